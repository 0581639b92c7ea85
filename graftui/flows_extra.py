"""Compose-and-evaluate: one graft carrying several skills, scored on every task involved.

Regions of different tasks found on one base (from different fine-tuned checkpoints, or several
tasks of one checkpoint) are merged with :func:`compose.union_values`: every index of the union
takes the fine-tuned value of the skill patch that claims it, and shared indices follow the
chosen rule. Each task is then scored with its own region's classifier head, on

* the region alone (its own patch: θ_pre + γ_i ⊙ δ_i),
* the union graft (θ_pre with every patch's values),
* the pre-trained body with that head (the floor),

so one table shows what composing costs or gains on each task.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import torch

from . import compose, method, metrics
from .data import Task
from .regions import RegionError, RegionRecord

Progress = Callable[[dict], None]

ALONE, UNION, BODY = "region alone", "union graft", "pre-trained body + its head"


@contextlib.contextmanager
def grafted_values(pair, indices: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> Iterator[torch.nn.Module]:
    """The working model with ``values`` written at ``indices`` (O(k)); θ_pre is put back after."""
    with torch.no_grad():
        for name, idx in indices.items():
            flat = pair.param(name).data.view(-1)
            flat[idx.to(flat.device)] = values[name].to(flat.device, flat.dtype)
    try:
        yield pair.model
    finally:
        pair.remove(indices)


def check_composable(records: list[RegionRecord]) -> None:
    """Skill patches of one base with the same graftable tensors, or a RegionError saying why not."""
    if len(records) < 2:
        raise RegionError("pick at least two regions to compose")
    for r in records:
        if not r.is_patch:
            raise RegionError("composition needs skill patches (regions with their fine-tuned values)")
    bases = {r.meta.get("base") for r in records}
    if len(bases) > 1:
        raise RegionError(f"the regions come from different base models ({', '.join(sorted(map(str, bases)))}); compose needs one base")
    first = records[0].shapes
    for r in records[1:]:
        if r.shapes != first:
            raise RegionError("the regions were made over different graftable tensors; compose needs the same set")


def union_of(records: list[RegionRecord], names: list[str], pre: dict[str, torch.Tensor], resolve: str = "mean"):
    """(indices, values, report) of the union graft; ``pre`` is θ_pre (read at shared indices only)."""
    check_composable(records)
    contributions = [compose.Contribution(n, r.indices, r.values) for n, r in zip(names, records)]
    return compose.union_values(contributions, pre, resolve)


def _row(task: Task, head: str, model: str, probs, labels, size: int | None) -> dict:
    m = metrics.metrics(probs, labels)
    return {"task": task.name, "head": head, "model": model, "n": m.n, "accuracy": m.accuracy, "f1": m.f1,
            "ece": m.ece, "region_size": size}


def evaluate_on_pair(pair, task: Task, own: RegionRecord, own_name: str, union_idx, union_val, *, n=None, split="test") -> list[dict]:
    """Score region alone, union graft and the bare body on ``task`` with this pair's head."""
    from .workflows import check_labels, predict

    check_labels(pair, task)
    rows = []
    with pair.grafted(own.indices):
        rows.append(_row(task, own_name, ALONE, *predict(pair, task, split, n), own.size))
    with grafted_values(pair, union_idx, union_val):
        rows.append(_row(task, own_name, UNION, *predict(pair, task, split, n), method.region_size(union_idx)))
    rows.append(_row(task, own_name, BODY, *predict(pair, task, split, n), 0))
    alone = rows[0]["accuracy"]
    for r in rows:
        r["delta_vs_alone"] = r["accuracy"] - alone
    return rows


def compose_evaluate(
    base_ref: str,
    records: list[RegionRecord],
    names: list[str],
    tasks: list[Task],
    *,
    resolve: str = "mean",
    n: int | None = None,
    split: str = "test",
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    allow_local: bool = True,
) -> dict:
    """Merge the skill patches ``records`` on ``base_ref`` and score each task (``tasks[i]`` goes with
    ``records[i]`` and its head) alone, in the union and on the bare body.

    Returns {"rows", "report" (union_values' report), "overlap" (compose.overlap_matrix)}.
    """
    from .regions import pair_from_patch

    if not (len(records) == len(names) == len(tasks)):
        raise ValueError("give one name and one task per region")
    check_composable(records)
    overlap = compose.overlap_matrix({nm: r.indices for nm, r in zip(names, records)})
    rows: list[dict] = []
    union_idx = union_val = report = None
    for i, (record, name, task) in enumerate(zip(records, names, tasks)):
        if cancel is not None and cancel.is_set():
            raise method.Cancelled("composition cancelled")
        if progress:
            progress({"stage": f"loading base + patch '{name}'", "fraction": i / len(records)})
        pair = pair_from_patch(base_ref, record, allow_local=allow_local)
        if union_idx is None:
            union_idx, union_val, report = union_of(records, names, pair.pre, resolve)
        if progress:
            progress({"stage": f"evaluating on {task.name} with the head of '{name}'", "fraction": (i + 0.5) / len(records)})
        rows += evaluate_on_pair(pair, task, record, name, union_idx, union_val, n=n, split=split)
        del pair
    return {"rows": rows, "report": report, "overlap": overlap}
