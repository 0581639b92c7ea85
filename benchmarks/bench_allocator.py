"""What mapping every large block costs a training step: ``compute.map_large_blocks`` against glibc's own heap.

    .venv/bin/python benchmarks/bench_allocator.py [--size 150m] [--rounds 6] [--steps 6] [--modes mapped,mapped:8,trim]

The candidate learner sets glibc's mmap threshold to 1 MiB (process-wide, for good) so that the blocks a step frees go
back to the system, not into a heap that stays resident (``docs/benchmarks.md``). Its price is a system call and a
page fault per page of every large block a step allocates. A setting that cannot be undone within a process is
measured across processes: each round starts a child per mode (the default heap, then each of ``--modes``; the order
alternates from round to round), that each time ``--steps`` forward+backward passes of the same config-built Llama
on the same batches after one warm-up pass, and report their median step and peak resident memory. Each mode's step
is divided by the default heap's of the same round (the children of one round share the machine's state), and the
median over rounds is printed with its range. Modes: ``mapped`` (``map_large_blocks``), ``mapped:N`` (the threshold
at N MiB), ``trim`` (the default heap, handed back to the system after each step by ``malloc_trim``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import SIZES, batches, build  # noqa: E402

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def child(mode: str, size: str, steps: int, checkpoint_every: int) -> None:
    libc = ctypes.CDLL(None)
    if mode == "mapped":
        from graftui.compute import map_large_blocks
        map_large_blocks()
    elif mode.startswith("mapped:"):
        libc.mallopt(M_MMAP_THRESHOLD, int(float(mode.split(":")[1]) * (1 << 20)))
    model = build(size)
    undo = None
    if checkpoint_every:  # the mask learner's own recomputation of every Nth layer, where it is asked for
        from graftui.compute import checkpoint_layers, checkpointable_layers
        undo = checkpoint_layers(model, checkpointable_layers(model), checkpoint_every)
    times = []
    for i, batch in enumerate(batches(steps + 1)):
        t = time.perf_counter()
        model(**batch).loss.backward()
        for p in model.parameters():
            p.grad = None
        if mode == "trim":
            libc.malloc_trim(0)
        if i:  # the first pass pays for the first allocations of every kind
            times.append(time.perf_counter() - t)
    if undo is not None:
        undo()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"step_s": statistics.median(times), "peak_bytes": peak}))


def run(mode: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--size", args.size, "--steps", str(args.steps),
           "--checkpoint-every", str(args.checkpoint_every)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="150m", choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="recompute every Nth layer, as the learner can")
    parser.add_argument("--modes", default="mapped", help="compared with the default heap: mapped, mapped:N (MiB), trim")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.size, args.steps, args.checkpoint_every)
        return
    modes = ["heap", *args.modes.split(",")]
    steps = {m: [] for m in modes}
    ratios = {m: [] for m in modes[1:]}
    peaks = {m: [] for m in modes[1:]}
    for r in range(args.rounds):
        got = {m: run(m, args) for m in (modes if r % 2 == 0 else modes[::-1])}
        for m in modes:
            steps[m].append(got[m]["step_s"])
        for m in modes[1:]:
            ratios[m].append(got[m]["step_s"] / got["heap"]["step_s"])
            peaks[m].append(got[m]["peak_bytes"] / got["heap"]["peak_bytes"])
        print(f"round {r + 1}: " + ", ".join(f"{m} {got[m]['step_s']:.3f} s ({got[m]['peak_bytes'] / 2**30:.2f} GiB)"
                                             for m in modes))
    print(f"\n{args.size} Llama, {args.steps} steps a child, checkpoint every {args.checkpoint_every or 'none'}; "
          f"default heap: step {statistics.median(steps['heap']):.3f} s")
    for m in modes[1:]:
        print(f"  {m}: step {statistics.median(ratios[m]):.3f}x the default heap's (rounds {min(ratios[m]):.3f}-"
              f"{max(ratios[m]):.3f}x), peak resident memory {statistics.median(peaks[m]):.3f}x")


if __name__ == "__main__":
    main()
