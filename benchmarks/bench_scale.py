"""Mask learning as models grow: peak memory in units of the model and time per step, side by side.

    .venv/bin/python benchmarks/bench_scale.py [--sizes 20m,60m,150m,400m,1b] [--steps 3] [--device cpu]
        [--dtype float32|bfloat16] [--logit-dtype float32|float16|bfloat16] [--memory lean|fast]
        [--checkpoint-every N]

For each size, a Llama pair is built from a config (random weights; the 'fine-tuned' copy is the
base plus heavy-tailed noise in the body), and two child processes run on the same batches:

* ``plain``: one model, ordinary forward+backward (every body parameter gets a gradient);
* ``mask``: the pair (working model, θ_pre, θ_ft) and the region logits, ``--steps`` mask steps
  (memory "lean" by default, the mode the memory target is about; "fast" holds σ(ℓ) and δ too).

Printed per size: parameters, the model's size in its dtype (the unit), and in that unit the peak
resident memory of each child while it steps (the high-water mark is reset once the models are
built; target for mask learning ≤ 4.5: working copy, θ_pre, θ_ft and the logits, with no full
gradient) and the mask child's peak while loading; then the median mask step over the median plain
step (target ≤ 1.10×). Peaks are whole-process figures, Python and torch included, so small models
read high.

With ``--checkpoint-every N`` the mask child recomputes every N-th layer's activations in the
backward pass, and a third child times the plain step checkpointed the same way: the ratio to it
is mask learning's own cost, the ratio to the plain step is what the memory costs in time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

SIZES = {  # hidden, layers, intermediate: Llama shapes of growing size
    "20m": (256, 8, 704), "60m": (512, 8, 1408), "150m": (768, 12, 2048), "400m": (1024, 20, 2816),
    "1b": (2048, 16, 5632),
}
VOCAB, BATCH, SEQ = 8192, 8, 64


def build(size: str, dtype: str = "float32"):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    hidden, layers, inter = SIZES[size]
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                         num_attention_heads=max(4, hidden // 64), num_key_value_heads=max(4, hidden // 64),
                         max_position_embeddings=SEQ, num_labels=2, pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForSequenceClassification(config).to(getattr(torch, dtype)).eval()


def batches(steps: int):
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen)
        yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 2}


def child(mode: str, size: str, steps: int, device: str, dtype: str, logit_dtype: str, memory: str,
          checkpoint_every: int) -> None:
    from graftui.models import GraftableSpec, ModelPair
    from graftui.compute import checkpoint_layers, checkpointable_layers
    from graftui.method import MaskLearner
    from graftui.requests import LearnConfig

    model = build(size, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    unit = sum(p.numel() * p.element_size() for p in model.parameters())
    times = []
    if mode == "plain":
        model.to(device)
        if checkpoint_every:
            checkpoint_layers(model, checkpointable_layers(model), checkpoint_every)
        loaded = _peak()
        _reset_peak()
        for batch in batches(steps):
            batch = {k: v.to(device) for k, v in batch.items()}
            start = time.perf_counter()
            model.zero_grad(set_to_none=True)
            model(**batch).loss.backward()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    else:
        finetuned = build(size, dtype)  # same seed: identical, then the body moves
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in finetuned.named_parameters():
                if name.startswith("model.layers."):
                    noise = torch.randn(p.shape, generator=gen) * 0.01 * torch.rand(p.shape, generator=gen).pow(4)
                    p.add_(noise.to(p.dtype))
        pair = ModelPair.from_models(model, finetuned, None, {"score.weight"}, GraftableSpec()).to(device)
        del model, finetuned
        params = {n: pair.param(n) for n in pair.graftable}
        k = max(1, pair.counts()["graftable"] // 1000)
        loaded = _peak()
        _reset_peak()
        learner = MaskLearner(pair.model, params, pair.pre, pair.ft, k, LearnConfig(
            steps=steps, logit_dtype=logit_dtype, memory=memory, checkpoint_every=checkpoint_every))
        for batch in batches(steps):
            start = time.perf_counter()
            learner.step(batch)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        learner.finish()
    gpu_peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    print(json.dumps({"params": n_params, "unit": unit, "loaded": loaded, "peak": _peak(), "gpu_peak": gpu_peak,
                      "step_s": statistics.median(times[1:] if len(times) > 1 else times)}))


def _peak() -> int:
    """The process's resident high-water mark (VmHWM) in bytes."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def _reset_peak() -> None:
    """Start the high-water mark again from the current resident size (Linux ≥ 4.0)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def run_child(mode: str, size: str, args, checkpoint_every: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", mode, "--sizes", size, "--steps", str(args.steps),
                           "--device", args.device, "--dtype", args.dtype, "--logit-dtype", args.logit_dtype,
                           "--memory", args.memory, "--checkpoint-every", str(checkpoint_every)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{mode} {size} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20m,60m,150m,400m", help=f"comma-separated, from {', '.join(SIZES)}")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--logit-dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--memory", default="lean", choices=("lean", "fast"))
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="mask learning recomputes every N-th layer's activations (0: none)")
    parser.add_argument("--child", choices=("plain", "mask"))
    args = parser.parse_args()
    if args.child:
        child(args.child, args.sizes, args.steps, args.device, args.dtype, args.logit_dtype, args.memory,
              args.checkpoint_every)
        return
    every = args.checkpoint_every
    print(f"batch {BATCH} x {SEQ} tokens, {args.steps} steps per child, device {args.device}, "
          f"{torch.get_num_threads()} threads, model {args.dtype}, logits {args.logit_dtype}, memory {args.memory}, "
          f"checkpoint every {every or '-'}")
    print(f"{'size':>5} {'params':>12} {'unit GB':>8} {'plain peak':>11} {'mask peak':>10} {'mask load':>10} "
          f"{'plain s':>8} {'mask s':>8} {'ratio':>6}" + (f" {'ckpt s':>8} {'ratio':>6}" if every else "")
          + "   (peaks in units of the model in its dtype)")
    for size in args.sizes.split(","):
        plain = run_child("plain", size, args, 0)
        mask = run_child("mask", size, args, every)
        unit = plain["unit"]
        key = "gpu_peak" if args.device.startswith("cuda") else "peak"
        line = (f"{size:>5} {plain['params']:>12,} {unit / 1e9:>8.2f} {plain[key] / unit:>10.2f}x {mask[key] / unit:>9.2f}x "
                f"{mask['loaded'] / unit:>9.2f}x {plain['step_s']:>8.2f} {mask['step_s']:>8.2f} "
                f"{mask['step_s'] / plain['step_s']:>5.2f}x")
        if every:  # the plain step checkpointed alike: what mask learning itself adds
            checkpointed = run_child("plain", size, args, every)
            line += f" {checkpointed['step_s']:>8.2f} {mask['step_s'] / checkpointed['step_s']:>5.2f}x"
        print(line, flush=True)
    print("targets: mask peak <= 4.5x (working copy, θ_pre, θ_ft, logits; no full gradient), ratio <= 1.10")


if __name__ == "__main__":
    main()
