"""Evaluation metrics over predicted class probabilities.

Grafting a small region back onto the pre-trained model should recover the
fine-tuned model's accuracy *and* its calibration (the paper's headline claim),
so every function here works from probabilities, not just hard predictions.
All inputs may be torch tensors or numpy arrays; all outputs are plain Python
numbers, lists and dicts so they can go straight into JSON reports and plots.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import torch

ArrayLike = Any  # torch.Tensor | numpy.ndarray | nested sequence


@dataclass(frozen=True)
class Metrics:
    """Summary of one model on one evaluation set."""

    n: int
    accuracy: float
    f1: float
    ece: float
    nll: float
    mean_confidence: float

    def as_dict(self) -> dict:
        """JSON-friendly dict of all fields."""
        return asdict(self)


def _probs(probs: ArrayLike) -> torch.Tensor:
    """Probabilities as a 2-D floating CPU tensor (N, C), keeping float32/float64 as given."""
    p = torch.as_tensor(probs).detach().cpu()
    if p.numel() == 0 and p.dim() < 2:
        p = p.reshape(0, 0)
    if not p.is_floating_point() or p.dtype in (torch.float16, torch.bfloat16):
        p = p.float()
    if p.dim() != 2:
        raise ValueError(f"probs must have shape (N, C), got {tuple(p.shape)}")
    return p


def _labels(labels: ArrayLike, n: int) -> torch.Tensor:
    """Labels as a 1-D int64 CPU tensor of length n."""
    y = torch.as_tensor(labels).detach().cpu().reshape(-1).long()
    if y.numel() != n:
        raise ValueError(f"got {y.numel()} labels for {n} predictions")
    return y


def accuracy(probs: ArrayLike, labels: ArrayLike) -> float:
    """Fraction of examples whose argmax matches the label (0.0 on an empty set)."""
    p = _probs(probs)
    y = _labels(labels, p.shape[0])
    if y.numel() == 0:
        return 0.0
    return float((_conf_pred(p)[1] == y).double().mean())


def _f1(tp: torch.Tensor, fp: torch.Tensor, fn: torch.Tensor) -> torch.Tensor:
    """Per-class F1 = 2TP / (2TP + FP + FN), 0 where the denominator is 0."""
    denom = 2 * tp + fp + fn
    return torch.where(denom > 0, 2 * tp / denom.clamp(min=1), torch.zeros_like(denom))


def f1_score(probs: ArrayLike, labels: ArrayLike, num_classes: int) -> float:
    """F1 of class 1 for binary tasks; macro-F1 otherwise.

    Binary tasks (SST-2, QQP, MRPC …) conventionally report the positive class's
    F1. For more classes we average over the classes that occur in the labels
    or the predictions (scikit-learn's default label set), so classes absent
    from a small evaluation split do not drag the average towards zero.
    """
    p = _probs(probs)
    y = _labels(labels, p.shape[0])
    if y.numel() == 0:
        return 0.0
    pred = _conf_pred(p)[1]
    k = max(int(num_classes), int(p.shape[1]), int(y.max()) + 1, int(pred.max()) + 1)
    tp = torch.bincount(y[pred == y], minlength=k).double()
    n_pred = torch.bincount(pred, minlength=k).double()
    n_true = torch.bincount(y, minlength=k).double()
    per_class = _f1(tp, n_pred - tp, n_true - tp)
    if num_classes == 2:
        return float(per_class[1])
    present = (n_pred + n_true) > 0
    return float(per_class[present].mean())


def _conf_pred(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Max probability and argmax per row (empty tensors for an empty set)."""
    if p.shape[0] == 0:
        return p.new_zeros(0), torch.zeros(0, dtype=torch.long)
    return p.max(dim=1).values, p.argmax(dim=1)


def _bins(conf: torch.Tensor, n_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bin edges and each confidence's bin index for bins (lo, hi], first bin [0, hi].

    Edges are k / n_bins computed in the confidences' own dtype, so a confidence
    written as e.g. 0.3 lands in (0.2, 0.3] whether it was stored as float32 or
    float64 (k * 0.1 would put it in the next bin through rounding).
    """
    if n_bins < 1:
        raise ValueError("n_bins must be >= 1")
    edges = torch.arange(n_bins + 1, dtype=conf.dtype) / n_bins
    idx = torch.bucketize(conf, edges[1:-1], right=False)
    return edges, idx


def _bin_stats(probs: ArrayLike, labels: ArrayLike, n_bins: int):
    """Per-bin counts, correct counts and confidence sums (float64) plus n."""
    p = _probs(probs)
    y = _labels(labels, p.shape[0])
    conf, pred = _conf_pred(p)
    edges, idx = _bins(conf, n_bins)
    count = torch.bincount(idx, minlength=n_bins).double()
    correct = torch.bincount(idx, weights=(pred == y).double(), minlength=n_bins)
    conf_sum = torch.bincount(idx, weights=conf.double(), minlength=n_bins)
    return edges, count, correct, conf_sum, p.shape[0]


def ece(probs: ArrayLike, labels: ArrayLike, n_bins: int = 10) -> float:
    """Expected calibration error (Guo et al., 2017).

    ECE = sum_b |B_b|/n * |acc(B_b) - conf(B_b)| over n_bins equal-width bins of
    the max probability, bins (lo, hi] with the first bin closed at 0.
    """
    _, count, correct, conf_sum, n = _bin_stats(probs, labels, n_bins)
    if n == 0:
        return 0.0
    # |B|/n * |acc - conf| == |correct - conf_sum| / n
    return float((correct - conf_sum).abs().sum() / n)


def reliability(probs: ArrayLike, labels: ArrayLike, n_bins: int = 10) -> list[dict]:
    """Reliability-diagram data: one dict per bin.

    Keys: lo, hi, count, accuracy, confidence (both None for an empty bin) and
    gap = confidence - accuracy (positive means over-confident; None if empty).
    """
    _, count, correct, conf_sum, _ = _bin_stats(probs, labels, n_bins)
    rows = []
    for b in range(n_bins):
        c = int(count[b])
        acc = float(correct[b] / c) if c else None
        conf = float(conf_sum[b] / c) if c else None
        rows.append(
            {
                "lo": b / n_bins,
                "hi": (b + 1) / n_bins,
                "count": c,
                "accuracy": acc,
                "confidence": conf,
                "gap": (conf - acc) if c else None,
            }
        )
    return rows


def confidence_histogram(probs: ArrayLike, n_bins: int = 10) -> list[dict]:
    """Histogram of max-probability confidence using the same bins as :func:`ece`."""
    p = _probs(probs)
    conf, _ = _conf_pred(p)
    _, idx = _bins(conf, n_bins)
    count = torch.bincount(idx, minlength=n_bins)
    n = p.shape[0]
    return [
        {
            "lo": b / n_bins,
            "hi": (b + 1) / n_bins,
            "count": int(count[b]),
            "fraction": float(count[b]) / n if n else 0.0,
        }
        for b in range(n_bins)
    ]


def agreement(probs_a: ArrayLike, probs_b: ArrayLike) -> float:
    """Fraction of examples on which two models predict the same class.

    Measures how faithfully a grafted model imitates the fine-tuned one,
    beyond matching its accuracy.
    """
    a, b = _probs(probs_a), _probs(probs_b)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.shape[0] == 0:
        return 0.0
    return float((_conf_pred(a)[1] == _conf_pred(b)[1]).double().mean())


def metrics(probs: ArrayLike, labels: ArrayLike, n_bins: int = 10) -> Metrics:
    """All summary metrics at once; F1 uses the number of columns of probs as classes."""
    p = _probs(probs)
    y = _labels(labels, p.shape[0])
    n = int(p.shape[0])
    if n == 0:
        return Metrics(n=0, accuracy=0.0, f1=0.0, ece=0.0, nll=0.0, mean_confidence=0.0)
    p64 = p.double()
    picked = p64.gather(1, y.view(-1, 1)).squeeze(1)
    nll = float(-(picked.clamp(min=1e-12).log()).mean())
    return Metrics(
        n=n,
        accuracy=accuracy(p, y),
        f1=f1_score(p, y, num_classes=int(p.shape[1])),
        ece=ece(p, y, n_bins=n_bins),
        nll=nll,
        mean_confidence=float(p64.max(dim=1).values.mean()),
    )


_LABEL_KEYS = ("labels", "label")


@torch.no_grad()
def predict_proba(
    model: torch.nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a classifier over batches and collect softmax probabilities.

    Labels are taken out of each batch (so the model does not compute a loss)
    and returned alongside; a batch without labels contributes -1s. Softmax is
    taken in float32 so half-precision models give comparable calibration
    numbers. The model is put in eval mode and its previous mode restored.

    Returns (probs (N, C) float32, labels (N,) int64), both on CPU.
    """
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    was_training = model.training
    model.eval()
    all_probs: list[torch.Tensor] = []
    all_labels: list[torch.Tensor] = []
    try:
        for batch in batches:
            label = next((batch[k] for k in _LABEL_KEYS if k in batch), None)
            inputs = {
                k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                for k, v in batch.items()
                if k not in _LABEL_KEYS
            }
            out = model(**inputs)
            logits = out.logits if hasattr(out, "logits") else out[0]
            probs = torch.softmax(logits.float(), dim=-1).cpu()
            all_probs.append(probs)
            if label is None:
                all_labels.append(torch.full((probs.shape[0],), -1, dtype=torch.long))
            else:
                all_labels.append(torch.as_tensor(label).reshape(-1).long().cpu())
    finally:
        model.train(was_training)
    if not all_probs:
        return torch.zeros(0, 0), torch.zeros(0, dtype=torch.long)
    return torch.cat(all_probs), torch.cat(all_labels)


# -- paired differences -------------------------------------------------------------------------------
# Two models scored on the same examples differ by less noise than two independent accuracies: the
# examples both get right or both get wrong cancel. A difference is therefore read with an interval
# computed on the pairs (the same resampled examples for both models), never from two separate intervals.
@dataclass(frozen=True)
class Metric:
    """What a score is, said once for every front end: its label, whether it is a share of the examples (each one
    right or wrong, so a difference of two reads in percentage points), which way is better, and how it aggregates."""
    name: str
    label: str
    share: bool
    higher_is_better: bool
    aggregation: str = "mean over examples"


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("accuracy", "accuracy", True, True),
    Metric("f1", "F1", False, True, "macro over classes"),
    Metric("ece", "ECE", False, False, "binned by confidence"),
    Metric("exact_match", "exact match", True, True),
    Metric("contains", "contains", True, True),
    Metric("token_f1", "token F1", False, True),
    Metric("loss", "loss", False, False, "mean over tokens"),
    Metric("token_ece", "token ECE", False, False, "binned by confidence, over tokens"),
    # lm-evaluation-harness's own metrics (named as the harness names them, a filter's name after a comma)
    Metric("acc", "accuracy", True, True),
    Metric("acc_norm", "length-normalized accuracy", True, True),
    Metric("acc_mutual_info", "mutual-information accuracy", True, True),
    Metric("acc_all", "accuracy over all of a question's answers", True, True),
    Metric("acc_bytes", "byte-normalized accuracy", True, True),
    Metric("mcc", "Matthews correlation", False, True, "over all documents"),
    Metric("brier_score", "Brier score", False, False),
    Metric("perplexity", "perplexity", False, False, "exp of the mean loss"),
    Metric("word_perplexity", "word perplexity", False, False, "over all words"),
    Metric("byte_perplexity", "byte perplexity", False, False, "over all bytes"),
    Metric("bits_per_byte", "bits per byte", False, False, "over all bytes"),
    Metric("bleu", "BLEU", False, True, "over the corpus"),
    Metric("chrf", "chrF", False, True, "over the corpus"),
    Metric("ter", "TER", False, False, "over the corpus"),
)}


def metric_of(name: str | None) -> Metric | None:
    """The registered metric of a score's name: as it is, else before a comma (a harness filter's name)."""
    if not name:
        return None
    return METRICS.get(name) or METRICS.get(name.split(",", 1)[0])


def in_points(difference: dict) -> bool:
    """Whether a paired difference is one of shares, read in points: as the difference says where it says (an
    lm-evaluation-harness metric is one when every document scored 0 or 1), else as its metric is registered."""
    if difference.get("share") is not None:
        return bool(difference["share"])
    metric = metric_of(difference.get("metric"))
    return metric is not None and metric.share


BOOTSTRAP_RESAMPLES = 2000
PAIRED_METRICS = ("accuracy", "ece")


def mcnemar_p(only_a: int, only_b: int) -> float:
    """McNemar's exact two-sided p-value: the discordant pairs (right under one model only) as a fair coin.

    ``only_a`` examples are right under A alone, ``only_b`` under B alone; p = P(a split at least as
    uneven | Binomial(only_a + only_b, ½)), 1.0 when no example tells them apart.
    """
    m, low = only_a + only_b, min(only_a, only_b)
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(low + 1)) / 2 ** m
    return min(1.0, 2 * tail)


def _resampled(values: torch.Tensor, idx: torch.Tensor, n_bins: int | None, bins: torch.Tensor | None,
               conf: torch.Tensor | None) -> torch.Tensor:
    """The statistic on each resample (rows of ``idx``): a mean of ``values``, or an ECE from binned sums."""
    if n_bins is None:
        return values[idx].mean(dim=1)
    rows, n = idx.shape
    b = bins[idx]
    correct = torch.zeros(rows, n_bins, dtype=torch.float64).scatter_add_(1, b, values[idx])
    confidence = torch.zeros(rows, n_bins, dtype=torch.float64).scatter_add_(1, b, conf[idx])
    return (correct - confidence).abs().sum(dim=1) / n


def paired_difference(probs_a: ArrayLike, probs_b: ArrayLike, labels: ArrayLike, metric: str = "accuracy", *,
                      resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0, level: float = 0.95,
                      n_bins: int = 10) -> dict:
    """metric(A) − metric(B) on the same examples, with a paired bootstrap interval.

    Each resample draws n examples with replacement and scores both models on the *same* draw
    (percentile interval over ``resamples`` draws, seeded, so a number reproduces). Accuracy also gets
    McNemar's exact p-value. Identical predictions give a zero-width interval at 0.

    Returns {"metric", "diff", "ci": [lo, hi], "n", "p" (accuracy only; else None)}.
    """
    if metric not in PAIRED_METRICS:
        raise ValueError(f"no paired difference for '{metric}'; pick one of {', '.join(PAIRED_METRICS)}")
    a, b = _probs(probs_a), _probs(probs_b)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {tuple(a.shape)} vs {tuple(b.shape)}")
    y = _labels(labels, a.shape[0])
    n = int(a.shape[0])
    if n == 0:
        return {"metric": metric, "diff": 0.0, "ci": [0.0, 0.0], "n": 0, "p": 1.0 if metric == "accuracy" else None}
    conf_a, pred_a = _conf_pred(a)
    conf_b, pred_b = _conf_pred(b)
    right_a, right_b = (pred_a == y).double(), (pred_b == y).double()
    if metric == "accuracy":
        diff = float(right_a.mean() - right_b.mean())
        p = mcnemar_p(int((right_a > right_b).sum()), int((right_b > right_a).sum()))
        stat_a = stat_b = None
    else:
        diff = ece(a, y, n_bins) - ece(b, y, n_bins)
        p = None
        stat_a, stat_b = (_bins(conf_a, n_bins)[1], conf_a.double()), (_bins(conf_b, n_bins)[1], conf_b.double())
    gen = torch.Generator().manual_seed(seed)
    chunk = max(1, min(resamples, 4_000_000 // n))  # bounded memory on a large test set
    diffs = []
    for start in range(0, resamples, chunk):
        idx = torch.randint(n, (min(chunk, resamples - start), n), generator=gen)
        if stat_a is None:
            diffs.append(_resampled(right_a - right_b, idx, None, None, None))
        else:
            diffs.append(_resampled(right_a, idx, n_bins, *stat_a) - _resampled(right_b, idx, n_bins, *stat_b))
    tail = (1 - level) / 2
    lo, hi = torch.quantile(torch.cat(diffs), torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    lo, hi = min(lo, diff), max(hi, diff)  # a percentile interval always holds its own estimate
    return {"metric": metric, "diff": diff, "ci": [lo, hi], "n": n, "p": p}


# -- completions: figures that are ratios of sums over examples ------------------------------------------
# A completion is scored token by token, but its tokens are not independent draws: an interval resamples
# whole examples. Each figure is Σ_i num_i / Σ_i den_i over the examples (exact match and contains: num = 0/1,
# den = 1; token F1: num = the example's F1, den = 1; loss per token: num = the example's summed loss, den = its
# token count); a calibration error keeps one num column per confidence bin, Σ_b |Σ_i num_ib| / Σ_i den_i
# (num_ib: the example's Σ (right − confidence) over its tokens in bin b).
COMPLETION_METRICS = ("exact_match", "contains", "token_f1", "loss", "token_ece")


def calibration_sums(confidence: ArrayLike, right: ArrayLike, example: ArrayLike, n_examples: int,
                     n_bins: int = 10) -> torch.Tensor:
    """Per example and bin, Σ (right − confidence) over its tokens: the num of a token-level ECE."""
    conf = torch.as_tensor(confidence).double().reshape(-1)
    hit = torch.as_tensor(right).double().reshape(-1)
    row = torch.as_tensor(example).long().reshape(-1)
    _, b = _bins(conf, n_bins)
    out = torch.zeros(n_examples * n_bins, dtype=torch.float64)
    out.index_add_(0, row * n_bins + b, hit - conf)
    return out.view(n_examples, n_bins)


def ratio(num: ArrayLike, den: ArrayLike, weights: torch.Tensor | None = None) -> torch.Tensor | float:
    """Σ w_i num_i / Σ w_i den_i (a bin matrix num gives Σ_b |·|): the figure itself without ``weights``, one per
    row of ``weights`` (resampled example counts) with them."""
    num, den = torch.as_tensor(num).double(), torch.as_tensor(den).double()
    w = torch.ones(1, num.shape[0], dtype=torch.float64) if weights is None else weights
    top = w @ num
    if top.dim() == 2:
        top = top.abs().sum(dim=1)
    value = top / (w @ den).clamp_min(1e-12)
    return float(value[0]) if weights is None else value


def paired_ratio_difference(a: tuple, b: tuple, metric: str, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                            level: float = 0.95) -> dict:
    """metric(A) − metric(B) for two models scored on the same examples, each side a (num, den) of ``ratio``,
    with a paired bootstrap over examples (each resample weighs both sides by the same draw). Exact match, a 0/1
    per example, also gets McNemar's exact p-value. Returns the entry shape of ``paired_difference``."""
    if metric not in COMPLETION_METRICS:
        raise ValueError(f"no paired difference for '{metric}'; pick one of {', '.join(COMPLETION_METRICS)}")
    n = int(torch.as_tensor(a[1]).numel())
    if n == 0:
        return {"metric": metric, "diff": 0.0, "ci": [0.0, 0.0], "n": 0, "p": 1.0 if metric == "exact_match" else None}
    diff = ratio(*a) - ratio(*b)
    p = None
    if metric == "exact_match":
        hit_a, hit_b = torch.as_tensor(a[0]).double(), torch.as_tensor(b[0]).double()
        p = mcnemar_p(int((hit_a > hit_b).sum()), int((hit_b > hit_a).sum()))
    gen = torch.Generator().manual_seed(seed)
    chunk = max(1, min(resamples, 4_000_000 // n))
    diffs = []
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        idx = torch.randint(n, (rows, n), generator=gen)
        w = torch.zeros(rows, n, dtype=torch.float64).scatter_add_(1, idx, torch.ones(rows, n, dtype=torch.float64))
        diffs.append(ratio(*a, weights=w) - ratio(*b, weights=w))
    tail = (1 - level) / 2
    lo, hi = torch.quantile(torch.cat(diffs), torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return {"metric": metric, "diff": diff, "ci": [min(lo, diff), max(hi, diff)], "n": n, "p": p}


def distinguishable(difference: dict) -> bool:
    """Whether a paired interval excludes zero."""
    lo, hi = difference["ci"]
    return lo > 0 or hi < 0


# -- replicates -----------------------------------------------------------------------------------------
# Two-sided 95 % quantiles of Student's t with 1 … 30 degrees of freedom (then the normal's).
_T95 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.306, 2.2622, 2.2281, 2.201, 2.1788, 2.1604,
        2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.093, 2.086, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
        2.0518, 2.0484, 2.0452, 2.0423)


def mean_std(values) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n − 1; 0.0 for one value) of the values that are there."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return None, None
    mean = sum(known) / len(known)
    if len(known) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in known) / (len(known) - 1))


def seed_interval(values) -> list[float] | None:
    """95 % t-interval of the mean of per-seed values (None for fewer than two): what another seed would vary."""
    known = [float(v) for v in values if v is not None]
    if len(known) < 2:
        return None
    mean, std = mean_std(known)
    half = (_T95[len(known) - 2] if len(known) - 1 <= len(_T95) else 1.959964) * std / math.sqrt(len(known))
    return [mean - half, mean + half]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def over_seeds(runs: list[list[dict]], keys: tuple[str, ...]) -> list[dict]:
    """The rows of several runs (one per seed) matched on ``keys``, as one row each.

    A number becomes the mean across runs, with ``<name>_std`` (sample standard deviation) and
    ``<name>_seeds`` (each run's value, None where a run lacks the row), a dict of numbers the same per
    entry; a list keeps each run's as
    ``<name>_seeds``; any other field is kept where every run agrees on it, else None. Rows keep the
    order in which they first appear.
    """
    def key_of(row):
        return tuple(row.get(k) for k in keys)

    order = list(dict.fromkeys(key_of(r) for run in runs for r in run))
    by_run = [{key_of(r): r for r in run} for run in runs]
    out = []
    for key in order:
        rows = [b.get(key) for b in by_run]
        present = [r for r in rows if r is not None]
        merged = {}
        for name in dict.fromkeys(n for r in present for n in r):
            if name in keys:
                merged[name] = present[0][name]
                continue
            values = [None if r is None else r.get(name) for r in rows]
            known = [v for v in values if v is not None]
            if known and all(_number(v) for v in known):
                merged[name], merged[f"{name}_std"] = mean_std(known)
                if all(v == known[0] for v in known):  # the same in every seed (a count stays a whole number)
                    merged[name] = known[0]
                merged[f"{name}_seeds"] = values
            elif known and all(isinstance(v, dict) and all(_number(x) for x in v.values()) for v in known):
                names = list(dict.fromkeys(n for v in known for n in v))  # {OOD task: accuracy}: mean per entry
                stats = {n: mean_std([v.get(n) for v in known]) for n in names}
                merged[name] = {n: m for n, (m, _) in stats.items()}
                merged[f"{name}_std"] = {n: sd for n, (_, sd) in stats.items()}
                merged[f"{name}_seeds"] = values
            elif known and all(isinstance(v, list) for v in known):
                merged[name] = known[0] if all(v == known[0] for v in known) and len(known) == len(rows) else None
                merged[f"{name}_seeds"] = values
            else:
                merged[name] = known[0] if known and all(v == known[0] for v in known) else None
        out.append(merged)
    return out


def mean_nested(values: list) -> tuple[Any, Any]:
    """(mean, std) of several seeds' values of one figure, shape kept: a number averages (a value the same in
    every seed stays as it is, so a count stays whole), a list or dict averages entry by entry, None is
    skipped (a matrix's empty cells stay None); anything else is kept where every seed agrees, else None."""
    known = [v for v in values if v is not None]
    if not known:
        return None, None
    if all(_number(v) for v in known):
        mean, std = mean_std(known)
        return (known[0] if all(v == known[0] for v in known) else mean), std
    if all(isinstance(v, list) for v in known) and len({len(v) for v in known}) == 1:
        parts = [mean_nested([v[i] for v in known]) for i in range(len(known[0]))]
        return [m for m, _ in parts], [s for _, s in parts]
    if all(isinstance(v, dict) for v in known):
        parts = {k: mean_nested([v.get(k) for v in known]) for k in dict.fromkeys(k for v in known for k in v)}
        return {k: m for k, (m, _) in parts.items()}, {k: s for k, (_, s) in parts.items()}
    return (known[0] if all(v == known[0] for v in known) else None), None


DIFFERENCE_KEYS = ("a", "b", "task", "distribution", "metric", "sparsity", "alpha", "stage", "head", "forgetting")
UNBOUNDED_METRICS = ("loss", "perplexity")  # paired differences not confined to [−1, 1]


def differences_over_seeds(runs: list[list[dict]], over: str = "seeds") -> list[dict]:
    """Paired differences of several seeds, one entry per comparison: ``diff`` the mean across seeds with
    ``diff_std`` and ``diff_seeds``, each seed's paired interval in ``ci_seeds`` (``distinguishable_in``:
    how many exclude zero), and ``ci`` the 95 % interval of the mean. The replicates may be other fine-tunes, or
    runs of fine-tunes × seeds (``over``, said in each entry where it is not seeds).

    Two noises move the mean: the seeds (another seed, another difference: the t-interval across seeds)
    and the test examples, which every seed shares, so averaging seeds does not shrink it (each seed's
    paired half-width). ``ci`` adds the two half-widths in quadrature; one seed keeps its paired interval.
    """
    out = []
    for d in over_seeds(runs, DIFFERENCE_KEYS):
        d.pop("n_std", None)
        d["n"] = None if d.get("n") is None else round(d["n"])
        d["p"] = None  # a mean of p-values is no p-value: each seed's is in p_seeds
        d.pop("p_std", None)
        per_seed = [ci for ci in d.get("ci_seeds") or () if ci is not None]
        across = seed_interval(d.get("diff_seeds") or ())
        if across is not None:
            seed_half = (across[1] - across[0]) / 2
            test_half = sum((hi - lo) / 2 for lo, hi in per_seed) / len(per_seed) if per_seed else 0.0
            half = math.sqrt(seed_half ** 2 + test_half ** 2)
            lo, hi = d["diff"] - half, d["diff"] + half
            # a difference of shares (accuracy, ECE, exact match, …) lies in [−1, 1], and so does its interval; one
            # of losses per token does not
            d["ci"] = [lo, hi] if d.get("metric") in UNBOUNDED_METRICS else [max(-1.0, lo), min(1.0, hi)]
            d["ci_kind"] = f"{over} and test examples"
        else:
            d["ci"] = per_seed[0] if per_seed else None
            d["ci_kind"] = "paired bootstrap"
        d["seeds"] = len([v for v in d.get("diff_seeds") or () if v is not None])
        d["distinguishable_in"] = sum(1 for lo, hi in per_seed if lo > 0 or hi < 0)
        if over != "seeds":
            d["over"] = over
        out.append(d)
    return out
