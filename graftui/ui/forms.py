"""What each form of the app submits: the widgets' plain values become a request and a job.

Each ``submit_*`` function takes what the widgets hold, builds the verb's request and hands a job that runs the
flow to the shared :class:`~graftui.jobs.JobRunner`; the Models tab's checks run the ``pair`` flow directly.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

from .. import bundle, flows, hosted, lanes, settings, tracking
from ..config import (DEFAULT_BASE, DEFAULT_BUILD_SECONDS, DEFAULT_EXAMPLES_PER_CLASS, DEFAULT_FINETUNED,
                      DEFAULT_FINETUNED_REFS, Budget, GraftableSpec, is_default_finetuned)
from ..tasks.completion.data import completion_columns
from ..tasks.classification.data import all_as_test, preview
from ..errors import ModelError, RegionError, RequestError
from ..hosted import check_rows, safe_name, save_upload
from ..flows.common import own_pairs, same_model
from ..jobs import DONE, MAIN, QUEUED, RUNNING, Job
from ..localizers import get_method
from ..paths import atomic_write, new_path, short_ref
from ..requests import (AnatomyRequest, ComposeRequest, ContinualRequest, EvaluateRequest, ExportRequest,
                        FinetuneRequest, LocalizeRequest, MultitaskRequest, PairRequest, PredictRequest,
                        ReproduceRequest, RetrainRequest, SweepRequest, TaskFields, WiseRequest, PushRequest,
                        parse_label_map, parse_list)
from ..tasks.classification.scoring import align_labels
from ..flows.replicates import replicate_groups
from ..kinds import CLASSIFICATION, KINDS, kind_named, named_kind
from . import store
from .kinds import app_of
from .jobwords import md


def data_columns(task: str, text=None, pair=None, label=None) -> dict:
    """The column fields of a request from the mapping widgets; offline tasks have their own columns,
    so a mapping left over from an uploaded file is not sent with them."""

    if any(str(task).strip().lower() in kind.offline() for kind in KINDS.values()):
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


AFTER: dict[str, Callable] = {}  # verb -> what the page reads of its result besides the flow's own document


def after(verb: str):
    """Register ``fn(request, result, doc) -> dict``: what a finished job of ``verb`` keeps for the page to read. It
    reads the request and the result alone, so a job made again from its record (``revive``) keeps the same."""
    def register(fn):
        AFTER[verb] = fn
        return fn
    return register


def job_fn(request):
    """The work of a job that runs ``request``: its flow, with models of its own where the job is in the quick lane
    when it starts (a job that outgrew that lane runs again in the main one, its mask learning continuing from its
    checkpoint), then what ``AFTER`` keeps."""
    then = AFTER.get(request.verb)

    def fn(ctx) -> dict:
        lane = ctx.job.lane
        with own_pairs(lane) if lane != MAIN else contextlib.nullcontext():
            result = flows.run(request, progress=ctx.report, cancel=ctx.cancel, guard=store.guard())
        doc = result.as_dict()
        return then(request, result, doc) if then else doc

    return fn


NOT_REVIVED = ("push",)  # a push needs its token, which no record keeps


def revive(job: Job):
    """A job that a server restart interrupted, made again from its record: its params are its request, checked again
    as a new one would be, in its own session's workspace. None where it cannot be: a record of no request of this
    version, a push, a hosted session that has expired."""
    params = job.params if isinstance(job.params, dict) else {}
    if job.kind in NOT_REVIVED or "verb" not in params:
        return None
    request = flows.from_dict(params)
    owner = job.owner if settings.hosted() else None
    if owner is not None and store.live_session(owner) is None:
        return None
    work = job_fn(request)

    def fn(ctx) -> dict:
        with store.session(owner) if owner is not None else contextlib.nullcontext():
            hosted.check_request(request, store.guard())
            return work(ctx)

    return fn


def submit(runner, request, title: str, kind: str | None = None) -> Job:
    """Validate ``request`` now (a bad field is a one-line message, no job), then run its flow as a job, in the lane
    ``lanes.plan`` gives it (from the request and the saved regions it reads); a job in the quick lane loads models of
    its own, since the main lane's may be grafted at the same time.

    The job's params are the request, so any result shows, and re-runs from, what made it (a restarted server runs
    it again from them: ``revive``); a request of a verb that does work reports to the app's tracker
    (``store.report_to``) unless it names one itself.
    """
    if getattr(request, "report_to", None) == tracking.NONE and store.report_to() != tracking.NONE:
        request = request.replace(report_to=store.report_to())
    hosted.check_request(request, store.guard())  # hosted: also the ceilings on work, and every path it names
    kind = kind or request.verb
    reads = [(e.task_kind.name, e.meta.finetuned) for e in store.regions_read(request)]
    plan = lanes.plan(request, kind, runner.history(), reads, runner.quick_held())
    return runner.submit(kind, title, job_fn(request), request.as_dict(), lane=plan.lane, estimate=plan.estimate,
                         work=plan.work)


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
            info["read_as"] = f"read as a completion task, by {said}"  # not as the guessed columns say
        return info

    return save_upload(file, read)


def load_task_checked(ref: str, columns: dict):
    """A task read as the flows read it (hosted checks and row cap included)."""
    return flows.get_task(ref, TaskFields(task=ref, **columns).data_spec(), store.guard())


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
                    steps, examples_per_class, lr, seeds: str = "", keep=None) -> Job:
    """A localization; ``keep`` (a share, 0 or empty for none) searches for the size the skill needs from the budget."""
    request = LocalizeRequest(base=base, finetuned=finetuned, task=task, **columns, method=method,
                              sparsity=10 ** float(log_sparsity), steps=whole(steps) or 0,
                              examples_per_class=per_class(examples_per_class), lr=float(lr or 0),
                              seeds=parse_seeds(seeds), check_n=LocalizeRequest.defaults()["check_n"],
                              keep=float(keep) if keep else None)

    title = (f"Localize '{short_ref(task)}' in {short_ref(finetuned)} · {get_method(method).label} · "
             + (f"the size that keeps {100 * request.keep:g} % from sparsity {request.sparsity:.1e}" if request.keep
                else f"sparsity {request.sparsity:.1e}")
             + (f" · seeds {', '.join(map(str, request.seeds))}" if request.seeds else ""))
    return submit(runner, request, title)


@after("localize")
def _localized(request, result, doc) -> dict:
    """The flow's own result, and what the page reads of it by region id."""
    return {**doc, "region": Path(result.path).stem, "summary": result.record.summary(), "card": doc.get("card") or [],
            "seeds": [{**{k: v for k, v in e.items() if k != "path"}, "region": Path(e["path"]).stem}
                      for e in doc.get("seeds") or []]}  # each seed's region by its id, not the server's path


def seeds_made(job) -> list[str]:
    """The core and union a finished localize job of several seeds wrote (none for any other job)."""
    st = ((job.result or {}).get("stability") or {}) if job is not None and job.status == DONE else {}
    return [st[key] for key in ("core_path", "union_path") if st.get(key)]


def submit_seed_regions(runner, job) -> Job:
    """A seeds run's core and union scored beside each seed's region, with paired intervals (a comparison: the Compare
    tab shows it), what the run's card otherwise leaves to a command."""
    made = seeds_made(job)
    if not made:
        raise RequestError("pick a finished localize job of two or more seeds: its core and union are what this scores")
    ids = [e["region"] for e in job.result.get("seeds") or []] + [Path(p).stem for p in made]
    request = EvaluateRequest(regions=_paths(ids), n=store.defaults()["test_examples"], no_ood=True)  # the app's
    # comparison size (a shared server asks for one), in distribution: how the core and union keep the skill
    return submit(runner, request, f"Compare the core and union of {len(ids) - len(made)} seeds", kind="compare")


def parse_seeds(text) -> list[int] | None:
    """The seeds box: empty for one run, or a list such as '0, 1, 2' (each seed its own region)."""
    if not str(text or "").strip():
        return None
    return parse_list(text, int, "seeds", "seed", "0, 1, 2")


def submit_finetune(runner, *, base: str, task: str, columns: dict, optimizer: str, lr, epochs, train_examples,
                    l1, lora_rank=0) -> Job:

    lora = f"-lora{whole(lora_rank)}" if whole(lora_rank) else ""  # named apart from a whole fine-tune's
    name = safe_name(f"{short_ref(base)}-{short_ref(task)}-{optimizer}{lora}-{time.strftime('%Y%m%d-%H%M%S')}")
    # scored on the app's comparison size, which the tab has no box for: a shared server scores no task whole
    request = FinetuneRequest(base=base, task=task, **columns, optimizer=optimizer, lr=float(lr or 0), epochs=whole(epochs),
                              train_examples=int(train_examples or 0), l1=float(l1 or 0.0) if optimizer == "adamw" else 0.0,
                              lora_rank=whole(lora_rank) or 0, out=str(store.checkpoints_dir() / name),
                              test_examples=store.defaults()["test_examples"])

    lora = f" · LoRA rank {request.lora_rank}" if request.lora_rank else ""
    title = (f"Fine-tune {short_ref(base)} on '{short_ref(task)}' · {optimizer} lr {float(lr or 0):g} · {whole(epochs)} "
             f"epoch(s){lora}")
    return submit(runner, request, title)


@after("finetune")
def _trained(request, result, doc) -> dict:
    return {**doc, "checkpoint": result.out, "name": Path(request.out).name}


def of_pair(region_ids: list[str], finetuned: str) -> list[str]:
    """The picked regions made from ``finetuned``: picking another pair leaves no region of the last one picked."""
    entries = {e.id: e for e in store.list_regions()}
    return [r for r in region_ids or [] if r in entries and same_model(entries[r].meta.finetuned or "", finetuned or "")]


def _paths(region_ids: list[str], at_least: int = 1) -> list[str]:
    if len(region_ids or []) < at_least:
        raise RegionError("pick at least one region (run Localize first if the list is empty)" if at_least == 1
                          else f"pick at least {at_least} regions")
    return [str(store.region_path(rid)) for rid in region_ids]


def task_summary(task) -> str:
    """A checked task in one Markdown line: its kind, labels and split sizes, and what reading it left out."""
    sizes = ", ".join(f"{k} {len(s):,}" for k, s in task.splits.items())
    kind = "text-pair" if task.is_pair else "single-text"
    source = "an uploaded file" if settings.hosted() and task.source.startswith("local") else task.source
    line = (f"✓ **{md(task.name)}**: {kind} task with {task.num_labels} labels ({md(', '.join(task.label_names))}); "
            f"examples per split: {sizes}. Source: {md(source)}.")
    return line + "".join(f"\n\nNote: {md(note)}" for note in task.notes)


def task_check(task: str, columns: dict) -> str | None:
    """A task checked as a job will read it, where its kind checks one as soon as it is named (``flows.preview_task``:
    a harness task YAML or lm-eval name, by the harness itself, within what this server allows): one "✓" line per
    task and its first scored document as the model reads it. None for another kind, read when its columns are
    checked."""
    parts = flows.preview_task(TaskFields(task=task, **columns), store.guard())
    return None if parts is None else "\n\n".join(task_preview(part) for part in parts)


def _code(text: str, block: bool = False) -> str:
    """``text`` as Markdown code, shown as it is: fenced by more backticks than any run of them inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3 if block else 1, longest + 1)
    return f"{fence}\n{text}\n{fence}" if block else f"{fence} {text} {fence}"


def task_preview(part: dict) -> str:
    """One task's check in Markdown, as the upload check words a file's: what it is, its documents and the score
    compared, then its first scored document: the context the model reads, and the choices or the target after it."""
    splits = ", ".join(f"{md(split)} {n:,}" for split, n in part["splits"].items())
    scored = md(part["scored"])
    line = (f"✓ **{md(part['name'])}**: {md(part['form'])} task, {part['n']:,} {scored} documents scored (documents "
            f"per split: {splits}); metric compared: {md(part['metric'] or 'its first metric')}.")
    first = part.get("first")
    if not first:
        return line + f"\n\n⚠️ Its {scored} split holds no document."
    if first["choices"]:
        after = "Choices, each scored after it: " + ", ".join(
            _code(repr(c)) + (" (the answer)" if i == first["gold"] else "") for i, c in enumerate(first["choices"]))
    else:
        after = f"Target: {_code(repr(first['target']))}"
    return f"{line}\n\nFirst {scored} document as the model reads it:\n\n{_code(first['context'], True)}\n\n{after}"


def upload_summary(path: Path, info: dict) -> tuple[str, str]:
    """(the Markdown beside an upload, the status line): its splits, and what reading it as a task would say."""
    splits = ", ".join(f"{k}: {v:,} rows" for k, v in info["splits"].items())
    text = f"Read **{md(path.name)}** ({splits}). Check the guessed columns, then press **Check column mapping**." \
        if not info.get("read_as") else f"Read **{md(path.name)}** ({splits}), {md(info['read_as'])}."
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


PROBE_BY = {"whole": None, "one layer at a time": "layer", "one module type at a time": "module",
            "layer × module map": "cell"}  # the Try box's probe choices, as PredictRequest.by reads them


def submit_predict(runner, *, region_ids: list[str], text: str, knockout: bool = False, by: str | None = None) -> Job:
    """The text typed in the box through the bare body, FT and each picked region's graft: one sentence per line to
    classify, or for completion regions the whole box as one prompt to generate from; ``knockout`` adds FT without
    each region, ``by`` (a PROBE_BY choice) the graft of each layer or module type of the one region picked, or the map
    of each of its layer × module parts grafted alone and knocked out alone."""
    if not region_ids:
        raise RegionError("pick at least one region (run Localize first if the list is empty)")
    kind = kind_named(predict_kind(region_ids))
    texts = app_of(kind).try_texts(text)
    request = PredictRequest(regions=_paths(region_ids), texts=texts, knockout=bool(knockout),
                             by=PROBE_BY.get(by, by) if by else None)
    probes = [*(["knockout"] if request.knockout else []), *([f"by {request.by}"] if request.by else [])]
    return submit(runner, request, f"{app_of(kind).try_title(texts)} with {len(region_ids)} region(s)"
                  + (f" ({', '.join(probes)})" if probes else ""))


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

    title = f"Compose {len(paths)} regions (overlaps: {resolve}) and evaluate on each region's task"
    return submit(runner, request, title)


@after("compose")
def _composed(request, result, doc) -> dict:
    return {**doc, "region": Path(request.out).stem} if request.out else doc


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

    return submit(runner, request, f"Export grafted checkpoint of {region_id}")


@after("export")
def _zipped(request, result, doc) -> dict:
    """The grafted checkpoint as one download, its texts without the server's paths."""
    folder = Path(request.out)
    public_texts(folder)
    archive = shutil.make_archive(str(folder), "zip", root_dir=folder)
    shutil.rmtree(folder, ignore_errors=True)
    return {"zip": archive, "region": Path(request.region).stem, "k": result.k}


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
