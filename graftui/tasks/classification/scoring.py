"""Scoring grafts: predictions of one pair under several regions, on a task and its OOD tasks.

Every model a table compares is the same working model in another state: the fine-tuned model,
the pre-trained body with the fine-tuned head (the empty region), θ̄(γ) for each region γ, or
the union graft of several skill patches. Each state is entered and left through a context
manager that restores θ_pre exactly, so the order of rows never changes a number.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch

from ... import method, metrics, sets
from ...config import FT_LABEL, Budget, LearnConfig
from .data import Task, batches, subsample
from ..grafts import kept_reference, region_size, state_of
from ...errors import Cancelled, DataError, RegionError
from ...localizers import run_method
from ...regions import RegionRecord

Progress = Callable[[dict], None]
ALONE, UNION, BODY = "region alone", "union graft", "pre-trained body + its head"


# -- labels ------------------------------------------------------------------------------------------
def check_labels(pair, task: Task) -> None:
    """The task fits the pair: as many labels as the model scores, and a prompt's second text only for a task that has
    one."""
    if task.num_labels != len(pair.label_names):
        raise DataError(
            f"task '{task.name}' has {task.num_labels} labels but the fine-tuned model has {len(pair.label_names)}"
        )
    if pair.prompt is not None and "{text_pair}" in pair.prompt.template and not task.is_pair:
        raise DataError(f"the template '{pair.prompt.template}' reads a second text ({{text_pair}}), but task "
                        f"'{task.name}' has one text per example: drop {{text_pair}} from --template, or name the "
                        "second text's column (--pair-column)")


def _integer_names(names) -> bool:
    return tuple(names) == tuple(str(i) for i in range(len(names)))


def remap_labels(task: Task, other: Task, mapping: dict[str, str]) -> tuple[Task, str]:
    """``other`` relabelled by ``mapping`` (its label name → one of ``task``'s; several may share one)."""
    missing = [name for name in other.label_names if name not in mapping]
    wrong = [mapping[name] for name in other.label_names if name in mapping and mapping[name] not in task.label_names]
    if missing or wrong:
        problem = (f"labels {missing} of '{other.name}' are not mapped" if missing else
                   f"{wrong} are not labels of '{task.name}' {list(task.label_names)}")
        raise DataError(f"the OOD label mapping does not fit: {problem}; map every label of '{other.name}' "
                        f"{list(other.label_names)} to one of {list(task.label_names)}")
    new_id = [task.label_names.index(mapping[name]) for name in other.label_names]
    splits = {name: replace(split, labels=tuple(new_id[y] for y in split.labels)) for name, split in other.splits.items()}
    pairs = ", ".join(f"{a} → {mapping[a]}" for a in other.label_names)
    return replace(other, label_names=task.label_names, splits=splits), f"labels of '{other.name}' mapped as asked: {pairs}"


def align_labels(task: Task, other: Task, mapping: dict[str, str] | None = None) -> tuple[Task, str | None]:
    """``other`` in ``task``'s label space, and a note when labels were matched by position or mapping.

    Names must agree, except that integer labels 0…n−1 on either side map by position onto the
    other side's names (a CSV with 0/1 labels against a task with negative/positive); ``mapping``
    (old name → new name, e.g. from ``--ood-labels``) says it explicitly and wins.
    """
    if mapping and any(name in mapping for name in other.label_names):  # a mapping may serve several OOD tasks
        return remap_labels(task, other, mapping)
    if tuple(other.label_names) == tuple(task.label_names):
        return other, None
    if len(other.label_names) == len(task.label_names) and (
        _integer_names(other.label_names) or _integer_names(task.label_names)
    ):
        pairs = ", ".join(f"{a} → {b}" for a, b in zip(other.label_names, task.label_names))
        note = f"labels of '{other.name}' matched by position to those of '{task.name}': {pairs}"
        return replace(other, label_names=task.label_names), note
    raise DataError(
        f"OOD task '{other.name}' has labels {list(other.label_names)}, not those of '{task.name}' "
        f"{list(task.label_names)}; pick OOD tasks with the same labels, or map them (--ood-labels 'a=negative,b=positive'; "
        "integer labels 0…n−1 map by position)"
    )


# -- predictions -------------------------------------------------------------------------------------
def sample(task: Task, split: str, n: int | None, seed: int = 0):
    """The examples of ``split`` that ``predict`` scores: all, or ``n`` of them drawn with ``seed``."""
    data = task.splits[split]
    return subsample(data, n, seed) if n is not None and n < len(data) else data


def predict(pair, task: Task, split: str, n: int | None, batch_size: int = 64, seed: int = 0):
    data = sample(task, split, n, seed)
    if len(data) == 0:
        raise DataError(f"task '{task.name}' has no examples in its {split} split")
    # Batches of similar length waste little on padding; the results come back in the split's order.
    order = sorted(range(len(data)), key=lambda i: len(data.texts[i]) + len(data.pairs[i] if data.pairs else ""))
    probs, labels = metrics.predict_proba(pair.model, batches(pair.tokenizer, data.select(order), batch_size,
                                                              task.max_length))
    back = torch.empty(len(order), dtype=torch.long)
    back[torch.tensor(order)] = torch.arange(len(order))
    return probs[back], labels[back]


def _sample_key(task: Task, split: str, n: int | None, seed: int) -> str:
    data = sample(task, split, n, seed)
    h = hashlib.sha256(repr((task.max_length, task.label_names)).encode())
    for text, other, label in zip(data.texts, data.pairs or [None] * len(data), data.labels):
        h.update(repr((text, other, label)).encode())
    return h.hexdigest()


def reference_predict(pair, name: str, task: Task, split: str, n: int | None, seed: int = 0):
    """``predict`` of FT or the bare body (``name``; the pair at rest in the matching state), cached per pair."""
    def make():
        with pair.finetuned() if name == FT_LABEL else contextlib.nullcontext():
            return predict(pair, task, split, n, seed=seed)

    return kept_reference(pair, (name, _sample_key(task, split, n, seed)), make)


@dataclass
class Comparison:
    """Metrics per (model, task); reliability data per model on the in-distribution task; paired differences."""

    rows: list[dict]
    reliability: dict[str, list[dict]]
    histogram: dict[str, list[dict]]
    task: str
    ood: list[str]
    differences: list[dict]
    disagreements: list[dict] = field(default_factory=list)  # in distribution: where a graft decides unlike FT

    def as_dict(self) -> dict:
        return asdict(self)


def compare(
    pair,
    task: Task,
    models: dict[str, dict[str, torch.Tensor]],
    *,
    ood: list[Task] = (),
    split: str = "test",
    n: int | None = None,
    seed: int = 0,
    contrasts: list[tuple[str, str]] = (),
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> Comparison:
    """Evaluate FT, pre-trained body + FT head and each region's graft on ``task`` and ``ood``.

    ``models`` maps a label to a region (flat indices), whose graft takes the fine-tuned values, or
    to ``(indices, values)`` written as given (a re-trained region, a union); ``ood`` tasks are already
    in ``task``'s label space (see :func:`align_labels`). Agreement is measured against FT. Each graft's
    difference to FT (accuracy, ECE) and to the bare body (accuracy), and each pair in ``contrasts``
    (accuracy, ECE), get a paired interval on the same examples (:func:`differences`).
    """
    check_labels(pair, task)
    body = pair.body_name
    rows, reliability, histogram, found = [], {}, {}, []
    pairs = [(label, FT_LABEL, m) for label in models for m in metrics.PAIRED_METRICS]
    pairs += [(label, body, "accuracy") for label in models]
    pairs += [(a, b, m) for a, b in contrasts for m in metrics.PAIRED_METRICS]
    tasks = [task, *ood]
    total = len(tasks) * (len(models) + 2)
    done = 0
    for t in tasks:
        variants: list[tuple[str, object]] = [(FT_LABEL, None), (body, None)]  # the references: cached per pair
        variants += [(label, state_of(pair, region)) for label, region in models.items()]
        reference, predictions = None, {}
        for label, context in variants:
            if cancel is not None and cancel.is_set():
                raise Cancelled("evaluation cancelled")
            if progress:
                progress({"stage": f"evaluating {label} on {t.name}", "fraction": done / total})
            if context is None:
                probs, labels = reference_predict(pair, label, t, split, n, seed)
            else:
                with context:
                    probs, labels = predict(pair, t, split, n, seed=seed)
            if reference is None:
                reference = probs
            predictions[label] = probs
            m = metrics.metrics(probs, labels)
            rows.append({
                "model": label,
                "task": t.name,
                "distribution": "in" if t is task else "OOD",
                "n": m.n,
                "accuracy": m.accuracy,
                "f1": m.f1,
                "ece": m.ece,
                "confidence": m.mean_confidence,
                "agreement_with_ft": metrics.agreement(probs, reference),
                "region_size": region_size(models[label]) if label in models else None,
            })
            if t is task:
                reliability[label] = metrics.reliability(probs, labels)
                histogram[label] = metrics.confidence_histogram(probs)
            done += 1
        found += differences(predictions, labels, pairs, t.name, "in" if t is task else "OOD", seed=seed)
        if t is task:
            unlike = disagreements(predictions, labels, sample(t, split, n, seed), t, list(models))
    return Comparison(rows, reliability, histogram, task.name, [o.name for o in ood], found, unlike)


MAX_DISAGREEMENTS = 100  # listed per model: the most confident first


def disagreements(predictions: dict[str, torch.Tensor], labels, data, task: Task, names: list[str]) -> list[dict]:
    """The test examples on which each of ``names`` decides unlike FT: the text, its label, both decisions and
    their confidence, the most confident first (at most MAX_DISAGREEMENTS per model; ``of``: how many in all)."""
    ft = predictions[FT_LABEL]
    out = []
    for name in names:
        probs = predictions[name]
        differ = (probs.argmax(1) != ft.argmax(1)).nonzero().flatten().tolist()
        differ.sort(key=lambda i: -float(probs[i].max()))
        for i in differ[:MAX_DISAGREEMENTS]:
            out.append({"model": name, "text": data.texts[i], "pair": data.pairs[i] if data.pairs else None,
                        "label": task.label_names[int(labels[i])], "ft": task.label_names[int(ft[i].argmax())],
                        "ft_confidence": float(ft[i].max()), "graft": task.label_names[int(probs[i].argmax())],
                        "graft_confidence": float(probs[i].max()), "of": len(differ)})
    return out


def differences(predictions: dict[str, torch.Tensor], labels, pairs, task: str, distribution: str = "in", *,
                seed: int = 0) -> list[dict]:
    """One entry per (a, b, metric) of ``pairs`` whose two models were scored: a − b with its paired interval."""
    out = []
    for a, b, metric in pairs:
        if a in predictions and b in predictions and a != b:
            d = metrics.paired_difference(predictions[a], predictions[b], labels, metric, seed=seed)
            out.append({"a": a, "b": b, "task": task, "distribution": distribution, **d})
    return out


def baseline_regions(pair, k: int, names: tuple[str, ...] = ("top-movement", "random"), seed: int = 0) -> dict:
    """Data-free baselines at the same budget, for side-by-side comparison: {method name: region}."""
    return {name: run_method(pair, Budget(k=k), name, config=LearnConfig(seed=seed))[0] for name in names}


# -- union grafts ----------------------------------------------------------------------------------------
def check_composable(records: list[RegionRecord]) -> None:
    """Skill patches of one base with the same graftable tensors, or a RegionError saying why not."""
    if len(records) < 2:
        raise RegionError("pick at least two regions to compose")
    for r in records:
        if not r.is_patch:
            raise RegionError("composition needs skill patches (regions with their fine-tuned values)")
    bases = {r.meta.base for r in records}
    if len(bases) > 1:
        raise RegionError(f"the regions come from different base models ({', '.join(sorted(map(str, bases)))}); "
                          "compose needs one base")
    first = records[0].shapes
    for r in records[1:]:
        if r.shapes != first:
            raise RegionError("the regions were made over different graftable tensors; compose needs the same set")


def union_of(records: list[RegionRecord], names: list[str], pre, resolve: str = "mean"):
    """(indices, values, report) of the union graft; ``pre`` is θ_pre (read at shared indices only)."""
    check_composable(records)
    contributions = [sets.Contribution(n, r.indices, r.values) for n, r in zip(names, records)]
    return sets.union_values(contributions, pre, resolve)


def _row(task: Task, head: str, model: str, probs, labels, size: int | None) -> dict:
    m = metrics.metrics(probs, labels)
    return {"task": task.name, "head": head, "model": model, "n": m.n, "accuracy": m.accuracy, "f1": m.f1,
            "ece": m.ece, "confidence": m.mean_confidence, "region_size": size}


def evaluate_on_pair(pair, task: Task, own: RegionRecord, own_name: str, union_idx, union_val, *, n=None,
                     split="test", seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Score region alone, union graft and the bare body on ``task`` with this pair's head: (rows, differences),
    the union's and the body's accuracy and ECE against the region alone with paired intervals."""
    check_labels(pair, task)
    rows, predictions = [], {}
    for model, context, size in ((ALONE, pair.grafted(own.indices), own.size),
                                 (UNION, pair.grafted(union_idx, union_val), method.region_size(union_idx)),
                                 (BODY, contextlib.nullcontext(), 0)):
        with context:
            predictions[model], labels = predict(pair, task, split, n, seed=seed)
        rows.append(_row(task, own_name, model, predictions[model], labels, size))
    alone = rows[0]["accuracy"]
    for r in rows:
        r["delta_vs_alone"] = r["accuracy"] - alone
    found = differences(predictions, labels, [(m, ALONE, metric) for m in (UNION, BODY) for metric in
                                              metrics.PAIRED_METRICS], task.name, seed=seed)
    return rows, [{**d, "head": own_name} for d in found]
