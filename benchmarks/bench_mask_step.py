"""Speed and memory of mask learning, measured side by side in one run.

    .venv/bin/python benchmarks/bench_mask_step.py [--finetuned REF] [--repeats 10] [--modes fast,lean,c10]

Prints three figures against their targets:

1. one mask step, in each mode (memory "fast" or "lean" of the full learner, or ``cF``: the
   candidate-restricted learner with factor F), vs one plain forward+backward of the same model on
   the same batch (interleaved, median of ``--repeats``; target ≤ 1.05×, ≤ 1.02× with candidates):
   a run's later steps, and apart from them its first, which also pays for memory the set-up
   handed back;
2. extra memory of lean mask learning in units of the graftable parameter count (fp32 copies;
   target ≤ 3), by exact tensor accounting and by peak RSS of two child processes (memory
   "fast", which "auto" picks when there is room, holds two copies more);
3. time to apply and remove a region of k = 10⁵ (target < 50 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def batch_of(pair, n: int = 16):
    from graftui.tasks.classification.data import batches, load_task, subsample

    task = load_task("movies")
    split = subsample(task.splits["train"], n, seed=0)
    return next(iter(batches(pair.tokenizer, split, n, task.max_length)))


def plain_step(model, batch) -> None:
    """An ordinary training forward+backward: every parameter gets a gradient."""
    for p in model.parameters():
        p.requires_grad_(True)
        p.grad = None
    model(**batch).loss.backward()
    for p in model.parameters():
        p.grad = None


def bench_speed(pair, batch, repeats: int, modes=("fast", "lean")) -> dict:
    """Plain step and a mask step in each memory mode, interleaved round by round.

    Each round builds a learner per mode and times its first and its second step. The second is
    the figure: every step of a run but the first is one, while the first also pays, once per run,
    for memory the learner's set-up handed back to the system.
    """
    from graftui import learning

    k = max(1, pair.counts()["graftable"] // 1000)
    params = {n: pair.param(n) for n in pair.graftable}
    plain, mask = [], {(mode, step): [] for mode in modes for step in (1, 2)}
    for i in range(repeats + 2):  # two warm-up rounds, then interleave to share the machine's noise
        t = time.perf_counter()
        plain_step(pair.model, batch)
        t_plain = time.perf_counter() - t
        times = {}
        for mode in modes if i % 2 else modes[::-1]:
            config = learn_config(mode)
            the_plan = learning.plan(pair.model, params, pair.pre, pair.ft, k, config, batch)
            learner = learning.make_learner(the_plan, pair.model, params, pair.pre, pair.ft, k, config,
                                            batches=[batch])
            for step in (1, 2):
                t = time.perf_counter()
                learner.step(batch)  # counting the region, as a step that reports progress does
                times[mode, step] = time.perf_counter() - t
            learner.finish()
        if i >= 2:
            plain.append(t_plain)
            for key in mask:
                mask[key].append(times[key])
    out = {"plain_ms": 1000 * statistics.median(plain)}
    for (mode, step), spent in mask.items():
        paired = sorted(m / p for m, p in zip(spent, plain))  # each round's steps share the machine's state
        out[mode, step] = {"mask_ms": 1000 * statistics.median(spent), "ratio": statistics.median(spent) / statistics.median(plain),
                           "paired": (statistics.median(paired), paired[len(paired) // 4],
                                      paired[len(paired) - 1 - len(paired) // 4])}
    return out


def learn_config(mode: str):
    """"fast" / "lean": the full learner in that memory mode; "cF": candidates with factor F (ranked by gradient on the
    step's batch, no growth within the two timed steps)."""
    from graftui.method import LearnConfig

    return LearnConfig(candidates=mode[1:], checkpoint_every=0) if mode.startswith("c") else \
        LearnConfig(memory=mode, candidates="all")


def bench_apply(pair, k: int = 100_000, repeats: int = 20) -> dict:
    from graftui.method import top_k

    gen = torch.Generator().manual_seed(0)
    region = top_k({n: torch.rand(pair.pre[n].shape, generator=gen) for n in pair.graftable}, k)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        pair.apply(region)
        pair.remove(region)
        times.append(time.perf_counter() - t)
    return {"k": k, "apply_remove_ms": 1000 * statistics.median(times)}


def accounting(pair) -> dict:
    """Bytes held for mask learning beyond one plain model, in fp32 copies of the graftable set."""
    graftable = pair.counts()["graftable"]
    pre_copy = sum(pair.pre[n].numel() for n in pair.graftable)  # the working model has its own
    ft_copy = sum(pair.ft[n].numel() for n in pair.ft)
    logits = graftable  # ℓ: one float each (normalised step; Adam adds two)
    return {"pre": pre_copy / graftable, "finetuned": ft_copy / graftable, "logits": logits / graftable,
            "total": (pre_copy + ft_copy + logits) / graftable}


def rss_bytes() -> int:
    """Resident memory now (Linux), so phases can be told apart, unlike the monotonic peak."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(mode: str, finetuned: str) -> None:
    """Resident memory of one process holding what ``mode`` needs, printed as JSON for the parent.

    Both modes import the same modules and tokenise the same batch first; the figure is the
    resident memory after three steps, with the state each mode keeps alive (a plain step keeps
    its model and gradients; mask learning keeps the pair, the working model and the logits).
    """
    torch.set_num_threads(1)
    from graftui.method import LearnConfig, MaskLearner
    from graftui.models import load_classifier, load_tokenizer
    from graftui.flows import load_pair

    class Tok:  # just enough of a pair for batch_of
        tokenizer = load_tokenizer(finetuned)

    batch = batch_of(Tok)
    graftable = None
    if mode == "plain":
        model, _ = load_classifier(finetuned)
        for _ in range(3):
            for p in model.parameters():
                p.requires_grad_(True)
                p.grad = None
            model(**batch).loss.backward()  # gradients stay alive, as in training
    else:
        pair = load_pair("minilm", finetuned)
        params = {n: pair.param(n) for n in pair.graftable}
        learner = MaskLearner(pair.model, params, pair.pre, pair.ft, pair.counts()["graftable"] // 1000,
                              LearnConfig(memory="lean", candidates="all"))
        for _ in range(3):
            learner.step(batch)
        graftable = pair.counts()["graftable"]
    try:  # hand freed heap back to the OS so the figure counts live memory, in both modes alike
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    print(json.dumps({"rss": rss_bytes(), "graftable": graftable}))


def measure_rss(finetuned: str) -> dict:
    out = {}
    for mode in ("plain", "mask"):
        text = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--finetuned", finetuned],
            check=True, capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]
        out[mode] = json.loads(text)
    graftable = out["mask"]["graftable"]
    extra = out["mask"]["rss"] - out["plain"]["rss"]
    return {"plain_mib": out["plain"]["rss"] / 2**20, "mask_mib": out["mask"]["rss"] / 2**20,
            "extra_copies": extra / (4 * graftable)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--finetuned", default="minilm-movies")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--modes", default="fast,lean,c10", help="full learner's memory modes and cF candidate factors")
    parser.add_argument("--child", choices=["plain", "mask"])
    args = parser.parse_args()
    if args.child:
        child(args.child, args.finetuned)
        return
    from graftui.flows import ensure_models, load_pair
    from graftui.models import resolve

    ensure_models([args.finetuned])  # builds the default checkpoint on first need
    finetuned = resolve(args.finetuned)
    torch.set_num_threads(os.cpu_count() or 1)
    pair = load_pair("minilm", finetuned)
    batch = batch_of(pair)
    counts = pair.counts()
    print(f"model: minilm + {args.finetuned}; graftable {counts['graftable']:,} of {counts['total']:,} parameters; "
          f"batch 16 x {batch['input_ids'].shape[1]} tokens; {torch.get_num_threads()} threads")
    modes = tuple(m.strip() for m in args.modes.split(","))
    speed = bench_speed(pair, batch, args.repeats, modes)
    print(f"1. plain forward+backward {speed['plain_ms']:.1f} ms; mask step (target <= 1.05x, <= 1.02x with candidates):")
    whats = {"fast": "σ(ℓ) and δ held, 2 more copies", "lean": "recomputed"}
    for mode, what in ((m, whats.get(m, f"candidates, c = {m[1:]}")) for m in modes):
        for step, when in ((2, "a later step"), (1, "a run's first step")):
            got = speed[mode, step]
            print(f"   {mode} ({what}), {when}: {got['mask_ms']:.1f} ms -> ratio {got['ratio']:.2f}x; per-round "
                  "median {:.2f}x, quartiles {:.2f}x to {:.2f}x".format(*got["paired"]))
    acc = accounting(pair)
    rss = measure_rss(finetuned)
    print(f"2. extra memory of lean mask learning (--candidates all), tensor accounting of a pair held in memory: "
          f"{acc['total']:.2f} fp32 copies of the graftable set (pre {acc['pre']:.2f} + fine-tuned {acc['finetuned']:.2f} "
          f"+ logits {acc['logits']:.2f}; target <= 3); a pair read from its files maps pre and fine-tuned instead")
    print(f"   resident memory after 3 steps: plain {rss['plain_mib']:.0f} MiB, mask learning {rss['mask_mib']:.0f} MiB "
          f"-> extra {rss['extra_copies']:.2f} copies (a plain step also holds embedding gradients)")
    apply = bench_apply(pair)
    print(f"3. apply + remove a region of k={apply['k']:,}: {apply['apply_remove_ms']:.2f} ms (target < 50 ms)")


if __name__ == "__main__":
    main()
