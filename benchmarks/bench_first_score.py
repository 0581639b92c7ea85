"""Time from Localize's click to a first held-out accuracy of the region, before and after the quick check.

    .venv/bin/python benchmarks/bench_first_score.py [--repeats N] [--base minilm --finetuned minilm-movies]

Each side runs in a fresh process (as a first job after the app starts: the pair is loaded by the job), offline,
with the app's defaults (learned, sparsity 1e-3, its mask steps and examples per class):

* before: Localize without its check (``check_n=0``), then Compare with its defaults (500 test examples, the
  top-movement and random baselines) — the first accuracy of the region is known when Compare ends;
* after: Localize with its check (200 held-out test examples): the first figure is the region it starts from
  (top-movement) scored beside FT and the empty region, before any mask step; the learned region's own follows
  at the end of the job, with FT's and the empty region's scores reused.

The clock starts after the imports (a running app has made them before any click; they are shown apart) and
includes loading the pair. Also shown: a second Localize in the same process (the app's next click on the same pair: the pair and the
references are kept), and each side's total. The default fine-tuned checkpoint is built first (untimed) where
$GRAFTUI_HOME does not hold it yet; the regions go to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
began = time.time()
from graftui import flows
from graftui.requests import EvaluateRequest, LocalizeRequest
side, base, finetuned, out = sys.argv[1:5]
t0 = time.time()  # the click: a running app has imported graftui, torch and transformers already
marks = {"imports (before the click)": t0 - began}
def progress(event):
    if "heldout" in event:
        marks.setdefault(event["heldout"]["model"], time.time() - t0)
req = dict(base=base, finetuned=finetuned, out=out, overwrite=True)
if side == "before":
    loc = flows.localize(LocalizeRequest(**req, check_n=0))
    marks["localized"] = time.time() - t0
    ev = flows.evaluate(EvaluateRequest(regions=[loc.path], n=500, baselines=True))
    marks["first accuracy"] = marks["done"] = time.time() - t0
else:
    loc = flows.localize(LocalizeRequest(**req), progress=progress)
    marks["first accuracy"] = marks["top-movement start"]
    marks["done"] = time.time() - t0
    t1 = time.time()
    again = {}
    flows.localize(LocalizeRequest(**req), progress=lambda e: "heldout" in e and again.setdefault("t", time.time() - t1))
    marks["second click: first accuracy"] = again["t"]
print(json.dumps(marks))
"""


def run(side: str, base: str, finetuned: str, folder: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    began = time.time()
    done = subprocess.run([sys.executable, "-c", CHILD, side, base, finetuned, os.path.join(folder, f"{side}.safetensors")],
                          capture_output=True, text=True, env=env, check=True)
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    marks["process"] = time.time() - began
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base", default="minilm")
    parser.add_argument("--finetuned", default="minilm-movies")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="graftui-bench-")  # the regions; models come from $GRAFTUI_HOME as usual
    from graftui.flows.common import ensure_models
    ensure_models([args.finetuned])  # untimed
    results = {"before": [], "after": []}
    for i in range(args.repeats):
        for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
            results[side].append(run(side, args.base, args.finetuned, folder))
            print(side, json.dumps({k: round(v, 1) for k, v in results[side][-1].items()}), flush=True)
    med = lambda side, key: statistics.median(r[key] for r in results[side])  # noqa: E731
    print(f"\n{args.base} / {args.finetuned}, {args.repeats} fresh processes per side, medians (s):")
    print(f"{'':44}{'before':>10}{'after':>10}")
    print(f"{'click → first held-out accuracy of a region':44}{med('before', 'first accuracy'):10.1f}"
          f"{med('after', 'first accuracy'):10.1f}")
    print(f"{'click → the learned region scored':44}{med('before', 'done'):10.1f}{med('after', 'this region'):10.1f}")
    print(f"{'second click, same pair → first accuracy':44}{'':>10}{med('after', 'second click: first accuracy'):10.1f}")
    print(f"{'imports, before the click (not counted)':44}{med('before', 'imports (before the click)'):10.1f}"
          f"{med('after', 'imports (before the click)'):10.1f}")
    print(f"ratio after / before (first accuracy): {med('after', 'first accuracy') / med('before', 'first accuracy'):.3f}")


if __name__ == "__main__":
    main()
