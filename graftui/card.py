"""Result cards: what a table of numbers says, in a sentence or two.

Every graft row gets the same readings wherever it is shown (the app, the CLI's text and ``--json``):

- ``accuracy_ci``: the 95 % Wilson interval of its accuracy on ``n`` test examples;
- ``ft_kept``: graft accuracy / fine-tuned accuracy;
- ``gain_recovered``: (graft − bare) / (FT − bare), "bare" being the pre-trained body with the
  fine-tuned head (the empty region): the share of what fine-tuning gained that the region brings
  back (the single-task form of the paper's Eq. 5); None where fine-tuning gained nothing;
- ``calibration``: over- or under-confident (mean confidence above or below accuracy), or balanced
  (within 2 points; the ECE can still be large when bins err both ways);
- ``vs_random`` / ``vs_top_movement``: accuracy over the baseline region of the same size.

Every difference a sentence states comes with its paired 95 % interval on the same test examples
(``metrics.paired_difference``), and says so when the interval holds zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import FT_LABEL, LM_BODY_LABEL, is_body
from .experiments import relative_gain
from .formatting import ONE_OF, difference, pct as _pct, pts

Z95 = 1.959963984540054
BALANCED = 0.02  # |mean confidence − accuracy| up to this: neither over- nor under-confident on the whole
SAME_AS_START = 0.8  # a learned region sharing more than this with its top-movement start barely moved


def wilson(accuracy: float, n: int, z: float = Z95) -> list[float] | None:
    """The Wilson score interval of a proportion: honest at 12 examples and at 100 %, unlike p ± z·se."""
    if not n:
        return None
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n))
    return [max(0.0, centre - half), min(1.0, centre + half)]


def gain_recovered(graft: float | None, ft: float | None, bare: float | None) -> float | None:
    """(graft − bare) / (FT − bare); None when fine-tuning gained nothing over the bare body (often so out
    of distribution), where a share of the gain has no meaning."""
    if None in (graft, ft, bare) or ft <= bare:
        return None
    return relative_gain(graft, bare, ft)


def calibration(accuracy: float, confidence: float | None) -> str | None:
    if confidence is None:
        return None
    gap = confidence - accuracy
    return "balanced" if abs(gap) <= BALANCED else ("over-confident" if gap > 0 else "under-confident")


def chance_overlap(size_i: int, graftable: int) -> float:
    """E|γi ∩ γj| / |γj| for γi drawn at random: |γi| / N, whatever γj is."""
    return size_i / graftable if graftable else 0.0


# -- rows ------------------------------------------------------------------------------------------
def _is_ft(row) -> bool:
    return str(row["model"]).startswith(FT_LABEL)


def annotate(rows: list[dict]) -> list[dict]:
    """Add the readings above to the rows of a comparison (in place; also returned).

    Rows are grouped by task; the fine-tuned and bare rows of a task are its references; a row's
    ``method`` ("random", "top-movement", …) marks baselines, matched to grafts by region size.
    """
    for row in rows:
        # a score that is no share of the examples (a perplexity, a BLEU) has no binomial interval
        row["accuracy_ci"] = wilson(row["accuracy"], row["n"]) if row.get("share", True) else None
        row["calibration"] = calibration(row["accuracy"], row.get("confidence"))
    for task in dict.fromkeys(r["task"] for r in rows):
        group = [r for r in rows if r["task"] == task]
        ft = next((r["accuracy"] for r in group if _is_ft(r)), None)
        bare = next((r["accuracy"] for r in group if is_body(r["model"])), None)
        baselines = {(r.get("method"), r.get("region_size")): r["accuracy"] for r in group}
        for r in group:
            if _is_ft(r) or is_body(r["model"]):
                continue
            r["ft_kept"] = r["accuracy"] / ft if ft else None
            r["gain_recovered"] = gain_recovered(r["accuracy"], ft, bare)
            for method, key in (("random", "vs_random"), ("top-movement", "vs_top_movement")):
                other = baselines.get((method, r.get("region_size")))
                r[key] = None if other is None or r.get("method") == method else r["accuracy"] - other
    return rows


# -- sentences -------------------------------------------------------------------------------------
def pct(x: float | None, digits: int = 0) -> str:
    """A share in a sentence: "95 %"."""
    return _pct(x, digits, spaced=True)


def bare_words(model: str | None) -> str:
    """The empty-region model in words, by the pair's kind (its row's name says which)."""
    return ("the pre-trained model read through the same prompt (zero-shot)" if model == LM_BODY_LABEL else
            "the bare pre-trained body with the fine-tuned head")


def interval(row) -> str:
    """The accuracy's 95 % Wilson interval on n examples, or its spread over seeds (or fine-tunes, runs: ``over``)
    where the row is a mean."""
    seeds = [v for v in row.get("accuracy_seeds") or () if v is not None]
    if len(seeds) > 1 and row.get("accuracy_std") is not None:
        return f" [± {100 * row['accuracy_std']:.1f} pts over {len(seeds)} {row.get('over', 'seeds')}, n = {round(row['n']):,}]"
    ci = row.get("accuracy_ci")
    return "" if not ci else f" [{100 * ci[0]:.1f}–{100 * ci[1]:.1f} %, n = {row['n']:,}]"


def _size(k: int | None, graftable: int | None) -> str:
    if k is None:
        return ""
    return f" (k = {k:,}" + (f", {pct(k / graftable, 3)} of the graftable set)" if graftable else ")")


def _paired(differences: list[dict] | None, a: str, task: str) -> dict:
    """{(b, metric): difference} of model ``a`` on ``task``."""
    return {(d["b"], d["metric"]): d for d in differences or () if d["a"] == a and d["task"] == task}


def graft_sentence(row: dict, ft_row: dict | None, graftable: int | None = None, paired: dict | None = None,
                   baselines: dict | None = None) -> str:
    """One graft in words: FT accuracy kept, gain recovered, baselines, calibration; each difference with its
    paired interval where ``paired`` ({(other model, metric): difference}) has it. ``baselines`` names the
    baseline rows of the same size ({"random": model name, "top-movement": …})."""
    paired, baselines = paired or {}, baselines or {}
    text = (f"The graft '{row['model']}'{_size(row.get('region_size'), graftable)} scores {pct(row['accuracy'], 1)}"
            f"{interval(row)} on {row['task']}")
    if row.get("ft_kept") is not None:
        text += f": it keeps {pct(row['ft_kept'])} of the fine-tuned accuracy"
        to_ft = ft_row and paired.get((ft_row["model"], "accuracy"))
        if to_ft:
            text += f" ({difference(to_ft, ' against it')})"
    gain = row.get("gain_recovered")
    if gain is not None and gain > 1:
        text += (f" and recovers {pct(gain)} of the fine-tuning gain ((graft − bare) / (FT − bare); above 100 % "
                 "because the graft scores above the fine-tuned model itself)")
    elif gain is not None and gain >= 0:
        text += f" and recovers {pct(gain)} of the fine-tuning gain ((graft − bare) / (FT − bare))"
    elif gain is not None:
        text += f" but scores below the model with an empty region ({pct(gain)} of the fine-tuning gain)"
    extra = []
    for key, name in (("vs_random", "random"), ("vs_top_movement", "top-movement")):
        d = paired.get((baselines.get(name), "accuracy"))
        if d:
            extra.append(difference(d, f" against a {name} region of the same size"))
        elif row.get(key) is not None:
            extra.append(f"{pts(row[key])} over a {name} region of the same size" if row[key] >= 0 else
                         f"{100 * -row[key]:.1f} pts below a {name} region of the same size")
    if extra:
        text += "; " + ", ".join(extra)
    text += "."
    if row.get("calibration") and row.get("confidence") is not None:
        text += (f" Calibration: {row['calibration']} (mean confidence {pct(row['confidence'], 1)} for an accuracy of "
                 f"{pct(row['accuracy'], 1)}; ECE {row['ece']:.3f}")
        if ft_row is not None:
            text += f" vs the fine-tuned model's {ft_row['ece']:.3f}"
            if ft_row.get("calibration"):
                text += f", itself {ft_row['calibration']}"
            ece_diff = paired.get((ft_row["model"], "ece"))
            if ece_diff:
                text += f"; graft − FT: {difference(ece_diff)}"
        text += ")."
    return text


def _small_test(rows) -> str | None:
    ns = [r["n"] for r in rows if r.get("n")]
    if ns and min(ns) < 200:
        n = min(ns)
        half = (wilson(0.5, n)[1] - wilson(0.5, n)[0]) / 2
        return (f"With {n:,} test examples an accuracy is known only to about ±{100 * half:.0f} pts (95 %): "
                "differences smaller than that are noise; score more examples (n) to separate them.")
    return None


def evaluate_card(rows: list[dict], *, graftable: int | None = None, start_overlap: dict | None = None,
                  differences: list[dict] | None = None) -> list[str]:
    """Sentences for a comparison: each in-distribution graft, its OOD transfer, and warnings; differences are read
    with their paired intervals (``differences``, as :func:`scoring.compare` gives them)."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if not tasks:
        return []
    own = [r for r in rows if r["task"] == tasks[0]]
    ft_row = next((r for r in own if _is_ft(r)), None)
    grafts = [r for r in own if not _is_ft(r) and not is_body(r["model"])]
    lines = []
    bare = next((r for r in own if is_body(r["model"])), None)
    if ft_row and bare:
        lines.append(f"Fine-tuned: {pct(ft_row['accuracy'], 1)}{interval(ft_row)}; {bare_words(bare['model'])}: "
                     f"{pct(bare['accuracy'], 1)}; fine-tuning gained {pts(ft_row['accuracy'] - bare['accuracy'])}.")
        if ft_row["accuracy"] <= bare["accuracy"]:
            lines.append("Fine-tuning gained nothing on this task (FT does not score above the empty region), so no "
                         "share of its gain is read and no region can show one: check the fine-tuned model first.")
        elif ft_row["accuracy"] - bare["accuracy"] < 0.02:
            lines.append("Fine-tuning gained almost nothing on this task, so no region can show a gain: check the "
                         "fine-tuned model first.")
    for row in grafts:
        if row.get("method") in ("random", "top-movement") and any(r.get("method") not in ("random", "top-movement")
                                                                 for r in grafts):
            continue  # baselines are read through the grafts they are compared with
        same_size = {r.get("method"): r["model"] for r in grafts if r.get("region_size") == row.get("region_size")
                     and r is not row}
        sentence = graft_sentence(row, ft_row, graftable, _paired(differences, row["model"], tasks[0]), same_size)
        ood = [r for r in rows if r["model"] == row["model"] and r["task"] != tasks[0]]
        if ood:
            parts = []
            for r in ood:
                ft_ood = next((x for x in rows if x["task"] == r["task"] and _is_ft(x)), None)
                d = ft_ood and _paired(differences, row["model"], r["task"]).get((ft_ood["model"], "accuracy"))
                delta = "" if ft_ood is None else \
                    f" ({difference(d, ' vs FT') if d else pts(r['accuracy'] - ft_ood['accuracy']) + ' vs FT'})"
                parts.append(f"{r['task']} {pct(r['accuracy'], 1)}{delta}")
            sentence += " Out of distribution: " + ", ".join(parts) + "."
        share = (start_overlap or {}).get(row["model"])
        if share is not None and share > SAME_AS_START:
            sentence += (f" Only {pct(1 - share, 1)} of it lies outside the top-movement region it started from: "
                         "mask learning barely moved it, so it stays close to top-movement; more steps, a larger "
                         "learning rate or more training examples let it move.")
        lines.append(sentence)
    small = _small_test(own)
    if small:
        lines.append(small)
    return lines


@dataclass(frozen=True)
class Words:
    """How a task kind's scores are named in cards, tables and the app (each kind has its own: ``tasks``)."""

    score: str  # "accuracy", "exact match"
    calibration: str  # "ECE", "token ECE"
    reference: str  # the model a graft of the empty region is: "bare body", "pre-trained"
    scored_by: str  # a clause: how a model is judged
    key: str = "accuracy"  # the metric paired differences name the score by
    score_suffix: str = ""  # what follows a bare percentage in a sentence ("" or " exact match")


ACCURACY = Words(score="accuracy", calibration="ECE", reference="bare body",
                 scored_by="accuracy of its class probabilities")  # a classification task's


def sweep_card(doc: dict, words: Words = ACCURACY) -> list[str]:
    """Sentences for a sparsity sweep: the smallest budget keeping 95 % of FT per method, and the gaps (``words``:
    how the task's kind names its score, ``kinds.Words``)."""
    rows, ft = doc["rows"], doc.get("ft_accuracy")
    if not rows or not ft:
        return []
    lines = [f"Fine-tuned: {pct(ft, 1)}{words.score_suffix} on {doc['task']}"
             + (f"; {words.reference} {pct(doc['body_accuracy'], 1)}."
                if doc.get("body_accuracy") is not None else ".")]
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = sorted((r for r in rows if r["method"] == m), key=lambda r: r["sparsity"])
        good = next((r for r in mine if r["accuracy"] >= 0.95 * ft), None)
        best = max(mine, key=lambda r: r["accuracy"])
        lines.append(f"{m}: " + (f"keeps ≥ 95 % of FT from sparsity {good['sparsity']:g} (k = {good['k']:,}, "
                                 f"{pct(good['accuracy'], 1)})" if good else
                                 f"never keeps 95 % of FT here; at best {pct(best['accuracy'] / ft)} of it, at sparsity "
                                 f"{best['sparsity']:g}") + ".")
    by = {(r["method"], r["sparsity"]): r for r in rows}
    paired = {(d["a"], d["b"], d.get("sparsity")): d for d in doc.get("differences") or ()
              if d["metric"] == words.key}
    gaps = []
    for (m, s) in sorted(by, key=lambda key: key[1]):
        if m == "learned" and ("top-movement", s) in by:
            d = paired.get(("learned", "top-movement", s))
            gaps.append(difference(d, f" at {s:g}") if d else
                        f"{pts(by[('learned', s)]['accuracy'] - by[('top-movement', s)]['accuracy'])} at {s:g}")
    if gaps:
        lines.append("learned − top-movement (95 % intervals): " + "; ".join(gaps) + ".")
    small = _small_test([{"n": doc.get("n_test")}] if doc.get("n_test") else [])
    if small:
        lines.append(small)
    return lines


def compose_card(doc: dict, words: Words = ACCURACY) -> list[str]:
    """Overlaps against what chance gives, and what the union graft does to each task (a stitch's in ``words``, its
    task kind's names of its score)."""
    names, sizes, over, graftable = doc["names"], doc["sizes"], doc["overlap"], doc.get("graftable_params")
    lines = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            # a random γi holds |γi| / N of any γj: the ratio to chance is the same in both directions
            chance = chance_overlap(sizes[i], graftable) if graftable else None
            ratio = f" ({over[i][j] / chance:,.0f}× chance)" if chance else ""
            both = (f"{pct(over[i][j], 1)} of '{names[j]}'" if sizes[i] == sizes[j] else
                    f"{pct(over[i][j], 1)} of '{names[j]}' and {pct(over[j][i], 1)} of '{names[i]}'")
            lines.append(f"'{names[i]}' and '{names[j]}' share {both}; two random regions of these sizes would share "
                         f"{pct(chance, 3)}{ratio}.")
    if doc.get("stitch"):
        return lines + stitch_card(doc, words)
    for task in dict.fromkeys(r["task"] for r in doc.get("rows") or []):
        by = {r["model"]: r for r in doc["rows"] if r["task"] == task}
        alone, union = by.get("region alone"), by.get("union graft")
        if alone and union:
            d = _paired(doc.get("differences"), "union graft", task).get(("region alone", "accuracy"))
            said = " against the task's own region alone"
            lines.append(f"On {task}: the union graft scores {pct(union['accuracy'], 1)}{interval(union)}, "
                         + (difference(d, said) if d else pts(union['accuracy'] - alone['accuracy']) + said) + ".")
    return lines


def localize_card(doc: dict, checked: list[str] = ()) -> list[str]:
    """What was found, whether mask learning moved away from its start, and (with seeds) how stable it is;
    ``checked``: the sentences of its quick held-out check, in its task kind's words."""
    check = doc.get("check")
    lines = [f"Region of {doc['k']:,} parameters ({pct(doc['fraction_of_graftable'], 3)} of the graftable set), by "
             f"{doc['method']}; " + (f"a quick check on {check['n']:,} held-out test examples of {check['task']} follows "
                                     "(Compare scores every test example, beside baselines of the same size)." if check
                                     else "evaluate it (Compare, or graftui evaluate) to see what it keeps.")]
    lines += checked
    if doc.get("stability"):
        lines.append(stability_sentence(doc["stability"]))
        held = [(e["seed"], e["check"]) for e in doc.get("seeds") or () if e.get("check")]
        if held:
            lines.append(f"Held-out check on {held[0][1]['n']:,} test examples: "
                         + ", ".join(f"seed {s} {pct(c['accuracy'], 1)}" for s, c in held)
                         + f" (fine-tuned {pct(held[0][1]['ft'], 1)}); Compare scores the seeds together, with the "
                           "spread over seeds in each interval.")
    if doc.get("finetune_stability"):
        lines.append(f"This is the region of '{doc['finetunes'][0]['finetuned']}'; on the other fine-tunes of the recipe "
                     "see finetunes. " + stability_sentence(doc["finetune_stability"], "fine-tunes")
                     + " Compare scores the fine-tunes' regions together, with the spread over fine-tunes in each "
                       "interval.")
    share = (doc.get("meta") or {}).get("top_movement_overlap")
    if share is not None:
        lines.append(f"{pct(1 - share, 1)} of it lies outside the top-movement region it started from"
                     + (": mask learning barely moved it; more steps, a larger learning rate or more examples let it move."
                        if share > SAME_AS_START else "."))
    return lines


def stability_sentence(st: dict, over: str = "seeds") -> str:
    """Regions of several seeds (or fine-tunes, ``over``): how much they share against chance, and their core."""
    mean_k = sum(st["sizes"]) / len(st["sizes"])
    one = ONE_OF.get(over, over)
    text = (f"Across {st['seeds']} {over} the regions share {pct(st['mean_overlap'], 1)} of each other on average; two "
            f"random regions of this size would share {pct(st['chance_overlap'], 3)}")
    if st.get("over_chance"):
        text += f" ({st['over_chance']:,.0f}× chance)"
    text += (f". {st['core']:,} parameters ({pct(st['core'] / mean_k if mean_k else 0, 1)} of a region) were found by "
             f"every {one}, {st['only_one']:,} by one {one} only; {st['union']:,} by any.")
    if st.get("core_path") or st.get("union_path"):
        files = " ".join(f"--region {st[key]}" for key in ("core_path", "union_path") if st.get(key))
        text += f" Score the core and the union beside the seeds: graftui evaluate {files} --baselines."
    return text


def replicate_sentence(group: dict) -> str:
    """Regions that differ only in their seed, read together: accuracy mean ± std, and the differences over seeds."""
    rows = [r for r in group["rows"] if r.get("distribution", "in") == "in"]
    text = f"Read together, '{group['name']}'" + (
        f" scores {pct(rows[0]['accuracy'], 1)}{interval(rows[0])} on {rows[0]['task']}" if rows else "")
    parts = [difference(d, f" against {d['b']}") for d in group["differences"]
             if d.get("distribution", "in") == "in" and d["metric"] == "accuracy"]
    return text + (": " + "; ".join(parts) if parts else "") + "."


def seeds_sentence(seeds: list[int] | None, what: str) -> list[str]:
    """The line a replicate result adds to its card: what its figures are the mean of, and where the rest is."""
    if not seeds:
        return []
    return [f"Each figure is the mean over {what} {', '.join(map(str, seeds))}; its standard deviation across them is "
            "under spread, each seed's own figures under per_seed, and every paired interval adds the seeds' spread "
            "to the test examples' noise."]


def finetune_card(doc: dict, words: Words = ACCURACY) -> list[str]:
    """The fine-tune's held-out score in sentences (``words``: how its task kind names the score)."""
    acc, n, chance = doc.get("test_accuracy"), doc.get("test_examples"), doc.get("chance_accuracy")
    if not n:
        return []
    if doc.get("per_seed"):
        each = ", ".join(f"seed {e['seed']} {pct(e['test_accuracy'], 1)}" for e in doc["per_seed"])
        return [f"Held-out accuracy {pct(acc, 1)} ± {100 * (doc.get('test_accuracy_std') or 0):.1f} pts over "
                f"{len(doc['per_seed'])} fine-tunes ({each}; n = {n:,} each). Localize in each checkpoint (--finetuned) "
                "to see how much of a region's variance comes from the fine-tune."]
    line = f"Held-out {words.score} {pct(acc, 1)}{interval({'accuracy_ci': wilson(acc, n), 'n': n})}"
    if doc.get("test_loss") is not None:  # scored on its completion tokens too
        return [f"{line} of greedy generations, loss {doc['test_loss']:.3f} per completion token."]
    if chance is not None:
        line += f"; chance (the most frequent class) is {pct(chance, 1)}"
        ci = wilson(acc, n)
        if ci[0] <= chance + 0.05:
            line += (". Warning: this model is barely above chance, so there is little skill to localize; "
                     "train longer or with a larger learning rate")
    return [line + "."]


def predict_card(rows: list[dict], ft_name: str, texts: int, judged: str | None = None) -> list[str]:
    """Hand-typed sentences: where each graft decides as the fine-tuned model does, and where the bare body did
    not (the sentences on which the region carries the skill). A handful of sentences shows, it does not measure.
    With ``judged`` (how a completion's answer is read) the texts are prompts and a model answers as FT or not."""
    grafts = list(dict.fromkeys(r["model"] for r in rows if r["model"] != ft_name and not is_body(r["model"])
                                and not r.get("probe")))
    body_differs = {r["text"] for r in rows if is_body(r["model"]) and r["agrees_with_ft"] is False}
    things, does, body = ("prompt(s)", "answers", "pre-trained model") if judged else ("sentence(s)", "decides",
                                                                                        "bare body")
    lines = [f"On {texts} {things}, the {body} {does} as the fine-tuned model on {texts - len(body_differs)} of "
             f"{texts}."]
    for name in grafts:
        same = {r["text"] for r in rows if r["model"] == name and r["agrees_with_ft"]}
        restored = len(same & body_differs)
        lines.append(f"The graft '{name}' {does} as the fine-tuned model on {len(same)} of {texts}"
                     + (f", {restored} of the {len(body_differs)} where the {body} does not" if body_differs else "")
                     + ".")
    lines += _probe_sentences(rows, texts, body_differs, does, body)
    if judged:
        return lines + [f"Generations: {judged}. A few prompts show what a model does, they do not measure it: score "
                        "a test set (evaluate, Compare) for exact match with its interval."]
    return lines + ["A few sentences show what a model does, they do not measure it: score a test set (evaluate, "
                    "Compare) for accuracy with its interval."]


def _probe_sentences(rows: list[dict], texts: int, body_differs: set, does: str, body: str) -> list[str]:
    """What a probe shows: the texts on which FT changes its answer without the region (knockout), and the parts of
    the region that alone answer as FT where the bare body does not (one layer or module type at a time)."""
    lines = []
    for name in dict.fromkeys(r["model"] for r in rows if r.get("probe") == "knockout"):
        changed = {r["text"] for r in rows if r["model"] == name and r["agrees_with_ft"] is False}
        lines.append(f"Knocked out ('{name}': θ_ft − γ⊙δ), the fine-tuned model {does} otherwise on {len(changed)} of "
                     f"{texts}" + (f", {len(changed & body_differs)} of the {len(body_differs)} where the {body} does"
                                   if body_differs else "") + ".")
    parts = [r for r in rows if r.get("probe") in ("layer", "module")]
    if parts and body_differs:
        alone = {}
        for r in parts:
            if r["agrees_with_ft"] and r["text"] in body_differs:
                alone[r["part"]] = alone.get(r["part"], 0) + 1
        named = ", ".join(f"{part} ({n} of {len(body_differs)})" for part, n in sorted(alone.items(),
                                                                                    key=lambda kv: -kv[1]))
        lines.append(f"One {parts[0]['probe']} of the region at a time, "
                     + (f"the parts that alone restore FT where the {body} does not: {named}." if named else
                        f"no part alone restores FT where the {body} does not: the region acts as a whole."))
    return lines


# -- the Laboratory ----------------------------------------------------------------------------------
def _best(rows: list[dict]) -> dict:
    return max(rows, key=lambda r: (r["accuracy"], -r["alpha"]))


def wise_card(doc: dict) -> list[str]:
    """WiSE curves: where each curve peaks on each task, and WiSE-graft − WiSE-FT at α = 1 (the graft against the
    fine-tuned model), with paired intervals."""
    rows, lines = doc.get("rows") or [], []
    paired = {(d["task"], d["alpha"], d["metric"]): d for d in doc.get("differences") or ()}
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        where = "in distribution" if mine[0]["distribution"] == "in" else "out of distribution"
        peaks = []
        for curve in ("WiSE-FT", "WiSE-graft"):
            line = [r for r in mine if r["curve"] == curve]
            if line:
                b = _best(line)
                peaks.append(f"{curve} peaks at α = {b['alpha']:g} with {pct(b['accuracy'], 1)} (ECE {b['ece']:.3f})")
        text = f"{task} ({where}): " + "; ".join(peaks)
        top = max((r["alpha"] for r in mine), default=None)
        acc, ece = paired.get((task, top, "accuracy")), paired.get((task, top, "ece"))
        if acc:
            text += f". At α = {top:g}, WiSE-graft − WiSE-FT: {difference(acc)}"
            if ece:
                text += f"; ECE {difference(ece)}"
        lines.append(text + ".")
    if lines:
        lines.append("WiSE-FT moves every parameter from θ_pre towards θ_ft by α; WiSE-graft moves only the region's. "
                     "At α = 0 both are the pre-trained body, at α = 1 they are FT and the graft.")
    return lines


def retrain_card(doc: dict) -> list[str]:
    """Re-training inside the region (and BitFit) read like a comparison, plus each trained model against the
    graft it started from."""
    rows = annotate([dict(r) for r in doc.get("rows") or []])
    lines = evaluate_card(rows, differences=doc.get("differences"))
    task = doc.get("task")
    for d in doc.get("differences") or ():
        if d["b"] == "graft" and d["task"] == task and d.get("distribution", "in") == "in":
            what = "accuracy" if d["metric"] == "accuracy" else "ECE"
            lines.append(f"{d['a']} − the graft ({what}): {difference(d)}.")
    trained = doc.get("trained") or {}
    if "BitFit (biases)" in trained:
        lines.append("BitFit trains every bias at the fine-tuning learning rate; where that rate suits full "
                     "fine-tuning it can leave BitFit equal to the bare body.")
    return lines


def multitask_card(doc: dict) -> list[str]:
    """The multi-task experiment: how much of each task's gain its own region keeps against the others' regions
    (Eq. 5), how much the regions overlap against chance, and what the union keeps."""
    tasks, gain = doc.get("tasks") or [], doc.get("relative_gain") or []
    if not tasks or not gain:
        return []
    ece = doc.get("ece") or {}
    lines = []
    for j, task in enumerate(tasks):
        own = gain[j][j]
        others = [(tasks[i], gain[i][j]) for i in range(len(tasks)) if i != j and gain[i][j] is not None]
        text = (f"On {task}: its own region recovers {pct(own)} of the multi-task model's gain (Eq. 5)" if own is not None
                else f"On {task}: the multi-task model gains nothing over its pre-trained body, so Eq. 5 is not read")
        if others and own is not None:
            best = max(others, key=lambda o: o[1])
            text += f"; the best other region ({best[0]}) {pct(best[1])}"
        if ece.get("scores") and ece.get("p_one"):
            text += f"; ECE of its graft {ece['scores'][j][j]:.3f} against the multi-task model's {ece['p_one'][j]:.3f}"
        lines.append(text + ".")
    overlap = doc.get("overlap") or []
    pairs = [(max(overlap[i][j], overlap[j][i]), tasks[i], tasks[j]) for i in range(len(tasks))
             for j in range(len(tasks)) if i < j]
    if pairs:
        most, least = max(pairs), min(pairs)
        lines.append(f"The regions overlap most between {most[1]} and {most[2]} ({pct(most[0], 1)}) and least between "
                     f"{least[1]} and {least[2]} ({pct(least[0], 1)}): in the paper, overlap follows task similarity.")
    union = doc.get("union") or {}
    if union.get("relative_gain"):
        kept = ", ".join(f"{t} {pct(g)}" for t, g in zip(tasks, union["relative_gain"]) if g is not None)
        lines.append(f"The union of {', '.join(union['group'])} ({union['size']:,} parameters) recovers {kept} of the gain.")
    return lines


def continual_card(doc: dict) -> list[str]:
    """Forget-free continual learning against sequential fine-tuning: what each keeps of the first tasks after the
    last stage, with paired intervals."""
    tasks = doc.get("tasks") or []
    if len(tasks) < 2:
        return []
    ff, seq, n = doc["forget_free"], doc["sequential"], len(tasks)
    ece = doc.get("ece") or {}
    last = [d for d in doc.get("differences") or () if d.get("stage") == n and d["metric"] == "accuracy"]
    lines = [f"After the last stage ({tasks[-1]}): forget-free "
             + ", ".join(f"{t} {pct(ff[n - 1][j], 1)}" for j, t in enumerate(tasks))
             + "; sequential fine-tuning " + ", ".join(f"{t} {pct(seq[n - 1][j], 1)}" for j, t in enumerate(tasks)) + "."]
    for d in last:
        if d["task"] != tasks[-1]:
            lines.append(f"On {d['task']}, forget-free − sequential after the last stage: {difference(d)}.")
    forgot = doc.get("forgetting") or {}
    if forgot:
        lines.append("Forgetting (accuracy after a task's own stage − after the last): "
                     + "; ".join(f"{arm} " + ", ".join(f"{t} {100 * f:+.1f} pts" for t, f in zip(tasks[:-1], v[:-1]))
                                 for arm, v in forgot.items()) + ".")
    if ece:
        lines.append("ECE after the last stage: " + "; ".join(
            f"{arm} " + ", ".join(f"{t} {e:.3f}" for t, e in zip(tasks, ece[arm][n - 1]) if e is not None)
            for arm in ("forget-free", "sequential") if arm in ece) + ".")
    return lines


def completion_card(rows: list[dict], differences: list[dict], graftable: int | None = None,
                    ft_name: str = FT_LABEL, judged: str = "") -> list[str]:
    """The result in sentences: each graft's exact match against FT's and the pre-trained model's, with the paired
    interval of the difference, beside how often its answer contains the reference's and its token F1, and its loss
    per token; ``judged`` says how answers were read (the rule every one of these numbers was decided by)."""
    by = {r["model"]: r for r in rows}
    ft, pre = by.get(ft_name), by.get(LM_BODY_LABEL)
    lines = []
    if ft and pre:
        lines.append(f"On {ft['n']:,} held-out examples of {ft['task']}, the fine-tuned model's greedy answers match "
                     f"the reference on {100 * ft['exact_match']:.1f} %{_lenient(ft)} (loss {ft['loss']:.3f} per "
                     f"token), the pre-trained model's on {100 * pre['exact_match']:.1f} %{_lenient(pre)} (loss "
                     f"{pre['loss']:.3f})" + (f" ({judged})." if judged else "."))
    found = {(d["a"], d["b"], d["metric"]): d for d in differences}
    gained = None if not (ft and pre) else round((ft["exact_match"] - pre["exact_match"]) * ft["n"])  # items FT won
    undecided = gained is not None and abs(gained) < HANDFUL
    if undecided:
        lines.append(f"Exact match is undecided here: the fine-tuned model answers {abs(gained)} "
                     f"{'more' if gained >= 0 else 'fewer'} of the "
                     f"{ft['n']:,} items right than the pre-trained model, too few for a share of its gain to mean "
                     "anything; the loss gap closed and the agreement with its answers decide.")
    for r in rows:
        if r["model"] in (ft_name, LM_BODY_LABEL):
            continue
        size = "" if r.get("region_size") is None else f" (k = {r['region_size']:,}" + (
            f", {100 * r['region_size'] / graftable:.3g} % of the graftable set)" if graftable else ")")
        text = f"{r['model']}{size}: "
        gap = None if not (ft and pre) else pre["loss"] - ft["loss"]
        if gap is not None and gap > 0:
            text += f"closes {100 * (pre['loss'] - r['loss']) / gap:.0f} % of the loss gap (loss {r['loss']:.3f} per "\
                    "token)"
        else:
            text += f"loss {r['loss']:.3f} per token"
        text += f", its answers agree with FT's on {100 * r['agreement_with_ft']:.0f} %; exact match " \
                f"{100 * r['exact_match']:.1f} %"
        d = found.get((r["model"], ft_name, "exact_match"))
        if d:
            text += ", " + difference(d, " against FT")
        if ft and pre and ft["exact_match"] != pre["exact_match"] and not undecided:
            share = (r["exact_match"] - pre["exact_match"]) / (ft["exact_match"] - pre["exact_match"])
            text += f", {100 * share:.0f} % of the fine-tuning gain"
        if r.get("contains") is not None:
            text += f"; contains the reference's answer on {100 * r['contains']:.1f} %, token F1 {r['token_f1']:.3f}"
        lines.append(text + ".")
    return lines


HANDFUL = 10  # items: a gain in exact match the fine-tuned model makes on fewer is no measure of a share of it


def _lenient(row: dict) -> str:
    """The two lenient readings of a row beside its exact match (none in a result made before they were scored)."""
    if row.get("contains") is None:
        return ""
    return f", contain it on {100 * row['contains']:.1f} %, token F1 {row['token_f1']:.3f}"


def generation_cell(shown: dict, model: str, width: int | None = None) -> str:
    """One model's cell of a generations table: ✓ where its answer is the reference's (exact match), ≈ where it only
    contains it, ✗ otherwise (with the token F1 where above 0), then the answer the rule read, then the generation
    where the answer is not all of it; ``width`` cuts each text (a terminal's table)."""
    def cut(text: str) -> str:
        text = " ".join(str(text).split())
        return text if width is None or len(text) <= width + 1 else text[:width] + "…"

    generation = shown.get(model, "")
    answers = shown.get("answer") or {}
    if model not in answers:  # a result made before answers were kept: its generation alone
        return ("✓ " if (shown.get("exact") or {}).get(model) else "✗ ") + cut(generation)
    exact, inside = (shown.get("exact") or {}).get(model), (shown.get("contains") or {}).get(model)
    f1 = (shown.get("token_f1") or {}).get(model) or 0.0
    mark = "✓ " if exact else "≈ " if inside else f"✗ (F1 {f1:.2f}) " if f1 else "✗ "
    answer = answers[model]
    said = "(no answer)" if answer is None else f"«{cut(answer)}»"
    return mark + said + ("" if answer is not None and cut(answer) == cut(generation) else f" ← {cut(generation)}")


def stitch_card(doc: dict, words: Words = ACCURACY) -> list[str]:
    """Per task: the stitched model against the task's own fine-tune and each merge, each with its paired
    interval (of the score ``words`` name: accuracy, or exact match of generations on a completion task)."""
    chosen, lines = doc["stitch"], []
    merges = [m["model"] for m in chosen.get("merges") or ()] or [chosen["model"]]
    for task in dict.fromkeys(r["task"] for r in doc["rows"]):
        by = {r["model"]: r for r in doc["rows"] if r["task"] == task}
        stitched, ft = by.get("stitched"), by.get(FT_LABEL)
        if not (stitched and ft):
            continue
        what, metric = words.score, words.key
        found = {d["b"]: d for d in doc.get("differences") or () if d["a"] == "stitched" and d["task"] == task
                 and d["metric"] == metric}
        text = f"On {task}, the stitched model's {what} is {pct(stitched['accuracy'], 1)}, against its own fine-tune's " \
               f"{pct(ft['accuracy'], 1)}"
        if FT_LABEL in found:
            text += f" ({difference(found[FT_LABEL], '')})"
        for merge in (m for m in merges if m in by):
            text += f"; {merge}'s {pct(by[merge]['accuracy'], 1)}"
            if merge in found:
                text += f" ({difference(found[merge], '')})"
        lines.append(text + ".")
    lines.append(f"Each merge's λ (and density) was chosen on {chosen['validation_n']:,} validation examples per task, "
                 "never on the test examples.")
    return lines
