"""The job runner's two lanes: a short job beside a long one, foreseen start and end times, which lane a request
takes (``graftui.lanes``), and the models a lane loads for itself."""

from __future__ import annotations

import json
import threading
import time

import pytest

from graftui.jobs import DONE, MAIN, QUEUED, QUICK, RUNNING, Job, JobRunner
from graftui import sizing


def _blocker(started: threading.Event, release: threading.Event):
    return lambda ctx: started.set() or release.wait(30) and {}


def test_a_quick_job_finishes_while_a_long_one_runs_and_waits_in_its_lane_only(tmp_path):
    runner = JobRunner(tmp_path)
    release, started = threading.Event(), threading.Event()
    try:
        long = runner.submit("localize", "long", _blocker(started, release))
        waits = runner.submit("localize", "behind the long one", lambda ctx: {})
        quick = runner.submit("predict", "quick", lambda ctx: {"ok": 1}, lane=QUICK)
        assert started.wait(10)
        assert runner.wait(quick.id, 10).status == DONE  # not held behind the long job
        assert runner.get(long.id).status == RUNNING and runner.get(waits.id).status == QUEUED
        assert runner.place(waits.id) == 1
    finally:
        release.set()
    assert runner.wait(waits.id, 10).status == DONE


def test_a_lane_that_does_not_exist_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no lane 'fast'"):
        JobRunner(tmp_path).submit("predict", "x", lambda ctx: {}, lane="fast")


def test_start_and_end_are_foreseen_from_what_runs_and_waits_before_a_job(tmp_path):
    """A waiting job's start is the time left of the running job plus the lengths of the jobs the lane serves before
    it (shortest expected first); behind a job of unknown length, what is known is said as a least wait."""
    runner = JobRunner(tmp_path)
    release, started = threading.Event(), threading.Event()
    try:
        running = runner.submit("localize", "runs", _blocker(started, release), estimate=100.0)
        assert started.wait(10)
        a = runner.submit("localize", "a", lambda ctx: {}, estimate=30.0)
        b = runner.submit("localize", "b", lambda ctx: {})  # never run here: its own end is unknown
        c = runner.submit("localize", "c", lambda ctx: {}, estimate=5.0)
        d = runner.submit("localize", "d", lambda ctx: {})  # unknown too, and after b
        beside = runner.submit("predict", "beside", _blocker(threading.Event(), release), lane=QUICK, estimate=3.0)
        t0 = runner.get(running.id).started
        assert [runner.place(j.id) for j in (c, a, b, d)] == [1, 2, 3, 4]  # shortest first, unknown lengths last
        assert runner.expected(running.id, now=t0 + 10) == pytest.approx((0.0, 90.0))
        assert runner.expected(c.id, now=t0 + 10) == pytest.approx((90.0, 95.0))
        assert runner.expected(a.id, now=t0 + 10) == pytest.approx((95.0, 125.0))
        assert runner.expected(b.id, now=t0 + 10) == pytest.approx((125.0, None))
        assert runner.expected(d.id, now=t0 + 10) is None  # b, before it, has no estimate
        assert runner.at_least(d.id, now=t0 + 10) == (pytest.approx(125.0), 1)  # but it waits at least this long
        assert runner.at_least(running.id) is None
        with runner._lock:  # half way after 40 s: its own pace, not its estimate, foretells its end
            runner.get(running.id).fraction = 0.5
        assert runner.expected(a.id, now=t0 + 40) == pytest.approx((45.0, 75.0))
        with runner._lock:
            runner.get(running.id).fraction = 0.0
        assert runner.expected(c.id, now=t0 + 500) == pytest.approx((0.0, 5.0))  # past its estimate: not below 0
        assert runner.get(beside.id).lane == QUICK and runner.expected(beside.id) is not None
        assert runner.place(beside.id) is None or runner.place(beside.id) == 1  # its own lane, not behind a, b, c
    finally:
        release.set()
    assert runner.wait(d.id, 10).status == DONE and runner.expected(d.id) is None  # ended: nothing to foresee


def test_lanes_survive_a_restart_and_old_records_without_one_read_as_main(tmp_path):
    import json
    runner = JobRunner(tmp_path)
    job = runner.submit("predict", "p", lambda ctx: {}, lane=QUICK, estimate=2.0)
    assert runner.wait(job.id, 10).status == DONE
    record = tmp_path / job.id / "job.json"
    again = JobRunner(tmp_path).get(job.id)
    assert (again.lane, again.estimate) == (QUICK, 2.0)
    data = json.loads(record.read_text())
    del data["lane"], data["estimate"]
    record.write_text(json.dumps(data))
    assert JobRunner(tmp_path).get(job.id).lane == MAIN
    data["lane"] = 3
    record.write_text(json.dumps(data))
    assert JobRunner(tmp_path).get(job.id).kind == "damaged"


# -- which lane a request takes ------------------------------------------------------------------
def _done(kind, params, seconds, finished=1000.0) -> Job:
    return Job(id=f"j{seconds}", kind=kind, title="t", params=params, status=DONE, started=finished - seconds,
               finished=finished)


def test_a_request_takes_the_quick_lane_when_its_cost_or_its_past_says_it_is_short(monkeypatch):
    from graftui.requests import FinetuneRequest, LocalizeRequest, PairRequest, PredictRequest
    from graftui import lanes

    monkeypatch.setattr(lanes, "is_built", lambda folder: True)
    monkeypatch.setattr(lanes, "pair_bytes", lambda request, reads=(): None)  # no checkpoint here: no cost in bytes
    predict = PredictRequest(regions=["/r/a.safetensors"], texts=["fine"])  # 2 tokens, read by 3 models
    assert lanes.plan(predict, "predict", []) == lanes.Plan(QUICK, 6 * lanes.TOKEN_SECONDS, None, 6.0)
    assert lanes.plan(PairRequest(), "pair", []) == lanes.Plan(QUICK, lanes.INSTANT_SECONDS, None)
    req = LocalizeRequest(base="minilm", finetuned="minilm-movies", task="movies", steps=5, out="/x/one.safetensors")
    assert lanes.plan(req, "localize", []) == lanes.Plan(MAIN, None, None)  # never run here: not known to be short
    past = [_done("localize", {**req.as_dict(), "out": "/x/two.safetensors"}, s) for s in (20.0, 40.0, 500.0)]
    assert lanes.plan(req, "localize", past[:2]) == lanes.Plan(QUICK, 30.0, None)  # where it wrote does not matter
    assert lanes.plan(req, "localize", past) == lanes.Plan(QUICK, 40.0, None)  # the median of its last runs
    assert lanes.plan(req, "localize", past[2:]).lane == MAIN  # 500 s is long
    other = LocalizeRequest(base="minilm", finetuned="minilm-movies", task="movies", steps=50)
    assert lanes.plan(other, "localize", past[:2]) == lanes.Plan(MAIN, None, None)  # other settings: not known
    assert lanes.plan(req, "compare", past[:2]).estimate is None  # another kind of job
    ft = FinetuneRequest(base="minilm", task="movies")
    assert lanes.plan(ft, "finetune", [_done("finetune", ft.as_dict(), 5.0)]) == lanes.Plan(MAIN, 5.0, None)  # trains


def test_a_first_localization_or_evaluation_is_foreseen_by_its_cost_and_the_pace_kept_here_corrects_it(monkeypatch):
    """A job never run here is foreseen from its request: example passes (a mask step's batch three times, each checked
    or scored example once per model) × the bytes of the pair's weights, at the pace measured on 2 CPU cores plus
    reading the pair; short by that first guess only within half the quick lane's time. Once a job of its kind ran
    here, its pace replaces the guess, and the whole of the quick lane's time counts."""
    from graftui.requests import EvaluateRequest, LocalizeRequest
    from graftui import lanes

    monkeypatch.setattr(lanes, "is_built", lambda folder: True)
    size = 91_000_000  # MiniLM-L6's weights
    monkeypatch.setattr(lanes, "pair_bytes", lambda request, reads=(): size)
    small = LocalizeRequest(base="minilm", finetuned="minilm-movies", task="movies", steps=10)
    assert lanes.passes(small) == 10 * 16 * 3 + 200 * 4 == 1280
    assert lanes.passes(small.replace(method="top-movement")) == 200 * 3  # data-free: the check alone
    assert lanes.passes(small.replace(seeds=[0, 1, 2])) == 3 * lanes.passes(small)
    points = sizing.EXPECTED_POINTS  # a size search: its regions, each scored by one pass, then the one it found
    assert lanes.passes(small.replace(keep=0.9)) == points * 10 * 16 * 3 + 200 * (points + 2) + 200 * 3
    assert lanes.passes(small.replace(schedule="nested")) == lanes.passes(small) + 10 * 16 * 3  # 10·k, then k inside
    # it, the check once
    plan = lanes.plan(small, "localize", [])
    load = 2 * size * lanes.LOAD_SECONDS_PER_BYTE
    assert plan == lanes.Plan(QUICK, pytest.approx(load + 1280 * size * lanes.PACE["localize"]), None, 1280.0 * size)
    longer = small.replace(steps=60)  # about 40 s by the first guess: more than half the quick lane's time
    assert 30 < lanes.plan(longer, "localize", []).estimate <= lanes.QUICK_SECONDS
    assert lanes.plan(longer, "localize", []).lane == MAIN
    ran = Job(id="a", kind="localize", title="t", params=small.as_dict(), status=DONE, started=0.0, finished=10.0,
              work=plan.work)  # the first one took 10 s here: this machine is that fast
    assert lanes.plan(longer, "localize", [ran]) == lanes.Plan(QUICK, pytest.approx(10.0 * 3680 / 1280), None,
                                                               3680.0 * size)
    assert lanes.plan(longer, "compare", [ran]).estimate != lanes.plan(longer, "localize", [ran]).estimate  # per kind
    scored = EvaluateRequest(regions=["/r/a.safetensors"], n=100, baselines=True, ood=["amazon"])
    assert lanes.passes(scored) == 100 * (2 + 3) * 2
    assert lanes.passes(scored.replace(seeds=[0, 1, 2])) == 3 * lanes.passes(scored)  # each seed scores again
    unsaid = EvaluateRequest(regions=["/r/a.safetensors"], n=100)  # its region's task, unread: a sentiment task's
    assert lanes.passes(unsaid) == 100 * 3 * (1 + 2)  # two others are scored by default
    assert lanes.passes(unsaid.replace(no_ood=True)) == 100 * 3
    assert lanes.passes(scored.replace(n=None)) is None  # every test example: how many is not known before reading
    assert lanes.plan(scored.replace(n=None), "compare", []) == lanes.Plan(MAIN, None, None)
    generating = LocalizeRequest(base="smollm2", finetuned="smollm2-dates", task="dates", steps=10)
    assert lanes.passes(generating) == 10 * 16 * 3 + 200 * 3 * lanes.ANSWER_PASSES  # each answer: a few passes;
    # generating, the check scores the learned region only (beside FT and the empty region)
    uploaded = small.replace(task="/data/my.csv", task_kind="completion")  # a completion task by --task-kind
    assert lanes.passes(uploaded) == lanes.passes(generating)


def test_a_study_of_n_examples_has_a_length_shown_and_takes_the_quick_lane_only_once_it_ran_short(monkeypatch):
    """WiSE curves, a composition scored on its regions' tasks and an ablation of n examples each have an expected
    length from their fields (models × tasks × n, at the measured pace of a comparison), so a job queued behind one
    has a start; their first guess never sends them to the quick lane, the same job having run here short does."""
    from graftui.requests import AnatomyRequest, ComposeRequest, WiseRequest
    from graftui import lanes

    monkeypatch.setattr(lanes, "is_built", lambda folder: True)
    size = 91_000_000
    monkeypatch.setattr(lanes, "pair_bytes", lambda request, reads=(): size)
    reads = [("classification", "minilm-movies")]
    wise = WiseRequest(region="/r/a.safetensors", n=16, alphas=[0.0, 0.5, 1.0])
    compose = ComposeRequest(regions=["/r/a.safetensors", "/r/b.safetensors"], evaluate=True, n=16)
    ablate = AnatomyRequest(region="/r/a.safetensors", ablate=True, n=16)
    assert lanes.passes(wise, reads) == 16 * 2 * 3 * (1 + 2)  # two curves at three α, on movies and its two others
    assert lanes.passes(wise.replace(no_ood=True, replicates=["/r/b.safetensors"])) == 16 * 2 * 3 * 2
    assert lanes.passes(compose) == 16 * 2 * (2 + 3)  # on each region's task: the union, each alone, FT and bare
    assert lanes.passes(ablate) == 16 * (1 + lanes.ABLATED_PARTS)
    stitched = compose.replace(stitch=True, merges=["task-arithmetic"], lambdas=[0.5, 1.0])  # two λ on 100
    assert lanes.passes(stitched) == 16 * 2 * (4 + 1 + 1) + 2 * 2 * 100  # validation examples of each task
    assert lanes.passes(stitched.replace(lambdas=[0.2, 0.5, 1.0])) > lanes.passes(stitched)
    for unsaid in (wise.replace(n=None), compose.replace(evaluate=False), stitched.replace(n=None),
                   ablate.replace(ablate=False)):
        assert lanes.passes(unsaid) is None, unsaid
    for request in (wise, compose, ablate):
        plan = lanes.plan(request, request.verb, [], reads)
        first = 2 * size * lanes.LOAD_SECONDS_PER_BYTE + lanes.passes(request) * size * lanes.PACE["evaluate"]
        assert plan == lanes.Plan(MAIN, pytest.approx(first), None, lanes.passes(request) * size), request.verb
        assert plan.estimate < 10  # short by its first guess, yet in the main lane
        ran = Job(id="a", kind=request.verb, title="t", params=request.as_dict(), status=DONE, started=0.0,
                  finished=4.0, work=plan.work)
        assert lanes.plan(request, request.verb, [ran], reads).lane == QUICK  # the same job ran here in 4 s


def test_the_weights_a_cost_counts_are_the_checkpoints_files_here_and_never_a_servers_for_a_visitor(tmp_path,
                                                                                                  monkeypatch):
    from graftui import lanes

    folder = tmp_path / "ft"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 1000)
    (folder / "notes.txt").write_text("not weights")
    assert lanes.weights_bytes(str(folder)) == 1000
    assert lanes.weights_bytes("someone/not-downloaded") is None and lanes.weights_bytes(str(tmp_path / "no")) is None
    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    assert lanes.weights_bytes(str(folder)) is None  # a shared server measures no local path for a visitor
    assert lanes.weights_bytes("minilm") > 10_000_000  # but its offline defaults
    monkeypatch.delenv("GRAFTUI_HOSTED")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"x" * 10)
    assert lanes.weights_bytes(str(adapter)) is None  # a LoRA adapter: its base does the work


def test_a_default_not_built_yet_and_an_adapter_cost_their_bases_weights_and_a_reproduction_its_plan(tmp_path,
                                                                                                     monkeypatch):
    """A job on a default fine-tuned model that it builds first, or on a LoRA adapter, is costed at its base's
    weights (a fine-tune has its base's tensors); a reproduction's length is its plan's, every step counted."""
    from graftui import lanes
    from graftui.config import DEFAULT_FINETUNED
    from graftui.flows import reproduction
    from graftui.requests import LocalizeRequest, ReproduceRequest, SweepRequest

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))  # nothing built here
    base = lanes.weights_bytes("minilm")
    assert base and lanes.weights_bytes(DEFAULT_FINETUNED) is None
    for request in (LocalizeRequest(), SweepRequest(n=100)):
        assert lanes.pair_bytes(request) == base, request.verb
        assert lanes.plan(request, request.verb, []).estimate is not None, request.verb
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    assert lanes.pair_bytes(LocalizeRequest(base="minilm", finetuned=str(adapter))) == base
    for request in (ReproduceRequest(), ReproduceRequest(quick=True), ReproduceRequest(quick=True, section="generative")):
        seconds = reproduction.expected_seconds(request)
        steps, cost, _ = reproduction.section_plan(request, reproduction.scale_of(request), tmp_path / "r")
        assert seconds == sum(cost(s) for s in steps) > 0
        plan = lanes.plan(request, "reproduce", [])
        assert plan.estimate == seconds and plan.lane == lanes.MAIN, plan
    assert reproduction.expected_seconds(ReproduceRequest()) > reproduction.expected_seconds(ReproduceRequest(quick=True))


def test_a_job_that_builds_a_default_model_or_runs_the_harness_takes_the_main_lane(monkeypatch):
    from graftui.config import DEFAULT_BUILD_SECONDS
    from graftui.requests import LocalizeRequest, PredictRequest
    from graftui import lanes

    monkeypatch.setattr(lanes, "is_built", lambda folder: False)
    monkeypatch.setattr(lanes, "pair_bytes", lambda request, reads=(): None)
    req = LocalizeRequest(base="smollm2", finetuned="smollm2-dates", task="dates")
    past = [_done("localize", req.as_dict(), 20.0)]
    assert lanes.plan(req, "localize", past) == lanes.Plan(MAIN, 20.0 + DEFAULT_BUILD_SECONDS["smollm2-dates"],
                                                           "smollm2-dates")
    job = Job(id="x", kind="localize", title="t", params=req.as_dict())
    assert "builds the default fine-tuned model **smollm2-dates** (about 4 min" in lanes.plan_words(job, "smollm2-dates")
    monkeypatch.setattr(lanes, "is_built", lambda folder: True)
    assert lanes.plan(req, "localize", past).lane == QUICK
    harness = LocalizeRequest(base="smollm2", finetuned="smollm2-dates", task="lm-eval:graftui_dates")
    assert lanes.plan(harness, "localize", [_done("localize", harness.as_dict(), 20.0)]).lane == MAIN
    assert lanes.plan(req, "localize", past, reads=[("lm-eval", "smollm2")]).lane == MAIN
    predict = PredictRequest(regions=["/r/a.safetensors"], texts=["fine"])  # its region's model is not built
    monkeypatch.setattr(lanes, "is_built", lambda folder: False)
    assert lanes.plan(predict, "predict", [], reads=[("completion", "smollm2-dates")]) == lanes.Plan(
        MAIN, 198 * lanes.TOKEN_SECONDS + DEFAULT_BUILD_SECONDS["smollm2-dates"], "smollm2-dates", 198.0)  # 32 new


def test_a_long_prompt_waits_in_the_main_lane_and_the_pace_of_past_predictions_calibrates_the_cost(monkeypatch):
    """Predict is not quick by its verb: 4,900 characters read by three models generating 32 tokens each is minutes
    on a CPU, one sentence is seconds; a probe's models are counted too; the pace of the predictions that ran here
    replaces the first guess."""
    from graftui.requests import PROBE_LAYERS, PredictRequest
    from graftui import lanes

    monkeypatch.setattr(lanes, "is_built", lambda folder: True)
    reads = [("completion", "smollm2-dates")]
    long = PredictRequest(regions=["/r/a.safetensors"], texts=["word " * 980])
    short = PredictRequest(regions=["/r/a.safetensors"], texts=["What is the date?"])
    assert lanes.plan(long, "predict", [], reads).lane == MAIN
    assert lanes.work(long, reads) == (4900 // 4 + 1) * 3 * 33 and lanes.plan(long, "predict", [], reads).estimate > 60
    assert lanes.plan(short, "predict", [], reads).lane == QUICK
    assert lanes.plan(short, "predict", [], []).work == (17 // 4 + 1) * 3  # a classifier generates nothing
    probe = short.replace(knockout=True, by="layer")  # FT without the region, and each layer of it alone
    assert probe.looks() == 2 + 1 + 1 + PROBE_LAYERS
    assert lanes.work(probe, reads) == (17 // 4 + 1) * probe.looks() * 33
    slow = Job(id="p", kind="predict", title="t", params={}, status=DONE, started=0.0, finished=300.0, work=198.0)
    assert lanes.token_seconds([slow]) == 300.0 / 198.0  # this machine is slower than the first guess
    assert lanes.plan(short, "predict", [slow], reads).lane == MAIN


def test_one_client_holds_no_more_than_its_share_of_the_quick_lane(monkeypatch):
    from graftui.requests import PredictRequest
    from graftui import lanes

    monkeypatch.setattr(lanes, "is_built", lambda folder: True)
    short = PredictRequest(regions=["/r/a.safetensors"], texts=["fine"])
    assert lanes.plan(short, "predict", [], held=lanes.QUICK_SHARE - 1).lane == QUICK
    assert lanes.plan(short, "predict", [], held=lanes.QUICK_SHARE).lane == MAIN


@pytest.mark.parametrize("reports", [True, False])
def test_a_quick_job_that_outgrows_the_quick_lane_moves_to_the_main_lane_and_ends_there(tmp_path, monkeypatch, reports):
    """A job that reports its steps leaves the quick lane as soon as their pace foretells more than the lane's limit
    (long before it runs that long); one that reports nothing is stopped in its thread past the limit. Either is
    queued in the main lane with the length its pace foretold, runs there from its start, and ends done."""
    from graftui import jobs

    monkeypatch.setattr(jobs, "QUICK_LIMIT", 1.0)
    monkeypatch.setattr(jobs, "STOP_GRACE", 0.3)
    runner = JobRunner(tmp_path)
    runs, lanes_seen = [], []

    def long(ctx):
        runs.append(time.monotonic())
        lanes_seen.append(ctx.job.lane)
        for step in range(1, 301):
            time.sleep(0.01)
            if reports:
                ctx.report({"step": step, "steps": 300})
        return {"steps": 300}

    job = runner.submit("localize", "t", long, lane=QUICK, estimate=0.5)
    done = runner.wait(job.id, timeout=60)
    assert done.status == "done" and done.result == {"steps": 300} and done.lane == MAIN, (done.status, done.message)
    assert lanes_seen == [QUICK, MAIN] and done.moved.startswith("moved to the main lane after "), done.moved
    assert done.message == done.moved
    if reports:  # moved by its pace, after about a twentieth of its steps, not after the lane's whole limit
        assert "its pace foretold" in done.moved and runs[1] - runs[0] < 1.0, (done.moved, runs[1] - runs[0])
        assert done.estimate > 2.0, done.estimate  # the main lane foresees it at its own pace, not at its 0.5 s
    else:
        assert "it ran 1 s, past the 1 s the quick lane gives work of seconds" in done.moved, done.moved
    assert json.loads((tmp_path / job.id / "job.json").read_text())["moved"] == done.moved


def test_a_job_cancelled_while_it_outgrows_the_quick_lane_ends_cancelled(tmp_path, monkeypatch):
    from graftui import jobs

    monkeypatch.setattr(jobs, "QUICK_LIMIT", 0.3)
    runner = JobRunner(tmp_path)
    started = threading.Event()

    def long(ctx):
        started.set()
        while True:
            time.sleep(0.01)
            ctx.report({"fraction": 0.01})

    job = runner.submit("predict", "t", long, lane=QUICK)
    assert started.wait(10)
    runner.cancel(job.id)
    assert runner.wait(job.id, timeout=30).status == "cancelled"


def test_a_servers_quick_lane_limit_is_its_setting_and_moves_a_job_past_it(tmp_path, monkeypatch):
    from graftui import settings
    from graftui.ui import store

    monkeypatch.setenv("GRAFTUI_QUICK_SECONDS", "0.5")
    monkeypatch.setattr(store, "_runner", None)  # the server that starts next reads it
    assert settings.quick_seconds() == 0.5 and store.runner().runner.quick_limit == 0.5
    monkeypatch.setattr(store, "_runner", None)
    runner = JobRunner(tmp_path, quick_limit=settings.quick_seconds())

    def slow(ctx):
        for i in range(1, 4):
            time.sleep(0.3)
            ctx.report({"step": i, "steps": 3})
        return {}

    done = runner.wait(runner.submit("predict", "t", slow, lane=QUICK).id, timeout=30)
    assert done.status == "done" and done.lane == MAIN and "past the 0.5 s the quick lane" in done.moved, done.moved
    monkeypatch.delenv("GRAFTUI_QUICK_SECONDS")
    assert settings.quick_seconds() is None and JobRunner(tmp_path / "b").quick_limit == 120.0


def test_the_page_says_when_a_waiting_job_should_start_and_end(tmp_path):
    from graftui.ui import jobwords

    runner = JobRunner(tmp_path)
    release, started = threading.Event(), threading.Event()
    try:
        runner.submit("localize", "runs", _blocker(started, release), estimate=600.0)
        assert started.wait(10)  # it runs: the shorter job waits behind it
        waits = runner.submit("compare", "waits", lambda ctx: {}, estimate=45.0)
        quick = runner.submit("predict", "beside", _blocker(threading.Event(), release), lane=QUICK)
        line = jobwords.job_line(runner, runner.get(waits.id))
        assert "next in the queue · starts in about 10 min, ends in about 11 min" in line
        assert jobwords.wait_words(runner, runner.get(waits.id)).startswith("next in the queue · starts in about 10 min")
        assert "quick lane" in jobwords.submitted_line(runner.get(quick.id))
        unknown = runner.submit("compare", "unknown", lambda ctx: {})
        behind = runner.submit("compare", "behind it", lambda ctx: {})
        assert jobwords.wait_words(runner, runner.get(behind.id)) == (
            "place 3 in the queue · starts in at least 11 min (and the length of a job before it, which is not known "
            "yet)")  # the 10 min left of the running job and the 45 s of the one before: what is known
        assert jobwords.wait_words(runner, runner.get(unknown.id)) == (
            "place 2 in the queue · starts in about 11 min, length unknown (no past run, and no cost its settings say)")
        assert [jobwords.about(s) for s in (3, 44, 46, 89, 95, 3600)] == [
            "a few seconds", "about 40 s", "about 50 s", "about 90 s", "about 2 min", "about 60 min"]
    finally:
        release.set()


# -- the models a lane loads for itself ---------------------------------------------------------
def test_flows_in_their_own_scope_load_a_pair_of_their_own(monkeypatch):
    from graftui.flows import common

    class Pair:
        def to(self, device):
            return self

        def loading_record(self):
            return {}

    loads = []
    monkeypatch.setattr(common.ModelPair, "load", classmethod(lambda cls, *a, **k: loads.append(a) or Pair()))
    monkeypatch.setattr(common, "pair_kind", lambda *a, **k: "classifier")
    common.clear_cache()
    try:
        main = common.load_pair("b", "f")
        assert common.load_pair("b", "f") is main
        with common.own_pairs(QUICK):
            mine = common.load_pair("b", "f")
            assert mine is not main and common.load_pair("b", "f") is mine
            other = common.load_pair("b", "g")  # a scope of its own keeps one pair
            assert common.load_pair("b", "f") is not mine
        assert common.load_pair("b", "f") is main  # the main scope's pair was never dropped for the other's
        assert len(loads) == 4 and other is not main
    finally:
        common.clear_cache()


def test_the_pair_check_says_how_long_a_default_model_takes_to_build_before_any_job(monkeypatch):
    from graftui.errors import ModelError
    from graftui.ui import forms, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: False)
    with pytest.raises(ModelError, match=r"'smollm2-dates-lora' is built on first use: .* about 8 min on 2 CPU cores"):
        forms.check_pair("smollm2", "smollm2-dates-lora")


def test_a_damaged_lane_or_time_in_a_job_record_is_listed_as_damaged(tmp_path):
    import json
    runner = JobRunner(tmp_path)
    job = runner.submit("predict", "p", lambda ctx: {}, estimate=2.0)
    assert runner.wait(job.id, 10).status == DONE
    record = tmp_path / job.id / "job.json"
    good = json.loads(record.read_text())
    for field, value in [("started", "x"), ("estimate", float("nan")), ("estimate", True), ("finished", -1.0),
                         ("lane", "fast")]:
        record.write_text(json.dumps({**good, field: value}))
        again = JobRunner(tmp_path).get(job.id)
        assert again.kind == "damaged" and field in again.error, (field, value, again.error)
        assert "Traceback" not in again.error and "\n" not in again.error


def test_a_hosted_session_foresees_from_its_own_and_the_servers_jobs_only(tmp_path, monkeypatch):
    from graftui import settings
    from graftui.ui import store

    runner = JobRunner(tmp_path)
    for owner in ("a" * 32, "b" * 32, None):
        assert runner.wait(runner.submit("compare", "c", lambda ctx: {}, owner=owner).id, 10).status == DONE
    monkeypatch.setattr(settings, "hosted", lambda: True)
    assert {j.owner for j in store.Jobs(runner, "a" * 32).history()} == {"a" * 32, None}


def test_a_run_button_waits_only_for_a_job_foreseen_to_end_soon(tmp_path, monkeypatch):
    import gradio as gr
    from graftui.ui import store, wiring

    runner = JobRunner(tmp_path)
    monkeypatch.setattr(store, "runner", lambda: store.Jobs(runner, None))
    render = lambda job: ["table of " + job.id] if job is not None else ["empty"]  # noqa: E731
    quick = runner.submit("predict", "p", lambda ctx: {}, lane=QUICK, estimate=1.0)
    got = wiring.answered(quick, ("predict",), "latest", render)
    assert got[2].startswith("**p**") and "done" in got[2] and got[3] == f"table of {quick.id}"
    release = threading.Event()
    try:
        slow = runner.submit("predict", "slow", lambda ctx: release.wait(30) and {}, lane=QUICK)  # length unknown
        t0 = time.monotonic()
        got = wiring.answered(slow, ("predict",), "latest", render)
        assert time.monotonic() - t0 < 2 and got[2] == gr.skip() and got[3] == gr.skip()  # left to the panel
    finally:
        release.set()


def test_a_long_curve_keeps_its_first_and_last_steps_and_no_more_points_than_its_cap():
    from graftui import regions

    for n in (401, 800, 1200):
        curve = regions.curve_of([{"step": i, "loss": 1.0, "accuracy": 0.5} for i in range(1, n + 1)])
        assert len(curve) == regions.MAX_CURVE_POINTS and curve[0][0] == 1 and curve[-1][0] == n
    assert regions.curve_of([{"step": 1, "loss": float("nan"), "accuracy": 0.5}]) == []


def test_every_verb_whose_request_says_its_size_has_a_length_that_grows_with_that_size(monkeypatch):
    """A sweep, seeds and fine-tune replicates, a size search, a fine-tune, a re-training, the multi-task and the
    continual experiments and a comparison of several regions each cost what their fields say; the field that sizes
    the work makes it longer. Their first guess is shown, never trusted to take the quick lane."""
    from graftui.requests import (ContinualRequest, EvaluateRequest, FinetuneRequest, LocalizeRequest,
                                  MultitaskRequest, RetrainRequest, SweepRequest)
    from graftui import lanes

    monkeypatch.setattr(lanes, "is_built", lambda folder: False)  # no fine-tune here yet: each is trained
    monkeypatch.setattr(lanes, "pair_bytes", lambda request, reads=(): 91_000_000)
    region = ["/r/a.safetensors"]
    grows = [  # (request, the same request with more of what sizes it)
        (SweepRequest(n=100, steps=10), SweepRequest(n=200, steps=10)),
        (SweepRequest(n=100, steps=10), SweepRequest(n=100, steps=10, sparsities=[1e-4, 1e-3, 1e-2, 1e-1])),
        (SweepRequest(n=100, steps=10), SweepRequest(n=100, steps=20)),
        (SweepRequest(n=100, steps=10), SweepRequest(n=100, steps=10, seeds=[0, 1])),
        (LocalizeRequest(steps=10), LocalizeRequest(steps=10, seeds=[0, 1, 2])),
        (LocalizeRequest(steps=10), LocalizeRequest(steps=10, finetuned_replicates=["ft-seed1"])),
        (LocalizeRequest(steps=10), LocalizeRequest(steps=10, keep=0.9)),
        (FinetuneRequest(task="movies"), FinetuneRequest(task="movies", epochs=4)),
        (FinetuneRequest(task="movies"), FinetuneRequest(task="movies", train_examples=4000)),
        (FinetuneRequest(task="movies"), FinetuneRequest(task="movies", seeds=[0, 1])),
        (FinetuneRequest(task="movies"), FinetuneRequest(task="movies", test_examples=500)),
        (RetrainRequest(region=region[0], n=100), RetrainRequest(region=region[0], n=400)),
        (RetrainRequest(region=region[0], n=100, no_bitfit=True), RetrainRequest(region=region[0], n=100)),
        (RetrainRequest(region=region[0], n=100), RetrainRequest(region=region[0], n=100, epochs=5)),
        (MultitaskRequest(n=100), MultitaskRequest(n=400)),
        (MultitaskRequest(n=100), MultitaskRequest(n=100, tasks=["movies", "amazon", "tweets", "rte"])),
        (MultitaskRequest(n=100, purify_steps=0), MultitaskRequest(n=100, purify_steps=20)),
        (ContinualRequest(n=100), ContinualRequest(n=400)),
        (ContinualRequest(n=100), ContinualRequest(n=100, tasks=["movies", "amazon", "tweets", "rte"])),
        (EvaluateRequest(regions=region, n=100), EvaluateRequest(regions=region + ["/r/b.safetensors"], n=100)),
        (EvaluateRequest(regions=region, n=100, task="lm-eval:graftui_dates"),
         EvaluateRequest(regions=region, n=300, task="lm-eval:graftui_dates")),  # a harness task: documents × models
    ]
    for small, large in grows:
        a, b = lanes.passes(small), lanes.passes(large)
        assert a and b and b > a, (small.verb, a, b)
        plan = lanes.plan(small, small.verb, [])
        assert plan.estimate is not None and plan.estimate > 0, (small.verb, plan)
        assert plan.lane == MAIN or small.verb not in lanes.SHOWN, (small.verb, plan)  # a first guess: shown only
    assert lanes.passes(SweepRequest(n=100, steps=10)) == 3 * 10 * 16 * 3 + 100 * 3 * (2 + 3 * 3)  # one method
    # learns, at three budgets; at each, three regions scored, and FT and the bare body once, on movies and its two
    # others
    assert lanes.passes(FinetuneRequest(task="movies")) == 2 * 2000 * 3  # two epochs of 2,000 examples
    assert lanes.passes(RetrainRequest(region=region[0], n=100, no_ood=True)) == 2 * 2 * 2000 * 3 + 100 * 5
    for unsaid in (SweepRequest(n=None), RetrainRequest(region=region[0]), MultitaskRequest(),
                   FinetuneRequest(task="movies", train_examples=0)):  # every example: not known before reading
        assert lanes.passes(unsaid) is None, unsaid.verb
    monkeypatch.setattr(lanes, "is_built", lambda folder: True)  # the fine-tune is there: it is reused
    assert lanes.passes(FinetuneRequest(task="movies", test_examples=500)) == 500
    small = SweepRequest(n=10, steps=1, sparsities=[1e-3], methods=["random"], no_ood=True)  # seconds by its guess
    ran = Job(id="s", kind="sweep", title="t", params=small.as_dict(), status=DONE, started=0.0, finished=3.0)
    assert lanes.plan(small, "sweep", []).lane == MAIN and lanes.plan(small, "sweep", [ran]).lane == QUICK


def test_a_generating_localizations_fraction_moves_while_its_check_generates(tmp_path, monkeypatch):
    """The held-out check of a completion region reports every batch of answers it generates: the fraction moves
    through the check (and the time left with it), from a share of the job its mask steps' passes set."""
    import graftui
    from graftui.flows.single import learning_share
    from graftui.kinds import kind_named
    from graftui.requests import LocalizeRequest
    from graftui.tasks.completion import generation
    from lm_util import write_completion_task, write_lm_pair

    monkeypatch.setattr(generation, "GENERATION_BATCH", 2)  # eight prompts: four batches per model
    base, ft = write_lm_pair(tmp_path, "llama")
    task = write_completion_task(tmp_path / "opposites.csv")
    events = []
    graftui.localize(base=str(base), finetuned=str(ft), task=str(task), sparsity=0.05, steps=4, check_n=8,
                     max_new_tokens=3, out=str(tmp_path / "r.safetensors"), progress=events.append)
    share = learning_share(LocalizeRequest(steps=4, check_n=8), kind_named("completion"), True)
    assert share == pytest.approx(4 * 16 * 3 / (4 * 16 * 3 + 8 * 3 * generation.ANSWER_PASSES))
    learning = [e["fraction"] for e in events if e.get("step")]
    assert max(learning) == pytest.approx(share)
    checking = [e["fraction"] for e in events if "generating with" in e.get("stage", "") and "fraction" in e]
    assert checking == sorted(checking) and checking[0] == pytest.approx(share) and checking[-1] <= 1.0
    region = [f for e, f in zip([e for e in events if "generating with" in e.get("stage", "") and "fraction" in e],
                                checking) if "this region" in e["stage"]]
    assert len(set(region)) >= 4, region  # the region's own answers, batch by batch, not one jump
    assert len(set(checking)) >= 10, checking
