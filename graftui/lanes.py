"""Which of the job runner's two lanes a job runs in, and how long it is expected to take.

The quick lane runs beside long jobs, so that what takes seconds is never held behind them: a job expected to take
at most QUICK_SECONDS. A job's expected length comes from the cost of its request where the request says what it is
(``work``: a prediction's tokens, times the models that read them, times one pass per token generated), at the pace
such jobs kept here (``token_seconds``), or from the last runs of the same job (same verb and settings, the same
regions, wherever it writes; texts counted, not read) that this session sees; unknown before either, when a pair check
or such is expected to be instant and any other job takes the main lane. Two kinds of job always take the main lane: one
that trains (``Request.trains``) or scores a task whose kind seeds the process's random generators
(``TaskKind.seeds_globally``), since either would change a seeded run beside it; and one that first builds a default
fine-tuned model (minutes, and training). One client may hold at most QUICK_SHARE jobs in the quick lane at once: its
next job waits in the main lane, so that the quick lane serves everyone's seconds-long work.

What a quick job may still do beside a seeded one: load a model with weights missing from its checkpoint, whose
initialisation draws the process's random numbers (no offline default is one).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .config import DEFAULT_BUILD_SECONDS, default_checkpoint_dir, is_default_finetuned
from .tasks.completion.generation import MAX_NEW_TOKENS
from .jobs import DONE, FAILED, MAIN, QUICK, QUICK_LIMIT, Job
from .paths import short_ref
from .kinds import kind_named, named_kind
from .training import is_built

QUICK_SECONDS = 60.0  # a job expected to take at most this long runs in the quick lane
QUICK_SHARE = 2  # jobs one client may have waiting or running in the quick lane at once
TOKEN_CHARS = 4  # characters per token, about: a lane is planned without loading a tokenizer
TOKEN_SECONDS = 1.5e-3  # seconds per token a model reads, before a prediction has run here: SmolLM2 on 2 CPU cores
# (measured: a 4,900-character prompt read by 3 models generating 32 tokens took 184 s, 121,000 token-passes)
HISTORY_RUNS = 3  # the expected length is the median of the same job's last runs
INSTANT_SECONDS = 5.0  # what an instant verb is expected to take before it has run here
COUNTED = ("texts",)  # fields a job's length depends on by their number, not their content (a region, by which it
# is: its model and task decide the length)
WHERE = ("out", "keep")  # fields that only say where a job writes


@dataclass(frozen=True)
class Plan:
    lane: str
    estimate: float | None  # seconds, the build included; None: not known yet
    builds: str | None = None  # the default fine-tuned model the job builds first
    work: float | None = None  # what the request asks the models to read (``work``), where it says


def shape(params: dict | None) -> tuple:
    """What decides a job's length among its request's fields: every field but where it writes, and of the texts
    their number."""
    out = []
    for key, value in sorted((params or {}).items()):
        if key in WHERE:
            continue
        if key in COUNTED and isinstance(value, (list, tuple)):
            value = len(value)
        out.append((key, repr(value)))
    return tuple(out)


def typical_seconds(history: list[Job], kind: str, params: dict) -> float | None:
    """The median length of the last HISTORY_RUNS finished runs of the same job (``history``: newest first)."""
    want = shape(params)
    runs = [j.duration for j in history if j.kind == kind and j.status == DONE and j.duration is not None
            and shape(j.params) == want][:HISTORY_RUNS]
    return statistics.median(runs) if runs else None


def default_to_build(ref) -> str | None:
    """The default fine-tuned model ``ref`` names when it is not built yet (a job with it builds it first)."""
    ref = str(ref or "").strip().lower()
    if is_default_finetuned(ref) and not is_built(default_checkpoint_dir(ref)):
        return ref
    return None


def seeds_globally(request, reads: list[tuple[str, str | None]]) -> bool:
    """Whether the request scores a task of a kind that seeds the process's random generators (its own task, or the
    kinds of the regions it reads)."""
    kinds = [named_kind(getattr(request, "task", None))] + [kind_named(k) for k, _ in reads]
    return any(k is not None and k.seeds_globally for k in kinds)


def work(request, reads: list[tuple[str, str | None]] = ()) -> float | None:
    """How much a request asks the models to read, where it says (a prediction: its texts): tokens × the models that
    read them (pre-trained, fine-tuned, each region, each probe: ``PredictRequest.looks``) × (1 + the tokens each
    generates); None for any other request."""
    texts = getattr(request, "texts", None)
    if not isinstance(texts, list) or not texts:
        return None
    tokens = sum(len(str(t)) // TOKEN_CHARS + 1 for t in [*texts, *(getattr(request, "pairs", None) or [])])
    looks = getattr(request, "looks", None)
    models = looks() if callable(looks) else 2 + len(getattr(request, "regions", None) or [])
    kinds = [named_kind(getattr(request, "task", None))] + [kind_named(k) for k, _ in reads]
    generates = any(k is not None and k.generates for k in kinds)
    new = (getattr(request, "max_new_tokens", None) or MAX_NEW_TOKENS) if generates else 0
    return float(tokens * models * (1 + new))


def token_seconds(history: list[Job]) -> float:
    """Seconds per token-pass, the median of the predictions this session saw end (``Job.work``), else TOKEN_SECONDS."""
    paces = [j.duration / j.work for j in history if j.work and j.duration is not None and (
        j.status == DONE or (j.status == FAILED and j.lane == QUICK and j.duration >= QUICK_LIMIT))]  # a stopped one:
    # at least that slow
    return statistics.median(paces[:HISTORY_RUNS * 3]) if paces else TOKEN_SECONDS


def plan(request, kind: str, history: list[Job], reads: list[tuple[str, str | None]] = (), held: int = 0) -> Plan:
    """The lane and expected length of the job that runs ``request`` as ``kind``, given the past jobs this session
    sees; ``reads``: the (task kind, fine-tuned model) of each saved region the request reads, whose default model
    it builds first if it is not built (a region's, a replicate fine-tune's or the request's own); ``held``: the jobs
    its client has waiting or running in the quick lane."""
    refs = [getattr(request, "finetuned", None), *(getattr(request, "finetuned_replicates", None) or ()),
            *(ft for _, ft in reads)]
    builds = next((b for b in map(default_to_build, refs) if b), None)
    cost = work(request, reads)
    typical = cost * token_seconds(history) if cost is not None else typical_seconds(history, kind, request.as_dict())
    if typical is None and request.instant:
        typical = INSTANT_SECONDS
    estimate = None if typical is None else typical + (DEFAULT_BUILD_SECONDS.get(builds, 0.0) if builds else 0.0)
    shares = not (request.trains or builds or seeds_globally(request, list(reads)))
    short = typical is not None and typical <= QUICK_SECONDS and held < QUICK_SHARE
    return Plan(QUICK if shares and short else MAIN, estimate, builds, cost)


def plan_words(job: Job, builds: str | None = None) -> str:
    """What a submission says of its job's lane, and of the default model it builds first."""
    words = []
    if builds:
        build = DEFAULT_BUILD_SECONDS.get(builds)
        about = f" (about {build / 60:.0f} min on 2 CPU cores)" if build else ""
        words.append(f"It first builds the default fine-tuned model **{short_ref(builds)}**{about}, once.")
    if job.lane == QUICK:
        words.append("It is short, so it runs in the quick lane, beside longer jobs.")
    return " ".join(words)
