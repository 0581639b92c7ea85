"""Which of the job runner's two lanes a job runs in, and how long it is expected to take.

The quick lane runs beside long jobs, so that what takes seconds is never held behind them: a job expected to take
at most QUICK_SECONDS. A job's expected length comes, in this order, from the last runs of the same job (same verb
and settings, the same regions, wherever it writes; texts counted, not read) that this session sees, or from the
cost of its request where its fields say it (``work``), at the pace jobs of its kind kept here (``pace``), else at
the pace measured on 2 CPU cores (``PACE``). A prediction costs its tokens, times the models that read them, times
one pass per token generated; a localization, or an evaluation of n examples, the examples its models read (a mask
step's batch three times over, forward and backward) times the bytes of the pair's weights on this disk, plus reading
the pair; WiSE curves, a composition scored on its regions' tasks and an ablation of n examples likewise, the models
and tasks their fields say (``SCORES``), though such a first guess is only shown: the job takes the quick lane once
the same job ran here short. A cost at the measured pace alone must fit in half of QUICK_SECONDS to count as short, since this machine
may be slower; once a job of its kind ran here, in all of it. Unknown before either, when a pair check or such is
expected to be instant and any other job takes the main lane. Two kinds of job always take the main lane: one that
trains (``Request.trains``) or scores a task whose kind seeds the process's random generators
(``TaskKind.seeds_globally``), since either would change a seeded run beside it; and one that first builds a default
fine-tuned model (minutes, and training). One client may hold at most QUICK_SHARE jobs in the quick lane at once: its
next job waits in the main lane, so that the quick lane serves everyone's seconds-long work.

What a quick job may still do beside a seeded one: load a model with weights missing from its checkpoint, whose
initialisation draws the process's random numbers (no offline default is one).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from . import settings
from .adapters import is_adapter
from .config import (DEFAULT_BUILD_SECONDS, DEFAULT_FINETUNED_REFS, SENTIMENT_TASKS, default_checkpoint_dir,
                     is_default_finetuned)
from .errors import GraftuiError
from .localizers import get_method
from .sizing import EXPECTED_POINTS
from .models import SMOLLM2_DIR, resolve
from .tasks.completion.generation import MAX_NEW_TOKENS
from .jobs import DONE, FAILED, MAIN, QUICK, QUICK_LIMIT, Job
from .paths import short_ref
from .kinds import given_fields, kind_named, named_kind
from .training import is_built

QUICK_SECONDS = 60.0  # a job expected to take at most this long runs in the quick lane
QUICK_SHARE = 2  # jobs one client may have waiting or running in the quick lane at once
TOKEN_CHARS = 4  # characters per token, about: a lane is planned without loading a tokenizer
TOKEN_SECONDS = 1.5e-3  # seconds per token a model reads, before a prediction has run here: SmolLM2 on 2 CPU cores
# (measured: a 4,900-character prompt read by 3 models generating 32 tokens took 184 s, 121,000 token-passes)
PACE = {"localize": 1.0e-10, "evaluate": 1.4e-10}  # seconds per example pass per byte of the
# pair's weights, before a job of the kind ran here: MiniLM-L6 (91 MB) on 2 CPU cores (measured: a localization of
# 40 mask steps of 16 examples and a check on 200 took 27 s, of 100 steps 53 s; an evaluation of 200 test examples
# 9.9 s, of 500 21.3 s)
LOAD_SECONDS_PER_BYTE = 1.6e-8  # reading a pair, both checkpoints: MiniLM, 3.0 s
STEP_PASSES = 3  # a mask step reads each example of its batch forward and backward: about three forward passes
ANSWER_PASSES = 4  # a scored example of a generating kind, its answer written token by token on a cache: about four
# passes (measured: the default localization of smollm2-dates, 40 steps and a check of 200 prompts by 4 models, took
# 263 s on 2 CPU cores, foreseen 292 s)
DEFAULT_BASES = ("minilm", "smollm2")  # the offline base models, the only models besides the default fine-tunes a
# shared server measures
UNMEASURED = 0.5  # the share of QUICK_SECONDS a cost at the first-guess pace must fit in to count as short
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
    return any(k.seeds_globally for k in _kinds(request, reads))


def weights_bytes(ref) -> int | None:
    """The bytes of a checkpoint's safetensors weights on this disk, from the files' sizes (nothing is read); None for
    a model that is not here (a Hub id, a default not built yet), a LoRA adapter (its base does the work), or, on a
    shared server, anything but the offline defaults (a server's files are not even looked at for a visitor)."""
    name = str(ref or "").strip().lower()
    if settings.hosted() and name not in (*DEFAULT_BASES, *DEFAULT_FINETUNED_REFS):
        return None  # a visitor's path is not even looked at
    if name == "smollm2" and not (settings.shared("models") / SMOLLM2_DIR / "model.safetensors").exists():
        return None  # not made yet: a plan does not make it
    try:
        folder = Path(resolve(str(ref or ""), allow_local=not settings.hosted()))
    except GraftuiError:
        return None
    if not folder.is_dir() or is_adapter(folder):
        return None
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) or None


def passes(request, reads: list[tuple[str, str | None]] = ()) -> float | None:
    """The example passes a localization or an evaluation asks of its models, where its fields say (an evaluation
    of all test examples does not: None): a mask step's batch STEP_PASSES times, each checked or scored example once
    per model (the region, where learning starts, FT and the empty region; a graft and its baselines, FT and the bare
    body, per task), a generating kind's ANSWER_PASSES times; every seed and fine-tune its own run."""
    generates = any(k.generates for k in _kinds(request, reads))
    tokens = ANSWER_PASSES if generates else 1
    seeds = len(getattr(request, "seeds", None) or [None])
    if request.verb == "localize":
        learns = get_method(request.method).needs_data
        runs = seeds * (len(request.finetunes()) if request.finetuned_replicates else 1)
        if request.keep:  # a search over budgets: as many localizations as it usually learns
            runs *= EXPECTED_POINTS
        elif request.schedule == "nested" and learns:  # a region of 10·k, then the region inside it
            runs *= 2
        steps = request.steps * request.batch_size * STEP_PASSES if learns else 0
        return float(runs * (steps + (request.check_n or 0) * (4 if learns else 3) * tokens))
    if request.verb == "evaluate" and request.n:
        models = 2 + max(len(request.regions), 1) * (3 if request.baselines else 1)
        return float(seeds * request.n * models * _tasks(request, generates) * tokens)
    looks = SCORES.get(request.verb)
    models = looks(request) if looks is not None and getattr(request, "n", None) else None
    return None if models is None else float(request.n * models * tokens)


def _tasks(request, generates: bool) -> int:
    """The tasks a request scores each model on: its own and the others out of distribution it asks for (a region's
    own task, unread: a sentiment task's two others, the most a classification region is scored on by default)."""
    task = getattr(request, "task", None)
    known = task or request.ood is not None or request.no_ood or generates
    return 1 + (len(request.ood_tasks(task)) if known else len(SENTIMENT_TASKS) - 1)


ABLATED_PARTS = 20  # the layers and module types an ablation drops one at a time, before the region is read
# (MiniLM: 6 + 8; SmolLM2: 30 + 7): a first guess, which the pace of the running job corrects


def _wise(r) -> float:  # both curves at every α, in and out of distribution, for the region and each replicate
    return 2 * len(set(r.alphas)) * _tasks(r, False) * (1 + len(r.replicates or ()))


def _compose(r) -> float | None:  # each region's task: the union, each region alone, FT and the bare body
    return len(r.regions) * (len(r.regions) + 3) if r.evaluate and not r.stitch else None


def _anatomy(r) -> float | None:  # the whole graft, then without each part
    return 1 + ABLATED_PARTS if r.ablate else None


# Verbs whose work is scoring n test examples with a number of models their fields say: (request) -> models × tasks.
# Their first-guess length is only shown: such a job takes the quick lane once the same job ran here short.
SCORES = {"wise": _wise, "compose": _compose, "anatomy": _anatomy}


def _kinds(request, reads) -> list:
    """The kinds of task a request reads, where they are known before anything is read: the one its task names (as its
    --task-kind and kind fields say: ``kinds.named_kind``) and each saved region's (``reads``)."""
    named = named_kind(getattr(request, "task", None), getattr(request, "task_kind", None) or "auto",
                       given_fields(request))
    return [k for k in [named, *(kind_named(k) for k, _ in reads)] if k is not None]


def pair_bytes(request, reads: list[tuple[str, str | None]] = ()) -> int | None:
    """The bytes of the fine-tuned model's weights a request reads (its own, else its first region's): what one example
    pass costs, in proportion."""
    ref = getattr(request, "finetuned", None) or next((ft for _, ft in reads if ft), None)
    return weights_bytes(ref) if ref else None


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
    generates = any(k.generates for k in _kinds(request, reads))
    new = (getattr(request, "max_new_tokens", None) or MAX_NEW_TOKENS) if generates else 0
    return float(tokens * models * (1 + new))


def pace(history: list[Job], kind: str) -> float | None:
    """Seconds per unit of ``Job.work`` that the jobs of ``kind`` this session saw end kept (the median of the last
    ones); None before any."""
    paces = [j.duration / j.work for j in history if j.kind == kind and j.work and j.duration is not None and (
        j.status == DONE or (j.status == FAILED and j.lane == QUICK and j.duration >= QUICK_LIMIT))]  # a stopped one:
    # at least that slow
    return statistics.median(paces[:HISTORY_RUNS * 3]) if paces else None


def token_seconds(history: list[Job], kind: str = "predict") -> float:
    """Seconds per token-pass, the median of the predictions this session saw end (``Job.work``), else TOKEN_SECONDS."""
    return pace(history, kind) or TOKEN_SECONDS


def costed(request, kind: str, history: list[Job], reads, tokens: float | None
           ) -> tuple[float | None, float | None, bool]:
    """(expected seconds, work, measured) of a request from its cost: ``work`` in the unit the pace of ``kind`` is kept
    in (``tokens``, a prediction's ``work``, else example passes × bytes of weights); measured: at a pace kept here,
    not the first guess (a prediction's first guess, TOKEN_SECONDS, counts as measured: it is the pace of the slower
    offline model)."""
    if tokens is not None:
        return tokens * token_seconds(history, kind), tokens, True
    n, size = passes(request, reads), pair_bytes(request, reads)
    if not n or not size:
        return None, None, False
    cost, kept = n * size, pace(history, kind)
    if kept is not None:
        return cost * kept, cost, True
    return 2 * size * LOAD_SECONDS_PER_BYTE + cost * PACE.get(request.verb, PACE["evaluate"]), cost, False


def plan(request, kind: str, history: list[Job], reads: list[tuple[str, str | None]] = (), held: int = 0) -> Plan:
    """The lane and expected length of the job that runs ``request`` as ``kind``, given the past jobs this session
    sees; ``reads``: the (task kind, fine-tuned model) of each saved region the request reads, whose default model
    it builds first if it is not built (a region's, a replicate fine-tune's or the request's own); ``held``: the jobs
    its client has waiting or running in the quick lane."""
    refs = [getattr(request, "finetuned", None), *(getattr(request, "finetuned_replicates", None) or ()),
            *(ft for _, ft in reads)]
    builds = next((b for b in map(default_to_build, refs) if b), None)
    tokens = work(request, reads)
    by_cost, cost, measured = costed(request, kind, history, list(reads), tokens)
    same = None if tokens is not None else typical_seconds(history, kind, request.as_dict())
    typical = same if same is not None else by_cost
    if typical is None and request.instant:
        typical = INSTANT_SECONDS
    estimate = None if typical is None else typical + (DEFAULT_BUILD_SECONDS.get(builds, 0.0) if builds else 0.0)
    shares = not (request.trains or builds or seeds_globally(request, list(reads)))
    room = QUICK_SECONDS if same is not None or measured or by_cost is None else QUICK_SECONDS * UNMEASURED
    if same is None and request.verb in SCORES:  # a first guess of a study's length is shown, never trusted to
        room = 0.0  # keep the quick lane short: it takes that lane once the same job ran here short
    short = typical is not None and typical <= room and held < QUICK_SHARE
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
