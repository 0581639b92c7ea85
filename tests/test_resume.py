"""Mask learning that is stopped continues where it was: a learner's state saved after step s and taken back gives the
region and the logits of a run never stopped, bit for bit (both learners, growth before and after the stop, normalized
and adam steps); a quick-lane job that outgrows its lane continues in the main lane from its step, and a job a server
restart found running continues from its last checkpoint. A checkpoint that does not fit is ignored, said in the log."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from conftest import make_tiny_pair, random_batches
from graftui import jobs, learning, resume
from graftui.config import LearnConfig
from graftui.errors import Paused
from graftui.jobs import DONE, MAIN, QUICK, RUNNING, Job, JobRunner

K = 50
STEPS = 8


def config(learner: str, optimizer: str = "normalized") -> LearnConfig:
    """The full learner, or the candidate learner growing C every 2 steps (so growths fall before and after a stop)."""
    return LearnConfig(steps=STEPS, lr=0.5 if optimizer == "normalized" else 1.0, optimizer=optimizer,
                       candidates="all" if learner == "full" else "2", grow_every=2, rank_examples=16)


def learn(pair, cfg, progress=None):
    params = {n: pair.param(n) for n in pair.graftable}
    details: dict = {}
    region, logits = learning.learn_region(pair.model, params, pair.pre, pair.ft, K, random_batches(), cfg, progress,
                                           details=details)
    return region, {n: logits[n].clone() for n in logits}, details


def stop_after(s: int):
    def progress(report):
        if report.step == s:
            raise Paused("stopped to continue elsewhere")
    return progress


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.fixture(scope="module")
def pair():
    pair, _, _ = make_tiny_pair()
    return pair


@pytest.fixture(scope="module")
def unstopped(pair):
    """The region, logits and details of runs never stopped, per (learner, optimizer)."""
    return {(learner, opt): learn(pair, config(learner, opt))
            for learner in ("full", "candidate") for opt in ("normalized", "adam")}


@pytest.mark.parametrize("learner, optimizer, s", [("full", "normalized", 1), ("full", "normalized", 5),
                                                   ("full", "adam", 3), ("candidate", "normalized", 1),
                                                   ("candidate", "normalized", 2), ("candidate", "normalized", 5),
                                                   ("candidate", "adam", 1), ("candidate", "adam", 4)])
def test_a_learning_stopped_after_step_s_and_continued_ends_as_if_never_stopped(pair, unstopped, tmp_path, learner,
                                                                                 optimizer, s):
    cfg = config(learner, optimizer)
    region, logits, details = unstopped[(learner, optimizer)]
    if learner == "candidate":  # C grows at step 2 (room filled there with adam), and again with normalized steps
        assert details["grown"] >= (2 if optimizer == "normalized" else 1), details
    with resume.kept_in(tmp_path):
        with pytest.raises(Paused):
            learn(pair, cfg, stop_after(s))
    kept = resume.scalars(next(tmp_path.glob(f"learn-*-0/{resume.CHECKPOINT}")))
    assert kept["steps_done"] == s
    steps = []
    with resume.kept_in(tmp_path):  # the job's next run: the same place
        again, again_logits, again_details = learn(pair, cfg, lambda r: steps.append(r.step))
    assert steps == list(range(s + 1, STEPS + 1))  # continued, not started over
    assert same(again, region) and same(again_logits, logits)
    if learner == "candidate":
        assert {k: again_details[k] for k in ("size", "grown", "added", "start")} == \
            {k: details[k] for k in ("size", "grown", "added", "start")}


def test_a_finished_learning_is_not_learned_again_by_a_rerun(pair, unstopped, tmp_path):
    cfg = config("candidate")
    for _ in range(2):
        steps = []
        with resume.kept_in(tmp_path):
            region, logits, _ = learn(pair, cfg, lambda r: steps.append(r.step))
        assert same(region, unstopped[("candidate", "normalized")][0])
        assert same(logits, unstopped[("candidate", "normalized")][1])
    assert steps == []  # the second run read the final state: no step taken


def _stopped_at(pair, place, cfg, s=3):
    with resume.kept_in(place):
        with pytest.raises(Paused):
            learn(pair, cfg, stop_after(s))
    return next(place.glob(f"learn-*-0/{resume.CHECKPOINT}"))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other settings", "other learner", "other start"])
def test_a_checkpoint_that_does_not_fit_is_ignored_and_the_learning_starts_over(pair, unstopped, tmp_path, caplog,
                                                                               damage):
    cfg = config("candidate")
    path = _stopped_at(pair, tmp_path, cfg)
    if damage == "garbage":
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header at all")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage in ("other settings", "other learner"):  # another learning's checkpoint, found in this one's place
        other = config("full") if damage == "other learner" else LearnConfig(**{**cfg.as_dict(), "lr": 0.25})
        shutil.copyfile(_stopped_at(pair, tmp_path / "other", other), path)
    elif damage == "other start":  # the same layout and settings, another start region
        meta = resume.scalars(path)
        meta["base"] = "0" * 64
        learning.write_checkpoint(path, _tensors(path), meta)
    steps = []
    with resume.kept_in(tmp_path):
        with caplog.at_level(logging.WARNING, logger="graftui.learning"):
            region, logits, _ = learn(pair, cfg, lambda r: steps.append(r.step))
    assert steps == list(range(1, STEPS + 1))
    assert same(region, unstopped[("candidate", "normalized")][0])
    assert same(logits, unstopped[("candidate", "normalized")][1])
    assert "mask learning starts over: the checkpoint" in caplog.text, caplog.text


def _tensors(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        return {n: f.get_tensor(n) for n in f.keys()}


def test_a_rerun_that_skips_a_finished_learning_still_finds_the_place_of_the_next(pair, tmp_path):
    """A run of two seeds moved during the second: its re-run reads the first seed's region back from its file and
    learns only the second, which continues from its step."""
    first, second = config("candidate"), LearnConfig(**{**config("candidate").as_dict(), "seed": 1})
    with resume.kept_in(tmp_path):
        learn(pair, first)
        with pytest.raises(Paused):
            learn(pair, second, stop_after(3))
    unstopped = learn(pair, second)
    steps = []
    with resume.kept_in(tmp_path):
        region, logits, _ = learn(pair, second, lambda r: steps.append(r.step))
    assert steps == list(range(4, STEPS + 1)) and same(region, unstopped[0]) and same(logits, unstopped[1])


def test_outside_a_job_nothing_is_written(pair, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(resume, "CHECKPOINT_SECONDS", 0.0)
    learn(pair, config("candidate"))
    assert list(tmp_path.rglob("*")) == []


def _job_learning(pair, cfg, seen, regions, report_from: int):
    """A job that learns a region, reporting its steps from ``report_from`` on."""
    def fn(ctx):
        def progress(r):
            seen.append((ctx.job.lane, r.step))
            if r.step >= report_from:
                ctx.report({"step": r.step, "steps": r.steps, "loss": r.loss})
        region, _, _ = learn(pair, cfg, progress)
        regions.append(region)
        return {"size": sum(int(i.numel()) for i in region.values())}
    return fn


def test_a_quick_job_that_outgrows_its_lane_continues_in_the_main_lane_from_its_step(pair, unstopped, tmp_path,
                                                                                    monkeypatch, caplog):
    monkeypatch.setattr(jobs, "QUICK_LIMIT", 0.0)  # outgrown at its first report
    runner = JobRunner(tmp_path)
    seen, regions = [], []
    with caplog.at_level(logging.INFO, logger="graftui.jobs"):
        job = runner.submit("localize", "t", _job_learning(pair, config("candidate"), seen, regions, 3), lane=QUICK)
        done = runner.wait(job.id, timeout=120)
    assert f"continues from step 3 of {STEPS} there" in caplog.text, caplog.text  # what its line said while it waited
    assert done.status == DONE and done.lane == MAIN and done.moved, (done.status, done.message, done.error)
    main = [step for lane, step in seen if lane == MAIN]
    assert [step for lane, step in seen if lane == QUICK] == [1, 2, 3] and main[0] == 4, seen
    assert [p["step"] for p in done.progress] == list(range(3, STEPS + 1))  # the earlier run's steps kept
    assert [p.get("run", 0) for p in done.progress] == [0] + [1] * (STEPS - 3)
    assert same(regions[-1], unstopped[("candidate", "normalized")][0])
    assert "starts over" not in done.moved
    assert not (tmp_path / job.id / resume.FOLDER).exists()  # it ended: its place is gone


def test_a_job_a_restart_found_running_continues_from_its_last_checkpoint(pair, unstopped, tmp_path, monkeypatch):
    monkeypatch.setattr(resume, "CHECKPOINT_SECONDS", 0.0)  # a checkpoint after every step
    cfg = config("candidate")
    job = Job(id="20260101-000000-aaaaaa", kind="localize", title="held", params={}, status=RUNNING, created=1.0,
              started=1.0, fraction=0.5, progress=[{"step": 4, "steps": STEPS, "fraction": 0.5, "time": 2.0}])
    folder = tmp_path / job.id
    folder.mkdir()
    (folder / "job.json").write_text(json.dumps(job.as_dict()))

    def killed(report):
        if report.step == 5:  # the server stops inside step 5's report: step 4's checkpoint is the last
            raise SystemExit("killed")

    with resume.kept_in(folder / resume.FOLDER):
        with pytest.raises(SystemExit):
            learn(pair, cfg, killed)
    assert resume.standing(folder) == (4, STEPS)
    runner = JobRunner(tmp_path)
    seen, regions = [], []
    assert runner.revive(lambda j: _job_learning(pair, cfg, seen, regions, 1)) == [job.id]
    assert runner.get(job.id).message == f"the server restarted while it ran: it continues from step 4 of {STEPS}"
    done = runner.wait(job.id, timeout=120)
    assert done.status == DONE and done.restarts == 1, (done.status, done.message, done.error)
    assert [step for _, step in seen] == list(range(5, STEPS + 1))
    assert same(regions[-1], unstopped[("candidate", "normalized")][0])
    assert [p["step"] for p in done.progress] == list(range(4, STEPS + 1))
    assert not (folder / resume.FOLDER).exists()


def test_the_pace_of_a_continued_job_is_measured_on_its_own_run():
    """After a move the kept entries of the earlier run (timed from its own start) do not count."""
    now = 1000.0
    job = Job(id="j", kind="localize", title="t", params={}, status=RUNNING, started=now - 10, run=1, run_from=0.5,
              fraction=0.75,
              progress=[{"step": 2, "steps": 8, "fraction": 0.25, "time": 50.0},
                        {"step": 4, "steps": 8, "fraction": 0.5, "time": 100.0},
                        {"step": 6, "steps": 8, "fraction": 0.75, "time": 2.0, "run": 1}])
    assert jobs._left(job, now) == pytest.approx(10.0)  # this run did a quarter in 10 s: a quarter is left
    job.progress.append({"step": 7, "steps": 8, "fraction": 0.875, "time": 5.0, "run": 1})
    job.fraction = 0.875
    assert jobs._left(job, now) == pytest.approx(8.0)  # an eighth in 8 s since this run's first step: 8 s left


def test_a_continued_jobs_line_measures_the_pace_of_its_own_run():
    from graftui.ui import jobwords

    earlier = [{"step": i, "steps": 40, "time": 2.0 * i} for i in range(1, 11)]  # timed from the first run's start
    later = [{"step": i, "steps": 40, "time": 30.0 + 1.0 * (i - 11), "run": 1} for i in range(11, 14)]
    job = Job("j", "localize", "x", {}, status=RUNNING, progress=earlier + later, run=1)
    assert jobwords.step_progress(job) == (13, 40, pytest.approx(27.0))  # 1 s a step in this run: 27 steps left


def test_the_checkpoint_file_is_safetensors_with_its_scalars_in_its_metadata(pair, tmp_path):
    from safetensors.torch import load_file

    path = _stopped_at(pair, tmp_path, config("full", "adam"), s=2)
    tensors = load_file(str(path))
    assert {n.partition(".")[0] for n in tensors} == {"logit", "adam_m", "adam_v", "rng"}
    kept = resume.scalars(path)
    assert kept["steps_done"] == 2 and kept["k"] == K and kept["learner"] == "full"
    assert not list(path.parent.glob(".*"))  # written atomically: nothing left aside


def test_a_run_over_seeds_stopped_to_move_is_not_called_cancelled():
    """A job over seeds that outgrows the quick lane is moved, its finished seeds read back there: the stop reaches
    the runner as it was raised, not as a cancel."""
    from graftui.flows import replicates
    from graftui.requests import LocalizeRequest

    def localize(one, progress, cancel, guard):
        raise jobs.Outgrown("its pace foretold 300 s")

    with pytest.raises(jobs.Outgrown):
        replicates.localize_seeds(localize, LocalizeRequest.make(seeds=[0, 1], steps=3))
