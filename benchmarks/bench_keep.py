"""The size a skill needs: ``graftui localize --keep`` on the offline pairs, its curve and the k it finds.

    .venv/bin/python benchmarks/bench_keep.py [--pairs movies,prompt,dates-small,lora,l1] [--keep 0.9] [--n 200]
        [--seed 0] [--out DIR]

For each pair of ``bench_candidates.PAIRS`` the search starts at the pair's budget with the default learner and
prints each region it learned (k, sparsity, the share of the gain kept on ``--n`` held-out examples — a completion
task's share of the pre → FT loss gap —, its score, the region it was learned inside), the k written and the wall
time. The regions are written to ``--out``; the JSON of each run beside them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_candidates import PAIRS, finetuned_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="movies,prompt,dates-small,lora,l1")
    parser.add_argument("--keep", type=float, default=0.9)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="/tmp/graftui-bench-keep")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import graftui

    for name in args.pairs.split(","):
        base, _, task, sparsity, loading = PAIRS[name]
        path = out / f"{name}-keep{args.keep:g}-seed{args.seed}.safetensors"
        start = time.time()
        result = graftui.localize(base=base, finetuned=finetuned_of(name, out), task=task, sparsity=sparsity,
                                  keep=args.keep, check_n=args.n, seed=args.seed, out=str(path), overwrite=True,
                                  **loading)
        seconds = time.time() - start
        doc = result.as_dict()
        search = doc["meta"]["size_search"]
        (out / f"{path.stem}.json").write_text(json.dumps({"seconds": seconds, "size_search": search,
                                                           "plan": doc.get("plan")}, indent=1))
        print(f"\n{name}: {base} → {PAIRS[name][1]} on {task}, from sparsity {sparsity:g}, keep {args.keep:g} "
              f"({search['measure']}, n = {search['n']}), seed {args.seed}: k = {search['k']:,} "
              f"({search['k'] / doc['graftable_params']:.4%}) in {seconds:.0f} s")
        print(f"{'k':>12} {'sparsity':>9} {'share kept':>10} {'score':>7} {'inside':>12}")
        for p in search["curve"]:
            share = "-" if p["share"] is None else f"{p['share']:.3f}"
            score = "-" if p["score"] is None else f"{p['score']:.3f}"
            inside = f"{p['inside']:,}" if p["inside"] else "all"
            print(f"{p['k']:>12,} {p['sparsity']:>9.4%} {share:>10} {score:>7} {inside:>12}"
                  + ("  ✓" if p["keeps"] else ""))


if __name__ == "__main__":
    main()
