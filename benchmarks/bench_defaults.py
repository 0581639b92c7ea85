"""`graftui localize` with its defaults on pairs of growing size read from their files: the whole process's peak.

    .venv/bin/python benchmarks/bench_defaults.py [--sizes 20m,150m,330m,1b] [--steps 12] [--check-n 20]
        [--dtype float32|bfloat16] [--batch-size N] [--workdir DIR]

For each size, a Llama causal language model with SmolLM2's tokenizer (vocabulary 49,152, tied embeddings) is
written at seed 0 as the base, and again with heavy-tailed noise on its body as the 'fine-tune' (safetensors, once,
under ``--workdir``). Then ``graftui localize`` runs in a process of its own on that pair and the offline ``movies``
task, read through a prompt, with no memory flag: the default learner, and the memory plan picks what is kept or
recomputed, as in a user's run. ``--steps`` and ``--check-n`` only shorten the run (12 steps include a growth pass of C).

Printed per size: parameters, the model's size in its dtype (the unit), the process's resident high-water mark
(``ru_maxrss`` of the child: Python, torch, transformers, the tokenizer and the data included) in that unit and in
GB, the wall time, and the plan's own line. Targets: ≤ 2.0 model sizes at 330 M, ≤ 1.5 at 1 B and 3 B.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = {  # hidden, layers, intermediate, heads: Llama shapes with SmolLM2's vocabulary
    "20m": (256, 4, 704, 4), "60m": (512, 6, 1408, 8), "150m": (768, 10, 2048, 12), "330m": (1024, 22, 2816, 16),
    "1b": (2048, 16, 5632, 32), "3b": (3072, 26, 8192, 24),
}


def tokenizer_folder() -> Path:
    """SmolLM2's folder as graftui builds it from the offline package (its tokenizer is this benchmark's)."""
    from graftui.models import smollm2_folder

    return smollm2_folder()


def write_pair(size: str, dtype: str, workdir: Path) -> tuple[Path, Path]:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    root = workdir / f"{size}-{dtype}"
    base, ft = root / "base", root / "finetuned"
    if (ft / "config.json").exists():
        return base, ft
    hidden, layers, inter, heads = SIZES[size]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                         num_attention_heads=heads, num_key_value_heads=heads, tie_word_embeddings=True,
                         max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("model.layers."):
                noise = torch.randn(p.shape, generator=gen) * 0.01 * torch.rand(p.shape, generator=gen).pow(4)
                p.add_(noise.to(p.dtype))
    model.save_pretrained(ft)
    tokenizer.save_pretrained(ft)
    return base, ft


def run(size: str, args) -> dict:
    base, ft = write_pair(size, args.dtype, Path(args.workdir))
    out = Path(args.workdir) / f"{size}-{args.dtype}-region.safetensors"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-c", "import sys; from graftui.cli import main; sys.exit(main(sys.argv[1:]))",
               "localize", "--base", str(base), "--finetuned", str(ft), "--task", "movies", "--template",
               "{text} It was", "--label-words", "negative= bad,positive= good", "--steps", str(args.steps),
               "--check-n", str(args.check_n), "--out", str(out)]
    if args.batch_size:
        command += ["--batch-size", str(args.batch_size)]
    if args.dtype != "float32":
        command += ["--dtype", args.dtype]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if done.returncode != 0:
        raise SystemExit(f"localize at {size} failed:\n{done.stderr[-3000:]}")
    if peak <= before * 1024:
        raise SystemExit("the child's peak is hidden by an earlier child's: run one size per invocation")
    plan = next((line for line in done.stderr.splitlines() if line.startswith("mask learning:")), "")
    from graftui.weights import Checkpoint

    checkpoint = Checkpoint.open(ft)
    params = sum(checkpoint.numel(name) for name in checkpoint)
    unit = params * (4 if args.dtype == "float32" else 2)
    return {"size": size, "unit": unit, "params": params, "peak": peak, "seconds": seconds, "plan": plan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20m,150m,330m,1b")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--check-n", type=int, default=20)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batch-size", type=int, default=0, help="rows per mask step (default: graftui's)")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "graftui-bench-defaults"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # one size in a process of its own: ru_maxrss of the children is a maximum over all of them
        print(json.dumps(run(args.one, args)))
        return
    print(f"graftui localize, defaults, {args.steps} steps, check on {args.check_n}, model {args.dtype}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'size':>5} {'params':>13} {'unit GB':>8} {'peak':>8} {'peak GB':>8} {'time s':>7}")
    for size in args.sizes.split(","):
        argv = [sys.executable, __file__, "--one", size, "--steps", str(args.steps), "--check-n", str(args.check_n),
                "--dtype", args.dtype, "--workdir", args.workdir, "--batch-size", str(args.batch_size)]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{size:>5} failed: {done.stderr.strip()[-2000:]}", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{size:>5} {r['params']:>13,} {r['unit'] / 1e9:>8.2f} {r['peak'] / r['unit']:>7.2f}x "
              f"{r['peak'] / 1e9:>8.2f} {r['seconds']:>7.0f}", flush=True)
        print(f"{'':>5} {r['plan']}", flush=True)
    print("targets: peak <= 2.0x at 330m, <= 1.5x at 1b and 3b")


if __name__ == "__main__":
    main()
