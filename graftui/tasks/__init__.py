"""Task kinds: what a verb needs to know of its task, one object per kind.

``kind_of(task)`` gives a task's kind; each kind (classification, completion, lm-evaluation-harness) reads the pair,
makes mask learning's batches, fine-tunes, scores models into rows of one schema and words the result. A new kind is
one module registering one object (``base.register_kind``).
"""

from __future__ import annotations

from .base import KINDS, Outcome, TaskKind, Words, kind_named, kind_of, register_kind
from .classification import CLASSIFICATION, examples_per_class, kshot_batches
from .completion import COMPLETION_KIND, recorded_rule
from .harness import HARNESS
from .reading import named_kind, read_classification, read_task, read_task_as, region_kind

__all__ = ["CLASSIFICATION", "COMPLETION_KIND", "HARNESS", "KINDS", "Outcome", "TaskKind", "Words",
           "examples_per_class", "kind_named", "kind_of", "kshot_batches", "named_kind", "read_classification",
           "read_task", "read_task_as", "recorded_rule", "region_kind", "register_kind"]
