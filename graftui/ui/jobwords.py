"""How a job is told on the page: the jobs table, its status line and expected times, the banner, the confirm buttons.

Words only: nothing here submits or changes a job (``forms`` submits, the job runner runs).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from .. import lanes
from ..formatting import minutes
from ..jobs import DAMAGED, FINISHED, MAIN, QUEUED, RUNNING, Job
from . import store


JOB_COLUMNS = ["id", "kind", "title", "status", "progress", "duration", "message"]


def _duration(job: Job) -> str:
    d = job.duration
    if d is None:
        return ""
    return f"{d:.1f} s" if d < 120 else f"{d / 60:.1f} min"


def job_rows(runner, limit: int = 40) -> pd.DataFrame:
    """One row per job, newest first: the state comes from the runner, never from the page."""
    rows = []
    for job in runner.jobs()[:limit]:
        rows.append({
            "id": job.id,
            "kind": job.kind,
            "title": job.title,
            "status": job.status,
            "progress": wait_words(runner, job) if job.status == QUEUED else
            f"{100 * job.fraction:.0f} %" + (when_words(runner.expected(job.id), waiting=False) if job.status == RUNNING
                                             else ""),
            "duration": _duration(job),
            "message": job.error or job.message,
        })
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def job_signature(runner) -> tuple:
    """Changes whenever anything shown in the jobs table changes."""
    return tuple((j.id, j.status, round(j.fraction, 2), j.message, int(j.duration or 0),
                  wait_words(runner, j) if j.status == QUEUED else
                  when_words(runner.expected(j.id), waiting=False) if j.status == RUNNING else None)
                 for j in runner.jobs()[:40])


def queue_words(place: int | None, lane: str = MAIN) -> str:
    """A waiting job's place in its lane, as the page says it."""
    if not place:
        return ""
    where = "the queue" if lane == MAIN else "the quick lane"
    return f"next in {where}" if place == 1 else f"place {place} in {where}"


def about(seconds: float) -> str:
    """A foreseen time, as coarse as a foresight is (so a line does not change at every tick)."""
    if seconds < 10:
        return "a few seconds"
    if seconds < 90:
        return f"about {10 * round(seconds / 10):.0f} s"
    return f"about {seconds / 60:.0f} min"


def when_words(expected: tuple[float, float | None] | None, waiting: bool,
               least: tuple[float, int] | None = None) -> str:
    """When a job is expected to start and end (``JobRunner.expected``); where a job before it has no expected length,
    the least it waits and how many such jobs are before it (``JobRunner.at_least``), else why its start is not known."""
    if expected is None:
        if not waiting:
            return ""
        if least is not None and least[0] >= 10 and least[1]:
            unknown = "a job" if least[1] == 1 else f"{least[1]} jobs"
            return (f" · starts in at least {about(least[0]).removeprefix('about ')} (and the length of {unknown} "
                    "before it, which is not known yet)")
        return " · start unknown (a job before it has no expected length)"
    start, end = expected
    if not waiting:
        return "" if end is None else f" · {about(end)} left"
    words = f" · starts in {about(start)}"
    return words + (f", ends in {about(end)}" if end is not None else
                    ", length unknown (no past run, and no cost its settings say)")


def wait_words(runner, job: Job) -> str:
    """A waiting job's place in its lane, and when it is expected to start and end (at least, behind a job of
    unknown length)."""
    return queue_words(runner.place(job.id), job.lane) + when_words(runner.expected(job.id), waiting=True,
                                                                    least=at_least(runner, job))


def at_least(runner, job: Job | None) -> tuple[float, int] | None:
    """``JobRunner.at_least`` of a job ``runner`` shows (a session's view of the one runner, or the runner itself)."""
    whole = getattr(runner, "runner", runner)
    return whole.at_least(job.id) if job is not None and runner.get(job.id) is not None else None


def movable(job: Job | None) -> bool:
    """Whether a job may be moved up (``JobRunner.move_up``): it waits."""
    return job is not None and job.status == QUEUED


PACE_STEPS = 10  # the pace of a stage is measured over its last steps


def step_progress(job: Job) -> tuple[int, int, float | None] | None:
    """(step, steps, seconds left) of a running job's current stage, from its progress events: the pace is the
    time its last steps took (their ``time`` stamps), so the loading before the first step does not count;
    no estimate before two steps. None when the job is not stepping (no steps yet, or its stage moved on)."""
    if job is None or job.status != RUNNING:
        return None
    events = [p for p in job.progress if "step" in p and "steps" in p]
    if not events:
        return None
    last = events[-1]
    step, steps = int(last["step"]), int(last["steps"])
    if step >= steps or ("stage" in last and last["stage"] != job.message):
        return None
    run = [last]  # this stage's steps: counting up to the same total, in the same run of the job (a job that
    # continues after a move or a restart keeps its earlier steps, timed from another start)
    for p in reversed(events[:-1]):
        if p["steps"] != steps or p["step"] >= run[-1]["step"] or len(run) > PACE_STEPS \
                or p.get("run", 0) != last.get("run", 0):
            break
        run.append(p)
    first = run[-1]
    if len(run) < 2 or "time" not in first or "time" not in last:
        return step, steps, None
    pace = (last["time"] - first["time"]) / (step - first["step"])
    return step, steps, max(0.0, pace * (steps - step))


def step_words(job: Job) -> str:
    """" · step 12/40, about 30 s left" for a stepping job (the step alone while the pace is unknown); else ""."""
    got = step_progress(job)
    if got is None:
        return ""
    step, steps, left = got
    parts = [] if f"step {step}/{steps}" in (job.message or "") else [f"step {step}/{steps}"]  # its stage says it
    if left is not None:
        parts.append(f"about {'1 s' if left < 1 else minutes(left)} left")
    return "".join(f" · {p}" for p in parts[:1]) + "".join(f", {p}" for p in parts[1:])


def job_choices(runner, kinds: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    out = []
    for job in runner.jobs():
        if kinds is None or job.kind in kinds:
            out.append((f"{job.title} · {job.status} [{job.id}]", job.id))
    return out


def latest_job(runner, kinds: tuple[str, ...]) -> Job | None:
    jobs = [j for j in runner.jobs() if j.kind in kinds]
    return jobs[0] if jobs else None


def shown_job(runner, picked: str, kinds: tuple[str, ...]) -> Job | None:
    """The job a panel shows: the picked one if it is of the panel's kinds, or ("" picked) the latest of them."""
    if not picked:
        return latest_job(runner, kinds)
    job = runner.get(picked)
    return job if job is not None and job.kind in kinds else None


CONFIRM_SECONDS = 10.0  # a Cancel or Delete button, once pressed, asks to be pressed again within this long
CONFIRM = "Confirm"  # how an armed button's label starts: "Confirm cancel", "Confirm: delete …"


def _armed_at(armed) -> float | None:
    """When a confirm button's first press armed it (its memory: (key, when)); None when it is not armed."""
    ok = isinstance(armed, (list, tuple)) and len(armed) == 2 and isinstance(armed[1], (int, float))
    return armed[1] if ok else None


def asks(label) -> bool:
    """Whether a button's label, as the page showed it when pressed, asked to confirm: a press confirms only then, so
    a button whose look went back (a poll, a pick answered late) never acts on one press."""
    return isinstance(label, str) and label.startswith(CONFIRM)


def still_armed(armed, key) -> bool:
    """Whether a confirm button's memory names ``key``, the job or region now picked. A pick's event and a press that
    follows it may be answered in either order: a press that armed the button for what is picked stays armed."""
    return _armed_at(armed) is not None and armed[0] == key


def expired(armed, now: float) -> bool:
    """Whether a button armed by a first press has waited past CONFIRM_SECONDS: it goes back to its first look."""
    at = _armed_at(armed)
    return at is not None and now - at > CONFIRM_SECONDS


def cancel_step(runner, job: Job | None, armed, now: float, asked: bool = True) -> tuple[str, tuple | None, str]:
    """One press of a Cancel button: (the status line, the button's new memory, its look: "off" for nothing to
    cancel, "armed" asking to confirm, "ready"). The first press on a waiting or running job arms the button; a
    second on the same job cancels it if the button ``asked`` to confirm when pressed. The page keeps the window:
    its poll disarms the button CONFIRM_SECONDS after the first press (``expired``), so a press the page showed
    as a confirmation is one however long a busy server takes to answer it."""
    if job is None:
        return "Nothing to cancel.", None, "off"
    if job.status in FINISHED:
        return f"**{md(job.title)}** has already finished ({job.status}).", None, "off"
    if hasattr(runner, "check_cancel"):
        runner.check_cancel(job.id)  # a job this page may not cancel is refused at the first press
    if asked and still_armed(armed, job.id):
        ok = runner.cancel(job.id)  # refuses a job that is not this page's own
        return (f"Cancel requested for **{md(job.title)}**." if ok else
                f"**{md(job.title)}** has already finished ({job.status})."), None, "off"
    return (f"Press **{CONFIRM} cancel** within {CONFIRM_SECONDS:g} s to stop **{md(job.title)}** [{job.id}]; what it "
            "has not saved is lost."), (job.id, now), "armed"


def reading_words(readers: list[Job], ahead: bool) -> str:
    """What deleting a region does to the waiting or running jobs that read it (``ahead``: before the confirming press,
    which cancels them with it); empty where none reads it."""
    if not readers:
        return ""
    named = ", ".join(f"**{md(j.title)}** [{j.id}]" for j in readers[:3]) + (" …" if len(readers) > 3 else "")
    return (f", and cancels the {len(readers)} job(s) that read it: {named}" if ahead else
            f" and cancelled the {len(readers)} job(s) that read it: {named}")


def cancellable(job: Job | None) -> bool:
    return job is not None and job.status not in FINISHED


def job_status_line(job: Job | None, place: int | None = None, when: str = "") -> str:
    """One Markdown line about a job: how far it is (its step, and the time left at its measured pace), or its
    ``place`` in its lane while it waits and ``when`` it is expected to start and end (``when_words``), its
    result, or its error text when it failed (never a traceback)."""
    if job is None:
        return "No job yet."
    steps = step_words(job)
    running = f" — {100 * job.fraction:.0f} %{steps or when}" if job.status == RUNNING else ""
    waiting = f" · {queue_words(place, job.lane)}{when}" if job.status == QUEUED and place else ""
    text = f"**{md(job.title)}** [{job.id}] · {job.status}{running}{waiting}"  # titles, messages and notes quote user text
    if job.status == "failed":
        return text + f"\n\n⚠️ {md(job.error)}"
    if job.message and job.message not in {job.status, "done"}:
        text += f" · {md(job.message)}"
    if job.status in FINISHED and job.duration is not None:
        text += f" · took {_duration(job)}"
    result = job.result or {}
    if result.get("region") and job.kind in ("localize", "compose"):
        text += f" · saved region **{result['region']}**" + (f" (k = {result['k']:,})" if result.get("k") else "")
    kept = [Path(r["region"]).stem for r in result.get("rows") or [] if job.kind == "sweep" and r.get("region")]
    if kept:
        text += f" · kept {len(kept)} regions: " + ", ".join(f"**{name}**" for name in kept)
    for note in result.get("notes") or []:
        text += f"\n\nNote: {md(note)}"
    if result.get("name") and job.kind == "finetune":
        text += f" · checkpoint **{result['name']}** is now in the model pickers"
    if job.status == "done" and result.get("card"):
        text += "\n\n" + card_markdown(result["card"])
    return text


def job_when(runner, job: Job | None) -> str:
    """``when_words`` of a job that waits or runs, from ``runner``."""
    if job is None or job.status in FINISHED:
        return ""
    return when_words(runner.expected(job.id), waiting=job.status == QUEUED, least=at_least(runner, job))


def request_words(job: Job | None) -> str:
    """The request box of the jobs panel: the job's request as JSON; a job without one says why, from its record
    alone (a damaged record is told as damaged, never as another job's)."""
    if job is None:
        return ""
    if "verb" in (job.params or {}):
        return json.dumps(job.params, indent=2)
    if job.kind == DAMAGED:
        return f"({job.error})"
    if job.kind == "prepare":
        return "(this job has no request: it prepares the default model)"
    return f"(this {job.kind} job's record names no request)"


def job_line(runner, job: Job | None) -> str:
    """``job_status_line`` with the job's place in ``runner``'s lane, and when it should start and end."""
    return job_status_line(job, runner.place(job.id) if job is not None and job.status == QUEUED else None,
                           job_when(runner, job))


class Banner(str):
    """The status line's text where it announces a job (just submitted, running or waiting): the page keeps the job's
    id beside the line (``wiring.Page.announced``), and the poll replaces the line once that job ends."""

    job: str

    def __new__(cls, text: str, job: str):
        made = super().__new__(cls, text)
        made.job = job
        return made

    def __getnewargs__(self):  # copied or pickled, it keeps its job
        return str(self), self.job


def submitted_line(job: Job) -> Banner:
    """The banner after a submission, with its lane and the default model it builds first (``lanes.plan_words``);
    ``settled_banner`` replaces it when the job ends."""
    more = lanes.plan_words(job, lanes.default_to_build((job.params or {}).get("finetuned")))
    return Banner(f"Submitted **{md(job.title)}** (job {job.id}); it runs in the background, see its progress below."
                  + (f" {more}" if more else ""), job.id)


def active_banner(runner) -> Banner | None:
    """The banner of a page opened while jobs run or wait (its own, or the server's): which one runs, how far it
    is, and how many wait; ``settled_banner`` replaces it when that job ends. None when nothing runs or waits."""
    jobs = runner.jobs()
    running = [j for j in jobs if j.status == RUNNING]
    waiting = [j for j in reversed(jobs) if j.status == QUEUED]  # oldest first
    if not running and not waiting:
        return None
    return job_banner(runner, (running or waiting)[0])


def job_banner(runner, job: Job) -> Banner:
    """The banner of one job that runs or waits, with how many others wait (``active_banner``). It says how far the
    job was when the page opened, as such: the banner changes only when the job ends (``settled_banner``), since a
    poll that rewrote it as the job moved could land after a newer banner (a job just submitted) and hide it."""
    waiting = [j for j in runner.jobs() if j.status == QUEUED]
    if job.status == RUNNING:
        text = (f"Running: **{md(job.title)}** (job {job.id}) — {100 * job.fraction:.0f} %{step_words(job)} when this "
                "page opened")
    else:
        text = (f"Waiting: **{md(job.title)}** (job {job.id}), {wait_words(runner, job) or 'in the queue'} when this "
                "page opened")
    more = len(waiting) - (job.status == QUEUED)
    if more:
        text += f"; {more} more job(s) waiting"
    return Banner(text + ". Its tab shows its progress; **Jobs** below lists every job.", job.id)


def settled_banner(announced: str | None) -> str | None:
    """The banner once the job it announced (its id, ``Banner.job``) has ended, or ``None`` while it runs (or it
    announced none)."""
    job = store.runner().get(announced) if announced else None
    if job is None or job.status not in FINISHED:
        return None
    took = f" in {_duration(job)}" if job.duration is not None else ""
    return f"**{md(job.title)}** (job {job.id}) ended: {job.status}{took}. Its result is in its tab."


def card_markdown(lines: list[str]) -> str:
    """The result card (graftui.card) as a quoted block under the job's line."""
    return "\n>\n".join(f"> {md(line)}" for line in lines)


def md(text) -> str:
    """User text (file, task and label names, messages quoting them) shown in Markdown as text, never as HTML."""
    return html.escape(str(text), quote=False)
