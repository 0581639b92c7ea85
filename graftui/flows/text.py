"""Each verb's result as plain text: the tables the CLI prints (``--json`` prints the result itself).

A renderer takes the result as ``Result.as_dict()`` gives it; the registry (``registry.verb``)
pairs each verb with its renderer.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import card
from ..config import FT_LABEL, kind_of_architecture
from ..experiments import MERGES
from ..formatting import count as _count, difference_value, num as _num, pairs_table, pct, table
from ..metrics import distinguishable
from ..paths import short_ref
from ..layout import MODULE_LABELS
from ..localizers import get_method
from ..kinds import kind_in


def _pct(x) -> str:
    return pct(x, missing="-")


def finetune(doc: dict) -> str:
    c = doc["config"]
    return pairs_table([
        ("checkpoint", doc["out"] + ("  (already built with this recipe; reused)" if doc["reused"] else "")),
        ("base / task", f"{doc['request']['base']} / {doc['task']}"),
        ("recipe", f"{c['optimizer']}, lr {c['lr']:g}, {c['epochs']} epoch(s), batch {c['batch_size']}"
         + (f", l1 {c['l1']:g}" if c["l1"] else "") + (f", LoRA rank {c['lora_rank']}" if c.get("lora_rank") else "")
         + f", {_trained_on(doc)} training examples"),
        (f"test {kind_in(doc).words.score}", f"{doc['test_accuracy']:.3f}"
         + (f" ± {doc['test_accuracy_std']:.3f} over {len(doc['seeds'])} seeds" if doc.get("seeds") else "")
         + f"  (n={doc['test_examples']:,})"),
        ("time", f"{doc['seconds']:.1f} s"),
    ]) + ("\n\n" + table(["seed", "checkpoint", "test accuracy"],
                          [[e["seed"], e["out"] + ("  (reused)" if e["reused"] else ""), _num(e["test_accuracy"])]
                           for e in doc["per_seed"]], "llr") if doc.get("per_seed") else "")


def _trained_on(doc: dict) -> str:
    """The training examples a fine-tune used (its record's count), else the recipe's cap ('all' without one)."""
    used, cap = doc.get("train_examples"), doc["config"]["train_examples"]
    if isinstance(used, int):
        return f"{used:,}"
    if isinstance(used, dict):
        return ", ".join(f"{n:,} of {name}" for name, n in used.items())
    return f"up to {cap:,}" if cap else "all"


def localize(doc: dict) -> str:
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
    ]) + (size_search(meta["size_search"]) if meta.get("size_search") else "") + (
        check(doc["check"]) if doc.get("check") else "") + (seeds(doc) if doc.get("seeds") else "") + (
        finetunes(doc) if doc.get("finetunes") else "")


def size_search(found: dict) -> str:
    """Localize --keep: the curve of share kept against k, the region written marked."""
    rows = [[_count(p["k"]), _pct(p["sparsity"]), "-" if p["share"] is None else _pct(p["share"]),
             "-" if p["score"] is None else _num(p["score"]), _count(p["inside"]) if p["inside"] else "all",
             "✓" + (" (written)" if p["k"] == found["k"] else "") if p["keeps"] else ""] for p in found["curve"]]
    return "\n".join(["", "", f"size search: the smallest region keeping {_pct(found['target'])} of the gain "
                               f"({found.get('measure', 'score')}, n = {found.get('n', '?')}):",
                       table(["k", "sparsity", "share kept", found.get("scored_by", "score"), "learned inside",
                              "keeps"], rows, "rrrrrl")])


def finetunes(doc: dict) -> str:
    """A localization on several fine-tunes of one recipe: each one's region, and how alike they are against chance."""
    st = doc["finetune_stability"]
    names = [f"ft{i}" for i in range(len(doc["finetunes"]))]
    rows = [[name, e["finetuned"], e["path"], _count(e["k"]), f"{e['seconds']:.1f} s"]
            for name, e in zip(names, doc["finetunes"])]
    return "\n".join(["", "", table(["", "fine-tuned model", "region", "k", "time"], rows, "lllrr"), "",
                      _matrix(r"overlap |γi∩γj|/|γj| across fine-tunes", names, st["pairwise_overlap"], _pct), "",
                      pairs_table([("mean overlap", f"{_pct(st['mean_overlap'])}; two random regions of these sizes: "
                                                    f"{_pct(st['chance_overlap'])}"),
                                   ("core", f"{st['core']:,} parameters found on every fine-tune"),
                                   ("union", f"{st['union']:,} parameters found on any")])])


def check(found: dict) -> str:
    """Localize's quick held-out score: the region beside FT and the empty region on the same examples."""
    rows = [[r["model"], _count(r["n"]), _num(r["accuracy"]), _num(r["ece"])] for r in found["rows"]]
    words = kind_in(found).words
    names = [words.score, words.calibration]
    return "\n".join(["", "", f"held-out check on {found['n']:,} test examples of {found['task']}:",
                      table(["model", "n", *names], rows, "lrrr")])


def seeds(doc: dict) -> str:
    """A replicate localization: each seed's region, and how alike they are against chance."""
    st = doc["stability"]
    names = [f"seed {e['seed']}" for e in doc["seeds"]]
    rows = [[e["seed"], e["path"] + ("  (read back)" if e["reused"] else ""), _count(e["k"]),
             _pct(e["top_movement_overlap"]) if e["top_movement_overlap"] is not None else "-", f"{e['seconds']:.1f} s"]
            for e in doc["seeds"]]
    parts = ["", "", table(["seed", "region", "k", "in top-movement", "time"], rows, "llrrr")]
    if not st:  # one seed: no core, union or stability
        return "\n".join(parts)
    parts += ["", _matrix(r"overlap |γi∩γj|/|γj| across seeds", names, st["pairwise_overlap"], _pct), "",
             pairs_table([
                 ("mean overlap", f"{_pct(st['mean_overlap'])}; two random regions of these sizes: "
                                  f"{_pct(st['chance_overlap'])}"
                                  + (f" ({st['over_chance']:,.0f}× chance)" if st["over_chance"] else "")),
                 ("core", f"{st['core']:,} parameters found by every seed"
                          + (f"  ({st['core_path']})" if st.get("core_path") else "")),
                 ("found once", f"{st['only_one']:,} parameters found by one seed only"),
                 ("union", f"{st['union']:,} parameters found by any seed"
                           + (f"  ({st['union_path']})" if st.get("union_path") else "")),
             ])]
    by = st.get("by_module") or {}
    if by:
        parts += ["", table(["module", "mean per seed", "core", "core / mean"],
                            [[v["label"], f"{v['mean']:,.0f}", _count(v["core"]), _pct(v["core_share"])]
                             for v in by.values()], "lrrr")]
    return "\n".join(parts)


def differences(found: list[dict]) -> str:
    """The paired differences a − b, each with its 95 % interval on the same examples (and McNemar's p); over
    several seeds the mean ± std, the t-interval across seeds, and how many seeds' own intervals exclude zero."""
    if not found:
        return ""
    several = any((d.get("seeds") or 1) > 1 for d in found)

    rows = [[d["a"], d["b"], d["task"], d["metric"], _count(d["n"]), difference_value(d), "yes" if distinguishable(d) else "no",
             f"{d.get('distinguishable_in', 0)}/{d.get('seeds', 1)}" if several else
             ("-" if d.get("p") is None else f"{d['p']:.3g}")] for d in found]
    if several:
        over = found[0].get("over", "seeds")
        title = (f"differences a − b over {over}: mean ± std (shares of the examples in pts) and its 95 % interval (the {over}' spread "
                 f"and the shared test examples' noise together); last column: {over} whose own paired interval "
                 "excludes zero")
        return title + "\n" + table(["a", "b", "task", "metric", "n", "a − b ± std [95 % CI]", "≠ 0", f"{over} ≠ 0"],
                                     rows, "llllrlll")
    return ("paired differences a − b on the same test examples (shares of the examples in pts; 95 % "
            "bootstrap interval; p: McNemar's exact test)\n"
            + table(["a", "b", "task", "metric", "n", "a − b [95 % CI]", "≠ 0", "p"], rows, "llllrlll"))


def _sd(row: dict, name: str) -> str:
    """A value, with ± its standard deviation over seeds where the row is a mean over several."""
    std = row.get(f"{name}_std")
    several = len(row.get(f"{name}_seeds") or ()) > 1
    return _num(row.get(name)) + (f" ± {std:.3f}" if several and std is not None else "")


def _seeds_line(doc: dict) -> list[str]:
    if doc.get("finetunes"):
        return [f"means over {len(doc['finetunes'])} fine-tunes ({', '.join(doc['finetunes'])}; ± std across them), "
                "each with its own regions, FT and baselines; each fine-tune's own numbers are under per_finetune in "
                "--json"]
    return [f"means over seeds {', '.join(map(str, doc['seeds']))} (± std across seeds); each seed's own numbers are "
            "under per_seed in --json"] if doc.get("seeds") else []


def generations(shown: list[dict], models: list[str]) -> str:
    """Prompt, reference and each model's answer and greedy generation, side by side (✓: its answer is the
    reference's; ≈: it contains it; ✗: neither, with its token F1 where above 0)."""
    rows = [[" ".join(g["prompt"].split())[-40:], " ".join(g["reference"].split())[:40],
             *(card.generation_cell(g, name, 30) for name in models)] for g in shown]
    return ("generations: ✓ the answer «…» is the reference's, ≈ it contains it, ✗ neither; ← the generation it was "
            "read from\n" + table(["prompt (end)", "reference", *models], rows, "l" * (2 + len(models))))


def rows_table(doc: dict) -> str:
    """A comparison's rows in the columns its task kind declares (``TaskKind.columns``)."""
    columns = kind_in(doc).columns
    words = ("model", "task", "distribution", "metric")

    def cell(row, key):
        value = row.get(key)
        if key in words:
            return "" if value is None else str(value)
        if key in ("n", "region_size"):
            return _count(value and round(value))
        return _sd(row, key)

    return table([header for header, _ in columns], [[cell(r, key) for _, key in columns] for r in doc["rows"]],
                 "".join("l" if key in words else "r" for _, key in columns))


def evaluate(doc: dict) -> str:
    kind = kind_in(doc)
    parts = [rows_table(doc), "", kind.legend(doc["rows"]), *_seeds_line(doc)]
    if doc.get("differences"):
        parts += ["", differences(doc["differences"])]
    if doc.get("generations"):
        parts += ["", generations(doc["generations"], list(dict.fromkeys(r["model"] for r in doc["rows"])))]
    side = doc.get("side_by_side")
    if side:
        names = side["names"]
        parts += ["", table(["region", "settings"], [[n, side["settings"][n]] for n in names], "ll"), "",
                  _matrix(r"overlap |γi∩γj|/|γj|", names, side["overlap"], _pct), "",
                  table(["share of region", *names], [[m, *(_pct(side["module_share"][n][j]) for n in names)]
                                                      for j, m in enumerate(side["module_labels"])])]
    return "\n".join(parts)


def predict(doc: dict) -> str:
    """One block per text: each model's answer to it, in the words of the task's kind; then the probe map's."""
    return kind_in(doc, "kind").predict_text(doc) + (f"\n\n{probe_map(doc)}" if doc.get("parts") else "")


def _dp(x: float) -> str:
    """A change of probability in points, signed: +12.3, −0.4."""
    return f"{100 * x:+.1f}".replace("-", "−")


def probe_map(doc: dict) -> str:
    """Per text, each (layer, module) part of the region: p of FT's answer with the part alone grafted (Δ against
    the pre-trained model) and alone knocked out (Δ against FT), × where the part changes that baseline's answer."""
    blocks = []
    for a in doc["answers"]:
        rows = [[p["part"], _count(p["k"]), pct(p["graft_p"]), _dp(p["graft_delta"]) + (" ×" if p["graft_flips"] else ""),
                 pct(p["knockout_p"]), _dp(p["knockout_delta"]) + (" ×" if p["knockout_flips"] else "")]
                for p in doc["parts"] if p["text"] == a["text"]]
        blocks += [f"Probe map, text {a['text'] + 1}: p is {a['measure']}, '{a['answer']}' "
                   f"({pct(a['ft_p'])} fine-tuned, {pct(a['pre_p'])} pre-trained, which answers '{a['pre_answer']}'); Δ in "
                   "points; × where the part changes the answer (grafted: from the pre-trained model's; knocked out: "
                   "from the fine-tuned model's)",
                   table(["part", "k", "graft p", "Δ vs pre", "knock-out p", "Δ vs FT"], rows, "lrrrrr"), ""]
    return "\n".join(blocks).rstrip()


def sweep(doc: dict) -> str:
    methods = list(dict.fromkeys(doc["request"]["methods"]))
    sparsities = sorted(set(doc["request"]["sparsities"]))
    by = {(r["method"], r["sparsity"]): r for r in doc["rows"]}
    body = [[f"{s:g}", "/".join(_count(round(k)) for k in sorted({by[(m, s)]["k"] for m in methods if (m, s) in by})),
             *[_sd(by[(m, s)], "accuracy") if (m, s) in by else "-" for m in methods]] for s in sparsities]
    oods = doc.get("ood") or []
    words = kind_in(doc).words
    score, ece = words.score, words.calibration
    detail = [[FT_LABEL, "", "", _num(doc["ft_accuracy"]), _num(doc.get("ft_ece")),
               *(_num(doc["ft_ood"].get(o)) for o in oods)]]
    detail += [[r["method"], f"{r['sparsity']:g}", _count(round(r["k"])), _sd(r, "accuracy"), _sd(r, "ece"),
                *(_num(r["ood"].get(o)) for o in oods)] for r in doc["rows"]]
    return "\n".join([
        table(["sparsity", "k", *methods], body),
        f"\ntest {score} on {doc['task']}; fine-tuned: {_num(doc['ft_accuracy'])}  ({doc['seconds']:.1f} s)",
        *_seeds_line(doc), "",
        table(["model", "sparsity", "k", score, ece, *(f"OOD {o}" for o in oods)], detail,
              "llr" + "r" * (2 + len(oods))),
        *(["", differences([{**d, "a": f"{d['a']} at {d['sparsity']:g}"} for d in doc["differences"]])]
          if doc.get("differences") else []),
        *([f"\nregions kept in {Path(kept[0]).parent}:", *(f"  {Path(p).name}" for p in kept)]
          if (kept := [r["region"] for r in doc["rows"] if r.get("region")]) else [])])


def anatomy(doc: dict) -> str:
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
    return header + "\n\n" + body + anatomy_more(doc)


def anatomy_more(doc: dict) -> str:
    """Anatomy's top tensors and neurons, with --replicate the stability per part across seeds, with --ablate what
    each part is worth."""
    parts = []
    if doc.get("tensors"):
        parts += ["tensors holding most of the region (density = region parameters / the tensor's size)",
                  table(["tensor", "layer", "module", "in region", "share of region", "density"],
                        [[t["tensor"], t["layer"], t["module"], _count(t["parameters"]), _pct(t["share"]),
                          _pct(t["density"])] for t in doc["tensors"]], "lllrrr")]
    if doc.get("neurons"):
        parts += ["neurons holding most of the region (a neuron: one output unit of a weight matrix, the weights into "
                  "it; density = region parameters / its fan-in)",
                  table(["tensor", "unit", "module", "in region", "fan-in", "share of region", "density"],
                        [[u["tensor"], f"{u['axis']} {u['unit']}", u["module"], _count(u["parameters"]),
                          _count(u["fan_in"]), _pct(u["share"]), _pct(u["density"])] for u in doc["neurons"]],
                        "lllrrrr")]
    st = doc.get("stability")
    if st:
        def stable(by: dict, what: str) -> str:
            return table([what, "mean per seed", "core", "core / mean", "chance", "× chance"],
                         [[v["label"], f"{v['mean']:,.0f}", _count(v["core"]), _pct(v["core_share"]),
                           _pct(v["chance_share"]), "-" if v["over_chance"] is None else f"{v['over_chance']:,.0f}×"]
                          for v in by.values()], "lrrrrr")
        parts += [f"stability across {st['seeds']} seeds: core = parameters every seed found; chance = core / mean "
                  f"expected of random regions of the same sizes in each part; whole region: mean overlap "
                  f"{_pct(st['mean_overlap'])} against {_pct(st['chance_overlap'])} by chance",
                  stable(st["by_module"], "module"), stable(st["by_layer"], "layer")]
    ab = doc.get("ablation")
    if ab:
        rows = [[r["label"] if r["by"] == "layer" else f"{r['label']} (all layers)", _count(r["parameters"]),
                 _pct(r["share"]), _num(r["accuracy"]),
                 f"{100 * r['drop']:+.1f} [{100 * r['ci'][0]:+.1f}, {100 * r['ci'][1]:+.1f}]",
                 "yes" if r["distinguishable"] else "no"] for r in ab["rows"]]
        parts += [f"what each part of the region is worth: the graft without it (its parameters back to θ_pre) on "
                  f"{ab['n']:,} test examples of {ab['task']} (the whole graft: accuracy {_num(ab['accuracy'])}); "
                  "drop = whole − without, in pts, with its paired 95 % interval; ≠ 0: the interval excludes zero",
                  table(["without", "in region", "share of region", "accuracy", "drop [95 % CI]", "≠ 0"], rows,
                        "lrrrrl")]
    return "".join("\n\n" + part for part in parts)


def regions(doc: dict) -> str:
    """The saved regions, one a row: what each is, and its latest evaluation in distribution."""
    shown, total = doc["regions"], doc["total"]
    if not shown:
        return f"no saved region in {doc['folder']}" + (" passes the filters" if total else "")
    ref = lambda v: "-" if v is None else short_ref(v)  # noqa: E731 - a model or task file by its name
    rows = [[r["id"], ref(r["base"]), ref(r["finetuned"]), ref(r["task"]), ref(r["method"]), _count(r["k"]),
             _pct(r["share_of_graftable"]), _count(r["steps"]), ref(r["seed"]), ref(r["created"]), _num(r["accuracy"]),
             _num(r["ece"]), _pct(r["share_of_ft"])] for r in shown]
    text = table(["id", "base", "fine-tuned", "task", "method", "k", "share", "steps", "seed", "created (UTC)",
                  "accuracy", "ECE", "share of FT gain"], rows, "lllllrrrrlrrr")
    scored = sum(r["accuracy"] is not None for r in shown)
    parts = [text, "", f"{len(shown)} of {total} region(s) in {doc['folder']}; {scored} scored. Scores are each "
             "region's latest evaluation on its task (graftui evaluate, the app's Compare); share: of the "
             "graftable parameters; share of FT gain: (graft − bare body) / (fine-tuned − bare body)."]
    by = (doc.get("request") or {}).get("group_by")
    if doc.get("groups"):
        spread = lambda g: "-" if g["std"] is None else f"{100 * g['std']:.1f} pts"  # noqa: E731
        parts += ["", f"grouped by {by}: the score's mean, spread (std) and range over the runs scored",
                  table([by, "runs", "scored", "mean", "spread", "min", "max", "ECE mean"],
                        [[g["group"], str(g["runs"]), str(g["scored"]), _pct(g["mean"]), spread(g), _pct(g["min"]),
                          _pct(g["max"]), _num(g["ece"])] for g in doc["groups"]], "lrrrrrrr")]
    if doc.get("diff") is not None and (doc.get("request") or {}).get("diff"):
        a, b = doc["request"]["diff"]
        parts += ["", f"{a} and {b}: " + (f"{len(doc['diff'])} setting(s) differ" if doc["diff"] else
                                          "made with the same settings")]
        if doc["diff"]:
            parts.append(table(["setting", a, b], [[d["setting"], d["a"], d["b"]] for d in doc["diff"]], "lll"))
    return "\n".join(parts)


def compose(doc: dict) -> str:
    n = len(doc["names"])
    ids = [f"#{i + 1}" for i in range(n)]
    legend = table(["#", "region", "kind", "k"], [[ids[i], doc["names"][i], doc["kinds"][i], _count(doc["sizes"][i])]
                                                 for i in range(n)], "llll")
    over = table([r"overlap |γi∩γj|/|γj|"] + [f"j={x}" for x in ids],
                 [[f"i={ids[i]}", *[_pct(doc["overlap"][i][j]) for j in range(n)]] for i in range(n)])
    iou = table(["IoU"] + ids, [[ids[i], *[_num(doc["iou"][i][j]) for j in range(n)]] for i in range(n)])
    parts = [legend, "", over, "", iou, "", f"union: {doc['union_size']:,} parameters"]
    chosen = doc.get("stitch")
    if chosen:
        parts += ["", table(["task", "model", "n", "accuracy / exact match", "loss/token", "k"],
                            [[r["task"], r["model"], _count(r["n"]), _num(r["accuracy"]),
                              _num(r.get("loss")) if "loss" in r else "-", _count(r["region_size"])]
                             for r in doc["rows"]], "llrrrr"),
                  *(f"{m['model']}: the best mean validation score over the tasks ({chosen['validation_n']:,} "
                    "examples each; " + ", ".join(_grid_point(m.get("merge"), e) for e in m["grid"]) + ")"
                    for m in chosen.get("merges") or _arithmetic_only(chosen))]
    elif doc["rows"]:
        parts += ["", table(["task", "head", "model", "n", "accuracy", "Δ vs alone", "ECE", "k"],
                            [[r["task"], r["head"], r["model"], _count(r["n"]), _num(r["accuracy"]),
                              f"{100 * r['delta_vs_alone']:+.1f} pts", _num(r["ece"]), _count(r["region_size"])]
                             for r in doc["rows"]], "llllrrrr")]
    if doc.get("differences"):
        parts += ["", differences(doc["differences"])]
    written = doc.get("written")
    if written:
        rule = doc["request"]["resolve"]
        kind = ("skill patch, overlaps resolved by " + rule if written["kind"] == "patch"
                else "region (not every input is a skill patch)")
        parts.append(f"wrote {written['path']}  ({kind})")
    return "\n".join(parts)


AUTO_CLASSES = {"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
                "classifier": "AutoModelForSequenceClassification"}


def _auto_class(architecture: str | None) -> str:
    """The transformers Auto class that loads an exported checkpoint of this architecture."""
    return AUTO_CLASSES[kind_of_architecture([architecture] if architecture else [])]


def export(doc: dict) -> str:
    return pairs_table([
        ("wrote", doc["out"]),
        ("graft", f"{doc['base']} + {doc['k']:,} parameters "
                  + (f"with the skill patch's own values (made from {doc['finetuned'][6:]})"
                     if doc["finetuned"].startswith("patch:") else f"of {doc['finetuned']}")
                  + f" ({os.path.basename(doc['region'])})"),
        ("load with", f"{_auto_class(doc.get('architecture'))}.from_pretrained('{doc['out']}')"),
    ])


def push(doc: dict) -> str:
    where = doc["url"] or f"{doc['out']}  (written here only; nothing was pushed)"
    return pairs_table([("repository", doc["repo"]), ("pushed" if doc["url"] else "written to", where),
                        ("files", ", ".join(doc["files"])), ("time", f"{doc['seconds']:.1f} s")])


def _matrix(title: str, names: list[str], rows: list[list[float]], fmt=lambda x: _num(x, 2)) -> str:
    return table([title, *names], [[name, *(fmt(x) for x in row)] for name, row in zip(names, rows)])


def multitask(doc: dict) -> str:
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
    parts += [*_replicates(doc.get("seeds"), "mask seeds"), f"time {doc['seconds']:.1f} s"]
    return "\n".join(parts)


def _replicates(seeds, what: str) -> list[str]:
    """The line a replicate run adds: what its figures are the mean of."""
    return [f"Every figure is the mean over {what} {', '.join(map(str, seeds))} (--json: 'spread' holds the standard "
            "deviations, 'per_seed' each seed's own figures)."] if seeds else []


def wise(doc: dict) -> str:
    tasks = [doc["task"], *doc["ood"]]
    by = {(r["curve"], r["alpha"], r["task"]): r for r in doc["rows"]}
    alphas = sorted({r["alpha"] for r in doc["rows"]})
    heads = [f"{c} {t}" for c in ("FT", "graft") for t in tasks]
    body = [[f"{a:g}", *(_num(by[(c, a, t)]["accuracy"]) for c in ("WiSE-FT", "WiSE-graft") for t in tasks)] for a in alphas]
    return "\n".join([
        f"θ_pre + α·δ (FT) and θ_pre + α·γ⊙δ (graft, k = {doc['k']:,} from {os.path.basename(doc['region'])}); "
        f"accuracy on {doc['task']} (in distribution){' and ' + ', '.join(doc['ood']) if doc['ood'] else ''}:",
        table(["α", *heads], body),
        *_replicates([e.get("seed") for e in doc.get("per_region") or ()], "the regions of mask seeds"),
        *(["", differences([{**d, "a": f"{d['a']} α={d['alpha']:g}", "b": f"{d['b']} α={d['alpha']:g}"}
                            for d in doc["differences"]])] if doc.get("differences") else [])])


def retrain(doc: dict) -> str:
    trained = doc["trained"]
    rows = [[r["model"], r["task"], r["distribution"], _count(r["n"]), _num(r["accuracy"]), _num(r["ece"]),
             _count(trained.get(r["model"])) if r["model"] in trained else ("all" if r["model"] == FT_LABEL else "0")]
            for r in doc["rows"]]
    c = doc["recipe"]
    return "\n".join([
        table(["model", "task", "dist", "n", "accuracy", "ECE", "trained params"], rows, "lllrrrr"), "",
        f"Re-trained from θ_pre with the fine-tuned head fixed: {c['optimizer']}, lr {c['lr']:g}, {c['epochs']} epoch(s), "
        f"{c['train_examples'] or 'all'} training examples; 'graft' takes the fine-tuned values inside the region.",
        *(["", differences(doc["differences"])] if doc.get("differences") else [])])


def continual(doc: dict) -> str:
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
    parts += _replicates(doc.get("seeds"), "mask seeds")
    if doc.get("differences"):
        parts += ["", differences(doc["differences"])]
    return "\n".join(parts)


def reproduce(doc: dict) -> str:
    r = doc["report"]
    if r.get("section") == "generative":
        return generative_report(doc)
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




def _arithmetic_only(chosen: dict) -> list[dict]:
    """A stitch saved before there were other merges: task arithmetic's λ grid, as a merge's."""
    return [{"merge": "task-arithmetic", "model": chosen["model"], "grid": list(chosen.get("lambdas") or ())}]


def _grid_point(merge: str | None, point: dict) -> str:
    """One setting a merge tried and its validation score: "λ 0.5: 0.830", "λ 1 density 0.2: 0.660"."""
    spec = MERGES.get(merge)
    value = point.get(spec.key) if spec is not None and spec.key else None
    return f"λ {point['lambda']:g}" + (f" {spec.words} {value:g}" if value else "") + f": {point['validation']:.3f}"


def generative_report(doc: dict) -> str:
    """The generative section in lines: per skill and recipe, the fine-tune's exact match and each method's at each
    budget; then the best region at the finding's budget."""
    r = doc["report"]
    lines = [("report", f"{doc['out']}/report.md  (and report.json)"),
             ("steps", f"{len(r['steps'])}, {len(doc['reused'])} reused from an earlier run; {doc['seconds'] / 60:.1f} min")]
    for s in r["skills"]:
        for rc in s["recipes"]:
            by = {(row["method"], row["sparsity"]): row["exact_match"] for row in rc["rows"]}
            cells = "; ".join(f"{m} " + " / ".join(_num(by.get((m, x))) for x in r["sparsities"]) for m in r["methods"])
            lines.append((f"{s['skill']}, {rc['label']}", f"FT {_num(rc['ft_exact_match'])}; {cells}"))
    f = r["finding"]
    for skill, b in f["best"].items():
        lines.append((f"best at {f['budget']:g}, {skill}",
                      f"{b['method']} after {b['recipe']}: {_num(b['exact_match'])} of FT's {_num(b['ft_exact_match'])} "
                      f"({_pct(b['retained'])}; target {_pct(f['target_retained'])} "
                      f"{'met' if b['meets_target'] else 'not met'})"))
    budgets = " / ".join(f"{x:g}" for x in r["sparsities"])
    return pairs_table(lines) + f"\n\nexact match at budgets {budgets}; loss per token and paired intervals in report.md"


def pair(doc: dict) -> str:
    d = doc["pair"]
    if d.get("prompt"):
        p = d["prompt"]
        read = (f"a {d['kind']} read through its prompt '{p['template']}', label words "
                + ", ".join(f"{label} → {word!r}" for label, word in zip(p["labels"], p["words"]))
                + (" (chosen from the label names)" if p.get("chosen") else "") + "; its own LM head and the embeddings "
                "stay fixed")
    else:
        read = f"a classifier; head: {', '.join(d['head_tensors']) or 'none'}"
    lines = [("pair", f"{d['base']} → {d['finetuned']}  ({d['architecture']})"), ("reads as", read),
             ("labels", ", ".join(d["labels"]))]
    lines += [(f"{key} parameters", _count(d[f"{key}_params"])) for key in ("graftable", "head", "excluded", "total")]
    text = pairs_table(lines)
    preview = doc.get("preview")
    if preview:
        tokens = "; ".join(f"{label}: {' '.join(map(repr, toks))}" for label, toks in preview["label_tokens"].items())
        text += f"\n\nfirst training example as the model reads it:\n  {preview['prompt']}\nlabel tokens ({preview['scored']} " \
                f"is scored): {tokens}"
    return text + "".join(f"\n\n{task_preview(part)}" for part in doc.get("task_preview") or ())


def task_preview(part: dict) -> str:
    """A task's check before any job (``preview_task``): its name, how it is scored, its documents and the score
    compared, then its first scored document as the model reads it."""
    splits = ", ".join(f"{split} {n:,}" for split, n in part["splits"].items())
    text = (f"✓ {part['name']}: {part['form']}, {part['n']:,} {part['scored']} documents scored ({splits}); "
            f"compared by {part['metric'] or 'its first metric'}")
    first = part.get("first")
    if not first:
        return text + f"\n(its {part['scored']} split holds no document)"
    context = "\n".join(f"  {line}" for line in first["context"].split("\n"))
    if first["choices"]:
        after = "choices scored after it: " + ", ".join(
            repr(c) + (" (the answer)" if i == first["gold"] else "") for i, c in enumerate(first["choices"]))
    else:
        after = f"target: {first['target']!r}"
    return f"{text}\nfirst {part['scored']} document as the model reads it:\n{context}\n{after}"
