"""The default localization started from the app vs from the CLI, side by side in one run.

    .venv/bin/python benchmarks/bench_app_vs_cli.py [--fast] [--repeats N] [--home DIR]
                                                    [--timeout S] [--json FILE] [--keep]

Both sides run the same localization (base minilm, fine-tuned minilm-movies, task movies,
method learned, sparsity 1e-3, and the app's default mask steps / examples per class / mask
learning rate, passed to the CLI explicitly) in the same ``GRAFTUI_HOME`` (a temporary folder
unless ``--home``), offline. The default fine-tuned checkpoint is built first, untimed, so
neither side pays for fine-tuning.

* CLI: ``graftui localize --json --out FILE …`` as a subprocess, timed from spawn to exit. This
  includes interpreter start, imports and model loading; the CLI's own reported localization
  time (``seconds`` in its JSON: model loading + mask learning) is shown too.
* App: a fresh ``python app.py --port P`` per repeat, so its first localization loads the models
  just as the CLI does. Timed: launch → HTTP 200, launch → page usable (status line filled), and,
  in headless Chromium on the Localize tab with the default settings, click on Run → the status
  shows "· done" (includes the page's own polling, one refresh every two seconds). The click is
  timed once the page takes it: opening the tab loads Plotly and draws it first, about 2 s a user
  who clicks at once also waits, shown as its own row and not in the ratio (the CLI has no such
  step). The job is followed on disk, so the benchmark adds no load of its own to the page while
  the job runs; CPU times start at the click. The job's own duration comes from
  ``$GRAFTUI_HOME/jobs/<id>/job.json`` (``finished - started``).

The ratio app click→done / CLI wall is the headline figure (target ≤ 1.10). With ``--repeats N``
both sides run N times, alternating which goes first (the app on the first repeat), and the
table shows medians. ``--fast`` sets ``GRAFTUI_FAST=1`` on both sides (small defaults, a quick
default fine-tune) for a quick check of the script itself; the figures that matter are the
ones without it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import browser_util as bu  # noqa: E402

TARGET_RATIO = 1.10

# Run in a child with the benchmark's environment: build the default checkpoint (untimed) and
# report the app's Localize defaults, so the CLI gets exactly the same settings.
PREPARE = r"""
import json, time
t0 = time.monotonic()
from graftui.config import DEFAULT_FINETUNED
from graftui.flows.common import ensure_default
path = ensure_default(DEFAULT_FINETUNED)
from graftui.config import DEFAULT_BASE, DEFAULT_FINETUNED
from graftui.ui.forms import per_class
from graftui.ui.store import defaults
d = defaults()
print(json.dumps({
    "checkpoint": str(path), "seconds": time.monotonic() - t0,
    "base": DEFAULT_BASE, "finetuned": DEFAULT_FINETUNED, "task": "movies", "method": "learned",
    "sparsity": 10 ** float(d["log_sparsity"]), "steps": int(d["steps"]),
    "examples_per_class": per_class(d["examples_per_class"]), "lr": float(d["mask_lr"]),  # the request's, as the app sends it
}))
"""


def environment(home: Path, fast: bool) -> dict:
    """The environment both sides get: the app server's (offline, GRAFTUI_HOME, GRAFTUI_FAST or not)."""
    return bu.AppServer(home=home, log_path=home / "unused.log", fast=fast, port=0).env()


def prepare(home: Path, fast: bool) -> dict:
    proc = subprocess.run([sys.executable, "-c", PREPARE], cwd=REPO, env=environment(home, fast),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"building the default fine-tuned checkpoint failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cli_command(settings: dict, out: Path) -> list[str]:
    exe = Path(sys.executable).with_name("graftui")
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "graftui.cli"]
    return head + [
        "localize", "--json", "--out", str(out),
        "--base", settings["base"], "--finetuned", settings["finetuned"], "--task", settings["task"],
        "--method", settings["method"], "--sparsity", repr(settings["sparsity"]),
        "--steps", str(settings["steps"]), "--lr", repr(settings["lr"]),
    ] + (["--examples-per-class", str(settings["examples_per_class"])] if settings["examples_per_class"] else [])


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a running process (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def browser_cpu() -> float:
    """User + system CPU seconds of every running Chromium process (the page's renderer, GPU process …)."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                name = (proc / "comm").read_text().strip()
            except OSError:
                continue
            if "chrom" in name or "headless" in name:
                total += process_cpu(int(proc.name)) or 0.0
    return total


def run_cli(home: Path, fast: bool, settings: dict, out: Path, timeout: float) -> dict:
    cmd = cli_command(settings, out)
    cpu0 = children_cpu()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=environment(home, fast), capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    cpu = children_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(f"the CLI failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    doc = json.loads(proc.stdout)
    return {"wall_s": wall, "cpu_s": cpu, "reported_s": doc.get("seconds"), "k": doc.get("k"), "meta": doc.get("meta", {})}


def job_ids(home: Path) -> set[str]:
    return {p.parent.name for p in (home / "jobs").glob("*/job.json")}


def read_job(home: Path, before: set[str], timeout: float, page=None) -> dict:
    """The localize job submitted by the click (the one not there before), once job.json says it finished.

    Read from disk, so the page is left alone while the job runs (asking the page every half second
    took about 0.1 of a core from the job, which no user's page does). The job must appear within a
    minute; with ``page``, a warning in its status line instead of a job stops the wait at once."""
    start = time.monotonic()
    while True:
        jobs = []
        for job_id in job_ids(home) - before:
            try:
                job = json.loads((home / "jobs" / job_id / "job.json").read_text())
            except (OSError, json.JSONDecodeError):
                continue  # being written
            if job.get("kind") == "localize":
                jobs.append(job)
        if len(jobs) == 1 and jobs[0].get("finished") and jobs[0].get("started"):
            return jobs[0]
        waited = time.monotonic() - start
        if not jobs and page is not None and "⚠️" in bu.text(page, "#status-message"):
            raise RuntimeError(f"pressing Run gave a warning instead of a job: {bu.text(page, '#status-message').strip()}")
        if (not jobs and waited > 60) or waited > timeout:
            raise RuntimeError(f"no finished localize job in {home / 'jobs'} after {waited:.0f} s (found {len(jobs)} new ones)")
        time.sleep(0.25)


def settle(page) -> float:
    """Seconds until the Localize tab's Run button takes a click. Opening the tab first loads Plotly
    and draws the tab, about 2 s that a user who clicks at once waits too; the CLI has no such step,
    so it is shown apart and the ratio starts at the click."""
    opened = time.time()
    page.click("#localize-run", trial=True)  # waits until the button would take the click
    return time.time() - opened


def click_and_wait(page, home: Path, timeout: float) -> tuple[dict, float, float]:
    """Click Run; wait for the job on disk, then for the page to show it done.

    Returns (job, time of the click, click → '· done' shown in seconds)."""
    before = job_ids(home)
    clicked = time.time()
    page.click("#localize-run")
    job = read_job(home, before, timeout, page)
    line, shown_by = "", time.time() + 60  # the page polls every 2 s: a minute means it stopped following
    while time.time() < shown_by:
        line = bu.text(page, "#localize-status")
        if bu.shows_ended(line, job["id"]):
            return job, clicked, time.time() - clicked
        time.sleep(0.1)
    raise RuntimeError(f"the page did not show job {job['id']} finished within a minute; last status {line.strip()!r}")


def run_app(home: Path, fast: bool, index: int, timeout: float) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = bu.launch_browser(pw)  # before the app starts, so launch → usable does not count Chromium's start
        server = bu.AppServer(home=home, log_path=home / f"bench-app-{index}.log", fast=fast)
        page = None
        try:
            server.start(timeout=180)
            page = browser.new_context(viewport=bu.VIEWPORT).new_page()
            bu.wait_usable(page, server.url, timeout_s=120)
            usable = server.since_start()
            bu.open_tab(page, "localize")
            settled = settle(page)
            cpu0, browser0 = process_cpu(server.proc.pid), browser_cpu()
            job, clicked, took = click_and_wait(page, home, timeout)
            cpu1, browser1 = process_cpu(server.proc.pid), browser_cpu()
            if job.get("status") != "done":
                raise RuntimeError(f"the app's localization did not finish: {job.get('status')} {job.get('error')}")
        except Exception:
            if page is not None:
                written = bu.save_artifacts(page, f"bench-app-{index}", home / "artifacts", server)
                print(f"failure artifacts: {', '.join(map(str, written))}", file=sys.stderr)
            raise
        finally:
            server.stop()
            browser.close()
    return {
        "http_200_s": server.http_ready_s, "usable_s": usable, "click_done_s": took,
        "cpu_s": cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None,
        "browser_cpu_s": browser1 - browser0, "settle_s": settled,
        "job_s": job["finished"] - job["started"], "submit_latency_s": job["started"] - clicked,
        "display_latency_s": clicked + took - job["finished"], "params": job.get("params", {}),
        "k": (job.get("result") or {}).get("k"),
    }


def check_same(settings: dict, params: dict) -> list[str]:
    """Differences between what the CLI was given and what the app's job ran with."""
    got = {key: params.get(key) for key in ("base", "finetuned", "task", "method", "sparsity", "steps",
                                            "examples_per_class", "lr")}  # the job's params are its request
    diffs = []
    for key, value in got.items():
        want = settings[key]
        same = abs(value - want) <= 1e-9 * abs(want) if isinstance(want, float) and value is not None else value == want
        if not same:
            diffs.append(f"{key}: CLI {want!r}, app {value!r}")
    return diffs


def fmt(x: float | None, unit: str = " s") -> str:
    return "—" if x is None else f"{x:.1f}{unit}" if unit else f"{x:.2f}"


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="GRAFTUI_FAST=1 on both sides (small defaults; a quick check)")
    parser.add_argument("--repeats", type=int, default=1, help="run both sides N times, alternating order (default 1)")
    parser.add_argument("--home", metavar="DIR", help="GRAFTUI_HOME to use (default: a new temporary folder)")
    parser.add_argument("--timeout", type=float, help="seconds allowed per localization (default 600 with --fast, else 3600)")
    parser.add_argument("--json", metavar="FILE", help="also write every measurement to FILE")
    parser.add_argument("--keep", action="store_true", help="keep the temporary GRAFTUI_HOME")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if bu.chromium_path() is None:
        parser.error(f"Chromium not found at {bu.CHROMIUM} (GRAFTUI_CHROMIUM overrides)")
    timeout = args.timeout or (600.0 if args.fast else 3600.0)

    temp = args.home is None
    home = Path(args.home or tempfile.mkdtemp(prefix="graftui-bench-")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    out_dir = Path(tempfile.mkdtemp(prefix="graftui-bench-out-"))
    mode = "GRAFTUI_FAST=1 (small defaults)" if args.fast else "full defaults"
    print(f"GRAFTUI_HOME {home} · {mode} · {args.repeats} repeat(s)", flush=True)
    cores = os.cpu_count() or 1
    loads = [os.getloadavg()[0]]

    try:
        settings = prepare(home, args.fast)
        print(f"default fine-tuned checkpoint ready (untimed, {settings['seconds']:.0f} s): {settings['checkpoint']}")
        print(f"localization: {settings['base']} → {settings['finetuned']}, task {settings['task']}, "
              f"{settings['method']}, sparsity {settings['sparsity']:g}, {settings['steps']} steps, "
              f"{settings['examples_per_class'] or 'default (up to 256)'} examples per class, mask lr {settings['lr']:g}",
              flush=True)

        cli_runs, app_runs, diffs = [], [], []
        for i in range(args.repeats):
            order = ("app", "cli") if i % 2 == 0 else ("cli", "app")
            for side in order:
                if side == "cli":
                    r = run_cli(home, args.fast, settings, out_dir / f"cli-{i}.safetensors", timeout)
                    cli_runs.append(r)
                    print(f"[{i + 1}/{args.repeats}] CLI: wall {r['wall_s']:.1f} s, reported {fmt(r['reported_s'])}, "
                          f"k = {r['k']}", flush=True)
                else:
                    r = run_app(home, args.fast, i, timeout)
                    app_runs.append(r)
                    diffs += check_same(settings, r["params"])
                    print(f"[{i + 1}/{args.repeats}] app: launch → 200 {r['http_200_s']:.1f} s, → usable "
                          f"{r['usable_s']:.1f} s, click → done {r['click_done_s']:.1f} s, job {r['job_s']:.1f} s, "
                          f"k = {r['k']}", flush=True)
                loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)

    cli_wall = median([r["wall_s"] for r in cli_runs])
    cli_rep = median([r["reported_s"] for r in cli_runs])
    app_done = median([r["click_done_s"] for r in app_runs])
    app_job = median([r["job_s"] for r in app_runs])
    ratio = app_done / cli_wall
    inner = app_job / cli_rep if cli_rep else None
    rows = [
        ("CLI wall, spawn → exit (interpreter, imports, models, localization)", fmt(cli_wall), [r["wall_s"] for r in cli_runs]),
        ("CLI reported localization time (models + mask learning)", fmt(cli_rep), [r["reported_s"] for r in cli_runs]),
        ("app click on Run → status '· done' (models + mask learning + UI)", fmt(app_done), [r["click_done_s"] for r in app_runs]),
        ("app job duration (job.json finished − started)", fmt(app_job), [r["job_s"] for r in app_runs]),
        ("app Localize tab opened → Run takes a click (not in the ratio)", fmt(median([r["settle_s"] for r in app_runs])),
         [r["settle_s"] for r in app_runs]),
        ("  click → job started", fmt(median([r["submit_latency_s"] for r in app_runs])),
         [r["submit_latency_s"] for r in app_runs]),
        ("  job finished → '· done' shown", fmt(median([r["display_latency_s"] for r in app_runs])),
         [r["display_latency_s"] for r in app_runs]),
        (f"ratio app click→done / CLI wall (target ≤ {TARGET_RATIO:.2f})",
         f"{ratio:.2f} {'ok' if ratio <= TARGET_RATIO else 'OVER'}", None),
        ("ratio app job / CLI reported (same work, no process start)", fmt(inner, ""), None),
        ("CPU time (user + sys): CLI process, spawn → exit", fmt(median([r["cpu_s"] for r in cli_runs])),
         [r["cpu_s"] for r in cli_runs]),
        ("CPU time (user + sys): app server, click → done", fmt(median([r["cpu_s"] for r in app_runs])),
         [r["cpu_s"] for r in app_runs]),
        ("CPU time (user + sys): Chromium, click → done", fmt(median([r["browser_cpu_s"] for r in app_runs])),
         [r["browser_cpu_s"] for r in app_runs]),
        ("app launch → HTTP 200", fmt(median([r["http_200_s"] for r in app_runs])), [r["http_200_s"] for r in app_runs]),
        ("app launch → page usable (status line filled)", fmt(median([r["usable_s"] for r in app_runs])),
         [r["usable_s"] for r in app_runs]),
    ]
    width = max(len(r[0]) for r in rows)
    label = "median" if args.repeats > 1 else "value"
    print(f"\n{'':{width}}  {label:>10}" + ("  runs" if args.repeats > 1 else ""))
    for name, value, runs in rows:
        extra = "  " + ", ".join("—" if v is None else f"{v:.1f}" for v in runs) if runs and args.repeats > 1 else ""
        print(f"{name:{width}}  {value:>10}{extra}")
    print(f"\n{mode}; the CLI wall time includes interpreter start, imports and model loading; the app's "
          "click → done includes model loading (first localization of a fresh server) and the page's 2 s polling, "
          "but not the server's own start (launch rows).")
    cli_cpu, app_cpu = median([r["cpu_s"] for r in cli_runs]), median([r["cpu_s"] for r in app_runs])
    if cli_cpu is not None and app_cpu is not None:
        print(f"cores busy on average: CLI {cli_cpu / cli_wall:.2f}, app server {app_cpu / app_done:.2f} (of {cores})")
    busy = loads[0] > 1.0 or max(loads) > cores + 1.0  # the benchmark itself keeps about `cores` busy
    print(f"load average (1 min) before and after each side: {', '.join(f'{x:.1f}' for x in loads)} on {cores} cores"
          + (" — other work was running, so the figures are noisy; rerun on a quiet machine" if busy else ""))
    if diffs:
        print("WARNING: the app's job did not run with the CLI's settings: " + "; ".join(sorted(set(diffs))))

    if args.json:
        Path(args.json).write_text(json.dumps({
            "mode": mode, "home": str(home), "settings": settings, "cli": cli_runs,
            "app": [{k: v for k, v in r.items() if k != "params"} for r in app_runs],
            "medians": {"cli_wall_s": cli_wall, "cli_reported_s": cli_rep, "app_click_done_s": app_done,
                        "app_job_s": app_job, "ratio_app_cli": ratio, "ratio_job_reported": inner},
            "settings_differ": diffs, "load_averages": loads, "cores": cores,
        }, indent=2, default=str))
    if temp and not args.keep:
        shutil.rmtree(home, ignore_errors=True)
    elif temp:
        print(f"kept {home}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
