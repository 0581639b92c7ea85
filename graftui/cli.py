"""The ``graftui`` command: a thin shell over :mod:`graftui.flows`.

Each subcommand's options are generated from its request's fields (``graftui.requests``), so
defaults, help texts and checks are the library's. A subcommand builds the request, runs the
flow with a progress bar on stderr (only on a terminal), and prints the result as aligned
tables, or one JSON document with ``--json``; ``--report FILE`` also writes the result with the
request that made it. ``graftui run FILE`` runs the request a config, report or region file
holds. Bad input exits with code 2 and one line on stderr; cheap checks run before any model
is loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import textwrap
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Sequence

from . import __version__
from .errors import RequestError

PROG = "graftui"


class CLIError(RequestError):
    """Bad command-line syntax: exit code 2 and its message on one line."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line instead of usage + message."""

    def error(self, message: str):  # noqa: D102 - argparse hook
        raise CLIError(f"{message} (see '{self.prog} --help')")


# -- tables ----------------------------------------------------------------------------------------
def _count(n) -> str:
    return "-" if n is None else f"{int(n):,}"


def _pct(x) -> str:
    if x is None:
        return "-"
    value = 100 * x
    if value == 0:
        return "0%"
    if value >= 10:
        return f"{value:.1f}%"
    if value >= 1:
        return f"{value:.2f}%"
    return f"{value:.2g}%"


def _num(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _looks_numeric(text: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d,]*\.?\d+(e[-+]?\d+)?%?|-", text.strip()))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """An aligned plain-text table; numeric columns are right-aligned unless ``align`` says otherwise."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if align is None:
        align = "".join("r" if cells and all(_looks_numeric(r[i]) for r in cells) else "l" for i in range(len(headers)))

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(values, widths, align)).rstrip()

    return "\n".join([line(list(headers)), "  ".join("-" * w for w in widths), *(line(r) for r in cells)])


def pairs_table(items: Sequence[tuple[str, object]]) -> str:
    """``key  value`` lines with the keys aligned."""
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in items)


# -- one renderer per verb ----------------------------------------------------------------------------
def render_finetune(doc: dict) -> str:
    c = doc["config"]
    return pairs_table([
        ("checkpoint", doc["out"] + ("  (already built with this recipe; reused)" if doc["reused"] else "")),
        ("base / task", f"{doc['request']['base']} / {doc['task']}"),
        ("recipe", f"{c['optimizer']}, lr {c['lr']:g}, {c['epochs']} epoch(s), batch {c['batch_size']}"
         + (f", l1 {c['l1']:g}" if c["l1"] else "") + f", {c['train_examples'] or 'all'} training examples"),
        ("test accuracy", f"{doc['test_accuracy']:.3f}  (n={doc['test_examples']:,})"),
        ("time", f"{doc['seconds']:.1f} s"),
    ])


def render_localize(doc: dict) -> str:
    from .methods import get_method

    req, meta = doc["request"], doc["meta"]
    info = get_method(req["method"])
    detail = info.label
    if info.needs_data:
        detail += f", {req['steps']} steps on {meta.get('train_examples', 0):,} training examples"
    return pairs_table([
        ("wrote", f"{doc['path']}  ({'skill patch' if doc['kind'] == 'patch' else 'region'})"),
        ("region", f"k = {doc['k']:,}  ({_pct(doc['fraction_of_graftable'])} of {doc['graftable_params']:,} graftable, "
                   f"{_pct(doc['fraction_of_all'])} of {doc['total_params']:,} parameters)"),
        ("method", detail),
        ("time", f"{doc['seconds']:.1f} s"),
        ("anatomy", "  ".join(f"{t['label']} {_pct(t['share'])}" for t in doc["top_modules"]) or "(empty region)"),
        ("", f"weights {doc['weights']:,}, biases {doc['biases']:,}"),
    ])


def render_evaluate(doc: dict) -> str:
    from .scoring import BODY_LABEL

    rows = [[r["model"], r["task"], r["distribution"], _count(r["n"]), _num(r["accuracy"]), _num(r["f1"]), _num(r["ece"]),
             _num(r["agreement_with_ft"]), _count(r["region_size"])] for r in doc["rows"]]
    text = table(["model", "task", "dist", "n", "accuracy", "F1", "ECE", "agree w/ FT", "k"], rows, "lllrrrrrr")
    ft = next(r["model"] for r in doc["rows"]) if doc["rows"] else "fine-tuned"
    parts = [text, "", f"'{BODY_LABEL}' is the graft of the empty region; agreement is with the {ft} model."]
    side = doc.get("side_by_side")
    if side:
        names = side["names"]
        parts += ["", table(["region", "settings"], [[n, side["settings"][n]] for n in names], "ll"), "",
                  _matrix(r"overlap |γi∩γj|/|γj|", names, side["overlap"], _pct), "",
                  table(["share of region", *names], [[m, *(_pct(side["module_share"][n][j]) for n in names)]
                                                      for j, m in enumerate(side["module_labels"])])]
    return "\n".join(parts)


def render_sweep(doc: dict) -> str:
    methods = list(dict.fromkeys(doc["request"]["methods"]))
    sparsities = sorted(set(doc["request"]["sparsities"]))
    by = {(r["method"], r["sparsity"]): r for r in doc["rows"]}
    body = [[f"{s:g}", "/".join(_count(k) for k in sorted({by[(m, s)]["k"] for m in methods if (m, s) in by})),
             *[_num(by[(m, s)]["accuracy"]) if (m, s) in by else "-" for m in methods]] for s in sparsities]
    oods = doc.get("ood") or []
    detail = [["fine-tuned", "", "", _num(doc["ft_accuracy"]), _num(doc.get("ft_ece")),
               *(_num(doc["ft_ood"].get(o)) for o in oods)]]
    detail += [[r["method"], f"{r['sparsity']:g}", _count(r["k"]), _num(r["accuracy"]), _num(r["ece"]),
                *(_num(r["ood"].get(o)) for o in oods)] for r in doc["rows"]]
    return "\n".join([
        table(["sparsity", "k", *methods], body),
        f"\ntest accuracy on {doc['task']}; fine-tuned: {_num(doc['ft_accuracy'])}  ({doc['seconds']:.1f} s)\n",
        table(["model", "sparsity", "k", "accuracy", "ECE", *(f"OOD {o}" for o in oods)], detail,
              "llr" + "r" * (2 + len(oods))),
        *([f"\nregions kept in {Path(kept[0]).parent}:", *(f"  {Path(p).name}" for p in kept)]
          if (kept := [r["region"] for r in doc["rows"] if r.get("region")]) else [])])


def render_anatomy(doc: dict) -> str:
    from .layout import MODULE_LABELS

    k, graftable, by = doc["k"], doc["graftable_params"], doc["by"]
    density = lambda count, total: count / total if total else 0.0  # noqa: E731
    layers, modules, totals, counts = doc["layers"], doc["modules"], doc["totals"], doc["counts"]
    by_layer = [doc["by_layer"][layer] for layer in layers]
    if by == "layer":
        rows = [[layer, _count(by_layer[i]), _count(sum(totals[i])), _pct(density(by_layer[i], sum(totals[i]))),
                 _pct(density(by_layer[i], k))] for i, layer in enumerate(layers)]
        body = table(["layer", "in region", "graftable", "density", "share of region"], rows, "lrrrr")
    elif by == "module":
        rows = []
        for j, m in enumerate(modules):
            t, c = sum(row[j] for row in totals), doc["by_module"][m]
            rows.append([MODULE_LABELS.get(m, m), _count(c), _count(t), _pct(density(c, t)), _pct(density(c, k))])
        body = table(["module", "in region", "graftable", "density", "share of region"], rows, "lrrrr")
    else:
        headers = ["layer"] + [MODULE_LABELS.get(m, m) for m in modules] + ["all", "density"]
        rows = [[layer, *[_count(c) if totals[i][j] else "" for j, c in enumerate(counts[i])], _count(by_layer[i]),
                 _pct(density(by_layer[i], sum(totals[i])))] for i, layer in enumerate(layers)]
        col_totals = [sum(row[j] for row in totals) for j in range(len(modules))]
        rows.append(["all", *[_count(doc["by_module"][m]) for m in modules], _count(k), _pct(density(k, graftable))])
        rows.append(["density", *[_pct(density(doc["by_module"][m], t)) for m, t in zip(modules, col_totals)],
                     _pct(density(k, graftable)), ""])
        body = table(headers, rows, "l" + "r" * (len(headers) - 1))
        body += "\n\ncells hold the number of region parameters; density = in region / graftable"
    w, b = doc["weights"], doc["biases"]
    header = pairs_table([
        ("region", f"{doc['path']}  ({doc['kind']})"),
        ("size", f"k = {k:,}  ({_pct(doc['fraction_of_graftable'])} of {graftable:,} graftable)"),
        ("weights", f"{w['count']:,} of {w['total']:,}  ({_pct(density(w['count'], w['total']))})"),
        ("biases", f"{b['count']:,} of {b['total']:,}  ({_pct(density(b['count'], b['total']))})"),
    ])
    return header + "\n\n" + body


def render_compose(doc: dict) -> str:
    n = len(doc["names"])
    ids = [f"#{i + 1}" for i in range(n)]
    legend = table(["#", "region", "kind", "k"], [[ids[i], doc["names"][i], doc["kinds"][i], _count(doc["sizes"][i])]
                                                 for i in range(n)], "llll")
    over = table([r"overlap |γi∩γj|/|γj|"] + [f"j={x}" for x in ids],
                 [[f"i={ids[i]}", *[_pct(doc["overlap"][i][j]) for j in range(n)]] for i in range(n)])
    iou = table(["IoU"] + ids, [[ids[i], *[_num(doc["iou"][i][j]) for j in range(n)]] for i in range(n)])
    parts = [legend, "", over, "", iou, "", f"union: {doc['union_size']:,} parameters"]
    if doc["rows"]:
        parts += ["", table(["task", "head", "model", "n", "accuracy", "Δ vs alone", "ECE", "k"],
                            [[r["task"], r["head"], r["model"], _count(r["n"]), _num(r["accuracy"]),
                              f"{100 * r['delta_vs_alone']:+.1f} pts", _num(r["ece"]), _count(r["region_size"])]
                             for r in doc["rows"]], "llllrrrr")]
    written = doc.get("written")
    if written:
        rule = doc["request"]["resolve"]
        kind = ("skill patch, overlaps resolved by " + rule if written["kind"] == "patch"
                else "region (not every input is a skill patch)")
        parts.append(f"wrote {written['path']}  ({kind})")
    return "\n".join(parts)


def _auto_class(architecture: str | None) -> str:
    """The transformers Auto class that loads an exported checkpoint of this architecture."""
    name = str(architecture or "")
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "AutoModelForCausalLM"
    if name.endswith("ForMaskedLM"):
        return "AutoModelForMaskedLM"
    return "AutoModelForSequenceClassification"


def render_export(doc: dict) -> str:
    return pairs_table([
        ("wrote", doc["out"]),
        ("graft", f"{doc['base']} + {doc['k']:,} parameters of {doc['request']['finetuned'] or 'the skill patch'} "
                  f"({os.path.basename(doc['region'])})"),
        ("load with", f"{_auto_class(doc.get('architecture'))}.from_pretrained('{doc['out']}')"),
    ])


def render_push(doc: dict) -> str:
    where = doc["url"] or f"{doc['out']}  (written here only; nothing was pushed)"
    return pairs_table([("repository", doc["repo"]), ("pushed" if doc["url"] else "written to", where),
                        ("files", ", ".join(doc["files"])), ("time", f"{doc['seconds']:.1f} s")])


def _matrix(title: str, names: list[str], rows: list[list[float]], fmt=lambda x: _num(x, 2)) -> str:
    return table([title, *names], [[name, *(fmt(x) for x in row)] for name, row in zip(names, rows)])


def render_multitask(doc: dict) -> str:
    names = doc["tasks"]
    parts = [
        pairs_table([("multi-task model", doc["checkpoint"]),
                     ("regions", f"k = {doc['k']:,} each, mask started from {doc['request']['start']}"),
                     *[(f"  {t}", p) for t, p in doc["regions"].items()]]),
        "",
        "Overlap |γ_row ∩ γ_col| / |γ_col| (Fig. 8a):",
        _matrix("region", names, doc["overlap"]),
        "",
        "Relative gain of the row's region on the column's task, Eq. 5 (Fig. 8b); accuracy in brackets:",
        table(["region", *names], [[name, *(f"{_num(g, 2)} ({_num(a)})" for g, a in zip(gains, accs))]
                                   for name, gains, accs in zip(names, doc["relative_gain"], doc["scores"])]),
        table(["reference", *names], [["P_0 body + head", *(_num(x) for x in doc["p_zero"])],
                                      ["P_1 multi-task", *(_num(x) for x in doc["p_one"])]]),
    ]
    for label, key in (("union", "union"), ("purified union", "purified")):
        u = doc.get(key) or {}
        if u:
            size = f"{u['size']:,} parameters" + (f", {u['steps']} steps, {u['kept_from_union']:,} kept from the union"
                                                   if key == "purified" else "")
            parts += ["", f"{label.capitalize()} of {', '.join(u['group'])} ({size}):",
                      table(["", *names], [["relative gain", *(_num(g, 2) for g in u["relative_gain"])],
                                           ["accuracy", *(_num(a) for a in u["accuracy"])]])]
    parts += [f"time {doc['seconds']:.1f} s"]
    return "\n".join(parts)


def render_wise(doc: dict) -> str:
    tasks = [doc["task"], *doc["ood"]]
    by = {(r["curve"], r["alpha"], r["task"]): r for r in doc["rows"]}
    alphas = sorted({r["alpha"] for r in doc["rows"]})
    heads = [f"{c} {t}" for c in ("FT", "graft") for t in tasks]
    body = [[f"{a:g}", *(_num(by[(c, a, t)]["accuracy"]) for c in ("WiSE-FT", "WiSE-graft") for t in tasks)] for a in alphas]
    return "\n".join([
        f"θ_pre + α·δ (FT) and θ_pre + α·γ⊙δ (graft, k = {doc['k']:,} from {os.path.basename(doc['region'])}); "
        f"accuracy on {doc['task']} (in distribution){' and ' + ', '.join(doc['ood']) if doc['ood'] else ''}:",
        table(["α", *heads], body)])


def render_retrain(doc: dict) -> str:
    trained = doc["trained"]
    rows = [[r["model"], r["task"], r["distribution"], _count(r["n"]), _num(r["accuracy"]), _num(r["ece"]),
             _count(trained.get(r["model"])) if r["model"] in trained else ("all" if r["model"] == "fine-tuned" else "0")]
            for r in doc["rows"]]
    c = doc["recipe"]
    return "\n".join([
        table(["model", "task", "dist", "n", "accuracy", "ECE", "trained params"], rows, "lllrrrr"), "",
        f"Re-trained from θ_pre with the fine-tuned head fixed: {c['optimizer']}, lr {c['lr']:g}, {c['epochs']} epoch(s), "
        f"{c['train_examples'] or 'all'} training examples; 'graft' takes the fine-tuned values inside the region."])


def render_continual(doc: dict) -> str:
    names = doc["tasks"]
    parts = [pairs_table([(f"region of {t}", p) for t, p in doc["regions"].items()]), ""]
    for arm, key in (("Forget-free (train γ_tn minus the earlier regions)", "forget_free"),
                     ("Naive sequential fine-tuning (train the whole body)", "sequential")):
        trained = doc["trained"]["forget-free" if key == "forget_free" else "sequential"]
        rows = [[f"after {names[i]}", _count(trained[i]), *(_num(x) for x in doc[key][i])] for i in range(len(names))]
        parts += [f"{arm}: accuracy on each task after each stage", table(["stage", "trained", *names], rows), ""]
    parts.append(table(["forgetting (own stage − last)", *names],
                       [[arm, *(_num(x) for x in doc["forgetting"][arm])] for arm in ("forget-free", "sequential")]))
    parts.append(f"independent fine-tunes: {', '.join(f'{t} {a:.3f}' for t, a in zip(names, doc['finetuned_accuracy']))}; "
                 f"time {doc['seconds']:.1f} s")
    return "\n".join(parts)


def render_reproduce(doc: dict) -> str:
    r = doc["report"]
    s, mt, cl = r["single_task"], r["multitask"], r["continual"]
    lines = [
        ("report", f"{doc['out']}/report.md  (and report.json, figures/)"),
        ("steps", f"{len(r['steps'])}, {len(doc['reused'])} reused from an earlier run; {doc['seconds'] / 60:.1f} min"),
        ("single task", f"graft k = {s['k']:,} keeps {_pct(s['retained'])} of FT accuracy "
                        f"({_num(s['accuracy']['graft'])} vs {_num(s['accuracy']['ft'])})"),
        *[(f"calibration, {c['setting'].split(' (')[0]}", f"ECE FT {_num(c['ft']['ece'])}, graft {_num(c['graft']['ece'])}")
          for c in r["calibration"]["settings"]],
        ("multi-task overlap", ", ".join(f"{mt['tasks'][i]}–{mt['tasks'][j]} {_pct(mt['overlap'][i][j])}"
                                         for i in range(len(mt["tasks"])) for j in range(i + 1, len(mt["tasks"])))),
        ("forgetting", "; ".join(f"{arm}: " + ", ".join(_num(x) for x in v) for arm, v in cl["forgetting"].items())),
    ]
    text = pairs_table(lines)
    if r.get("problems"):
        text += "\n\nproblems with this run:\n" + "\n".join(f"  - {x}" for x in r["problems"])
    if r.get("did_not_reproduce"):
        text += "\n\ndid not reproduce here:\n" + "\n".join(f"  - {x}" for x in r["did_not_reproduce"])
    return text


RENDER = {"finetune": render_finetune, "localize": render_localize, "evaluate": render_evaluate,
          "sweep": render_sweep, "anatomy": render_anatomy, "compose": render_compose, "export": render_export,
          "multitask": render_multitask, "wise": render_wise, "retrain": render_retrain,
          "continual": render_continual, "reproduce": render_reproduce, "push": render_push}


# -- options from request fields ----------------------------------------------------------------------
def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None


def _comma(element):
    def parse(text: str) -> list:
        parts = [p.strip() for p in str(text).split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError("give at least one value")
        return [element(p) for p in parts]

    return parse


def add_request_options(parser: argparse.ArgumentParser, cls) -> None:
    """One option per request field: name, type, choices, help and shown default from the field."""
    from .requests import _kind

    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(cls):
        meta = f.metadata
        kind = _kind(cls, f.name)
        where = groups.setdefault(meta["group"], parser.add_argument_group(meta["group"])) if meta.get("group") else parser
        flag = meta.get("flag", "--" + f.name.replace("_", "-"))
        text = meta.get("help", "")
        default = cls.defaults()[f.name]
        if default is not None and default is not False and default != [] and "default" not in text:
            shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default) \
                if isinstance(default, list) else (f"{default:g}" if isinstance(default, float) else default)
            text += f" (default {shown})"
        kw = {"dest": f.name, "default": argparse.SUPPRESS, "help": text}
        if kind is bool:
            where.add_argument(flag, action="store_true", **kw)
            continue
        if kind is list:
            element = {float: _number, int: _whole}.get(_element(cls, f.name), str)
            if meta.get("list") == "comma":
                where.add_argument(flag, type=_comma(element), metavar=meta.get("metavar", "LIST"), **kw)
            else:
                where.add_argument(flag, action="extend", nargs="+", type=element, metavar=meta.get("metavar"), **kw)
            continue
        kw["type"] = {int: _whole, float: _number}.get(kind, str)
        if meta.get("choices"):
            kw["choices"] = list(meta["choices"])
        else:
            kw["metavar"] = meta.get("metavar")
        where.add_argument(flag, **kw)


def _element(cls, name: str):
    import typing

    from .requests import _hints

    hint = _hints(cls)[name]
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is list:
            return typing.get_args(arg)[0]
    return str


def request_from(args: argparse.Namespace, cls):
    """The request the given options describe; every option not given keeps the request's default."""
    given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    defaults = cls.defaults()
    return cls(**{**defaults, **given})


# -- output ----------------------------------------------------------------------------------------
class Terminal:
    """Results to stdout, progress to stderr (a bar, only on a terminal, never with --json)."""

    def __init__(self, args: argparse.Namespace):
        self.json = bool(getattr(args, "json", False))
        self.live = not self.json and sys.stderr.isatty()
        self._bar = None

    def progress(self, event: dict) -> None:
        if event.get("announce") and not self.json:  # milestones (a plan, its estimate) are printed, bar or not
            if self._bar is not None:
                self._bar.write(str(event["stage"]), file=sys.stderr)
            else:
                print(str(event["stage"]), file=sys.stderr, flush=True)
        if not self.live:
            return
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=100, file=sys.stderr, leave=False, dynamic_ncols=True, bar_format="{l_bar}{bar}| {desc}")
        bar = self._bar
        if "step" in event and "steps" in event:
            fraction = event["step"] / max(event["steps"], 1)
            bar.set_postfix_str(f"step {event['step']}/{event['steps']}" + (
                f" loss {event['loss']:.3f}" if "loss" in event else ""), refresh=False)
        else:
            fraction = event.get("fraction", bar.n / 100)
        if event.get("stage"):
            bar.set_description_str(str(event["stage"])[:60], refresh=False)
        bar.n = round(100 * float(fraction))
        bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def emit(self, doc: dict, text: str) -> None:
        """The result: JSON, or the verb's table followed by its card (what the numbers say)."""
        if not self.json and doc.get("card"):
            text += "\n\n" + "\n".join(textwrap.fill(line, 110, subsequent_indent="  ") for line in doc["card"])
        print(json.dumps(doc, indent=2) if self.json else text)


@contextlib.contextmanager
def _quiet(debug: bool):
    """Library warnings, log records and loading bars stay off stderr (``--debug`` shows them)."""
    if debug:
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _no_library_bars() -> None:
    for call in (lambda: __import__("transformers").logging.disable_progress_bar(),
                 lambda: __import__("huggingface_hub.utils", fromlist=["x"]).disable_progress_bars()):
        try:
            call()
        except Exception:  # noqa: BLE001 - cosmetics only
            pass


def run_request(request, args: argparse.Namespace) -> int:
    """Run a request's flow, print its result, and write the report when asked."""
    from . import flows, settings

    settings.configure_torch()
    _no_library_bars()
    out = Terminal(args)
    try:
        result = flows.run(request, progress=out.progress)
    finally:
        out.close()
    doc = result.as_dict()
    text = RENDER[request.verb](doc)
    if doc.get("notes"):
        text += "\n\n" + "\n".join(f"note: {n}" for n in doc["notes"])
    report = getattr(args, "report", None)
    if report:
        result.save(report)
        text += f"\n\nreport (with its request) written to {report}"
    out.emit(doc, text)
    return 0


def cmd_verb(args: argparse.Namespace) -> int:
    request = request_from(args, args.request_cls)
    request.validate()  # cheap checks before any model is loaded; the flow checks again
    return run_request(request, args)


def cmd_run(args: argparse.Namespace) -> int:
    from . import flows

    return run_request(flows.read_request(args.file, args.out), args)


def cmd_methods(args: argparse.Namespace) -> int:
    from .methods import METHODS

    doc = {"methods": [{"name": m.name, "label": m.label, "needs_data": m.needs_data, "description": m.description}
                       for m in METHODS.values()]}
    rows = [[m.name, "yes" if m.needs_data else "no", m.description] for m in METHODS.values()]
    Terminal(args).emit(doc, table(["method", "data", "description"], rows, "lll"))
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from .data import OFFLINE_TASKS

    doc = {"tasks": [{"name": n, "description": d} for n, d in OFFLINE_TASKS.items()]}
    text = table(["task", "description"], [[n, d] for n, d in OFFLINE_TASKS.items()], "ll")
    text += "\n\n--task also takes a CSV/TSV/JSON(L)/Parquet file, a folder of them, or a Hugging Face dataset id."
    Terminal(args).emit(doc, text)
    return 0


# -- parser ------------------------------------------------------------------------------------------
SUMMARY = {"finetune": "make a fine-tuned checkpoint (SGD or AdamW + ℓ1)",
           "localize": "learn a skill region and write it as a skill patch",
           "evaluate": "compare fine-tuned, pre-trained and grafted models",
           "sweep": "accuracy against region size for several methods",
           "anatomy": "where a region sits: layers × module types",
           "compose": "overlap of regions, their union, and the union graft scored",
           "export": "write a grafted model as a Hugging Face checkpoint",
           "multitask": "regions of a multi-task model: overlap, skill transfer (Eq. 5), union, purification",
           "wise": "WiSE-FT and WiSE-graft curves along α, in and out of distribution",
           "retrain": "train only the region from θ_pre (and BitFit), against FT and the graft",
           "continual": "forget-free continual learning with regions, against sequential fine-tuning",
           "reproduce": "every experiment on the offline default, in one report (resumes where it stopped)",
           "push": "push a skill patch or grafted checkpoint to the Hugging Face Hub, with a model card"}


def build_parser() -> argparse.ArgumentParser:
    from .requests import REQUESTS

    parser = _Parser(prog=PROG, description="Find where a fine-tuned model keeps its skill: learn a tiny region of "
                     "parameters that, grafted onto the pre-trained model, recovers the fine-tuned accuracy "
                     "(Panigrahi et al., ICML 2023).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of tables")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback on errors")
    report = _Parser(add_help=False)
    report.add_argument("--report", metavar="FILE", help="also write the result, with its request, as JSON "
                        "('graftui run FILE' makes it again); FILE.zip writes a report bundle: README, request, "
                        "tables as CSV and JSON, figures as HTML")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for verb, cls in REQUESTS.items():
        p = sub.add_parser(verb, parents=[common, report], help=SUMMARY[verb], description=cls.__doc__)
        add_request_options(p, cls)
        p.set_defaults(func=cmd_verb, request_cls=cls)
    p = sub.add_parser("run", parents=[common, report], help="run a request again from a config, report or region file",
                       description="Run the request held by a JSON/YAML config ({'verb': ..., fields}), a report, a "
                       "region file or a checkpoint folder graftui wrote. With the same seed a region is made again "
                       "bit for bit.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--out", metavar="PATH", help="where to write (default: the verb's default place, never the file read)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("methods", parents=[common], help="list localization methods")
    p.set_defaults(func=cmd_methods)
    p = sub.add_parser("tasks", parents=[common], help="list offline tasks")
    p.set_defaults(func=cmd_tasks)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 bad input, 1 unexpected, 130 interrupted)."""
    from .errors import is_user_error, message

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle workers sleep
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as stop:  # --help and --version
            return int(stop.code or 0) if not isinstance(stop.code, str) else 2
        debug = bool(getattr(args, "debug", False))
        if args.command is None:
            raise CLIError(f"choose a command: {', '.join(SUMMARY)}, run, methods or tasks (see '{PROG} --help')")
        with _quiet(debug):
            return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `graftui tasks | head -1`: the reader left, nothing to report
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - one line for the user, the traceback behind --debug
        if debug:
            raise
        if is_user_error(err):
            print(f"{PROG}: error: {message(err)}", file=sys.stderr)
            return 2
        text = " ".join(str(err).split())
        print(f"{PROG}: error: unexpected {type(err).__name__}: {text} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
