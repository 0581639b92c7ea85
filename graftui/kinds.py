"""Task kinds: what a verb needs to know of its task, one object per kind.

``kind_of(task)`` gives a task's kind; each kind (classification, completion, lm-evaluation-harness) reads the pair,
makes mask learning's batches, fine-tunes, scores models into rows of one schema and words the result. Each lives in
its folder under ``tasks/`` and registers one object (``tasks.base.register_kind``) when its ``kind.py`` is imported,
which is what this module does for the built-in kinds: a new kind is one folder and one import line here. The
registry answers which kind a task reference, a task, a region file or a request's --task-kind names, and what
`graftui tasks` lists.
"""

from __future__ import annotations

from .tasks.base import (KINDS, Look, Outcome, TaskKind, Words, kind_in, kind_named, kind_of, ordered, register_kind,
                         task_kinds)
from .tasks.classification.kind import CLASSIFICATION, examples_per_class, kshot_batches
from .tasks.completion.kind import COMPLETION_KIND, recorded_rule
from .tasks.harness.kind import HARNESS
from .tasks.reading import (given_fields, named_kind, read_classification, read_for, read_task, read_task_as,
                            recorded_columns, region_kind)

__all__ = ["CLASSIFICATION", "COMPLETION_KIND", "HARNESS", "KINDS", "Outcome", "TaskKind", "Words",
           "examples_per_class", "given_fields", "kind_in", "kind_named", "kind_of", "kshot_batches", "named_kind",
           "ordered", "read_classification", "read_for", "read_task", "read_task_as", "recorded_columns",
           "recorded_rule", "region_kind", "register_kind", "task_kinds"]
