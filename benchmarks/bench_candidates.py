"""The candidate learner against the full learner: the region it finds, and what the graft scores.

    .venv/bin/python benchmarks/bench_candidates.py [--pairs movies,prompt,dates,dates-small,lora,l1]
        [--learners 5,movement:5] [--seeds 0] [--n 200] [--out DIR]

For each offline pair — ``movies`` (minilm → minilm-movies, 0.1 %), ``prompt`` (smollm2 → smollm2-movies read
through its prompt, 0.1 %), ``dates`` and ``dates-small`` (smollm2 → smollm2-dates, an AdamW fine-tune, 1 % and
0.1 %), ``lora`` (smollm2 → smollm2-dates-lora, an AdamW LoRA adapter, 1 %) and ``l1`` (smollm2 fine-tuned on dates
with AdamW and an ℓ1 penalty on the movement, made here once with ``graftui finetune``, 0.1 %) — the learned region is
found with ``--candidates all`` (the full learner) and with each learner of ``--learners``: a factor c is the
candidate learner (C = γ_base and the parameters the first step's gradient ranks next, grown while learning; c = 5 is
the default), ``movement:c`` the candidate set of the c·k largest movements (without growth: the rule before),
``nested`` the default learner at 10·k and then the region inside that one (``--schedule nested``), at the default
mask-learning settings and each seed. Printed per learner: |C| at
the start and at the end, how often C grew, the region's IoU with the full learner's region of the same seed, the wall
time against it, the score and its share of the fine-tuning gain kept ((graft − pre) / (FT − pre)), and the paired
difference of the grafts' scores on the same ``--n`` test examples (accuracy; exact match for a completion task; 95 %
paired interval), learner − all. With several seeds, each learner's IoU between its
own regions of different seeds follows: how far the full learner's region is itself a fixed reference. The regions are kept in ``--out`` so a run can be
read again; a second run reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

PROMPT = {"template": "{text} It was", "label_words": "negative= bad,positive= good"}
PAIRS = {  # name: (base, fine-tuned, task, sparsity, loading)
    "movies": ("minilm", "minilm-movies", "movies", 1e-3, {}),
    "prompt": ("smollm2", "smollm2-movies", "movies", 1e-3, PROMPT),
    "dates": ("smollm2", "smollm2-dates", "dates", 1e-2, {}),
    "dates-small": ("smollm2", "smollm2-dates", "dates", 1e-3, {}),
    "lora": ("smollm2", "smollm2-dates-lora", "dates", 1e-2, {}),
    "l1": ("smollm2", "l1", "dates", 1e-3, {}),  # the fine-tune is made in --out once
}


def finetuned_of(name: str, out: Path) -> str:
    """The fine-tuned reference of a pair; the ℓ1 fine-tune is made once under ``out``."""
    ref = PAIRS[name][1]
    if ref != "l1":
        return ref
    folder = out / "smollm2-dates-l1"
    if not (folder / "config.json").exists():
        import graftui

        graftui.finetune(base="smollm2", task="dates", optimizer="adamw", l1=1e-3, out=str(folder))
    return str(folder)


def settings(learner: str) -> dict:
    """A learner's request fields: "all", a factor c (the gradient-ranked candidate learner), "movement:c", or
    "nested" (the default learner at 10·k, then the region inside that one)."""
    if learner.startswith("movement:"):
        return {"candidates": learner.split(":", 1)[1], "rank": "movement", "grow_every": 0}
    if learner == "nested":
        return {"schedule": "nested"}
    return {"candidates": learner}


def localize(name: str, learner: str, seed: int, out: Path) -> tuple[Path, float]:
    import graftui

    base, _, task, sparsity, loading = PAIRS[name]
    path = out / f"{name}-{learner.replace(':', '-')}-s{seed}.safetensors"
    record = out / f"{path.stem}.json"
    if path.exists() and record.exists():
        return path, json.loads(record.read_text())["seconds"]
    start = time.perf_counter()
    graftui.localize(base=base, finetuned=finetuned_of(name, out), task=task, sparsity=sparsity, seed=seed,
                     out=str(path), check_n=0, **settings(learner), **loading)
    seconds = time.perf_counter() - start
    record.write_text(json.dumps({"seconds": seconds}))
    return path, seconds


def iou(a: dict, b: dict) -> float:
    inter = union = 0
    for name in set(a) | set(b):
        x = set(a[name].tolist()) if name in a else set()
        y = set(b[name].tolist()) if name in b else set()
        inter, union = inter + len(x & y), union + len(x | y)
    return inter / union if union else 1.0


def scorer_for(path: Path, n: int):
    """The pair the region was made on and a function scoring its working model on n test examples."""
    from graftui import regions
    from graftui.config import GraftableSpec
    from graftui.flows.common import LOCAL, load_pair
    from graftui.requests import EvaluateRequest
    from graftui.kinds import kind_of, read_task_as, recorded_columns

    meta = regions.load(path).meta
    task = read_task_as(meta.task, recorded_columns(meta), LOCAL)
    pair = load_pair(meta.base, meta.finetuned, regions.recorded_spec(meta) or GraftableSpec(),
                     options=regions.recorded_options(meta), labels=regions.recorded_labels(meta))
    kind = kind_of(task)
    return pair, kind, kind.scorer(pair, task, "test", n, kind.judging(EvaluateRequest(), meta, LOCAL))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="movies,prompt,dates,dates-small,lora,l1")
    parser.add_argument("--learners", default="5,movement:5")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "graftui-bench-candidates"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from graftui import regions

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    learners = [f.strip() for f in args.learners.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    summary = []
    for name in args.pairs.split(","):
        print(f"\n{name}: {PAIRS[name][0]} → {PAIRS[name][1]} on {PAIRS[name][2]}, sparsity {PAIRS[name][3]:g}", flush=True)
        print(f"{'learner':>10} {'seed':>4} {'|C| start':>10} {'|C| end':>10} {'grew':>4} {'IoU':>6} {'time':>6} "
              f"{'score':>7} {'kept':>6} {'learner − all [95 %]':>28}")
        references = None
        for seed in seeds:
            full_path, full_s = localize(name, "all", seed, out)
            full = regions.load(full_path)
            pair, kind, score = scorer_for(full_path, args.n)
            if references is None:  # FT and the pre-trained model: the gain a region keeps a share of
                with pair.finetuned():
                    ft_score = score().score
                references = (ft_score, score().score)
                print(f"{'FT':>10} {'':>4} {'':>10} {'':>10} {'':>4} {'':>6} {'':>6} {references[0]:>7.3f}\n"
                      f"{'pre':>10} {'':>4} {'':>10} {'':>10} {'':>4} {'':>6} {'':>6} {references[1]:>7.3f}", flush=True)
            ft_score, pre_score = references

            def kept(s: float) -> float:
                return (s - pre_score) / (ft_score - pre_score) if ft_score > pre_score else float("nan")

            with pair.grafted(full.indices):
                full_out = score()
            print(f"{'all':>10} {seed:>4} {pair.counts()['graftable']:>10,} {'':>10} {'':>4} {1.0:>6.3f} {1.0:>5.2f}x "
                  f"{full_out.score:>7.3f} {kept(full_out.score):>6.3f}", flush=True)
            summary.append({"pair": name, "learner": "all", "seed": seed, "k": full.size, "score": full_out.score,
                            "kept": kept(full_out.score), "ft": ft_score, "pre": pre_score, "n": args.n})
            for learner in learners:
                path, seconds = localize(name, learner, seed, out)
                region = regions.load(path)
                with pair.grafted(region.indices):
                    got = score()
                diff = kind.paired(got, full_out, seed)  # got − full
                lo, hi = diff["ci"]
                overlap = iou(full.indices, region.indices)
                made = region.meta.learner or {}
                print(f"{learner:>10} {seed:>4} {made.get('start', 0):>10,} {made.get('size', 0):>10,} "
                      f"{made.get('grown', 0):>4} {overlap:>6.3f} {seconds / full_s:>5.2f}x {got.score:>7.3f} "
                      f"{kept(got.score):>6.3f} {diff['diff']:>+9.3f} [{lo:+.3f}, {hi:+.3f}]", flush=True)
                summary.append({"pair": name, "learner": learner, "seed": seed, "k": full.size, "iou": overlap,
                                "kept": kept(got.score),
                                "c_start": made.get("start"), "c_end": made.get("size"), "grown": made.get("grown"),
                                "time_ratio": seconds / full_s, "score_all": full_out.score, "score": got.score,
                                "diff": diff["diff"], "ci": [lo, hi], "n": args.n})
        if len(seeds) > 1:  # how far a learner's region depends on its seed: the reference's own reproducibility
            for learner in ["all", *learners]:
                found = [regions.load(localize(name, learner, seed, out)[0]).indices for seed in seeds]
                pairs = [iou(a, b) for i, a in enumerate(found) for b in found[i + 1:]]
                print(f"{learner:>10} between seeds: IoU {min(pairs):.3f}–{max(pairs):.3f} over {len(pairs)} pair(s)",
                      flush=True)
                summary.append({"pair": name, "learner": learner, "between_seeds": pairs})
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nwritten: {out / 'summary.json'}")


if __name__ == "__main__":
    main()
