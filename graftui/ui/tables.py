"""Each result as the labelled tables the app shows, built from the job's result alone (so a reload or a restart
rebuilds them)."""

from __future__ import annotations

import pandas as pd

from .. import card
from ..config import BODY_LABELS, FT_LABEL
from ..formatting import difference_value, num, pct, undecided
from ..tasks.classification.scoring import MAX_DISAGREEMENTS as MAX_SHOWN
from ..kinds import CLASSIFICATION, COMPLETION_KIND, kind_in
from .kinds import app_of
from .jobwords import md


# The headers under which the tables below (and the Laboratory's) hold numbers, dates and ids: the page never
# wraps such a cell, so a number is never split across lines ("0.8 / 29"); the other cells wrap between words.
NUMBER_COLUMNS = frozenset({
    "density (in region / tensor size)", "fan-in", "density (in region / fan-in)", "accuracy without it",
    "drop [95 % CI]", "mean per seed", "core (every seed)", "core / mean", "chance", "× chance",
    "held-out ↑ (n)", "FT held-out ↑", "mean IoU with the other seeds", "overlap with top movement",
    "n", "accuracy ↑ [95 % CI]", "share of FT gain", "Δ vs FT", "− top movement [95 % CI]", "− random [95 % CI]", "F1 ↑", "ECE ↓", "agree w/ FT", "k (params)",
    "sparsity (fraction of graftable)", "accuracy ↑", "retained FT accuracy", "ECE ↓ (10 bins)", "test examples",
    "Δ accuracy vs region alone", "params grafted", "|γi|", "|γj|", "|γi ∩ γj| shared params", "|γi ∩ γj| / |γj|",
    "|γi ∩ γj| / |γi|", "IoU", "in region", "graftable", "density (in region / graftable)", "share of region",
    "share of graftable", "created (UTC)", "progress", "duration", "count", "share of total", "size",
    "relative gain", "accuracy", "parameters trained", "α", "difference [95 % CI]", "McNemar p", "p", "FT p",
    "graft p", "budget", "exact match", "OOD accuracy", "score mean", "score spread (std)",
    "score min – max", "ECE ↓ mean", "OOD accuracy mean", "runs", "scored",
})


def pct_cell(v) -> str:
    return pct(v, 1, missing="")


def num_cell(v, digits: int = 3) -> str:
    return num(v, digits, missing="")


COMPARE_COLUMNS = list(app_of(CLASSIFICATION).app_columns)
COMPLETION_COLUMNS = list(app_of(COMPLETION_KIND).app_columns)


def compare_table(result: dict) -> pd.DataFrame:
    """One row per (model, task), in the columns of its task kind; the note under the table says what each is."""
    kind = kind_in(result)
    return pd.DataFrame(app_of(kind).app_rows(result), columns=list(app_of(kind).app_columns))


GENERATION_WIDTH = 80  # characters of an answer or a generation a cell shows at most (the bundle holds them whole)
GENERATIONS_ROOM = 200  # characters the models' cells of one row share: one model's long generation (a baseline's
# babble) cannot push the others off the screen
GENERATIONS_LABEL = ("Generations on the first test examples: the fine-tuned model, each graft and baseline, then the "
                     "pre-trained model (texts cut to share the table's width; the report bundle holds them whole)")


def generation_width(models: int) -> int:
    """Characters of each text a model's cell shows when ``models`` share a row: GENERATIONS_ROOM between them, at
    least 24 and at most GENERATION_WIDTH each."""
    return max(24, min(GENERATION_WIDTH, GENERATIONS_ROOM // max(models, 1)))


def generations_table(result: dict) -> pd.DataFrame:
    """Prompt, reference, the reference's answer under the rule, and each model's answer and greedy generation side
    by side, marked as it was judged (``card.generation_cell``): the fine-tuned model first, then the grafts and
    baselines, the pre-trained model (whose generations run longest) last."""
    shown = result.get("generations") or []
    listed = list(dict.fromkeys(r["model"] for r in result.get("rows") or []))
    last = [m for m in listed if m in BODY_LABELS]
    models = [m for m in listed if m == FT_LABEL] + [m for m in listed if m != FT_LABEL and m not in last] + last
    width = generation_width(len(models))
    out = [{"task": g.get("task", ""), "prompt": g["prompt"], "reference": g["reference"],
            "reference answer": g.get("reference_answer") or "",
            **{m: card.generation_cell(g, m, width) for m in models if m in g}} for g in shown]
    return pd.DataFrame(out, columns=["task", "prompt", "reference", "reference answer", *models])


STITCH_COLUMNS = ["task", "model", "test examples", "accuracy / exact match ↑", "loss/token ↓", "params grafted"]


def stitch_table(result: dict) -> pd.DataFrame:
    """Stitching: every model on every member's task (the stitched union, each fine-tune, task arithmetic)."""
    out = [{"task": r["task"], "model": r["model"], "test examples": r["n"], "accuracy / exact match ↑": pct_cell(r["accuracy"]),
            "loss/token ↓": num_cell(r.get("loss")) if "loss" in r else "",
            "params grafted": f"{r['region_size']:,}" if r.get("region_size") is not None else ""}
           for r in result.get("rows") or []]
    return pd.DataFrame(out, columns=STITCH_COLUMNS)


DIFFERENCE_COLUMNS = ["a − b", "task", "dist.", "metric", "difference [95 % CI]", "McNemar p", "reading"]


SEEDS_COLUMNS = ["region", "k (params)", "held-out ↑ (n)", "FT held-out ↑", "mean IoU with the other seeds",
                 "overlap with top movement"]


def seeds_table(result: dict) -> pd.DataFrame:
    """A localize run over seeds as a table: each seed's region (its size, its quick held-out score beside FT's on the
    same examples, how alike it is to the other seeds and to top movement), the mean ± spread over the seeds, then
    the core (what every seed found) and the union (what any found), which the button below scores on Compare."""
    seeds, st = result.get("seeds") or [], result.get("stability") or {}
    if len(seeds) < 2 or not st:
        return pd.DataFrame([], columns=SEEDS_COLUMNS)
    iou = st.get("pairwise_iou") or []

    def mean_iou(i: int) -> float | None:
        others = [iou[i][j] for j in range(len(seeds)) if j != i and i < len(iou) and j < len(iou[i])]
        return sum(others) / len(others) if others else None

    def spread(values: list, cell) -> str:
        known = [v for v in values if v is not None]
        if not known:
            return ""
        mean = sum(known) / len(known)
        sd = (sum((v - mean) ** 2 for v in known) / (len(known) - 1)) ** 0.5 if len(known) > 1 else 0.0
        return f"{cell(mean)} ± {cell(sd)}"

    rows, held = [], [(e.get("check") or {}) for e in seeds]  # a record from before these were kept has none
    for i, e in enumerate(seeds):
        check = held[i]
        rows.append({"region": f"seed {e['seed']}", "k (params)": f"{e['k']:,}" if e.get("k") is not None else "",
                     "held-out ↑ (n)": "" if check.get("accuracy") is None else
                     f"{pct_cell(check['accuracy'])} ({check['n']:,})",
                     "FT held-out ↑": pct_cell(check.get("ft")) if check.get("ft") is not None else "",
                     "mean IoU with the other seeds": num_cell(mean_iou(i)),
                     "overlap with top movement": pct_cell(e.get("top_movement_overlap"))
                     if e.get("top_movement_overlap") is not None else ""})
    rows.append({"region": f"mean ± spread over {len(seeds)} seeds",
                 "k (params)": spread([e.get("k") for e in seeds], lambda v: f"{v:,.0f}"),
                 "held-out ↑ (n)": spread([c.get("accuracy") for c in held], pct_cell),
                 "FT held-out ↑": spread([c.get("ft") for c in held], pct_cell),
                 "mean IoU with the other seeds": spread([mean_iou(i) for i in range(len(seeds))], num_cell),
                 "overlap with top movement": spread([e.get("top_movement_overlap") for e in seeds], pct_cell)})
    for how, words in (("core", "core (every seed)"), ("union", "union (any seed)")):
        rows.append({"region": words, "k (params)": f"{st[how]:,}" if st.get(how) is not None else "",
                     "held-out ↑ (n)": "scored by the button below" if st.get(f"{how}_path") else "not written",
                     "FT held-out ↑": "", "mean IoU with the other seeds": "", "overlap with top movement": ""})
    return pd.DataFrame(rows, columns=SEEDS_COLUMNS)


def differences_table(result: dict) -> pd.DataFrame:
    """Every paired difference of a result (a − b on the same test examples), those of its replicate groups over
    seeds included: the number, its interval, and whether the interval tells the two apart."""
    found = [*(result.get("differences") or ()), *(d for g in result.get("replicates") or () for d in g["differences"])]
    out = []
    for d in found:
        lo, hi = d["ci"]
        m = d.get("seeds") or 1
        apart = "higher" if lo > 0 else "lower" if hi < 0 else None
        out.append({"a − b": f"{d['a']} − {d['b']}", "task": d["task"],
                    "dist.": "ID" if d.get("distribution", "in") == "in" else "OOD",
                    "metric": "ECE" if d["metric"] == "ece" else d["metric"],
                    "difference [95 % CI]": difference_value(d, f" ({m} seeds)" if m > 1 else ""),
                    "McNemar p": "" if d.get("p") is None else f"{d['p']:.3g}",
                    "reading": f"a is {apart}" if apart else undecided(d)})
    return pd.DataFrame(out, columns=DIFFERENCE_COLUMNS)


DISAGREEMENT_COLUMNS = ["graft", "text", "label", "FT says", "FT p", "graft says", "graft p"]


def disagreements_table(result: dict) -> pd.DataFrame:
    """The test examples on which a graft decides unlike FT, the graft's most confident first: the page's table
    sorts by any column."""
    out = [{"graft": d["model"], "text": d["text"] + (f" ‖ {d['pair']}" if d.get("pair") else ""), "label": d["label"],
            "FT says": d["ft"], "FT p": pct_cell(d["ft_confidence"]), "graft says": d["graft"],
            "graft p": pct_cell(d["graft_confidence"])} for d in result.get("disagreements") or []]
    return pd.DataFrame(out, columns=DISAGREEMENT_COLUMNS)


def disagreements_note(result: dict) -> str:
    """How many examples each graft decides unlike FT, of how many scored."""
    n = {r["model"]: r["n"] for r in result.get("rows") or [] if r.get("distribution") == "in"}
    counts = {d["model"]: d["of"] for d in result.get("disagreements") or []}
    parts = [f"**{md(m)}** {c:,} of {n.get(m, 0):,}" for m, c in counts.items()]
    return ("Test examples on which a graft decides unlike the fine-tuned model: " + "; ".join(parts)
            + (f" (the {MAX_SHOWN} most confident of each are listed)" if any(c > MAX_SHOWN for c in counts.values())
               else "") + "." if parts else "")


def retrain_table(result: dict) -> pd.DataFrame:
    """The re-training's rows as a comparison's, with the same readings (share of FT gain, calibration), which
    the re-training flow does not add to its rows."""
    return compare_table({**result, "rows": card.annotate([dict(r) for r in result.get("rows") or []])})


WISE_COLUMNS = ["α", "curve", "task", "accuracy ↑", "ECE ↓"]


def wise_table(rows: list[dict]) -> pd.DataFrame:
    """The WiSE curves as numbers, both curves side by side at each α."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    out = [{"α": f"{r['alpha']:g}", "curve": r["curve"], "task": r["task"] + (" (OOD)" if r.get("distribution") == "OOD" else ""),
            "accuracy ↑": pct_cell(r["accuracy"]), "ECE ↓": num_cell(r.get("ece"))}
           for r in sorted(rows, key=lambda r: (r["alpha"], tasks.index(r["task"]), r["curve"]))]
    return pd.DataFrame(out, columns=WISE_COLUMNS)


SWEEP_COLUMNS = ["method", "sparsity (fraction of graftable)", "k (params)", "accuracy ↑", "retained FT accuracy", "ECE ↓ (10 bins)"]


def sweep_table(rows: list[dict]) -> pd.DataFrame:
    """One row per (budget, method); one more column per OOD task the sweep scored."""
    oods = list(dict.fromkeys(t for r in rows for t in (r.get("ood") or {})))
    out = [{
        "method": r["method"],
        "sparsity (fraction of graftable)": f"{r['sparsity']:.0e}",
        "k (params)": f"{r['k']:,}",
        "accuracy ↑": pct_cell(r["accuracy"]),
        "retained FT accuracy": pct_cell(r.get("retained")),
        "ECE ↓ (10 bins)": num_cell(r.get("ece")),
        **{f"OOD {t} ↑": pct_cell((r.get("ood") or {}).get(t)) for t in oods},
    } for r in rows]
    return pd.DataFrame(out, columns=SWEEP_COLUMNS + [f"OOD {t} ↑" for t in oods])


COMPOSE_COLUMNS = ["task", "head from", "model", "test examples", "accuracy ↑", "Δ accuracy vs region alone", "F1 ↑",
                   "ECE ↓ (10 bins)", "params grafted"]


def compose_table(result: dict) -> pd.DataFrame:
    if result.get("stitch"):
        return stitch_table(result)
    out = [{
        "task": r["task"],
        "head from": r["head"],
        "model": r["model"],
        "test examples": r["n"],
        "accuracy ↑": pct_cell(r["accuracy"]),
        "Δ accuracy vs region alone": f"{100 * r['delta_vs_alone']:+.1f} pts",
        "F1 ↑": num_cell(r["f1"]),
        "ECE ↓ (10 bins)": num_cell(r["ece"]),
        "params grafted": f"{r['region_size']:,}" if r.get("region_size") is not None else "",
    } for r in result.get("rows") or []]
    return pd.DataFrame(out, columns=COMPOSE_COLUMNS)


def compose_report_text(report: dict | None) -> str:
    """How the union was built: sizes, shared parameters and the rule that settled them."""
    if not report:
        return ""
    rule = {"mean": "base + mean of the contributors' movements", "first": "the first region listed wins",
            "last": "the last region listed wins"}.get(report["resolve"], report["resolve"])
    sizes = ", ".join(f"{name}: {k:,}" for name, k in report["sizes"].items())
    pairs = [f"{a} ∩ {b}: {c:,}" for a, inner in report["per_pair"].items() for b, c in inner.items()]
    return (f"**Union graft: {report['union_params']:,} parameters** (region sizes {sizes}). "
            f"**{report['overlap_params']:,}** parameters are claimed by two or more regions"
            + (f" ({'; '.join(pairs)})" if pairs else "")
            + f"; rule for them: **{report['resolve']}** ({rule}).")


OVERLAP_COLUMNS = ["region i", "region j", "|γi|", "|γj|", "|γi ∩ γj| shared params", "|γi ∩ γj| / |γj|", "|γi ∩ γj| / |γi|", "IoU"]


def overlap_summary(matrix: dict | None) -> pd.DataFrame:
    if not matrix:
        return pd.DataFrame(columns=OVERLAP_COLUMNS)
    names, inter, sizes = matrix["names"], matrix["intersection_counts"], matrix["sizes"]
    rows = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            rows.append({"region i": names[i], "region j": names[j], "|γi|": f"{sizes[i]:,}", "|γj|": f"{sizes[j]:,}",
                         "|γi ∩ γj| shared params": f"{inter[i][j]:,}",
                         "|γi ∩ γj| / |γj|": pct_cell(matrix["overlap"][i][j]), "|γi ∩ γj| / |γi|": pct_cell(matrix["overlap"][j][i]),
                         "IoU": pct_cell(matrix["iou"][i][j])})
    return pd.DataFrame(rows, columns=OVERLAP_COLUMNS)


WEIGHT_BIAS_COLUMNS = ["parameter kind", "in region", "graftable", "density (in region / graftable)", "share of region"]


def weight_bias_table(anat) -> pd.DataFrame:
    rows = []
    for kind, count, total in (("weights", anat.weight_count, anat.weight_total), ("biases", anat.bias_count, anat.bias_total)):
        rows.append({"parameter kind": kind, "in region": f"{count:,}", "graftable": f"{total:,}",
                     "density (in region / graftable)": f"{count / total:.4%}" if total else "",
                     "share of region": f"{count / max(anat.weight_count + anat.bias_count, 1):.1%}"})
    return pd.DataFrame(rows, columns=WEIGHT_BIAS_COLUMNS)


META_KEYS = [
    ("kind", "file kind (patch = with fine-tuned values)"), ("method", "method"), ("task", "task"), ("base", "base model"),
    ("finetuned", "fine-tuned model"), ("k", "k (parameters in region)"), ("graftable_params", "graftable parameters"),
    ("fraction_of_graftable", "fraction of graftable"), ("fraction_of_all", "fraction of all parameters"),
    ("budget", "budget asked for"), ("labels", "labels"), ("architecture", "architecture"),
    ("train_examples", "training examples (mask learning)"), ("learn", "mask-learning settings"),
    ("base_sha256", "base sha256"), ("finetuned_sha256", "fine-tuned sha256"), ("library_version", "graftui version"),
    ("created", "created (UTC)"),
]


def region_meta_table(record) -> pd.DataFrame:
    if record is None:
        return pd.DataFrame(columns=["field", "value"])
    meta = {"kind": "patch" if record.is_patch else "region", **record.meta, "k": record.size}
    rows = []
    for key, label in META_KEYS:
        if key not in meta or meta[key] is None:
            continue
        v = meta[key]
        if isinstance(v, float):
            v = f"{v:.4%}" if key.startswith("fraction") else f"{v:g}"
        elif isinstance(v, int):
            v = f"{v:,}"
        elif isinstance(v, (list, dict)):
            v = ", ".join(map(str, v)) if isinstance(v, list) else ", ".join(f"{a}={b}" for a, b in v.items())
        rows.append({"field": label, "value": str(v)})
    rows.append({"field": "tensors touched", "value": f"{len(record.indices):,} of {len(record.shapes):,} graftable tensors"})
    return pd.DataFrame(rows, columns=["field", "value"])


COUNT_COLUMNS = ["parameters", "count", "share of total"]


COUNT_ROWS = [
    ("graftable", "graftable (may be in a region: shared body, embeddings excluded)"),
    ("head", "head-only (fine-tuned classifier, always taken from FT)"),
    ("excluded", "excluded (shared but frozen out, e.g. embeddings)"),
    ("total", "total (all parameters of the fine-tuned model)"),
]


def share(x: float) -> str:
    """A share of the total in the counts table: two decimals, or as many as keep it non-zero (0.0034%)."""
    return pct(x, 2) if x == 0 or x >= 0.01 else pct(x)


def counts_table(counts: dict | None) -> pd.DataFrame:
    """Parameter counts of a pair; blank cells until the pair has been checked."""
    counts = counts or {}
    total = max(int(counts.get("total") or 0), 1)
    rows = [{"parameters": label,
             "count": f"{int(counts[key]):,}" if key in counts else "not checked yet",
             "share of total": share(int(counts[key]) / total) if key in counts else ""}
            for key, label in COUNT_ROWS]
    return pd.DataFrame(rows, columns=COUNT_COLUMNS)


PREDICT_COLUMNS = list(app_of(CLASSIFICATION).predict_columns)


GENERATION_COLUMNS = list(app_of(COMPLETION_KIND).predict_columns)


def predict_table(result: dict) -> pd.DataFrame:
    """One row per sentence, the models side by side: the class each picks, its probability, and ≠ FT where it decides
    otherwise than the fine-tuned model. For completion regions one row per model: its greedy generation for the
    prompt, and whether its answer is the fine-tuned model's (the task kind's ``predict_rows``)."""
    words = app_of(kind_in(result, "kind"))
    return pd.DataFrame(words.predict_rows(result), columns=words.predict_table_columns(result))
