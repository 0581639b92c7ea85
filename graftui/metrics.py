"""Evaluation metrics over predicted class probabilities.

Grafting a small region back onto the pre-trained model should recover the
fine-tuned model's accuracy *and* its calibration (the paper's headline claim),
so every function here works from probabilities, not just hard predictions.
All inputs may be torch tensors or numpy arrays; all outputs are plain Python
numbers, lists and dicts so they can go straight into JSON reports and plots.
"""

from __future__ import annotations

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
