"""The single-task verbs: load a pair, fine-tune a model, find a region, score it, and sweep its size.

Each is ``flow(request, progress=None, cancel=None, guard=LOCAL) -> Result`` (see ``common``), registered
once with its request, summary and text (``registry.verb``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .. import card, figures as fig, method, metrics, regions, sets, settings, sizing, training
from ..tasks.classification import scoring
from ..config import (
    DEFAULT_BASE, DEFAULT_FINETUNED, DEFAULT_FINETUNED_REFS, DEFAULT_LOADING, DEFAULT_SPARSITY, DEFAULT_TASK, FT_LABEL,
    GraftableSpec, LoadOptions, default_checkpoint_dir,
)
from ..tasks.classification.data import Task
from ..errors import DataError, GraftuiError, ModelError, RegionError, RequestError
from ..learning import out_of_memory_as_error
from ..localizers import METHODS, Budget, get_method, run_method
from ..compute import data_parallel
from ..method import region_size
from ..models import ModelPair, pair_kind, prompt_tokenizer
from ..formatting import pct
from ..paths import file_lock, short_ref, slug
from ..regions import RegionMeta, RegionRecord
from ..requests import (
    NESTED_FACTOR, EvaluateRequest, FinetuneRequest, LocalizeRequest, PairRequest, PredictRequest, SweepRequest,
    derive,
)
from ..experiments import only_part
from ..kinds import Look, given_fields, kind_named, kind_of, named_kind, read_task, read_task_as, recorded_columns
from ..layout import anatomy as count_anatomy, cell_label, part_label
from . import text
from .common import (
    LOCAL, Guard, LocalizeResult, Progress, Result, another_model, check_build, check_model_ref, finish,
    get_pair, get_task,
    graft_of, labels_for, load_region, loadable, merged_shapes, needs_task_labels, ood_tasks,
    pair_for_regions, phase_progress, prompt_notes, region_stem, remember_scores, same_regions, save_new,
    part_progress, side_by_side, STEP_PASSES,
)
from ..tasks.completion.generation import ANSWER_PASSES
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
        out["card"] = card.finetune_card(out, kind_named(self.task_kind).words)
        return out


def _test_table(doc: dict) -> dict:
    keys = ("task", "test_accuracy", "test_accuracy_ci", "test_examples", "chance_accuracy")
    return {"test": [{k: doc.get(k) for k in keys}]} if "test_accuracy" in doc else {}


@verb(FinetuneRequest, "make a fine-tuned checkpoint (SGD or AdamW + ℓ1)", text.finetune, tables=_test_table)
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
    task = read_task(req, guard, notes)
    kind = kind_of(task)
    kind.supports("finetune", task)
    allow = guard.allow_local(models=[req.base])
    options = kind.reading(req.load_options(), task)
    kind.check_finetune(req, task, config, allow, notes)  # what the base cannot be fine-tuned on, refused now
    if req.out:
        out, shared = Path(req.out).expanduser(), contextlib.nullcontext()
    else:
        key = f"{slug(req.base)}-{slug(task.name)}"
        if options.reading() != LoadOptions().reading():
            key += "-" + hashlib.sha256(json.dumps(options.reading(), sort_keys=True).encode()).hexdigest()[:6]
        out = default_checkpoint_dir(key, config)
        shared = file_lock(out)  # another run building this very checkpoint: wait for it, then reuse it
    with shared:
        reused = not req.out and training.is_built(out)
        if not reused:
            kind.finetune(req, task, config, out, options, progress, cancel, allow)
    if progress:
        progress({"stage": "testing", "fraction": 0.99})
    trained_on = training.recorded_train_examples(out)
    scored = kind.test_score(out, task, req, options, notes)
    finish(progress)
    return FinetuneResult(req, notes, time.time() - start, str(out), reused, task.name, scored["test_accuracy"],
                          scored["test_examples"], config.as_dict(), scored["chance_accuracy"], task_kind=kind.name,
                          test_loss=scored["test_loss"], train_examples=trained_on)


# -- localize --------------------------------------------------------------------------------------
def check_moved(pair: ModelPair) -> None:
    """Refuse a pair whose fine-tuned model is its base: no parameter moved, so no region carries anything."""
    if not pair.moved():
        raise ModelError(f"'{short_ref(pair.finetuned_ref)}' equals '{short_ref(pair.base_ref)}' in every graftable "
                         "parameter: fine-tuning moved nothing, so there is no skill to localize; give the fine-tuned "
                         "checkpoint as --finetuned")


def budget_of(req, task: Task | None) -> Budget:
    """The request's budget: its --k or --sparsity, else the task kind's own (a completion skill needs more room)."""
    return req.budget(kind_of(task).sparsity if task is not None else DEFAULT_SPARSITY)


def find_region(req, pair: ModelPair, task: Task | None, k: int, notes: list[str], progress=None, cancel=None,
                within=None):
    """Run ``req.method`` at budget k on ``pair`` (inside the region ``within`` where given); returns the region and
    the record fields that say how."""
    info = get_method(req.method)
    config = info.configured(req.learn_config())  # what the method runs with, as its region file records it
    make_batches, n_train = None, 0
    if info.needs_data:
        make_batches, n_train = kind_of(task).mask_batches(pair, task, req, notes)

    steps: list[dict] = []  # the curve the region file keeps

    def on_step(report) -> None:
        steps.append(asdict(report))
        progress({"stage": "mask learning", "k": k, **asdict(report)})

    announce = (lambda line: progress({"stage": line, "announce": True})) if progress else None
    details: dict = {}
    region, _ = run_method(pair, Budget(k=k), req.method, make_batches=make_batches, config=config,
                           progress=on_step if progress else None, cancel=cancel,  # no one to report to: no count
                           announce=announce, details=details, within=within)
    budget = budget_of(req, task)
    made = {"method": req.method, "task": req.task, "task_files": kind_of(task).task_files(task) or None if task else None,
            "budget": budget.describe(), "budget_k": k,
            "sparsity": budget.sparsity, "train_examples": n_train,
            "learn": config.as_dict() if info.needs_data else None, "graftable_spec": req.graftable_spec().as_dict(),
            "curve": regions.curve_of(steps) if steps else None, "learner": details or None}
    return region, made


def region_record(req: LocalizeRequest, pair, region, made: dict, notes: list[str], seconds: float) -> RegionRecord:
    """What a region file holds: the region, its settings and the request that re-makes it (and its patch)."""
    if get_method(req.method).needs_data:  # mask learning starts from top-movement: how far did it move?
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
    with out_of_memory_as_error("localize"):
        return _localize(req, progress, cancel, guard)


def _localize(req: LocalizeRequest, progress: Progress | None, cancel, guard: Guard) -> LocalizeResult:
    start = time.time()
    info = get_method(req.method)
    for ref in (req.base, req.finetuned):
        check_model_ref(ref)
    options = req.load_options()
    needs_task = info.needs_data or needs_task_labels(req.finetuned, options, guard)  # an LM's words follow the labels
    notes: list[str] = []
    task = read_task(req, guard, notes) if needs_task else None
    if task is None and req.check_n:  # only the held-out check reads the task: without it the region is still made
        try:
            task = read_task(req, guard, notes)
        except GraftuiError as err:
            notes.append(f"no held-out check: {err}")
    kind = kind_of(task) if task is not None else None
    if kind is not None:
        kind.supports("localize", task)
        options = kind.reading(options, task)
        if info.needs_data:
            kind.check_sample(task, req)  # a bad sample size fails before any model is loaded
    with kind.loading(task) if kind is not None else contextlib.nullcontext():
        pair = get_pair(req.base, req.finetuned, req.graftable_spec(), guard, progress, cancel, options,
                        kind.labels(task) if kind is not None else None)
    notes += prompt_notes(pair)
    if kind is not None:
        kind.check_pair(pair, task)
    check_moved(pair)
    k = budget_of(req, task).resolve(pair.counts()["graftable"])
    if progress:
        progress({"stage": f"budget k = {k:,}", "k": k})
    world = data_parallel()
    checking = bool(req.check_n) and world is None and kind is not None
    problem = kind.heldout_problem(pair, task) if checking else None
    if problem:
        checking = False
        notes.append(problem)
    if req.keep and not checking:  # the search measures every region it learns on held-out examples
        raise RequestError(f"--keep scores each region on held-out examples, and here none can be scored ("
                           f"{problem or ('several processes learn one region' if world else 'no task to score')}); "
                           "give a fixed --sparsity or --k instead")
    if kind is not None:  # what the model's context cannot hold is refused before the first mask step
        kind.check_context(pair, task, req, notes, req.check_n if checking else 0)
    if checking and info.needs_data and progress and kind.cheap_check and not req.keep:  # a first held-out figure in seconds: the
        # region learning starts from (generating is slower: such a task checks the learned region only)
        start_region = method.base_region(pair.pre, pair.ft, list(pair.graftable), k)
        quick_check(pair, task, {"top-movement start": start_region}, req, 0, progress, cancel)
    learned = learning_share(req, kind, info.needs_data) if checking else 1.0  # where scoring starts
    if req.keep:
        region, made, check = size_needed(req, pair, task, k, notes, progress, cancel)
    elif req.schedule == "nested" and info.needs_data:  # a region of 10·k first, then the region inside it
        wide = min(pair.counts()["graftable"], NESTED_FACTOR * k)
        middle = learned / 2
        outer, _ = find_region(req, pair, task, wide, notes, phase_progress(progress, 0.0, middle,
                                                                           f"nested: k = {wide:,} first"), cancel)
        region, made = find_region(req, pair, task, k, notes, phase_progress(progress, middle, learned,
                                                                             f"nested: k = {k:,} inside it"),
                                   cancel, within=outer)
        made["nested_from"] = wide
    else:
        region, made = find_region(req, pair, task, k, notes, phase_progress(progress, 0.0, learned), cancel)
    k = made["budget_k"]  # the size search's, where it ran
    if region_size(region) < k:  # a method with fewer parameters to give than the budget (bias-only)
        graftable = pair.counts()["graftable"]
        notes.append(f"the method '{req.method}' gave {region_size(region):,} parameters "
                     f"({pct(region_size(region) / graftable)} of the graftable set), fewer than the budget k = "
                     f"{k:,} ({pct(k / graftable)}): it has no more to give ({info.description[:1].lower()}"
                     f"{info.description[1:].rstrip('.')})")
    if not req.keep:
        check = quick_check(pair, task, {"this region": region}, req, req.steps if info.needs_data else 0,
                            phase_progress(progress, learned, 1.0, f"held-out check on "
                                           f"{kind.test_count(task, req.check_n):,} examples"),
                            cancel) if checking else None
        if check:
            notes += did_not_fit(check, kind, k, pair.counts()["graftable"])
    record = region_record(req, pair, region, made, notes, time.time() - start)
    if req.out:
        out = Path(req.out).expanduser()
        if world is None or world.rank == 0:  # several processes learn one region; one writes it
            regions.save(record, out, exclusive=not req.overwrite)
    else:
        out = save_new(record, settings.subdir("regions"), region_stem(req.finetuned, req.task, req.method, record.size),
                       world is None or world.rank == 0)
    if check:  # the quick check is the region's first entry in the regions table (a data-parallel run makes none)
        remember_scores(check["rows"], [out], ["this region"], [record], notes)
    finish(progress)
    return LocalizeResult(req, notes, time.time() - start, str(out), record, check=check)


def size_needed(req: LocalizeRequest, pair: ModelPair, task, k0: int, notes: list[str], progress=None, cancel=None
                ) -> tuple[dict, dict, dict]:
    """``--keep``: the smallest region whose graft keeps ``req.keep`` of what fine-tuning gained on the held-out check's
    examples (``sizing.search``, from the request's budget); returns it, its record fields with the search's curve,
    and its held-out check. Refused in one line where no region up to the whole graftable set keeps that much."""
    kind = kind_of(task)
    graftable = pair.counts()["graftable"]
    made_at, checks = {}, {}
    now: dict = {}  # the region the search is at: its stage's words and its share of the progress bar

    def told(i: int, k: int, inside: int | None) -> None:
        expect = sizing.EXPECTED_POINTS  # the search's share of the bar: all but the last check's 1/(expect + 1)
        start, end = min(i, expect - 1) / (expect + 1), min(i + 1, expect) / (expect + 1)
        where = f" inside k = {inside:,}" if inside else ""
        now.update(start=start, middle=(start + end) / 2, stage=f"size search, region {i + 1} (k = {k:,}{where})")

    def learn(k: int, within):
        said: list[str] = []
        region, made_at[k] = find_region(req, pair, task, k, said, phase_progress(
            progress, now["start"], now["middle"], now["stage"]), cancel, within)
        notes.extend(n for n in said if n not in notes)
        return region

    def share(region, k: int):
        if progress:
            progress({"stage": f"{now['stage']}: held-out check", "fraction": now["middle"]})
        rows = kind.sizing_rows(pair, task, {"this region": region}, n=req.check_n, judging=kind.judging(req),
                                cancel=cancel)
        checks[k] = by = {r["model"]: r for r in rows}
        return kind.share_kept(by["this region"], by[FT_LABEL], by[pair.body_name]), by["this region"][kind.sized_by]

    found = sizing.search(learn, share, k0, graftable, req.keep, told, cancel)
    if found.points[-1].share is None:
        by, key = checks[found.points[-1].k], kind.sized_by
        raise ModelError(f"fine-tuning gained nothing to keep on {by[FT_LABEL]['n']:,} held-out examples: the fine-tuned "
                         f"model's {key} is {by[FT_LABEL][key]:.3g}, the pre-trained one's {by[pair.body_name][key]:.3g}; "
                         "check the fine-tune and the task, or give a fixed --sparsity instead of --keep")
    if found.k is None:
        tried = ", ".join(f"k = {p.k:,} keeps {pct(p.share) if p.share is not None else 'nothing measurable'}"
                          for p in sorted(found.points, key=lambda p: p.k))
        whole = "; the whole graftable set was tried" if found.reached_all else \
            f"; the search stops after {sizing.MAX_POINTS} regions"
        raise ModelError(f"no region keeps {pct(req.keep)} of what fine-tuning gained on "
                         f"{kind.test_count(task, req.check_n):,} held-out examples ({kind.kept_by}): {tried}{whole}; "
                         "give a lower --keep, or check the fine-tune")
    n = checks[found.k][FT_LABEL]["n"]
    made = {**made_at[found.k], "budget": f"keep={req.keep:g}", "sparsity": found.k / graftable,
            "size_search": {**found.record(), "measure": kind.kept_by, "scored_by": kind.sized_by, "n": n}}
    notes.append(f"the size search learned {len(found.points)} regions; k = {found.k:,} is the smallest that keeps "
                 f"{pct(req.keep)} of the gain ({kind.kept_by}) on the {n:,} held-out examples it was chosen on: score "
                 "it on others (evaluate) for a figure the choice did not see")
    check = quick_check(pair, task, {"this region": found.region}, req, req.steps, phase_progress(
        progress, sizing.EXPECTED_POINTS / (sizing.EXPECTED_POINTS + 1), 1.0, "held-out check of the region found"),
        cancel)
    return found.region, made, check


def learning_share(req: LocalizeRequest, kind, learns: bool) -> float:
    """The share of a localization's progress that is mask learning, the rest its held-out check, in proportion to
    their expected passes: a mask step's batch STEP_PASSES times (twice the steps on a nested schedule), each checked
    example once per model (the region, FT and the empty region), ANSWER_PASSES times where the kind generates its
    answers: so the fraction, and the time left it foretells, move at one pace through both."""
    steps = req.steps * req.batch_size * STEP_PASSES * (2 if req.schedule == "nested" else 1) if learns else 0
    check = req.check_n * 3 * (ANSWER_PASSES if kind.generates else 1)
    return steps / (steps + check) if steps + check else 1.0


DID_NOT_FIT = 0.5  # a region keeping less than this share of the fine-tune's gain on held-out examples lost the skill


def did_not_fit(check: dict, kind, k: int, graftable: int) -> list[str]:
    """One sentence when the held-out check says the skill is not in the region: it kept less than half of what
    fine-tuning gained over the empty region (mask learning's own batch may still score high: the relaxed region it
    trained on can be far larger than k). The larger budget it suggests is ten times this one (none past 10 %)."""
    by = {r["model"]: r for r in check["rows"]}
    region, ft = by.get("this region"), by.get(FT_LABEL)
    share = region.get("gain_recovered") if region else None
    if share is None or share >= DID_NOT_FIT:
        return []
    what, budget = kind.words.score, k / max(graftable, 1)
    larger = f"a larger budget such as {100 * 10 * budget:.2g} % (ten times this one), " if budget < 0.1 else ""
    return [f"the skill did not fit in k = {k:,} parameters: the region's held-out {what} is "
            f"{pct(region['accuracy'], 1)} against the fine-tune's {pct(ft['accuracy'], 1)} (n = {check['n']:,}); try "
            f"{larger}the budget-true method (--method budget-true), or a fine-tune with an ℓ1 penalty on the movement "
            "(finetune --optimizer adamw --l1 1e-3)"]


def quick_check(pair: ModelPair, task, models: dict, req, step: int, progress=None, cancel=None) -> dict:
    """A region scored at once on ``req.check_n`` held-out test examples beside FT and the empty region (theirs cached
    per pair): {task, n, step, rows, differences}; each graft's accuracy (a completion task's: its exact match) goes
    to ``progress`` as a ``heldout`` event."""
    kind = kind_of(task)
    part = kind.compare(pair, task, models, n=req.check_n, judging=kind.judging(req), progress=progress, cancel=cancel)
    rows = card.annotate(part["rows"])
    scored = {r["model"]: r for r in rows}
    ft, bare = scored[FT_LABEL], scored[pair.body_name]
    for name in models:
        if progress:
            progress({"stage": f"held-out check of {name}", "heldout": {
                "step": step, "model": name, "accuracy": scored[name]["accuracy"], "ft": ft["accuracy"],
                "bare": bare["accuracy"], "n": scored[name]["n"]}})
    return {"task": part["task"], "task_kind": kind.name, "n": ft["n"], "step": step, "rows": rows,
            "differences": part["differences"], **({"generations": part["generations"]} if part["generations"] else {})}


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
    task_kind: str = "classification"  # the kind its rows are scored by (kinds.KINDS)


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


def changed_task_files(records, labels, groups: dict, tasks: dict) -> list[str]:
    """A note for each region whose task file (recorded when it was learned, by path and sha256) is scored again as it
    reads now, changed: the scores are on the file as it is, not as the region was learned on."""
    out = []
    for key, members in groups.items():
        now = kind_of(tasks[key]).task_files(tasks[key])
        for i in members:
            then = records[i].meta.task_files or {}
            changed = [p for p, digest in then.items() if p in now and now[p] != digest]
            if changed:
                out.append(f"the task file {', '.join(changed)} changed since {labels[i]} was learned on it: it is "
                           "scored on the file as it is now")
    return out


def recorded_task(ref: str, spec, guard: Guard, notes: list[str], paths: list[str]) -> Task:
    """The task a region recorded, read again; where it cannot be (a file moved, or named by a path relative to the
    folder the region was learned in), the line says that ``--task`` names it afresh."""
    try:
        return read_task_as(ref, spec, guard, notes)
    except DataError as err:
        if not Path(ref).suffix or Path(ref).expanduser().exists():  # no file gone missing: the error says it all
            raise
        region = Path(paths[0]).name if paths else "the region"
        raise DataError(f"{err} (the task '{ref}' that {region} recorded, as it was named where it was learned: give "
                        "--task PATH to name it from here)") from err


def regions_setting(req, guard: Guard) -> Grafts:
    """The regions of ``req`` (``GraftsFields``): their base, fine-tuned model and the task each was learned on
    (unless the request names them), every reference checked."""
    records = [load_region(p) for p in req.regions]
    labels = labels_for(req.regions, records)
    merged_shapes(records)
    first = records[0].meta if records else RegionMeta()
    notes: list[str] = same_regions(labels, records)
    notes += [f"region '{label}' is empty (k = 0): its graft is the pre-trained model and knocking it out leaves the "
              "fine-tuned model as it is, so neither shows anything of a skill; learn a larger region"
              for label, record in zip(labels, records) if not record.size]  # said, not refused: the bare body
    # beside FT is still worth a look
    base = req.base or first.base or DEFAULT_BASE
    task_ref = req.task or first.task or DEFAULT_TASK
    spec = req.data_spec() if (req.task or not records) else recorded_columns(first)
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
        key = (req.task, None) if req.task else (record.meta.task or DEFAULT_TASK, recorded_columns(record.meta))
        groups.setdefault(key, []).append(i)
    if not groups:
        groups[(task_ref, None)] = []
    tasks = {key: read_task(req, guard, notes) if key[1] is None and req.task else
             recorded_task(key[0], key[1] or spec, guard, notes, [req.regions[i] for i in groups[key]])
             for key in groups}
    kinds = {kind_of(t).name for t in tasks.values()}
    if len(kinds) > 1:
        raise RegionError(f"the regions were learned on {' and '.join(sorted(kinds))} tasks: evaluate them apart")
    notes += changed_task_files(records, labels, groups, tasks)
    return Grafts(records, labels, first, base, finetuned, from_patch, groups, tasks, notes)


def regions_pair(req, grafts: Grafts, task: Task, guard: Guard, progress=None, cancel=None) -> ModelPair:
    """The pair the regions of ``grafts`` are grafted onto, each region checked against it (``grafts.notes``
    gains what the reader should know: a patch's fine-tuned model rebuilt, another build, the prompt)."""
    records, labels, first, notes = grafts.records, grafts.labels, grafts.first, grafts.notes
    kind = kind_of(task)
    for path, record in zip(req.regions, records):  # before the reading the region recorded meets the request's
        kind.check_region(Path(path).name, record.meta, task)
    options = kind.reading(req.load_options(regions.recorded_options(first) if records else None), task)
    try:
        pair = _regions_pair(req, grafts, task, guard, options, progress, cancel)
    except (ModelError, RegionError, DataError) as err:  # the region read on another model: the pair is the reason
        given = None if grafts.from_patch else grafts.finetuned
        said = next((line for line in (another_model(Path(path).name, record, grafts.base, given)
                                       for path, record in zip(req.regions, records)) if line), None)
        if said is None:
            raise
        raise RegionError(said) from err
    for path, label, record in zip(req.regions, labels, records):
        check_build(record, pair, label, notes)
    return pair


def _regions_pair(req, grafts: Grafts, task: Task, guard: Guard, options, progress, cancel) -> ModelPair:
    """``regions_pair``'s loading: the pair, read as the regions were, and every region checked to fit it."""
    records, labels, first, notes = grafts.records, grafts.labels, grafts.first, grafts.notes
    kind = kind_of(task)
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
        with kind.loading(task):
            pair = pair_for_regions(grafts.base, grafts.finetuned, records, guard, progress, cancel, options)
    else:
        with kind.loading(task):
            pair = get_pair(grafts.base, grafts.finetuned, GraftableSpec(), guard, progress, cancel, options,
                            kind.labels(task))
    notes += prompt_notes(pair)
    kind.check_pair(pair, task)
    for path, record in zip(req.regions, records):
        try:
            regions.check_fits(record, pair)
        except RegionError as err:
            raise RegionError(f"'{path}': {err}") from None
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
    kind = kind_of(task)
    kind.supports("evaluate", task)
    no_ood = kind.ood_note(task)
    if no_ood and req.ood:
        notes.append(f"{no_ood}: evaluate another {kind.name} task as its own --task")
    oods = {key: [] if no_ood else ood_tasks(req, key[0], tasks[key], guard, notes) for key in groups}  # checked
    # before any model loads
    pair = regions_pair(req, grafts, task, guard, progress, cancel)
    graftable = pair.counts()["graftable"]
    kinds = {label: record.meta.method for label, record in zip(labels, records)}
    start_overlap = {label: r.meta.top_movement_overlap for label, r in zip(labels, records)
                     if r.meta.top_movement_overlap is not None}
    baselines: dict[int, dict] = {}  # k -> {label: region}: the same regions on every task they are scored on
    if req.baselines:
        budgets = sorted({r.size for r in records}) or [
            Budget(sparsity=kind.sparsity if req.sparsity is None else req.sparsity).resolve(graftable)]
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
                        if record.size == k and getattr(METHODS.get(record.meta.method), "needs_data", False):
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
        contrasts += [(labels[i], labels[j]) for x, i in enumerate(members) for j in members[x + 1:]
                      if labels[i] != labels[j]]  # region against region: learner against learner, seed against seed
        part = kind.compare(pair, task_g, models, n=req.n, contrasts=contrasts, oods=oods[key],
                            judging=kind.judging(req, records[members[0]].meta if members else None, guard),
                            progress=progress, cancel=cancel)
        notes += [n for n in part["notes"] if n not in notes]  # what the model's context cut
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
                g[ft_name] = g.pop(FT_LABEL)
                for per_model in ("exact", "answer", "contains", "token_f1"):  # each model's judging, by name
                    if FT_LABEL in g.get(per_model, {}):
                        g[per_model][ft_name] = g[per_model].pop(FT_LABEL)
        result["generations"] += [{**g, "task": part["task"]} for g in part.get("generations", ())]
        if "rule" in part:  # how its answers were judged
            result["judging"].append({k: part[k] for k in ("task", "rule", "max_new_tokens")})
        lines += kind.card(part, graftable, ft_name, start_overlap)
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
                          side_by_side=side, replicates=together, task_kind=kind.name)


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
    kind: str = "classification"  # its task's kind (tasks.KINDS): "completion": each text is a prompt, each row a
    # model's generation for it
    answers: list[dict] = field(default_factory=list)  # --by cell: per text, FT's answer, its p under FT and the
    # pre-trained model, the pre-trained model's own answer, and what p measures
    parts: list[dict] = field(default_factory=list)  # --by cell: per (text, layer, module) part of the region, p of
    # FT's answer with that part alone grafted onto θ_pre and with it alone knocked out of θ_ft, and the Δp of each


@verb(PredictRequest, "each model's class probabilities (a completion region: its generation) for texts you give",
      text.predict, figures=lambda doc: {"probe_map": fig.probe_map(doc)} if doc.get("parts") else {})
def predict(req: PredictRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> PredictResult:
    """The bare body, the fine-tuned model and every region's graft on the same sentences, side by side: the
    first look at what a region changes (for a language model, the label words' scores under its prompt; for a
    completion region, each model's greedy generation for each text as a prompt: ``predict_completions``)."""
    req.validate()
    start = time.time()
    grafts = regions_setting(req, guard)
    if (req.knockout or req.by == "cell") and grafts.from_patch:
        raise RequestError(f"{'--knockout' if req.knockout else '--by cell'} takes a region out of the fine-tuned model, which cannot be loaded here (it is "
                           "rebuilt from the patches, so without a region it is the others' graft); give the "
                           "fine-tuned model as --finetuned")
    tasks = list(grafts.tasks.values())
    task = tasks[0]
    kind = kind_of(task)
    kind.supports("predict", task)
    if len({kind.labels(t) for t in tasks}) > 1:
        raise RequestError("the regions were learned on tasks with different labels ("
                           + "; ".join(f"{t.name}: {', '.join(t.label_names)}" for t in tasks)
                           + "); predict with regions of one task at a time")
    kind.check_texts(req, task)
    pair = regions_pair(req, grafts, task, guard, progress, cancel)
    judging = kind.judging(req, grafts.first if grafts.records else None, guard)
    ft_name = f"{FT_LABEL} (from patch)" if grafts.from_patch else FT_LABEL
    looks = _models(pair, grafts, ft_name, req)
    rows, names, lines = kind.predict(pair, task, req, looks, ft_name, judging, grafts.notes,
                                      part_progress(progress, 0, 2, None, "each model") if req.by == "cell" else progress,
                                      cancel)
    answers, parts = (_probe_map(pair, task, kind, req, grafts, rows, ft_name, part_progress(
        progress, 1, 2, None, "each part"), cancel) if req.by == "cell" else ([], []))
    finish(progress)
    return PredictResult(req, grafts.notes, time.time() - start, task.name, names, list(req.texts), rows, grafts.base,
                         None if grafts.from_patch else grafts.finetuned, lines, kind=kind.name, answers=answers,
                         parts=parts)


def _probe_map(pair: ModelPair, task, kind, req: PredictRequest, grafts: Grafts, rows: list[dict], ft_name: str,
               progress, cancel) -> tuple[list[dict], list[dict]]:
    """Causal tracing by part: each (layer, module type) cell of the region grafted alone onto θ_pre (Δp against the
    pre-trained model) and knocked out alone from θ_ft (Δp against FT), p being the probability the kind gives the
    fine-tuned model's answer (``answer_probs``). A part "flips" the answer where it changes it from its baseline's:
    grafted, where θ_pre + γ_P⊙δ answers otherwise than θ_pre; knocked out, otherwise than FT (so a graft map is not
    crossed out wherever the pre-trained model already disagrees with FT)."""
    record = grafts.records[0]
    anat = count_anatomy(record.indices, record.shapes)
    cells = [(row, module, anat.counts[i][j]) for i, row in enumerate(anat.layers)
             for j, module in enumerate(anat.modules) if anat.counts[i][j]]
    if settings.hosted() and len(cells) > settings.MAX_MAP_CELLS:
        raise RequestError(f"the region spans {len(cells)} layer × module parts, over this server's limit of "
                           f"{settings.MAX_MAP_CELLS} for one probe map (--by cell); use --by layer or --by module, "
                           "or run graftui on your own machine")
    insides = [only_part(record.indices, record.shapes, layer=row, module=module)[0] for row, module, _ in cells]
    with contextlib.ExitStack() as held:  # FT is written once for every knockout, not once each (``_Knockouts``)
        knockouts = _Knockouts(pair, held)
        looks = [Look(ft_name, pair.finetuned), Look(pair.body_name, contextlib.nullcontext),
                 *(Look(f"{cell_label(r, m)} grafted", functools.partial(pair.grafted, inside), "graft",
                        cell_label(r, m)) for (r, m, _), inside in zip(cells, insides)),
                 *(Look(f"{FT_LABEL} − {cell_label(r, m)}", functools.partial(knockouts.one, inside),
                        "knockout", cell_label(r, m)) for (r, m, _), inside in zip(cells, insides))]
        said, found = kind.answer_probs(pair, task, req, rows, ft_name, looks, progress, cancel)
    n = len(cells)
    answers = [{"text": i, "answer": s["answer"], "measure": s["measure"], "ft_p": found[0][i][0],
                "pre_p": found[1][i][0], "pre_answer": found[1][i][1]} for i, s in enumerate(said)]
    parts = []
    for c, (row, module, k) in enumerate(cells):
        graft, knock = found[2 + c], found[2 + n + c]
        for i, a in enumerate(answers):
            parts.append({"text": i, "layer": row, "module": module, "part": cell_label(row, module), "k": k,
                          "graft_p": graft[i][0], "graft_delta": graft[i][0] - a["pre_p"],
                          "graft_answer": graft[i][1], "graft_flips": graft[i][1] != a["pre_answer"],
                          "knockout_p": knock[i][0], "knockout_delta": knock[i][0] - a["ft_p"],
                          "knockout_answer": knock[i][1], "knockout_flips": knock[i][1] != a["answer"]})
    return answers, parts


class _Knockouts:
    """θ_ft − γ_P⊙δ as ``pair.knocked_out`` makes it, for parts knocked out one after another: the whole fine-tuned
    model is written at the first and kept until ``held`` closes (which puts the pair back at rest), each part's
    parameters put back to θ_pre for its block and to θ_ft after: O(k) a part instead of two whole-model copies. The
    looks after the first knockout must all be knockouts (a kind reads its looks in order)."""

    def __init__(self, pair: ModelPair, held: contextlib.ExitStack):
        self.pair, self.held, self.started = pair, held, False

    @contextlib.contextmanager
    def one(self, part: dict):
        if not self.started:
            self.held.enter_context(self.pair.finetuned())
            self.started = True
        self.pair.remove(part)
        try:
            yield self.pair.model
        finally:
            self.pair.apply(part)


def _models(pair: ModelPair, grafts: Grafts, ft_name: str, req: PredictRequest) -> list[Look]:
    """Each model predict shows: the bare body, FT, every region's graft; with ``knockout`` FT without each region
    (θ_ft − γ⊙δ); with ``by`` the graft of each layer or module type of the region that holds any of it."""
    models = [Look(pair.body_name, contextlib.nullcontext), Look(ft_name, pair.finetuned)]  # the pair rests as the body
    for label, record in zip(grafts.labels, grafts.records):
        models.append(Look(label, functools.partial(pair.grafted, *_as_args(graft_of(record)))))
    if req.knockout:
        models += [Look(f"{ft_name} − {label}", functools.partial(pair.knocked_out, record.indices), "knockout")
                   for label, record in zip(grafts.labels, grafts.records)]
    if req.by in ("layer", "module"):  # a cell's map is drawn apart (``_probe_map``), not as columns
        label, record = grafts.labels[0], grafts.records[0]
        anat = count_anatomy(record.indices, record.shapes)
        parts = [row for row, n in zip(anat.layers, anat.by_layer) if n] if req.by == "layer" else [
            m for m, n in anat.by_module.items() if n]
        for part in parts:
            named = part_label(req.by, part)
            inside = only_part(record.indices, record.shapes, **{req.by: part},
                               values=record.values if record.is_patch else None)
            models.append(Look(f"{label} · {named} only", functools.partial(pair.grafted, *_as_args(inside)), req.by,
                               named))
    return models


def _as_args(region) -> tuple:
    """A region, or a (region, values) pair, as the arguments of ``ModelPair.grafted``."""
    if isinstance(region, tuple):
        return region if region[1] is not None else region[:1]
    return (region,)


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
    task_kind: str = "classification"  # the kind its rows are scored by (kinds.KINDS)

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["card"] = card.sweep_card(out, kind_named(self.task_kind).words)
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


@verb(SweepRequest, "accuracy against region size for several methods", text.sweep,
      figures=lambda doc: {"sweep": fig.sweep_figure(doc["rows"], doc.get("task", ""))} if doc.get("rows") else {})
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
    task = read_task(req, guard, notes)
    kind = kind_of(task)
    kind.supports("sweep", task)
    options = kind.reading(req.load_options(), task)
    no_ood = kind.ood_note(task)
    if no_ood and req.ood:
        notes.append(no_ood)
    oods = [] if no_ood else ood_tasks(req, req.task, task, guard, notes)
    methods = list(dict.fromkeys(req.methods))
    if any(get_method(m).needs_data for m in methods):
        kind.check_sample(task, req)
    with kind.loading(task):
        pair = get_pair(req.base, req.finetuned, req.graftable_spec(), guard, progress, cancel, options,
                        kind.labels(task))
    kind.check_pair(pair, task)
    notes += prompt_notes(pair)
    check_moved(pair)
    kind.check_context(pair, task, req, notes, req.n)  # before the first mask step: what the context cannot hold
    reference = kind.sweep_reference(pair, task, req, oods, cancel)
    graftable = pair.counts()["graftable"]
    rows, found = [], []
    sparsities = sorted(set(req.sparsities))
    total = len(sparsities) * len(methods)
    for i, s in enumerate(sparsities):
        k = Budget(sparsity=s).resolve(graftable)
        made, kept = {}, {}
        for j, name in enumerate(methods):
            if progress:
                progress({"stage": f"{name} at sparsity {s:g}", "fraction": (i * len(methods) + j) / total})
            one = derive(LocalizeRequest, req, method=name, sparsity=s)
            began = time.time()
            made[name], record = find_region(one, pair, task, k, notes, cancel=cancel)
            if req.keep:  # the region as a file that `graftui run` re-makes, like one from localize
                kept[name] = str(save_new(region_record(one, pair, made[name], record, [], time.time() - began),
                                          Path(req.keep).expanduser(),
                                          region_stem(req.finetuned, req.task, name, region_size(made[name]))))
        budget_rows, budget_found = kind.sweep_rows(reference, pair, task, req, made, kept, s, cancel)
        rows += budget_rows
        found += budget_found
    finish(progress)
    return SweepResult(req, list(dict.fromkeys(notes)), time.time() - start, rows, task=task.name,
                       ood=[o.name for o in oods], differences=found, task_kind=kind.name,
                       **kind.sweep_fields(reference))


# -- pair ---------------------------------------------------------------------------------------
@dataclass
class PairResult(Result):
    pair: dict = field(default_factory=dict)  # ModelPair.describe(): architecture, kind, prompt, labels, counts, hashes
    preview: dict | None = None  # a language model's prompt on the task's first training example (preview_prompt)
    task_preview: list[dict] | None = None  # the task's kind's own check of it (preview_task): a harness task's


def preview_task(req, guard: Guard = LOCAL) -> list[dict] | None:
    """The request's task read as a job reads it (the guard's rules included) and checked by its kind before any job
    (``TaskKind.preview``: a harness task's documents per split and its first scored document as the model reads
    it); None, unread, where its kind checks none on sight (a Hub dataset is not fetched to tell)."""
    kind = named_kind(req.task, req.task_kind, given_fields(req))
    if kind is None or not kind.previewed:
        return None
    task = read_task(req, guard)
    return kind_of(task).preview(task)


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
    options, notes = req.load_options(), []
    # a language model is read as its task's kind reads it (a completion task: as itself, no label words), the task
    # read as localize reads it; a classifier needs no task, and a head the request gives is read as given
    task = read_task(req, guard, notes) if needs_task_labels(req.finetuned, options, guard) else None
    kind = kind_of(task) if task is not None and options.head == "auto" else None
    if kind is not None:
        kind.supports("pair", task)
        options = kind.reading(options, task)
    loaded = get_pair(req.base, req.finetuned, GraftableSpec(), guard, progress, cancel, options,
                      kind_of(task).labels(task) if task is not None else None)
    if kind is not None:
        kind.check_pair(loaded, task)
    preview = preview_prompt(req, guard) if loaded.prompt is not None else None
    finish(progress)
    return PairResult(req, notes + prompt_notes(loaded), time.time() - start, loaded.describe(), preview,
                      kind_of(task).preview(task) or None if task is not None else None)
