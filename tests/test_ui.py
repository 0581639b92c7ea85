"""Fast tests of the web app's handlers, tables and figures on tiny, hand-made inputs (no browser)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import make_tiny_pair
from graftui import hosted


def tiny_record(pair, k: int = 20, method: str = "top-movement", task: str = "movies"):
    from graftui import regions
    from graftui.localizers import Budget, run_method

    region, _ = run_method(pair, Budget(k=k), method)
    record = regions.make_record(pair, region, {"method": method, "task": task})
    return regions.with_patch(pair, record)


# -- figures ---------------------------------------------------------------------------------------
def test_anatomy_heatmap_shows_counts_or_density_with_exact_hover():
    from graftui.layout import anatomy
    from graftui import figures

    shapes = {
        "bert.encoder.layer.0.attention.self.query.weight": (4, 4),
        "bert.encoder.layer.0.intermediate.dense.bias": (8,),
        "bert.encoder.layer.1.attention.self.query.weight": (4, 4),
    }
    region = {
        "bert.encoder.layer.0.attention.self.query.weight": torch.tensor([0, 5, 6]),
        "bert.encoder.layer.0.intermediate.dense.bias": torch.tensor([1]),
    }
    anat = anatomy(region, shapes)
    fig = figures.anatomy_heatmap(anat, "counts")
    heat = fig.data[0]
    assert list(heat.x) == ["Query", "FFN in"]
    assert list(heat.y) == ["layer 0", "layer 1"]
    assert [list(r) for r in heat.z] == [[3, 1], [0, 0]]
    assert list(heat.customdata[0][0]) == [3, 16, 3 / 16]
    assert "graftable in cell" in heat.hovertemplate and "density" in heat.hovertemplate
    dens = figures.anatomy_heatmap(anat, "density").data[0]
    assert dens.z[0][0] == pytest.approx(3 / 16)
    assert dens.z[0][1] == pytest.approx(1 / 8)
    bars = figures.module_bars(anat).data[0]
    assert list(bars.y) == [3, 1]
    assert bars.customdata[0][0] == 32  # Query tensors of both layers


def test_localize_progress_plots_every_step_and_the_budget_line():
    from graftui import figures

    progress = [{"stage": "loading models"}] + [
        {"step": i, "steps": 3, "loss": 1.0 / i, "accuracy": 0.5 + 0.1 * i, "region_size": 100 + i} for i in (1, 2, 3)
    ]
    fig = figures.localize_progress(progress, k=100)
    assert len(fig.data) == 4  # the loss, its running mean, the batch accuracy, the relaxed region's size
    assert list(fig.data[0].x) == [1, 2, 3]
    assert list(fig.data[1].y) == pytest.approx([(1 + 1 / 2 + 1 / 3) / 3] * 3)  # a window of 5 holds all three
    assert list(fig.data[3].y) == [101, 102, 103]
    assert any("budget k = 100" in (a.text or "") for a in fig.layout.annotations)
    held = [{"heldout": {"step": s, "model": m, "accuracy": a, "ft": 0.8, "bare": 0.5, "n": 64}}
            for s, m, a in ((0, "top-movement start", 0.6), (3, "this region", 0.75))]
    fig = figures.localize_progress(held[:1])  # before the first mask step: the start's held-out score alone
    assert [list(d.y) for d in fig.data] == [[0.6]]
    fig = figures.localize_progress(progress + held, k=100)
    assert list(fig.data[-1].x) == [0, 3] and list(fig.data[-1].y) == [0.6, 0.75]
    assert {a.text for a in fig.layout.annotations} >= {"fine-tuned 80.0%", "empty region 50.0%"}
    seeds = [{**e, "seed": s} for s in (0, 1) for e in progress[1:]]
    assert "seed 1" in figures.localize_progress(seeds[:4]).layout.title.text  # the seed under way, its steps alone
    assert list(figures.localize_progress(seeds[:4]).data[0].x) == [1]
    waiting = figures.localize_progress([{"stage": "loading models"}])
    assert "Waiting" in waiting.layout.annotations[0].text


def test_calibration_figures_skip_empty_bins_and_label_axes():
    from graftui import figures

    bins = [{"lo": b / 10, "hi": (b + 1) / 10, "count": 0, "accuracy": None, "confidence": None, "gap": None} for b in range(10)]
    bins[9] = {"lo": 0.9, "hi": 1.0, "count": 5, "accuracy": 0.8, "confidence": 0.95, "gap": 0.15}
    fig = figures.reliability_diagram({"fine-tuned": bins}, "movies")
    assert list(fig.data[1].x) == [0.95] and list(fig.data[1].y) == [0.8]
    assert "confidence" in fig.layout.xaxis.title.text
    hist = figures.confidence_histogram({"fine-tuned": [{"lo": 0.9, "hi": 1.0, "count": 5, "fraction": 1.0}]})
    assert list(hist.data[0].y) == [1.0]


def test_sweep_figure_uses_log_budget_axis_and_ft_reference():
    from graftui import figures

    rows = [
        {"method": m, "sparsity": s, "k": int(s * 1e6), "accuracy": a, "ece": 0.1, "ft_accuracy": 0.9, "retained": a / 0.9}
        for m, pts in {"learned": [(1e-4, 0.85), (1e-3, 0.88)], "random": [(1e-4, 0.5), (1e-3, 0.52)]}.items()
        for s, a in pts
    ]
    fig = figures.sweep_figure(rows, "movies")
    assert fig.layout.xaxis.type == "log"
    assert [t.name for t in fig.data] == ["learned", "random"]
    assert any("fine-tuned model: 90.0%" in (a.text or "") for a in fig.layout.annotations)
    # two methods that agree must both stay visible: their own dash and symbol
    assert fig.data[0].line.dash != fig.data[1].line.dash and fig.data[0].marker.symbol != fig.data[1].marker.symbol
    assert fig.data[0].error_y.array is None  # rows without intervals: no bars
    for r in rows:
        r["accuracy_ci"] = (r["accuracy"] - 0.05, r["accuracy"] + 0.02)
    bars = figures.sweep_figure(rows).data[0].error_y
    assert list(bars.array) == pytest.approx([0.02, 0.02]) and list(bars.arrayminus) == pytest.approx([0.05, 0.05])


def test_overlap_heatmap_from_overlap_matrix():
    from graftui.sets import overlap_matrix
    from graftui import figures

    m = overlap_matrix({"a": {"w": torch.tensor([0, 1, 2, 3])}, "b": {"w": torch.tensor([3, 4])}})
    fig = figures.overlap_heatmap(m)
    assert [list(r) for r in fig.data[0].z] == [[1.0, 0.5], [0.25, 1.0]]
    iou = figures.overlap_heatmap(m, "iou").data[0]
    assert iou.z[0][1] == pytest.approx(1 / 5)


# -- jobs ------------------------------------------------------------------------------------------
def test_jobs_table_rows_from_a_runner_with_dummy_jobs(tmp_path):
    from graftui.jobs import JobRunner
    from graftui.ui import jobwords

    runner = JobRunner(tmp_path / "jobs")

    def ok(ctx):
        for i in range(1, 4):
            ctx.report({"stage": "counting", "step": i, "steps": 3, "loss": 0.1})
        return {"answer": 42}

    def broken(ctx):
        raise ValueError("column 'txt' not found")

    a = runner.submit("localize", "dummy ok", ok)
    b = runner.submit("compare", "dummy broken", broken)
    runner.wait(b.id, timeout=10)
    frame = jobwords.job_rows(runner)
    assert list(frame.columns) == jobwords.JOB_COLUMNS
    rows = {r["id"]: r for r in frame.to_dict("records")}
    assert rows[a.id]["status"] == "done" and rows[a.id]["progress"] == "100 %"
    assert rows[b.id]["status"] == "failed"
    assert rows[b.id]["message"] == "column 'txt' not found"
    assert "Traceback" not in jobwords.job_status_line(runner.get(b.id))
    assert "⚠️ column 'txt' not found" in jobwords.job_status_line(runner.get(b.id))
    # a restarted runner sees the same jobs
    again = jobwords.job_rows(JobRunner(tmp_path / "jobs"))
    assert set(again["id"]) == {a.id, b.id}


def slow_job(started: threading.Event):
    """A job of 1,000 short steps, each reported (so a cancel takes effect at the next), ``started`` set at each."""
    def slow(ctx):
        for i in range(1000):
            started.set()
            ctx.report({"step": i, "steps": 1000, "loss": 0.0})
            time.sleep(0.01)
        return {}

    return slow


def test_cancel_takes_effect_at_the_next_step(tmp_path):
    from graftui.jobs import JobRunner

    runner = JobRunner(tmp_path / "jobs")
    started = threading.Event()
    job = runner.submit("localize", "slow", slow_job(started))
    assert started.wait(5)
    assert runner.cancel(job.id)
    assert runner.wait(job.id, timeout=5).status == "cancelled"


def test_a_cancel_button_cancels_only_when_pressed_again_on_the_same_job(tmp_path):
    from graftui.jobs import JobRunner
    from graftui.ui.jobwords import CONFIRM_SECONDS, cancel_step

    runner = JobRunner(tmp_path / "jobs")
    started = threading.Event()
    job = runner.submit("localize", "slow", slow_job(started))
    other = runner.submit("localize", "waiting", slow_job(threading.Event()))
    assert started.wait(5)
    said, armed, look = cancel_step(runner, job, None, 100.0)
    assert look == "armed" and armed == (job.id, 100.0) and "Confirm cancel" in said and "slow" in said
    assert runner.get(job.id).status == "running"  # one press cancels nothing
    said, armed, look = cancel_step(runner, other, armed, 101.0)  # armed for another job: asks again for this one
    assert look == "armed" and armed == (other.id, 101.0) and runner.get(other.id).status == "queued"
    said, armed, look = cancel_step(runner, job, (job.id, 100.0), 101.0, asked=False)  # the look went back: arms
    assert look == "armed" and runner.get(job.id).status == "running"
    said, armed, look = cancel_step(runner, job, None, 102.0)  # the page's poll disarmed it: asks again
    assert look == "armed" and runner.get(job.id).status == "running"
    # a press the page showed as "Confirm cancel" confirms, however late a busy server answers it
    said, armed, look = cancel_step(runner, job, armed, armed[1] + 10 * CONFIRM_SECONDS)
    assert look == "off" and armed is None and said == "Cancel requested for **slow**."
    assert runner.wait(job.id, timeout=5).status == "cancelled"
    said, armed, look = cancel_step(runner, runner.get(job.id), (job.id, time.time()), time.time())
    assert look == "off" and "has already finished (cancelled)" in said
    assert cancel_step(runner, None, None, 0.0) == ("Nothing to cancel.", None, "off")
    runner.cancel(other.id)


# -- error handling ----------------------------------------------------------------------------------
def test_guarded_turns_exceptions_into_a_status_message_not_a_traceback():
    from graftui.tasks.classification.data import DataError
    from graftui.ui.wiring import guarded

    status = object()

    @guarded(status, toast=False)
    def bad_data():
        raise DataError("task 'x' has 3 labels but the fine-tuned model has 2")

    @guarded(status, toast=False)
    def crash():
        raise RuntimeError("boom\nTraceback (most recent call last): ...")

    @guarded(status, toast=False)
    def fine(x):
        return x + 1, "ok"

    assert bad_data() == {status: "⚠️ task 'x' has 3 labels but the fine-tuned model has 2"}
    msg = crash()[status]
    assert msg.startswith("⚠️ internal error (RuntimeError: boom")
    assert fine(1) == (2, "ok")


def test_poll_runs_every_part_in_one_event_and_a_failing_part_keeps_its_outputs():
    import gradio as gr

    from graftui.ui.wiring import Poll

    class Timer:
        def tick(self, fn, inputs, outputs, **kw):
            self.fn, self.inputs, self.outputs = fn, inputs, outputs

    a, b, c, d, e, status, announced, sid = (object() for _ in range(8))
    poll = Poll()
    poll.add(lambda x: (x + 1,), [a], [b])
    poll.add(lambda x: 1 / 0, [a], [c])
    poll.add(lambda x, y: (x * y, "ok"), [a, b], [d, a])
    poll.add(lambda x: (gr.skip(),), [a], [e], tab="other")
    timer, other = Timer(), Timer()
    poll.wire({"one": timer, "other": other}, status, announced, sid)
    assert timer.outputs == [b, c, d, a, status, announced] and timer.inputs == [sid, announced, a, a, a, b]
    assert other.outputs == [b, c, d, a, e, status, announced]
    out = timer.fn("", "", 2, 2, 3, 4)  # the session id and the announced job first
    assert out[0] == 3 and out[2:4] == (12, "ok")
    assert isinstance(out[1], type(gr.skip())) and out[4].startswith("⚠️ internal error (ZeroDivisionError")
    quiet = Poll()
    quiet.add(lambda x: (gr.skip(), gr.skip()), [a], [b, c])
    quiet.wire({"one": timer}, status, announced, sid)
    assert timer.fn("", "", 1) == gr.skip()  # nothing new: one skip for all outputs (Gradio's cheap path)
    shared = Poll()  # two parts that update one component (a panel's Cancel button, and the part disarming it)
    shared.add(lambda x: (x,), [a], [b])
    shared.add(lambda x: (gr.skip() if x == 1 else "disarmed",), [a], [b])
    shared.wire({"one": timer}, status, announced, sid)
    assert timer.outputs == [b, status, announced]  # one output: the later part's answer wins where both answer
    assert timer.fn("", "", 1, 1)[0] == 1 and timer.fn("", "", 2, 2)[0] == "disarmed"
    with pytest.raises(ValueError, match="no timer for the tab 'other'"):
        poll.wire({"one": Timer()}, status, announced, sid)


def test_poll_writes_a_state_back_only_when_its_value_changed():
    """Gradio rebuilds the config of every State an event writes; an unchanged one is skipped."""
    import gradio as gr

    from graftui.ui.wiring import Poll

    class Timer:
        def tick(self, fn, inputs, outputs, **kw):
            self.fn = fn

    sig, shown = gr.State(None), object()
    poll = Poll()
    poll.add(lambda last: ("drawn" if last != ("a", 1) else gr.skip(), ("a", 1)), [sig], [shown, sig])
    timer = Timer()
    poll.wire({"one": timer}, object(), object(), object())
    first = timer.fn("", "", None)
    assert first[:2] == ("drawn", ("a", 1))
    assert timer.fn("", "", ("a", 1)) == gr.skip()  # unchanged: nothing written at all
    assert timer.fn("", "", ("b", 2))[1] == ("a", 1)


def test_the_submitted_banner_is_replaced_once_its_job_has_ended(home):
    import threading

    from graftui.ui import jobwords, store

    release = threading.Event()
    job = store.runner().submit("localize", "waits", lambda ctx: release.wait(30) and {})
    banner = jobwords.submitted_line(job)
    assert banner.job == job.id  # the page keeps the id beside the line: nothing reads it back out of the text
    assert jobwords.settled_banner(banner.job) is None  # still queued or running: the banner stays
    assert jobwords.settled_banner("") is None and jobwords.settled_banner(None) is None  # it announced no job
    release.set()
    store.runner().runner.wait(job.id, 30)
    settled = jobwords.settled_banner(banner.job)
    assert settled is not None and "Submitted" not in settled and f"(job {job.id}) ended: done" in settled


def test_the_status_line_keeps_the_id_of_the_job_it_announces_and_forgets_it_when_it_says_anything_else():
    """A handler that writes a job's banner leaves that job's id beside the line; one that writes anything else
    leaves none (the poll then has no job to settle over the new text); one that leaves the line leaves the id."""
    import copy
    import pickle

    import gradio as gr

    from graftui.ui import jobwords, wiring

    banner = jobwords.Banner("Submitted **x** (job j-1); …", "j-1")
    for answer, kept in ((banner, "j-1"), ("⚠️ a problem", ""), ("Column mapping checked", ""), (gr.skip(), None)):
        got = wiring.announces(lambda answer=answer: (answer, "other"), 0, 2)()
        assert got[:2] == (answer, "other") and (got[2] == kept if kept is not None else wiring._skipped(got[2])), got
    status, announced = object(), object()  # a guarded failure names what it writes: the id goes, so the end of the
    failure = {status: "⚠️ refused"}  # job it announced does not overwrite the failure
    assert wiring.announces(lambda: failure, 0, 2, status, announced)() == {status: "⚠️ refused", announced: ""}
    other = {object(): "a value"}  # a failure that leaves the line leaves the id
    assert wiring.announces(lambda: other, 0, 2, status, announced)() is other
    assert copy.deepcopy(banner).job == pickle.loads(pickle.dumps(banner)).job == "j-1"


def test_a_run_buttons_answer_never_leaves_a_stale_line_under_the_panel(home):
    """A Run button's answer can reach the page after a tick that already saw its (short) job end: its event is
    slower under load. The panel writes its status line together with its record of what it shows, so the answer
    must leave the line alone, or "running" stays under a finished job for good (ticks see nothing new)."""
    import threading

    import gradio as gr

    from graftui.ui import store
    from graftui.ui.wiring import job_panel, submitted

    release = threading.Event()
    job = store.runner().submit("predict", "two sentences", lambda ctx: release.wait(30) and {})
    answer = submitted(job, ("predict",), "latest")  # the button's answer, made while the job waits or runs
    release.set()
    store.runner().runner.wait(job.id, 30)
    with gr.Blocks():
        picker, status, record = gr.Dropdown(), gr.Markdown(), gr.State()
    tick, _, _ = job_panel(record, ("predict",), picker, status, [], lambda job: [], "latest")
    _, line, state = tick(job.id, None)  # a tick that saw the job end; the answer lands after it
    shown = line if answer[2] == gr.skip() else answer[2]
    assert "done" in shown and job.id in answer[1]["value"]
    assert tick(job.id, state)[1] == gr.skip()  # no later tick writes the line again: the end must be shown already


def test_a_panel_writes_the_picked_jobs_own_line_whatever_a_late_answer_left_on_the_page(home):
    """A tick answered late (begun before a pick, or before the job ended, on a busy machine) can leave the line of
    another job, or a "queued · starts in …" line under a finished one. Every tick reads the line as the page shows it
    and writes the picked job's own line where they differ; a warning beside the form stays."""
    import gradio as gr

    from graftui.ui import jobwords, store
    from graftui.ui.wiring import job_panel

    runner = store.runner()
    seeds = runner.submit("localize", "Localize 'movies' · seeds 0, 1", lambda ctx: {}, {"seeds": [0, 1]})
    other = runner.submit("localize", "Localize 'movies' · sparsity 1e-3", lambda ctx: {})
    for job in (seeds, other):
        runner.runner.wait(job.id, 30)
    with gr.Blocks():
        picker, status, record = gr.Dropdown(), gr.Markdown(), gr.State()
    tick, inputs, _ = job_panel(record, ("localize",), picker, status, [], lambda job: [], "latest")
    assert inputs[:3] == [picker, record, status]  # the line as the page shows it is read on every tick
    _, line, state = tick(seeds.id, None, "")
    assert "done" in line and seeds.id in line and "starts in" not in line
    stale = f"**{seeds.title}** [{seeds.id}] · queued · next in the queue · starts in about 13 min"
    fixed = tick(seeds.id, state, stale)[1]  # nothing changed in the record: the page is what is wrong
    assert fixed == jobwords.job_line(runner, runner.get(seeds.id)) and "queued" not in fixed
    assert tick(seeds.id, state, fixed)[1] == gr.skip()  # the page agrees: nothing is written
    elsewhere = tick(seeds.id, state, jobwords.job_line(runner, runner.get(other.id)))[1]  # another job's line
    assert seeds.id in elsewhere and other.id not in elsewhere
    assert tick(seeds.id, state, "⚠️ Mask steps must be a whole number")[1] == gr.skip()  # a refused form says why


def test_each_tab_polls_with_its_own_timer_and_only_the_open_one_ticks(home, monkeypatch):
    """One tick event per tab; its outputs are that tab's panels and the lists every tab shows."""
    import gradio as gr

    from graftui.ui import app, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    timers = [b for b in demo.blocks.values() if isinstance(b, gr.Timer)]
    assert len(timers) == 8 and [t.active for t in timers].count(True) == 1  # the first tab's

    def tick_outputs(timer):
        fns = [fn for fn in demo.fns.values() if any(t[0] == timer._id and t[1] == "tick" for t in fn.targets)]
        assert len(fns) == 1
        return {getattr(o, "elem_id", None) for o in fns[0].outputs}

    outputs = [tick_outputs(t) for t in timers]
    shared = set.intersection(*outputs)
    assert {"jobs-table", "status-message", "region-list"} <= shared
    localize = next(o for o in outputs if "localize-status" in o)
    assert "compare-status" not in localize and "lab-wise-status" not in localize
    assert sum("localize-status" in o for o in outputs) == 1

    tab = by_id["tab-compare"]
    select = next(fn for fn in demo.fns.values() if any(t[0] == tab._id and t[1] == "select" for t in fn.targets))
    returned = select.fn(None)  # the session id, then no inputs
    flags = [(out, r.active) for out, r in zip(select.outputs, returned) if isinstance(r, gr.Timer)]
    active = [out for out, on in flags if on]
    assert len(flags) == 8 and len(active) == 1
    assert "compare-status" in tick_outputs(active[0])  # the opened tab's own timer


def test_the_launched_queue_loop_idles_at_fifty_milliseconds(home, monkeypatch):
    """Gradio's queue wakes every 1 ms when free and sums its history after every event; launch slows both."""
    import gradio as gr

    from graftui.ui import app, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    assert gr.Blocks().queue()._queue.sleep_when_free < app.QUEUE_IDLE_SECONDS  # Gradio's own default: work to do
    monkeypatch.setattr(gr.Blocks, "launch", lambda demo, **kwargs: demo)  # the server itself is not started
    demo = app.launch(port=0)
    assert demo._queue.sleep_when_free == app.QUEUE_IDLE_SECONDS
    assert gr.Blocks().queue()._queue.ANAYLTICS_CACHE_FREQUENCY < app.ANALYTICS_EVERY_EVENTS  # Gradio: after every event
    assert demo._queue.ANAYLTICS_CACHE_FREQUENCY == app.ANALYTICS_EVERY_EVENTS


def test_the_page_script_comes_first_in_the_apps_pages_and_nothing_else_changes(home):
    """Gradio's modules keep their own requestAnimationFrame: the script must precede them, in the served HTML."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, StreamingResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from graftui.ui import app as ui_app, pagescript

    html = '<html><head><script type="module" src="x.js"></script></head><body>é</body></html>'

    async def page(request):
        return HTMLResponse(html)

    async def missing(request):
        return HTMLResponse(html, status_code=404)

    async def data(request):
        return JSONResponse({"a": "<head>"})

    async def stream(request):
        async def parts():
            yield b"<html><head>"
            yield b"</head></html>"
        return StreamingResponse(parts(), media_type="text/html")

    options = ui_app.launch_options()  # what launch serves the app with
    assert options["ssr_mode"] is False  # the page comes from this server, through the middleware
    site = Starlette(routes=[Route("/", page, methods=["GET", "POST"]), Route("/data", data), Route("/stream", stream),
                             Route("/missing", missing), Route("/gradio_api/file=report.html", page)],
                     middleware=options["app_kwargs"]["middleware"])
    client = TestClient(site)
    got = client.get("/")
    assert got.text == html.replace("<head>", "<head>" + pagescript.SCRIPT)
    assert int(got.headers["content-length"]) == len(got.content)
    assert client.get("/stream").text == "<html><head>" + pagescript.SCRIPT + "</head></html>"
    assert client.get("/data").json() == {"a": "<head>"}  # not a page: untouched
    for untouched in (client.post("/"), client.get("/missing"), client.get("/gradio_api/file=report.html")):
        assert untouched.text == html  # another method, an error page, a served file: as they were

    sent = []  # a server's extension message while a page is held: the held start goes first, unchanged

    async def extension_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.pathsend", "path": "/tmp/page.html"})

    async def record(message):
        sent.append(message)

    asyncio.run(pagescript.EarlyScript(extension_app)({"type": "http", "method": "GET", "path": "/"}, None, record))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.pathsend"]


def test_friendly_message_keeps_quotes_and_names_internal_errors():
    from graftui.regions import RegionError
    from graftui.ui.wiring import friendly_message

    assert friendly_message(RegionError("'x.safetensors' is not a region")) == "'x.safetensors' is not a region"
    assert friendly_message(KeyError("no parameter 'w'")) == "internal error (KeyError: no parameter 'w')"


# -- hosted mode -----------------------------------------------------------------------------------
def test_hosted_mode_refuses_server_paths_but_not_its_own_uploads(home, monkeypatch, tmp_path):
    from graftui.tasks.classification.data import DataError
    from graftui.models import ModelError
    from graftui.ui import store

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    data = tmp_path / "data.csv"
    data.write_text("text,label\ngood,1\nbad,0\n")
    assert hosted.allow_local_for([str(outside)], [str(data)]) is True  # locally anything goes

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    with pytest.raises(ModelError, match="local paths are not allowed"):
        hosted.allow_local_for([str(outside)])
    with pytest.raises(DataError, match="disabled"):
        hosted.allow_local_for([], [str(data)])
    assert hosted.allow_local_for(["minilm", "org/model"], ["movies"]) is False
    uploaded, _ = hosted.save_upload(data)
    assert uploaded.parent.parent == store.uploads_dir() and uploaded.name == "data.csv"  # split names come from file names
    assert hosted.allow_local_for(["org/model"], [str(uploaded)]) is True
    assert hosted.is_managed(str(uploaded)) and not hosted.is_managed(str(data))


def test_hosted_sessions_own_their_files_and_jobs_and_share_a_read_only_gallery(home, monkeypatch, tmp_path):
    from graftui import regions, settings
    from graftui.errors import SessionError
    from graftui.ui import store

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    a, b = store.resume(""), store.resume("not-an-issued-id")
    assert a != b and store.live_session(a) and store.live_session(b) and store.resume(a) == a
    pair, _, _ = make_tiny_pair()
    shared = regions.save(tiny_record(pair, k=10), store.gallery_dir() / "shared.safetensors")  # the server's own
    data = tmp_path / "data.csv"
    data.write_text("text,label\ngood,1\nbad,0\n")
    with store.session(a):
        mine = store.save_region(tiny_record(pair, k=20))
        upload, _ = hosted.save_upload(data)
        job = store.runner().submit("localize", "writes a file", lambda ctx: {"at": str(settings.subdir("regions"))})
        assert {(e.id, e.gallery) for e in store.list_regions()} == {(mine.stem, False), ("shared", True)}
    assert store.runner().runner.wait(job.id, 30).result["at"] == str(store.sessions_dir() / a / "regions")  # the job's context
    with store.session(b):
        entries = store.list_regions()
        assert [(e.id, e.gallery) for e in entries] == [("shared", True)] and "gallery" in entries[0].label
        assert store.runner().jobs() == [] and store.upload_choices() == []
        assert not hosted.is_managed(str(upload)) and not hosted.is_managed(str(mine))
        with pytest.raises(regions.RegionError, match="gallery"):
            store.delete_region("shared")
        with pytest.raises(regions.RegionError, match="not saved here"):
            store.delete_region(mine.stem)
    with store.session(a):
        assert hosted.is_managed(str(upload))
        assert store.delete_region(mine.stem) == mine and not mine.exists()
    with store.session(None):  # a request without a session reads and writes nothing of anyone's
        with pytest.raises(SessionError, match="reload the page"):
            store.regions_dir()
        with pytest.raises(SessionError, match="reload the page"):
            store.runner().submit("localize", "x", lambda ctx: {})
    assert shared.exists()


def test_uploads_are_capped_and_typed(home, monkeypatch, tmp_path):
    from graftui import settings

    big = tmp_path / "big.csv"
    big.write_bytes(b"x" * 3000)
    monkeypatch.setattr(settings, "MAX_UPLOAD_MB", 0.001)
    with pytest.raises(ValueError, match="limited to"):
        hosted.save_upload(big)
    with pytest.raises(ValueError, match="accepted file types"):
        hosted.check_upload(tmp_path / "model.pkl", (".safetensors",))


# -- regions store and tables ----------------------------------------------------------------------
def test_every_region_label_is_unique_and_names_no_folder(home, tmp_path):
    """Two files of one region (same settings, same content) get labels that also say when each was saved, ahead of
    the ids that end every label, and no label, table cell or union's task shows the folder of an uploaded task."""
    from graftui import regions
    from graftui.ui import library, store

    pair, _, _ = make_tiny_pair()
    upload = str(tmp_path / "uploads" / "3af35dc8b7da" / "mydata.csv")
    folder = store.regions_dir()
    first = regions.save(tiny_record(pair, k=20), folder / "movies-top-20261129-104500.safetensors")
    twin = regions.save(tiny_record(pair, k=20), folder / "movies-top-20261129-104512.safetensors")
    mine = regions.save(tiny_record(pair, k=12, task=upload), folder / "mydata-top-20261129-104600.safetensors")
    union = tiny_record(pair, k=30, task=f"movies+{upload}")
    union.meta.method = "union"
    regions.save(union, store.regions_dir() / "union-20261129-104700.safetensors")
    choices = store.region_choices()
    labels = dict((i, label) for label, i in choices)
    assert len(set(labels.values())) == len(labels) == 4
    assert labels[first.stem].endswith(f"#{store.list_regions()[-1].digest} · saved 2026-11-29 10:45:00 [{first.stem}]")
    assert "saved 2026-11-29 10:45:12" in labels[twin.stem] and "saved" not in labels[mine.stem]
    assert all("uploads" not in label and "3af35dc8b7da" not in label and str(tmp_path) not in label
               for label in labels.values())
    assert "mydata.csv" in labels[mine.stem] and labels["union-20261129-104700"].startswith("movies+mydata.csv")
    table = library.region_list_rows()
    assert set(table["task"]) == {"movies", "mydata.csv", "movies+mydata.csv"}
    assert set(library.regions_table(library.regions_listing())["task"]) == {"movies", "mydata.csv", "movies+mydata.csv"}


def test_a_new_region_is_picked_in_every_picker_unless_someone_is_picking_there():
    """``library.next_pick``: a new region becomes the pick (one region: it; a union or curves: added to those of its
    base; a comparison: replaces them); a picker picked by hand in the last PICKING_SECONDS keeps its pick; a region
    gone leaves the picker; an empty one gets the newest."""
    from types import SimpleNamespace as NS

    from graftui.ui import library

    def entry(rid, base="b"):
        return NS(id=rid, meta=NS(base=base))

    old = [entry("a"), entry("z", base="other")]
    now = [entry("n"), *old]  # newest first
    pick = library.next_pick
    assert pick("a", False, False, now, {"n"}) == "n"
    assert pick(["a"], True, False, now, {"n"}) == ["n"]  # Compare: the new one, alone
    assert pick(["a", "z"], True, True, now, {"n"}) == ["a", "n"]  # Compose: added to those of its base
    assert pick("a", False, False, now, {"n"}, picked_at=100.0, now=110.0) == "a"  # someone is picking there
    assert pick("a", False, False, now, {"n"}, picked_at=100.0, now=100.0 + library.PICKING_SECONDS + 1) == "n"
    assert pick("a", False, False, now, set()) == "a"  # the page opened: nothing is new
    assert pick("gone", False, False, now, set()) == "n" and pick(["gone"], True, True, now, set()) == ["n", "a"]
    assert pick("a", False, False, [e for e in now if e.id != "a"], set()) == "n"  # deleted: it leaves the picker


def test_saved_regions_are_listed_after_a_restart_and_ids_are_checked(home):
    from graftui import regions
    from graftui.ui import library, store, tables

    pair, _, _ = make_tiny_pair()
    record = tiny_record(pair, k=20)
    path = store.save_region(record)
    entries = store.list_regions()
    assert [e.id for e in entries] == [path.stem]
    assert entries[0].kind == "patch" and entries[0].meta["k"] == 20
    assert "movies · top-movement · k=20" in entries[0].label
    table = library.region_list_rows()
    assert table.iloc[0]["k (params)"] == "20"
    for bad in ("../etc/passwd", "", "a/b"):
        with pytest.raises(regions.RegionError):
            store.region_path(bad)
    only = regions.load(library.region_only_file(path.stem))
    assert not only.is_patch and only.size == 20
    meta = tables.region_meta_table(store.load_region(path.stem))
    assert "k (parameters in region)" in set(meta["field"])


def test_budget_text_shows_k_when_the_graftable_count_is_known(home):
    from graftui.ui import forms, store, tables

    assert "check the pair" in forms.budget_text(-3, None)
    store.remember_counts("b", "f", {"graftable": 2_000_000, "head": 10, "excluded": 5, "total": 2_000_015})
    text = forms.budget_text(-3, store.known_counts("b", "f"))
    assert "k = 2,000" in text and "0.1000%" in text
    table = tables.counts_table(store.known_counts("b", "f"))
    assert table.iloc[0]["count"] == "2,000,000"
    assert tables.counts_table(None).iloc[0]["count"] == "not checked yet"


def test_laboratory_inputs_are_checked_before_any_job(home):
    from graftui.errors import RequestError
    from graftui.ui import forms, store

    assert forms.parse_alphas("1, 0,0.5") == [0.0, 0.5, 1.0]
    with pytest.raises(ValueError, match="α values like"):
        forms.parse_alphas("0, half")
    with pytest.raises(ValueError, match="at least one α"):
        forms.parse_alphas(" , ")
    runner = store.runner()
    before = len(runner.jobs())
    with pytest.raises(RequestError, match="two or more different tasks"):
        forms.submit_multitask(runner, tasks=["movies"], group=[], log_sparsity=-3, start="empty", steps=5,
                                 purify_steps=2, examples_per_class=None, n=10)
    with pytest.raises(RequestError, match="'bbc' is not one of --tasks"):
        forms.submit_multitask(runner, tasks=["movies", "amazon"], group=["movies", "bbc"], log_sparsity=-3,
                                 start="empty", steps=5, purify_steps=2, examples_per_class=None, n=10)
    with pytest.raises(ValueError, match="pick at least one region"):
        forms.submit_wise(runner, region_id="", alphas="0, 1", ood=[], n=10)
    assert len(runner.jobs()) == before


def test_parse_budgets():
    from graftui.ui.forms import parse_budgets

    assert parse_budgets("1e-3, 1e-5;1e-4") == [1e-5, 1e-4, 1e-3]
    with pytest.raises(ValueError, match="not a number"):
        parse_budgets("1e-3, lots")
    from graftui.requests import SweepRequest

    with pytest.raises(ValueError, match=r"\(0, 1\]"):  # the range is the request's to check, for every front end
        SweepRequest(sparsities=parse_budgets("2")).validate()


def test_compare_table_labels_every_column():
    from graftui.ui.tables import compare_table

    base = {"n": 10, "f1": 0.5, "ece": 0.05, "agreement_with_ft": 1.0, "region_size": None}
    result = {"rows": [
        {**base, "model": "fine-tuned", "task": "movies", "distribution": "in", "accuracy": 0.9},
        {**base, "model": "graft: r", "task": "movies", "distribution": "in", "accuracy": 0.85, "region_size": 20},
        {**base, "model": "fine-tuned", "task": "amazon", "distribution": "OOD", "accuracy": 0.8},
    ]}
    frame = compare_table(result)
    assert "ECE ↓" in frame.columns and "agree w/ FT" in frame.columns
    graft = frame.iloc[1]
    # the interval is computed when a result predates it: Wilson at 8.5 of 10 is [54.1, 96.5] %
    assert graft["accuracy ↑ [95 % CI]"] == "85.0% [54–96]" and graft["Δ vs FT"] == "-5.0 pts"
    assert graft["k (params)"] == "20" and frame.iloc[0]["k (params)"] == "full model"
    assert frame.iloc[2]["dist."] == "OOD" and graft["share of FT gain"] == ""  # no bare row: no gain to share


@pytest.mark.parametrize("kind", ["classification", "completion"])
def test_the_compare_table_has_each_regions_difference_to_the_baselines_as_columns(kind):
    """Learned − top movement and − random, with their paired intervals, in the region's row of Compare's table (on
    its own task: an OOD row has its own); the fine-tuned model and the baselines leave them empty."""
    from graftui.ui.kinds import app_of
    from graftui.ui.tables import compare_table

    score = "accuracy" if kind == "classification" else "exact_match"
    base = {"n": 200, "f1": 0.5, "ece": 0.05, "agreement_with_ft": 1.0, "region_size": 20, "distribution": "in"}
    models = [("fine-tuned", None, 0.9), ("learned-r", "learned", 0.86), ("Top movement", "top-movement", 0.83),
              ("Random", "random", 0.6)]
    rows = [{**base, "model": m, "method": method, "task": task, score: value - (0.1 if task == "amazon" else 0)}
            for task in ("movies", "amazon") for m, method, value in models]
    diff = lambda b, task, d, ci: {"a": "learned-r", "b": b, "task": task, "metric": score, "diff": d, "ci": ci,  # noqa: E731
                                   "n": 200, "p": 0.01}
    result = {"rows": rows, "differences": [
        diff("Top movement", "movies", 0.032, [0.004, 0.058]), {**diff("Top movement", "movies", -0.01, [-0.02, 0.0]),
                                                                "metric": "ece"},
        diff("Random", "movies", 0.26, [0.2, 0.31]), diff("Top movement", "amazon", -0.005, [-0.03, 0.02])]}
    frame = compare_table({**result, "task_kind": kind})
    assert list(frame.columns) == list(app_of(kind).app_columns)
    cells = {(r["model"], r["task"]): (r["− top movement [95 % CI]"], r["− random [95 % CI]"])
             for r in frame.to_dict("records")}
    assert cells[("learned-r", "movies")] == ("+3.2 pts [+0.4, +5.8]", "+26.0 pts [+20.0, +31.0]")
    assert cells[("learned-r", "amazon")] == ("−0.5 pts [−3.0, +2.0]", "")  # no random baseline scored there
    assert {cells[(m, t)] for m in ("fine-tuned", "Top movement", "Random") for t in ("movies", "amazon")} == {("", "")}


def test_submit_prepare_is_skipped_when_the_default_is_cached(home, monkeypatch):
    from graftui.ui import forms, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    assert forms.submit_prepare(store.runner()) is None


# -- compose flow --------------------------------------------------------------------------------
class CharTokenizer:
    """Enough of a tokenizer for data.batches: characters to ids below the tiny vocabulary."""

    def __call__(self, texts, pairs=None, padding=None, truncation=None, max_length=16, return_tensors=None):
        ids = [[1 + (ord(c) % 50) for c in t[:max_length]] or [1] for t in texts]
        width = max(len(r) for r in ids)
        input_ids = torch.tensor([r + [0] * (width - len(r)) for r in ids])
        return {"input_ids": input_ids, "attention_mask": (input_ids > 0).long()}


def test_union_graft_is_scored_against_each_region_alone_and_restored():
    from graftui import regions, sets
    from graftui.tasks.classification.data import Split, Task
    from graftui.tasks.classification.scoring import evaluate_on_pair, union_of

    pair, _, _ = make_tiny_pair()
    pair.tokenizer = CharTokenizer()
    a = tiny_record(pair, k=30, method="top-movement")
    b = tiny_record(pair, k=30, method="random")
    before = {n: pair.param(n).detach().clone() for n in pair.graftable}
    idx, val, report = union_of([a, b], ["a", "b"], pair.pre, "first")
    assert report["union_params"] == sets.region_size(sets.union(a.indices, b.indices))
    with pair.grafted(idx, val):
        name = next(iter(idx))
        assert torch.equal(pair.param(name).data.view(-1)[idx[name]], pair.ft[name].view(-1)[idx[name]])
    split = Split(("good film", "bad film", "great", "awful"), (1, 0, 1, 0))
    task = Task("tiny", ("neg", "pos"), {"train": split, "validation": split, "test": split}, "hand-made", max_length=16)
    rows, paired = evaluate_on_pair(pair, task, a, "a", idx, val)
    assert [r["model"] for r in rows] == ["region alone", "union graft", "pre-trained body + its head"]
    assert [(d["a"], d["b"], d["metric"]) for d in paired] == [
        (m, "region alone", metric) for m in ("union graft", "pre-trained body + its head") for metric in ("accuracy", "ece")]
    assert paired[0]["diff"] == pytest.approx(rows[1]["accuracy"] - rows[0]["accuracy"]) and paired[0]["head"] == "a"
    assert rows[0]["delta_vs_alone"] == 0 and rows[1]["region_size"] == report["union_params"]
    for n in pair.graftable:  # every graft was undone exactly
        assert torch.equal(pair.param(n).data, before[n])
    with pytest.raises(regions.RegionError, match="at least two"):
        union_of([a], ["a"], pair.pre)


def test_compose_report_text_names_the_rule_and_the_shared_count():
    from graftui.ui.tables import compose_report_text

    text = compose_report_text({"union_params": 50, "overlap_params": 3, "per_pair": {"a": {"b": 3}, "b": {}},
                                "sizes": {"a": 30, "b": 23}, "resolve": "mean"})
    assert "50" in text and "**3**" in text and "a ∩ b: 3" in text and "mean" in text


# -- the page --------------------------------------------------------------------------------------
def test_every_job_picker_takes_a_job_its_choices_do_not_list_yet(home, monkeypatch):
    """A poll may list the jobs just before a new one is submitted; were the new id refused, every later
    poll would fail and the page would never show that job end."""
    import gradio as gr

    from graftui.ui import app, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()
    pickers = [b for b in demo.blocks.values() if isinstance(b, gr.Dropdown) and b.label in ("Show job", "Job")]
    ids = {b.elem_id for b in pickers}
    assert {"finetune-job", "localize-job", "compare-job", "sweep-job", "jobs-select"} <= ids and len(ids) >= 8, ids
    for picker in pickers:
        assert picker.preprocess("20991231-235959-abcdef") == "20991231-235959-abcdef", picker.elem_id


def test_app_builds_with_the_named_tabs_and_stable_element_ids(home, monkeypatch):
    import gradio as gr

    from graftui.ui import app, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()
    blocks = list(demo.blocks.values())
    tabs = [b.label for b in blocks if isinstance(b, gr.Tab)]
    assert tabs == list(app.TAB_NAMES)
    ids = {b.elem_id for b in blocks if getattr(b, "elem_id", None)}
    for needed in ("localize-run", "localize-cancel", "jobs-table", "region-list", "compare-run", "anatomy-heatmap",
                   "compose-run", "region-upload", "region-download", "status-message", "models-check", "sweep-run",
                   "lab-multitask-run", "lab-overlap", "lab-gain", "lab-wise-run", "lab-wise-plot", "lab-retrain-run"):
        assert needed in ids, needed


@pytest.mark.parametrize("fast", ["1", ""])
def test_the_forms_defaults_submit_as_they_stand(monkeypatch, fast):
    """Run pressed on an untouched form is a job, in either mode (not a refusal of the form's own defaults)."""
    from graftui.ui import forms, store

    monkeypatch.setenv("GRAFTUI_FAST", fast)
    d = store.defaults()
    jobs = []

    class Runner:
        def submit(self, kind, title, fn, params=None, owner=None, **lane):
            jobs.append((kind, params))

        def history(self):
            return []

        def quick_held(self):
            return 0

    box = {k: 0 if v is None else v for k, v in d.items()}  # what the page sends: a number box shows None as 0
    pair = {"base": "minilm", "finetuned": "minilm-movies", "task": "movies", "columns": {}}
    forms.submit_localize(Runner(), **pair, method="learned", log_sparsity=box["log_sparsity"], steps=box["steps"],
                            examples_per_class=box["examples_per_class"], lr=box["mask_lr"])
    forms.submit_sweep(Runner(), **pair, budgets=box["sweep_budgets"], steps=box["steps"],
                         examples_per_class=box["examples_per_class"], lr=box["mask_lr"], n=box["test_examples"])
    assert [kind for kind, _ in jobs] == ["localize", "sweep"]
    assert jobs[0][1]["examples_per_class"] == (16 if fast else None)


def test_the_laboratorys_seeds_reach_its_requests(home, monkeypatch):
    """Multi-task and continual take a Seeds box; WiSE's 'mean over its seeds' adds the other regions of the picked
    region's localize run, and says in one line when there are none."""
    from graftui.errors import RequestError
    from graftui.ui import forms, store

    jobs = []

    class Runner:
        def submit(self, kind, title, fn, params=None, owner=None, **lane):
            jobs.append((kind, title, params))

        def history(self):
            return []

        def quick_held(self):
            return 0

    forms.submit_multitask(Runner(), tasks=["movies", "amazon"], group=[], log_sparsity=-4, start="empty", steps=2,
                             purify_steps=0, examples_per_class=8, n=16, seeds="0, 1")
    forms.submit_continual(Runner(), tasks=["movies", "amazon"], log_sparsity=-4, steps=2, examples_per_class=8,
                             n=16, seeds="2,3")
    assert [(kind, params["seeds"]) for kind, _, params in jobs] == [("multitask", [0, 1]), ("continual", [2, 3])]
    assert all(title.endswith(f"· seeds {', '.join(map(str, params['seeds']))}") for _, title, params in jobs)
    monkeypatch.setattr(store, "region_path", lambda rid: Path(f"/regions/{rid}.safetensors"))
    monkeypatch.setattr(forms.WiseRequest, "check", lambda self: None)  # no such files: the request is what is read
    monkeypatch.setattr(forms, "seeds_of_run", lambda rid: ["r-seed1", "r-seed2"] if rid == "r-seed0" else [])
    forms.submit_wise(Runner(), region_id="r-seed0", alphas="0, 1", ood=[], n=16, over_seeds=True)
    assert jobs[-1][2]["replicates"] == ["/regions/r-seed1.safetensors", "/regions/r-seed2.safetensors"]
    assert "mean over its 3 seeds" in jobs[-1][1]
    forms.submit_wise(Runner(), region_id="r-seed0", alphas="0, 1", ood=[], n=16)
    assert not jobs[-1][2].get("replicates")
    with pytest.raises(RequestError, match="no other seeds saved"):
        forms.submit_wise(Runner(), region_id="alone", alphas="0, 1", ood=[], n=16, over_seeds=True)
    with pytest.raises(RequestError, match="seed"):
        forms.submit_continual(Runner(), tasks=["movies", "amazon"], log_sparsity=-4, steps=2, examples_per_class=8,
                                 n=16, seeds="1, one")


def test_fast_mode_lowers_defaults(monkeypatch):
    from graftui.ui import store

    monkeypatch.setenv("GRAFTUI_FAST", "1")
    d = store.defaults()
    assert (d["steps"], d["examples_per_class"], d["test_examples"]) == (10, 16, 64)
    monkeypatch.delenv("GRAFTUI_FAST")
    full = store.defaults()
    assert (full["steps"], full["examples_per_class"], full["mask_lr"]) == (40, 256, 0.02)
    assert full["ft_lr"] == 0.003
    # a number box cannot show "unset" (an empty one reads 0, which the request refuses): every default is a number,
    # and the k-shot box's default stands for the library's default, "up to 256, all there are when fewer"
    assert all(isinstance(v, (int, float)) for k, v in full.items() if k != "sweep_budgets"), full
    from graftui.requests import LocalizeRequest
    from graftui.ui import forms

    assert forms.per_class(full["examples_per_class"]) is LocalizeRequest.defaults()["examples_per_class"] is None
    assert forms.per_class(16) == 16 and forms.per_class(0) == 0 and forms.per_class(None) is None


# -- the app's jobs end to end, on a tiny saved pair -------------------------------------------------
@pytest.fixture
def tiny_checkpoints(tmp_path):
    """A tiny BERT base and a 'fine-tuned' copy saved as checkpoints, with the MiniLM tokenizer."""
    import shutil

    from transformers import BertConfig, BertForSequenceClassification

    from conftest import MINILM_DIR, make_tiny_finetuned

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=128, num_labels=2, id2label={0: "negative", 1: "positive"},
                        label2id={"negative": 0, "positive": 1})
    base = BertForSequenceClassification(config).eval()
    ft = make_tiny_finetuned(base, scale=0.05)
    dirs = {}
    for name, model in (("base", base), ("ft", ft)):
        out = tmp_path / name
        model.save_pretrained(out, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            shutil.copy(MINILM_DIR / f, out / f)
        dirs[name] = str(out)
    return dirs


def test_a_seeds_localize_then_its_core_and_union_scored_from_the_page(home, tiny_checkpoints):
    """End to end: a localize job of two seeds writes each seed's region, the core and the union; the button under it
    compares all four on the region's task, each graft a row, each with its paired difference against FT."""
    from graftui.ui import forms, store
    from graftui.ui.tabs import compare, localize

    runner = store.runner()
    seeds = runner.wait(forms.submit_localize(runner, base=tiny_checkpoints["base"], finetuned=tiny_checkpoints["ft"],
                                              task="movies", columns={}, method="learned", log_sparsity=-2, steps=2,
                                              examples_per_class=4, lr=0.5, seeds="0, 1").id, timeout=240)
    assert seeds.status == "done", seeds.error
    assert localize.render_localize(seeds)[2]["visible"] is True
    table = localize.render_localize(seeds)[3]["value"]  # each seed, their mean ± spread, the core and the union
    st, each = seeds.result["stability"], seeds.result["seeds"]
    assert list(table["region"]) == ["seed 0", "seed 1", "mean ± spread over 2 seeds", "core (every seed)",
                                     "union (any seed)"]
    assert list(table["k (params)"])[-2:] == [f"{st['core']:,}", f"{st['union']:,}"]
    assert table["mean IoU with the other seeds"][0] == f"{st['pairwise_iou'][0][1]:.3f}"
    ks = [e["k"] for e in each]
    mean, sd = sum(ks) / 2, (sum((k - sum(ks) / 2) ** 2 for k in ks)) ** 0.5
    assert table["k (params)"][2] == f"{mean:,.0f} ± {sd:,.0f}"
    held = [e["check"] for e in each]
    assert table["held-out ↑ (n)"][0] == f"{100 * held[0]['accuracy']:.1f}% ({held[0]['n']:,})", table
    scored = runner.wait(forms.submit_seed_regions(runner, seeds).id, timeout=240)
    assert scored.status == "done", scored.error
    table = compare.render_compare(scored)[0]
    names = [e["region"] for e in seeds.result["seeds"]] + [
        Path(seeds.result["stability"][k]).stem for k in ("core_path", "union_path")]
    shown = list(table["model"])  # a seed's region is labelled with its seed
    assert len(names) == 4 and all(any(m == n or m.startswith(f"{n} (seed ") for m in shown) for n in names), shown
    against_ft = {d["a"] for d in scored.result["differences"] if d["b"] == "fine-tuned"}
    assert all(any(a == n or a.startswith(f"{n} (seed ") for a in against_ft) for n in names), against_ft


def test_the_localize_tab_finds_the_size_a_skill_needs(home, tiny_checkpoints, tmp_path):
    """The Localize tab's keep share: the job searches from the budget and writes the smallest region that keeps it,
    with its curve; a panel showing the job puts the share back into the form. Where fine-tuning gained nothing, one
    line says so after one localization."""
    from graftui import regions
    from graftui.ui import forms, store, wiring

    runner = store.runner()
    nothing = runner.wait(forms.submit_localize(runner, base=tiny_checkpoints["base"], finetuned=tiny_checkpoints["ft"],
                                                task="movies", columns={}, method="learned", log_sparsity=-2, steps=2,
                                                examples_per_class=4, lr=0.5, keep=0.9).id, timeout=240)
    assert nothing.status == "failed" and nothing.error.startswith("fine-tuning gained nothing to keep on 200 "
                                                                   "held-out examples: the fine-tuned model's "
                                                                   "accuracy is ")
    assert sum("size search, region" in str(p.get("stage", "")) and "held-out" in str(p.get("stage", ""))
               for p in nothing.progress) <= 1
    task = tmp_path / "task.csv"
    task.write_text("text,label\n" + "".join(f"a {'good' if i % 2 else 'bad'} sentence {i},{i % 2}\n"
                                             for i in range(80)))
    job = runner.wait(forms.submit_localize(runner, base=tiny_checkpoints["base"], finetuned=tiny_checkpoints["ft"],
                                            task=str(task), columns={}, method="learned", log_sparsity=-3, steps=2,
                                            examples_per_class=4, lr=0.5, keep=0.9).id, timeout=240)
    assert job.status == "done", job.error
    assert job.params["keep"] == 0.9 and "the size that keeps 90 %" in job.title
    meta = regions.load(job.result["path"]).meta
    assert meta.size_search["target"] == 0.9 and meta.k == meta.size_search["k"]
    assert any(p["keeps"] and p["k"] == meta.k for p in meta.size_search["curve"])
    assert wiring.job_form("localize", job)[-1]["value"] == 0.9
    plain = forms.submit_localize(runner, base=tiny_checkpoints["base"], finetuned=tiny_checkpoints["ft"],
                                  task="movies", columns={}, method="top-movement", log_sparsity=-2, steps=2,
                                  examples_per_class=4, lr=0.5, keep=0)
    assert plain.params["keep"] is None  # 0: the budget as it is
    runner.wait(plain.id, timeout=240)


def test_an_app_localize_jobs_bundle_holds_the_same_files_as_the_clis(home, tiny_checkpoints, tmp_path):
    """The report bundle of a localize job made on the page and of the same request run as `--report x.zip`: the same
    files (README, request, result, inputs, tables, figures, the region under outputs/), the region's name aside."""
    import zipfile

    from graftui.cli import main as cli_main
    from graftui.ui import forms, store

    runner = store.runner()
    job = runner.wait(forms.submit_localize(runner, base=tiny_checkpoints["base"], finetuned=tiny_checkpoints["ft"],
                                            task="movies", columns={}, method="learned", log_sparsity=-2, steps=2,
                                            examples_per_class=4, lr=0.5).id, timeout=240)
    assert job.status == "done", job.error
    assert cli_main(["run", str(forms.request_file(job)), "--report", str(tmp_path / "cli.zip")]) in (0, None)

    def files(path, region: str) -> set[str]:
        with zipfile.ZipFile(path) as zf:
            return {name.split("/", 1)[1].replace(region, "REGION") for name in zf.namelist() if "/" in name}

    with zipfile.ZipFile(tmp_path / "cli.zip") as zf:
        written = next(n for n in zf.namelist() if "/outputs/" in n)
    app, made = files(forms.report_bundle(job), job.result["region"]), files(tmp_path / "cli.zip", Path(written).stem)
    assert app == made, (app - made, made - app)
    assert {"README.md", "request.json", "result.json", "outputs/REGION.safetensors", "tables/mask_curve.csv",
            "figures/mask_curve.html"} <= app, app


def test_localize_compare_compose_export_jobs_end_to_end(home, tiny_checkpoints):
    import json
    import zipfile

    from graftui import flows, regions
    from graftui.errors import RequestError
    from graftui.ui import forms, store
    from graftui.ui.tabs import compare, compose, localize

    runner = store.runner()
    base, ft = tiny_checkpoints["base"], tiny_checkpoints["ft"]

    def finish(job):
        done = runner.wait(job.id, timeout=240)
        assert done.status == "done", done.error
        return done

    learned = finish(forms.submit_localize(runner, base=base, finetuned=ft, task="movies", columns={}, method="learned",
                                             log_sparsity=-2, steps=2, examples_per_class=4, lr=0.5))
    steps = [p for p in learned.progress if "step" in p]
    assert len(steps) == 2 and steps[-1]["k"] == learned.result["k"] > 0  # the live plot's budget line
    assert localize.render_localize(learned)[0].data  # the live figure has its curves
    assert learned.params["verb"] == "localize" and learned.params["examples_per_class"] == 4
    again = flows.run_file(forms.request_file(learned))  # the job's request, downloaded, runs again to the same region
    first = regions.load(store.region_path(learned.result["region"]))
    assert all(torch.equal(first.indices[n], again.region[n]) for n in first.indices)
    Path(again.path).unlink()
    other = finish(forms.submit_localize(runner, base=base, finetuned=ft, task="amazon", columns={}, method="top-movement",
                                           log_sparsity=-2, steps=2, examples_per_class=4, lr=0.5))
    ids = [e.id for e in store.list_regions()]
    assert set(ids) == {learned.result["region"], other.result["region"]}

    cmp = finish(forms.submit_compare(runner, region_ids=[learned.result["region"]], ood=["amazon"], n=16, baselines=True))
    table, diffs, rel, hist, note, side, unlike_note, unlike = compare.render_compare(cmp)
    assert rel["visible"] and hist["visible"] and unlike["label"] == compare.DISAGREEMENTS_LABEL
    unlike = unlike["value"]
    assert set(table["model"]) >= {"fine-tuned", "pre-trained body + FT head", "Top movement", "Random", learned.result["region"]}
    # every paired difference of the job as a row: the graft against FT and each baseline, accuracy and ECE
    region = learned.result["region"]
    assert {f"{region} − fine-tuned", f"{region} − Random", f"{region} − Top movement"} <= set(diffs["a − b"])
    assert len(diffs) == len(cmp.result["differences"]) and set(diffs["metric"]) == {"accuracy", "ECE"}
    for d, (_, row) in zip(cmp.result["differences"], diffs.iterrows()):
        lo, hi = d["ci"]
        assert (row["reading"] == "a is higher") == (lo > 0) and (row["reading"] == "a is lower") == (hi < 0)
        assert row["reading"].startswith("not distinguishable at n = 16") == (lo <= 0 <= hi)
        assert (row["McNemar p"] == "") == (d["metric"] != "accuracy")
    assert set(table["task"]) == {"movies", "amazon"}
    # the test examples on which the graft decides unlike FT, each with both decisions
    ours = [d for d in cmp.result["disagreements"] if d["model"] == region]
    assert len(unlike) == len(cmp.result["disagreements"]) == len(ours)  # the region's, not the baselines'
    assert all(row["FT says"] != row["graft says"] for _, row in unlike.iterrows())
    agree = next(r["agreement_with_ft"] for r in cmp.result["rows"] if r["model"] == region and r["task"] == "movies")
    assert len(ours) == round((1 - agree) * 16) and (not ours or f"{len(ours)} of 16" in unlike_note)
    prd = finish(forms.submit_predict(runner, region_ids=[region], text="a great film\n\n   \nawful, dull"))
    frame, hidden = compare.render_predict(prd)
    assert hidden["visible"] is False  # no probe map asked for: no plot
    assert list(frame["sentence"]) == ["1. a great film", "2. awful, dull"]  # blank lines are not sentences
    assert list(frame.columns) == ["sentence", "fine-tuned", region, "pre-trained body + FT head"]  # side by side
    names = "|".join(prd.result["label_names"])
    assert all(re.fullmatch(rf"({names}) \d+\.\d%", c) for c in frame["fine-tuned"])
    assert all(re.fullmatch(rf"({names}) \d+\.\d%( ≠ FT)?", c) for c in frame[region])
    probe = finish(forms.submit_predict(runner, region_ids=[region], text="a great film", knockout=True,
                                        by="one module type at a time"))
    frame, _ = compare.render_predict(probe)  # FT without the region, and each module type of it alone, side by side
    parts = [c for c in frame.columns if c.startswith(f"{region} · ") and c.endswith(" only")]
    assert f"fine-tuned − {region}" in frame.columns and parts, list(frame.columns)
    assert all(re.fullmatch(rf"({names}) \d+\.\d%( ≠ FT)?", frame[c][0]) for c in [f"fine-tuned − {region}", *parts])
    mapped = finish(forms.submit_predict(runner, region_ids=[region], text="a great film", by="layer × module map"))
    frame, plot = compare.render_predict(mapped)  # the table as ever, and the map under it
    assert list(frame.columns) == ["sentence", "fine-tuned", region, "pre-trained body + FT head"]
    assert plot["visible"] and [t.type for t in plot["value"].data] == ["heatmap", "heatmap"]
    assert mapped.result["parts"] and mapped.title.endswith("(by cell)")
    with pytest.raises(RequestError, match="type one or more sentences"):
        forms.submit_predict(runner, region_ids=[region], text=" \n ")
    bad = runner.wait(forms.submit_compare(runner, region_ids=[learned.result["region"]], ood=["bbc"], n=16,
                                             baselines=False).id, timeout=240)
    assert bad.status == "failed" and "bbc" in bad.error and "same labels" in bad.error  # the CLI says the same

    cps = finish(forms.submit_compose(runner, region_ids=ids, resolve="mean", n=16))
    report, frame = compose.render_compose(cps)
    assert "Union graft" in report and set(frame["task"]) == {"movies", "amazon"} and len(frame) == 6
    union = regions.load(store.region_path(cps.result["region"]))
    assert union.is_patch and union.meta["request"]["verb"] == "compose"

    exp = finish(forms.submit_export(runner, region_id=learned.result["region"]))
    with zipfile.ZipFile(exp.result["zip"]) as z:
        assert {"config.json", "model.safetensors", "graftui_region.json"} <= set(z.namelist())
        assert json.loads(z.read("graftui_region.json"))["export_request"]["verb"] == "export"
    assert regions.load(store.region_path(learned.result["region"])).is_patch


def test_small_shares_stay_visible():
    from graftui.ui.tables import share

    assert share(770 / 22_713_986) == "0.0034%"
    assert share(0.4752) == "47.52%" and share(0) == "0.00%"


def test_laboratory_panels_render_results_with_every_value():
    from types import SimpleNamespace

    from graftui.ui.tabs import laboratory

    res = {"tasks": ["movies", "bbc"], "forget_free": [[0.7, None], [0.7, 0.9]], "sequential": [[0.72, None], [0.55, 0.91]],
           "trained": {"forget-free": [100, 80], "sequential": [1000, 1000]}}
    fig, shown = laboratory.render_continual(SimpleNamespace(result=res))
    table = shown["value"]
    assert len(table) == 6 and list(table["accuracy"]) == ["0.700", "0.700", "0.900", "0.720", "0.550", "0.910"]
    assert shown["label"] == laboratory.CONTINUAL_TABLE
    over = laboratory.render_continual(SimpleNamespace(result={**res, "seeds": [0, 1]}))[1]
    assert over["label"].endswith("(mean over seeds 0, 1; Download has each seed's own)")
    assert [t.y for t in fig.data if t.name == "movies · sequential"][0] == (0.72, 0.55)
    mt = {"tasks": ["a", "b"], "k": 5, "checkpoint": "/x/mt", "overlap": [[1, 0.2], [0.4, 1]], "intersection_counts": [[5, 1], [1, 5]],
          "sizes": [5, 5], "relative_gain": [[1.0, None], [0.5, 0.9]], "scores": [[0.9, 0.5], [0.7, 0.8]],
          "p_zero": [0.5, 0.5], "p_one": [0.9, 0.8], "union": {"group": ["a", "b"], "size": 9, "accuracy": [0.8, 0.7],
                                                            "relative_gain": [0.75, 0.6667]}, "purified": {}, "notes": []}
    overlap, gain, union, note = laboratory.render_multitask(SimpleNamespace(result=mt))
    assert list(union["relative gain"]) == ["0.750", "0.667"] and "k = **5**" in note
    assert gain.data[0].text[0] == ["1.00", "–"]


def test_a_running_jobs_figures_are_throttled_but_never_left_stale():
    from graftui.ui.wiring import LIVE_REDRAW_SECONDS as T
    from graftui.ui.wiring import panel_changes

    lst, job = ("listing",), ("j1", "running")
    new_list, new_line, redraw, s = panel_changes(None, lst, job, (1,), True, 0.0)
    assert new_list and new_line and redraw
    assert panel_changes(s, lst, job, (1,), True, 1.0)[:3] == (False, False, False)  # nothing new
    new_list, new_line, redraw, s = panel_changes(s, lst, job, (2,), True, 1.0)  # progress: line now, figures later
    assert (new_list, new_line, redraw) == (False, True, False)
    new_list, new_line, redraw, s = panel_changes(s, lst, job, (2,), True, T - 0.5)  # quiet, still too soon
    assert (new_line, redraw) == (False, False)
    new_list, new_line, redraw, s = panel_changes(s, lst, job, (2,), True, T + 0.5)  # the held-back change is drawn
    assert (new_line, redraw) == (False, True)
    assert panel_changes(s, lst, job, (2,), True, 3 * T)[2] is False  # drawn once, not again
    done = ("j1", "done")
    assert panel_changes(s, ("listing", "done"), done, (3,), False, T + 1.0)[:3] == (True, True, True)  # stops: at once


def test_a_shown_job_puts_its_own_settings_into_the_form():
    import math
    from types import SimpleNamespace

    from graftui.ui import wiring

    job = SimpleNamespace(params={"verb": "localize", "method": "random", "sparsity": 1e-3, "k": None, "steps": 7,
                                  "examples_per_class": 16, "lr": 0.5})
    method, budget, steps, epc, lr, seeds, keep = wiring.job_form("localize", job)
    assert seeds == wiring.gr.skip() and keep == wiring.gr.skip()  # one run, a fixed budget: the boxes keep theirs
    assert wiring.job_form("localize", SimpleNamespace(params={**job.params, "keep": 0.9}))[6]["value"] == 0.9
    assert wiring.job_form("localize", SimpleNamespace(params={**job.params, "seeds": [0, 2]}))[5]["value"] == "0, 2"
    assert method["value"] == "random" and budget["value"] == pytest.approx(math.log10(1e-3)) and steps["value"] == 7
    assert epc["value"] == 16 and lr["value"] == 0.5
    regions, n, baselines = wiring.job_form("compare", SimpleNamespace(params={"verb": "evaluate", "regions": ["/x/a.safetensors"],
                                                                             "n": None, "baselines": True}))
    assert regions["value"] == ["a"] and n == wiring.gr.skip() and baselines["value"] is True
    # the prepare job has no request: the form is left as it is
    assert all(u == wiring.gr.skip() for u in wiring.job_form("finetune", SimpleNamespace(params={"kind": "prepare"})))


def test_a_bundle_offered_under_one_job_is_withdrawn_when_another_job_is_shown(home, monkeypatch):
    from graftui.ui import app, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    for prefix in ("compare", "localize", "sweep", "lab-wise"):
        picker, file = by_id[f"{prefix}-job"], by_id[f"{prefix}-report-file"]
        fns = [fn for fn in demo.fns.values() if any(t[0] == picker._id and t[1] == "change" for t in fn.targets)
               and file in fn.outputs]
        assert len(fns) == 1, prefix
        update = fns[0].fn(None, "some-job")  # the session id, then the picked job
        assert update["value"] is None and update["visible"] is False


def test_the_built_defaults_are_listed_once_by_their_names(home):
    from graftui.config import DEFAULT_FINETUNED_REFS, default_checkpoint_dir
    from graftui.ui import store

    for key in DEFAULT_FINETUNED_REFS:
        folder = default_checkpoint_dir(key)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    values = [value for _, value in store.checkpoint_choices()]
    assert values == list(DEFAULT_FINETUNED_REFS)  # not once more as their cache folders


def test_user_text_is_shown_as_text_and_a_hosted_page_names_no_server_path(home, monkeypatch):
    import json

    from graftui.tasks.classification.data import Split, Task
    from graftui.ui import app, forms, store

    split = Split(("a", "b"), (0, 1))
    task = Task("<img src=x onerror=alert(1)>.csv", ("<b>neg</b>", "pos"), {"train": split, "validation": split,
                                                                          "test": split}, "local file /srv/x.csv",
                notes=("<script>1</script>",))
    text = forms.task_summary(task)
    assert "<img" not in text and "<b>" not in text and "<script>" not in text and "&lt;b&gt;neg" in text
    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    assert "/srv/x.csv" not in forms.task_summary(task)  # an upload's place on the server is not the page's
    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    config = json.dumps(app.build_app().get_config_file(), default=str)
    assert str(home) not in config and "/work" not in config


# -- the page tells the truth at a glance -------------------------------------------------------------
def _handler(demo, name: str):
    """The function wired to a page event under ``name`` (the session id first, then its inputs)."""
    return next(fn for fn in demo.fns.values() if fn.name == name)


def test_a_running_jobs_line_shows_its_step_and_the_time_left_at_its_measured_pace():
    from graftui.jobs import Job
    from graftui.ui import jobwords

    # loading took 30 s before the first step; then 2 s a step: 28 steps left → 56 s, not (30 + 22) / 12 × 28
    steps = [{"stage": "mask learning", "step": i, "steps": 40, "time": 30.0 + 2 * (i - 1)} for i in range(1, 13)]
    job = Job("j1", "localize", "Localize x", {}, status="running", progress=steps, fraction=0.3, message="mask learning")
    line = jobwords.job_status_line(job)
    assert "step 12/40, about 56 s left" in line, line
    assert jobwords.step_progress(job) == (12, 40, pytest.approx(56.0))
    one = Job("j2", "localize", "x", {}, status="running", progress=steps[:1], message="mask learning")
    assert "step 1/40" in jobwords.job_status_line(one) and "left" not in jobwords.job_status_line(one)  # no pace yet
    moved_on = Job("j3", "sweep", "x", {}, status="running", progress=steps, message="evaluating on movies")
    assert "step" not in jobwords.job_status_line(moved_on)  # its stage has no steps: an old step is not shown
    said = Job("j4", "retrain", "x", {}, status="running", message="training the graft: step 12/40",
               progress=[{**p, "stage": "training the graft: step 12/40"} for p in steps])
    assert jobwords.job_status_line(said).count("step 12/40") == 1  # the stage says it already: said once
    slow = Job("j5", "finetune", "x", {}, status="running", message="mask learning",
               progress=[{**p, "time": 60.0 * p["step"]} for p in steps])
    assert "about 28 min left" in jobwords.job_status_line(slow)


def test_a_waiting_job_shows_its_place_in_the_queue(tmp_path):
    from graftui.jobs import JobRunner
    from graftui.ui import jobwords

    runner = JobRunner(tmp_path / "jobs")
    release, started = threading.Event(), threading.Event()
    try:
        running = runner.submit("localize", "runs", lambda ctx: started.set() or release.wait(30) and {})
        first = runner.submit("compare", "waits first", lambda ctx: {})
        second = runner.submit("compare", "waits second", lambda ctx: {})
        started.wait(10)  # it runs (its status is set before its function is called); the others wait
        assert "queued · next in the queue" in jobwords.job_line(runner, first)
        assert "queued · place 2 in the queue" in jobwords.job_line(runner, second)
        rows = {r["id"]: r for r in jobwords.job_rows(runner).to_dict("records")}
        assert rows[second.id]["progress"] == "place 2 in the queue · start unknown (a job before it has no expected length)"
        before = jobwords.job_signature(runner)
        runner.cancel(first.id)
        assert jobwords.job_signature(runner) != before  # the table follows the queue
        assert "next in the queue" in jobwords.job_line(runner, runner.get(second.id))
    finally:
        release.set()


def test_the_jobs_table_gives_a_running_job_its_time_left_and_a_waiting_one_its_start_and_end(tmp_path):
    from graftui.jobs import JobRunner
    from graftui.ui import jobwords

    runner = JobRunner(tmp_path / "jobs")
    release, started = threading.Event(), threading.Event()
    try:
        running = runner.submit("localize", "runs", lambda ctx: started.set() or release.wait(30) and {}, estimate=600)
        assert started.wait(10)  # it holds the lane before the shorter job comes (which would otherwise go first)
        waiting = runner.submit("finetune", "waits", lambda ctx: {}, estimate=300)
        rows = {r["id"]: r for r in jobwords.job_rows(runner).to_dict("records")}
        assert rows[running.id]["progress"].startswith("0 % · about 10 min left"), rows[running.id]
        assert rows[waiting.id]["progress"].startswith("next in the queue · starts in about 10 min, ends in about 15"), \
            rows[waiting.id]
    finally:
        release.set()


def test_a_reloaded_page_says_which_job_runs_and_then_how_it_ended(home, monkeypatch):
    from graftui.ui import app, jobwords, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()
    load = _handler(demo, "on_load")
    assert load.fn("")[0].startswith("Ready.")
    release, started = threading.Event(), threading.Event()
    job = store.runner().submit("localize", "Localize 'movies' slowly",
                                lambda ctx: started.set() or release.wait(30) and {})
    waiting = store.runner().submit("compare", "Compare later", lambda ctx: {})
    try:
        started.wait(10)  # it runs (its status is set before its function is called)
        banner, _, announced = load.fn("")
        assert "Ready" not in banner and f"Running: **Localize 'movies' slowly** (job {job.id})" in banner, banner
        assert "1 more job(s) waiting" in banner and announced == job.id
        assert jobwords.settled_banner(announced) is None  # while it runs, the banner stays
        assert "when this page opened" in banner  # how far it was then, said as such: it does not follow the job
    finally:
        release.set()
    store.runner().runner.wait(job.id, 30)
    store.runner().runner.wait(waiting.id, 30)
    assert f"(job {job.id}) ended: done" in jobwords.settled_banner(announced)


def test_an_error_in_the_header_is_cleared_by_the_next_success_on_any_tab(home, monkeypatch):
    import gradio as gr

    from graftui.ui import app, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()
    compare, overlap = _handler(demo, "on_compare"), _handler(demo, "on_overlap")
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    status, flag = by_id["status-message"], compare.outputs[-1]
    assert isinstance(flag, gr.State) and overlap.outputs[-1] is flag  # one flag per page, read and written by both

    failed = compare.fn("", [], [], "", 10, True, False)  # the Compare tab: no region picked
    assert failed[status].startswith("⚠️ pick at least one region") and failed[flag] is True
    cleared = overlap.fn("", [], "overlap", True)  # then a success on the Compose tab, which writes no message
    assert cleared[overlap.outputs.index(status)] == "" and cleared[-1] is False
    kept = overlap.fn("", [], "overlap", False)  # with no error shown, the line (a banner, say) is left alone
    assert kept[overlap.outputs.index(status)] == gr.skip() and kept[-1] == gr.skip()


def test_web_errors_name_the_widget_not_the_cli_flag(home, monkeypatch):
    from types import SimpleNamespace

    from graftui.errors import RequestError
    from graftui.ui import app, store
    from graftui.ui.wiring import friendly_message, in_words

    steps = SimpleNamespace(label="Mask steps")
    assert in_words("--steps must be at least 1, got 0", {"steps": steps}) == "Mask steps must be at least 1, got 0"
    assert in_words("--purify-steps must be 0 or more") == "Purify steps must be 0 or more"  # no widget: in words
    assert in_words("the region names no fine-tuned model; give --finetuned REF",
                    {"finetuned": SimpleNamespace(label="Fine-tuned model θ_ft")}) == \
        "the region names no fine-tuned model; give Fine-tuned model θ_ft"
    assert in_words("--group: 'x' is not one of --tasks (a, b)", {"tasks": "Tasks", "group": "Union (empty: all)"}) == \
        "Union: 'x' is not one of Tasks (a, b)"
    assert in_words("a pre--trained 'my--file.csv'") == "a pre--trained 'my--file.csv'"  # not flags
    assert friendly_message(RequestError("--n must be at least 1, got 0")) == "N must be at least 1, got 0"

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()
    localize = _handler(demo, "on_localize")
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    out = localize.fn("", "minilm", "minilm-movies", "movies", "(guess)", "(none)", "(guess)", "learned", -3, 0, 8, 0.02,
                      "auto", "", "", "", 0, False)
    assert out[by_id["status-message"]] == "⚠️ Mask steps must be at least 1, got 0"
    assert out[by_id["localize-status"]] == "⚠️ Mask steps must be at least 1, got 0"  # beside the button too
    out = localize.fn("", "minilm", "minilm-movies", "movies", "(guess)", "(none)", "(guess)", "learned", -3, 5, 8, 0.02,
                      "auto", "", "", "0, -1", 0, False)
    assert out[by_id["status-message"]] == "⚠️ Seeds: every seed is a whole number &gt;= 0, got -1"  # Markdown shows ">"
    out = localize.fn("", "minilm", "minilm-movies", "movies", "(guess)", "(none)", "(guess)", "learned", -3, 5, 8, 0.02,
                      "auto", "", "", "", 1.5, False)
    assert out[by_id["status-message"]] == ("⚠️ Size the skill needs: keep this share of the gain must be a share in "
                                            "(0, 1], e.g. 0.9 for 90 % of what fine-tuning gained; got 1.5")
    multitask = _handler(demo, "on_multitask")
    out = multitask.fn("", ["movies", "amazon"], [], -3, "empty", 5, -1, 10, "", False)
    assert out[by_id["status-message"]] == "⚠️ Purification steps must be 0 or more, got -1"
    out = multitask.fn("", ["movies", "amazon"], [], -3, "empty", 5, 0, 10, "0, -2", False)
    assert out[by_id["status-message"]] == "⚠️ Seeds: every seed is a whole number &gt;= 0, got -2"


def test_the_laboratory_shows_its_findings_in_tables():
    from types import SimpleNamespace

    from graftui.ui.tabs import laboratory

    rows = [{"curve": c, "alpha": a, "task": t, "distribution": "in" if t == "movies" else "OOD", "n": 10,
             "accuracy": acc, "ece": 0.1} for c in ("WiSE-FT", "WiSE-graft") for a in (0.0, 1.0)
            for t, acc in (("movies", 0.5 + a / 4), ("amazon", 0.6))]
    plot, table = laboratory.render_wise(SimpleNamespace(result={"rows": rows}))
    assert list(table.columns) == ["α", "curve", "task", "accuracy ↑", "ECE ↓"] and len(table) == 8
    assert table.iloc[0].tolist() == ["0", "WiSE-FT", "movies", "50.0%", "0.100"]  # both curves side by side at each α
    assert table.iloc[1]["curve"] == "WiSE-graft" and table.iloc[2]["task"] == "amazon (OOD)"
    assert table.iloc[4].tolist() == ["1", "WiSE-FT", "movies", "75.0%", "0.100"]

    def row(model, acc, size=None):
        return {"model": model, "task": "movies", "distribution": "in", "n": 100, "accuracy": acc, "f1": 0.5, "ece": 0.05,
                "confidence": acc + 0.2, "agreement_with_ft": 0.9, "region_size": size}

    res = {"rows": [row("fine-tuned", 0.9), row("pre-trained body + FT head", 0.5), row("graft", 0.8, 10),
                    row("re-trained graft", 0.7, 10), row("BitFit (biases)", 0.5, 20)],
           "reliability": {}, "task": "movies"}
    table, _ = laboratory.render_retrain(SimpleNamespace(result=res))
    gains = dict(zip(table["model"], table["share of FT gain"]))
    assert gains["graft"] == "75.0%" and gains["re-trained graft"] == "50.0%" and gains["BitFit (biases)"] == "0.0%"
    assert set(table["calibration"]) == {"over-confident"}  # mean confidence 20 points above accuracy
    assert "fine-tuning learning rate" in laboratory.RETRAIN_NOTE and "bare" in laboratory.RETRAIN_NOTE


def test_the_laboratory_fields_are_kept_across_reloads(home, monkeypatch):
    from graftui.ui import app, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()
    remember = next(fn for fn in demo.fns.values() if isinstance(fn.js, str) and "setItem" in fn.js)  # in the browser
    kept = {b.elem_id for b in remember.inputs}
    lab = {"lab-tasks", "lab-group", "lab-start", "lab-budget", "lab-steps", "lab-purify", "lab-n", "lab-wise-region",
           "lab-wise-alphas", "lab-wise-n", "lab-retrain-region", "lab-retrain-epochs", "lab-retrain-train",
           "lab-retrain-n", "lab-continual-tasks", "lab-continual-budget", "lab-continual-n", "lab-reproduce-quick"}
    assert lab <= kept, lab - kept
    restore = _handler(demo, "restore")
    assert [b.elem_id for b in restore.outputs] == [b.elem_id for b in remember.inputs]
    assert "sessionStorage" in remember.js and "sessionStorage" in restore.js  # each browser tab its own form


def test_number_columns_are_never_wrapped():
    from graftui.ui import app, tables

    css = app.launch_options()["css"]
    at = tables.COMPARE_COLUMNS.index("accuracy ↑ [95 % CI]")
    assert f'#compare-table [role=gridcell][data-col="{at}"] span' in css
    assert f"#compare-table .sizing-body td:nth-child({at + 1})" in css
    assert '#compare-table [role=gridcell][data-col="0"]' not in css  # model names wrap
    assert '#region-list [role=gridcell][data-col="8"]' in css  # created (UTC)
    assert all(elem_id in css for elem_id in app.TABLES)
    assert ".gradio-container " not in css  # Gradio scopes every rule itself: a rule starting with it matches nothing


def test_the_differences_table_reads_replicate_groups_over_seeds():
    from graftui.ui.tables import differences_table

    one = {"a": "r", "b": "fine-tuned", "task": "movies", "distribution": "in", "metric": "accuracy", "diff": 0.032,
           "ci": [0.009, 0.054], "n": 500, "p": 0.0123}
    group = {**one, "a": "r (seeds 0, 1, 2)", "metric": "ece", "diff": -0.004, "diff_std": 0.002, "ci": [-0.02, 0.01],
             "p": None, "seeds": 3}
    table = differences_table({"differences": [one], "replicates": [{"name": "r (seeds 0, 1, 2)", "differences": [group]}]})
    first, second = table.iloc[0], table.iloc[1]
    assert first["difference [95 % CI]"] == "+3.2 pts [+0.9, +5.4]" and first["McNemar p"] == "0.0123"
    assert first["reading"] == "a is higher"
    assert second["difference [95 % CI]"] == "−0.004 ± 0.002 (3 seeds) [−0.020, +0.010]"
    assert second["reading"] == "not distinguishable across 3 seeds" and second["McNemar p"] == ""


def test_the_try_box_shows_each_models_generation_for_a_completion_region():
    """A completion region's predict result (kind "completion": one prompt, a generation per model) is drawn as one
    row per model with its generation; a classification result keeps its class columns."""
    from graftui.ui import tables
    from graftui.ui.tabs import compare

    result = {"kind": "completion", "task": "dates", "texts": ["Q: the day after Monday?\nA:"], "rows": [
        {"text": 0, "model": "pre-trained", "generation": "Sunday", "agrees_with_ft": False},
        {"text": 0, "model": "fine-tuned", "generation": "Tuesday", "agrees_with_ft": None},
        {"text": 0, "model": "dates-learned-k9", "generation": "Tuesday", "agrees_with_ft": True}]}
    frame = tables.predict_table(result)
    assert list(frame.columns) == tables.GENERATION_COLUMNS
    assert frame.values.tolist() == [
        ["Q: the day after Monday?\nA:", "pre-trained", "Sunday", "no"],
        ["Q: the day after Monday?\nA:", "fine-tuned", "Tuesday", ""],
        ["Q: the day after Monday?\nA:", "dates-learned-k9", "Tuesday", "yes"]]

    drawn, plot = compare.render_predict(type("Job", (), {"result": result})())
    assert drawn.equals(frame) and plot["visible"] is False
    # a classification result: one row per sentence, the models side by side (FT first, the bare body last)
    rows = [{"text": t, "model": m, "probs": {}, "predicted": c, "confidence": p, "agrees_with_ft": same}
            for t, m, c, p, same in ((0, "pre-trained body + FT head", "neg", 0.6, False), (0, "fine-tuned", "pos", 0.8,
                                     None), (0, "r1", "pos", 0.7, True), (1, "fine-tuned", "neg", 0.9, None),
                                     (1, "r1", "pos", 0.55, False), (1, "pre-trained body + FT head", "neg", 0.5, True))]
    classified = tables.predict_table({"label_names": ["neg", "pos"], "texts": ["fine", "dull"], "rows": rows})
    assert list(classified.columns) == [*tables.PREDICT_COLUMNS, "fine-tuned", "r1", "pre-trained body + FT head"]
    assert classified.values.tolist() == [["1. fine", "pos 80.0%", "pos 70.0%", "neg 60.0% ≠ FT"],
                                          ["2. dull", "neg 90.0%", "pos 55.0% ≠ FT", "neg 50.0%"]]
    # a probe by layer × module: the table as before, and the map's two heatmaps beside it
    part = {"text": 0, "layer": "layer 0", "module": "query", "part": "layer 0 · Query", "k": 12, "graft_p": 0.7,
            "graft_delta": 0.1, "graft_answer": "pos", "graft_flips": False, "knockout_p": 0.3,
            "knockout_delta": -0.5, "knockout_answer": "neg", "knockout_flips": True}
    mapped = {"label_names": ["neg", "pos"], "texts": ["fine", "dull"], "rows": rows, "parts": [part],
              "answers": [{"text": 0, "answer": "pos", "measure": "p", "ft_p": 0.8, "pre_p": 0.6, "pre_answer": "pos"}]}
    table, plot = compare.render_predict(type("Job", (), {"result": mapped})())
    assert table.equals(classified) and plot["visible"] is True
    assert [t.type for t in plot["value"].data] == ["heatmap", "heatmap"]
    assert [list(t.text[0]) for t in plot["value"].data] == [[""], ["×"]]  # the knockout flips the answer


def test_the_try_box_is_one_prompt_for_completion_regions_and_sentences_otherwise(home, monkeypatch):
    """For completion regions the whole box is one prompt (its lines kept) and the box, its button and the table say
    Prompt / Generate; for classification regions it is one sentence per line; both kinds at once: one line."""
    from graftui.errors import RequestError
    from graftui.ui import forms, store
    from graftui.ui.tabs import compare

    kinds = {"gen": "completion", "cls": "classification"}
    monkeypatch.setattr(store, "region_kinds", lambda ids: [kinds[i] for i in ids])
    monkeypatch.setattr(forms, "_paths", lambda ids, at_least=1: [f"/regions/{i}.safetensors" for i in ids])

    class Runner:  # what the button's handler hands on: the request and its title
        params = title = None

    runner = Runner()

    def submit(runner, request, title, **lane):
        runner.params, runner.title = request.as_dict(), title
        return "job"

    monkeypatch.setattr(forms, "submit", submit)
    forms.submit_predict(runner, region_ids=["gen"], text="  Q: the day after Monday?\nA:  \n")
    assert runner.params["texts"] == ["Q: the day after Monday?\nA:"] and "prompt" in runner.title
    forms.submit_predict(runner, region_ids=["cls"], text="a fine film\n\nawful")
    assert runner.params["texts"] == ["a fine film", "awful"] and not runner.params["knockout"] and not runner.params["by"]
    forms.submit_predict(runner, region_ids=["cls"], text="a fine film", knockout=True, by="one layer at a time")
    assert runner.params["knockout"] and runner.params["by"] == "layer" and "(knockout, by layer)" in runner.title
    forms.submit_predict(runner, region_ids=["cls"], text="a fine film", by="whole")
    assert runner.params["by"] is None
    with pytest.raises(RequestError, match="type a prompt"):
        forms.submit_predict(runner, region_ids=["gen"], text=" \n ")
    with pytest.raises(RequestError, match="pick regions of one kind") as err:
        forms.submit_predict(runner, region_ids=["gen", "cls"], text="x")
    assert "\n" not in str(err.value)
    assert compare.predict_kind_or_default(["gen"]) == "completion"
    assert compare.predict_kind_or_default(["gen", "cls"]) == compare.predict_kind_or_default([]) == "classification"
    assert forms.PREDICT_WORDS["completion"][:2] == ("Prompt (the whole box is one prompt)", "Generate")


def test_a_confirm_button_confirms_only_its_own_target_and_expires_after_its_window():
    from graftui.ui import jobwords

    armed, window = ("job1", 100.0), jobwords.CONFIRM_SECONDS
    assert jobwords.still_armed(armed, "job1") and not jobwords.still_armed(armed, "job2")
    assert not jobwords.still_armed(None, "job1") and not jobwords.still_armed(("job1", None), "job1")
    assert not jobwords.expired(armed, 100.0 + window) and jobwords.expired(armed, 100.0 + window + 0.1)
    assert not jobwords.expired(None, 1e9) and not jobwords.expired("job1", 1e9)  # nothing armed: nothing to undo


def test_compare_follows_the_regions_picked_not_the_models_tab(home, monkeypatch, tmp_path):
    """A completion region is never sent with the Models tab's OOD tasks, and picking another pair drops the regions
    of the last one."""
    from types import SimpleNamespace

    from graftui.ui import forms, store

    entries = [SimpleNamespace(id="dates-r", meta=SimpleNamespace(finetuned="smollm2-dates")),
               SimpleNamespace(id="movies-r", meta=SimpleNamespace(finetuned="minilm-movies"))]
    monkeypatch.setattr(store, "list_regions", lambda: entries)
    assert forms.of_pair(["dates-r", "movies-r", "gone"], "minilm-movies") == ["movies-r"]
    (tmp_path / "ft").mkdir()
    (tmp_path / "ft" / "config.json").write_text("{}")  # a checkpoint folder, named two ways
    assert forms.same_model(f"{tmp_path}/../{tmp_path.name}/ft", str(tmp_path / "ft")) and not forms.same_model("smollm2-dates", "minilm-movies")

    sent = {}
    monkeypatch.setattr(forms, "_paths", lambda ids, at_least=1: [f"/r/{i}.safetensors" for i in ids])
    monkeypatch.setattr(forms, "submit", lambda runner, request, title, kind=None: sent.update(r=request, t=title))
    for kinds, ood in ((["completion"], []), (["classification"], ["amazon"]), (["completion", "classification"],
                                                                              ["amazon"])):
        monkeypatch.setattr(store, "region_kinds", lambda ids, kinds=kinds: kinds)
        forms.submit_compare(None, region_ids=["x"] * len(kinds), ood=["amazon"], n=10, baselines=False,
                               ood_labels="0:0")
        assert sent["r"].ood == ood and ("OOD" in sent["t"]) == bool(ood)


def test_the_training_sample_is_counted_as_the_tasks_kind_counts_it():
    """'per class' only where the task has classes: a completion or harness task's sample is its prompts."""
    from graftui.kinds import named_kind
    from graftui.ui.kinds import app_of

    assert app_of(named_kind("movies")).sample_label == "Training examples per class"
    for task in ("dates", "lm-eval:graftui_dates"):
        assert "per class" not in app_of(named_kind(task)).sample_label


def test_the_fine_tune_form_sends_a_lora_rank_and_names_the_adapter_apart(home, monkeypatch):
    """The app's Fine-tune form trains a LoRA adapter when given a rank (the CLI's --lora-rank): its request carries
    the rank, its checkpoint and title say LoRA, so the adapter is never named like a whole fine-tune of that task."""
    from graftui.ui import forms

    sent = {}
    monkeypatch.setattr(forms, "submit", lambda runner, request, title, made=None: sent.update(r=request, t=title))
    for rank in (0, 8):
        forms.submit_finetune(None, base="smollm2", task="dates", columns={}, optimizer="adamw", lr=1e-3, epochs=1,
                              train_examples=0, l1=0, lora_rank=rank)
        assert sent["r"].lora_rank == rank and ("LoRA rank 8" in sent["t"]) == bool(rank)
        assert ("-lora8-" in sent["r"].out) == bool(rank), sent["r"].out


def test_the_generations_of_many_models_share_the_rows_width():
    """One model's long generation (a baseline's babble) is cut to its share of the row, so the other models'
    columns stay on the screen; two models keep the full width."""
    from graftui.ui import tables

    def result(models):
        babble = "word " * 100
        return {"rows": [{"model": m} for m in models], "generations": [{
            "task": "dates", "prompt": "Date: 2019-07-04\nIn words:", "reference": " July 4, 2019",
            **{m: babble for m in models}, "answer": {m: babble for m in models},
            "exact": {m: False for m in models}, "contains": {m: False for m in models}}]}

    many = ["fine-tuned", "r1", "r2", "top-movement", "random", "pre-trained, same prompt"]
    for models, width in ((many[:2], tables.GENERATION_WIDTH), (many, tables.GENERATIONS_ROOM // 6)):
        shown = tables.generations_table(result(models))
        cells = [str(shown.iloc[0][m]) for m in models]
        assert tables.generation_width(len(models)) == width
        assert all(len(c) <= 2 * (width + 1) + 8 for c in cells), [len(c) for c in cells]  # the answer, the generation
    assert sum(len(c) for c in cells) <= 2 * tables.GENERATIONS_ROOM + 60


def test_a_seeds_runs_core_and_union_are_scored_beside_its_seeds_with_one_button(home, monkeypatch):
    """The button under a finished seeds run compares each seed's region, the core and the union (the comparison
    the run's card otherwise leaves to a command); it shows only for such a job, and any other job is one line."""
    from graftui import sets
    from graftui.errors import RequestError
    from graftui.jobs import Job
    from graftui.ui import forms, store
    from graftui.ui.tabs import localize

    monkeypatch.setattr(store, "region_path", lambda rid: Path(f"/regions/{rid}.safetensors"))
    sent = {}

    def submit(runner, request, title, kind=None):
        sent.update(regions=request.regions, title=title, kind=kind, n=request.n, no_ood=request.no_ood)
        return "job"

    monkeypatch.setattr(forms, "submit", submit)
    result = {"seeds": [{"seed": s, "region": f"r-seed{s}"} for s in (0, 1, 2)],
              "stability": {**sets.stability([{"w": torch.tensor(idx)} for idx in ([0, 1, 2], [1, 2, 3], [2, 3, 4])], 100),
                            "core_path": "/regions/r-core.safetensors", "union_path": "/regions/r-union.safetensors"}}
    done = Job(id="a", kind="localize", title="t", params={}, status="done", result=result)
    assert forms.submit_seed_regions(None, done) == "job"
    assert sent == {"regions": [f"/regions/r-{n}.safetensors" for n in ("seed0", "seed1", "seed2", "core", "union")],
                    "title": "Compare the core and union of 3 seeds", "kind": "compare",
                    "n": store.defaults()["test_examples"], "no_ood": True}  # a shared server asks for an n
    assert localize.render_localize(done)[2]["visible"] is True
    one = Job(id="b", kind="localize", title="t", params={}, status="done", result={"seeds": [], "stability": None})
    running = Job(id="c", kind="localize", title="t", params={}, status="running", result=None)
    for job in (one, running, None):
        with pytest.raises(RequestError, match="pick a finished localize job of two or more seeds"):
            forms.submit_seed_regions(None, job)
        assert localize.render_localize(job)[2]["visible"] is False


# -- confirm buttons: a press and the pick before it, answered in either order ------------------------
def _events(demo, elem_id: str, trigger: str) -> list:
    """The app's handlers of ``trigger`` on the widget ``elem_id``."""
    block = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)
    return [fn for fn in demo.fns.values() if (block._id, trigger) in [tuple(t) for t in fn.targets]]


def _answer(fn, values: dict) -> None:
    """Run ``fn`` as Gradio does, on the page's current ``values`` (block id -> value), and write its answer back:
    a skip leaves a value as it is, an update sets the value it names."""
    import gradio as gr

    got = fn.fn(*[values.get(b._id) for b in fn.inputs])
    if isinstance(got, dict) and "__type__" not in got:  # {component: value}: what a failed handler answers
        got = [got.get(b, gr.skip()) for b in fn.outputs]
    elif not (isinstance(got, (tuple, list)) and len(fn.outputs) > 1):
        got = (got,)
    for block, value in zip(fn.outputs, got):
        if isinstance(value, dict) and value.get("__type__") == "update":
            if "value" in value:
                values[block._id] = value["value"]
        elif not (isinstance(value, dict) and value == gr.skip()):
            values[block._id] = value


def _confirm_pair(demo, button: str, picker: str):
    """(press, picks, the button's memory, the button): the press of ``button`` and the handlers of a pick in
    ``picker`` that write the button or its memory (the memory's id names the press's queue)."""
    (press,) = _events(demo, button, "click")
    armed = demo.blocks[int(press.concurrency_id.removeprefix("confirm-"))]
    widget = next(b for b in press.outputs if getattr(b, "elem_id", None) == button)
    picks = [fn for fn in _events(demo, picker, "change") if armed in fn.outputs or widget in fn.outputs]
    return press, picks, armed, widget


def test_a_confirm_button_pressed_just_after_a_pick_stays_armed_whichever_is_answered_first(home, monkeypatch):
    """A pick's change events and a press that follows them reach the server as several events; each reads the
    button's memory when it starts. The press arms the button for what is picked in either order of answers; a pick
    of another region or job still disarms it; those that write the memory run one at a time; a poll keeps the look
    of a button armed for the job it shows; and a press confirms only where the button it pressed asked to."""
    from graftui.ui import app, store
    from graftui.ui.tabs.jobs import LABEL
    from graftui.ui.tabs.regions import DELETE

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    pair, _, _ = make_tiny_pair()
    x = store.save_region(tiny_record(pair, k=20), "region-x").stem
    y = store.save_region(tiny_record(pair, k=30), "region-y").stem
    started = threading.Event()

    def learning(ctx):  # a localization's progress, as the Localize panel draws it
        for i in range(6000):
            started.set()
            ctx.report({"step": i, "steps": 6000, "loss": 0.5, "accuracy": 0.5})
            time.sleep(0.01)
        return {}

    job = store.runner().submit("localize", "slow", learning)
    assert started.wait(5)
    demo = app.build_app()
    pressed = {}
    for button, picker, key, before, asking in (("region-delete", "regions-select", x, DELETE, f"Confirm: delete {x}"),
                                                ("jobs-cancel", "jobs-select", job.id, LABEL, "Confirm cancel"),
                                                ("localize-cancel", "localize-job", job.id, "Cancel", "Confirm cancel")):
        press, picks, armed, widget = _confirm_pair(demo, button, picker)
        writers = [fn for fn in [press, *picks] if armed in fn.outputs]
        assert len(writers) >= 2 and {(fn.concurrency_id, fn.concurrency_limit) for fn in writers} == {
            (press.concurrency_id, 1)}, button
        picker_id = next(b for b in picks[0].inputs if getattr(b, "elem_id", None) == picker)._id
        for order in ((*picks, press), (press, *picks)):
            values = {picker_id: key, armed._id: None, widget._id: before}
            for fn in order:
                _answer(fn, values)
            assert (values[armed._id] or [None])[0] == key and values[widget._id] == asking, (button, order, values)
        pressed[button] = (press, picks, armed, widget, picker_id, asking)
    press, picks, armed, widget, picker_id, asking = pressed["region-delete"]
    values = {picker_id: x, armed._id: (y, time.time()), widget._id: f"Confirm: delete {y}"}  # armed for y, x picked
    for fn in picks:
        _answer(fn, values)
    assert values[armed._id] is None and values[widget._id] == DELETE  # a press must name x first
    values = {picker_id: x, armed._id: (x, time.time()), widget._id: DELETE}  # armed, but its look went back
    _answer(press, values)
    assert (store.regions_dir() / f"{x}.safetensors").is_file() and values[widget._id] == asking  # it asks again
    _answer(press, values)
    assert not (store.regions_dir() / f"{x}.safetensors").exists() and values[widget._id] == DELETE
    assert (store.regions_dir() / f"{y}.safetensors").is_file()
    # a poll of the Localize tab (the jobs list and the Localize panel, each with a Cancel button armed for the job
    # it shows) keeps both asking
    (timer,) = [b for b in demo.blocks.values() if type(b).__name__ == "Timer" and any(
        "localize-status" == getattr(o, "elem_id", None) for fn in demo.fns.values()
        if (b._id, "tick") in [tuple(t) for t in fn.targets] for o in fn.outputs)]
    (tick,) = [fn for fn in demo.fns.values() if (timer._id, "tick") in [tuple(t) for t in fn.targets]]
    values = {}
    for button in ("jobs-cancel", "localize-cancel"):
        _, _, armed, widget, picker_id, asking = pressed[button]
        values.update({picker_id: job.id, armed._id: (job.id, time.time()), widget._id: asking})
    _answer(tick, values)
    assert [values[pressed[b][3]._id] for b in ("jobs-cancel", "localize-cancel")] == ["Confirm cancel"] * 2
    assert store.runner().get(job.id).status == "running"  # no press has cancelled anything yet
    press, _, armed, widget, picker_id, _ = pressed["jobs-cancel"]
    values = {picker_id: job.id, armed._id: (job.id, time.time()), widget._id: LABEL}  # armed, its look went back
    _answer(press, values)
    assert store.runner().get(job.id).status == "running" and values[widget._id] == "Confirm cancel"
    _answer(press, values)
    assert store.runner().runner.wait(job.id, timeout=10).status == "cancelled"


@pytest.mark.e2e
def test_the_app_resolves_transformers_names_before_any_job_thread_loads_a_model(home):
    """Two jobs whose first model loads meet resolve transformers' lazy names from two threads at once, and one was
    handed a half-made module ("cannot import name 'AutoConfig'"); building the app resolves them first, in its own
    thread (a fresh interpreter: this one has resolved them long ago)."""
    import os
    import subprocess
    import sys

    code = ("import sys, transformers; from graftui.models import WARM_NAMES; from graftui.ui import app; "
            "before = [n for n in WARM_NAMES if n in vars(transformers)]; app.build_app(); "
            "now = vars(sys.modules['transformers']); "  # the module object there now (peft's import replaces it)
            "print(len(before), sum(n in now for n in WARM_NAMES), len(WARM_NAMES))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GRAFTUI_HOME": str(home), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, names = map(int, done.stdout.split()[-3:])
    assert before < names and after == names, done.stdout


def test_every_described_endpoint_takes_the_inputs_its_description_lists(home, monkeypatch):
    """Gradio's API description leaves out a Button's value (and States, which its client fills in): an event that
    reads one cannot be called as described ("didn't receive enough input values"). Such an event is kept out of
    the description, and a described twin takes what it lists (``Page.confirm``)."""
    import gradio as gr

    from graftui.ui import app, store

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()
    described = {fn.api_name: fn for fn in demo.fns.values() if fn.api_visibility == "public"}
    for name, fn in described.items():
        unlisted = [type(b).__name__ for b in fn.inputs if b.skip_api and not isinstance(b, gr.State)]
        assert not unlisted, (name, unlisted)
    info = demo.get_api_info()["named_endpoints"]
    for name in ("on_job_cancel", "on_region_delete", "on_localize_cancel"):  # the session, then what is picked
        assert len(info[f"/{name}"]["parameters"]) == 2, (name, info[f"/{name}"]["parameters"])
        assert f"/{name}_press" not in info


def test_deleting_a_region_that_waiting_jobs_read_names_them_and_cancels_them_with_it(home, monkeypatch):
    """A comparison queued on a region would fail on its missing file once the region is deleted: the first press
    names the jobs that read it and says they go with it, the confirming press cancels them and deletes it; a job
    that reads another region is left alone."""
    from graftui.ui import app, store
    from graftui.ui.tabs.regions import DELETE

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    pair, _, _ = make_tiny_pair()
    x = store.save_region(tiny_record(pair, k=20), "region-x")
    y = store.save_region(tiny_record(pair, k=30), "region-y")
    gate, started = threading.Event(), threading.Event()
    runner = store.runner()
    blocker = runner.submit("localize", "holds the lane", lambda ctx: started.set() or gate.wait(30) and {})
    reads_x = runner.submit("compare", "Compare x", lambda ctx: {}, {"verb": "evaluate", "regions": [str(y), str(x)]})
    reads_y = runner.submit("compare", "Compare y", lambda ctx: {}, {"verb": "evaluate", "regions": [str(y)]})
    try:
        assert started.wait(5)
        assert [j.id for j in store.jobs_reading(x)] == [reads_x.id]
        press, _, armed, widget = _confirm_pair(app.build_app(), "region-delete", "regions-select")
        status = next(b for b in press.outputs if getattr(b, "elem_id", None) == "status-message")
        picker = next(b for b in press.inputs if getattr(b, "elem_id", None) == "regions-select")
        values = {picker._id: x.stem, armed._id: None, widget._id: DELETE}
        _answer(press, values)
        assert x.is_file() and f"cancels the 1 job(s) that read it: **Compare x** [{reads_x.id}]" in values[status._id]
        _answer(press, values)
        assert not x.exists() and y.is_file(), values[status._id]
        assert f"Deleted region **{x.stem}** and cancelled the 1 job(s) that read it" in values[status._id]
        assert runner.get(reads_x.id).status == "cancelled" and runner.get(reads_y.id).status == "queued"
    finally:
        gate.set()
    assert runner.wait(reads_y.id, 30).status == "done" and runner.wait(blocker.id, 30).status == "done"


def test_a_task_yaml_named_in_the_task_box_is_checked_before_any_job(home, monkeypatch, tmp_path):
    """The Models tab checks a harness task as soon as it is named, as it checks an upload: a "✓" line and its first
    test document beside the task box (and under Check column mapping); a YAML the harness refuses, its one line; a
    task of another kind is left to its columns' check."""
    from test_yaml_tasks import _yaml

    from graftui.ui import app, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    demo = app.build_app()

    def wired(elem_id, trigger, out):
        (fn,) = [fn for fn in _events(demo, elem_id, trigger) if any(getattr(b, "elem_id", None) == out
                                                                     for b in fn.outputs)]
        return fn, next(b for b in fn.inputs if getattr(b, "elem_id", None) == "models-task")._id, \
            next(b for b in fn.outputs if getattr(b, "elem_id", None) == out)._id

    named, task_id, info_id = wired("models-task", "change", "models-task-info")
    good, bad = _yaml(tmp_path / "good", "my_box"), _yaml(tmp_path / "bad", "my_broken", metric="exact_mtch")
    values = {task_id: str(good)}
    _answer(named, values)
    assert values[info_id].startswith("✓ **my_box**: generate_until task, 3 test documents scored"), values[info_id]
    assert "```\nQ: test 0\nA:\n```" in values[info_id] and "Target: ` ' test-0' `" in values[info_id]
    values[task_id] = str(bad)
    _answer(named, values)
    assert values[info_id].startswith("⚠️ ") and "metric 'exact_mtch' is none the harness knows" in values[info_id]
    assert "\n" not in values[info_id]
    values[task_id] = "movies"
    _answer(named, values)
    assert values[info_id] == ""  # a classification task: its columns are checked with the mapping

    press, task_id, mapping_id = wired("models-data-check", "click", "models-data-info")
    values = {task_id: str(good)}
    _answer(press, values)
    assert values[mapping_id].startswith("✓ **my_box**: generate_until task")


def test_compare_has_a_cancel_of_its_own_that_cancels_the_comparison_it_shows(home, monkeypatch):
    from graftui.ui import app, store

    monkeypatch.setattr(store, "default_ready", lambda key=None: True)
    gate, started = threading.Event(), threading.Event()
    runner = store.runner()
    def comparing(ctx):  # a comparison's progress, as its flow reports it
        while not gate.wait(0.02):
            started.set()
            ctx.report({"stage": "scoring", "fraction": 0.5})
        return {}

    job = runner.submit("compare", "a long comparison", comparing)
    try:
        assert started.wait(5)
        press, _, armed, widget = _confirm_pair(app.build_app(), "compare-cancel", "compare-job")
        picker = next(b for b in press.inputs if getattr(b, "elem_id", None) == "compare-job")
        values = {picker._id: "", armed._id: None, widget._id: "Cancel"}  # "latest comparison": the one running
        _answer(press, values)
        assert values[widget._id] == "Confirm cancel" and runner.get(job.id).status == "running"
        _answer(press, values)
        assert runner.wait(job.id, 30).status == "cancelled"
    finally:
        gate.set()
