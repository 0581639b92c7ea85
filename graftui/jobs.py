"""One runner for all long work (fine-tuning, localization, sweeps, evaluations).

Jobs run in two lanes, each one job at a time on a background thread of its own: the main lane, and a quick
lane for work that takes seconds (a prediction, a job as short as the same job was here before), so a
short job is never held behind a long one. A job in the quick lane loads models of its own (its caller's choice:
``flows.common.own_pairs``), so the models a lane shares are never touched by two jobs at once. Each job carries
the seconds it is expected to take, when its caller knows (``estimate``), from which a waiting job's start and end
are foreseen (``expected``). Waiting jobs are served client by client in turn (a client is the address a job came
from, else its owner; the one served longest ago goes next), so one busy client cannot hold the queue; a client's
own jobs go shortest expected first, a job's wait counting in its favour (``_rank``), and one its owner moved up
(``move_up``) first of all; a job over the runner's time limit, or cancelled, is
stopped at its next progress report, and one that reports no more is stopped in its thread STOP_GRACE seconds
later. Each job lives in ``$GRAFTUI_HOME/jobs/<id>/`` as
``job.json`` (status, parameters, progress history, result) plus whatever files it writes, so
a reloaded page, or a restarted server, sees every job again.

A job runs in a copy of the context it was submitted from, so the workspace a hosted session
entered (``settings.workspace()``) is where its job writes; ``owner`` names that session, and
the app lists and cancels only a session's own jobs.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import json
import logging
import math
import threading
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from . import resume
from .errors import Cancelled, Paused, SessionError, first_line, message
from .paths import atomic_write

log = logging.getLogger(__name__)

QUEUED, RUNNING, DONE, FAILED, CANCELLED, INTERRUPTED = "queued", "running", "done", "failed", "cancelled", "interrupted"
MAIN, QUICK = "main", "quick"
LANES = (MAIN, QUICK)  # each runs one job at a time, beside the other
FINISHED = {DONE, FAILED, CANCELLED, INTERRUPTED}
STOP_GRACE = 30.0  # seconds a job past its time limit, or cancelled, has to stop at its own next step (a batch of
# generations on a CPU may take this long between two)
WATCH_SECONDS = 0.2  # how often the runner looks at a running job
QUICK_LIMIT = 120.0  # seconds a job may run in the quick lane, which serves work of seconds: past it, it is moved
# to the main lane (a runner's own limit may be set: ``JobRunner(quick_limit=…)``, GRAFTUI_QUICK_SECONDS)
UNKNOWN_SECONDS = 3600.0  # the length a waiting job of unknown length is ranked at (``_rank``): after most known ones
NOBODY = ""  # the owner of a record whose owner is unknown: no hosted session's id (those have 32 characters)
OWNER_FILE = "owner"  # beside job.json: whose job it is, should the record be damaged
DAMAGED = "damaged"  # the kind of a job whose record could not be read: it is listed as failed, saying so


@dataclass
class Job:
    id: str
    kind: str  # "finetune" | "localize" | "sweep" | "compare" | "compose" | ...
    title: str
    params: dict
    status: str = QUEUED
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    progress: list[dict] = field(default_factory=list)  # one entry per reported step
    fraction: float = 0.0
    message: str = ""
    result: dict | None = None
    error: str | None = None
    owner: str | None = None  # the hosted session that submitted it; None: the server's own (or a local user's)
    client: str | None = None  # the address it came from (hosted): fairness is per client, whatever its sessions
    lane: str = MAIN
    estimate: float | None = None  # the seconds it is expected to take, when its submitter knows
    work: float | None = None  # what its request asks the models to read (tokens × models × passes), where it says
    restarts: int = 0  # how often a server restart found it running and ran it again
    moved: str = ""  # why it left the quick lane for the main one, where it continued (empty: it did not)
    first: float = 0.0  # when its owner moved it to the front of its client's waiting jobs (0: never; ``move_up``)
    run: int = 0  # which run of it this is: a job moved or revived runs again, continuing; its progress entries of a
    # later run say which ("run"), so the pace of the run under way is measured on its own steps
    run_from: float = 0.0  # the fraction it had done when this run began

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.finished or time.time()) - self.started

    def as_dict(self) -> dict:
        return asdict(self)


class TimeLimit(Cancelled):
    """A job ran past the runner's time limit (a hosted server's GRAFTUI_JOB_SECONDS), or past the quick lane's."""


class Outgrown(TimeLimit, Paused):
    """A quick-lane job that will not end within the quick lane's limit: the runner moves it to the main lane, where it continues
    (mask learning keeps its place: ``resume``)."""


def _outgrown(ran: float, total: float | None, limit: float) -> Outgrown:
    pace = f"its pace foretold {total:,.0f} s" if total is not None else f"it ran {ran:,.0f} s"
    return Outgrown(f"{pace}, past the {limit:,.0f} s the quick lane gives work of seconds" if limit >= 10 else
                    f"{pace}, past the {limit:g} s the quick lane gives work of seconds")


def _limit_stop(limit: float) -> TimeLimit:
    return TimeLimit(f"stopped after {limit:,.0f} s, this server's limit for one job: ask for less work (fewer steps, "
                     "examples or test examples)")


class JobContext:
    """What a running job sees: its folder, a progress reporter and its cancel flag."""

    def __init__(self, runner: "JobRunner", job: Job):
        self._runner, self.job = runner, job
        self.cancel = threading.Event()
        self.dir = runner.job_dir(job.id)

    def report(self, event: dict) -> None:
        """Record a progress event; ``fraction`` (0..1) and ``stage`` are shown, the rest plotted."""
        limit, ran = self._runner.max_seconds, time.time() - (self.job.started or time.time())
        if self.cancel.is_set():
            raise Cancelled(f"{self.job.kind} cancelled")
        if limit and ran > limit:
            raise _limit_stop(limit)
        outgrown = None
        if self.job.lane == QUICK:  # moved to the main lane as soon as its own pace says it outgrows this one
            total, quick = _foreseen(self.job, time.time()), self._runner.quick_limit
            if ran > quick or (total is not None and total > quick):
                outgrown = _outgrown(ran, total, quick)  # after this step is recorded: the job continues after it
        event = {k: v for k, v in event.items() if v is not None}
        if self.job.run:
            event["run"] = self.job.run
        with self._runner._lock:
            if "step" in event and "steps" in event:
                event.setdefault("fraction", event["step"] / max(event["steps"], 1))
            if "fraction" in event:
                self.job.fraction = float(event["fraction"])
            if "stage" in event:
                self.job.message = str(event["stage"])
            if "step" in event or "heldout" in event:  # what the panels plot: steps, and held-out checks between them
                self.job.progress.append({**event, "time": round(time.time() - (self.job.started or time.time()), 3)})
        self._runner._save(self.job, throttle=True)
        if outgrown is not None:
            raise outgrown


JobFn = Callable[[JobContext], dict]


class JobRunner:
    def __init__(self, root: str | Path, max_seconds: float | None = None,
                 after_forced_stop: Callable[[], None] | None = None, quick_limit: float | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_seconds = max_seconds  # a job running longer is stopped at its next progress report
        self._quick_limit = quick_limit  # a quick-lane job foreseen longer is moved to the main lane (None: QUICK_LIMIT)
        # what to drop after a job was stopped in its thread: it may have been stopped anywhere, a model half-grafted
        self.after_forced_stop = after_forced_stop
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._jobs: dict[str, Job] = {}
        self._fns: dict[str, tuple[JobFn, contextvars.Context]] = {}
        self._contexts: dict[str, JobContext] = {}
        self._waiting: list[str] = []  # job ids, in submission order
        self._served: dict[tuple[str, str | None], float] = {}  # (lane, client) -> when its last job there started
        self._last_save: dict[str, float] = {}
        self._load_existing()
        self._workers = [threading.Thread(target=self._work, args=(lane,), name=f"graftui-jobs-{lane}", daemon=True)
                         for lane in LANES]
        for worker in self._workers:
            worker.start()

    @property
    def quick_limit(self) -> float:
        return self._quick_limit or QUICK_LIMIT

    # -- public --------------------------------------------------------------------------------
    def submit(self, kind: str, title: str, fn: JobFn, params: dict | None = None, owner: str | None = None,
               dedupe: bool = False, client: str | None = None,
               admit: Callable[[list[Job]], None] | None = None, lane: str = MAIN,
               estimate: float | None = None, work: float | None = None) -> Job:
        """Queue ``fn`` in ``lane``; with ``dedupe``, the same owner's identical job still waiting or running is
        returned instead (a double click queues one job). ``admit(active jobs, both lanes)`` may refuse it by raising:
        it runs under the runner's lock, so quotas hold when many requests arrive at once."""
        if lane not in LANES:
            raise ValueError(f"no lane '{lane}' (lanes: {', '.join(LANES)})")
        with self._lock:
            twin = self.twin(kind, params, owner) if dedupe else None
            if twin is not None:
                return twin
            if admit is not None:
                admit([j for j in self._jobs.values() if j.status in (QUEUED, RUNNING)])
            job = Job(id=time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6], kind=kind, title=title,
                      params=params or {}, owner=owner, client=client, lane=lane, estimate=estimate, work=work)
            self._save(job, required=True)  # a job whose record cannot be written is refused, not lost later
            if owner is not None:  # kept apart too: a damaged record is still listed to its own session
                (self.job_dir(job.id) / OWNER_FILE).write_text(owner)
            self._jobs[job.id] = job
            self._fns[job.id] = (fn, contextvars.copy_context())
            self._waiting.append(job.id)
            self._wake.notify_all()  # each lane's worker waits on the same condition
        return job

    def twin(self, kind: str, params: dict | None, owner: str | None) -> Job | None:
        """The owner's job of this kind and these params that is still waiting or running, if any (where it writes,
        ``out``, is not compared: a form names a new place for every click)."""
        same = _without_out(params)
        with self._lock:
            return next((j for j in self._jobs.values() if j.status in (QUEUED, RUNNING) and j.owner == owner
                         and j.kind == kind and _without_out(j.params) == same), None)

    def place(self, job_id: str) -> int | None:
        """A waiting job's place in its lane (1: next), as the lane serves clients in turn; None once it runs."""
        with self._lock:
            job = self._jobs.get(job_id)
            order = self._order(job.lane) if job is not None else []
            return order.index(job_id) + 1 if job_id in order else None

    def expected(self, job_id: str, now: float | None = None) -> tuple[float, float | None] | None:
        """(seconds until a job starts, seconds until it ends) from now, foreseen from what runs and waits before it
        in its lane (a running job's measured pace, else its estimate), in the order the lane will serve them; the
        end is None when the job's own length is unknown, and the whole answer None when a job ahead of it has none
        (``at_least`` then says what is known), or it has ended."""
        ahead = self._ahead(job_id, now)
        if ahead is None:
            return None
        job, waits = ahead
        if job.status == RUNNING:
            return None if waits[0] is None else (0.0, waits[0])
        if any(w is None for w in waits):
            return None
        start = float(sum(waits))
        return start, None if job.estimate is None else start + job.estimate

    def at_least(self, job_id: str, now: float | None = None) -> tuple[float, int] | None:
        """(the seconds a waiting job waits at least, how many jobs before it have no expected length): what is known
        of its start when ``expected`` cannot say it; None once it runs or has ended."""
        ahead = self._ahead(job_id, now)
        if ahead is None or ahead[0].status != QUEUED:
            return None
        waits = ahead[1]
        return float(sum(w for w in waits if w is not None)), sum(w is None for w in waits)

    def _ahead(self, job_id: str, now: float | None) -> tuple[Job, list[float | None]] | None:
        """A job and the seconds each job before it in its lane still needs (None: unknown); a running job's own
        seconds left alone; None once it has ended."""
        now = time.time() if now is None else now
        with self._lock:
            job = self._jobs.get(job_id) if isinstance(job_id, str) else None
            if job is None or job.status in FINISHED:
                return None
            if job.status == RUNNING:
                return job, [_left(job, now)]
            ahead = [j for j in self._jobs.values() if j.status == RUNNING and j.lane == job.lane]
            order = self._order(job.lane)
            ahead += [self._jobs[i] for i in order[:order.index(job_id)]] if job_id in order else []
            return job, [_left(j, now) if j.status == RUNNING else j.estimate for j in ahead]

    def move_up(self, job_id, owner: str | None = None, check_owner: bool = False) -> Job:
        """Move a waiting job to the front of its lane: of its client's own waiting jobs, whose turn among the other
        clients stays as it was (a hosted server's fairness holds). ``check_owner``: only ``owner``'s own job moves.
        A job that is not there, not its owner's or no longer waiting is refused in one line (``SessionError``)."""
        with self._lock:
            job = self._jobs.get(job_id) if isinstance(job_id, str) else None
            if job is None or (check_owner and job.owner != owner):
                raise SessionError(f"no waiting job {str(job_id)[:40]!r} of yours here; pick one of your jobs that "
                                   "waits in the Jobs list")
            if job.status != QUEUED:
                raise SessionError(f"job {job.id} is {job.status}, not waiting: only a waiting job can be moved up")
            job.first = time.time()
            self._save(job)
            self._wake.notify_all()
            return job

    def cancel(self, job_id: str) -> bool:
        """Cancel a queued job now, or a running one at its next step."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.status in FINISHED:
                return False
            if job.status == QUEUED:
                job.status, job.finished, job.message = CANCELLED, time.time(), "cancelled before it started"
                self._fns.pop(job_id, None)
                self._save(job)
                self._wake.notify_all()  # who waits for it
                return True
            ctx = self._contexts.get(job_id)
        if ctx is not None:
            ctx.cancel.set()
        return True

    def get(self, job_id: str) -> Job | None:
        if not isinstance(job_id, str):  # a page may send anything
            return None
        with self._lock:
            return self._jobs.get(job_id)

    def jobs(self, kind: str | None = None) -> list[Job]:
        with self._lock:
            items = [j for j in self._jobs.values() if kind is None or j.kind == kind]
        return sorted(items, key=lambda j: j.created, reverse=True)

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """The job once it has ended and its record is written (or as it stands after ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._wake:
            while True:
                job = self.get(job_id)
                if job is None or job.status in FINISHED:
                    return job
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return job
                self._wake.wait(left)

    def job_dir(self, job_id: str) -> Path:
        path = self.root / job_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- internals -----------------------------------------------------------------------------
    def _order(self, lane: str) -> list[str]:
        """The waiting jobs of ``lane`` in the order they will run: each round takes the next job of every client
        (or owner), the one served longest ago in this lane first; a client's own jobs in ``_rank`` order
        (``_lock`` held)."""
        queued = [i for i in self._waiting if self._jobs[i].status == QUEUED and self._jobs[i].lane == lane]
        owners = list(dict.fromkeys(_turn(self._jobs[i]) for i in queued))
        owners.sort(key=lambda o: self._served.get((lane, o), float("-inf")))
        per_owner = {o: sorted((i for i in queued if _turn(self._jobs[i]) == o), key=lambda i: _rank(self._jobs[i]))
                     for o in owners}
        order, rounds = [], max((len(v) for v in per_owner.values()), default=0)
        for r in range(rounds):
            order += [jobs[r] for jobs in per_owner.values() if r < len(jobs)]
        return order

    def _next(self, lane: str) -> str:
        with self._lock:
            while True:
                self._waiting = [i for i in self._waiting if self._jobs[i].status == QUEUED]
                order = self._order(lane)
                if order:
                    self._waiting.remove(order[0])
                    self._served[(lane, _turn(self._jobs[order[0]]))] = time.monotonic()
                    return order[0]
                self._wake.wait()

    def _work(self, lane: str) -> None:
        while True:
            job_id = self._next(lane)
            with self._lock:
                job = self._jobs[job_id]
                fn, context = self._fns.pop(job_id, (None, None))
                if job.status != QUEUED or fn is None:
                    continue
                ctx = JobContext(self, job)
                self._contexts[job_id] = ctx
                job.status, job.started = RUNNING, time.time()
            self._save(job)
            outcome: dict = {}

            def body(fn=fn, context=context, ctx=ctx, outcome=outcome):
                try:
                    outcome["result"] = context.run(_in_place, fn, ctx)
                except BaseException as err:  # noqa: BLE001 - a job must never take the runner down
                    outcome["error"], outcome["trace"] = err, traceback.format_exc()

            thread = threading.Thread(target=body, name=f"graftui-job-{job_id}", daemon=True)
            thread.start()
            stopped = self._watch(thread, job, ctx)
            if stopped is not None and self.after_forced_stop is not None:
                with contextlib.suppress(Exception):
                    self.after_forced_stop()
            err = stopped or outcome.get("error")
            if isinstance(err, Outgrown):
                if self._move(job, fn, context, err):
                    continue
                err = Cancelled(f"{job.kind} cancelled")  # while it outgrew its lane
            end: dict = {}
            try:
                if err is None:
                    end = {"result": outcome.get("result") or {}, "status": DONE, "fraction": 1.0,
                           "message": job.moved or "done"}
                elif isinstance(err, Cancelled) and not isinstance(err, TimeLimit):
                    end = {"status": CANCELLED, "message": "cancelled"}
                else:
                    if not isinstance(err, TimeLimit):  # a failure, not a limit: its traceback is kept
                        with contextlib.suppress(OSError):
                            (self.job_dir(job_id) / "error.log").write_text(outcome.get("trace", ""))
                        log.warning("job %s failed: %s", job_id, err)
                    end = {"status": FAILED, "error": message(err), "message": message(err)}
            finally:
                resume.forget(self.job_dir(job_id))  # it ended: nothing of it continues
                with self._lock:  # the end is seen with its record written: who waits for it reads the file
                    for name, value in (end or {"status": FAILED, "message": "failed"}).items():
                        setattr(job, name, value)
                    job.finished = time.time()
                    self._contexts.pop(job_id, None)
                    self._save(job)
                    self._wake.notify_all()

    def _watch(self, thread: threading.Thread, job: Job, ctx: JobContext) -> BaseException | None:
        """Wait for a job's thread. A job that stops reporting (a loop that never calls ``report``) is stopped all
        the same: STOP_GRACE seconds past its time limit, or after a cancel, the runner raises in its thread
        (``PyThreadState_SetAsyncExc``; it lands at the thread's next Python instruction, so a long call into torch
        ends first). Returns the error that stopped it, None when it ended by itself."""
        cancelled_at, stop, raised_at = None, None, 0.0
        while thread.is_alive():
            thread.join(WATCH_SECONDS)
            now = time.time()
            if not thread.is_alive():
                break
            if ctx.cancel.is_set() and cancelled_at is None:
                cancelled_at = now
            limit, ran = self.max_seconds, now - (job.started or now)
            if stop is None and limit and ran > limit + STOP_GRACE:
                stop = _limit_stop(limit)
            elif stop is None and job.lane == QUICK and ran > self.quick_limit + STOP_GRACE:
                stop = _outgrown(ran, None, self.quick_limit)
            elif stop is None and cancelled_at is not None and now - cancelled_at > STOP_GRACE:
                stop = Cancelled(f"{job.kind} cancelled")
            if stop is not None and now - raised_at > STOP_GRACE:  # again, should the job have caught it
                log.warning("job %s did not stop by itself; raising %s in its thread", job.id, type(stop).__name__)
                _raise_in(thread, type(stop))
                raised_at = now
        return stop

    def _save(self, job: Job, throttle: bool = False, required: bool = False) -> None:
        """Write a job's record; a record that cannot be written (a full disk) is logged, and the runner goes on
        with the job as it holds it (``required``: raised, for a job not queued yet)."""
        now = time.time()
        if throttle and now - self._last_save.get(job.id, 0.0) < 0.5:
            return
        self._last_save[job.id] = now
        with self._lock:
            text = json.dumps(job.as_dict(), default=str)
        try:
            atomic_write(self.job_dir(job.id) / "job.json", lambda tmp: Path(tmp).write_text(text))
        except OSError as err:
            if required:
                raise
            log.warning("the record of job %s could not be written: %s", job.id, err)

    def _move(self, job: Job, fn: JobFn, context: contextvars.Context, why: Outgrown) -> bool:
        """Queue a quick-lane job that outgrew its lane again in the main lane, where it continues from where it was
        (False when it was cancelled meanwhile: it ends as cancelled). Its length there is what its own pace foretold
        it still needs."""
        with self._lock:
            ctx = self._contexts.pop(job.id, None)
            if ctx is not None and ctx.cancel.is_set():
                return False
            ran = time.time() - (job.started or time.time())
            total = _foreseen(job, time.time())
            left = _left(job, time.time())
            job.lane, job.estimate = MAIN, left if left is not None else max(total or 0.0, ran, job.estimate or 0.0)
            job.moved = f"moved to the main lane after {ran:,.0f} s in the quick lane: {why}"
            self._requeue(job, fn, context, f"{job.moved}; it {_continues(self.job_dir(job.id))} there")
        log.info("job %s %s", job.id, job.message)
        return True

    def _requeue(self, job: Job, fn: JobFn, context: contextvars.Context, message: str) -> None:
        """Queue ``job`` again, to run ``fn`` (``_lock`` held): a job moved out of the quick lane, or one a restart
        interrupted. It keeps its progress (its next run's entries say which run they are of) and its fraction; its
        work continues where a checkpoint kept its place (``resume``)."""
        job.status, job.started, job.finished = QUEUED, None, None
        job.run, job.run_from = job.run + 1, job.fraction
        job.message = message
        self._fns[job.id] = (fn, context)
        self._waiting.append(job.id)
        self._save(job)
        self._wake.notify_all()

    def _load_existing(self) -> None:
        """Every job on disk; one the server was running or holding when it stopped waits for ``revive``."""
        self._restart: list[tuple[str, str]] = []  # (job id, the status it had), in the order they were submitted
        for path in sorted(self.root.glob("*/job.json")):
            job = _read_job(path)
            if job.status not in FINISHED:  # the server stopped while it ran or waited
                self._restart.append((job.id, job.status))
                job.status, job.message = INTERRUPTED, "interrupted by a restart"
                job.finished = job.finished or time.time()
                self._save(job)
            self._jobs[job.id] = job
        self._restart.sort(key=lambda item: self._jobs[item[0]].created)

    def revive(self, rebuild: Callable[[Job], JobFn | None]) -> list[str]:
        """Queue again the jobs a restart interrupted, each as ``rebuild`` makes it from its record (None: it stays
        interrupted). A job that waited runs as it would have; one that was running runs again, once, continuing from
        its last checkpoint (``resume``): a job found running by a second restart may be what stopped the server, so
        it is left for its user to run again. Call once, when the server starts; returns the ids queued again."""
        with self._lock:
            pending, self._restart = self._restart, []
        queued = []
        for job_id, was in pending:
            job = self._jobs[job_id]
            if job.status != INTERRUPTED or (was == RUNNING and job.restarts >= 1):
                continue
            try:
                fn = rebuild(job)
            except Exception as err:  # noqa: BLE001 - a record that no longer makes a job stays interrupted
                log.warning("job %s cannot run again after the restart: %s", job_id, err)
                fn = None
            if fn is None:
                continue
            with self._lock:
                job.restarts += was == RUNNING
                self._requeue(job, fn, contextvars.copy_context(),
                              f"the server restarted while it ran: it {_continues(self.job_dir(job_id))}"
                              if was == RUNNING else "queued again after a server restart")
            queued.append(job_id)
        return queued


def _in_place(fn: JobFn, ctx: JobContext) -> dict:
    """Run ``fn`` with its job's folder as the place its mask learning keeps its checkpoints (``resume``)."""
    with resume.kept_in(ctx.dir / resume.FOLDER):
        return fn(ctx)


def _continues(job_dir: Path) -> str:
    """How a job queued again goes on: from the step its checkpoint kept, else from its start."""
    at = resume.standing(job_dir)
    return "runs again from its start (no mask learning of it kept a checkpoint)" if at is None else \
        f"continues from step {at[0]} of {at[1]}"


def _raise_in(thread: threading.Thread, kind: type[BaseException]) -> None:
    """Raise ``kind`` in another thread at its next Python instruction."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(kind))


def _without_out(params: dict | None) -> dict:
    return {k: v for k, v in (params or {}).items() if k != "out"}


PACE_AFTER = 0.05  # a running job's own pace foretells its end once it is this far; before, its estimate does


def _foreseen(job: Job, now: float) -> float | None:
    """The seconds this run of a job will take in all, at the pace of its own steps once they have taken it PACE_AFTER
    further than its first (loading models before the first step says nothing of the pace after it); None before.
    Only the steps of the run under way count: an earlier run's times were measured from another start."""
    first = next((p for p in job.progress if isinstance(p.get("fraction"), (int, float))
                  and p.get("run", 0) == job.run), None)
    ran = max(now - (job.started or now), 0.0)
    if first is None or job.fraction - first["fraction"] < PACE_AFTER:
        return None
    done = min(job.fraction, 1.0)
    return ran + (1.0 - done) * max(ran - first["time"], 0.0) / (done - first["fraction"])


def _left(job: Job, now: float) -> float | None:
    """Seconds a running job still needs: at the pace of its own steps once they say (``_foreseen``), else at its
    pace so far once it is PACE_AFTER along, else its estimate less the time it has run (never below 0); None when
    none of these is known."""
    ran = max(now - (job.started or now), 0.0)
    total = _foreseen(job, now)
    if total is not None:
        return max(total - ran, 0.0)
    done = min(job.fraction, 1.0)
    if done - job.run_from >= PACE_AFTER:  # this run's share of the work, at this run's pace
        return ran * (1.0 - done) / (done - job.run_from)
    return None if job.estimate is None else max(job.estimate - ran, 0.0)


def _rank(job: Job) -> tuple:
    """Where a waiting job stands among its client's: one its owner moved up first (the latest moved first), then
    shortest expected first, each job's wait counting in its favour one second for one second: its expected length
    less the time it has waited, which is its submission time plus its length less now, so the order of the jobs
    waiting never changes while they wait (``expected`` foresees the order the lane keeps) and only a job submitted
    later can pass one. A job is so passed only by a job that ends, by its own estimate, before it would have ended
    had it started when it was submitted (a later job of length L passes one of length E submitted w seconds before
    it only while L < E − w): once it has waited its own length, no newcomer passes it, so a long job is never
    starved. A job of unknown length is ranked as one of UNKNOWN_SECONDS: after the known ones submitted with it,
    aging alike. Ties keep the order submitted."""
    if job.first:
        return (0, -job.first, job.created)
    return (1, job.created + (job.estimate if job.estimate is not None else UNKNOWN_SECONDS), job.created)


def _turn(job: Job) -> str | None:
    """Whose turn a job waits for: its client's (one address, however many sessions), else its owner's."""
    return job.client or job.owner


_FIELD_TYPES = {"id": str, "kind": str, "title": str, "params": dict, "status": str, "progress": list,
                "message": str, "result": (dict, type(None)), "error": (str, type(None)), "owner": (str, type(None)),
                "client": (str, type(None)), "lane": str, "estimate": (int, float, type(None)),
                "work": (int, float, type(None)), "restarts": int, "moved": str, "first": (int, float), "run": int,
                "run_from": (int, float),
                "created": (int, float), "started": (int, float, type(None)), "finished": (int, float, type(None)),
                "fraction": (int, float)}
_TIMES = ("created", "started", "finished", "fraction", "estimate", "work", "first", "run_from")  # numbers, finite
# and not below 0


def _read_job(path: Path) -> Job:
    """A job record from disk; a damaged one (unreadable, truncated, not a job) is listed as a failed job
    that says so, and its file is left as it was, so one bad file never stops the server. A damaged record keeps
    the owner it names, if any; one that names none is nobody's (a hosted page lists it to no session)."""
    data = None
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"it holds {type(data).__name__}, not a job")
        for name, kind in _FIELD_TYPES.items():
            if name in data and not isinstance(data[name], kind):
                what = getattr(kind, "__name__", None) or ("number" if float in kind else "value of its kind")
                raise ValueError(f"its field '{name}' is not a {what}")
        for name in _TIMES:
            value = data.get(name)
            if value is not None and (isinstance(value, bool) or not math.isfinite(value) or value < 0):
                raise ValueError(f"its field '{name}' is not a number of at least 0")
        if data.get("lane", MAIN) not in LANES:
            raise ValueError(f"unknown lane '{data['lane']}'")
        job = Job(**{k: v for k, v in data.items() if k in Job.__dataclass_fields__})
        if job.id != path.parent.name:
            raise ValueError("its id does not match its folder")
        if job.status not in FINISHED | {QUEUED, RUNNING}:
            raise ValueError(f"unknown status '{job.status}'")
        float(job.fraction)
        return job
    except (OSError, ValueError, TypeError) as err:
        reason = first_line(err)
        owner = data.get("owner") if isinstance(data, dict) and isinstance(data.get("owner"), str) else \
            _owner_beside(path)
        return Job(id=path.parent.name, kind=DAMAGED, title=f"damaged job record ({path.parent.name})", params={},
                   status=FAILED, created=_mtime(path), finished=_mtime(path), owner=owner,
                   error=f"the record of this job is damaged and was not loaded: {reason}")


def _owner_beside(record: Path) -> str:
    """The owner a job's folder names beside its record (written when it was submitted), else nobody."""
    try:
        owner = (record.parent / OWNER_FILE).read_text()[:64]
    except (OSError, UnicodeDecodeError):
        return NOBODY
    return owner if owner.isprintable() else NOBODY


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()
