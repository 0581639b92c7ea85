import json
import math

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from graftui.metrics import (
    METRICS,
    Metrics,
    accuracy,
    agreement,
    confidence_histogram,
    ece,
    f1_score,
    metrics,
    predict_proba,
    reliability,
)

# Five binary examples. Confidence = max prob; bins are (lo, hi], 10 wide.
#   #  probs        label  pred  conf  correct  bin
#   0  [0.10 0.90]  1      1     0.90  yes      (0.8, 0.9]
#   1  [0.20 0.80]  0      1     0.80  no       (0.7, 0.8]   <- on the edge 0.8
#   2  [0.75 0.25]  0      0     0.75  yes      (0.7, 0.8]
#   3  [0.40 0.60]  1      1     0.60  yes      (0.5, 0.6]   <- on the edge 0.6
#   4  [0.45 0.55]  0      1     0.55  no       (0.5, 0.6]
# (0.8, 0.9]: n=1, acc=1.0, conf=0.9               -> 1/5 * |1.0 - 0.9|   = 0.02
# (0.7, 0.8]: n=2, acc=0.5, conf=(0.8+0.75)/2=0.775 -> 2/5 * |0.5 - 0.775| = 0.11
# (0.5, 0.6]: n=2, acc=0.5, conf=(0.6+0.55)/2=0.575 -> 2/5 * |0.5 - 0.575| = 0.03
# ECE = 0.02 + 0.11 + 0.03 = 0.16
# (Had 0.8 gone to (0.8, 0.9] the result would be 0.22; had 0.6 gone up, 0.32.)
PROBS = [[0.10, 0.90], [0.20, 0.80], [0.75, 0.25], [0.40, 0.60], [0.45, 0.55]]
LABELS = [1, 0, 0, 1, 0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ece_hand_computed_with_bin_edges(dtype):
    probs = torch.tensor(PROBS, dtype=dtype)
    assert ece(probs, torch.tensor(LABELS)) == pytest.approx(0.16, abs=1e-6)


def test_ece_accepts_numpy():
    assert ece(np.array(PROBS), np.array(LABELS)) == pytest.approx(0.16, abs=1e-12)


def test_ece_perfect_calibration_is_zero():
    # every example has confidence 1.0 and is correct: acc = conf = 1 in the top bin
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert ece(probs, torch.tensor([0, 1, 2])) == 0.0
    # 3-class, conf 0.5 for four examples with two correct: bin (0.4, 0.5] acc 0.5 conf 0.5
    probs = torch.tensor([[0.5, 0.25, 0.25]] * 4, dtype=torch.float64)
    assert ece(probs, torch.tensor([0, 0, 1, 2])) == pytest.approx(0.0, abs=1e-12)


def test_ece_fully_wrong_confident():
    # conf 0.9, never right: ECE = |0 - 0.9| = 0.9
    probs = torch.tensor([[0.9, 0.1], [0.1, 0.9]], dtype=torch.float64)
    assert ece(probs, torch.tensor([1, 0])) == pytest.approx(0.9, abs=1e-12)


def test_reliability_bins():
    rows = reliability(torch.tensor(PROBS, dtype=torch.float64), LABELS)
    assert len(rows) == 10
    assert [r["count"] for r in rows] == [0, 0, 0, 0, 0, 2, 0, 2, 1, 0]
    assert rows[5]["lo"] == 0.5 and rows[5]["hi"] == 0.6
    assert rows[0]["accuracy"] is None and rows[0]["confidence"] is None and rows[0]["gap"] is None
    assert rows[5]["accuracy"] == 0.5 and rows[5]["confidence"] == pytest.approx(0.575)
    assert rows[5]["gap"] == pytest.approx(0.075)  # confidence - accuracy: over-confident
    assert rows[7]["gap"] == pytest.approx(0.275)
    assert rows[8]["accuracy"] == 1.0 and rows[8]["gap"] == pytest.approx(-0.1)  # under-confident
    weighted = sum(r["count"] / 5 * abs(r["gap"]) for r in rows if r["count"])
    assert weighted == pytest.approx(ece(PROBS, LABELS))
    json.dumps(rows)


def test_confidence_histogram():
    hist = confidence_histogram(torch.tensor(PROBS), n_bins=5)  # bins of width 0.2
    # confidences 0.9 | 0.8, 0.75, 0.6 | 0.55  -> (0.8,1.0]:1, (0.6,0.8]:2, (0.4,0.6]:2
    assert [h["count"] for h in hist] == [0, 0, 2, 2, 1]
    assert [h["fraction"] for h in hist] == [0.0, 0.0, 0.4, 0.4, 0.2]
    assert hist[-1]["hi"] == 1.0 and hist[0]["lo"] == 0.0


def test_accuracy_and_agreement():
    assert accuracy(PROBS, LABELS) == pytest.approx(3 / 5)
    other = [[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8], [0.8, 0.2]]  # preds 0 1 0 1 0
    # PROBS preds: 1 1 0 1 1 -> agree on #1, #2, #3
    assert agreement(PROBS, other) == pytest.approx(3 / 5)
    assert agreement(other, other) == 1.0
    with pytest.raises(ValueError):
        agreement(PROBS, other[:3])


def _onehot(preds, k):
    return torch.nn.functional.one_hot(torch.tensor(preds), k).double() * 0.8 + 0.2 / k


def test_f1_binary_is_positive_class():
    # preds 1 1 0 0 1, labels 1 0 0 1 1: TP=2 (#0,#4), FP=1 (#1), FN=1 (#3)
    # F1(pos) = 2*2 / (2*2 + 1 + 1) = 2/3; macro would be (2/3 + 1/2) / 2
    probs = _onehot([1, 1, 0, 0, 1], 2)
    assert f1_score(probs, [1, 0, 0, 1, 1], num_classes=2) == pytest.approx(2 / 3)


def test_f1_macro_multiclass():
    # labels 0 0 1 1 2 2, preds 0 1 1 1 2 0
    # class 0: TP1 FP1 FN1 -> 2/4; class 1: TP2 FP1 FN0 -> 4/5; class 2: TP1 FP0 FN1 -> 2/3
    probs = _onehot([0, 1, 1, 1, 2, 0], 3)
    expected = (0.5 + 0.8 + 2 / 3) / 3
    assert f1_score(probs, [0, 0, 1, 1, 2, 2], num_classes=3) == pytest.approx(expected)
    # a class neither present nor predicted (3) does not count
    probs4 = _onehot([0, 1, 1, 1, 2, 0], 4)
    assert f1_score(probs4, [0, 0, 1, 1, 2, 2], num_classes=4) == pytest.approx(expected)
    # a class predicted but absent from the labels counts with F1 = 0
    # labels 0 0 1, preds 0 2 1: class 0 -> 2/3, class 1 -> 1, class 2 -> 0
    assert f1_score(_onehot([0, 2, 1], 3), [0, 0, 1], num_classes=3) == pytest.approx(5 / 9)


def test_metrics_summary():
    m = metrics(PROBS, LABELS)
    assert isinstance(m, Metrics)
    assert m.n == 5
    assert m.accuracy == pytest.approx(0.6)
    assert m.ece == pytest.approx(0.16)
    assert m.f1 == pytest.approx(f1_score(PROBS, LABELS, 2))
    p_true = [0.9, 0.2, 0.75, 0.6, 0.45]
    assert m.nll == pytest.approx(-sum(math.log(p) for p in p_true) / 5)
    assert m.mean_confidence == pytest.approx((0.9 + 0.8 + 0.75 + 0.6 + 0.55) / 5)
    d = m.as_dict()
    assert set(d) == {"n", "accuracy", "f1", "ece", "nll", "mean_confidence"}
    json.dumps(d)


def test_empty_inputs():
    empty = torch.zeros(0, 2)
    assert ece(empty, torch.zeros(0, dtype=torch.long)) == 0.0
    assert metrics(empty, torch.zeros(0, dtype=torch.long)).n == 0


def test_predict_proba_tiny_bert():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, num_labels=3)
    model = BertForSequenceClassification(cfg)
    model.train()
    batches = []
    for _ in range(3):
        ids = torch.randint(1, 50, (4, 7))
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                        "labels": torch.randint(0, 3, (4,))})
    probs, labels = predict_proba(model, batches)
    assert model.training  # previous mode restored
    assert probs.shape == (12, 3) and probs.dtype == torch.float32 and probs.device.type == "cpu"
    assert torch.allclose(probs.sum(dim=1), torch.ones(12), atol=1e-6)
    assert torch.equal(labels, torch.cat([b["labels"] for b in batches]))
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
                            for b in batches])
    assert torch.allclose(probs, torch.softmax(logits, dim=-1), atol=1e-6)
    # unlabeled batches get -1
    _, unl = predict_proba(model, [{"input_ids": batches[0]["input_ids"]}])
    assert unl.tolist() == [-1] * 4


# -- paired differences -------------------------------------------------------------------------------
def test_mcnemar_exact_p_values():
    from graftui.metrics import mcnemar_p

    assert mcnemar_p(8, 2) == pytest.approx(2 * (1 + 10 + 45) / 1024)  # 0.109375: binomtest(2, 10) two-sided
    assert mcnemar_p(2, 8) == mcnemar_p(8, 2)
    assert mcnemar_p(0, 10) == pytest.approx(2 / 1024)
    assert mcnemar_p(5, 5) == 1.0 and mcnemar_p(0, 0) == 1.0


def _confident(pred, conf=0.9):
    p = torch.full((len(pred), 2), 1 - conf, dtype=torch.float64)
    p[torch.arange(len(pred)), torch.as_tensor(pred)] = conf
    return p


def test_paired_difference_of_accuracy_covers_the_known_difference():
    from graftui.metrics import distinguishable, paired_difference

    y = torch.tensor([0, 1] * 100)
    a = y.clone()
    a[:40] = 1 - a[:40]  # A wrong on the first 40 (accuracy 0.80)
    b = a.clone()
    b[40:46] = 1 - b[40:46]  # B wrong on 6 more (0.77): the two disagree on 6 examples only
    d = paired_difference(_confident(a), _confident(b), y)
    assert d["diff"] == pytest.approx(0.03) and d["n"] == 200 and d["metric"] == "accuracy"
    lo, hi = d["ci"]
    assert 0 < lo < 0.03 < hi < 0.06 and distinguishable(d)
    assert d["p"] == pytest.approx(2 / 64)  # McNemar: 6 discordant pairs, all for A
    # two separate Wilson intervals (about ±6 pts each) could never tell 0.80 from 0.77: pairing can
    from graftui.card import wilson
    assert wilson(0.77, 200)[1] > wilson(0.80, 200)[0]
    # seeded: the same interval every time
    assert paired_difference(_confident(a), _confident(b), y) == d
    assert paired_difference(_confident(b), _confident(a), y)["diff"] == pytest.approx(-0.03)


def test_paired_difference_is_zero_width_on_identical_models_and_exact_for_ece():
    from graftui.metrics import distinguishable, paired_difference

    g = torch.Generator().manual_seed(0)
    y = torch.randint(2, (150,), generator=g)
    pa = torch.softmax(torch.randn(150, 2, generator=g, dtype=torch.float64), dim=1)
    pb = torch.softmax(3 * torch.randn(150, 2, generator=g, dtype=torch.float64), dim=1)
    for metric in ("accuracy", "ece"):
        same = paired_difference(pa, pa.clone(), y, metric)
        assert same["diff"] == 0 and same["ci"] == [0.0, 0.0] and not distinguishable(same)
    assert paired_difference(pa, pa, y)["p"] == 1.0
    d = paired_difference(pa, pb, y, "ece")
    assert d["diff"] == pytest.approx(ece(pa, y) - ece(pb, y), abs=1e-12) and d["p"] is None
    assert d["ci"][0] <= d["diff"] <= d["ci"][1]
    with pytest.raises(ValueError, match="f1"):
        paired_difference(pa, pb, y, "f1")
    with pytest.raises(ValueError, match="shape"):
        paired_difference(pa, pb[:10], y)


def test_paired_bootstrap_interval_holds_the_true_difference_at_its_nominal_rate():
    """Simulated pairs with a known difference of 5 pts: about 95 % of the intervals hold it."""
    from graftui.metrics import paired_difference

    g = torch.Generator().manual_seed(1)
    held = 0
    for trial in range(60):
        y = torch.zeros(300, dtype=torch.long)
        u = torch.rand(300, generator=g)
        right_a, right_b = u < 0.80, u < 0.75  # A is right wherever B is, and on 5 % more
        a = torch.where(right_a, y, 1 - y)
        b = torch.where(right_b, y, 1 - y)
        lo, hi = paired_difference(_confident(a), _confident(b), y, resamples=500, seed=trial)["ci"]
        held += lo <= 0.05 <= hi
    assert held >= 52  # 95 % of 60 is 57; binomial noise leaves 52 a safe floor, and 0.5 coverage would fail


def test_mean_std_and_rows_over_seeds():
    from graftui.metrics import differences_over_seeds, mean_std, over_seeds, seed_interval

    assert mean_std([1, 2, 3]) == (2.0, 1.0) and mean_std([5]) == (5.0, 0.0) and mean_std([None]) == (None, None)
    lo, hi = seed_interval([1, 2, 3])
    assert (lo, hi) == pytest.approx((2 - 4.3027 / 3 ** 0.5, 2 + 4.3027 / 3 ** 0.5))  # t(0.975, 2) = 4.3027
    assert seed_interval([1]) is None
    runs = [[{"model": "g", "task": "t", "accuracy": 0.8, "n": 100, "ood": {"x": 0.5}, "calibration": "over"}],
            [{"model": "g", "task": "t", "accuracy": 0.9, "n": 100, "ood": {"x": 0.7}, "calibration": "under"}]]
    (row,) = over_seeds(runs, ("model", "task"))
    assert row["accuracy"] == pytest.approx(0.85) and row["accuracy_seeds"] == [0.8, 0.9]
    assert row["accuracy_std"] == pytest.approx(0.1 / 2 ** 0.5)
    assert row["n"] == 100 and isinstance(row["n"], int) and row["ood"] == {"x": pytest.approx(0.6)}
    assert row["calibration"] is None  # the seeds disagree: no single word stands for both
    diffs = [[{"a": "g", "b": "f", "task": "t", "metric": "accuracy", "diff": d, "ci": [d - 0.02, d + 0.02], "n": 100,
               "p": 0.5}] for d in (0.01, 0.03, 0.05)]
    (d,) = differences_over_seeds(diffs)
    assert d["diff"] == pytest.approx(0.03) and d["seeds"] == 3 and d["distinguishable_in"] == 2 and d["p"] is None
    seed_half = 4.3027 * 0.02 / 3 ** 0.5
    half = (seed_half ** 2 + 0.02 ** 2) ** 0.5  # the seeds' spread and the shared test noise together
    assert d["ci"] == pytest.approx([0.03 - half, 0.03 + half])
    near = [[{"a": "g", "b": "f", "task": "t", "metric": "accuracy", "diff": d, "ci": [d - 0.2, d + 0.2], "n": 100}]
            for d in (-2.3, -2.4, -2.2)]  # a loss per token falls by 2.3: far outside [−1, 1]
    (loss,) = differences_over_seeds([[{**e[0], "metric": "loss"}] for e in near])
    assert loss["ci"][0] < -2.3 < loss["ci"][1] < -1.0  # not cut at −1
    (share,) = differences_over_seeds([[{**e[0], "diff": d, "ci": [d - 0.05, d + 0.05]}]
                                       for e, d in zip(near, (-0.98, -0.96, -0.97))])
    assert share["ci"][0] == -1.0 < share["ci"][1]  # a difference of shares stays within [−1, 1]


def test_a_nested_figure_averages_entry_by_entry_and_keeps_its_shape():
    from graftui.metrics import mean_nested

    seeds = [{"matrix": [[1.0, None], [0.2, 0.4]], "size": 7, "group": ["a", "b"], "name": "x"},
             {"matrix": [[0.0, None], [0.4, 0.4]], "size": 7, "group": ["a", "b"], "name": "y"}]
    mean, std = mean_nested(seeds)
    assert mean["matrix"] == [[0.5, None], [pytest.approx(0.3), 0.4]] and std["matrix"][0] == [pytest.approx(0.5 ** 0.5), None]
    assert std["matrix"][1][1] == 0.0 and mean["size"] == 7 and isinstance(mean["size"], int)  # a shared count stays whole
    assert mean["group"] == ["a", "b"] and mean["name"] is None  # words: kept where the seeds agree
    assert mean_nested([None, None]) == (None, None) and mean_nested([2, None, 4]) == (3.0, pytest.approx(2 ** 0.5))
    assert mean_nested([[1, 2], [1, 2, 3]]) == (None, None)  # shapes that differ do not average


def test_disagreements_list_where_a_graft_decides_unlike_ft_most_confident_first():
    from graftui.tasks.classification import scoring
    from graftui.config import FT_LABEL
    from graftui.tasks.classification.data import Split, Task

    split = Split(("a", "b", "c", "d"), (0, 1, 1, 0))
    task = Task("t", ("neg", "pos"), {s: split for s in ("train", "validation", "test")}, "hand-made")
    ft = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.4, 0.6], [0.7, 0.3]])
    graft = torch.tensor([[0.8, 0.2], [0.6, 0.4], [0.1, 0.9], [0.45, 0.55]])  # unlike FT on b and d
    found = scoring.disagreements({FT_LABEL: ft, "g": graft}, torch.tensor(split.labels), split, task, ["g"])
    assert [(d["text"], d["label"], d["ft"], d["graft"]) for d in found] == [("b", "pos", "pos", "neg"),
                                                                             ("d", "neg", "neg", "pos")]
    assert [d["graft_confidence"] for d in found] == pytest.approx([0.6, 0.55])  # the most confident first
    assert found[0]["ft_confidence"] == pytest.approx(0.8) and {d["of"] for d in found} == {2}
    assert scoring.disagreements({FT_LABEL: ft, "same": ft.clone()}, None, split, task, ["same"]) == []


def test_a_difference_on_few_examples_says_how_large_a_difference_they_could_tell():
    from graftui.formatting import difference, undecided

    agreed = {"metric": "accuracy", "diff": 0.0, "ci": [0.0, 0.0], "n": 16}  # the two agreed on each of 16
    assert difference(agreed).endswith(": not distinguishable at n = 16, too few to tell apart differences under "
                                       "about ±24 pts")
    assert undecided({**agreed, "n": 500}) == "not distinguishable at n = 500"  # enough: no excuse made
    assert undecided({**agreed, "metric": "ece"}) == "not distinguishable at n = 16"  # not a share: no points
    assert undecided({**agreed, "seeds": 3}) == "not distinguishable across 3 seeds"
    assert ": not distinguishable" not in difference({**agreed, "diff": 0.3, "ci": [0.1, 0.5]})


@pytest.mark.parametrize("metric, share", [*((m.name, None) for m in METRICS.values()),
                                           ("acc", True), ("acc_norm", True), ("perplexity", False)])
def test_a_metric_prints_the_same_in_the_card_the_cli_and_the_app(metric, share):
    """The one place that says whether a metric is a share (``metrics.METRICS``, or what a harness difference
    says of itself) decides how its difference is written, alike in a card, the CLI's table and the app's."""
    from graftui.flows.text import differences
    from graftui.formatting import difference
    from graftui.ui.tables import differences_table

    d = {"a": "graft", "b": "fine-tuned", "task": "t", "metric": metric, "diff": 0.032, "ci": [0.010, 0.054],
         "n": 500, "p": 0.01, **({} if share is None else {"share": share})}
    points = METRICS[metric].share if share is None else share
    want = "+3.2 pts [+1.0, +5.4]" if points else "+0.032 [+0.010, +0.054]"
    assert difference(d).startswith(want)
    assert want in differences([d]).splitlines()[-1]
    assert differences_table({"differences": [d]})["difference [95 % CI]"].tolist() == [want]
