"""The low-budget frontier: learned regions against top-movement at small k, on two test sets.

    .venv/bin/python benchmarks/bench_low_budget.py [--finetuned REF] [--sparsities 1e-4,3e-4,1e-3]
        [--configs default,hard,...] [--n 1000]

For each mask-learning configuration (``CONFIGS``) and budget: accuracy of the graft on the task's
test split and on an independent split (training sentences used neither by the default fine-tune
nor by mask learning), its share of the fine-tuned accuracy, the margin over top-movement of the
same size, and the time mask learning took (with its ratio to the default configuration's).
"""

from __future__ import annotations

import argparse
import time

CONFIGS = {  # LearnConfig fields that differ from the defaults; "examples_per_class", "start" ("empty": γ_base = ∅)
    # and "data" too; "data": "test" learns on the test split itself, which no real use can do: a reference
    # point for how far more or better data could lift mask learning on this pair
    "default": {},
    "hard": {"forward": "hard"},
    "bias6": {"sigmoid_bias": 6.0},
    "hard-bias6": {"forward": "hard", "sigmoid_bias": 6.0},
    "steps80": {"steps": 80},
    "lr0.05": {"lr": 0.05},
    "empty": {"start": "empty"},
    "batch64": {"batch_size": 64, "steps": 20},
    "data1024": {"batch_size": 64, "steps": 20, "examples_per_class": 1024},
    "on-test": {"data": "test", "batch_size": 64},  # 40 × 64: two and a half passes over 1,000 test sentences
}


def independent_split(task, n: int, finetune_examples: int, examples_per_class: int):
    """Training sentences outside the fine-tune's subsample and the mask's k-shot sample."""
    from graftui.tasks.classification.data import kshot, subsample

    train = task.splits["train"]
    used = set(subsample(train, finetune_examples, 0).texts) | set(kshot(train, examples_per_class, 0).texts)
    rest = train.select(i for i, t in enumerate(train.texts) if t not in used)
    return subsample(rest, n, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="minilm")
    parser.add_argument("--finetuned", default="minilm-movies")
    parser.add_argument("--sparsities", default="1e-4,3e-4,1e-3")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--n", type=int, default=1000, help="examples of the independent split")
    args = parser.parse_args()

    from dataclasses import replace

    from graftui import flows, metrics, settings
    from graftui.tasks.classification import scoring
    from graftui.tasks.classification.data import batches, kshot, load_task
    from graftui.learning import learn_region
    from graftui.method import LearnConfig
    from graftui.config import Budget
    from graftui.models import GraftableSpec
    from graftui.requests import DEFAULT_EXAMPLES_PER_CLASS, DEFAULT_RECIPE

    settings.configure_torch()
    task = load_task("movies")
    names = args.configs.split(",")
    most = max(CONFIGS[name].get("examples_per_class", DEFAULT_EXAMPLES_PER_CLASS) for name in names)
    held_out = independent_split(task, args.n, DEFAULT_RECIPE.train_examples, most)  # unseen by every config
    splits = {"test": task.splits["test"], "independent": held_out}
    pair = flows.get_pair(args.base, args.finetuned, GraftableSpec(), flows.LOCAL)
    params = {n: pair.param(n) for n in pair.graftable}

    def score(context) -> dict:
        out = {}
        with context:
            for name, split in splits.items():
                probs, labels = metrics.predict_proba(pair.model, batches(pair.tokenizer, split, 64, task.max_length))
                out[name] = metrics.accuracy(probs, labels)
        return out

    ft = score(pair.finetuned())
    print(f"fine-tuned: test {ft['test']:.3f}, independent {ft['independent']:.3f} (n={len(held_out)})")
    print(f"{'sparsity':>9} {'k':>7} {'config':>11} {'test':>6} {'kept':>5} {'vs top':>7} {'indep':>6} {'kept':>5} "
          f"{'vs top':>7} {'seconds':>8} {'time×':>6}")
    for s in [float(x) for x in args.sparsities.split(",")]:
        k = Budget(sparsity=s).resolve(pair.counts()["graftable"])
        top = score(pair.grafted(scoring.baseline_regions(pair, k, ("top-movement",))["top-movement"]))
        print(f"{s:>9g} {k:>7,} {'top-move':>11} {top['test']:>6.3f} {top['test'] / ft['test']:>5.0%} {'':>7} "
              f"{top['independent']:>6.3f} {top['independent'] / ft['independent']:>5.0%}")
        base_seconds = None
        for name in names:
            fields = dict(CONFIGS[name])
            per_class, origin = fields.pop("examples_per_class", DEFAULT_EXAMPLES_PER_CLASS), fields.pop("start", None)
            data = fields.pop("data", "train")
            if data not in ("train", "test"):
                raise SystemExit(f"config '{name}': data must be 'train' or 'test', got '{data}'")
            config = replace(LearnConfig(), **fields)
            train = task.splits["test"] if data == "test" else kshot(task.splits["train"], per_class, 0)

            def make_batches(epoch: int, config=config, train=train):
                return batches(pair.tokenizer, train, config.batch_size, task.max_length, shuffle_seed=config.seed + epoch)

            start = time.perf_counter()
            region, _ = learn_region(pair.model, params, pair.pre, pair.ft, k, make_batches, config,
                                     start={} if origin == "empty" else None)
            seconds = time.perf_counter() - start
            base_seconds = base_seconds or seconds
            got = score(pair.grafted(region))
            print(f"{s:>9g} {k:>7,} {name:>11} {got['test']:>6.3f} {got['test'] / ft['test']:>5.0%} "
                  f"{100 * (got['test'] - top['test']):>+7.1f} {got['independent']:>6.3f} "
                  f"{got['independent'] / ft['independent']:>5.0%} {100 * (got['independent'] - top['independent']):>+7.1f} "
                  f"{seconds:>8.1f} {seconds / base_seconds:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
