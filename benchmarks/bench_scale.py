"""Mask learning as models grow: peak memory in units of the model and time per step, side by side.

    .venv/bin/python benchmarks/bench_scale.py [--sizes 20m,60m,150m,400m,1b,3b,8b] [--steps 3] [--device cpu|cuda]
        [--dtype float32|bfloat16] [--logit-dtype float32|float16|bfloat16] [--memory lean|fast|auto]
        [--checkpoint-every N|auto] [--pair memory|files|lora] [--candidates auto|all|c] [--batch N] [--no-plain]

For each size, a Llama pair is built from a config (random weights; the 'fine-tuned' copy is the
base plus heavy-tailed noise in the body), and two child processes run on the same batches:

* ``plain``: one model, ordinary forward+backward (every body parameter gets a gradient);
* ``mask``: the pair and the region logits, ``--steps`` mask steps.

``--pair memory`` builds both models in the child and holds θ_pre and θ_ft in memory (the working
model, θ_pre, θ_ft; memory "auto" by default, "lean" recomputes σ(ℓ) and δ, "fast" holds them). ``--pair files`` writes
the two checkpoints once under ``--workdir`` (safetensors, one model in memory while writing) and
reads the pair as graftui reads a pair from disk: the fine-tuned model loaded as the working model,
θ_pre and θ_ft memory-mapped from their files; ``--pair lora`` reads θ_ft as a LoRA adapter of the base
(rank 16 on every linear layer of the body), the base loaded as the working model and θ_pre mapped from
its file. ``--candidates c`` keeps region logits only over the
C = γ_base and the c·k − k parameters the first step's gradient ranks next; ``all`` over every graftable parameter;
``auto`` (the default, as graftui's) is c = 5 on every machine, and the mask child prints the plan's line.

Printed per size: parameters, the model's size in its dtype (the unit), and in that unit the peak
resident memory of each child while it steps (the high-water mark is reset once the models are
built; the mask child's covers building the learner too) and the mask child's peak while loading;
then the median mask step over the median plain step. On CPU a second line splits the mask peak
into building the learner and stepping, and the resident memory after the steps into allocated
and mapped file pages. Peaks are whole-process figures, Python and torch included, so small models read high; pages
of a memory-mapped checkpoint count while they are mapped in.

With ``--checkpoint-every N`` the mask child recomputes every N-th layer's activations in the
backward pass, and a third child times the plain step checkpointed the same way: the ratio to it
is mask learning's own cost, the ratio to the plain step is what the memory costs in time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SIZES = {  # hidden, layers, intermediate: Llama shapes of growing size
    "20m": (256, 8, 704), "60m": (512, 8, 1408), "150m": (768, 12, 2048), "400m": (1024, 20, 2816),
    "1b": (2048, 16, 5632), "3b": (3072, 28, 8192), "8b": (4096, 32, 14336),
}
SHAPED = {"8b": {"num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}}  # Llama-3-8B's own
VOCAB, BATCH, SEQ = 8192, 8, 64  # token ids are drawn below VOCAB whatever the model's vocabulary


def build(size: str, dtype: str = "float32", device: str = "cpu"):
    """The size's Llama, at seed 0. Off the CPU it is made on the device in its dtype (an 8 B model is not
    initialised on the host in float32 first); on the CPU as before, so earlier figures stand."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    hidden, layers, inter = SIZES[size]
    shape = {"vocab_size": VOCAB, "num_attention_heads": max(4, hidden // 64), "num_key_value_heads": max(4, hidden // 64),
             **SHAPED.get(size, {})}
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                         max_position_embeddings=SEQ, num_labels=2, pad_token_id=0, **shape)
    torch.manual_seed(0)
    if device == "cpu":
        return LlamaForSequenceClassification(config).to(getattr(torch, dtype)).eval()
    torch.cuda.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            return LlamaForSequenceClassification(config).eval()
    finally:
        torch.set_default_dtype(default)


def batches(steps: int, batch: int = BATCH):
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(1, VOCAB, (batch, SEQ), generator=gen)
        yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 2}


def move_body(model, seed: int = 1) -> None:
    """The 'fine-tune': heavy-tailed noise on the body, tensor by tensor."""
    where = next(model.parameters()).device
    gen = torch.Generator(device=where).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("model.layers."):
                noise = torch.randn(p.shape, generator=gen, device=where) * 0.01 * \
                    torch.rand(p.shape, generator=gen, device=where).pow(4)
                p.add_(noise.to(p.dtype))


def write_pair(size: str, dtype: str, workdir: str, device: str = "cpu") -> tuple[Path, Path]:
    """The pair's two checkpoint folders under ``workdir``, written once (one model in memory, made on ``device``)."""
    root = Path(workdir) / f"{size}-{dtype}"
    base, ft = root / "base", root / "finetuned"
    if not (ft / "config.json").exists():
        model = build(size, dtype, device)
        model.save_pretrained(base)
        move_body(model)
        model.save_pretrained(ft)
        del model
    return base, ft


def write_adapter(size: str, dtype: str, workdir: str, rank: int = 16) -> tuple[Path, Path]:
    """The base's folder and a LoRA adapter of it (rank ``rank`` on every linear layer of the body, B drawn at
    random as a trained adapter's is), written once."""
    base, _ = write_pair(size, dtype, workdir)
    adapter = Path(workdir) / f"{size}-{dtype}" / f"lora-r{rank}"
    if not (adapter / "adapter_config.json").exists():
        from peft import LoraConfig, get_peft_model
        from transformers import LlamaForSequenceClassification

        model = get_peft_model(LlamaForSequenceClassification.from_pretrained(base, dtype=getattr(torch, dtype)),
                               LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                          "up_proj", "down_proj"]))
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_((torch.randn(p.shape, generator=gen) * 0.01).to(p.dtype))
        model.save_pretrained(adapter)
    return base, adapter


def child(mode: str, size: str, steps: int, device: str, dtype: str, logit_dtype: str, memory: str,
          checkpoint_every: int | None, pair_from: str = "memory", candidates: str = "auto", batch_size: int = BATCH,
          workdir: str = "") -> None:
    from graftui import learning
    from graftui.models import GraftableSpec, ModelPair
    from graftui.compute import checkpoint_layers, checkpointable_layers
    from graftui.requests import LearnConfig

    if mode == "mask" and pair_from in ("files", "lora"):
        from transformers import LlamaForSequenceClassification

        from graftui.adapters import read_adapter
        from graftui.weights import Checkpoint

        base_dir, ft_dir = write_pair(size, dtype, workdir) if pair_from == "files" else \
            write_adapter(size, dtype, workdir)
        model = LlamaForSequenceClassification.from_pretrained(ft_dir if pair_from == "files" else base_dir,
                                                               dtype=getattr(torch, dtype)).eval()
    else:
        model = build(size, dtype, device)
    n_params = sum(p.numel() for p in model.parameters())
    unit = sum(p.numel() * p.element_size() for p in model.parameters())
    times = []
    ranked, resident, built = 0, {}, 0.0  # the mask child's peak while building its learner, its resident memory after the steps
    plan_line = None
    if mode == "plain":
        model.to(device)
        if checkpoint_every:
            checkpoint_layers(model, checkpointable_layers(model), checkpoint_every)
        loaded = _peak()
        _reset_peak()
        for batch in batches(steps, batch_size):
            batch = {k: v.to(device) for k, v in batch.items()}
            start = time.perf_counter()
            model.zero_grad(set_to_none=True)
            model(**batch).loss.backward()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    else:
        if pair_from == "files":
            pair = ModelPair.from_files(model, None, Checkpoint.open(base_dir), Checkpoint.open(ft_dir), GraftableSpec())
            if pair is None:
                raise SystemExit("the written checkpoints could not be read as the model's tensors")
            pair.to(device)
        elif pair_from == "lora":
            pair = ModelPair.from_adapter(model, None, read_adapter(str(ft_dir)), Checkpoint.open(base_dir), set(),
                                          GraftableSpec()).to(device)
        else:
            finetuned = build(size, dtype, device)  # same seed: identical, then the body moves
            move_body(finetuned)
            pair = ModelPair.from_models(model, finetuned, None, {"score.weight"}, GraftableSpec()).to(device)
            del finetuned
        del model
        params = {n: pair.param(n) for n in pair.graftable}
        k = max(1, pair.counts()["graftable"] // 1000)
        loaded = _peak()
        _reset_peak()
        started = time.perf_counter()
        config = LearnConfig(steps=steps, logit_dtype=logit_dtype, memory=memory, checkpoint_every=checkpoint_every,
                             candidates=candidates)
        ranking = list(batches(1, batch_size))
        the_plan = learning.plan(pair.model, params, pair.pre, pair.ft, k, config, ranking[0])
        plan_line = the_plan.describe()
        learner = learning.make_learner(the_plan, pair.model, params, pair.pre, pair.ft, k, config, batches=ranking)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        built = time.perf_counter() - started
        ranked = _peak()  # the learner built: the ranking by movement and C's values gathered
        _reset_peak()
        for batch in batches(steps, batch_size):
            start = time.perf_counter()
            learner.step(batch)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        resident = _resident()  # after the last step: what the steps left mapped and allocated
        learner.finish()
    gpu_peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    stepped = _peak()
    print(json.dumps({"plan": plan_line if mode == "mask" else None,
                      "params": n_params, "unit": unit, "loaded": loaded, "peak": max(stepped, ranked),
                      "ranked": ranked, "stepped": stepped, "resident": resident, "gpu_peak": gpu_peak, "build_s": built,
                      "step_s": statistics.median(times[1:] if len(times) > 1 else times)}))


def _peak() -> int:
    """The process's resident high-water mark (VmHWM) in bytes."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def _resident() -> dict[str, int]:
    """The process's resident memory now in bytes: anonymous (allocated) and file pages (mapped files, libraries)."""
    with open("/proc/self/status") as fh:
        return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh
                if line.startswith(("RssAnon:", "RssFile:"))}


def _reset_peak() -> None:
    """Start the high-water mark again from the current resident size (Linux ≥ 4.0)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def run_child(mode: str, size: str, args, checkpoint_every: int | None) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", mode, "--sizes", size, "--steps", str(args.steps),
                           "--device", args.device, "--dtype", args.dtype, "--logit-dtype", args.logit_dtype,
                           "--memory", args.memory, "--checkpoint-every", "auto" if checkpoint_every is None else str(checkpoint_every),
                           "--pair", args.pair, "--candidates", args.candidates, "--batch", str(args.batch),
                           "--workdir", args.workdir],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{mode} {size} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]) if mode != "write" else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20m,60m,150m,400m", help=f"comma-separated, from {', '.join(SIZES)}")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--logit-dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--memory", default="auto", choices=("lean", "fast", "auto"))
    parser.add_argument("--checkpoint-every", default="auto",
                        help="mask learning recomputes every N-th layer's activations (0: none; auto: the plan decides)")
    parser.add_argument("--pair", default="memory", choices=("memory", "files", "lora"),
                        help="hold θ_pre and θ_ft in memory, read them from checkpoint files written once, or read "
                             "θ_pre from the base's file and θ_ft as a LoRA adapter of it (rank 16, every linear layer)")
    parser.add_argument("--candidates", default="auto", help="'auto' (c = 5, graftui's default), 'all', or the factor c "
                        "of the candidate set")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"rows per step (default {BATCH}, of {SEQ} tokens)")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain child (a model too big for two)")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "graftui-bench-scale"),
                        help="where --pair files writes the checkpoints (kept for later runs)")
    parser.add_argument("--child", choices=("plain", "mask", "write"))
    args = parser.parse_args()
    if args.child == "write":  # a process of its own: what the device's allocator keeps is not the children's
        write_pair(args.sizes, args.dtype, args.workdir, args.device)
        if args.pair == "lora":
            write_adapter(args.sizes, args.dtype, args.workdir)
        return
    every = None if args.checkpoint_every == "auto" else int(args.checkpoint_every)
    if args.child:
        child(args.child, args.sizes, args.steps, args.device, args.dtype, args.logit_dtype, args.memory,
              every if args.child == "mask" else (every or 0), args.pair, args.candidates, args.batch, args.workdir)
        return
    print(f"batch {args.batch} x {SEQ} tokens, {args.steps} steps per child, device {args.device}, "
          f"{torch.get_num_threads()} threads, model {args.dtype}, logits {args.logit_dtype}, memory {args.memory}, "
          f"checkpoint every {args.checkpoint_every}, pair from {args.pair}, candidates {args.candidates}")
    print(f"{'size':>5} {'params':>12} {'unit GB':>8} {'plain peak':>11} {'mask peak':>10} {'mask load':>10} "
          f"{'plain s':>8} {'mask s':>8} {'ratio':>6}" + (f" {'ckpt s':>8} {'ratio':>6}" if every else "")
          + "   (peaks in units of the model in its dtype)")
    for size in args.sizes.split(","):
        if args.pair != "memory":  # written before either child, in a process of its own: its peak is not theirs
            run_child("write", size, args, 0)
        mask = run_child("mask", size, args, every)
        plain = {"peak": math.nan, "gpu_peak": math.nan, "step_s": math.nan} if args.no_plain else \
            run_child("plain", size, args, 0)
        unit = mask["unit"]
        key = "gpu_peak" if args.device.startswith("cuda") else "peak"
        line = (f"{size:>5} {mask['params']:>12,} {unit / 1e9:>8.2f} {plain[key] / unit:>10.2f}x {mask[key] / unit:>9.2f}x "
                f"{mask['loaded'] / unit:>9.2f}x {plain['step_s']:>8.2f} {mask['step_s']:>8.2f} "
                f"{mask['step_s'] / plain['step_s']:>5.2f}x")
        if every and not args.no_plain:  # the plain step checkpointed alike: what mask learning itself adds
            checkpointed = run_child("plain", size, args, every)
            line += f" {checkpointed['step_s']:>8.2f} {mask['step_s'] / checkpointed['step_s']:>5.2f}x"
        print(line, flush=True)
        print(f"{'':>5} {mask['plan']}", flush=True)
        print(f"{'':>5} the learner built in {mask['build_s']:.1f} s (ranking by movement, C's values gathered)",
              flush=True)
        if key == "peak":  # where the mask peak lies, and what stays resident
            print(f"{'':>5} mask peak {mask['ranked'] / unit:.2f}x while building the learner (ranking, C's values), "
                  f"{mask['stepped'] / unit:.2f}x while stepping; resident after the steps "
                  f"{mask['resident']['RssAnon'] / unit:.2f}x allocated + {mask['resident']['RssFile'] / unit:.2f}x "
                  "mapped file pages (the model's unwritten pages where it is mapped, libraries)", flush=True)
    print("targets: mask peak <= 1.5x from files with candidates (the working model and O(|C|)), <= 1.2x from a LoRA "
          "adapter, <= 4.5x in memory with all (working copy, θ_pre, θ_ft, logits); ratio <= 1.02 (CPU) / 1.10 (GPU)")


if __name__ == "__main__":
    main()
