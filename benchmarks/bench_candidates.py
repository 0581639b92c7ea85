"""How large the candidate set C must be: candidate-restricted mask learning against the full learner.

    .venv/bin/python benchmarks/bench_candidates.py [--pairs movies,prompt,dates] [--factors 2,5,10,20]
        [--seeds 0] [--n 200] [--out DIR]

For each offline pair — ``movies`` (minilm → minilm-movies, 0.1 %), ``prompt`` (smollm2 → smollm2-movies read
through its prompt, 0.1 %), ``dates`` (smollm2 → smollm2-dates, 1 %: the smallest budget at which its
region writes dates) — the learned region is found with ``--candidates all`` and with each factor c, at
the default mask-learning settings and each seed. Printed per factor: |C|, the region's IoU with the full
learner's region of the same seed, the wall time against it, and the paired difference of the grafts'
scores on the same ``--n`` test examples (accuracy; exact match for dates; 95 % paired interval), c − all.
The regions are kept in ``--out`` so a run can be read again; a second run reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

PAIRS = {  # name: (base, fine-tuned, task, sparsity, loading)
    "movies": ("minilm", "minilm-movies", "movies", 1e-3, {}),
    "prompt": ("smollm2", "smollm2-movies", "movies", 1e-3, {"template": "{text} It was",
                                                           "label_words": "negative= bad,positive= good"}),
    "dates": ("smollm2", "smollm2-dates", "dates", 1e-2, {}),
}


def localize(name: str, candidates: str, seed: int, out: Path) -> tuple[Path, float]:
    import graftui

    base, finetuned, task, sparsity, loading = PAIRS[name]
    path = out / f"{name}-c{candidates}-s{seed}.safetensors"
    record = out / f"{path.stem}.json"
    if path.exists() and record.exists():
        return path, json.loads(record.read_text())["seconds"]
    start = time.perf_counter()
    graftui.localize(base=base, finetuned=finetuned, task=task, sparsity=sparsity, candidates=candidates, seed=seed,
                     out=str(path), **loading)
    seconds = time.perf_counter() - start
    record.write_text(json.dumps({"seconds": seconds}))
    return path, seconds


def iou(a: dict, b: dict) -> float:
    inter = union = 0
    for name in set(a) | set(b):
        x = set(a.get(name, ()).tolist()) if name in a else set()
        y = set(b.get(name, ()).tolist()) if name in b else set()
        inter, union = inter + len(x & y), union + len(x | y)
    return inter / union if union else 1.0


def scorer_for(path: Path, n: int):
    """The pair the region was made on and a function scoring its working model on n test examples."""
    from graftui import regions
    from graftui.config import GraftableSpec
    from graftui.flows.common import LOCAL, load_pair
    from graftui.requests import EvaluateRequest
    from graftui.tasks import kind_of
    from graftui.tasks.reading import read_task_as

    meta = regions.load(path).meta
    task = read_task_as(meta.task, regions.recorded_columns(meta), LOCAL)
    pair = load_pair(meta.base, meta.finetuned, regions.recorded_spec(meta) or GraftableSpec(),
                     options=regions.recorded_options(meta), labels=regions.recorded_labels(meta))
    kind = kind_of(task)
    return pair, kind, kind.scorer(pair, task, "test", n, kind.judging(EvaluateRequest(), meta, LOCAL))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="movies,prompt,dates")
    parser.add_argument("--factors", default="2,5,10,20")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "graftui-bench-candidates"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from graftui import regions

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    factors = [f.strip() for f in args.factors.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    summary = []
    for name in args.pairs.split(","):
        print(f"\n{name}: {PAIRS[name][0]} → {PAIRS[name][1]} on {PAIRS[name][2]}, sparsity {PAIRS[name][3]:g}", flush=True)
        print(f"{'c':>5} {'seed':>4} {'|C|':>12} {'IoU':>6} {'time':>6} {'score':>7} {'c − all [95 %]':>26}")
        for seed in seeds:
            full_path, full_s = localize(name, "all", seed, out)
            full = regions.load(full_path)
            pair, kind, score = scorer_for(full_path, args.n)
            with pair.grafted(full.indices):
                full_out = score()
            k = full.size
            print(f"{'all':>5} {seed:>4} {pair.counts()['graftable']:>12,} {1.0:>6.3f} {1.0:>5.2f}x "
                  f"{full_out.score:>7.3f}", flush=True)
            for c in factors:
                path, seconds = localize(name, c, seed, out)
                region = regions.load(path)
                with pair.grafted(region.indices):
                    got = score()
                diff = kind.paired(got, full_out, seed)  # got − full
                lo, hi = diff["ci"]
                overlap = iou(full.indices, region.indices)
                size = min(int(-(-float(c) * k // 1)), pair.counts()["graftable"])
                print(f"{c:>5} {seed:>4} {size:>12,} {overlap:>6.3f} {seconds / full_s:>5.2f}x {got.score:>7.3f} "
                      f"{diff['diff']:>+9.3f} [{lo:+.3f}, {hi:+.3f}]", flush=True)
                summary.append({"pair": name, "factor": c, "seed": seed, "k": k, "iou": overlap,
                                "time_ratio": seconds / full_s, "score_all": full_out.score, "score": got.score,
                                "diff": diff["diff"], "ci": [lo, hi]})
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nwritten: {out / 'summary.json'}")


if __name__ == "__main__":
    main()
