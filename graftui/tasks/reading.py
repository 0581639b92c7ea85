"""Reading a request's task as the kind it names: a classification task, a completion task, or an
lm-evaluation-harness task (``lm-eval:NAME``)."""

from __future__ import annotations

from ..completion import OFFLINE_SKILLS, CompletionSpec, NoCompletionColumns, load_completion_task
from ..data import OFFLINE_TASKS, MissingColumn, load_task
from ..errors import DataError
from ..lmeval import harness_names, is_harness_ref
from ..config import COMPLETION
from .base import TaskKind
from .classification import CLASSIFICATION
from .completion import COMPLETION_KIND
from .harness import HARNESS, load_harness


def _noted(task, notes: list[str] | None):
    if notes is not None:
        notes += [note for note in task.notes if note not in notes]
    return task


def read_classification(ref: str, spec, guard, notes: list[str] | None = None):
    """A classification task; column options given for an offline task must name its own columns (text, label).
    What reading it left out (rows without a text or a label) is said in ``notes``."""
    if str(ref).strip().lower() in OFFLINE_TASKS:
        for name, allowed in (("text_column", "text"), ("label_column", "label"), ("pair_column", None)):
            column = getattr(spec, name)
            if column is not None and column != allowed:
                raise DataError(f"column '{column}' ({name}) not found in the offline task '{ref}'; "
                                "its columns are text, label")
    return _noted(guard.checked_task(load_task(ref, spec, allow_local=guard.allow_local(tasks=[ref]))), notes)


def read_task_as(ref: str, spec, guard, notes: list[str] | None = None):
    """A task read as ``spec`` says: an ``lm-eval:`` name a harness task, a CompletionSpec a completion task, a
    DataSpec a classification task."""
    if is_harness_ref(ref):
        guard.checked_harness(harness_names(ref))
        return _noted(guard.checked_task(load_harness(ref)), notes)
    if not isinstance(spec, CompletionSpec):
        return read_classification(ref, spec, guard, notes)
    task = load_completion_task(ref, spec, allow_local=guard.allow_local(tasks=[ref]))
    return _noted(guard.checked_task(task), notes)


def named_kind(ref, kind: str = "auto", completion_columns: bool = False) -> TaskKind | None:
    """The kind a task reference names before anything is read (None: only reading the source can tell). An
    ``lm-eval:`` name is a harness task; with kind auto, an offline skill or a completion column given makes a
    completion task, and an offline classification task is one."""
    key = str(ref or "").strip().lower()
    if is_harness_ref(key):
        return HARNESS
    if kind == "completion" or (kind == "auto" and (completion_columns or key in OFFLINE_SKILLS)):
        return COMPLETION_KIND
    if kind == "classification" or key in OFFLINE_TASKS:
        return CLASSIFICATION
    return None


def read_task(req, guard, notes: list[str] | None = None):
    """The request's task as the kind it names (``named_kind``); any other source is read as a classification task
    first, then as a completion task, and the error said is the one of the kind the source's columns fit."""
    ref = req.task
    named = named_kind(ref, req.task_kind, bool(req.prompt_column or req.completion_column or req.messages_column))
    if named is HARNESS:
        return read_task_as(ref, None, guard, notes)
    if named is COMPLETION_KIND:
        return read_task_as(ref, req.completion_spec(), guard, notes)
    try:
        return read_classification(ref, req.data_spec(), guard, notes)
    except DataError as first:
        if named is CLASSIFICATION:
            raise
        try:
            return read_task_as(ref, req.completion_spec(), guard, notes)
        except NoCompletionColumns as second:  # a prompt or a completion column and no text or label column: a
            # completion file missing its other column, told in its own words
            if second.partial and isinstance(first, MissingColumn) and not first.found_any:
                raise second from None
            raise first from None


def region_kind(meta) -> TaskKind:
    """The kind of task a region was learned on, from its file: its recorded reading and task."""
    if (getattr(meta, "loading", None) or {}).get("head") != COMPLETION:
        return CLASSIFICATION
    return HARNESS if is_harness_ref(getattr(meta, "task", None) or "") else COMPLETION_KIND


__all__ = ["named_kind", "region_kind", "read_classification", "read_task", "read_task_as"]
