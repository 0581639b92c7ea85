"""The report of a ``graftui reproduce`` run, written from its saved steps alone: the document (``report.json``) with
the paper's claims judged against it, ``report.md`` in words, and the figures; and the names the plan and the report
share (a fine-tune's regime, an extra optimizer's step).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import card, figures
from ..config import BODY_LABELS, DEFAULT_SPARSITY, FT_LABEL, PROMPT_SPARSITY, FinetuneConfig
from ..formatting import difference, markdown_table, num, pct
from ..paths import atomic_write, short_ref
from ..version import __version__


# -- names the plan and the report share ----------------------------------------------------------
def regime(recipe: FinetuneConfig) -> str:
    """A prompt-based fine-tune's regime in words, from its recipe: the step's title and the report say the same."""
    return (("trained until the training loss plateaus: " if recipe.epochs > 1 else "a short fine-tune: ")
            + f"{recipe.optimizer.upper()} at lr {recipe.lr:g}, {recipe.epochs} epoch{'s' if recipe.epochs > 1 else ''}"
            + f" of {recipe.train_examples:,} examples")


def optimizer_key(optimizer: str, l1: float) -> str:
    """The step-name suffix of an extra fine-tune (Fig. 5): finetune-<key>, sweep-<key>."""
    return "optimizer-" + optimizer + ("-l1" if l1 else "")


# -- the report ------------------------------------------------------------------------------------
def _row(rows: list[dict], model, task: str | None = None, distribution: str = "in") -> dict | None:
    """The row of ``model`` (a name, or a tuple of names that mean one model)."""
    names = model if isinstance(model, tuple) else (model,)
    return next((r for r in rows if r["model"] in names and r["distribution"] == distribution
                 and (task is None or r["task"] == task)), None)


def _ratio(a, b):
    return None if a is None or not b else a / b


MIN_GAIN = 0.02  # a fine-tune that gains less over the bare body than this did not learn the task
METHOD_ORDER = ["learned", "top-movement", "random"]
BASELINES = ("top-movement", "random")


def _label_of(rows: list[dict], method: str | None = None) -> str | None:
    """The row label of the evaluate step's model made by ``method`` (None: the evaluated region itself, which
    is neither FT, nor the bare body, nor a baseline)."""
    for r in rows:
        if method is None and r["model"] not in (FT_LABEL, *BODY_LABELS) and r.get("method") not in BASELINES:
            return r["model"]
        if method is not None and r.get("method") == method:
            return r["model"]
    return None


def _paired(doc: dict, a: str | None, b: str | None, metric: str, task: str | None = None,
            **where) -> dict | None:
    """The step's paired difference a − b (on its own task unless ``task`` is given), if it has one; a replicate
    group's difference over seeds where ``a`` names the group."""
    task = task or doc.get("task")
    found = [*(doc.get("differences") or ()), *(d for g in doc.get("replicates") or () for d in g["differences"])]
    return next((d for d in found if d["a"] == a and d["b"] == b and d["metric"] == metric
                 and d["task"] == task and all(d.get(k) == v for k, v in where.items())), None)


def _graft(ev: dict) -> tuple[str, list[dict]]:
    """The evaluated graft's label and rows: the region, or the replicate group of its seeds (means, with std)."""
    group = next(iter(ev.get("replicates") or ()), None)
    if group:
        return group["name"], group["rows"]
    label = _label_of(ev["rows"])
    return label, [r for r in ev["rows"] if r["model"] == label]


def verdict(difference: dict | None, expected_sign: int) -> str:
    """A finding decided by its paired interval: "reproduces" where the interval lies on the expected side of
    zero, "contradicted" where it lies on the other, "undecided" where it holds zero (or is missing)."""
    if difference is None:
        return "undecided"
    lo, hi = difference["ci"]
    if (lo > 0 and expected_sign > 0) or (hi < 0 and expected_sign < 0):
        return "reproduces"
    if (lo > 0 and expected_sign < 0) or (hi < 0 and expected_sign > 0):
        return "contradicted"
    return "undecided"


def _calibration(doc: dict, setting: str) -> dict:
    rows = doc["rows"]
    graft_label, graft_rows = _graft(doc)
    ft, graft = _row(rows, FT_LABEL), _row(graft_rows, graft_label)
    change = _ratio(graft["ece"] - ft["ece"], ft["ece"])
    paired = _paired(doc, graft_label, FT_LABEL, "ece")
    return {"setting": setting, "task": doc["task"], "n": ft["n"],
            "ft": {"accuracy": ft["accuracy"], "ece": ft["ece"]},
            "graft": {"accuracy": graft["accuracy"], "ece": graft["ece"], "k": graft["region_size"],
                      "accuracy_std": graft.get("accuracy_std"), "ece_std": graft.get("ece_std"),
                      "seeds": len(graft.get("accuracy_seeds") or ()) or 1},
            "ece_change": change, "graft_better_calibrated": graft["ece"] < ft["ece"],
            "ece_difference": paired, "verdict": verdict(paired, -1),
            "reliability": {FT_LABEL: doc["reliability"].get(FT_LABEL),
                            "graft": doc["reliability"].get(_label_of(rows))}}


def _sweep_rows(ev: dict, ft_accuracy: float) -> list[dict]:
    """The evaluate step's graft and baselines as sweep rows (accuracy, ECE, OOD) at their budget."""
    out = []
    for name in METHOD_ORDER:
        label, rows = _graft(ev) if name == "learned" else (_label_of(ev["rows"], name), ev["rows"])
        row = _row(rows, label) if label else None
        if row is None:
            continue
        out.append({"method": name, "sparsity": DEFAULT_SPARSITY, "k": row["region_size"], "accuracy": row["accuracy"],
                    "accuracy_std": row.get("accuracy_std"), "accuracy_seeds": row.get("accuracy_seeds"),
                    "ece": row["ece"], "ece_std": row.get("ece_std"), "ood": {t: _row(rows, label, t, "OOD")["accuracy"] for t in ev["ood"]},
                    "ft_accuracy": ft_accuracy, "retained": _ratio(row["accuracy"], ft_accuracy)})
    return out


def _prompt_setting(scale, R: dict) -> dict:
    """The paper's main setting: a causal LM read through label words, its fine-tune, and the learned region at
    0.01 % against FT, the zero-shot prompt and the baselines, with paired differences (accuracy and ECE)."""
    ft_step, ev = R["finetune-prompt"], R["evaluate-prompt"]
    rows = ev["rows"]
    graft_label, graft_rows = _graft(ev)
    top = _label_of(rows, "top-movement")
    recipe = FinetuneConfig(**ft_step["config"])
    models = {"ft": _row(rows, FT_LABEL), "zero_shot": _row(rows, BODY_LABELS), "graft": _row(graft_rows, graft_label),
              "top_movement": _row(rows, top), "random": _row(rows, _label_of(rows, "random"))}
    return {
        "base": short_ref(ev.get("base") or scale.prompt["base"]), "task": ev["task"], "finetuned": ft_step["out"],
        "recipe": ft_step["config"], "regime": regime(recipe),
        "k": models["graft"]["region_size"], "sparsity": PROMPT_SPARSITY, "n": models["ft"]["n"],
        "seeds": len(models["graft"].get("accuracy_seeds") or ()) or 1,
        "models": {name: None if r is None else {"accuracy": r["accuracy"], "ece": r["ece"],
                                                 "accuracy_std": r.get("accuracy_std"), "ece_std": r.get("ece_std")}
                   for name, r in models.items()},
        "graft_minus_ft": {m: _paired(ev, graft_label, FT_LABEL, m) for m in ("accuracy", "ece")},
        "graft_minus_top_movement": {m: _paired(ev, graft_label, top, m) for m in ("accuracy", "ece")},
        "retained": _ratio(models["graft"]["accuracy"], models["ft"]["accuracy"]),
    }


def build_report(scale, R: dict, log: list[dict], seconds: float) -> dict:
    """report.json: one key per experiment, numbers only, and the findings (report.md says them in words)."""
    ev, sweep = R["evaluate"], R["sweep"]
    rows = ev["rows"]
    graft_label, graft_rows = _graft(ev)
    ft, bare, graft = _row(rows, FT_LABEL), _row(rows, BODY_LABELS), _row(graft_rows, graft_label)
    ood = {}
    for t in ev["ood"]:
        f, g = _row(rows, FT_LABEL, t, "OOD"), _row(graft_rows, graft_label, t, "OOD")
        ood[t] = {"ft": f["accuracy"], "graft": g["accuracy"], "retained": _ratio(g["accuracy"], f["accuracy"])}
    # the sweep leaves out the evaluated budget: its three regions come from the evaluate step
    sweep_rows = sorted(sweep["rows"] + _sweep_rows(ev, sweep["ft_accuracy"]),
                        key=lambda r: (r["sparsity"], METHOD_ORDER.index(r["method"])))
    by = {(r["method"], r["sparsity"]): r for r in sweep_rows}
    low = min(r["sparsity"] for r in sweep_rows)
    learned_low, top_low = by.get(("learned", low)), by.get(("top-movement", low))
    margin = (_paired(ev, graft_label, _label_of(rows, "top-movement"), "accuracy") if low == DEFAULT_SPARSITY else
              _paired(sweep, "learned", "top-movement", "accuracy", sparsity=low))
    baseline = {name: (_row(rows, _label_of(rows, name)) or {}).get("accuracy") for name in BASELINES}
    single = {
        "task": ev["task"], "ood": ev["ood"], "finetuned": R["finetune"]["out"], "recipe": R["finetune"]["config"],
        "k": graft["region_size"], "sparsity": DEFAULT_SPARSITY,
        "accuracy": {"ft": ft["accuracy"], "bare": bare["accuracy"], "graft": graft["accuracy"],
                     "top_movement": baseline["top-movement"], "random": baseline["random"]},
        "seeds": len(graft.get("accuracy_seeds") or ()) or 1, "graft_std": {
            "accuracy": graft.get("accuracy_std"), "ece": graft.get("ece_std"),
            "accuracy_seeds": graft.get("accuracy_seeds")},
        "graft_minus_ft": {m: _paired(ev, graft_label, FT_LABEL, m) for m in ("accuracy", "ece")},
        "graft_minus_top_movement": _paired(ev, graft_label, _label_of(rows, "top-movement"), "accuracy"),
        "retained": _ratio(graft["accuracy"], ft["accuracy"]),
        "gain_recovered": card.gain_recovered(graft["accuracy"], ft["accuracy"], bare["accuracy"]),
        "ood_transfer": ood,
        "rows": rows,
        "sweep": {"ft_accuracy": sweep["ft_accuracy"], "ft_ece": sweep.get("ft_ece"), "ft_ood": sweep.get("ft_ood", {}),
                  "rows": sweep_rows},
        "low_budget": {"sparsity": low,
                       "learned": learned_low and learned_low["accuracy"], "top_movement": top_low and top_low["accuracy"],
                       "retained": learned_low and learned_low["retained"],
                       "margin_over_top_movement": (learned_low["accuracy"] - top_low["accuracy"])
                       if learned_low and top_low else None, "margin_interval": margin},
        "differences": ev.get("differences") or [],
    }
    calibration = {"settings": [_calibration(ev, "standard head (trained with the body)"),
                                _calibration(R["evaluate-frozen-head"], "frozen head (the seed code's fixhead)")],
                   "not_measured": []}
    prompt = _prompt_setting(scale, R) if "evaluate-prompt" in R else None
    if prompt:
        calibration["settings"].append(_calibration(R["evaluate-prompt"], f"prompt-based ({prompt['regime']})"))
    else:
        calibration["not_measured"].append("prompt-based (label words scored by the LM head): a run made before "
                                           "this setting joined the plan")
    wise = {k: R["wise"][k] for k in ("task", "ood", "k", "rows")}
    mt = R["multitask"]
    multitask = {k: mt[k] for k in ("tasks", "overlap", "relative_gain", "union", "purified", "k", "sizes",
                                    "intersection_counts", "p_zero", "p_one", "scores", "checkpoint")}
    rt = R["retrain"]
    retrain = {"rows": rt["rows"], "trained": rt["trained"], "recipe": rt["recipe"], "task": rt["task"]}
    cl = R["continual"]
    continual = {k: cl[k] for k in ("tasks", "forget_free", "sequential", "forgetting", "trained", "finetuned_accuracy")}
    optimizers = {"SGD": {"ft_accuracy": sweep["ft_accuracy"], "rows": [r for r in sweep_rows
                                                                        if r["method"] in ("learned", "top-movement")]}}
    for label, optimizer, l1 in scale.optimizers:
        key = optimizer_key(optimizer, l1)
        optimizers[label] = {"ft_accuracy": R[f"sweep-{key}"]["ft_accuracy"], "rows": R[f"sweep-{key}"]["rows"]}
    notes = [f"{entry['step']}: {note}" for entry in log for note in (R[entry["step"]].get("notes") or [])]
    report = {
        "graftui_version": __version__, "mode": scale.name, "seconds": round(seconds, 1),
        "step_seconds": round(sum(entry["seconds"] or 0 for entry in log), 1), "notes": notes,
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "single_task": single, "prompt": prompt, "calibration": calibration, "wise": wise, "multitask": multitask, "retrain": retrain,
        "continual": continual, "optimizers": optimizers, "steps": log,
    }
    report["did_not_reproduce"], report["problems"] = did_not_reproduce(report), problems(report)
    return report


def did_not_reproduce(report: dict) -> list[str]:
    """The paper's findings this run contradicts, one sentence each."""
    s, out = report["single_task"], []
    low = s["low_budget"]
    if low["learned"] is not None and low["top_movement"] is not None and low["sparsity"] <= 1e-4 \
            and low["retained"] < 0.95:
        out.append(f"> 95 % of FT accuracy at sparsity ≤ 0.01 % (Fig. 2): here {_p(low['retained'])} at "
                   f"{low['sparsity']:g}.")
    for c in report["calibration"]["settings"]:
        if c.get("verdict", "contradicted" if not c["graft_better_calibrated"] else "") == "contradicted":
            out.append(f"lower ECE for the graft with a {c['setting']}: ECE {_f(c['graft']['ece'])} vs FT "
                       f"{_f(c['ft']['ece'])}" + (f", graft − FT {difference(c['ece_difference'])}"
                                                  if c.get("ece_difference") else "") + ".")
    return out


def problems(report: dict) -> list[str]:
    """What makes numbers of this run mean little: a model that did not learn, forget-free regions that forgot."""
    s, mt, cl = report["single_task"], report["multitask"], report["continual"]
    acc, out = s["accuracy"], []
    if acc["ft"] - acc["bare"] < MIN_GAIN:
        out.append(f"the fine-tuned model barely beats the bare body on {s['task']} ({_f(acc['ft'])} vs "
                   f"{_f(acc['bare'])}): shares of its gain are noise")
    for t, p0, p1 in zip(mt["tasks"], mt["p_zero"], mt["p_one"]):
        if p1 - p0 < MIN_GAIN:
            out.append(f"the multi-task model did not learn {t} (P_1 {_f(p1)} vs P_0 {_f(p0)}): Eq. 5 on {t} is "
                       "undefined or noise; fine-tune it again with a lower --ft-lr")
    ff = cl["forgetting"]["forget-free"]
    if max(abs(x) for x in ff) > 1e-9:  # zero by construction: earlier regions are never trained again
        out.append("forget-free regions forgot (a bug: earlier regions are never trained again): "
                   + ", ".join(f"{t} {_f(x)}" for t, x in zip(cl["tasks"], ff)))
    return out


# -- report.md -------------------------------------------------------------------------------------
def _f(x, digits: int = 3) -> str:
    return num(x, digits, missing="–")


def _p(x) -> str:
    return pct(x, 0, spaced=True)


def _fs(x, std=None, digits: int = 3) -> str:
    """A mean over seeds in the paper's way, "0.884 (0.010)"; one run's value alone."""
    return _f(x, digits) + (f" ({std:.{digits}f})" if std is not None and x is not None else "")


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _commands(report: dict, *names: str) -> str:
    by = {s["step"]: s for s in report["steps"]}
    return "\n".join(f"    {by[n]['command']}" for n in names if n in by)


def _header(report: dict) -> list[str]:
    out = [f"# Skill localization by grafting: the paper's experiments ({report['mode']} run)", "",
           f"graftui {report['graftui_version']}, {report['cpu_cores']} CPU cores; the steps took "
           f"{report['step_seconds'] / 60:.1f} minutes in all (this invocation {report['seconds'] / 60:.1f}). Every "
           "section names the commands that make its numbers again; `graftui run steps/<step>.json` re-runs one step "
           "from its saved request. The paper is Panigrahi et al., *Task-Specific Skill Localization in Fine-tuned "
           "Language Models*, ICML 2023.", ""]
    if report["mode"] != "full":
        out += ["> This is a reduced run (short fine-tunes, fewer test examples and curve points): its models are "
                "weaker than the full run's and its numbers are noisier.", ""]
    return out


def _single_task(report: dict) -> list[str]:
    s = report["single_task"]
    acc, low, sw = s["accuracy"], s["low_budget"], s["sweep"]
    seeds, spread = s.get("seeds", 1), s.get("graft_std") or {}
    over = f" (mean (std) over {seeds} mask-learning seeds)" if seeds > 1 else ""
    out = ["## 1. One skill, one small region (§3, Fig. 2, Tables 6–7)", "",
           f"Fine-tuned MiniLM on **{s['task']}** (test accuracy {_f(acc['ft'])}); the learned region at sparsity "
           f"{DEFAULT_SPARSITY:g} holds k = {s['k']:,} parameters. Its graft θ_pre + γ⊙(θ_ft − θ_pre) scores "
           f"{_fs(acc['graft'], spread.get('accuracy'))}{over}: **{_p(s['retained'])} of the fine-tuned accuracy**, and "
           f"{_p(s['gain_recovered'])} of the fine-tuning gain over the bare pre-trained body ({_f(acc['bare'])}). "
           f"Top-movement of the same size scores {_f(acc['top_movement'])}, a random region {_f(acc['random'])}.", ""]
    said = []
    for name, d, sign in (("graft − FT accuracy", (s.get("graft_minus_ft") or {}).get("accuracy"), 0),
                          ("graft − FT ECE", (s.get("graft_minus_ft") or {}).get("ece"), -1),
                          ("learned − top-movement", s.get("graft_minus_top_movement"), 1)):
        if d:
            said.append(f"- {name}: {difference(d)}" + (f" — {verdict(d, sign)}" if sign else ""))
    if said:
        out += [f"Differences on the same test examples (95 % intervals{'; over seeds they add the seeds’ spread' if seeds > 1 else ''}):",
                "", *said, ""]
    if s["ood_transfer"]:
        parts = [f"{t}: graft {_f(v['graft'])} vs FT {_f(v['ft'])} ({_p(v['retained'])} kept)"
                 for t, v in s["ood_transfer"].items()]
        better = [t for t, v in s["ood_transfer"].items() if v["retained"] is not None and s["retained"] is not None
                  and v["retained"] > s["retained"]]
        out += [f"Out of distribution — {'; '.join(parts)}. The graft keeps more of FT's accuracy out of distribution "
                f"than in it on {len(better)} of {len(s['ood_transfer'])} tasks"
                + (f" ({', '.join(better)})" if better else "") + ".", ""]
    oods = list(sw["ft_ood"])
    rows = [[FT_LABEL, "", "", _f(sw["ft_accuracy"]), "", _f(sw["ft_ece"]), *(_f(sw["ft_ood"][o]) for o in oods)]]
    rows += [[r["method"], f"{r['sparsity']:g}", f"{round(r['k']):,}", _fs(r["accuracy"], r.get("accuracy_std")),
              _p(r["retained"]), _fs(r["ece"], r.get("ece_std")), *(_f(r["ood"].get(o)) for o in oods)]
             for r in sw["rows"]]
    out += ["Sparsity sweep (accuracy, share of FT kept, ECE, and accuracy out of distribution"
            + (f"; mean (std) over {seeds} seeds" if seeds > 1 else "") + "):", "",
            markdown_table(["model", "sparsity", "k", "accuracy", "kept", "ECE", *(f"OOD {o}" for o in oods)], rows), ""]
    if low["learned"] is not None and low["top_movement"] is not None:
        d = low.get("margin_interval")
        out += [f"At the smallest budget ({low['sparsity']:g}) the learned region keeps {_p(low['retained'])} of FT; "
                "learned − top-movement: " + (difference(d) + f" (95 % interval; {verdict(d, 1)})" if d else
                                              f"{100 * low['margin_over_top_movement']:+.1f} points") + ".", ""]
    return out + ["Made by:", "", _commands(report, "finetune", "sweep", "localize", "evaluate"), ""]


def _prompt_md(report: dict) -> list[str]:
    p = report.get("prompt")
    if not p:
        return []
    m, seeds = p["models"], p["seeds"]
    over = f" (mean (std) over {seeds} mask-learning seeds)" if seeds > 1 else ""
    names = {"ft": "fine-tuned", "zero_shot": "pre-trained, same prompt (zero-shot)", "graft": "learned region (graft)",
             "top_movement": "top-movement, same size", "random": "random, same size"}
    out = ["## 1b. The paper's main setting: prompt-based fine-tuning", "",
           f"{p['base']} reads **{p['task']}** through a prompt whose label words its own LM head scores; the fine-tune "
           f"({p['regime']}) trains the body, the head and the embeddings stay fixed. The learned region at sparsity "
           f"{p['sparsity']:g} holds k = {p['k']:,} parameters; its graft keeps **{_p(p['retained'])} of the fine-tuned "
           f"accuracy** on {p['n']:,} test examples{over}.", "",
           markdown_table(["model", "accuracy", "ECE"],
                          [[names[k], _fs(v["accuracy"], v.get("accuracy_std")), _fs(v["ece"], v.get("ece_std"))]
                           for k, v in m.items() if v]), "",
           f"Differences on the same test examples (95 % intervals{'; over seeds they add the seeds’ spread' if seeds > 1 else ''}):", ""]
    for name, key, metric, sign in (("graft − FT accuracy", "graft_minus_ft", "accuracy", 0),
                                    ("graft − FT ECE", "graft_minus_ft", "ece", -1),
                                    ("learned − top-movement accuracy", "graft_minus_top_movement", "accuracy", 1),
                                    ("learned − top-movement ECE", "graft_minus_top_movement", "ece", 0)):
        d = p[key].get(metric)
        if d:
            out.append(f"- {name}: {difference(d)}" + (f" — {verdict(d, sign)}" if sign else ""))
    return out + ["", "Made by:", "", _commands(report, "finetune-prompt", "localize-prompt", "evaluate-prompt"), ""]


def _calibration_md(report: dict) -> list[str]:
    cal = report["calibration"]
    out = ["## 2. Calibration (Table 2)", "",
           "The paper reports a 40–90 % lower expected calibration error (ECE, 10 bins) for the graft than for the "
           "fine-tuned model, with prompt-based fine-tuning (a fixed LM head). Here, per head setting:", ""]
    out += [markdown_table(["setting", "FT accuracy", "FT ECE", "graft accuracy", "graft ECE", "ECE change"],
                           [[c["setting"], _f(c["ft"]["accuracy"]), _f(c["ft"]["ece"]),
                             _fs(c["graft"]["accuracy"], c["graft"].get("accuracy_std")),
                             _fs(c["graft"]["ece"], c["graft"].get("ece_std")),
                             "–" if c["ece_change"] is None else f"{100 * c['ece_change']:+.0f} %"]
                            for c in cal["settings"]]), ""]
    for c in cal["settings"]:
        d, said = c.get("ece_difference"), c.get("verdict")
        if d is None:  # a step saved before paired intervals: the sign alone
            said = "reproduces" if c["graft_better_calibrated"] else "does not reproduce"
            out.append(f"- {c['setting']}: the graft is {'better' if c['graft_better_calibrated'] else 'worse'} "
                       f"calibrated than FT — the finding **{said}** in this setting (sign only, no paired interval).")
            continue
        words = {"reproduces": "reproduces", "contradicted": "does not reproduce",
                 "undecided": "is not decided at this n"}[said]
        over = f", {d['seeds']} seeds" if (d.get("seeds") or 1) > 1 else ""
        out.append(f"- {c['setting']}: graft − FT ECE {difference(d)} (95 % interval on the same "
                   f"{d['n']:,} test examples{over}) — the finding **{words}** in this setting.")
    out += [f"- not measured: {x}." for x in cal["not_measured"]]
    return out + ["", "Reliability diagrams side by side: `figures/calibration.html`. Made by:", "",
                  _commands(report, "evaluate", "finetune-frozen-head", "localize-frozen-head", "evaluate-frozen-head"), ""]


def _optimizers_md(report: dict) -> list[str]:
    opt = report["optimizers"]
    if len(opt) <= 1:
        return ["## 3. Localization after SGD, AdamW and AdamW + ℓ1 (Fig. 5)", "", "Not in this run (the full run has it).",
                ""]
    sparsities = sorted({r["sparsity"] for v in opt.values() for r in v["rows"]})
    rows = []
    for label, v in opt.items():
        by = {(r["method"], r["sparsity"]): r for r in v["rows"]}
        rows.append([label, _f(v["ft_accuracy"]), *(f"{_f(by[('learned', x)]['accuracy'])} / "
                                                     f"{_f(by[('top-movement', x)]['accuracy'])}"
                                                     if ("learned", x) in by and ("top-movement", x) in by else "–"
                                                     for x in sparsities)])
    steps = [s_["step"] for s_ in report["steps"] if s_["step"].startswith(("finetune-optimizer", "sweep-optimizer"))]
    return [f"## 3. Localization after {', '.join(opt)} fine-tuning (Fig. 5)", "",
            "Learned / top-movement graft accuracy at each sparsity, for fine-tunes with each optimizer:", "",
            markdown_table(["fine-tuned with", "FT accuracy", *(f"{x:g}" for x in sparsities)], rows), "", "Made by:", "",
            _commands(report, *steps), ""]


def _wise_md(report: dict) -> list[str]:
    w = report["wise"]
    tasks = [w["task"], *w["ood"]]
    by = {(r["curve"], r["alpha"], r["task"]): r["accuracy"] for r in w["rows"]}
    alphas = sorted({r["alpha"] for r in w["rows"]})
    best = {c: max(alphas, key=lambda a: by.get((c, a, w["task"])) or 0) for c in ("WiSE-FT", "WiSE-graft")}
    return ["## 4. WiSE-FT and WiSE-graft (Fig. 7)", "",
            f"θ_pre + α·δ against θ_pre + α·γ⊙δ (k = {w['k']:,}); accuracy in distribution ({w['task']}) and out of it:",
            "", markdown_table(["α", *(f"FT {t}" for t in tasks), *(f"graft {t}" for t in tasks)],
                               [[f"{a:g}", *(_f(by.get(("WiSE-FT", a, t))) for t in tasks),
                                 *(_f(by.get(("WiSE-graft", a, t))) for t in tasks)] for a in alphas]), "",
            f"Best in-distribution accuracy: WiSE-FT {_f(by[('WiSE-FT', best['WiSE-FT'], w['task'])])} at α = "
            f"{best['WiSE-FT']:g}, WiSE-graft {_f(by[('WiSE-graft', best['WiSE-graft'], w['task'])])} at α = "
            f"{best['WiSE-graft']:g}. Figure: `figures/wise.html`. Made by:", "", _commands(report, "wise"), ""]


def _multitask_md(report: dict) -> list[str]:
    mt = report["multitask"]
    names = mt["tasks"]
    n = len(names)
    off = [(i, j) for i in range(n) for j in range(n) if i != j]
    out = ["## 5. Multi-task model: overlap, skill transfer, union, purification (§5.1, Fig. 8)", "",
           f"One MiniLM body fine-tuned on {', '.join(names)} at once (one head per task); each task's region has "
           f"k = {mt['k']:,}.", "", "Overlap |γ_row ∩ γ_col| / |γ_col| (Fig. 8a):", "",
           markdown_table(["region", *names], [[a, *(_p(x) for x in row)] for a, row in zip(names, mt["overlap"])]), "",
           "Relative gain (Eq. 5) of the row's region on the column's task, (P_γ − P_0) / (P_1 − P_0) (Fig. 8b):", "",
           markdown_table(["region", *names], [[a, *(_f(x, 2) for x in row)] for a, row in zip(names, mt["relative_gain"])]),
           "", markdown_table(["reference", *names], [["P_0: pre-trained body + task head", *(_f(x) for x in mt["p_zero"])],
                                                      ["P_1: the multi-task model", *(_f(x) for x in mt["p_one"])]]), ""]
    if off:
        lo = min(off, key=lambda ij: mt["overlap"][ij[0]][ij[1]])
        hi = max(off, key=lambda ij: mt["overlap"][ij[0]][ij[1]])
        diag = [mt["relative_gain"][i][i] for i in range(n)]
        cross = [mt["relative_gain"][i][j] for i, j in off if mt["relative_gain"][i][j] is not None]
        out += [f"The largest overlap is between {names[hi[0]]} and {names[hi[1]]} ({_p(mt['overlap'][hi[0]][hi[1]])}), "
                f"the smallest between {names[lo[0]]} and {names[lo[1]]} ({_p(mt['overlap'][lo[0]][lo[1]])}). A task's own "
                f"region recovers on average {_f(_mean(diag), 2)} of its gain; other tasks' regions "
                f"{_f(_mean(cross), 2)}.", ""]
    for label, key in (("Union", "union"), ("Purified union", "purified")):
        u = mt.get(key) or {}
        if u:
            out += [f"{label} of {', '.join(u['group'])} ({u['size']:,} parameters"
                    + (f", {u['steps']} mask steps on the joint loss" if key == "purified" else "") + "): relative gain "
                    + ", ".join(f"{t} {_f(g, 2)}" for t, g in zip(names, u["relative_gain"])) + "."]
    return out + ["", "Figures: `figures/multitask-overlap.html`, `figures/multitask-gain.html`. Made by:", "",
                  _commands(report, "multitask"), ""]


def _retrain_md(report: dict) -> list[str]:
    rt = report["retrain"]
    rows = [r for r in rt["rows"] if r["distribution"] == "in"]
    return ["## 6. Re-training the region from θ_pre (Table 1)", "",
            markdown_table(["model", "trained parameters", "accuracy", "ECE"],
                           [[r["model"], "all" if r["model"] == FT_LABEL else f"{rt['trained'].get(r['model'], 0):,}",
                             _f(r["accuracy"]), _f(r["ece"])] for r in rows]), "",
            "Training only the region from θ_pre (with the fine-tuned head, same recipe) against taking the fine-tuned "
            "values (graft) and against BitFit, which trains every bias. Made by:", "", _commands(report, "retrain"), ""]


def _continual_md(report: dict) -> list[str]:
    cl = report["continual"]
    names = cl["tasks"]
    out = ["## 7. Forget-free continual learning (§5.2, Table 4)", ""]
    for label, key in (("Forget-free: task t_n trains only γ_tn minus the earlier regions", "forget_free"),
                       ("Naive sequential fine-tuning of the whole body", "sequential")):
        out += [f"{label}; accuracy on every task after each stage:", "",
                markdown_table(["after", *names], [[names[i], *(_f(x) for x in row)] for i, row in enumerate(cl[key])]),
                ""]
    ff, sq = cl["forgetting"]["forget-free"], cl["forgetting"]["sequential"]
    out += ["Forgetting (accuracy right after a task's own stage minus after the last stage): forget-free "
            + ", ".join(f"{t} {_f(x)}" for t, x in zip(names, ff)) + "; sequential "
            + ", ".join(f"{t} {_f(x)}" for t, x in zip(names, sq)) + ".", "",
            f"Forget-free regions lose nothing by construction (checked: {_f(max(abs(x) for x in ff))}); the finding is "
            f"how much sequential fine-tuning forgets (up to {_f(max(sq))}) and what the regions cost at each task's own "
            "stage (compare the diagonals).", ""]
    return out + ["Figure: `figures/continual.html`. Made by:", "", _commands(report, "continual"), ""]


def _closing(report: dict) -> list[str]:
    failed, trouble = report["did_not_reproduce"], report["problems"]
    out = ["## Problems with this run", ""] + [f"- {x}" for x in trouble] + [""] if trouble else []
    out += ["## What did not reproduce here", ""]
    out += [f"- {x}" for x in failed] or ["- Every check above held in this run"
                                          + (" (but see the problems above)." if trouble else ".")]
    if report["notes"]:
        out += ["", "## Notes from the steps", ""] + [f"- {x}" for x in report["notes"]]
    return out + ["", "## Steps", "", markdown_table(["step", "seconds", "", "command"],
                                                     [[x["step"], _f(x["seconds"], 0), "reused" if x["reused"] else "",
                                                       f"`{x['command']}`"] for x in report["steps"]]), ""]


def write_markdown(report: dict) -> str:
    """report.md: the report in words, section by section (it reads the report and changes nothing in it)."""
    sections = (_header, _single_task, _prompt_md, _calibration_md, _optimizers_md, _wise_md, _multitask_md, _retrain_md,
                _continual_md, _closing)
    return "\n".join(line for section in sections for line in section(report))


def write_figures(folder: Path, report: dict) -> list[str]:
    """One standalone HTML file per figure (plotly.js once, beside them)."""
    folder.mkdir(parents=True, exist_ok=True)
    s, cal = report["single_task"], report["calibration"]
    made = {
        "sweep": figures.sweep_figure(s["sweep"]["rows"], s["task"]),
        "calibration": figures.reliability_side_by_side(
            [(c["setting"], {k: v for k, v in c["reliability"].items() if v}) for c in cal["settings"]]),
        "wise": figures.wise_curves(report["wise"]["rows"]),
        "multitask-overlap": figures.overlap_heatmap({"names": report["multitask"]["tasks"], **report["multitask"]}),
        "multitask-gain": figures.gain_heatmap(report["multitask"]),
        "continual": figures.continual_curves(report["continual"]),
    }
    for name, fig in made.items():
        atomic_write(folder / f"{name}.html",
                     lambda tmp, fig=fig: fig.write_html(tmp, include_plotlyjs="directory", full_html=True))
    return sorted(f"figures/{name}.html" for name in made)


# -- the generative section: Fig. 5 on completion skills ---------------------------------------------
TARGET_RETAINED = 0.8  # a 0.1 % region keeping this share of the fine-tune's exact match "fits in a small region"
LEARNED_SKILL = 0.5  # a fine-tune below this exact match did not learn the skill: its regions are not candidates


def build_generative_report(mode: str, study, R: dict, log: list[dict], seconds: float) -> dict:
    """report.json of ``--section generative``: per skill and recipe, the fine-tune's exact match and each method's at
    each budget (mean and std over seeds, loss per token beside it), every two methods paired on the same items."""
    skills = []
    for skill in study.skills:
        recipes = []
        for r in study.recipes:
            if f"sweep-{skill}-{r.key}" not in R:  # a report of the steps saved so far
                continue
            ft, sw = R[f"finetune-{skill}-{r.key}"], R[f"sweep-{skill}-{r.key}"]
            rows = [{k: row.get(k) for k in ("method", "sparsity", "k", "n", "exact_match", "accuracy_std", "loss",
                                             "retained")} for row in sw["rows"]]
            found = [d for d in sw.get("differences") or () if d.get("metric") in ("exact_match", "loss")
                     and d.get("a") in study.methods and d.get("b") in study.methods]
            recipes.append({"label": r.label, "key": r.key, "optimizer": r.optimizer, "lr": r.lr, "l1": r.l1,
                            "finetuned": ft["out"], "ft_exact_match": sw["ft_accuracy"],
                            "pre_exact_match": sw.get("body_accuracy"), "rows": rows, "differences": found})
        skills.append({"skill": skill, "recipes": recipes})
    return {"section": "generative", "mode": mode, "graftui_version": __version__, "cpu_cores": os.cpu_count(),
            "base": study.base,
            "sparsities": list(study.sparsities), "methods": list(study.methods), "seeds": study.seeds, "n": study.n,
            "skills": skills, "finding": generative_finding(skills), "steps": log, "seconds": seconds,
            "step_seconds": sum(x["seconds"] for x in log),
            "notes": [f"{entry['step']}: {note}" for entry in log for note in (R[entry["step"]].get("notes") or [])]}


def generative_finding(skills: list[dict], budget: float = 1e-3) -> dict:
    """Per skill, the recipe and method whose region at ``budget`` keeps most of its fine-tune's exact match, and
    whether that is the target share (a recipe whose fine-tune did not learn the skill does not count)."""
    best = {}
    for s in skills:
        options = [(row["exact_match"] / r["ft_exact_match"], r["label"], row["method"], row["exact_match"],
                    r["ft_exact_match"]) for r in s["recipes"] for row in r["rows"]
                   if row["sparsity"] == budget and r["ft_exact_match"] and r["ft_exact_match"] >= LEARNED_SKILL]
        if options:
            share, recipe, method, em, ft = max(options)
            best[s["skill"]] = {"recipe": recipe, "method": method, "exact_match": em, "ft_exact_match": ft,
                                "retained": share, "meets_target": share >= TARGET_RETAINED}
    return {"budget": budget, "target_retained": TARGET_RETAINED, "best": best}


def _pair(found: list[dict], a: str, b: str, sparsity: float) -> dict | None:
    """a − b in exact match at ``sparsity``, whichever order the sweep paired them in (b − a is turned round)."""
    for d in found:
        if d["metric"] == "exact_match" and d["sparsity"] == sparsity and {d["a"], d["b"]} == {a, b}:
            if d["a"] == a:
                return d
            lo, hi = d["ci"]
            return {**d, "a": a, "b": b, "diff": -d["diff"], "ci": [-hi, -lo]}
    return None


def _generative_md(report: dict) -> list[str]:
    budgets, methods = report["sparsities"], report["methods"]
    seeds = report["seeds"]
    over = f"mean (std) over {seeds} mask-learning seeds" if seeds > 1 else "one mask-learning seed"
    out = [f"# Skill localization on generative skills: the paper's Fig. 5 on {report['base']} ({report['mode']} run)",
           "", f"graftui {report['graftui_version']}, {report['cpu_cores']} CPU cores; the steps took "
           f"{report['step_seconds'] / 60:.1f} minutes in all. Each skill is fine-tuned with each recipe (the default "
           "skill recipe's data and steps), and each fine-tune is localized at each budget by each method. A cell is "
           f"the graft's exact match on {report['n']} held-out items ({over}) and its loss per reference token; the "
           "paper (§3, Fig. 5) finds that AdamW fine-tunes hold no sparse graft and that an ℓ1 penalty on the "
           "movement restores one.", ""]
    for s in report["skills"]:
        out += [f"## {s['skill']}", ""]
        rows = []
        for r in s["recipes"]:
            by = {(row["method"], row["sparsity"]): row for row in r["rows"]}
            rows.append([f"**{r['label']}**", "fine-tuned", f"**{_f(r['ft_exact_match'])}**",
                         *[""] * (len(budgets) - 1)])
            for m in methods:
                rows.append(["", m, *(f"{_fs(by[(m, b)]['exact_match'], by[(m, b)].get('accuracy_std'))} "
                                      f"({_f(by[(m, b)]['loss'], 2)})" if (m, b) in by else "–" for b in budgets)])
        out += [markdown_table(["recipe", "model", *(f"{b:g}" for b in budgets)], rows), ""]
        pairs = [("budget-true", "learned"), ("learned", "top-movement"), ("budget-true", "top-movement")]
        lines = []
        for r in s["recipes"]:
            for a, b in pairs:
                for x in budgets:
                    d = _pair(r["differences"], a, b, x)
                    if d is not None:
                        lines.append([r["label"], f"{a} − {b}", f"{x:g}", difference(d)])
        if lines:
            out += ["Paired differences of exact match on the same items (95 % interval):", "",
                    markdown_table(["recipe", "difference", "budget", "exact match"], lines), ""]
    f = report["finding"]
    out += ["## Finding", ""]
    for skill, b in f["best"].items():
        out.append(f"- **{skill}** at {f['budget']:g}: the best region is {b['method']} after {b['recipe']}, exact "
                   f"match {_f(b['exact_match'])} of the fine-tune's {_f(b['ft_exact_match'])} "
                   f"({_p(b['retained'])}); the target of {_p(f['target_retained'])} is "
                   f"{'met' if b['meets_target'] else 'not met'}.")
    if not f["best"]:
        out.append(f"- No recipe's fine-tune learned a skill (exact match ≥ {LEARNED_SKILL:g}), so nothing here is "
                   "localized.")
    out += ["", "## Steps", "", markdown_table(["step", "seconds", "", "command"],
                                               [[x["step"], _f(x["seconds"], 0), "reused" if x["reused"] else "",
                                                 f"`{x['command']}`"] for x in report["steps"]]), ""]
    if report["notes"]:
        out += ["## Notes from the steps", ""] + [f"- {x}" for x in report["notes"]] + [""]
    return out


def write_report(out: Path, report: dict) -> None:
    if report.get("section") == "generative":
        atomic_write(out / "report.json", lambda tmp: Path(tmp).write_text(json.dumps(report, indent=2)))
        atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text("\n".join(_generative_md(report))))
        return
    text = write_markdown(report)
    report["figures"] = write_figures(out / "figures", report)
    atomic_write(out / "report.json", lambda tmp: Path(tmp).write_text(json.dumps(report, indent=2)))
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text(text))
