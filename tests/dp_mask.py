"""Mask learning on the tiny pair, as one process or as several (run by ``torch.distributed.run``).

    python tests/dp_mask.py OUT.pt [MEMORY [CANDIDATES]]    # one process, the whole batch
    python -m torch.distributed.run --nproc-per-node 2 tests/dp_mask.py OUT.pt [MEMORY [CANDIDATES]]

Rank 0 (or the single process) saves the region, the final logits and the candidate learner's C to OUT.pt.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from conftest import make_tiny_pair, random_batches  # noqa: E402

from graftui.learning import learn_region  # noqa: E402
from graftui.requests import LearnConfig  # noqa: E402

torch.set_num_threads(1)
pair, _, _ = make_tiny_pair()
params = {n: pair.param(n) for n in pair.graftable}
memory = sys.argv[2] if len(sys.argv) > 2 else "auto"
candidates = sys.argv[3] if len(sys.argv) > 3 else "all"
region, logits = learn_region(pair.model, params, pair.pre, pair.ft, 200, random_batches(batch_size=7),
                              LearnConfig(steps=4, lr=0.05, memory=memory, candidates=candidates))
if int(os.environ.get("RANK", "0")) == 0:
    torch.save({"region": region, "logits": {n: logits[n] for n in logits},
                "candidates": getattr(logits, "candidates", None)}, sys.argv[1])
