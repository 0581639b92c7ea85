"""The result card's numbers: exact on hand-made rows, and sentences that say what the rows say."""

from __future__ import annotations

import math

import pytest

from graftui import card

FT, BODY = "fine-tuned", "pre-trained body + FT head"


def test_wilson_interval_known_values():
    z2 = card.Z95 ** 2
    assert card.wilson(0.0, 10) == pytest.approx([0.0, z2 / (10 + z2)])  # 0 of 10: upper bound 0.2775
    assert card.wilson(1.0, 12)[1] == 1.0 and card.wilson(1.0, 12)[0] == pytest.approx(12 / (12 + z2))
    lo, hi = card.wilson(0.5, 100)
    half = card.Z95 / (1 + z2 / 100) * math.sqrt(0.25 / 100 + z2 / 40_000)  # centred at 0.5 by symmetry
    assert (lo, hi) == pytest.approx((0.5 - half, 0.5 + half))
    assert card.wilson(0.7, 0) is None
    # more examples, a narrower interval
    assert (lambda a, b: a[1] - a[0] > b[1] - b[0])(card.wilson(0.8, 50), card.wilson(0.8, 500))


def test_gain_recovered_and_chance_overlap():
    assert card.gain_recovered(0.75, 0.80, 0.60) == pytest.approx(0.75)
    assert card.gain_recovered(0.60, 0.60, 0.60) is None  # fine-tuning gained nothing: no share to speak of
    assert card.gain_recovered(0.55, 0.45, 0.50) is None  # nor when it lost (out of distribution, often)
    assert card.chance_overlap(10, 10_000) == 0.001


def rows(n=400):
    def row(model, acc, task="movies", size=None, method=None, conf=None, ece=0.05):
        return {"model": model, "task": task, "distribution": "in" if task == "movies" else "OOD", "n": n,
                "accuracy": acc, "f1": acc, "ece": ece, "confidence": acc if conf is None else conf,
                "region_size": size, "method": method}

    return [row(FT, 0.80, conf=0.90), row(BODY, 0.60), row("mine", 0.76, size=100, method="learned", conf=0.60),
            row("Top movement", 0.70, size=100, method="top-movement"), row("Random", 0.61, size=100, method="random"),
            row(FT, 0.82, task="amazon"), row(BODY, 0.58, task="amazon"), row("mine", 0.79, task="amazon", size=100)]


def test_annotate_rows():
    out = {(r["model"], r["task"]): r for r in card.annotate(rows())}
    mine = out[("mine", "movies")]
    assert mine["ft_kept"] == pytest.approx(0.95) and mine["gain_recovered"] == pytest.approx(0.8)
    assert mine["vs_random"] == pytest.approx(0.15) and mine["vs_top_movement"] == pytest.approx(0.06)
    assert mine["calibration"] == "under-confident" and out[(FT, "movies")]["calibration"] == "over-confident"
    assert out[("Random", "movies")]["vs_random"] is None  # a baseline is not compared with itself
    assert out[("mine", "amazon")]["gain_recovered"] == pytest.approx((0.79 - 0.58) / (0.82 - 0.58))
    assert "gain_recovered" not in out[(FT, "movies")] and out[(FT, "movies")]["accuracy_ci"] == card.wilson(0.8, 400)


def test_evaluate_card_sentences():
    lines = card.evaluate_card(card.annotate(rows()), graftable=100_000, start_overlap={"mine": 0.9})
    text = " ".join(lines)
    assert "fine-tuning gained +20.0 pts" in text
    assert "keeps 95 % of the fine-tuned accuracy and recovers 80 % of the fine-tuning gain" in text
    assert "+15.0 pts over a random region" in text and "+6.0 pts over a top-movement region" in text
    assert "under-confident" in text and "amazon 79.0 % (-3.0 pts vs FT)" in text
    assert "barely moved" in text  # 90 % of the learned region is still its top-movement start
    assert "'Random'" not in text  # baselines are read through the graft they are compared with
    assert "±" not in text  # 400 examples: no small-test warning
    assert "±25 pts" in " ".join(card.evaluate_card(card.annotate(rows(n=12))))
    assert "vs the fine-tuned model's 0.050, itself over-confident" in text


def test_a_graft_below_its_baselines_and_the_bare_body_is_said_so():
    worse = [r if r["model"] != "mine" or r["task"] != "movies" else {**r, "accuracy": 0.55} for r in rows()]
    text = " ".join(card.evaluate_card(card.annotate(worse)))
    assert "but scores below the model with an empty region (-25 % of the fine-tuning gain)" in text
    assert "6.0 pts below a random region" in text and "15.0 pts below a top-movement region" in text
    assert "recovers -" not in text and "-6.0 pts over" not in text


def test_compose_card_against_chance():
    doc = {"names": ["a", "b"], "sizes": [100, 100], "overlap": [[1.0, 0.1], [0.1, 1.0]], "graftable_params": 100_000,
           "rows": []}
    text = " ".join(card.compose_card(doc))
    assert "'a' and 'b' share 10.0 % of 'b';" in text and "would share 0.100 % (100× chance)" in text
    doc.update(sizes=[100, 400], overlap=[[1.0, 0.05], [0.2, 1.0]])
    text = " ".join(card.compose_card(doc))
    assert "share 5.0 % of 'b' and 20.0 % of 'a'" in text and "(50× chance)" in text  # 5 % vs |γa| / N = 0.1 %


def test_finetune_card_warns_near_chance():
    assert "barely above chance" in card.finetune_card({"test_accuracy": 0.44, "test_examples": 200, "chance_accuracy": 0.40})[0]
    assert "barely above chance" not in card.finetune_card({"test_accuracy": 0.85, "test_examples": 200, "chance_accuracy": 0.5})[0]


def test_ood_label_mapping_relabels_exactly():
    from graftui.tasks.classification.data import Split, Task
    from graftui.errors import DataError, RequestError
    from graftui.requests import parse_label_map
    from graftui.tasks.classification.scoring import align_labels

    split = Split(texts=("a", "b", "c", "d"), labels=(0, 1, 2, 3))
    stars = Task("stars", ("1", "2", "4", "5"), {"train": split, "validation": split, "test": split}, "hand-made")
    two = Split(texts=("a", "b"), labels=(0, 1))
    sentiment = Task("movies", ("negative", "positive"), {"train": two, "validation": two, "test": two}, "hand-made")
    mapping = parse_label_map(" 1=negative, 2=negative,4=positive ,5=positive")
    mapped, note = align_labels(sentiment, stars, mapping)
    assert mapped.label_names == ("negative", "positive") and mapped.splits["test"].labels == (0, 0, 1, 1)
    assert note.endswith("1 → negative, 2 → negative, 4 → positive, 5 → positive")
    # a mapping for another OOD task leaves this one to the default rule; a partial one is refused
    same, note = align_labels(sentiment, sentiment, mapping)
    assert same is sentiment and note is None
    with pytest.raises(DataError, match=r"labels \['5'\] of 'stars' are not mapped"):
        align_labels(sentiment, stars, {"1": "negative", "2": "negative", "4": "positive"})
    with pytest.raises(DataError, match="'great'"):
        align_labels(sentiment, stars, {**mapping, "5": "great"})
    assert parse_label_map("") is None
    for bad in ("0", "0=", "=x", "0=a,0=b"):
        with pytest.raises(RequestError, match="--ood-labels"):
            parse_label_map(bad)


def _diff(a, b, metric, diff, lo, hi, task="movies", n=400):
    return {"a": a, "b": b, "task": task, "metric": metric, "diff": diff, "ci": [lo, hi], "n": n, "p": None}


def test_evaluate_card_reads_each_difference_with_its_paired_interval():
    found = [_diff("mine", "Top movement", "accuracy", 0.06, 0.02, 0.10),
             _diff("mine", "Random", "accuracy", 0.15, -0.01, 0.31),
             _diff("mine", FT, "accuracy", -0.04, -0.07, -0.01),
             _diff("mine", FT, "ece", -0.012, -0.020, -0.004),
             _diff("mine", FT, "accuracy", -0.03, -0.08, 0.02, task="amazon")]
    text = " ".join(card.evaluate_card(card.annotate(rows()), differences=found))
    assert "+6.0 pts [+2.0, +10.0] against a top-movement region of the same size" in text
    assert "+15.0 pts [−1.0, +31.0] against a random region of the same size: not distinguishable at n = 400" in text
    assert "keeps 95 % of the fine-tuned accuracy (−4.0 pts [−7.0, −1.0] against it)" in text
    assert "graft − FT: −0.012 [−0.020, −0.004]" in text
    assert "amazon 79.0 % (−3.0 pts [−8.0, +2.0] vs FT: not distinguishable at n = 400)" in text
    # a difference of another model or task is not read as this one's
    other = [_diff("Top movement", FT, "accuracy", 0.5, 0.4, 0.6), _diff("mine", FT, "accuracy", 0.5, 0.4, 0.6, "x")]
    assert "[+40.0, +60.0]" not in " ".join(card.evaluate_card(card.annotate(rows()), differences=other))


def test_sweep_and_compose_cards_give_the_interval():
    doc = {"task": "movies", "ft_accuracy": 0.8, "body_accuracy": 0.6, "n_test": 500,
           "rows": [{"method": m, "sparsity": 1e-4, "k": 10, "accuracy": a} for m, a in
                    (("learned", 0.78), ("top-movement", 0.765))],
           "differences": [{**_diff("learned", "top-movement", "accuracy", 0.015, -0.011, 0.039, n=500),
                            "sparsity": 1e-4}]}
    assert "learned − top-movement (95 % intervals): +1.5 pts [−1.1, +3.9] at 0.0001: not distinguishable " \
           "at n = 500." in card.sweep_card(doc)
    comp = {"names": ["a", "b"], "sizes": [10, 10], "overlap": [[1, 0], [0, 1]], "graftable_params": 1000,
            "rows": [{"task": "t", "model": m, "accuracy": a, "n": 500, "accuracy_ci": [0, 1]}
                     for m, a in (("region alone", 0.8), ("union graft", 0.7))],
            "differences": [_diff("union graft", "region alone", "accuracy", -0.1, -0.14, -0.06, task="t")]}
    assert "−10.0 pts [−14.0, −6.0] against the task's own region alone." in " ".join(card.compose_card(comp))


def test_a_completion_card_leads_with_the_loss_gap_and_agreement_and_calls_a_gain_of_a_handful_undecided():
    """A held-out skill whose fine-tune answers 5 of 49 items right: the graft's exact match is no share of a gain
    that small; the card says the share of the loss gap closed and the agreement with FT first, and says why
    exact match does not decide. With a gain of many items the share is said."""
    from graftui.config import FT_LABEL, LM_BODY_LABEL

    def row(model, right, loss, agree=1.0, n=49):
        return {"model": model, "task": "held-out", "n": n, "exact_match": right / n, "loss": loss,
                "agreement_with_ft": agree}

    small = [row(FT_LABEL, 5, 1.0), row(LM_BODY_LABEL, 0, 2.0, 0.0), row("g", 5, 1.16, 0.45)]
    lines = card.completion_card(small, [])
    assert any(line.startswith("Exact match is undecided here: the fine-tuned model answers 5 more of the 49 items")
               for line in lines), lines
    graft = next(line for line in lines if line.startswith("g"))
    assert graft.startswith("g: closes 84 % of the loss gap (loss 1.160 per token), its answers agree with FT's on "
                            "45 %; exact match 10.2 %"), graft
    assert "fine-tuning gain" not in graft
    lost = [row(FT_LABEL, 2, 1.0), row(LM_BODY_LABEL, 5, 2.0, 0.0), row("g", 3, 1.5, 0.5)]
    assert card.completion_card(lost, [])[1].startswith("Exact match is undecided here: the fine-tuned model answers "
                                                        "3 fewer of the 49 items")
    large = [row(FT_LABEL, 40, 1.0), row(LM_BODY_LABEL, 0, 2.0, 0.0), row("g", 30, 1.5, 0.7)]
    lines = card.completion_card(large, [])
    assert not any("undecided" in line for line in lines)
    assert next(line for line in lines if line.startswith("g")).endswith("exact match 61.2 %, 75 % of the fine-tuning "
                                                                         "gain.")
