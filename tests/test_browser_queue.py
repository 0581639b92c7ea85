"""Work is moved, never thrown away, in headless Chromium (``-k queue``): with both cores kept busy by another
process, the first default Localize ends done without a second press (a job its own pace moves out of the quick lane
goes on there from the step it had reached); a server stopped while it held a queued job runs that job once it is
started again, and a job it was running goes on from its last checkpoint; the Jobs table says so at a phone's width
too."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import browser_util as bu
from conftest import link_shared_builds
from graftui.ui import jobwords
from test_browser import ARTIFACTS, browser  # noqa: F401 - the module's Chromium fixture

pytestmark = pytest.mark.browser
JOB_S = 600  # a job's limit here: minutes, on cores another process keeps busy
BURN = "import time\nend = time.monotonic() + 900\nwhile time.monotonic() < end: pass"  # one core busy, 15 min at most


@pytest.fixture(scope="module")
def home(tmp_path_factory, shared_builds):
    from graftui.config import DEFAULT_FINETUNED
    from graftui.flows.common import ensure_default

    ensure_default(DEFAULT_FINETUNED)  # built once for the run (as after a first visit), not within the job's wait:
    # the job's lane is then chosen by its cost alone, the quick one, as a new user's first Localize is
    return link_shared_builds(tmp_path_factory.mktemp("graftui-queue-home"), shared_builds)


def _record(home, job_id: str) -> dict:
    return json.loads((home / "jobs" / job_id / "job.json").read_text())


def _page(browser, srv, width: int = 1280):  # noqa: F811
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    bu.wait_usable(page, srv.url, timeout_s=120)
    return context, page


def _jobs(page) -> dict[str, dict]:
    """The Jobs table as the page shows it: job id -> its row by column name."""
    return {r[0]: dict(zip(jobwords.JOB_COLUMNS, r)) for r in bu.table_rows(page, "jobs-table") if r}


def _until_row(page, job_id: str, pattern: str, timeout_s: float) -> dict:
    """The Jobs table's row of ``job_id`` once its status matches ``pattern`` (a regular expression)."""
    import re

    deadline, row = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        row = _jobs(page).get(job_id)
        if row and re.fullmatch(pattern, row["status"]):
            return row
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} is not {pattern} after {timeout_s:.0f} s: {row}")


def test_the_first_default_localize_ends_done_on_busy_cores_without_a_second_press(browser, home, request):  # noqa: F811
    # the offline default as a new user runs it, on a server whose quick lane gives a job 20 s (not 120): on any
    # machine the first Localize, foreseen short, outgrows it and is moved, most often while it learns
    srv = bu.started(home, "queue-server", fast=False, extra_env={"GRAFTUI_QUICK_SECONDS": "20"})
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(2)]  # another process on both cores
    context, page = _page(browser, srv)
    try:
        bu.open_tab(page, "localize")
        line, took = bu.run_job(page, "#localize-run", "#localize-status", "localize-job", timeout_s=JOB_S)
        print(f"[queue] the first default Localize on busy cores: {took:.1f} s: {line}")
        assert "· done" in line, line
        job_id = bu.tab_job(page, "#localize-status")
        localizes = [j for j in _jobs(page).values() if j["kind"] == "localize"]
        assert [j["id"] for j in localizes] == [job_id], localizes  # one press, one job
        record = _record(home, job_id)
        assert record["status"] == "done" and "stopped" not in record["message"], record["message"]
        steps = [p["step"] for p in record["progress"] if "step" in p and p.get("seed") is None]
        assert steps and steps == sorted(steps) and len(set(steps)) == len(steps), steps  # never started over
        assert record["moved"] and record["lane"] == "main", record  # its pace moved it; there it went on from
        before = [p["step"] for p in record["progress"] if not p.get("run") and "step" in p]  # the step it had
        later = [p["step"] for p in record["progress"] if p.get("run") and "step" in p]  # reached (the first, had it
        assert later and later[0] == (before[-1] if before else 0) + 1, record["progress"]  # been moved while loading)
        print(f"[queue] steps in the quick lane: {len(before)}; in the main lane from step {later[0]}")
        print(f"[queue] lane {record['lane']}; moved: {record['moved'] or 'no'}")
    except Exception:
        bu.save_artifacts(page, request.node.name, ARTIFACTS, srv)
        raise
    finally:
        for b in burners:
            b.kill()
        context.close()
        srv.stop()


def test_a_restarted_server_runs_the_job_it_held_queued(browser, home, request):  # noqa: F811
    srv = bu.started(home, "queue-server-1", fast=True)
    context, page = _page(browser, srv)
    long = queued = None
    try:
        bu.open_tab(page, "localize")
        page.fill("#localize-steps input", "3000")  # the main lane's for minutes: cancelled below
        page.press("#localize-steps input", "Tab")
        long = bu.submit_job(page, "#localize-run")
        page.wait_for_function("id => { const t = document.querySelector('#localize-status').innerText; "
                               "return t.includes(id) && /step \\d+\\/3000/.test(t); }", arg=long, timeout=180_000)
        bu.open_tab(page, "finetune")
        queued = bu.submit_job(page, "#finetune-run")  # it trains: the main lane's, behind the long job
        row = _until_row(page, queued, "queued", 60)
        assert "starts in" in row["progress"], row
    except Exception:
        bu.save_artifacts(page, request.node.name, ARTIFACTS, srv)
        raise
    finally:
        context.close()
        srv.stop()  # with a job running and one waiting
    srv = bu.started(home, "queue-server-2", fast=True)
    context, page = _page(browser, srv, width=390)  # a phone this time
    try:
        row = _until_row(page, queued, "done", JOB_S)
        print(f"[queue] the job held queued ran after the restart: {row}")
        record = _record(home, queued)
        assert record["status"] == "done" and record["result"], record["message"]
        assert _jobs(page)[long]["status"] in ("queued", "running"), _jobs(page)[long]  # it goes on after a restart
        fit = bu.table_fit(page, "jobs-table")
        assert page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth + 1")
        assert fit["cut"] == [] or all(c[0] not in (long, queued) for c in fit["cut"]), fit
    except Exception:
        bu.save_artifacts(page, request.node.name, ARTIFACTS, srv)
        raise
    finally:
        if long is not None and _record(home, long)["status"] in ("queued", "running"):
            bu.choose(page, "jobs-select", long)
            bu.cancel(page, "#jobs-cancel")
        context.close()
        srv.stop()
