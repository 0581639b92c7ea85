"""How soon a hosted server answers a one-sentence prediction, alone and while another session's long one runs.

    .venv/bin/python benchmarks/bench_lanes.py [--runs 3] [--workdir DIR]

A hosted server's job runner (``GRAFTUI_HOSTED=1``, in this process) and two sessions, each with a completion region
of SmolLM2's quick dates fine-tune (built once under ``--workdir``). Each run measures, from submission to the
finished job, B's prediction from one sentence (three models, 32 new tokens each): first alone, then while session
A's prediction from a 5,000-character prompt (minutes) runs; A is then cancelled. Printed: both waits per run, their
median, min and max, and the ratio beside / alone. Target: beside ≤ 10 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The committee met on the fourth of March, 2021, and again on"
LONG = (("The archive lists a meeting on the fourth of March, 2021, a letter sent on the ninth of June, 2019, and a "
         "report filed two weeks later. ") * 40)[:5000]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-lanes-"))
    os.environ.update(GRAFTUI_HOME=str(work / "home"), GRAFTUI_HOSTED="1", GRAFTUI_FAST="1")

    import graftui
    from graftui import regions
    from graftui.flows.common import ensure_default
    from graftui.jobs import DONE, MAIN, QUICK, RUNNING
    from graftui.ui import forms, store

    finetuned = str(ensure_default("smollm2-dates"))
    path = work / "dates.safetensors"
    if not path.exists():
        graftui.localize(base="smollm2", finetuned=finetuned, task="dates", method="top-movement", sparsity=1e-3,
                         check_n=0, out=str(path))
    runner = store.runner()

    def ask(sid: str, text: str):
        with store.session(sid):
            region = store.save_region(regions.load(path)).stem
            return forms.submit_predict(runner, region_ids=[region], text=text)

    def answered(sid: str) -> float:
        t0 = time.monotonic()
        job = ask(sid, PROMPT)
        assert job.lane == QUICK, job.lane
        assert runner.runner.wait(job.id, 600).status == DONE, runner.runner.get(job.id).error
        return time.monotonic() - t0

    alone, beside = [], []
    for run in range(args.runs):
        a, b = store.new_session(), store.new_session()
        alone.append(answered(b))
        long = ask(a, LONG)
        assert long.lane == MAIN, long.lane
        while runner.runner.get(long.id).status != RUNNING:
            time.sleep(0.05)
        beside.append(answered(b))
        still = runner.runner.get(long.id).status == RUNNING
        runner.runner.cancel(long.id)
        runner.runner.wait(long.id, 120)
        print(f"run {run}: alone {alone[-1]:.1f} s, beside a 5,000-character prompt {beside[-1]:.1f} s "
              f"(that one still running: {still})", flush=True)

    def spread(xs):
        return f"median {statistics.median(xs):.1f} s (min {min(xs):.1f}, max {max(xs):.1f})"

    print(f"one sentence alone: {spread(alone)}; beside another session's long prompt: {spread(beside)}; "
          f"ratio beside / alone {statistics.median(beside) / statistics.median(alone):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
