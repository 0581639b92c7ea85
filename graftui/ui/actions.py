"""What the app's buttons do: submit library flows as jobs, and turn results into labelled tables.

Each ``submit_*`` function takes plain values (what the widgets hold), defines the job body as a
closure over library calls and hands it to the shared :class:`~graftui.jobs.JobRunner`. The
tables are built from job results only, so they can be rebuilt after a reload or a restart.

Over 700 lines because it holds one submit function per form of the app (about twenty) and the tables of each
result; splitting them by tab would split the one place a widget's value becomes a request.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import re
import shutil
import threading
import time
from pathlib import Path

import pandas as pd

from .. import bundle, card, flows, hosted, lanes, settings
from ..config import (BODY_LABELS, DEFAULT_BASE, DEFAULT_BUILD_SECONDS, DEFAULT_EXAMPLES_PER_CLASS, DEFAULT_FINETUNED,
                      DEFAULT_FINETUNED_REFS, FT_LABEL, Budget, GraftableSpec, is_default_finetuned)
from ..tasks.completion.data import OFFLINE_SKILLS, completion_columns
from ..tasks.classification.data import OFFLINE_TASKS, all_as_test, preview
from ..errors import ModelError, RegionError, RequestError
from ..hosted import check_rows, check_upload, safe_name, save_upload
from ..formatting import difference_value, minutes, num, pct, undecided
from ..flows.common import own_pairs, same_model
from ..jobs import FINISHED, MAIN, QUEUED, RUNNING, Job
from ..localizers import get_method
from ..paths import atomic_write, new_path, short_ref
from ..regions import RegionRecord, check_fits, listing_row, load as load_region_file, save, settings_of
from ..requests import (
    AnatomyRequest, ComposeRequest, ContinualRequest, EvaluateRequest, ExportRequest, FinetuneRequest, LocalizeRequest,
    MultitaskRequest, PairRequest, PredictRequest, ReproduceRequest, RetrainRequest, SweepRequest, TaskFields, WiseRequest,
    PushRequest, parse_label_map, parse_list,
)
from ..tasks.classification.scoring import MAX_DISAGREEMENTS as MAX_SHOWN, align_labels
from ..flows.replicates import replicate_groups
from ..kinds import CLASSIFICATION, COMPLETION_KIND, KINDS, kind_in, kind_named, named_kind
from . import store
from .kinds import app_of

# -- jobs table ----------------------------------------------------------------------------------
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
            "progress": f"{100 * job.fraction:.0f} %" if job.status != QUEUED else wait_words(runner, job),
            "duration": _duration(job),
            "message": job.error or job.message,
        })
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def job_signature(runner) -> tuple:
    """Changes whenever anything shown in the jobs table changes."""
    return tuple((j.id, j.status, round(j.fraction, 2), j.message, int(j.duration or 0),
                  wait_words(runner, j) if j.status == QUEUED else None) for j in runner.jobs()[:40])


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


def when_words(expected: tuple[float, float | None] | None, waiting: bool) -> str:
    """When a job is expected to start and end (``JobRunner.expected``), or why that is not known."""
    if expected is None:
        return " · start unknown (no past run of a job before it)" if waiting else ""
    start, end = expected
    if not waiting:
        return "" if end is None else f" · {about(end)} left"
    words = f" · starts in {about(start)}"
    return words + (f", ends in {about(end)}" if end is not None else ", length unknown (no past run)")


def wait_words(runner, job: Job) -> str:
    """A waiting job's place in its lane, and when it is expected to start and end."""
    return queue_words(runner.place(job.id), job.lane) + when_words(runner.expected(job.id), waiting=True)


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
    run = [last]  # this stage's steps: counting up to the same total
    for p in reversed(events[:-1]):
        if p["steps"] != steps or p["step"] >= run[-1]["step"] or len(run) > PACE_STEPS:
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


def _armed_at(armed) -> float | None:
    """When a confirm button's first press armed it (its memory: (key, when)); None when it is not armed."""
    ok = isinstance(armed, (list, tuple)) and len(armed) == 2 and isinstance(armed[1], (int, float))
    return armed[1] if ok else None


def confirms(armed, key: str, now: float) -> bool:
    """Whether a press confirms what the first press of its button named: the same ``key`` (a job, a region), within
    CONFIRM_SECONDS (``armed``: the button's memory, (key, when))."""
    at = _armed_at(armed)
    return at is not None and armed[0] == key and 0 <= now - at <= CONFIRM_SECONDS


def expired(armed, now: float) -> bool:
    """Whether a button armed by a first press has waited past CONFIRM_SECONDS: it goes back to its first look."""
    at = _armed_at(armed)
    return at is not None and now - at > CONFIRM_SECONDS


def cancel_step(runner, job: Job | None, armed, now: float) -> tuple[str, tuple | None, str]:
    """One press of a Cancel button: (the status line, the button's new memory, its look: "off" for nothing to
    cancel, "armed" asking to confirm, "ready"). The first press on a waiting or running job arms the button; a
    second on the same job within CONFIRM_SECONDS cancels it."""
    if job is None:
        return "Nothing to cancel.", None, "off"
    if job.status in FINISHED:
        return f"**{md(job.title)}** has already finished ({job.status}).", None, "off"
    if hasattr(runner, "check_cancel"):
        runner.check_cancel(job.id)  # a job this page may not cancel is refused at the first press
    if confirms(armed, job.id, now):
        ok = runner.cancel(job.id)  # refuses a job that is not this page's own
        return (f"Cancel requested for **{md(job.title)}**." if ok else
                f"**{md(job.title)}** has already finished ({job.status})."), None, "off"
    return (f"Press **Confirm cancel** within {CONFIRM_SECONDS:g} s to stop **{md(job.title)}** [{job.id}]; what it "
            "has not saved is lost."), (job.id, now), "armed"


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
    return when_words(runner.expected(job.id), waiting=job.status == QUEUED)


def job_line(runner, job: Job | None) -> str:
    """``job_status_line`` with the job's place in ``runner``'s lane, and when it should start and end."""
    return job_status_line(job, runner.place(job.id) if job is not None and job.status == QUEUED else None,
                           job_when(runner, job))


def submitted_line(job: Job) -> str:
    """The banner after a submission, with its lane and the default model it builds first (``lanes.plan_words``);
    ``settled_banner`` replaces it when the job ends."""
    more = lanes.plan_words(job, lanes.default_to_build((job.params or {}).get("finetuned")))
    return (f"Submitted **{md(job.title)}** (job {job.id}); it runs in the background, see its progress below."
            + (f" {more}" if more else ""))


def active_banner(runner) -> str | None:
    """The banner of a page opened while jobs run or wait (its own, or the server's): which one runs, how far it
    is, and how many wait; ``settled_banner`` replaces it when that job ends. None when nothing runs or waits."""
    jobs = runner.jobs()
    running = [j for j in jobs if j.status == RUNNING]
    waiting = [j for j in reversed(jobs) if j.status == QUEUED]  # oldest first
    if not running and not waiting:
        return None
    return job_banner(runner, (running or waiting)[0])


def job_banner(runner, job: Job) -> str:
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
    return text + ". Its tab shows its progress; **Jobs** below lists every job."


_SUBMITTED = re.compile(r"(?:Submitted|Running:|Waiting:) \*\*.*\*\* \(job ([^)\s]+)\)", re.S)


def settled_banner(banner) -> str | None:
    """The banner once the job it announces has ended, or ``None`` while it runs (or it announces none)."""
    m = _SUBMITTED.match(banner or "")
    job = store.runner().get(m.group(1)) if m else None
    if job is None or job.status not in FINISHED:
        return None
    took = f" in {_duration(job)}" if job.duration is not None else ""
    return f"**{md(job.title)}** (job {job.id}) ended: {job.status}{took}. Its result is in its tab."


def card_markdown(lines: list[str]) -> str:
    """The result card (graftui.card) as a quoted block under the job's line."""
    return "\n>\n".join(f"> {md(line)}" for line in lines)


# -- requests from widgets --------------------------------------------------------------------------
def data_columns(task: str, text=None, pair=None, label=None) -> dict:
    """The column fields of a request from the mapping widgets; offline tasks have their own columns,
    so a mapping left over from an uploaded file is not sent with them."""

    if str(task).strip().lower() in OFFLINE_TASKS or str(task).strip().lower() in OFFLINE_SKILLS:
        return {}
    clean = lambda v: (str(v).strip() or None) if v not in (None, "", "(none)", "(guess)") else None  # noqa: E731
    return {"text_column": clean(text), "pair_column": clean(pair), "label_column": clean(label)}


def whole(value) -> int | None:
    """A number widget's value as a whole number; an empty box means 'not set' (the request's default).
    Every other value, 0 and negatives too, goes to the request, which refuses it as the CLI does."""
    if value is None or value == "":
        return None
    return int(value)


def per_class(value) -> int | None:
    """The examples-per-class box: the default it shows (256) means the request's default, "up to 256,
    all there are when a class has fewer", so a small data set works as from the CLI; another number is exact."""

    n = whole(value)
    return None if n == DEFAULT_EXAMPLES_PER_CLASS else n


def submit(runner, request, title: str, on_result=None, kind: str | None = None) -> Job:
    """Validate ``request`` now (a bad field is a one-line message, no job), then run its flow as a job, in the lane
    ``lanes.plan`` gives it (from the request and the saved regions it reads); a job in the quick lane loads models of
    its own, since the main lane's may be grafted at the same time.

    The job's params are the request, so any result shows, and re-runs from, what made it.
    """

    hosted.check_request(request, store.guard())  # hosted: also the ceilings on work, and every path it names
    kind = kind or request.verb
    reads = [(e.task_kind.name, e.meta.finetuned) for e in store.regions_read(request)]
    plan = lanes.plan(request, kind, runner.history(), reads, runner.quick_held())

    def fn(ctx) -> dict:
        with own_pairs(plan.lane) if plan.lane != MAIN else contextlib.nullcontext():
            result = flows.run(request, progress=ctx.report, cancel=ctx.cancel, guard=store.guard())
        doc = result.as_dict()
        return on_result(result, doc) if on_result else doc

    return runner.submit(kind, title, fn, request.as_dict(), lane=plan.lane, estimate=plan.estimate, work=plan.work)


def prompt_fields(head=None, template=None, label_words=None) -> dict:
    """The loading fields of a request from the prompt widgets (empty means: the checkpoint's own, or the default)."""
    clean = lambda v: (str(v).strip("\n") if str(v).strip() else None) if v is not None else None  # noqa: E731
    return {"head": head or "auto", "template": clean(template), "label_words": clean(label_words)}


def pair_request(base: str, finetuned: str, prompt: dict | None = None, task: str | None = None,
                 columns: dict | None = None) -> PairRequest:
    """The Models tab's widgets as a request of the ``pair`` verb (an empty task: the default one)."""
    return PairRequest.make(base=base, finetuned=finetuned, **({"task": task} if task else {}), **(columns or {}),
                            **(prompt or {}))


def check_pair(base: str, finetuned: str, prompt: dict | None = None, task: str | None = None,
               columns: dict | None = None) -> dict:
    """Load (or reuse) the pair and describe it (flows.pair); a clear error when the two do not pair.

    A default fine-tuned model is built by a job, never by this button: until it is, the check says so.
    """
    if is_default_finetuned(finetuned) and not store.default_ready(finetuned):
        if finetuned.strip().lower() == DEFAULT_FINETUNED:
            raise ModelError(f"'{finetuned}' is still being prepared: follow the 'Prepare default model' job below, then "
                             "check again")
        build = DEFAULT_BUILD_SECONDS.get(finetuned.strip().lower(), 300)
        raise ModelError(f"'{finetuned}' is built on first use: start a localization with it (the job builds it first, "
                         f"about {build / 60:.0f} min on 2 CPU cores, in the main lane), then check again")
    return flows.pair(pair_request(base, finetuned, prompt, task, columns), guard=store.guard()).pair


def preview_prompt(finetuned: str, task: str, columns: dict, prompt: dict) -> dict:
    """What a language model reads for the task's first training example, and each label word's tokens."""
    return flows.preview_prompt(pair_request(DEFAULT_BASE, finetuned, prompt, task, columns), store.guard())


def read_data_upload(file) -> tuple[Path, dict]:
    """An uploaded data file saved among the session's uploads, with its columns, first rows and split sizes;
    a file too large for this server is refused (and deleted again by save_upload)."""

    def read(path):
        info = preview(str(path), allow_local=True)
        check_rows(path.name, sum(info["splits"].values()))
        spec = completion_columns(info["columns"])
        if spec is not None:  # a completion or chat file: its columns say so, and no text column is missing
            said = (f"the chat column '{spec.messages_column}'" if spec.messages_column else
                    f"the prompt column '{spec.prompt_column}' and the completion column '{spec.completion_column}'")
            info["warnings"] = [w for w in info["warnings"] if "could not guess" not in w]
            info["completion"] = f"read as a completion task, by {said}"
        return info

    return save_upload(file, read)


def load_task_checked(ref: str, columns: dict):
    """A task read as the flows read it (hosted checks and row cap included)."""
    return flows.get_task(ref, TaskFields(task=ref, **columns).data_spec(), store.guard())


COUNT_COLUMNS = ["parameters", "count", "share of total"]
COUNT_ROWS = [
    ("graftable", "graftable (may be in a region: shared body, embeddings excluded)"),
    ("head", "head-only (fine-tuned classifier, always taken from FT)"),
    ("excluded", "excluded (shared but frozen out, e.g. embeddings)"),
    ("total", "total (all parameters of the fine-tuned model)"),
]


def share(x: float) -> str:
    """A share of the total in the counts table: two decimals, or as many as keep it non-zero (0.0034%)."""
    return pct(x, 2) if x == 0 or x >= 0.01 else pct(x)


def counts_table(counts: dict | None) -> pd.DataFrame:
    """Parameter counts of a pair; blank cells until the pair has been checked."""
    counts = counts or {}
    total = max(int(counts.get("total") or 0), 1)
    rows = [{"parameters": label,
             "count": f"{int(counts[key]):,}" if key in counts else "not checked yet",
             "share of total": share(int(counts[key]) / total) if key in counts else ""}
            for key, label in COUNT_ROWS]
    return pd.DataFrame(rows, columns=COUNT_COLUMNS)


def budget_for(task, log_sparsity):
    """The budget slider's position for ``task``: its kind's budget (a completion skill needs 1 %) while the slider
    sits at a kind's default; a budget chosen by hand, or a task whose kind only reading it could tell, keeps it."""
    kind = named_kind(task)
    defaults = {math.log10(k.sparsity) for k in KINDS.values()}
    at_default = log_sparsity is not None and any(abs(float(log_sparsity) - d) < 1e-9 for d in defaults)
    return math.log10(kind.sparsity) if kind is not None and at_default else None


def pair_of(finetuned: str) -> tuple[str, str] | None:
    """(base, task) a fine-tuned choice was made from: an offline default's own, or what the record of a checkpoint
    fine-tuned here says (None: not known, e.g. a Hub id)."""
    if finetuned in DEFAULT_FINETUNED_REFS:
        return DEFAULT_FINETUNED_REFS[finetuned]
    record = next((c["record"] for c in store.list_checkpoints() if c["path"] == finetuned), None) or {}
    base, task = record.get("base"), record.get("task")
    return (base, task) if isinstance(base, str) and isinstance(task, str) and base and task else None


def default_ood(task: str) -> list[str]:
    """The OOD tasks a task starts with: the other sentiment tasks for a sentiment task, none for another (a
    completion or harness task has none)."""
    kind = named_kind(task)
    return EvaluateRequest.make().ood_tasks(task) if kind is not None and kind.scores_ood else []


def budget_text(log_sparsity: float, counts: dict | None) -> str:
    """What a budget slider position means: the sparsity, and k when the graftable count is known."""
    s = 10 ** float(log_sparsity)
    if counts and counts.get("graftable"):

        g = int(counts["graftable"])
        k = Budget(sparsity=s).resolve(g)
        return (f"**k = {k:,}** parameters = **{s:.4%}** of the {g:,} graftable parameters "
                f"(sparsity 10^{float(log_sparsity):.2f} = {s:.1e})")
    return (f"sparsity **{s:.1e}** = **{s:.4%}** of the graftable parameters; "
            "check the pair on the Models tab to see k")


# -- job submissions ----------------------------------------------------------------------------
_prepare_lock = threading.Lock()


def submit_prepare(runner) -> Job | None:
    """Build the default fine-tuned model once, as a visible job; None when it is already cached."""
    if store.default_ready():
        return None
    with _prepare_lock:
        for job in runner.jobs("prepare"):
            if job.status in (QUEUED, RUNNING):
                return job

        def fn(ctx) -> dict:
            flows.ensure_models([DEFAULT_FINETUNED], progress=ctx.report, cancel=ctx.cancel)
            ctx.report({"stage": "checking the pair", "fraction": 0.99})
            pair = flows.get_pair(DEFAULT_BASE, DEFAULT_FINETUNED, GraftableSpec(), store.guard())
            return {"checkpoint": str(store.default_checkpoint()), "counts": pair.counts()}

        return runner.submit("prepare", f"Prepare default model ({DEFAULT_FINETUNED}: {DEFAULT_BASE} fine-tuned on movies)", fn,
                             {"base": DEFAULT_BASE, "finetuned": DEFAULT_FINETUNED}, server=True)


def submit_localize(runner, *, base: str, finetuned: str, task: str, columns: dict, method: str, log_sparsity: float,
                    steps, examples_per_class, lr, seeds: str = "") -> Job:

    request = LocalizeRequest(base=base, finetuned=finetuned, task=task, **columns, method=method,
                              sparsity=10 ** float(log_sparsity), steps=whole(steps) or 0,
                              examples_per_class=per_class(examples_per_class), lr=float(lr or 0),
                              seeds=parse_seeds(seeds), check_n=LocalizeRequest.defaults()["check_n"])

    def saved(result, doc) -> dict:  # the flow's own result, and what the page reads of it by region id
        return {**doc, "region": Path(result.path).stem, "summary": result.record.summary(),
                "card": doc.get("card") or [],
                "seeds": [{"seed": e["seed"], "region": Path(e["path"]).stem} for e in doc.get("seeds") or []]}

    title = (f"Localize '{short_ref(task)}' in {short_ref(finetuned)} · {get_method(method).label} · "
             f"sparsity {request.sparsity:.1e}" + (f" · seeds {', '.join(map(str, request.seeds))}" if request.seeds
                                                   else ""))
    return submit(runner, request, title, saved)


def parse_seeds(text) -> list[int] | None:
    """The seeds box: empty for one run, or a list such as '0, 1, 2' (each seed its own region)."""
    if not str(text or "").strip():
        return None
    return parse_list(text, int, "seeds", "seed", "0, 1, 2")


def submit_finetune(runner, *, base: str, task: str, columns: dict, optimizer: str, lr, epochs, train_examples,
                    l1) -> Job:

    name = safe_name(f"{short_ref(base)}-{short_ref(task)}-{optimizer}-{time.strftime('%Y%m%d-%H%M%S')}")
    request = FinetuneRequest(base=base, task=task, **columns, optimizer=optimizer, lr=float(lr or 0), epochs=whole(epochs),
                              train_examples=int(train_examples or 0), l1=float(l1 or 0.0) if optimizer == "adamw" else 0.0,
                              out=str(store.checkpoints_dir() / name))

    def made(result, doc) -> dict:
        return {**doc, "checkpoint": result.out, "name": name}

    title = f"Fine-tune {short_ref(base)} on '{short_ref(task)}' · {optimizer} lr {float(lr or 0):g} · {whole(epochs)} epoch(s)"
    return submit(runner, request, title, made)


def of_pair(region_ids: list[str], finetuned: str) -> list[str]:
    """The picked regions made from ``finetuned``: picking another pair leaves no region of the last one picked."""
    entries = {e.id: e for e in store.list_regions()}
    return [r for r in region_ids or [] if r in entries and same_model(entries[r].meta.finetuned or "", finetuned or "")]


def _paths(region_ids: list[str], at_least: int = 1) -> list[str]:
    if len(region_ids or []) < at_least:
        raise RegionError("pick at least one region (run Localize first if the list is empty)" if at_least == 1
                          else f"pick at least {at_least} regions")
    return [str(store.region_path(rid)) for rid in region_ids]


def md(text) -> str:
    """User text (file, task and label names, messages quoting them) shown in Markdown as text, never as HTML."""
    return html.escape(str(text), quote=False)


def task_summary(task) -> str:
    """A checked task in one Markdown line: its kind, labels and split sizes, and what reading it left out."""
    sizes = ", ".join(f"{k} {len(s):,}" for k, s in task.splits.items())
    kind = "text-pair" if task.is_pair else "single-text"
    source = "an uploaded file" if settings.hosted() and task.source.startswith("local") else task.source
    line = (f"✓ **{md(task.name)}**: {kind} task with {task.num_labels} labels ({md(', '.join(task.label_names))}); "
            f"examples per split: {sizes}. Source: {md(source)}.")
    return line + "".join(f"\n\nNote: {md(note)}" for note in task.notes)


def upload_summary(path: Path, info: dict) -> tuple[str, str]:
    """(the Markdown beside an upload, the status line): its splits, and what reading it as a task would say."""
    splits = ", ".join(f"{k}: {v:,} rows" for k, v in info["splits"].items())
    text = f"Read **{md(path.name)}** ({splits}). Check the guessed columns, then press **Check column mapping**." \
        if not info.get("completion") else f"Read **{md(path.name)}** ({splits}), {md(info['completion'])}."
    text += "".join(f"\n\n⚠️ {md(w)}" for w in info.get("warnings") or [])
    status = f"✓ Read {path.name}." if not info.get("warnings") else f"Read {path.name}; see the warning beside it."
    return text, status


def ood_preview(task: str, columns: dict, ood: list[str], mapping: str | None) -> str:
    """How each OOD task will be read against the task: its test size and its labels' mapping, or why not."""
    if not ood:
        return "No OOD task: results score the in-distribution task only."
    kind = named_kind(task)
    if kind is not None and not kind.scores_ood:
        return (f"⚠️ '{md(short_ref(task))}' is a {kind.name} task, scored on its own test items only: clear the "
                "out-of-distribution tasks")
    labels = parse_label_map(mapping)
    main = load_task_checked(task, columns)
    lines = []
    for ref in ood:
        name = short_ref(ref)
        try:
            other = all_as_test(load_task_checked(ref, {}))  # scored on all its examples
            _, note = align_labels(main, other, labels)
            lines.append(f"✓ **{md(name)}**: {len(other.splits['test']):,} test examples; "
                         + md(note or f"same labels as {main.name} ({', '.join(main.label_names)})"))
        except Exception as err:  # noqa: BLE001 - each task says what is wrong with it
            lines.append(f"⚠️ **{md(name)}**: {md(err)}")
    return "\n\n".join(lines)


def submit_compare(runner, *, region_ids: list[str], ood: list[str], n, baselines: bool, ood_labels: str | None = None
                   ) -> Job:
    """Evaluate the picked regions on their own task; the Models tab's OOD tasks only for regions of a kind that
    scores them (a completion skill is never 'compared on amazon')."""
    if not any(kind_named(k).scores_ood for k in store.region_kinds(region_ids)):
        ood, ood_labels = [], None
    request = EvaluateRequest(regions=_paths(region_ids), ood=list(ood or []), n=whole(n), baselines=bool(baselines),
                              ood_labels=(ood_labels or "").strip() or None)
    title = f"Compare {len(region_ids)} region(s)" + (f" + {len(ood)} OOD task(s)" if ood else "")
    return submit(runner, request, title, kind="compare")


def predict_kind(region_ids) -> str:
    """The kind of task the picked regions were learned on, which decides what the Try box does: one sentence per
    line to classify, or the whole box as one prompt to generate from."""
    kinds = store.region_kinds(region_ids)
    if len(set(kinds)) > 1:
        raise RequestError("the picked regions were learned on tasks of different kinds ("
                           + ", ".join(f"{rid}: {k}" for rid, k in zip(region_ids, kinds))
                           + "); pick regions of one kind to try them on the same text")
    return kinds[0] if kinds else CLASSIFICATION.name


PREDICT_WORDS = {name: app_of(kind).try_words for name, kind in KINDS.items()}  # the Try box's label, button and table label


def submit_predict(runner, *, region_ids: list[str], text: str) -> Job:
    """The text typed in the box through the bare body, FT and each picked region's graft: one sentence per line to
    classify, or for completion regions the whole box as one prompt to generate from."""
    if not region_ids:
        raise RegionError("pick at least one region (run Localize first if the list is empty)")
    kind = kind_named(predict_kind(region_ids))
    texts = app_of(kind).try_texts(text)
    request = PredictRequest(regions=_paths(region_ids), texts=texts)
    return submit(runner, request, f"{app_of(kind).try_title(texts)} with {len(region_ids)} region(s)")


PREDICT_COLUMNS = list(app_of(CLASSIFICATION).predict_columns)
GENERATION_COLUMNS = list(app_of(COMPLETION_KIND).predict_columns)


def predict_table(result: dict) -> pd.DataFrame:
    """One row per sentence and model: the predicted class, its probability, every class's, and whether it
    decides as the fine-tuned model. For completion regions one row per model: its greedy generation for the
    prompt, and whether its answer is the fine-tuned model's (the task kind's ``predict_rows``)."""
    kind = kind_in(result, "kind")
    names = result.get("label_names") or []
    words = app_of(kind)
    return pd.DataFrame(words.predict_rows(result), columns=[*words.predict_columns, *(f"p({n})" for n in names)])


def parse_budgets(text: str) -> list[float]:
    """'1e-5, 1e-4, 0.001' -> sorted numbers (the request checks their range)."""
    return sorted(set(parse_list(text, float, "budgets", "budget", "1e-4, 1e-3, 1e-2")))


def submit_sweep(runner, *, base: str, finetuned: str, task: str, columns: dict, budgets: str, steps,
                 examples_per_class, lr, n, ood: list[str] | None = None, ood_labels: str | None = None,
                 keep: bool = False) -> Job:

    request = SweepRequest(base=base, finetuned=finetuned, task=task, **columns, sparsities=parse_budgets(budgets),
                           steps=whole(steps) or 0, examples_per_class=per_class(examples_per_class), lr=float(lr or 0),
                           n=whole(n), ood=None if ood is None else list(ood), ood_labels=(ood_labels or "").strip() or None,
                           keep=str(store.regions_dir()) if keep else None)
    title = (f"Sparsity sweep on '{short_ref(task)}' ({len(request.sparsities)} budgets × "
             f"{len(request.methods)} methods)")
    return submit(runner, request, title)


def overlap_for(region_ids: list[str]) -> dict:
    """The overlap matrix of the selected regions (compose without evaluation: cheap, no models)."""
    return flows.compose(ComposeRequest(regions=_paths(region_ids, 2))).matrix()


def submit_compose(runner, *, region_ids: list[str], resolve: str, n, stitch: bool = False) -> Job:
    paths = _paths(region_ids, 2)
    out = new_path(store.regions_dir(), "union", ".safetensors")
    request = ComposeRequest.make(regions=paths, resolve=resolve, evaluate=True, stitch=stitch, n=whole(n), out=str(out))

    def saved(result, doc) -> dict:
        return {**doc, "region": out.stem}

    title = f"Compose {len(paths)} regions (overlaps: {resolve}) and evaluate on each region's task"
    return submit(runner, request, title, saved)


def _over_seeds(request) -> str:
    return f" · seeds {', '.join(map(str, request.seeds))}" if request.seeds else ""


def submit_multitask(runner, *, tasks: list[str], group: list[str], log_sparsity: float, start: str, steps,
                     purify_steps, examples_per_class, n, seeds: str = "") -> Job:
    """The multi-task experiment on the offline default multi-task model (built on first need)."""

    request = MultitaskRequest(tasks=list(tasks or []), group=list(group) if group else None,
                               sparsity=10 ** float(log_sparsity), start=start, steps=whole(steps) or 0,
                               purify_steps=whole(purify_steps) if purify_steps is not None else 0,
                               examples_per_class=per_class(examples_per_class), n=whole(n), seeds=parse_seeds(seeds))
    title = f"Multi-task regions of {', '.join(request.tasks)} · sparsity {request.sparsity:.1e}" + _over_seeds(request)
    return submit(runner, request, title)


def parse_alphas(text: str) -> list[float]:
    """'0, 0.25, 0.5' -> numbers (the request checks they lie in [0, 1])."""
    return sorted(set(parse_list(text, float, "α values", "α", "0, 0.5, 1")))


def submit_wise(runner, *, region_id: str, alphas: str, ood: list[str], n, over_seeds: bool = False) -> Job:
    """WiSE curves of a region; ``over_seeds``: averaged with the other seeds' regions of its localize run."""
    others = seeds_of_run(region_id) if over_seeds and region_id else []
    if over_seeds and region_id and not others:
        raise RequestError(f"'{region_id}' has no other seeds saved: localize with Seeds such as 0, 1, 2, then pick one "
                           "of its regions; or untick 'over its seeds'")
    request = WiseRequest(region=_paths([region_id] if region_id else [])[0], alphas=parse_alphas(alphas),
                          ood=list(ood) if ood else None, n=whole(n), replicates=_paths(others) if others else None)
    over = f" · mean over its {len(others) + 1} seeds" if others else ""
    return submit(runner, request, f"WiSE curves of {region_id} ({len(request.alphas)} values of α){over}")


def submit_retrain(runner, *, region_id: str, epochs, train_examples, n) -> Job:
    request = RetrainRequest(region=_paths([region_id] if region_id else [])[0], epochs=whole(epochs),
                             train_examples=None if train_examples is None else int(train_examples), n=whole(n))
    return submit(runner, request, f"Re-train {region_id} from θ_pre, and BitFit")


def submit_continual(runner, *, tasks: list[str], log_sparsity: float, steps, examples_per_class, n,
                     seeds: str = "") -> Job:
    request = ContinualRequest(tasks=list(tasks or []), sparsity=10 ** float(log_sparsity), steps=whole(steps) or 0,
                               examples_per_class=per_class(examples_per_class), n=whole(n), seeds=parse_seeds(seeds))
    return submit(runner, request, f"Continual learning of {' → '.join(request.tasks)}" + _over_seeds(request))


def submit_reproduce(runner, *, quick: bool) -> Job:
    request = ReproduceRequest(quick=bool(quick))
    return submit(runner, request, f"Every experiment, one report ({'quick' if request.quick else 'full'} run)")


def submit_export(runner, *, region_id: str) -> Job:
    folder = new_path(store.downloads_dir(), f"{region_id}-graft")
    request = ExportRequest(region=str(store.region_path(region_id)), out=str(folder))

    def zipped(result, doc) -> dict:
        public_texts(folder)
        archive = shutil.make_archive(str(folder), "zip", root_dir=folder)
        shutil.rmtree(folder, ignore_errors=True)
        return {"zip": archive, "region": region_id, "k": result.k}

    return submit(runner, request, f"Export grafted checkpoint of {region_id}", zipped)


def submit_push(runner, *, region_id: str, repo: str, what: str, private: bool, n, token: str | None = None) -> Job:
    """Push a saved region to the Hub as a job (flows.hub.push). ``token`` (on a hosted server the visitor's
    Hugging Face sign-in) goes to the job's function only, never into its request, record or result; a push
    without a token it may use is refused here, before any job."""
    request = PushRequest.make(repo=(repo or "").strip() or None, region=str(store.region_path(region_id)), what=what,
                               private=bool(private), n=whole(n))
    hosted.check_request(request, store.guard())
    token = flows.hub.hub_token(token)  # hosted: the visitor's, or "Sign in with Hugging Face to push"

    def fn(ctx) -> dict:
        return flows.push(request, progress=ctx.report, cancel=ctx.cancel, guard=store.guard(), token=token).as_dict()

    return runner.submit("push", f"Push {region_id} to {request.repo}", fn, request.as_dict())


def request_file(job: Job | None) -> Path | None:
    """The request that made a job, as a JSON config (``graftui run`` takes it); None for jobs without one."""
    if job is None or "verb" not in (job.params or {}):
        return None
    path = store.downloads_dir() / f"request-{job.id}.json"
    if not path.exists():  # as the page sees it: no server path, no session id (store.public)
        atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(store.public(job.params), indent=2)))
    return path


def _region_file(region_id: str) -> Path | None:
    """A saved region's file in this workspace (None where it is no longer there)."""
    try:
        path = store.region_path(region_id)
    except (RegionError, ValueError):
        return None
    return path if path.is_file() else None


def reportable(job: Job | None) -> bool:
    """Whether a job has a report bundle to make: it finished with a result of a verb's request."""
    return job is not None and job.status == "done" and bool(job.result) and "verb" in (job.params or {})


def report_bundle(job: Job | None) -> str:
    """The report bundle (bundle.py) of a finished job, written once into this session's downloads."""
    if job is None:
        raise ValueError("pick a job in the list above first")
    if not reportable(job):
        raise ValueError(f"'{job.title}' has no result to report ({job.status}); pick a finished job")
    path = store.downloads_dir() / f"report-{job.id}.zip"
    if not path.exists():
        made = [(job.result or {}).get("region"), *(s.get("region") for s in (job.result or {}).get("seeds") or ())]
        outputs = [p for p in (_region_file(r) for r in made if isinstance(r, str)) if p is not None]
        bundle.write(store.public(job.params), store.public(job.result), path, outputs=outputs)
    return str(path)


def anatomy_of(region_id: str):
    return flows.anatomy(AnatomyRequest(region=str(store.region_path(region_id))))


def seeds_of_run(region_id: str) -> list[str]:
    """The other saved regions of ``region_id``'s localize run: made by the same request but for its seed."""
    entries = store.list_regions()
    ids = [e.id for e in entries]
    for members in replicate_groups(ids, entries).values():  # an entry's header meta is all the grouping reads
        if region_id in members:
            return [m for m in members if m != region_id]
    return []


def stability_of(region_id: str, seed_ids: list[str]):
    """Anatomy of ``region_id`` with its stability per part across it and the regions ``seed_ids`` (other seeds)."""
    return flows.anatomy(AnatomyRequest.make(region=str(store.region_path(region_id)),
                                             replicates=[str(store.region_path(i)) for i in seed_ids]))


def submit_ablation(runner, *, region_id: str, n) -> Job:
    """The region's graft without each layer's and each module type's part, scored on its own task (a job)."""
    n = whole(n)
    request = AnatomyRequest.make(region=str(store.region_path(region_id)), ablate=True,
                                  **({} if n is None else {"n": n}))
    return submit(runner, request, f"What each part of {region_id} is worth (n = {request.n})")


# -- result tables ------------------------------------------------------------------------------
# The headers under which the tables below (and the Laboratory's) hold numbers, dates and ids: the page never
# wraps such a cell, so a number is never split across lines ("0.8 / 29"); the other cells wrap between words.
NUMBER_COLUMNS = frozenset({
    "density (in region / tensor size)", "fan-in", "density (in region / fan-in)", "accuracy without it",
    "drop [95 % CI]", "mean per seed", "core (every seed)", "core / mean", "chance", "× chance",
    "n", "accuracy ↑ [95 % CI]", "share of FT gain", "Δ vs FT", "F1 ↑", "ECE ↓", "agree w/ FT", "k (params)",
    "sparsity (fraction of graftable)", "accuracy ↑", "retained FT accuracy", "ECE ↓ (10 bins)", "test examples",
    "Δ accuracy vs region alone", "params grafted", "|γi|", "|γj|", "|γi ∩ γj| shared params", "|γi ∩ γj| / |γj|",
    "|γi ∩ γj| / |γi|", "IoU", "in region", "graftable", "density (in region / graftable)", "share of region",
    "share of graftable", "created (UTC)", "progress", "duration", "count", "share of total", "size",
    "relative gain", "accuracy", "parameters trained", "α", "difference [95 % CI]", "McNemar p", "p", "FT p",
    "graft p", "budget", "exact match", "OOD accuracy", "seeds of run", "score mean", "score spread (std)",
    "score min – max", "ECE ↓ mean", "OOD accuracy mean", "runs", "scored",
})


def _pct(v) -> str:
    return pct(v, 1, missing="")


def _num(v, digits: int = 3) -> str:
    return num(v, digits, missing="")


COMPARE_COLUMNS = list(app_of(CLASSIFICATION).app_columns)
COMPLETION_COLUMNS = list(app_of(COMPLETION_KIND).app_columns)


def compare_table(result: dict) -> pd.DataFrame:
    """One row per (model, task), in the columns of its task kind; the note under the table says what each is."""
    kind = kind_in(result)
    return pd.DataFrame(app_of(kind).app_rows(result), columns=list(app_of(kind).app_columns))


GENERATION_WIDTH = 80  # characters of an answer or a generation a cell shows (the JSON and the bundle hold them whole)
GENERATIONS_LABEL = (f"Generations on the first test examples: the fine-tuned model, each graft and baseline, then the "
                     f"pre-trained model (texts cut at {GENERATION_WIDTH} characters; the report bundle holds them whole)")


def generations_table(result: dict) -> pd.DataFrame:
    """Prompt, reference, the reference's answer under the rule, and each model's answer and greedy generation side
    by side, marked as it was judged (``card.generation_cell``): the fine-tuned model first, then the grafts and
    baselines, the pre-trained model (whose generations run longest) last."""
    shown = result.get("generations") or []
    listed = list(dict.fromkeys(r["model"] for r in result.get("rows") or []))
    last = [m for m in listed if m in BODY_LABELS]
    models = [m for m in listed if m == FT_LABEL] + [m for m in listed if m != FT_LABEL and m not in last] + last
    out = [{"task": g.get("task", ""), "prompt": g["prompt"], "reference": g["reference"],
            "reference answer": g.get("reference_answer") or "",
            **{m: card.generation_cell(g, m, GENERATION_WIDTH) for m in models if m in g}} for g in shown]
    return pd.DataFrame(out, columns=["task", "prompt", "reference", "reference answer", *models])


STITCH_COLUMNS = ["task", "model", "test examples", "accuracy / exact match ↑", "loss/token ↓", "params grafted"]


def stitch_table(result: dict) -> pd.DataFrame:
    """Stitching: every model on every member's task (the stitched union, each fine-tune, task arithmetic)."""
    out = [{"task": r["task"], "model": r["model"], "test examples": r["n"], "accuracy / exact match ↑": _pct(r["accuracy"]),
            "loss/token ↓": _num(r.get("loss")) if "loss" in r else "",
            "params grafted": f"{r['region_size']:,}" if r.get("region_size") is not None else ""}
           for r in result.get("rows") or []]
    return pd.DataFrame(out, columns=STITCH_COLUMNS)


DIFFERENCE_COLUMNS = ["a − b", "task", "dist.", "metric", "difference [95 % CI]", "McNemar p", "reading"]


def differences_table(result: dict) -> pd.DataFrame:
    """Every paired difference of a result (a − b on the same test examples), those of its replicate groups over
    seeds included: the number, its interval, and whether the interval tells the two apart."""
    found = [*(result.get("differences") or ()), *(d for g in result.get("replicates") or () for d in g["differences"])]
    out = []
    for d in found:
        lo, hi = d["ci"]
        m = d.get("seeds") or 1
        apart = "higher" if lo > 0 else "lower" if hi < 0 else None
        out.append({"a − b": f"{d['a']} − {d['b']}", "task": d["task"],
                    "dist.": "ID" if d.get("distribution", "in") == "in" else "OOD",
                    "metric": "ECE" if d["metric"] == "ece" else d["metric"],
                    "difference [95 % CI]": difference_value(d, f" ({m} seeds)" if m > 1 else ""),
                    "McNemar p": "" if d.get("p") is None else f"{d['p']:.3g}",
                    "reading": f"a is {apart}" if apart else undecided(d)})
    return pd.DataFrame(out, columns=DIFFERENCE_COLUMNS)


DISAGREEMENT_COLUMNS = ["graft", "text", "label", "FT says", "FT p", "graft says", "graft p"]


def disagreements_table(result: dict) -> pd.DataFrame:
    """The test examples on which a graft decides unlike FT, the graft's most confident first: the page's table
    sorts by any column."""
    out = [{"graft": d["model"], "text": d["text"] + (f" ‖ {d['pair']}" if d.get("pair") else ""), "label": d["label"],
            "FT says": d["ft"], "FT p": _pct(d["ft_confidence"]), "graft says": d["graft"],
            "graft p": _pct(d["graft_confidence"])} for d in result.get("disagreements") or []]
    return pd.DataFrame(out, columns=DISAGREEMENT_COLUMNS)


def disagreements_note(result: dict) -> str:
    """How many examples each graft decides unlike FT, of how many scored."""
    n = {r["model"]: r["n"] for r in result.get("rows") or [] if r.get("distribution") == "in"}
    counts = {d["model"]: d["of"] for d in result.get("disagreements") or []}
    parts = [f"**{md(m)}** {c:,} of {n.get(m, 0):,}" for m, c in counts.items()]
    return ("Test examples on which a graft decides unlike the fine-tuned model: " + "; ".join(parts)
            + (f" (the {MAX_SHOWN} most confident of each are listed)" if any(c > MAX_SHOWN for c in counts.values())
               else "") + "." if parts else "")


def retrain_table(result: dict) -> pd.DataFrame:
    """The re-training's rows as a comparison's, with the same readings (share of FT gain, calibration), which
    the re-training flow does not add to its rows."""
    return compare_table({**result, "rows": card.annotate([dict(r) for r in result.get("rows") or []])})


WISE_COLUMNS = ["α", "curve", "task", "accuracy ↑", "ECE ↓"]


def wise_table(rows: list[dict]) -> pd.DataFrame:
    """The WiSE curves as numbers, both curves side by side at each α."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    out = [{"α": f"{r['alpha']:g}", "curve": r["curve"], "task": r["task"] + (" (OOD)" if r.get("distribution") == "OOD" else ""),
            "accuracy ↑": _pct(r["accuracy"]), "ECE ↓": _num(r.get("ece"))}
           for r in sorted(rows, key=lambda r: (r["alpha"], tasks.index(r["task"]), r["curve"]))]
    return pd.DataFrame(out, columns=WISE_COLUMNS)


SWEEP_COLUMNS = ["method", "sparsity (fraction of graftable)", "k (params)", "accuracy ↑", "retained FT accuracy", "ECE ↓ (10 bins)"]


def sweep_table(rows: list[dict]) -> pd.DataFrame:
    """One row per (budget, method); one more column per OOD task the sweep scored."""
    oods = list(dict.fromkeys(t for r in rows for t in (r.get("ood") or {})))
    out = [{
        "method": r["method"],
        "sparsity (fraction of graftable)": f"{r['sparsity']:.0e}",
        "k (params)": f"{r['k']:,}",
        "accuracy ↑": _pct(r["accuracy"]),
        "retained FT accuracy": _pct(r.get("retained")),
        "ECE ↓ (10 bins)": _num(r.get("ece")),
        **{f"OOD {t} ↑": _pct((r.get("ood") or {}).get(t)) for t in oods},
    } for r in rows]
    return pd.DataFrame(out, columns=SWEEP_COLUMNS + [f"OOD {t} ↑" for t in oods])


COMPOSE_COLUMNS = ["task", "head from", "model", "test examples", "accuracy ↑", "Δ accuracy vs region alone", "F1 ↑",
                   "ECE ↓ (10 bins)", "params grafted"]


def compose_table(result: dict) -> pd.DataFrame:
    if result.get("stitch"):
        return stitch_table(result)
    out = [{
        "task": r["task"],
        "head from": r["head"],
        "model": r["model"],
        "test examples": r["n"],
        "accuracy ↑": _pct(r["accuracy"]),
        "Δ accuracy vs region alone": f"{100 * r['delta_vs_alone']:+.1f} pts",
        "F1 ↑": _num(r["f1"]),
        "ECE ↓ (10 bins)": _num(r["ece"]),
        "params grafted": f"{r['region_size']:,}" if r.get("region_size") is not None else "",
    } for r in result.get("rows") or []]
    return pd.DataFrame(out, columns=COMPOSE_COLUMNS)


def compose_report_text(report: dict | None) -> str:
    """How the union was built: sizes, shared parameters and the rule that settled them."""
    if not report:
        return ""
    rule = {"mean": "base + mean of the contributors' movements", "first": "the first region listed wins",
            "last": "the last region listed wins"}.get(report["resolve"], report["resolve"])
    sizes = ", ".join(f"{name}: {k:,}" for name, k in report["sizes"].items())
    pairs = [f"{a} ∩ {b}: {c:,}" for a, inner in report["per_pair"].items() for b, c in inner.items()]
    return (f"**Union graft: {report['union_params']:,} parameters** (region sizes {sizes}). "
            f"**{report['overlap_params']:,}** parameters are claimed by two or more regions"
            + (f" ({'; '.join(pairs)})" if pairs else "")
            + f"; rule for them: **{report['resolve']}** ({rule}).")


OVERLAP_COLUMNS = ["region i", "region j", "|γi|", "|γj|", "|γi ∩ γj| shared params", "|γi ∩ γj| / |γj|", "|γi ∩ γj| / |γi|", "IoU"]


def overlap_summary(matrix: dict | None) -> pd.DataFrame:
    if not matrix:
        return pd.DataFrame(columns=OVERLAP_COLUMNS)
    names, inter, sizes = matrix["names"], matrix["intersection_counts"], matrix["sizes"]
    rows = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            rows.append({"region i": names[i], "region j": names[j], "|γi|": f"{sizes[i]:,}", "|γj|": f"{sizes[j]:,}",
                         "|γi ∩ γj| shared params": f"{inter[i][j]:,}",
                         "|γi ∩ γj| / |γj|": _pct(matrix["overlap"][i][j]), "|γi ∩ γj| / |γi|": _pct(matrix["overlap"][j][i]),
                         "IoU": _pct(matrix["iou"][i][j])})
    return pd.DataFrame(rows, columns=OVERLAP_COLUMNS)


WEIGHT_BIAS_COLUMNS = ["parameter kind", "in region", "graftable", "density (in region / graftable)", "share of region"]


def weight_bias_table(anat) -> pd.DataFrame:
    rows = []
    for kind, count, total in (("weights", anat.weight_count, anat.weight_total), ("biases", anat.bias_count, anat.bias_total)):
        rows.append({"parameter kind": kind, "in region": f"{count:,}", "graftable": f"{total:,}",
                     "density (in region / graftable)": f"{count / total:.4%}" if total else "",
                     "share of region": f"{count / max(anat.weight_count + anat.bias_count, 1):.1%}"})
    return pd.DataFrame(rows, columns=WEIGHT_BIAS_COLUMNS)


META_KEYS = [
    ("kind", "file kind (patch = with fine-tuned values)"), ("method", "method"), ("task", "task"), ("base", "base model"),
    ("finetuned", "fine-tuned model"), ("k", "k (parameters in region)"), ("graftable_params", "graftable parameters"),
    ("fraction_of_graftable", "fraction of graftable"), ("fraction_of_all", "fraction of all parameters"),
    ("budget", "budget asked for"), ("labels", "labels"), ("architecture", "architecture"),
    ("train_examples", "training examples (mask learning)"), ("learn", "mask-learning settings"),
    ("base_sha256", "base sha256"), ("finetuned_sha256", "fine-tuned sha256"), ("library_version", "graftui version"),
    ("created", "created (UTC)"),
]


def region_meta_table(record) -> pd.DataFrame:
    if record is None:
        return pd.DataFrame(columns=["field", "value"])
    meta = {"kind": "patch" if record.is_patch else "region", **record.meta, "k": record.size}
    rows = []
    for key, label in META_KEYS:
        if key not in meta or meta[key] is None:
            continue
        v = meta[key]
        if isinstance(v, float):
            v = f"{v:.4%}" if key.startswith("fraction") else f"{v:g}"
        elif isinstance(v, int):
            v = f"{v:,}"
        elif isinstance(v, (list, dict)):
            v = ", ".join(map(str, v)) if isinstance(v, list) else ", ".join(f"{a}={b}" for a, b in v.items())
        rows.append({"field": label, "value": str(v)})
    rows.append({"field": "tensors touched", "value": f"{len(record.indices):,} of {len(record.shapes):,} graftable tensors"})
    return pd.DataFrame(rows, columns=["field", "value"])


REGION_LIST_COLUMNS = ["id", "task", "method", "k (params)", "share of graftable", "settings", "content id",
                       "fine-tuned model", "created (UTC)"]


def region_list_rows() -> pd.DataFrame:
    """The session's saved regions, newest first; a region whose content another also has says so."""
    rows, entries = [], store.list_regions()
    digests = [e.digest for e in entries]
    for e in entries:
        m = e.meta
        frac = m.fraction_of_graftable
        rows.append({
            "id": e.id,
            "task": short_ref(m.task or ""),
            "method": m.method or "",
            "k (params)": f"{m.k:,}" if m.k is not None else "",
            "share of graftable": f"{frac:.3%}" if isinstance(frac, (int, float)) else "",
            "settings": " · ".join(settings_of(m)),
            "content id": f"#{e.digest}" + (" (same as another)" if digests.count(e.digest) > 1 else ""),
            "fine-tuned model": short_ref(m.finetuned or ""),
            "created (UTC)": m.created or "",
        })
    return pd.DataFrame(rows, columns=REGION_LIST_COLUMNS)


# -- the regions table (Regions tab) ------------------------------------------------------------------
REGIONS_COLUMNS = ["id", "base", "fine-tuned model", "task", "method", "k (params)", "share of graftable", "steps", "seed",
                   "created (UTC)", "n", "accuracy", "ECE ↓", "share of FT gain"]


def regions_listing() -> list[dict]:
    """The session's saved regions as rows of the regions table (regions.listing_row), newest first, each with the
    scores of its latest evaluation."""
    scores = store.region_scores()
    return [listing_row(e.path, e.kind, e.meta, e.digest, scores.get(e.digest)) for e in store.list_regions()]


def regions_shown(rows: list[dict], words: str = "", sort: str | None = None, descending: bool = False) -> list[dict]:
    """The rows that hold every word typed in the filter, sorted by the column picked (none: newest first)."""
    return flows.regionfiles.select_regions(flows.regionfiles.with_words(rows, words), sort=sort or None,
                                            descending=bool(descending))


def regions_table(rows: list[dict]) -> pd.DataFrame:
    """Rows of the regions table as the page shows them: models and tasks by name, shares as percentages."""
    out = []
    for r in rows:
        out.append({
            "id": r["id"], "base": short_ref(r["base"] or ""), "fine-tuned model": short_ref(r["finetuned"] or ""),
            "task": short_ref(r["task"] or ""), "method": r["method"] or "",
            "k (params)": f"{r['k']:,}" if r["k"] is not None else "", "share of graftable": pct(r["share_of_graftable"], missing=""),
            "steps": "" if r["steps"] is None else str(r["steps"]), "seed": "" if r["seed"] is None else str(r["seed"]),
            "created (UTC)": (r["created"] or "").replace("T", " ")[:16],
            "n": "" if r.get("n") is None else f"{r['n']:,}", "accuracy": _pct(r["accuracy"]),
            "ECE ↓": _num(r["ece"]),
            "share of FT gain": _pct(r["share_of_ft"]),
        })
    return pd.DataFrame(out, columns=REGIONS_COLUMNS)


def read_region_upload(file) -> tuple[Path, RegionRecord]:
    """An uploaded region file, its format, metadata and every index validated."""
    path = check_upload(file, hosted.REGION_SUFFIXES)
    return path, load_region_file(path)


def adopt_region(file, base: str, finetuned: str) -> Path:
    """An uploaded region checked against the pair and saved among the session's regions, as a region of that
    pair (the pair it was made on is kept beside). A region without values takes the pair's fine-tuned values
    from now on, so it records the pair's build; a skill patch keeps the build its values came from."""
    path, record = read_region_upload(file)
    check_pair(base, finetuned)
    pair = flows.pair_for_regions(base, finetuned, [record], store.guard())
    check_fits(record, pair)
    meta = record.meta
    meta.original_base = meta.original_base or meta.base
    meta.original_finetuned = meta.original_finetuned or meta.finetuned
    meta.base, meta.finetuned, meta.uploaded_as = base, finetuned, path.name
    meta.base_sha256 = pair.hashes.get("base")
    if not record.is_patch:
        meta.finetuned_sha256 = pair.hashes.get("finetuned")
    meta.method = meta.method or "uploaded"
    return store.save_region(record, stem=f"uploaded-{safe_name(path.stem, 30)}")


def region_only_file(region_id: str):
    """A region file without values (indices only) next to the downloads; written once, its metadata as the page
    may see it (``store.public``)."""
    path = store.downloads_dir() / f"{region_id}-region.safetensors"
    if not path.exists():
        record = store.load_region(region_id)
        save(RegionRecord(record.indices, record.shapes, store.public(dict(record.meta))), path)
    return path


def region_file(region_id: str) -> Path:
    """A saved region or skill patch as a page downloads it: locally the file itself; hosted a copy next to the
    downloads whose metadata names no server path and no session (``store.public``), written once."""
    path = store.region_path(region_id)
    if not settings.hosted():
        return path
    copy = store.downloads_dir() / path.name
    if not copy.exists() or copy.stat().st_mtime < path.stat().st_mtime:
        record = store.load_region(region_id)
        record = RegionRecord(record.indices, record.shapes, store.public(dict(record.meta)), record.values, record.head)
        atomic_write(copy, lambda tmp: save(record, tmp))
    return copy


PUBLIC_TEXTS = (".json", ".md", ".txt")


def public_texts(folder: Path) -> None:
    """Every text file (JSON, Markdown) of a folder a page downloads rewritten as the page may see it (a checkpoint's
    config names the folder it was read from, a region's record its request)."""
    if not settings.hosted():
        return
    for path in Path(folder).rglob("*"):
        if path.is_file() and path.suffix.lower() in PUBLIC_TEXTS:
            text = path.read_text(errors="replace")
            shown = store.public(text)
            if shown != text:
                path.write_text(shown)
