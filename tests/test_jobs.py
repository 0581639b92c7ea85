"""The job runner: order, progress, cancel, clear failures, persistence across restarts."""

from __future__ import annotations

import json
import threading
import time

import pytest

from graftui.tasks.classification.data import DataError
from graftui.jobs import CANCELLED, DONE, FAILED, INTERRUPTED, QUEUED, RUNNING, JobRunner


def test_jobs_run_in_order_and_report_progress(tmp_path):
    runner = JobRunner(tmp_path)
    order = []

    def work(name):
        def fn(ctx):
            for step in range(1, 4):
                ctx.report({"step": step, "steps": 3, "loss": 1.0 / step})
            order.append(name)
            return {"name": name}
        return fn

    a = runner.submit("localize", "a", work("a"))
    b = runner.submit("localize", "b", work("b"))
    assert runner.wait(b.id, 10).status == DONE
    assert order == ["a", "b"]
    job = runner.get(a.id)
    assert job.result == {"name": "a"} and job.fraction == 1.0
    assert [e["step"] for e in job.progress] == [1, 2, 3] and job.progress[-1]["loss"] == 1 / 3
    saved = json.loads((tmp_path / a.id / "job.json").read_text())
    assert saved["status"] == DONE and saved["result"] == {"name": "a"}


def test_cancel_takes_effect_at_the_next_step(tmp_path):
    runner = JobRunner(tmp_path)
    started = threading.Event()
    steps = []

    def fn(ctx):
        for step in range(1, 1000):
            started.set()
            time.sleep(0.01)
            steps.append(step)
            ctx.report({"step": step, "steps": 1000})
        return {}

    job = runner.submit("localize", "long", fn)
    queued = runner.submit("localize", "never runs", lambda ctx: {})
    assert started.wait(5)
    assert runner.cancel(job.id)
    assert runner.cancel(queued.id)
    assert runner.wait(job.id, 5).status == CANCELLED
    assert len(steps) < 50
    assert runner.wait(queued.id, 5).status == CANCELLED and runner.get(queued.id).started is None


def test_failures_show_one_clear_line_and_keep_the_traceback_in_a_log(tmp_path):
    runner = JobRunner(tmp_path)

    def bad_input(ctx):
        raise DataError("unknown column 'txt'; available: text, label")

    def bug(ctx):
        raise KeyError("boom")

    a = runner.wait(runner.submit("localize", "bad", bad_input).id, 5)
    b = runner.wait(runner.submit("localize", "bug", bug).id, 5)
    assert a.status == FAILED and a.error == "unknown column 'txt'; available: text, label"
    assert b.status == FAILED and "internal error (KeyError" in b.error and "Traceback" not in b.error
    assert "Traceback" in (tmp_path / b.id / "error.log").read_text()
    ok = runner.wait(runner.submit("localize", "after", lambda ctx: {"x": 1}).id, 5)
    assert ok.status == DONE  # a failure never takes the runner down


def test_a_restart_lists_old_jobs_and_marks_unfinished_ones_interrupted(tmp_path):
    runner = JobRunner(tmp_path)
    gate, started = threading.Event(), threading.Event()
    done = runner.wait(runner.submit("localize", "done", lambda ctx: {"v": 2}).id, 5)
    running = runner.submit("finetune", "running", lambda ctx: started.set() or gate.wait(10) and {})
    assert started.wait(10)  # its record says it runs
    again = JobRunner(tmp_path)  # a new server process over the same folder
    listed = {j.id: j for j in again.jobs()}
    assert listed[done.id].status == DONE and listed[done.id].result == {"v": 2}
    assert listed[running.id].status == INTERRUPTED
    assert [j.kind for j in again.jobs(kind="finetune")] == ["finetune"]
    gate.set()


def _held(folder, status: str, job_id: str, created: float, restarts: int = 0) -> None:
    """The record a server leaves of a job it held when it stopped."""
    from graftui.jobs import Job

    (folder / job_id).mkdir(parents=True, exist_ok=True)
    job = Job(id=job_id, kind="localize", title=job_id, params={"n": job_id}, status=status, created=created,
              started=created if status == RUNNING else None, fraction=0.4 if status == RUNNING else 0.0,
              restarts=restarts)
    (folder / job_id / "job.json").write_text(json.dumps(job.as_dict()))


HELD = [(RUNNING, "a-running", 1.0, 0), (QUEUED, "b-queued", 2.0, 0), (RUNNING, "c-twice", 3.0, 1),
        (QUEUED, "d-refused", 4.0, 0), (QUEUED, "e-broken", 5.0, 0)]


def test_a_restarted_runner_runs_again_what_it_held_once_revived(tmp_path):
    """Jobs found queued run again in the order they were submitted, one found running runs again once (a restart
    that finds it running again leaves it interrupted), and a record ``rebuild`` refuses or fails on stays
    interrupted; without ``revive`` (the CLI, a test) every one stays interrupted."""
    for held in HELD:
        _held(tmp_path / "plain", *held)
        _held(tmp_path / "revived", *held)
    assert {j.status for j in JobRunner(tmp_path / "plain").jobs()} == {INTERRUPTED}
    ran = []

    def rebuild(job):
        if job.id == "d-refused":
            return None
        if job.id == "e-broken":
            raise ValueError("no such verb")
        return lambda ctx: ran.append(job.params["n"]) or {"ran": job.params["n"]}

    runner = JobRunner(tmp_path / "revived")
    assert runner.revive(rebuild) == ["a-running", "b-queued"]
    assert runner.revive(rebuild) == []  # once
    first, second = runner.wait("a-running", 10), runner.wait("b-queued", 10)
    assert first.status == second.status == DONE and ran == ["a-running", "b-queued"], (first.message, ran)
    assert first.restarts == 1 and second.restarts == 0 and first.result == {"ran": "a-running"}
    assert {runner.get(j).status for j in ("c-twice", "d-refused", "e-broken")} == {INTERRUPTED}
    assert json.loads((tmp_path / "revived" / "a-running" / "job.json").read_text())["restarts"] == 1
    _held(tmp_path / "revived", RUNNING, "a-running", 1.0, restarts=1)  # found running by the next restart too
    _held(tmp_path / "revived", QUEUED, "f-new", 6.0)
    assert JobRunner(tmp_path / "revived").revive(rebuild) == ["f-new"]


def test_damaged_job_records_are_listed_as_damaged_and_never_stop_the_runner(tmp_path):
    """null, truncated JSON, a list, wrong field types, an unknown status: each is one failed job saying so."""
    contents = {"nulljob": "null", "truncated": '{"id": "truncated", "kind": "loc', "alist": "[1, 2]",
                "badtype": json.dumps({"id": "badtype", "kind": "x", "title": "t", "params": [], "status": "done"}),
                "badstatus": json.dumps({"id": "badstatus", "kind": "x", "title": "t", "params": {}, "status": "??"})}
    for name, text in contents.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "job.json").write_text(text)
    good = JobRunner(tmp_path)
    job = good.submit("localize", "fine", lambda ctx: {"ok": 1})
    good.wait(job.id, 30)
    runner = JobRunner(tmp_path)  # a restart reads every record again
    for name, text in contents.items():
        damaged = runner.get(name)
        assert damaged.status == FAILED and damaged.kind == "damaged" and "damaged" in damaged.error, name
        assert (tmp_path / name / "job.json").read_text() == text  # left as it was
    assert runner.get(job.id).status == DONE and runner.get(job.id).result == {"ok": 1}


def test_a_job_that_never_reports_is_stopped_past_its_time_limit_and_after_a_cancel(tmp_path, monkeypatch):
    """A loop that never calls report (as a hung answer regex once was) is stopped in its thread, and the runner
    goes on to the next job."""
    from graftui import jobs

    monkeypatch.setattr(jobs, "STOP_GRACE", 0.3)
    dropped = []
    runner = JobRunner(tmp_path, max_seconds=0.5, after_forced_stop=lambda: dropped.append(1))
    spinning = threading.Event()

    def spin(ctx):
        spinning.set()
        while True:  # pure Python, never yields to the runner
            pass

    over = runner.submit("compare", "spins past its limit", spin)
    after = runner.submit("compare", "next", lambda ctx: {"ok": 1})
    job = runner.wait(over.id, 30)
    assert job.status == FAILED and "limit for one job" in job.error, job
    assert runner.wait(after.id, 10).status == DONE
    assert dropped == [1]  # what the stopped job may have left half done is dropped once; a job that ends does not

    spinning.clear()
    runner = JobRunner(tmp_path / "again")  # no time limit: only a cancel stops it
    job = runner.submit("compare", "spins until cancelled", spin)
    assert spinning.wait(10)
    assert runner.cancel(job.id)
    assert runner.wait(job.id, 30).status == CANCELLED


def test_wait_returns_once_the_finished_record_is_written(tmp_path, monkeypatch):
    """Who waits for a job reads its record next (the app's job list, a bundle): the record of its end is on disk
    when ``wait`` returns, however slow the disk (each record here takes 0.3 s to write)."""
    from graftui import jobs

    def slow(path, write):
        time.sleep(0.3)
        return atomic_write(path, write)

    atomic_write = jobs.atomic_write
    monkeypatch.setattr(jobs, "atomic_write", slow)
    runner = JobRunner(tmp_path)
    for fn, status in ((lambda ctx: {"ok": 1}, DONE), (lambda ctx: 1 / 0, FAILED)):
        job = runner.submit("localize", "t", fn)
        assert runner.wait(job.id, 30).status == status
        assert json.loads((tmp_path / job.id / "job.json").read_text())["status"] == status


def test_a_job_has_a_report_bundle_to_make_only_once_it_finished_with_a_result(tmp_path):
    """The Jobs panel's bundle button is on only for such a job, and making one for any other says why in one line."""
    import pytest

    from graftui.jobs import Job
    from graftui.ui import forms

    done = Job(id="a", kind="localize", title="Localize", params={"verb": "localize"}, status=DONE, result={"k": 1})
    assert forms.reportable(done)
    for job in (None, Job(id="b", kind="localize", title="L", params={"verb": "localize"}, status="running"),
                Job(id="c", kind="prepare", title="Prepare", params={}, status=DONE, result={"k": 1}),
                Job(id="d", kind="localize", title="L", params={"verb": "localize"}, status=FAILED)):
        assert not forms.reportable(job)
        with pytest.raises(ValueError, match="pick a job in the list above first|has no result to report"):
            forms.report_bundle(job)


def test_the_jobs_panel_tells_a_damaged_record_as_damaged_never_as_another_job(tmp_path):
    """A truncated record, or one whose fields name no request, is shown as what it is in the panel's request box:
    never as the job that prepares the default model (the only job without a request)."""
    from graftui.ui import jobwords

    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "job.json").write_text('{"id": "cut", "kind": "loc')
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "job.json").write_text(json.dumps({"id": "odd", "kind": "localize", "title": "t",
                                                            "params": {"x": 1}, "status": "done"}))
    runner = JobRunner(tmp_path)
    cut, odd = runner.get("cut"), runner.get("odd")
    said = jobwords.request_words(cut)
    assert cut.status == FAILED and said == f"({cut.error})" and "record of this job is damaged" in said
    assert jobwords.request_words(odd) == "(this localize job's record names no request)"
    ready = runner.submit("prepare", "Prepare default model", lambda ctx: {})
    assert "prepares the default model" in jobwords.request_words(ready)
    asked = runner.submit("localize", "l", lambda ctx: {}, params={"verb": "localize", "task": "movies"})
    assert json.loads(jobwords.request_words(asked)) == {"verb": "localize", "task": "movies"}
    assert jobwords.request_words(None) == ""


# -- the order waiting jobs run in --------------------------------------------------------------------------
def _held_lane(runner, **submit):
    """A job that holds the main lane until the returned event is set; it runs once this returns."""
    started, release = threading.Event(), threading.Event()
    runner.submit("localize", "holds the lane", lambda ctx: started.set() or release.wait(30) and {}, **submit)
    assert started.wait(10)
    return release


def _recorder(started: list, name: str):
    return lambda ctx: started.append(name) or {}


def _run_all(runner, release, jobs) -> None:
    release.set()
    for job in jobs:
        assert runner.wait(job.id, 10).status == DONE


def test_waiting_jobs_run_shortest_expected_first_and_unknown_lengths_last(tmp_path):
    runner = JobRunner(tmp_path)
    release, started = _held_lane(runner), []
    jobs = [runner.submit("localize", name, _recorder(started, name), estimate=seconds)
            for name, seconds in (("long", 600.0), ("unknown", None), ("short", 10.0), ("middle", 60.0))]
    assert [runner.place(j.id) for j in jobs] == [3, 4, 1, 2]
    _run_all(runner, release, jobs)
    assert started == ["short", "middle", "long", "unknown"]


def test_a_long_job_that_waited_its_length_is_passed_by_no_newer_job(tmp_path):
    """Aging: a job's rank is its length less the time it has waited, so a newer job passes it only while it would
    end before the older one would have, had that started when it was submitted."""
    runner = JobRunner(tmp_path)
    release, started = _held_lane(runner), []
    long = runner.submit("localize", "long", _recorder(started, "long"), estimate=100.0)
    with runner._lock:
        runner.get(long.id).created -= 95.0  # it has waited 95 s of its 100
    later = runner.submit("localize", "later, 10 s", _recorder(started, "later, 10 s"), estimate=10.0)
    tiny = runner.submit("localize", "tiny, 1 s", _recorder(started, "tiny, 1 s"), estimate=1.0)
    assert [runner.place(j.id) for j in (tiny, long, later)] == [1, 2, 3]
    with runner._lock:
        runner.get(long.id).created -= 10.0  # now it has waited longer than its length: nothing passes it
    assert [runner.place(j.id) for j in (long, tiny, later)] == [1, 2, 3]
    fresh = runner.submit("localize", "fresh, 0 s", _recorder(started, "fresh, 0 s"), estimate=0.0)
    assert runner.place(long.id) == 1 and runner.place(fresh.id) == 2  # it passes the newer ones, not the long one
    _run_all(runner, release, [long, later, tiny, fresh])
    assert started == ["long", "fresh, 0 s", "tiny, 1 s", "later, 10 s"]


def test_the_foreseen_starts_are_the_order_jobs_really_start_in(tmp_path):
    runner = JobRunner(tmp_path)
    release, started = _held_lane(runner, estimate=50.0), []
    lengths = {"a": 40.0, "b": 5.0, "c": None, "d": 20.0, "e": 5.0}
    jobs = {name: runner.submit("localize", name, _recorder(started, name), estimate=s) for name, s in lengths.items()}
    now = time.time()
    foreseen = {name: runner.expected(job.id, now) for name, job in jobs.items()}
    assert foreseen["c"] == (pytest.approx(120.0, abs=1.0), None)  # after every known job
    by_start = sorted(jobs, key=lambda name: foreseen[name][0])
    assert by_start == sorted(jobs, key=lambda name: runner.place(jobs[name].id)) == ["b", "e", "d", "a", "c"]
    _run_all(runner, release, jobs.values())
    assert started == by_start


def test_a_waiting_job_moved_up_runs_next_and_a_stale_or_hostile_id_gets_one_line(tmp_path):
    from graftui.errors import SessionError

    runner = JobRunner(tmp_path)
    release, started = _held_lane(runner), []
    a = runner.submit("localize", "a", _recorder(started, "a"), estimate=10.0, owner="me")
    b = runner.submit("localize", "b", _recorder(started, "b"), estimate=20.0, owner="me")
    c = runner.submit("localize", "c", _recorder(started, "c"), owner="me")  # unknown length: last
    assert runner.place(c.id) == 3
    assert runner.move_up(c.id, owner="me", check_owner=True).id == c.id
    assert [runner.place(j.id) for j in (c, a, b)] == [1, 2, 3]
    assert runner.expected(a.id) is None and runner.at_least(a.id) == (0.0, 2)  # the lane's holder and c: unknown
    saved = json.loads((tmp_path / c.id / "job.json").read_text())
    assert saved["first"] > 0  # a restarted server keeps it in front
    for bad in ({"not": "an id"}, "../../etc", "20990101-000000-abcdef", None):
        with pytest.raises(SessionError, match="no waiting job") as err:
            runner.move_up(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(SessionError, match="of yours"):
        runner.move_up(b.id, owner="someone else", check_owner=True)
    _run_all(runner, release, [a, b, c])
    assert started == ["c", "a", "b"]
    with pytest.raises(SessionError, match=f"job {a.id} is done, not waiting"):
        runner.move_up(a.id)


def test_a_client_moves_up_among_its_own_jobs_and_never_past_another_clients_turn(tmp_path):
    runner = JobRunner(tmp_path)
    release, started = _held_lane(runner, owner="server", client="z"), []

    def job(client, name, seconds):
        return runner.submit("localize", name, _recorder(started, name), owner=client, client=client, estimate=seconds)

    x1, x2, y1, x3 = job("x", "x1", 50.0), job("x", "x2", 60.0), job("y", "y1", 100.0), job("x", "x3", 10.0)
    assert [runner.place(j.id) for j in (x3, y1, x1, x2)] == [1, 2, 3, 4]  # clients in turn, each shortest first
    runner.move_up(x2.id, owner="x", check_owner=True)
    assert [runner.place(j.id) for j in (x2, y1, x3, x1)] == [1, 2, 3, 4]  # y's turn is where it was
    runner.move_up(y1.id, owner="y", check_owner=True)
    assert runner.place(y1.id) == 2  # its own only job: first of its own, still after x's turn
    _run_all(runner, release, [x1, x2, y1, x3])
    assert started == ["x2", "y1", "x3", "x1"]


def test_the_jobs_panels_run_next_moves_a_waiting_job_up_and_refuses_anything_else_in_one_line(home):
    from graftui.errors import SessionError
    from graftui.ui import jobwords, store
    from graftui.ui.tabs import jobs as panel

    runner = store.runner()
    release, started = _held_lane(runner.runner), []
    short = runner.submit("localize", "short", _recorder(started, "short"), {"n": 1}, estimate=10.0)
    long = runner.submit("localize", "long <b>", _recorder(started, "long"), {"n": 2}, estimate=900.0)
    assert jobwords.movable(runner.get(long.id)) and not jobwords.movable(None)
    line = panel.move_up(long.id)
    assert line.startswith(f"Moved up **long &lt;b&gt;** [{long.id}]: next in the queue"), line
    for bad in (None, "", {"not": "an id"}, "20990101-000000-abcdef", "../../etc/passwd"):
        with pytest.raises(SessionError, match="pick a waiting job of yours") as err:
            panel.move_up(bad)
        assert "\n" not in str(err.value)
    _run_all(runner, release, [short, long])
    assert started == ["long", "short"]
    assert not jobwords.movable(runner.get(long.id))
    with pytest.raises(SessionError, match="is done, not waiting"):
        panel.move_up(long.id)


def test_run_next_is_on_for_a_waiting_job_only_and_hosted_for_ones_own_only(home, monkeypatch):
    from graftui.jobs import Job
    from graftui.ui import store
    from graftui.ui.tabs import jobs as panel

    waiting = Job(id="w", kind="localize", title="w", params={}, owner=None)
    running = Job(id="r", kind="localize", title="r", params={}, status=RUNNING)
    assert panel.next_button(waiting)["interactive"] and not panel.next_button(running)["interactive"]
    assert not panel.next_button(None)["interactive"]
    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    monkeypatch.setattr(store, "session_id", lambda: "a" * 32)
    assert not panel.next_button(waiting)["interactive"]  # the server's own job: watched, not moved
    assert panel.next_button(Job(id="m", kind="localize", title="m", params={}, owner="a" * 32))["interactive"]
