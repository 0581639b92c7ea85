"""Every verb, implemented once: ``flow(request, progress=None, cancel=None, guard=LOCAL) -> Result``.

The CLI, the app and ``import graftui`` only build a request (``graftui.requests``), call the flow
and show its result. The verbs live in families, each registered once in :data:`VERBS`
(``registry.verb``): ``single`` (fine-tune, localize, evaluate, predict, sweep, pair), ``regionfiles``
(anatomy, compose, export), ``laboratory`` (the paper's experiments), ``hub`` (push) and
``reproduction`` (every experiment in one report). ``common`` holds what they share: the guard,
the pair cache, task and pair loading, region helpers and ``Result``; ``replicates`` runs one verb over
mask seeds or fine-tune replicates and reads the runs together.
"""

from __future__ import annotations

from .common import (
    LOCAL, Guard, Progress, Result, clear_cache, ensure_models, get_pair, get_task, labels_for, load_pair, load_region,
    needs_task_labels, pair_for_regions,
)
from .registry import VERBS, Verb, from_dict, read_request, run, run_file, verb
from .single import evaluate, finetune, localize, pair, predict, preview_prompt, preview_task, sweep
from .regionfiles import anatomy, compose, export
from .laboratory import continual, multitask, retrain, wise
from .hub import push
from .reproduction import reproduce

__all__ = [
    "LOCAL", "Guard", "Progress", "Result", "VERBS", "Verb", "verb", "run", "run_file", "read_request", "from_dict",
    "clear_cache", "ensure_models", "get_pair", "get_task", "labels_for", "load_pair", "load_region", "needs_task_labels",
    "pair_for_regions", "preview_prompt", "preview_task", "finetune", "localize", "evaluate", "predict", "sweep", "pair", "anatomy", "compose",
    "export", "multitask", "wise", "retrain", "continual", "push", "reproduce",
]
