"""Reading a request's task as the kind it names: each registered kind is asked in turn whether it claims the
reference (``TaskKind.claims``: an ``lm-eval:`` name, an offline task, the kind the request asks for, columns only
one kind reads); a source none claims is tried as each kind that reads sources, in turn."""

from __future__ import annotations

from ..errors import ColumnsMissing, DataError
from .base import KINDS, TaskKind, ordered
from .classification.kind import CLASSIFICATION


def _noted(task, notes: list[str] | None):
    if notes is not None:
        notes += [note for note in task.notes if note not in notes]
    return task


def read_classification(ref: str, spec, guard, notes: list[str] | None = None):
    """A classification task; what reading it left out (rows without a text or a label) is said in ``notes``."""
    return _noted(CLASSIFICATION.read(ref, spec, guard), notes)


def read_task_as(ref: str, spec, guard, notes: list[str] | None = None):
    """A task read as ``spec`` says: a reference that names its kind (``lm-eval:``) as that kind, else as the kind
    whose columns ``spec`` is, else as a classification task."""
    key = str(ref or "").strip().lower()
    kind = next((k for k in ordered() if k.names(key)), None) or next((k for k in ordered() if k.takes(spec)),
                                                                       CLASSIFICATION)
    return _noted(kind.read(ref, spec, guard), notes)


def read_for(verb: str, ref: str, spec, guard, notes: list[str] | None = None):
    """A task for a verb that works on some kinds only (the laboratory's): the kind its reference names, else the
    kind whose columns ``spec`` is, refused in one line before anything is read where that kind cannot do ``verb``."""
    key = str(ref or "").strip().lower()
    kind = named_kind(key) or next((k for k in ordered() if k.takes(spec)), CLASSIFICATION)
    kind.does(verb, str(ref))
    return _noted(kind.read(ref, spec if kind.takes(spec) else None, guard), notes)


def given_fields(req) -> set[str]:
    """The request's fields, of those only one kind reads, that it gives a value."""
    return {f for kind in KINDS.values() for f in kind.fields if getattr(req, f, None)}


def named_kind(ref, asked: str = "auto", given=()) -> TaskKind | None:
    """The kind a task reference names before anything is read (None: only reading the source can tell): the
    first kind, in order, that claims it (``asked``: the request's --task-kind; ``given``: its fields given)."""
    key = str(ref or "").strip().lower()
    return next((k for k in ordered() if k.claims(key, asked, set(given))), None)


def read_task(req, guard, notes: list[str] | None = None):
    """The request's task as the kind it names (``named_kind``); any other source is tried as each kind that reads
    sources, in turn, and the error said is that of the kind whose columns the source fits: a later kind's missing
    columns are told instead of an earlier one's only where the source holds some of the later's and none of the
    earlier's, and a later kind's other error (its columns are there) at once."""
    ref = req.task
    named = named_kind(ref, req.task_kind, given_fields(req))
    if named is not None:
        return _noted(named.read(ref, named.spec(req), guard), notes)
    told = None
    for kind in sorted((k for k in KINDS.values() if k.tried is not None), key=lambda k: k.tried):
        try:
            return _noted(kind.read(ref, kind.spec(req), guard), notes)
        except DataError as err:
            if told is None:
                told = err
            elif not isinstance(err, ColumnsMissing):
                raise
            elif err.fits and isinstance(told, ColumnsMissing) and not told.fits:
                told = err
    raise told from None


def region_kind(meta) -> TaskKind:
    """The kind of task a region was learned on, from its file: its recorded reading and task."""
    return next(k for k in ordered() if k.made(meta))


def recorded_columns(meta):
    """The columns a region's own task was read with, as its kind reads them."""
    return region_kind(meta).recorded_spec(meta)


__all__ = ["given_fields", "named_kind", "read_for", "recorded_columns", "region_kind", "read_classification", "read_task",
           "read_task_as"]
