"""The hosted quick lane serves everyone's seconds-long work while one visitor's long prediction runs.

Two strangers drive a hosted server over its HTTP API with a completion region of SmolLM2's dates fine-tune: A asks
for a generation from a 5,000-character prompt (minutes on 2 CPU cores: three models each read it and write 32
tokens), then B for one from a single sentence. A's request is foreseen as long by its cost and waits in the main
lane; B's runs in the quick lane and is answered while A's still runs. How fast B is answered is measured by
``benchmarks/bench_lanes.py``; here the order of events is checked.
"""

from __future__ import annotations

import time

import pytest

import graftui
from conftest import link_shared_builds
from test_hostile import hosted, own_jobs

pytestmark = pytest.mark.e2e

PROMPT = "The committee met on the fourth of March, 2021, and again on"  # one sentence: seconds
LONG = (("The archive lists a meeting on the fourth of March, 2021, a letter sent on the ninth of June, 2019, and a "
        "report filed two weeks later. ") * 40)[:5000]  # the longest text a prediction reads: minutes


@pytest.fixture(scope="module")
def dates_server(tmp_path_factory, shared_builds):
    """A hosted server whose home shares the run's builds, and a completion region of the quick dates fine-tune."""
    from graftui.flows.common import ensure_default

    root = tmp_path_factory.mktemp("hosted-lanes")
    with hosted(root, link_shared_builds(root / "home", shared_builds)) as server:
        finetuned = str(ensure_default("smollm2-dates"))
        graftui.localize(base="smollm2", finetuned=finetuned, task="dates", method="top-movement", sparsity=1e-3,
                         check_n=0, out=str(root / "dates.safetensors"))
        yield server, root / "dates.safetensors"


def saved(sid: str, path):
    """The region saved in session ``sid``'s own library; its id."""
    from graftui import regions
    from graftui.ui import store

    with store.session(sid):
        return store.save_region(regions.load(path)).stem


def until(condition, timeout: float):
    """Wait until ``condition()`` holds (a job's state, seen by the runner), at most ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.05)


def test_a_sentence_is_answered_in_the_quick_lane_while_another_sessions_long_prompt_generates(dates_server):
    from graftui.jobs import CANCELLED, DONE, MAIN, QUICK, RUNNING
    from graftui.ui import store, tables

    server, region = dates_server
    a, b = server.session(), server.session()
    assert len(LONG) == 5000
    server.call("/on_predict", a, [saved(a, region)], LONG)
    (long,) = own_jobs(a)
    runner = store.runner().runner
    try:
        assert long.lane == MAIN and long.work > 100_000  # foreseen as minutes by its cost, not by its verb
        until(lambda: runner.get(long.id).status == RUNNING, 120)
        asked = time.monotonic()
        server.call("/on_predict", b, [saved(b, region)], PROMPT)
        (short,) = own_jobs(b)
        assert short.lane == QUICK
        assert runner.wait(short.id, 120).status == DONE, runner.get(short.id).error
        answered = time.monotonic() - asked
        assert runner.get(long.id).status == RUNNING  # B was answered beside A's prediction, not after it
        print(f"[lanes] one sentence answered in {answered:.1f} s ({runner.get(short.id).duration:.1f} s of work) "
              f"while a {len(LONG):,}-character prompt generated in the main lane")
        table = tables.predict_table(runner.get(short.id).result)
        assert len(table) == 3 and table["generation"].str.len().gt(0).all()  # FT, pre-trained and the graft wrote
    finally:
        runner.cancel(long.id)
    assert runner.wait(long.id, 60).status == CANCELLED
