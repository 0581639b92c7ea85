"""The grafts a score compares, whatever the task's kind.

Every model a table compares is the same working model in another state: a region's graft, (indices, values)
written as given, or whole tensors held (another fine-tune, a merge). The fine-tuned model's and the bare body's
scores of one sample are kept with the pair, and every kind draws its test sample with one seed.
"""

from __future__ import annotations

import threading
from typing import Callable

from .. import method

# The n test examples a sweep or an evaluation scores are drawn with this seed, whatever the run's own seed: the
# seeds of a replicate run (and any two runs with the same n) are scored on the same examples, so their
# differences pair and their spread is the seeds', not the test sample's.
TEST_SAMPLE_SEED = 0


# The fine-tuned model's and the bare body's predictions on a sample are the same in every comparison of one pair:
# they are kept with the pair (``ModelPair.references``, gone with it) and reused, so a second comparison or a
# Localize's quick score of the same pair and task scores only the grafts. The key holds the sample's content, not
# its name: two uploads called alike never share an entry.
_references_lock = threading.Lock()
REFERENCES_PER_PAIR = 16


def kept_reference(pair, key, make: Callable[[], object]):
    """What ``make()`` returns for ``key``, kept with the pair (the oldest of more than REFERENCES_PER_PAIR dropped):
    FT's and the empty region's scores, which every comparison of the same examples shares."""
    with _references_lock:
        found = pair.references.get(key)
    if found is not None:
        return found
    found = make()
    with _references_lock:
        kept = pair.references
        kept[key] = found
        while len(kept) > REFERENCES_PER_PAIR:
            kept.pop(next(iter(kept)))
    return found


def state_of(pair, model):
    """The context in which the working model is ``model``: a region (its graft), (indices, values) written as
    given, or a callable that returns a context of its own (whole tensors held: another fine-tune, a merge)."""
    if callable(model):
        return model()
    return pair.grafted(model) if isinstance(model, dict) else pair.grafted(*model)


def region_size(model) -> int | None:
    """A graft's region size (None for whole tensors held)."""
    if callable(model):
        return None
    return method.region_size(model if isinstance(model, dict) else model[0])
