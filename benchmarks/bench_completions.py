"""Completion tasks on SmolLM2, measured side by side in one run.

    .venv/bin/python benchmarks/bench_completions.py [--repeats 5] [--batch 8] [--tokens 256] [--prompts 64]

Prints three figures against their targets:

1. one mask step on completion batches of ``--tokens`` tokens (the prompt masked out of the loss) against one plain
   fine-tuning step of the same model on the same batch (the body trained, embeddings and head fixed, through the
   same forward as ``graftui finetune`` trains on completions), interleaved round by round; median ratio and the
   per-round paired ratios (target <= 1.10x); the mask step with every layer's activations recomputed
   (``--checkpoint-every 1``) is timed in the same rounds;
2. peak resident memory of a process stepping each way, in units of the model's size, above what the process held
   before it loaded a model (the interpreter and its libraries; the whole-process peak is printed too; target for mask
   learning <= 4.5: working copy, θ_pre, θ_ft, the logits, no full gradient), for mask learning with all activations
   kept and with them recomputed layer by layer;
3. generation throughput of the evaluation (``generation.generate``: greedy, batched, prompts grouped by length)
   against plain ``model.generate`` on the same prompts in batches of the same size (target >= 0.9x).

The pair is smollm2 and smollm2-dates (built on first use); each long example is a few-shot prompt of dates written
out, then the query, so a batch is ``--batch`` x about ``--tokens`` tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

PAIR = ("smollm2", "smollm2-dates")


def long_examples(tokenizer, n: int, tokens: int):
    """``n`` completions of about ``tokens`` tokens: a few-shot prompt of written-out dates, then the query."""
    from graftui.tasks.completion.data import Completions, offline_skill

    pool = offline_skill("dates").splits["train"].examples
    out, at = [], 0
    for _ in range(n):
        shots = ""
        while True:
            (_, prompt), (_, answer) = pool[at % len(pool)]
            at += 1
            more = shots + prompt + answer + "\n\n"
            if len(tokenizer(more)["input_ids"]) > tokens - 24:
                break
            shots = more
        (_, prompt), (_, answer) = pool[at % len(pool)]
        at += 1
        out.append((("user", shots + prompt), ("assistant", answer)))
    return Completions(tuple(out))


def batch_of(tokenizer, size: int, tokens: int) -> dict:
    from graftui.tasks.completion.data import batches

    return next(batches(tokenizer, long_examples(tokenizer, size, tokens), False, size, tokens + 16))


def trainable_body(model) -> list:
    """What supervised fine-tuning trains: every parameter but the embeddings and the LM head."""
    head = {id(p) for p in model.get_output_embeddings().parameters()}
    head |= {id(p) for p in model.get_input_embeddings().parameters()}
    return [p for p in model.parameters() if id(p) not in head]


def plain_step(reader, batch, body) -> None:
    for p in reader.parameters():
        p.requires_grad_(False)
        p.grad = None
    for p in body:
        p.requires_grad_(True)
    reader(**batch).loss.backward()
    for p in body:
        p.grad = None


def bench_speed(pair, batch, repeats: int) -> dict:
    from graftui.method import LearnConfig, MaskLearner

    lm = pair.model.lm
    body = trainable_body(lm)
    params = {n: pair.param(n) for n in pair.graftable}
    k = max(1, pair.counts()["graftable"] // 1000)
    times = {"plain": [], "mask": [], "checkpointed": []}
    for i in range(repeats + 1):  # one warm-up round
        t = time.perf_counter()
        plain_step(pair.model, batch, body)
        took = {"plain": time.perf_counter() - t}
        for name, every in (("mask", 0), ("checkpointed", 1)):
            learner = MaskLearner(pair.model, params, pair.pre, pair.ft, k,
                                  LearnConfig(memory="lean", checkpoint_every=every))
            learner.step(batch)  # a run's first step also pays for memory its set-up handed back
            t = time.perf_counter()
            learner.step(batch)
            took[name] = time.perf_counter() - t
            learner.finish()
        if i:
            for name, seconds in took.items():
                times[name].append(seconds)
    plain = statistics.median(times["plain"])
    return {"plain_s": plain, "mask_s": statistics.median(times["mask"]),
            "ratio": statistics.median(times["mask"]) / plain,
            "paired": sorted(m / p for m, p in zip(times["mask"], times["plain"])),
            "checkpointed_ratio": statistics.median(times["checkpointed"]) / plain}


def bench_generation(pair, prompts: int, repeats: int, new_tokens: int = 16, batch: int = 32) -> dict:
    """Tokens generated per second, ours against plain ``generate`` on the same prompts (batches of ``batch``)."""
    from graftui.tasks.completion import generation
    from graftui.tasks.completion.data import offline_skill

    task = offline_skill("dates")
    data = task.splits["test"].select(range(prompts))
    lm, tok = pair.model.lm, pair.tokenizer
    ids = [generation.prompt_ids(tok, e, False, 256) for e in data.examples]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def plain() -> int:
        made = 0
        for start in range(0, len(ids), batch):
            chosen = ids[start:start + batch]
            width = max(map(len, chosen))
            x = torch.tensor([[pad] * (width - len(c)) + c for c in chosen])
            mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chosen])
            with torch.no_grad():
                out = lm.generate(input_ids=x, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                  temperature=None, top_p=None, top_k=None, pad_token_id=pad,
                                  eos_token_id=tok.eos_token_id)
            made += int((out[:, width:] != pad).sum())
        return made

    def ours() -> int:
        texts = generation.generate(pair.model, tok, data, False, max_new_tokens=new_tokens, batch_size=batch)
        return sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)

    speeds = {"plain": [], "ours": []}
    for i in range(repeats + 1):
        for name, fn in ((("plain", plain), ("ours", ours)) if i % 2 else (("ours", ours), ("plain", plain))):
            t = time.perf_counter()
            made = fn()
            if i:
                speeds[name].append(made / (time.perf_counter() - t))
    paired = sorted(o / p for o, p in zip(speeds["ours"], speeds["plain"]))
    return {"plain_tps": statistics.median(speeds["plain"]), "ours_tps": statistics.median(speeds["ours"]),
            "ratio": statistics.median(speeds["ours"]) / statistics.median(speeds["plain"]), "paired": paired}


def _peak() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def _resident() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def child(mode: str, size: int, tokens: int) -> None:
    """Peak resident memory of three steps of ``mode``, in bytes, with the model's own size."""
    from graftui.config import LoadOptions
    from graftui.flows import load_pair
    from graftui.method import LearnConfig, MaskLearner
    from graftui.models import CompletionLM, load_lm, load_tokenizer, resolve

    tok = load_tokenizer(resolve(PAIR[1]))
    batch = batch_of(tok, size, tokens)
    before = _resident()  # the interpreter, torch and transformers, before any model
    if mode == "plain":
        lm = load_lm(resolve(PAIR[1]), "causal-lm")
        reader, body = CompletionLM(lm), trainable_body(lm)
        unit = sum(p.numel() * p.element_size() for p in lm.parameters())
        _reset_peak()
        for _ in range(3):
            for p in body:
                p.requires_grad_(True)
            lm.zero_grad(set_to_none=False)
            reader(**batch).loss.backward()  # gradients stay alive, as in training
    else:
        pair = load_pair(PAIR[0], resolve(PAIR[1]), options=LoadOptions(head="completion"))
        unit = sum(p.numel() * p.element_size() for p in pair.model.parameters())
        params = {n: pair.param(n) for n in pair.graftable}
        learner = MaskLearner(pair.model, params, pair.pre, pair.ft, pair.counts()["graftable"] // 1000,
                              LearnConfig(memory="lean", checkpoint_every=int(mode == "checkpointed")))
        _reset_peak()
        for _ in range(3):
            learner.step(batch)
    print(json.dumps({"peak": _peak(), "unit": unit, "before": before}))


def measure_memory(size: int, tokens: int) -> dict:
    out = {}
    for mode in ("plain", "mask", "checkpointed"):
        done = subprocess.run([sys.executable, __file__, "--child", mode, "--batch", str(size), "--tokens", str(tokens)],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"the {mode} child failed:\n{done.stderr[-2000:]}")
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--child", choices=("plain", "mask", "checkpointed"))
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batch, args.tokens)
        return
    from graftui.config import LoadOptions
    from graftui.flows import ensure_models, load_pair
    from graftui.models import resolve

    ensure_models([PAIR[1]])
    pair = load_pair(PAIR[0], resolve(PAIR[1]), options=LoadOptions(head="completion"))
    batch = batch_of(pair.tokenizer, args.batch, args.tokens)
    scored = int((batch["labels"] != -100).sum())
    print(f"pair {PAIR[0]} + {PAIR[1]}: graftable {pair.counts()['graftable']:,} of {pair.counts()['total']:,}; batch "
          f"{tuple(batch['input_ids'].shape)} tokens ({scored} scored); {torch.get_num_threads()} threads")
    speed = bench_speed(pair, batch, args.repeats)
    print(f"1. plain fine-tuning step {speed['plain_s']:.2f} s, mask step {speed['mask_s']:.2f} s -> ratio "
          f"{speed['ratio']:.2f}x (target <= 1.10x); per-round ratios " + ", ".join(f"{r:.2f}" for r in speed["paired"])
          + f"; with every layer recomputed {speed['checkpointed_ratio']:.2f}x")
    memory = measure_memory(args.batch, args.tokens)
    unit = memory["mask"]["unit"]
    above = {m: (memory[m]["peak"] - memory[m]["before"]) / unit for m in memory}
    print(f"2. peak resident memory while stepping, in model sizes ({unit / 2**20:.0f} MiB), above the process before "
          f"any model was loaded: plain fine-tuning {above['plain']:.2f}, mask learning {above['mask']:.2f}, with every "
          f"layer recomputed {above['checkpointed']:.2f} (target <= 4.5); whole process: "
          + ", ".join(f"{memory[m]['peak'] / unit:.2f}" for m in memory))
    gen = bench_generation(pair, args.prompts, max(2, args.repeats // 2))
    print(f"3. generation: plain generate {gen['plain_tps']:.0f} tokens/s, the evaluation's {gen['ours_tps']:.0f} "
          f"tokens/s -> {gen['ratio']:.2f}x (target >= 0.9x); per-round " + ", ".join(f"{r:.2f}" for r in gen["paired"]))


if __name__ == "__main__":
    main()
