"""The single-task verbs: load a pair, fine-tune a model, find a region, score it, and sweep its size.

Each is ``flow(request, progress=None, cancel=None, guard=LOCAL) -> Result`` (see ``common``), registered
once with its request, summary and text (``registry.verb``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from .. import card, generation, method, metrics, regions, scoring, sets, settings, training
from ..config import (
    DEFAULT_BASE, DEFAULT_FINETUNED, DEFAULT_FINETUNED_REFS, DEFAULT_LOADING, DEFAULT_TASK, FT_LABEL, GraftableSpec,
    LoadOptions, default_checkpoint_dir,
)
from ..completion import Completions, CompletionTask, context_length
from ..data import Split, Task, batches
from ..errors import Cancelled, GraftuiError, ModelError, RegionError, RequestError
from ..localizers import Budget, get_method, run_method
from ..compute import data_parallel
from ..method import region_size
from ..models import ModelPair, pair_kind, prompt_tokenizer
from ..paths import file_lock, short_ref, slug
from ..regions import RegionMeta, RegionRecord
from ..requests import (
    EvaluateRequest, FinetuneRequest, LocalizeRequest, PairRequest, PredictRequest, SweepRequest, derive,
)
from . import completions, text
from .common import (
    LOCAL, Guard, LocalizeResult, Progress, Result, check_build, check_model_ref, examples_per_class, finish,
    get_any_task, get_pair, get_task, load_task_as,
    graft_of, kshot_batches, labels_for, load_region, loadable, merged_shapes, needs_task_labels, ood_tasks,
    pair_for_regions, prompt_notes, remember_scores, same_regions, save_new, part_progress, side_by_side,
)
from .registry import verb
from .replicates import (
    each_seed, evaluate_finetunes, finetune_replicates, localize_finetunes, localize_seeds, per_seed_rows,
    replicate_groups, summarise_replicates,
)


# -- finetune --------------------------------------------------------------------------------------
@dataclass
class FinetuneResult(Result):
    out: str = ""
    reused: bool = False
    task: str = ""
    test_accuracy: float = 0.0
    test_examples: int = 0
    config: dict = field(default_factory=dict)
    chance_accuracy: float | None = None  # the most frequent class's share of the test split
    seeds: list[int] = field(default_factory=list)  # with --seeds: test_accuracy is the mean over these
    per_seed: list[dict] = field(default_factory=list)  # with --seeds: {seed, out, test_accuracy, reused} per seed
    test_accuracy_std: float | None = None  # with --seeds: the spread of the seeds' test accuracies
    task_kind: str = "classification"  # a completion task's test accuracy is the exact match of greedy generations
    test_loss: float | None = None  # a completion task: loss per completion token on the test examples
    train_examples: int | dict | None = None  # the examples it was trained on (the recipe's train_examples is a cap)

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["test_accuracy_ci"] = card.wilson(self.test_accuracy, self.test_examples)
        out["card"] = card.finetune_card(out)
        return out


@verb(FinetuneRequest, "make a fine-tuned checkpoint (SGD or AdamW + ℓ1)", text.finetune)
def finetune(req: FinetuneRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> FinetuneResult:
    """Fine-tune ``req.base`` on ``req.task``; the default folder is per recipe and reused. With ``req.seeds`` one
    fine-tune per seed (the variance the paper reports is over fine-tunes), each kept, a finished one reused."""
    req.validate()
    if req.seeds:
        runs = []
        for i, (seed, out) in enumerate(req.seed_outs().items()):
            one = replace(req, seed=seed, seeds=None, out=out)  # the same request, one seed
            runs.append(finetune(one, part_progress(progress, i, len(req.seeds), seed), cancel, guard))
        mean, std = metrics.mean_std([r.test_accuracy for r in runs])
        per_seed = [{"seed": s, "out": r.out, "test_accuracy": r.test_accuracy, "reused": r.reused}
                    for s, r in zip(req.seeds, runs)]
        loss = metrics.mean_std([r.test_loss for r in runs])[0]  # None for classification
        return replace(runs[0], request=req, seconds=sum(r.seconds for r in runs), test_accuracy=mean,
                       test_accuracy_std=std, seeds=list(req.seeds), per_seed=per_seed, test_loss=loss)
    start = time.time()
    config = req.recipe()
    check_model_ref(req.base)
    notes: list[str] = []
    task = get_any_task(req, guard, notes)
    allow = guard.allow_local(models=[req.base])
    options = req.load_options()
    generative = isinstance(task, CompletionTask)
    if generative:
        options = completions.check_kind(options)
        completions.check_finetune(req, task, config, allow, notes)  # what the base's context cannot hold, refused now
    else:
        completions.check_classification(options, task)
    if req.out:
        out, shared = Path(req.out).expanduser(), contextlib.nullcontext()
    else:
        key = f"{slug(req.base)}-{slug(task.name)}"
        if options.reading() != LoadOptions().reading():
            key += "-" + hashlib.sha256(json.dumps(options.reading(), sort_keys=True).encode()).hexdigest()[:6]
        out = default_checkpoint_dir(key, config)
        shared = file_lock(out)  # another run building this very checkpoint: wait for it, then reuse it

    def step(p):
        if progress:
            progress({"stage": f"fine-tuning on {task.name}", **asdict(p)})

    with shared:
        reused = not req.out and (out / "config.json").exists()
        if not reused and generative:
            completions.finetune(req, task, config, out, progress, cancel, allow)
        elif not reused:
            training.finetune(req.base, task, config, out, progress=step, cancel=cancel, allow_local=allow,
                              request=req.as_dict(), options=options)
    if progress:
        progress({"stage": "testing", "fraction": 0.99})
    trained_on = training.recorded_train_examples(out)
    if generative:
        exact, n, loss = completions.test_score(out, task, req)
        finish(progress)
        return FinetuneResult(req, notes, time.time() - start, str(out), reused, task.name, exact, n, config.as_dict(),
                              task_kind="completion", test_loss=loss, train_examples=trained_on)
    model, tokenizer, _, _ = training.load_trainable(str(out), task.label_names, LoadOptions(head=options.head,
                                                                                          dtype=options.dtype))
    checkpoint = SimpleNamespace(model=model.eval().to(settings.device()), tokenizer=tokenizer)
    probs, labels = scoring.predict(checkpoint, task, "test", req.test_examples)
    accuracy, n = metrics.accuracy(probs, labels), len(labels)
    chance = float(labels.bincount().max()) / n if n else None  # always answering the most frequent class
    if getattr(tokenizer, "prompt", None):
        notes.append(f"fine-tuned through its prompt: {tokenizer.prompt.describe()}")
    finish(progress)
    return FinetuneResult(req, notes, time.time() - start, str(out), reused, task.name, accuracy, n, config.as_dict(),
                          chance, train_examples=trained_on)


# -- localize --------------------------------------------------------------------------------------
def check_kinds(pair: ModelPair, task) -> None:
    """Refuse a task the pair cannot be scored on: a completion pair on a classification task, or the other way."""
    if task is None or pair.completion == isinstance(task, CompletionTask):
        return
    if pair.completion:
        raise ModelError(f"'{short_ref(pair.finetuned_ref)}' was fine-tuned on completions, and '{task.name}' is a "
                         "classification task: give its completion task as --task (e.g. --task dates for "
                         "smollm2-dates)")
    raise ModelError(f"'{task.name}' is a completion task, and the pair is read as a classifier: give the causal LMs "
                     "fine-tuned on it (e.g. --base smollm2 --finetuned smollm2-dates)")


def check_moved(pair: ModelPair) -> None:
    """Refuse a pair whose fine-tuned model is its base: no parameter moved, so no region carries anything."""
    if not pair.moved():
        raise ModelError(f"'{short_ref(pair.finetuned_ref)}' equals '{short_ref(pair.base_ref)}' in every graftable "
                         "parameter: fine-tuning moved nothing, so there is no skill to localize; give the fine-tuned "
                         "checkpoint as --finetuned")


def find_region(req, pair: ModelPair, task: Task | None, k: int, notes: list[str], progress=None, cancel=None):
    """Run ``req.method`` at budget k on ``pair``; returns the region and the record fields that say how."""
    info = get_method(req.method)
    config = req.learn_config()
    make_batches, n_train = None, 0
    if info.needs_data and pair.completion:
        make_batches, n_train = completions.mask_batches(pair, task, req, notes)
    elif info.needs_data:
        scoring.check_labels(pair, task)
        make_batches, n_train = kshot_batches(pair, task, req, notes)

    def on_step(report) -> None:
        progress({"stage": "mask learning", "k": k, **asdict(report)})

    region, _ = run_method(pair, Budget(k=k), req.method, make_batches=make_batches, config=config,
                           progress=on_step if progress else None, cancel=cancel)  # no one to report to: no count
    made = {"method": req.method, "task": req.task, "budget": req.budget().describe(), "budget_k": k,
            "sparsity": req.sparsity if req.k is None else None, "train_examples": n_train,
            "learn": config.as_dict() if info.needs_data else None, "graftable_spec": req.graftable_spec().as_dict()}
    return region, made


def region_record(req: LocalizeRequest, pair, region, made: dict, notes: list[str], seconds: float) -> RegionRecord:
    """What a region file holds: the region, its settings and the request that re-makes it (and its patch)."""
    if req.method == "learned":  # it starts from top-movement: how far did mask learning move it?
        start_region = method.base_region(pair.pre, pair.ft, list(pair.graftable), region_size(region))
        made = {**made, "top_movement_overlap": sets.overlap(start_region, region)}
    record = regions.make_record(pair, region, {**made, "request": req.as_dict(), "notes": list(notes),
                                                "seconds": round(seconds, 3)})
    return record if req.region_only else regions.with_patch(pair, record)


@verb(LocalizeRequest, "learn a skill region and write it as a skill patch", text.localize)
def localize(req: LocalizeRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> LocalizeResult:
    """Find the region of ``req.finetuned`` that carries ``req.task``, and save it."""
    req.validate()
    if req.finetuned_replicates:
        return localize_finetunes(localize, req, progress, cancel, guard)
    if req.seeds:
        return localize_seeds(localize, req, progress, cancel, guard)
    start = time.time()
    info = get_method(req.method)
    for ref in (req.base, req.finetuned):
        check_model_ref(ref)
    options = req.load_options()
    needs_task = info.needs_data or needs_task_labels(req.finetuned, options, guard)  # an LM's words follow the labels
    notes: list[str] = []
    task = get_any_task(req, guard, notes) if needs_task else None
    if task is None and req.check_n:  # only the held-out check reads the task: without it the region is still made
        try:
            task = get_any_task(req, guard, notes)
        except GraftuiError as err:
            notes.append(f"no held-out check: {err}")
    generative = isinstance(task, CompletionTask)
    if generative:
        options = completions.check_kind(options)
        if info.needs_data:
            completions.train_sample(task, req, [])  # a bad sample size fails before any model is loaded
    elif task is not None:
        completions.check_classification(options, task)
        if info.needs_data:
            examples_per_class(req, task, [])  # a bad k-shot size fails before any model is loaded
    pair = get_pair(req.base, req.finetuned, req.graftable_spec(), guard, progress, cancel, options,
                    task.label_names if task is not None and not generative else None)
    notes += prompt_notes(pair)
    check_kinds(pair, task)
    check_moved(pair)
    k = req.budget().resolve(pair.counts()["graftable"])
    if progress:
        progress({"stage": f"budget k = {k:,}", "k": k})
    world = data_parallel()
    checking = bool(req.check_n) and world is None and task is not None
    if checking and generative != pair.completion:
        checking = False
        notes.append(f"no held-out check: task '{task.name}' is a {'completion' if generative else 'classification'} "
                     "task and the pair is not read as one")
    if checking and not generative and len(task.label_names) != len(pair.label_names):
        checking = False
        notes.append(f"no held-out check: task '{task.name}' has {len(task.label_names)} labels, the fine-tuned model "
                     f"{len(pair.label_names)}; evaluate the region on its own task (--task)")
    if generative and pair.completion:  # what the model's context cannot hold is refused before the first mask step
        completions.check_context(pair, task, req, notes, req.check_n if checking else 0)
    if checking and info.needs_data and progress and not generative:  # a first held-out figure in seconds: the region
        # learning starts from (generating is slower: a completion task checks the learned region only)
        start_region = method.base_region(pair.pre, pair.ft, list(pair.graftable), k)
        quick_check(pair, task, {"top-movement start": start_region}, req, 0, progress, cancel)
    region, made = find_region(req, pair, task, k, notes, progress, cancel)
    check = quick_check(pair, task, {"this region": region}, req, req.steps if info.needs_data else 0,
                        progress, cancel) if checking else None
    record = region_record(req, pair, region, made, notes, time.time() - start)
    if req.out:
        out = Path(req.out).expanduser()
        if world is None or world.rank == 0:  # several processes learn one region; one writes it
            regions.save(record, out, exclusive=not req.overwrite)
    else:
        out = save_new(record, settings.subdir("regions"), f"{short_ref(req.task)}-{req.method}-k{record.size}",
                       world is None or world.rank == 0)
    if check:  # the quick check is the region's first entry in the regions table (a data-parallel run makes none)
        remember_scores(check["rows"], [out], ["this region"], [record], notes)
    finish(progress)
    return LocalizeResult(req, notes, time.time() - start, str(out), record, check=check)


def quick_check(pair: ModelPair, task, models: dict, req, step: int, progress=None, cancel=None) -> dict:
    """A region scored at once on ``req.check_n`` held-out test examples beside FT and the empty region (theirs cached
    per pair): {task, n, step, rows, differences}; each graft's accuracy (a completion task's: its exact match) goes
    to ``progress`` as a ``heldout`` event."""
    if pair.completion:
        part = completions.quick_check(pair, task, models, req, cancel=cancel)
    else:
        part = scoring.compare(pair, task, models, n=req.check_n, seed=scoring.TEST_SAMPLE_SEED, cancel=cancel).as_dict()
    rows = card.annotate(part["rows"])
    scored = {r["model"]: r for r in rows}
    ft, bare = scored[FT_LABEL], scored[scoring.body_of(pair)]
    for name in models:
        if progress:
            progress({"stage": f"held-out check of {name}", "heldout": {
                "step": step, "model": name, "accuracy": scored[name]["accuracy"], "ft": ft["accuracy"],
                "bare": bare["accuracy"], "n": scored[name]["n"]}})
    return {"task": part["task"], "n": ft["n"], "step": step, "rows": rows, "differences": part["differences"],
            **({"generations": part["generations"]} if "generations" in part else {})}


# -- evaluate --------------------------------------------------------------------------------------
@dataclass
class EvaluateResult(Result):
    rows: list[dict] = field(default_factory=list)
    reliability: dict = field(default_factory=dict)
    histogram: dict = field(default_factory=dict)
    task: str = ""
    ood: list[str] = field(default_factory=list)
    base: str = ""
    finetuned: str | None = None
    regions: dict = field(default_factory=dict)  # label -> its file (over fine-tunes: name -> each fine-tune's file)
    card: list[str] = field(default_factory=list)  # the result in sentences (card.py)
    side_by_side: dict | None = None  # two or more regions: their overlap and where each lies (side_by_side)
    differences: list[dict] = field(default_factory=list)  # paired: {"a", "b", "task", "metric", "diff", "ci", "p"}
    seeds: list[int] = field(default_factory=list)  # with --seeds: rows and differences are means over these
    per_seed: list[dict] = field(default_factory=list)  # with --seeds: each seed's rows and differences
    replicates: list[dict] = field(default_factory=list)  # regions that differ only in their seed, read together
    disagreements: list[dict] = field(default_factory=list)  # test examples where a graft decides unlike FT
    finetunes: list[str] = field(default_factory=list)  # regions of several fine-tunes: figures are means over these
    per_finetune: list[dict] = field(default_factory=list)  # … and each fine-tune's own rows and differences
    generations: list[dict] = field(default_factory=list)  # a completion task: prompt, reference, each model's answer
    judging: list[dict] = field(default_factory=list)  # a completion task: {"task", "rule", "max_new_tokens"} it was judged by


def _merge_patches(records, labels):
    """One patch holding every given patch's values, so each graft is exact on one pair."""
    sources = {r.meta.finetuned_sha256 or r.meta.finetuned for r in records}
    if len(sources) > 1:
        raise RegionError("the patches come from different fine-tuned models; give --finetuned, or evaluate them one "
                          "at a time")
    shapes = merged_shapes(records)
    if len(records) == 1:
        return records[0]
    contributions = [sets.Contribution(label, r.indices, r.values) for label, r in zip(labels, records)]
    indices, values, _ = sets.union_values(contributions, {}, "first")
    return RegionRecord(indices, shapes, dict(records[0].meta), values, records[0].head)


@dataclass
class Grafts:
    """Regions of a request and what they name, read and checked before any model loads (``regions_setting``),
    then the pair they are grafted onto (``regions_pair``): what evaluate and predict score."""

    records: list[RegionRecord]
    labels: list[str]
    first: RegionMeta
    base: str
    finetuned: str | None
    from_patch: bool  # the fine-tuned model cannot be loaded: its values come from the patches
    groups: dict[tuple, list[int]]  # (task ref, its columns) -> the regions learned on that task
    tasks: dict[tuple, Task]
    notes: list[str]


def regions_setting(req, guard: Guard) -> Grafts:
    """The regions of ``req`` (``GraftsFields``): their base, fine-tuned model and the task each was learned on
    (unless the request names them), every reference checked."""
    records = [load_region(p) for p in req.regions]
    labels = labels_for(req.regions, records)
    merged_shapes(records)
    first = records[0].meta if records else RegionMeta()
    notes: list[str] = same_regions(labels, records)
    base = req.base or first.base or DEFAULT_BASE
    task_ref = req.task or first.task or DEFAULT_TASK
    spec = req.data_spec() if (req.task or not records) else regions.recorded_columns(first)
    finetuned = req.finetuned
    from_patch = False
    if finetuned is None:
        recorded = {r.meta.finetuned for r in records}
        if len(recorded) > 1 and not all(r.is_patch for r in records):
            raise RegionError("the regions come from different fine-tuned models; give --finetuned, or use them "
                              "one at a time")
        finetuned = recorded.pop() if len(recorded) == 1 else (None if records else DEFAULT_FINETUNED)
        if not loadable(finetuned):
            if not (records and all(r.is_patch for r in records)):
                raise ModelError(f"the fine-tuned model '{finetuned}' the regions were made from cannot be loaded here; "
                                 "give --finetuned REF")
            from_patch = True
    if from_patch and getattr(req, "baselines", False):
        raise RequestError("--baselines needs the fine-tuned checkpoint (--finetuned REF): a skill patch holds only "
                           "its own region")
    check_model_ref(base)
    if not from_patch:
        check_model_ref(finetuned)
    # each region is scored on the task it was learned on (or all on --task): one group per task
    groups: dict[tuple, list[int]] = {}
    for i, record in enumerate(records):
        key = (req.task, None) if req.task else (record.meta.task or DEFAULT_TASK, regions.recorded_columns(record.meta))
        groups.setdefault(key, []).append(i)
    if not groups:
        groups[(task_ref, None)] = []
    tasks = {key: get_any_task(req, guard, notes) if key[1] is None and req.task else
             load_task_as(key[0], key[1] or spec, guard, notes) for key in groups}
    if len({isinstance(t, CompletionTask) for t in tasks.values()}) > 1:
        raise RegionError("the regions were learned on completion and classification tasks: evaluate them apart")
    return Grafts(records, labels, first, base, finetuned, from_patch, groups, tasks, notes)


def regions_pair(req, grafts: Grafts, task: Task, guard: Guard, progress=None, cancel=None) -> ModelPair:
    """The pair the regions of ``grafts`` are grafted onto, each region checked against it (``grafts.notes``
    gains what the reader should know: a patch's fine-tuned model rebuilt, another build, the prompt)."""
    records, labels, first, notes = grafts.records, grafts.labels, grafts.first, grafts.notes
    for path, record in zip(req.regions, records):  # before the reading the region recorded meets the request's
        completions.check_region_kind(Path(path).name, record.meta, task)
    options = req.load_options(regions.recorded_options(first) if records else None)
    if isinstance(task, CompletionTask):
        options = completions.check_kind(options)
    else:
        completions.check_classification(options, task)
    if grafts.from_patch:
        if progress:
            progress({"stage": f"loading {short_ref(grafts.base)} with the patch"})
        pair = guard.checked_pair(regions.pair_from_patch(grafts.base, _merge_patches(records, labels), options,
                                                          allow_local=guard.allow_local(models=[grafts.base])))
        if not options.device_map:
            pair.to(settings.device())
        notes.append(f"the fine-tuned model '{first.finetuned}' cannot be loaded here: '{FT_LABEL}' is "
                     "rebuilt from the patch (equal to the fine-tuned model inside the region only); give --finetuned "
                     "for the real one")
    elif records:
        pair = pair_for_regions(grafts.base, grafts.finetuned, records, guard, progress, cancel, options)
    else:
        pair = get_pair(grafts.base, grafts.finetuned, GraftableSpec(), guard, progress, cancel, options,
                        getattr(task, "label_names", None))
    notes += prompt_notes(pair)
    check_kinds(pair, task)
    for path, label, record in zip(req.regions, labels, records):
        try:
            regions.check_fits(record, pair)
        except RegionError as err:
            raise RegionError(f"'{path}': {err}") from None
        check_build(record, pair, label, notes)
    return pair


@verb(EvaluateRequest, "compare fine-tuned, pre-trained and grafted models", text.evaluate)
def evaluate(req: EvaluateRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> EvaluateResult:
    """FT, the pre-trained body with FT's head and every region's graft, in and out of distribution."""
    req.validate()
    parts = finetune_replicates(req)
    if parts is not None:  # before --seeds: every (fine-tune, seed) is one run of the mean, not a mean of means
        return evaluate_finetunes(evaluate, req, parts, progress, cancel, guard)
    if req.seeds:
        runs = each_seed(evaluate, req, progress, cancel, guard)
        rows = metrics.over_seeds([r.rows for r in runs], ("model", "task", "distribution"))
        card.annotate(rows)
        found = metrics.differences_over_seeds([r.differences for r in runs])
        lines = card.evaluate_card(rows, differences=found) + [
            f"Each figure is the mean over seeds {', '.join(map(str, req.seeds))} (the random baseline is drawn per "
            "seed; every seed is scored on the same test examples); each seed's own numbers are under per_seed."]
        return replace(runs[0], request=req, seconds=sum(r.seconds for r in runs), rows=rows, differences=found,
                       card=lines, seeds=list(req.seeds), per_seed=per_seed_rows(req.seeds, runs))
    start = time.time()
    grafts = regions_setting(req, guard)
    records, labels, groups, tasks, notes = grafts.records, grafts.labels, grafts.groups, grafts.tasks, grafts.notes
    task = next(iter(tasks.values()))
    generative = isinstance(task, CompletionTask)
    if generative and req.ood:
        notes.append(f"--ood names classification tasks in the task's label space; the completion task {task.name} "
                     "has none, so they are not scored: evaluate another completion task as its own --task")
    oods = {key: [] if generative else ood_tasks(req, key[0], tasks[key], guard, notes) for key in groups}  # checked
    # before any model loads
    pair = regions_pair(req, grafts, task, guard, progress, cancel)
    graftable = pair.counts()["graftable"]
    kinds = {label: record.meta.method for label, record in zip(labels, records)}
    start_overlap = {label: r.meta.top_movement_overlap for label, r in zip(labels, records)
                     if r.meta.top_movement_overlap is not None}
    baselines: dict[int, dict] = {}  # k -> {label: region}: the same regions on every task they are scored on
    if req.baselines:
        budgets = sorted({r.size for r in records}) or [Budget(sparsity=req.sparsity).resolve(graftable)]
        for k in budgets:
            if progress:
                progress({"stage": f"building baselines at k = {k:,}"})
            for name, region in scoring.baseline_regions(pair, k, seed=req.seed).items():
                label = get_method(name).label
                label = f"{label} k={k:,}" if len(budgets) > 1 else label
                label = f"{label} (baseline)" if label in labels else label
                baselines.setdefault(k, {})[label], kinds[label] = region, name
                if name == "top-movement":
                    for own, record in zip(labels, records):
                        if record.size == k and record.meta.method == "learned":
                            start_overlap.setdefault(own, sets.overlap(region, record.indices))
    result = {"rows": [], "reliability": {}, "histogram": {}, "ood": [], "differences": [], "disagreements": [],
              "generations": [], "judging": []}
    lines: list[str] = []
    several = len(groups) > 1
    for key, members in groups.items():
        task_g = tasks[key]
        models = {labels[i]: graft_of(records[i]) for i in members}
        contrasts = []  # each region against the baselines of its size
        for k in sorted({records[i].size for i in members}) or list(baselines):
            models.update(baselines.get(k, {}))
            contrasts += [(labels[i], other) for i in members if records[i].size == k for other in baselines.get(k, {})]
        if generative:
            part = completions.evaluate(req, pair, task_g, models, contrasts, progress, cancel,
                                        records[members[0]].meta if members else None, guard)
            notes += [n for n in part["notes"] if n not in notes]  # what the model's context cut
            part = {**part, "reliability": {}, "histogram": {}, "ood": [], "disagreements": []}
        else:
            part = scoring.compare(pair, task_g, models, ood=oods[key], n=req.n, seed=scoring.TEST_SAMPLE_SEED,
                                   contrasts=contrasts, progress=progress, cancel=cancel).as_dict()
        for row in part["rows"]:
            row["method"] = kinds.get(row["model"])
        card.annotate(part["rows"])
        ft_name = FT_LABEL
        if grafts.from_patch:
            ft_name = f"{FT_LABEL} (from patch)"
            for row in part["rows"]:
                if row["model"] == FT_LABEL:
                    row["model"] = ft_name
            for table in (part["reliability"], part["histogram"]):
                if FT_LABEL in table:
                    table[ft_name] = table.pop(FT_LABEL)
            for d in part["differences"]:
                d["b"] = ft_name if d["b"] == FT_LABEL else d["b"]
            for g in part.get("generations", ()):
                g[ft_name], g["exact"][ft_name] = g.pop(FT_LABEL), g["exact"].pop(FT_LABEL)
        result["generations"] += [{**g, "task": part["task"]} for g in part.get("generations", ())]
        if generative:
            result["judging"].append({k: part[k] for k in ("task", "rule", "max_new_tokens")})
        lines += card.completion_card(part["rows"], part["differences"], graftable, ft_name, judged=generation.AnswerRule(
            **part["rule"]).describe(part["max_new_tokens"])) if generative else \
            card.evaluate_card(part["rows"], graftable=graftable, start_overlap=start_overlap,
                               differences=part["differences"])
        result["rows"] += part["rows"]
        result["differences"] += part["differences"]
        result["disagreements"] += [{**d, "task": part["task"]} for d in part["disagreements"]
                                    if d["model"] in labels]  # the regions', not the baselines'
        result["ood"] += [o for o in part["ood"] if o not in result["ood"]]
        for key in ("reliability", "histogram"):  # the references of later tasks are named with their task
            result[key].update({(f"{name} · {part['task']}" if several and name not in models else name): value
                                for name, value in part[key].items()})
    result["task"] = " + ".join(t.name for t in tasks.values())
    if several:
        notes.append(f"the regions were learned on {len(groups)} tasks ({result['task']}): each is scored on its own, "
                     "beside the fine-tuned model and the bare body on that task")
    side = side_by_side(labels, records) if len(records) > 1 else None
    remember_scores(result["rows"], req.regions, labels, records, notes, not grafts.from_patch)
    finish(progress)
    if side:
        lines += card.compose_card({**side, "graftable_params": graftable, "rows": []})
    together = [summarise_replicates(name, members, result["rows"], result["differences"])
                for name, members in replicate_groups(labels, records).items()]
    lines += [card.replicate_sentence(group) for group in together]
    return EvaluateResult(req, notes, time.time() - start, **result, base=grafts.base,
                          finetuned=None if grafts.from_patch else grafts.finetuned,
                          regions={label: str(p) for label, p in zip(labels, req.regions)}, card=lines,
                          side_by_side=side, replicates=together)


# -- predict ---------------------------------------------------------------------------------------
@dataclass
class PredictResult(Result):
    task: str = ""
    label_names: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # one per (text, model): probs per class, predicted, confidence
    # (a completion region: {text, model, generation, agrees_with_ft})
    base: str = ""
    finetuned: str | None = None
    card: list[str] = field(default_factory=list)
    kind: str = "classification"  # or "completion": each text is a prompt, each row a model's generation for it


@verb(PredictRequest, "each model's class probabilities (a completion region: its generation) for texts you give",
      text.predict)
def predict(req: PredictRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> PredictResult:
    """The bare body, the fine-tuned model and every region's graft on the same sentences, side by side: the
    first look at what a region changes (for a language model, the label words' scores under its prompt; for a
    completion region, each model's greedy generation for each text as a prompt: ``predict_completions``)."""
    req.validate()
    start = time.time()
    grafts = regions_setting(req, guard)
    tasks = list(grafts.tasks.values())
    task = tasks[0]
    if isinstance(task, CompletionTask):
        return predict_completions(req, grafts, task, start, progress, cancel, guard)
    if any(t.label_names != task.label_names for t in tasks):
        raise RequestError("the regions were learned on tasks with different labels ("
                           + "; ".join(f"{t.name}: {', '.join(t.label_names)}" for t in tasks)
                           + "); predict with regions of one task at a time")
    if task.is_pair and not req.pairs:
        raise RequestError(f"task '{task.name}' reads two texts: give a second text (--pair) for each --text")
    if req.pairs and not task.is_pair:
        raise RequestError(f"--pair: task '{task.name}' reads one text; drop --pair")
    pair = regions_pair(req, grafts, task, guard, progress, cancel)
    sentences = Split(tuple(req.texts), (0,) * len(req.texts), tuple(req.pairs) if req.pairs else None)
    ft_name = f"{FT_LABEL} (from patch)" if grafts.from_patch else FT_LABEL
    body = scoring.body_of(pair)
    models = _models(pair, grafts, ft_name)
    names = list(task.label_names)
    rows, ft_says = [], {}
    for m, (model, context) in enumerate(models):
        if cancel is not None and cancel.is_set():
            raise Cancelled("predict cancelled")
        if progress:
            progress({"stage": f"scoring {model}", "fraction": m / len(models)})
        with context():
            probs, _ = metrics.predict_proba(pair.model, batches(pair.tokenizer, sentences, 16, task.max_length))
        for i, p in enumerate(probs.tolist()):
            best = max(range(len(names)), key=p.__getitem__)
            if model == ft_name:
                ft_says[i] = best
            rows.append({"text": i, "model": model, "probs": dict(zip(names, p)), "predicted": names[best],
                         "confidence": p[best], "agrees_with_ft": None if model in (ft_name, body) else best})
    for r in rows:  # grafts against FT's own prediction on the same sentence
        if r["agrees_with_ft"] is not None:
            r["agrees_with_ft"] = r["agrees_with_ft"] == ft_says[r["text"]]
        elif r["model"] == body:
            r["agrees_with_ft"] = names.index(r["predicted"]) == ft_says[r["text"]]
    finish(progress)
    return PredictResult(req, grafts.notes, time.time() - start, task.name, names, list(req.texts), rows, grafts.base,
                         None if grafts.from_patch else grafts.finetuned, card.predict_card(rows, ft_name, len(req.texts)))


def _models(pair: ModelPair, grafts: Grafts, ft_name: str) -> list[tuple[str, object]]:
    """(name, context) of each model predict shows: the bare body, FT, then every region's graft."""
    models = [(scoring.body_of(pair), contextlib.nullcontext), (ft_name, pair.finetuned)]  # the pair rests as the body
    for label, record in zip(grafts.labels, grafts.records):
        region = graft_of(record)
        models.append((label, functools.partial(pair.grafted, *(region if isinstance(region, tuple) else (region,)))))
    return models


def predict_completions(req: PredictRequest, grafts: Grafts, task: CompletionTask, start: float, progress=None,
                        cancel=None, guard: Guard = LOCAL) -> PredictResult:
    """Predict on completion regions: each model's greedy generation for each prompt (each --text one whole prompt),
    judged as the region is (its answer rule and tokens to generate, unless the request says otherwise); a model
    ``agrees_with_ft`` where its answer is FT's."""
    if req.pairs:
        raise RequestError(f"--pair: '{task.name}' is a completion task, and each --text is one whole prompt; drop "
                           "--pair (a prompt of several lines is one --text)")
    notes = grafts.notes
    pair = regions_pair(req, grafts, task, guard, progress, cancel)
    rule, new = completions.judging(req, grafts.first if grafts.records else None, guard)
    prompts = Completions(tuple(((("user", t), ("assistant", "")) for t in req.texts)))
    given = dataclasses.replace(task, name="the prompts given")  # what the notes name: the --text, not the task
    notes += [n for n in generation.fit(pair.tokenizer, given, prompts, context_length(pair.model), new)
              if n not in notes]  # refused here when the tokens to generate leave no room for a prompt
    one_line = all("\n" not in r.strip() for r in task.splits["test"].references)  # how evaluate cuts answers
    ft_name = f"{FT_LABEL} (from patch)" if grafts.from_patch else FT_LABEL
    models = _models(pair, grafts, ft_name)
    said: dict[str, list[str]] = {}
    for m, (model, context) in enumerate(models):
        if cancel is not None and cancel.is_set():
            raise Cancelled("predict cancelled")
        if progress:
            progress({"stage": f"generating with {model}", "fraction": m / len(models)})
        with context():
            said[model] = generation.generate(pair.model, pair.tokenizer, prompts, task.chat, max_new_tokens=new)
    rows = [{"text": i, "model": model, "generation": said[model][i],
             "agrees_with_ft": None if model == ft_name else
             generation.same_answer(said[model][i], said[ft_name][i], rule, one_line)}
            for i in range(len(req.texts)) for model, _ in models]
    finish(progress)
    return PredictResult(req, notes, time.time() - start, task.name, [], list(req.texts), rows, grafts.base,
                         None if grafts.from_patch else grafts.finetuned,
                         card.predict_card(rows, ft_name, len(req.texts), judged=rule.describe(new)), kind="completion")


# -- sweep ---------------------------------------------------------------------------------------
@dataclass
class SweepResult(Result):
    rows: list[dict] = field(default_factory=list)
    ft_accuracy: float | None = None
    ft_ece: float | None = None
    ft_ood: dict = field(default_factory=dict)  # OOD task -> the fine-tuned model's accuracy
    task: str = ""
    ood: list[str] = field(default_factory=list)
    body_accuracy: float | None = None  # the pre-trained body with the fine-tuned head (the empty region)
    n_test: int = 0
    differences: list[dict] = field(default_factory=list)  # paired, per sparsity: each method − FT, method − method
    seeds: list[int] = field(default_factory=list)  # with --seeds: rows and differences are means over these
    per_seed: list[dict] = field(default_factory=list)  # with --seeds: each seed's rows and differences
    finetunes: list[str] = field(default_factory=list)  # with --finetuned-replicates: … means over these fine-tunes
    per_finetune: list[dict] = field(default_factory=list)  # … and each one's rows and differences

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["card"] = card.sweep_card(out)
        return out


def _sweep_over(runs: list[SweepResult], req, over: str, each: list[dict]) -> SweepResult:
    """Sweeps of several seeds (or fine-tunes, or both: ``over``) as one: every figure their mean, a row's interval
    their spread (not one test's Wilson interval), each run's own rows and differences kept beside ``each``'s entry."""
    rows = metrics.over_seeds([r.rows for r in runs], ("method", "sparsity"))
    for row in rows:
        row["accuracy_ci"] = metrics.seed_interval(row.get("accuracy_seeds") or ())
        if over != "seeds":
            row["over"] = over
    found = metrics.differences_over_seeds([r.differences for r in runs], over)
    per = [{**e, "rows": r.rows, "differences": r.differences} for e, r in zip(each, runs)]
    kept = ({"seeds": list(req.seeds), "per_seed": per} if over == "seeds" else
            {"finetunes": req.finetunes(), "per_finetune": per, "seeds": list(req.seeds or ())})
    mean = {name: metrics.mean_std([getattr(r, name) for r in runs])[0]
            for name in ("ft_accuracy", "ft_ece", "body_accuracy")}
    mean["ft_ood"] = metrics.mean_nested([r.ft_ood for r in runs])[0]
    return replace(runs[0], request=req, seconds=sum(r.seconds for r in runs), rows=rows, differences=found, **mean,
                   **kept)


@verb(SweepRequest, "accuracy against region size for several methods", text.sweep)
def sweep(req: SweepRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> SweepResult:
    """Accuracy, ECE and OOD accuracy against budget for several methods (Fig. 2, Tables 6–7); writes no file."""
    req.validate()
    if req.finetuned_replicates:  # with --seeds, every (fine-tune, seed) is one run of the mean
        jobs = [(ref, seed) for ref in req.finetunes() for seed in req.seeds or [None]]
        runs = [sweep(req.replace(finetuned=ref, finetuned_replicates=None, seeds=None,
                                  **({} if seed is None else {"seed": seed})),
                      part_progress(progress, i, len(jobs), None,
                                    f"fine-tune {short_ref(ref)}" + ("" if seed is None else f", seed {seed}")),
                      cancel, guard)
                for i, (ref, seed) in enumerate(jobs)]
        each = [{"finetuned": ref, **({} if seed is None else {"seed": seed})} for ref, seed in jobs]
        return _sweep_over(runs, req, "runs" if req.seeds else "fine-tunes", each)
    if req.seeds:
        return _sweep_over(each_seed(sweep, req, progress, cancel, guard), req, "seeds",
                           [{"seed": seed} for seed in req.seeds])
    start = time.time()
    for ref in (req.base, req.finetuned):
        check_model_ref(ref)
    notes: list[str] = []
    task = get_any_task(req, guard, notes)
    if isinstance(task, CompletionTask):
        return sweep_completions(req, task, notes, start, progress, cancel, guard)
    completions.check_classification(req.load_options(), task)
    oods = ood_tasks(req, req.task, task, guard, notes)
    methods = list(dict.fromkeys(req.methods))
    if any(get_method(m).needs_data for m in methods):
        examples_per_class(req, task, [])
    pair = get_pair(req.base, req.finetuned, req.graftable_spec(), guard, progress, cancel, req.load_options(),
                    task.label_names)
    check_kinds(pair, task)
    scoring.check_labels(pair, task)
    notes += prompt_notes(pair)
    check_moved(pair)

    def score(region):
        """(metrics in distribution, {OOD task: accuracy}, test predictions) of a graft; ``None`` is the fine-tuned
        model, ``{}`` the empty region (both cached per pair)."""
        seed = scoring.TEST_SAMPLE_SEED
        if region is None or region == {}:
            name = FT_LABEL if region is None else scoring.body_of(pair)
            probs, labels = scoring.reference_predict(pair, name, task, "test", req.n, seed)
            ood = {o.name: metrics.accuracy(*scoring.reference_predict(pair, name, o, "test", req.n, seed)) for o in oods}
            return metrics.metrics(probs, labels), ood, probs, labels
        with pair.grafted(region):
            probs, labels = scoring.predict(pair, task, "test", req.n, seed=seed)
            ood = {o.name: metrics.accuracy(*scoring.predict(pair, o, "test", req.n, seed=seed)) for o in oods}
            return metrics.metrics(probs, labels), ood, probs, labels

    ft, ft_ood, ft_probs, labels = score(None)
    bare, _, bare_probs, _ = score({})
    graftable = pair.counts()["graftable"]
    rows, found = [], []
    sparsities = sorted(set(req.sparsities))
    total = len(sparsities) * len(methods)
    for i, s in enumerate(sparsities):
        k = Budget(sparsity=s).resolve(graftable)
        predictions = {FT_LABEL: ft_probs, scoring.body_of(pair): bare_probs}
        for j, name in enumerate(methods):
            if progress:
                progress({"stage": f"{name} at sparsity {s:g}", "fraction": (i * len(methods) + j) / total})
            one = derive(LocalizeRequest, req, method=name, sparsity=s)
            began = time.time()
            region, made = find_region(one, pair, task, k, notes, cancel=cancel)
            kept = None
            if req.keep:  # the region as a file that `graftui run` re-makes, like one from localize
                kept = save_new(region_record(one, pair, region, made, [], time.time() - began),
                                Path(req.keep).expanduser(), f"{short_ref(req.task)}-{name}-k{region_size(region)}")
            own, ood, predictions[name], _ = score(region)
            rows.append({"method": name, "region": None if kept is None else str(kept), "sparsity": s,
                         "k": region_size(region), "n": own.n, "accuracy": own.accuracy,
                         "accuracy_ci": card.wilson(own.accuracy, own.n), "ece": own.ece,
                         "calibration": card.calibration(own.accuracy, own.mean_confidence), "ood": ood,
                         "ft_accuracy": ft.accuracy, "retained": own.accuracy / ft.accuracy if ft.accuracy else None,
                         "gain_recovered": card.gain_recovered(own.accuracy, ft.accuracy, bare.accuracy)})
        # each method against FT, and every two methods at this budget, on the same test examples
        pairs = [(m, FT_LABEL, metric) for m in methods for metric in metrics.PAIRED_METRICS]
        pairs += [(a, b, metric) for x, a in enumerate(methods) for b in methods[x + 1:]
                  for metric in metrics.PAIRED_METRICS]
        found += [{**d, "sparsity": s} for d in scoring.differences(predictions, labels, pairs, task.name,
                                                                     seed=req.seed)]
    finish(progress)
    return SweepResult(req, list(dict.fromkeys(notes)), time.time() - start, rows, ft.accuracy, ft.ece, ft_ood, task.name,
                       [o.name for o in oods], bare.accuracy, ft.n, found)




def sweep_completions(req: SweepRequest, task: CompletionTask, notes: list[str], start: float, progress=None,
                      cancel=None, guard: Guard = LOCAL) -> SweepResult:
    """The sweep on a completion task: at each budget, each method's region scored by generation beside FT and the
    pre-trained model (exact match as the row's accuracy, token ECE as its ECE), every two methods paired."""
    if req.ood:
        notes.append(f"--ood names classification tasks in the task's label space; the completion task {task.name} has "
                     "none, so they are not scored")
    methods = list(dict.fromkeys(req.methods))
    if any(get_method(m).needs_data for m in methods):
        completions.train_sample(task, req, [])
    pair = get_pair(req.base, req.finetuned, req.graftable_spec(), guard, progress, cancel,
                    completions.check_kind(req.load_options()))
    check_kinds(pair, task)
    check_moved(pair)
    completions.check_context(pair, task, req, notes, req.n)  # before the first mask step: what the context cannot hold
    graftable = pair.counts()["graftable"]
    rows, found, ft = [], [], None
    sparsities = sorted(set(req.sparsities))
    for i, s in enumerate(sparsities):
        k = Budget(sparsity=s).resolve(graftable)
        made, kept = {}, {}
        for j, name in enumerate(methods):
            if progress:
                progress({"stage": f"{name} at sparsity {s:g}", "fraction": (i * len(methods) + j) / len(sparsities)
                          / len(methods)})
            one = derive(LocalizeRequest, req, method=name, sparsity=s)
            began = time.time()
            region, record = find_region(one, pair, task, k, notes, cancel=cancel)
            made[name] = region
            if req.keep:
                kept[name] = str(save_new(region_record(one, pair, region, record, [], time.time() - began),
                                          Path(req.keep).expanduser(), f"{short_ref(req.task)}-{name}-k{region_size(region)}"))
        part = completions.evaluate(req, pair, task, made, [(a, b) for x, a in enumerate(methods)
                                                             for b in methods[x + 1:]], cancel=cancel)
        by = {r["model"]: r for r in part["rows"]}
        ft, bare = by[FT_LABEL], by[scoring.body_of(pair)]
        for name in methods:
            r = by[name]
            rows.append({"method": name, "region": kept.get(name), "sparsity": s, "k": r["region_size"], "n": r["n"],
                         "accuracy": r["exact_match"], "exact_match": r["exact_match"], "loss": r["loss"],
                         "accuracy_ci": card.wilson(r["exact_match"], r["n"]), "ece": r["token_ece"],
                         "calibration": None, "ood": {}, "ft_accuracy": ft["exact_match"],
                         "retained": r["exact_match"] / ft["exact_match"] if ft["exact_match"] else None,
                         "gain_recovered": card.gain_recovered(r["exact_match"], ft["exact_match"],
                                                               bare["exact_match"])})
        found += [{**d, "sparsity": s} for d in part["differences"] if d["b"] != scoring.body_of(pair)]
    finish(progress)
    return SweepResult(req, list(dict.fromkeys(notes)), time.time() - start, rows, ft["exact_match"], ft["token_ece"], {},
                       task.name, [], bare["exact_match"], ft["n"], found)


# -- pair ---------------------------------------------------------------------------------------
@dataclass
class PairResult(Result):
    pair: dict = field(default_factory=dict)  # ModelPair.describe(): architecture, kind, prompt, labels, counts, hashes
    preview: dict | None = None  # a language model's prompt on the task's first training example (preview_prompt)


def preview_prompt(req: PairRequest, guard: Guard = LOCAL) -> dict:
    """What a language model reads for the task's first training example, and each label word's tokens.

    Only the tokenizer is loaded; a default fine-tuned model not built yet is read with its base's tokenizer
    and its known prompt.
    """
    req.validate()
    key = str(req.finetuned).strip().lower()
    finetuned, recorded = req.finetuned, None
    if key in DEFAULT_FINETUNED_REFS:
        finetuned, recorded = DEFAULT_FINETUNED_REFS[key][0], DEFAULT_LOADING.get(key)
    options = req.load_options(recorded)
    allow = guard.allow_local(models=[finetuned])
    kind = pair_kind(finetuned, options, allow_local=allow)
    if kind == "classifier":
        raise ModelError(f"'{short_ref(req.finetuned)}' is a sequence classifier: it reads the text as it is, no prompt")
    task = get_task(req.task, req.data_spec(), guard)
    tokenizer = prompt_tokenizer(finetuned, kind, task.label_names, options, allow_local=allow)
    train = task.splits["train"]
    return {**tokenizer.preview(train.texts[0], train.pairs[0] if train.pairs else None, task.max_length),
            "describe": tokenizer.prompt.describe(), "kind": kind}


@verb(PairRequest, "load a pair: its parameter counts, and how a language model reads the task", text.pair)
def pair(req: PairRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> PairResult:
    """Load (or reuse) the pair and describe it; a clear error when the two do not pair."""
    req.validate()
    start = time.time()
    options = req.load_options()
    labels = get_task(req.task, req.data_spec(), guard).label_names if needs_task_labels(req.finetuned, options, guard) \
        else None
    loaded = get_pair(req.base, req.finetuned, GraftableSpec(), guard, progress, cancel, options, labels)
    preview = preview_prompt(req, guard) if loaded.prompt is not None else None
    finish(progress)
    return PairResult(req, prompt_notes(loaded), time.time() - start, loaded.describe(), preview)
