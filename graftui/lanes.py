"""Which of the job runner's two lanes a job runs in, and how long it is expected to take.

The quick lane runs beside long jobs, so that what takes seconds is never held behind them: a job expected to take
at most QUICK_SECONDS. A job's expected length comes, in this order, from the last runs of the same job (same verb
and settings, the same regions, wherever it writes; texts counted, not read) that this session sees, or from the
cost of its request where its fields say it (``work``), at the pace jobs of its kind kept here (``pace``), else at
the pace measured on 2 CPU cores (``PACE``). A prediction costs its tokens, times the models that read them, times
one pass per token generated; a localization, or an evaluation of n examples, the examples its models read (a mask
step's batch three times over, forward and backward) times the bytes of the pair's weights on this disk, plus reading
the pair; WiSE curves, a composition scored on its regions' tasks and an ablation of n examples likewise, the models
and tasks their fields say (``SCORES``); a sweep, a fine-tune, a re-training, the multi-task and the continual
experiments their steps and scored examples (``COSTS``: a recipe's training examples per epoch, mask steps, every
model on every task's n test examples). Of these studies a first guess is only shown: the job takes the quick lane
once the same job ran here short. A cost at the measured pace alone must fit in half of QUICK_SECONDS to count as short, since this machine
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
from .config import (DEFAULT_BUILD_SECONDS, DEFAULT_CHECK_N, DEFAULT_FINETUNED_REFS, SENTIMENT_TASKS,
                     default_checkpoint_dir, is_default_finetuned)
from .flows.common import STEP_PASSES
from .flows.laboratory import multitask_checkpoint
from .flows.reproduction import expected_seconds
from .errors import GraftuiError
from .localizers import get_method
from .sizing import EXPECTED_POINTS
from .models import SMOLLM2_DIR, resolve
from .tasks.completion.generation import ANSWER_PASSES, MAX_NEW_TOKENS
from .jobs import DONE, FAILED, MAIN, QUICK, QUICK_LIMIT, Job
from .paths import short_ref, slug
from .kinds import given_fields, kind_named, named_kind
from .training import is_built

QUICK_SECONDS = 60.0  # a job expected to take at most this long runs in the quick lane
QUICK_SHARE = 2  # jobs one client may have waiting or running in the quick lane at once
TOKEN_CHARS = 4  # characters per token, about: a lane is planned without loading a tokenizer
TOKEN_SECONDS = 1.5e-3  # seconds per token a model reads, before a prediction has run here: SmolLM2 on 2 CPU cores
# (measured: a 4,900-character prompt read by 3 models generating 32 tokens took 184 s, 121,000 token-passes)
PACE = {"localize": 1.0e-10, "evaluate": 1.4e-10}  # seconds per example pass per byte of the pair's weights, before a
# job of the kind ran here: MiniLM-L6 (91 MB) on 2 CPU cores (measured: a localization of 40 mask steps of 16 examples
# and a check on 200 took 27 s, of 100 steps 53 s; an evaluation of 200 test examples 9.9 s, of 500 21.3 s)
PACE.update(dict.fromkeys(("sweep", "finetune", "retrain", "multitask", "continual"), PACE["localize"]))  # studies
# whose work is mostly training steps: a mask step's pace (not measured apart)
LOAD_SECONDS_PER_BYTE = 1.6e-8  # reading a pair, both checkpoints: MiniLM, 3.0 s
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
    """The example passes a request asks of its models, where its fields say (``COSTS``; a count of test examples
    left to the data, all of them, does not: None): a mask step's or a training step's batch STEP_PASSES times, each
    checked or scored example once per model, a generating kind's ANSWER_PASSES times; every seed and fine-tune its
    own run."""
    generates = any(k.generates for k in _kinds(request, reads))
    count = COSTS.get(request.verb)
    if count is not None:
        return count(request, ANSWER_PASSES if generates else 1, generates)
    looks = SCORES.get(request.verb)
    models = looks(request) if looks is not None and getattr(request, "n", None) else None
    return None if models is None else float(request.n * models * (ANSWER_PASSES if generates else 1))


def _seeds(request) -> int:
    return len(getattr(request, "seeds", None) or [None])


def _learning(request) -> int:
    """The passes of one region's mask learning: every step's batch STEP_PASSES times."""
    return request.steps * request.batch_size * STEP_PASSES


def _localize(r, tokens: int, generates: bool) -> float:
    """Each seed and fine-tune one run: its mask steps, then the region checked on --check-n held-out examples
    beside FT and the empty region (a kind whose check is one pass checks the start region too). A size search
    (--keep) learns about EXPECTED_POINTS regions, each scored on the check by one teacher-forced pass (FT and the
    empty region once), then checks the one it found; a nested schedule learns a region of 10·k first."""
    learns = get_method(r.method).needs_data
    runs = _seeds(r) * (len(r.finetunes()) if r.finetuned_replicates else 1)
    steps, check = _learning(r) if learns else 0, r.check_n or 0
    if r.keep:
        return float(runs * (EXPECTED_POINTS * steps + check * (EXPECTED_POINTS + 2) + check * 3 * tokens))
    if r.schedule == "nested" and learns:
        steps *= 2
    return float(runs * (steps + check * (4 if learns and not generates else 3) * tokens))


def _evaluate(r, tokens: int, generates: bool) -> float | None:  # FT, the bare body, each graft (and its baselines)
    if not r.n:
        return None
    models = 2 + max(len(r.regions), 1) * (3 if r.baselines else 1)
    return float(_seeds(r) * r.n * models * _tasks(r, generates) * tokens)


def _sweep(r, tokens: int, generates: bool) -> float | None:
    """Per budget, a region of each method (mask steps for a method that learns), each scored on n test examples
    of every task, FT and the bare body once; every seed and fine-tune its own sweep."""
    if not r.n:
        return None
    points, methods = len(set(r.sparsities)), list(dict.fromkeys(r.methods))
    learning = points * sum(_learning(r) for m in methods if get_method(m).needs_data)
    scoring = r.n * _tasks(r, generates) * (2 + points * len(methods)) * tokens
    return float(_seeds(r) * len(r.finetunes()) * (learning + scoring))


def _training(recipe) -> int | None:
    """The passes of a fine-tuning recipe: every epoch's examples STEP_PASSES times (None: all of a task's, a number
    not known before it is read)."""
    return recipe.epochs * recipe.train_examples * STEP_PASSES if recipe.train_examples else None


def _finetune(r, tokens: int, generates: bool) -> float | None:
    """Each seed's training (none where its default folder holds it already: it is reused), and its test examples
    where it says how many (all of them are not counted: a fraction of the training)."""
    total = 0
    for seed in r.seeds or [r.seed]:
        one = r.replace(seed=seed, seeds=None)
        if not r.out and is_built(default_checkpoint_dir(f"{slug(one.base)}-{slug(one.task)}", one.recipe())):
            train = 0
        else:
            train = _training(one.recipe())
            if train is None:
                return None
        total += train + (r.test_examples or 0) * tokens
    return float(total)


def _retrain(r, tokens: int, generates: bool) -> float | None:
    """Per seed: the region trained from θ_pre with the recipe, and BitFit unless dropped, then FT, the bare body, the
    graft and each retrained model scored on n test examples of every task."""
    train = _training(r.recipe(seed=r.seed))
    if train is None or not r.n:
        return None
    arms = 1 if r.no_bitfit else 2
    return float(_seeds(r) * (arms * train + r.n * _tasks(r, generates) * (3 + arms) * tokens))


def _multitask(r, tokens: int, generates: bool) -> float | None:
    """The multi-task fine-tune where it is not built yet (every task's examples), each task's region, the
    purification of the group's union on their joint loss, then on every task's n test examples: FT, the bare body,
    every task's region, the union and the purified union."""
    tasks = len(r.tasks)
    built = r.checkpoint or is_built(multitask_checkpoint(r.base, r.tasks, r.recipe()))
    build = 0 if built else _training(r.recipe())
    if build is None or not r.n:
        return None
    purify = r.purify_steps * r.batch_size * STEP_PASSES * len(r.group or r.tasks)
    scoring = r.n * tasks * (2 + tasks + 1 + (1 if r.purify_steps else 0))
    return float(_seeds(r) * (tasks * build + tasks * _learning(r) + purify + scoring))


def _continual(r, tokens: int, generates: bool) -> float | None:
    """Per task: its own fine-tune (none where built), its region with the held-out check, a forget-free stage and a
    sequential one (the recipe each), and after stage i every task up to i scored by both arms on n test examples."""
    tasks, recipe = len(r.tasks), r.recipe()
    train = _training(recipe)
    if train is None or not r.n:
        return None
    own = [0 if is_built(default_checkpoint_dir(f"{slug(r.base)}-{slug(t)}", recipe)) else train for t in r.tasks]
    learning = tasks * (_learning(r) + DEFAULT_CHECK_N * 4) + sum(own) + tasks * r.n
    return float(_seeds(r) * (learning + 2 * tasks * train + 2 * r.n * tasks * (tasks + 1) // 2))


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


def _compose(r) -> float | None:
    """Scored on each region's task: the union, each region alone, FT and the bare body; stitched, the stitched
    union, the region alone, each merge at its chosen setting, the other fine-tunes, FT and the bare body, after every
    setting of every merge was scored on each task's validation examples (counted in test examples' stead)."""
    tasks = len(r.regions)
    if r.stitch:
        return tasks * (4 + len(r.merges) + tasks - 1) + r.merge_settings() * tasks * r.validation_n / r.n
    return tasks * (tasks + 3) if r.evaluate else None


def _anatomy(r) -> float | None:  # the whole graft, then without each part
    return 1 + ABLATED_PARTS if r.ablate else None


# Verbs whose work is scoring n test examples with a number of models their fields say: (request) -> models × tasks.
# Their first-guess length is only shown: such a job takes the quick lane once the same job ran here short.
SCORES = {"wise": _wise, "compose": _compose, "anatomy": _anatomy}
# Verbs whose passes their fields say in full: (request, passes per scored example, whether the task generates) ->
# example passes, or None where a count is left to the data.
COSTS = {"localize": _localize, "evaluate": _evaluate, "sweep": _sweep, "finetune": _finetune, "retrain": _retrain,
         "multitask": _multitask, "continual": _continual}
TOLD = {"reproduce": expected_seconds}  # verbs whose own plan says its seconds on 2 CPU cores
SHOWN = {*SCORES, *TOLD, "sweep", "finetune", "retrain", "multitask", "continual"}  # a first guess only shown (see
# SCORES)


def _kinds(request, reads) -> list:
    """The kinds of task a request reads, where they are known before anything is read: the one its task names (as its
    --task-kind and kind fields say: ``kinds.named_kind``) and each saved region's (``reads``)."""
    named = named_kind(getattr(request, "task", None), getattr(request, "task_kind", None) or "auto",
                       given_fields(request))
    return [k for k in [named, *(kind_named(k) for k, _ in reads)] if k is not None]


TRAINS_BASE = ("finetune", "multitask", "continual")  # verbs whose work is on their base model's weights


def pair_bytes(request, reads: list[tuple[str, str | None]] = ()) -> int | None:
    """The bytes of the fine-tuned model's weights a request reads (its own, else its first region's; a fine-tune's,
    its base's): what one example pass costs, in proportion."""
    ref = getattr(request, "finetuned", None) or next((ft for _, ft in reads if ft), None) or (
        getattr(request, "base", None) if request.verb in TRAINS_BASE else None)
    if not ref:
        return None
    # a default not built yet, or an adapter, reads as its base does: a fine-tune has its base's tensors
    default = DEFAULT_FINETUNED_REFS.get(str(ref).strip().lower())
    return weights_bytes(ref) or weights_bytes(default[0] if default else getattr(request, "base", None))


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
    if typical is None and request.verb in TOLD:
        typical = TOLD[request.verb](request)
    if typical is None and request.instant:
        typical = INSTANT_SECONDS
    estimate = None if typical is None else typical + (DEFAULT_BUILD_SECONDS.get(builds, 0.0) if builds else 0.0)
    shares = not (request.trains or builds or seeds_globally(request, list(reads)))
    room = QUICK_SECONDS if same is not None or measured or by_cost is None else QUICK_SECONDS * UNMEASURED
    if same is None and request.verb in SHOWN:  # a first guess of a study's length is shown, never trusted to
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
