"""The paper's experiments as verbs: multi-task regions with skill transfer (§5.1), WiSE curves (Fig. 7),
re-training a region (Table 1) and forget-free continual learning (§5.2).

Same contract as every flow: ``flow(request, progress, cancel, guard) -> result``. The maths (Eq. 5,
re-training inside a region, set differences, the joint loss of purification) is ``experiments``;
WiSE is ``method``; overlap and unions are ``sets``.

The multi-task model is read through one task's head at a time: a multi-task fine-tune writes one
ordinary checkpoint per task (the shared body with that task's head), so "the pre-trained body with
the fine-tuned head" (P_0) and "the multi-task model" (P_1) of Eq. 5 are the two ends of that
task's pair, and a region of any task grafts onto any task's pair (the body is the same).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from .. import card, experiments, figures as fig, metrics, regions, sets, settings, training
from ..tasks.classification import scoring
from ..tasks.grafts import TEST_SAMPLE_SEED
from ..config import (
    DEFAULT_BASE, DEFAULT_MULTITASK, DEFAULT_MULTITASK_TASKS, Budget, GraftableSpec, default_checkpoint_dir,
    is_default_finetuned,
)
from ..tasks.classification.data import DataSpec
from ..errors import Cancelled, ModelError, RegionError, RequestError
from ..experiments import JointLoss
from ..learning import learn_region
from ..method import region_size
from ..models import checkpoint_kind, checkpoint_record, load_classifier
from ..paths import file_lock, new_path, short_ref, slug
from ..requests import (
    ContinualRequest, FinetuneRequest, LocalizeRequest, MultitaskRequest, RetrainRequest, WiseRequest, derive,
)
from . import text
from ..kinds import examples_per_class, kshot_batches, read_for
from .common import (
    LOCAL, Guard, Progress, Result, check_build, check_model_ref, finish, get_pair, latest_region, load_region, ood_tasks, pair_for_regions, save_new, part_progress,
)
from .registry import verb
from .replicates import each_seed, replicated
from .single import finetune as run_finetune, localize as run_localize


# -- multi-task ------------------------------------------------------------------------------------
@dataclass
class MultitaskResult(Result):
    checkpoint: str = ""
    tasks: list[str] = field(default_factory=list)
    k: int = 0
    regions: dict[str, str] = field(default_factory=dict)  # task -> region file
    sizes: list[int] = field(default_factory=list)
    overlap: list[list[float]] = field(default_factory=list)  # [i][j] = |γ_i ∩ γ_j| / |γ_j|
    intersection_counts: list[list[int]] = field(default_factory=list)
    p_zero: list[float] = field(default_factory=list)  # pre-trained body + task head, per task
    p_one: list[float] = field(default_factory=list)  # the multi-task model, per task
    scores: list[list[float]] = field(default_factory=list)  # [i][j] = accuracy of γ_i's graft on task j
    relative_gain: list[list[float]] = field(default_factory=list)  # Eq. 5 of scores
    union: dict = field(default_factory=dict)
    purified: dict = field(default_factory=dict)
    # ECE beside each accuracy above: {"p_zero": [..], "p_one": [..], "scores": [[..]], "union": [..], "purified": [..]}
    ece: dict = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)  # with --seeds: every figure above is the mean over these
    per_seed: list[dict] = field(default_factory=list)  # with --seeds: each seed's own figures and region files
    spread: dict = field(default_factory=dict)  # with --seeds: the standard deviation across seeds of each figure

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["card"] = card.multitask_card(out) + card.seeds_sentence(self.seeds, "mask seeds")
        return out


MULTITASK_FIGURES = ("sizes", "overlap", "intersection_counts", "p_zero", "p_one", "scores", "relative_gain", "union",
                     "purified", "ece")  # what a replicate run averages over seeds


def multitask_checkpoint(base: str, tasks: list[str], recipe=None) -> Path:
    """Cache folder of the multi-task fine-tune of ``base`` on ``tasks`` with ``recipe`` (default: the default recipe)."""
    key = "multitask-" + slug(short_ref(base)) + "-" + "-".join(slug(t) for t in tasks)
    if base == DEFAULT_BASE and tuple(tasks) == DEFAULT_MULTITASK_TASKS:
        key = DEFAULT_MULTITASK
    return default_checkpoint_dir(key, recipe)


def _ensure_checkpoint(req: MultitaskRequest, tasks, guard: Guard, progress, cancel) -> Path:
    if req.checkpoint:
        folder = Path(req.checkpoint).expanduser()
        guard.allow_local(models=[str(folder)])
    else:
        folder = multitask_checkpoint(req.base, req.tasks, req.recipe())

        def step(p):
            if progress:
                progress({"stage": f"multi-task fine-tuning of {short_ref(req.base)} (first use; batch of {p.task})",
                          "fraction": 0.4 * p.step / max(p.steps, 1)})

        with file_lock(folder):  # another run building it: wait, then reuse it
            if not (folder / "graftui_record.json").exists():
                training.finetune_multitask(req.base, tasks, req.recipe(), folder, progress=step, cancel=cancel,
                                            allow_local=guard.allow_local(models=[req.base]),
                                            request={**req.as_dict(), "checkpoint": None})
    missing = [t.name for t in tasks if not (folder / slug(t.name) / "config.json").exists()]
    if missing:
        raise ModelError(f"'{folder}' has no checkpoint for task '{missing[0]}' (expected the sub-folder "
                         f"'{slug(missing[0])}' that a multi-task fine-tune writes)")
    made_from = (checkpoint_record(folder) or {}).get("base")
    if made_from and made_from != req.base and Path(made_from).expanduser().resolve() != Path(req.base).expanduser().resolve():
        raise RequestError(f"'{folder}' was fine-tuned from '{made_from}', not '{req.base}'; give --base {made_from}")
    return folder


def refuse_language_model(ref: str, what: str, guard: Guard) -> None:
    """Experiments that train one classification head per task take sequence classifiers only (for now)."""
    if is_default_finetuned(ref):
        return
    kind = checkpoint_kind(ref, allow_local=guard.allow_local(models=[ref]))
    if kind != "classifier":
        raise ModelError(f"{what} trains a classification head per task, and '{ref}' is a {kind.replace('-', ' ')}: "
                         "use a sequence classifier or an encoder base (prompt-based training works in finetune, "
                         "localize, evaluate, sweep and export)")


@verb(MultitaskRequest, "regions of a multi-task model: overlap, skill transfer (Eq. 5), union, purification",
      text.multitask, figures=lambda doc: {"gain": fig.gain_heatmap(doc)} if doc.get("tasks") else {})
def multitask(req: MultitaskRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> MultitaskResult:
    """Regions of every task of one multi-task model, their overlap, Eq. 5, the union and its purification. With
    ``req.seeds`` once per mask seed (one multi-task model), every figure the mean over seeds, each seed's kept."""
    req.validate()
    if req.seeds:
        runs = each_seed(multitask, req, progress, cancel, guard, out_folders=True)
        return replicated(runs, req, MULTITASK_FIGURES, kept=("regions",))
    start = time.time()
    check_model_ref(req.base)
    refuse_language_model(req.base, "the multi-task experiment", guard)
    notes: list[str] = []
    tasks = [read_for(req.verb, t, DataSpec(), guard, notes) for t in req.tasks]
    for t in tasks:
        examples_per_class(req, t, [])  # a bad k-shot size fails before any model is loaded
    folder = _ensure_checkpoint(req, tasks, guard, progress, cancel)
    refs = [str(folder / slug(t.name)) for t in tasks]
    n = len(tasks)
    out_dir = Path(req.out).expanduser() if req.out else settings.subdir("regions")
    out_dir.mkdir(parents=True, exist_ok=True)
    config = req.learn_config()

    def stage(what: str, fraction: float, **extra) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("multi-task experiment cancelled")
        if progress:
            progress({"stage": what, "fraction": 0.4 + 0.6 * fraction, **extra})

    # Regions hold shared body parameters only, so that each one grafts onto every task's pair
    # (a head is task-specific, and a base checkpoint may come with a head of its own).
    first = get_pair(req.base, refs[0], GraftableSpec(), guard, progress, cancel)
    prefix = first.model.base_model_prefix + "."
    spec = GraftableSpec(names=tuple(name for name in first.graftable if name.startswith(prefix)))

    # 1. each task's region, with its own loss and head (App. C.2)
    found, paths, k = {}, {}, 0
    for i, (name, task, ref) in enumerate(zip(req.tasks, tasks, refs)):
        stage(f"region of '{name}' ({i + 1}/{n})", i / (n + 3))
        pair = get_pair(req.base, ref, spec, guard, progress, cancel)
        scoring.check_labels(pair, task)
        k = Budget(sparsity=req.sparsity).resolve(pair.counts()["graftable"])
        begin = {} if req.start == "empty" else None
        params = {p: pair.param(p) for p in pair.graftable}
        on_step = (lambda r, name=name, i=i: progress({
            "stage": f"region of '{name}': mask step {r.step}/{r.steps}", "k": k, **asdict(r),
            "fraction": 0.4 + 0.6 * (i + r.step / r.steps) / (n + 3)})) if progress else None
        make_batches, _ = kshot_batches(pair, task, req, notes if i == 0 else [])
        region, _ = learn_region(pair.model, params, pair.pre, pair.ft, k, make_batches,
                                 config, on_step, cancel, start=begin)
        found[name] = region
        record = regions.make_record(pair, region, {
            "method": "learned", "task": name, "budget": f"sparsity={req.sparsity:g}", "budget_k": k, "sparsity": req.sparsity,
            "start": req.start, "multitask_checkpoint": str(folder), "learn": config.as_dict(), "request": req.as_dict(),
            "graftable_spec": spec.as_dict(),
        })
        paths[name] = str(save_new(regions.with_patch(pair, record), out_dir, f"multitask-{slug(name)}-k{k}"))

    # 2. the union of the group, and its purification on the group's joint loss
    group = req.group or list(req.tasks)
    union = sets.union(*(found[g] for g in group))
    purified = None
    if req.purify_steps:
        stage(f"purifying the union of {', '.join(group)} ({req.purify_steps} steps on the joint loss)", n / (n + 3))
        lead = req.tasks.index(group[0])
        pair = get_pair(req.base, refs[lead], spec, guard, progress, cancel)
        body = pair.model.base_model_prefix
        heads = []
        for g in group:
            idx = req.tasks.index(g)
            if idx == lead:
                heads.append(pair.model)
                continue
            other, _ = load_classifier(refs[idx], allow_local=guard.allow_local(models=[refs[idx]]))
            setattr(other, body, getattr(pair.model, body))  # the head of task g on the working body
            heads.append(other.to(pair.device).eval())
        joint = JointLoss(heads)
        makers = [kshot_batches(pair, tasks[req.tasks.index(g)], req, [], seed_offset=j)[0] for j, g in enumerate(group)]

        def joint_batches(epoch: int):
            for parts in zip(*(make(epoch) for make in makers)):
                yield {f"{j}:{key}": v for j, part in enumerate(parts) for key, v in part.items()}

        params = {p: pair.param(p) for p in pair.graftable}
        cfg = replace(config, steps=req.purify_steps)
        on_step = (lambda r: progress({"stage": f"purifying: mask step {r.step}/{r.steps}", **asdict(r),
                                       "fraction": 0.4 + 0.6 * (n + r.step / r.steps) / (n + 3)})) if progress else None
        purified, _ = learn_region(joint, params, pair.pre, pair.ft, region_size(union), joint_batches, cfg, on_step, cancel,
                                   start=union)
        record = regions.make_record(pair, purified, {
            "method": "purified union", "task": "+".join(group), "budget_k": region_size(union), "group": group,
            "multitask_checkpoint": str(folder), "learn": cfg.as_dict(), "request": req.as_dict(),
            "graftable_spec": spec.as_dict(),
        })
        paths["purified"] = str(save_new(regions.with_patch(pair, record), out_dir,
                                         f"multitask-purified-{'-'.join(slug(g) for g in group)}"))

    # 3. every region, the union and the purified union on every task (Eq. 5)
    p_zero, p_one, scores = [0.0] * n, [0.0] * n, [[0.0] * n for _ in range(n)]
    union_acc, purified_acc = [0.0] * n, [0.0] * n
    ece = {"p_zero": [0.0] * n, "p_one": [0.0] * n, "scores": [[0.0] * n for _ in range(n)], "union": [0.0] * n,
           "purified": [0.0] * n if purified is not None else []}
    for j, (task, ref) in enumerate(zip(tasks, refs)):
        stage(f"scoring every region on '{req.tasks[j]}'", (n + 1 + j / n * 2) / (n + 3))
        pair = get_pair(req.base, ref, spec, guard, progress, cancel)

        def acc(where: list, at: int = j) -> float:
            """The accuracy of the working model on task j; its ECE goes to ``where[at]``."""
            m = metrics.metrics(*scoring.predict(pair, task, "test", req.n, seed=TEST_SAMPLE_SEED))
            where[at] = m.ece
            return m.accuracy

        p_zero[j] = acc(ece["p_zero"])
        with pair.finetuned():
            p_one[j] = acc(ece["p_one"])
        for i, name in enumerate(req.tasks):
            with pair.grafted(found[name]):
                scores[i][j] = acc(ece["scores"][i])
        with pair.grafted(union):
            union_acc[j] = acc(ece["union"])
        if purified is not None:
            with pair.grafted(purified):
                purified_acc[j] = acc(ece["purified"])
    matrix = sets.overlap_matrix({name: found[name] for name in req.tasks})
    gain = experiments.gain_matrix(scores, p_zero, p_one)
    if any(p1 <= p0 for p0, p1 in zip(p_zero, p_one)):
        notes.append("on some task the multi-task model is no better than its pre-trained body with the same head, so "
                     "Eq. 5 has no gain to share there (shown as '-') or flips its sign")
    finish(progress)
    return MultitaskResult(
        req, notes, time.time() - start, checkpoint=str(folder), tasks=list(req.tasks), k=k, regions=paths,
        sizes=matrix["sizes"], overlap=matrix["overlap"], intersection_counts=matrix["intersection_counts"],
        p_zero=p_zero, p_one=p_one, scores=scores, relative_gain=gain,
        union={"group": group, "size": region_size(union), "accuracy": union_acc,
               "relative_gain": [experiments.relative_gain(a, p0, p1) for a, p0, p1 in zip(union_acc, p_zero, p_one)]},
        purified={} if purified is None else {
            "group": group, "steps": req.purify_steps, "size": region_size(purified),
            "kept_from_union": sets._intersection_count(purified, union), "accuracy": purified_acc,
            "relative_gain": [experiments.relative_gain(a, p0, p1) for a, p0, p1 in zip(purified_acc, p_zero, p_one)]},
        ece=ece,
    )


# -- WiSE --------------------------------------------------------------------------------------------
@dataclass
class WiseResult(Result):
    region: str = ""
    k: int = 0
    base: str = ""
    finetuned: str = ""
    task: str = ""
    ood: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # curve, alpha, task, distribution, n, accuracy, ece
    differences: list[dict] = field(default_factory=list)  # paired, per α and task: WiSE-graft − WiSE-FT
    replicates: list[str] = field(default_factory=list)  # with --replicates: rows and differences are means over
    per_region: list[dict] = field(default_factory=list)  # the regions: each one's own rows and differences

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["card"] = card.wise_card(out) + card.seeds_sentence(
            [e["seed"] for e in self.per_region], "the regions of mask seeds")
        return out


@verb(WiseRequest, "WiSE-FT and WiSE-graft curves along α, in and out of distribution", text.wise,
      figures=lambda doc: {"wise": fig.wise_curves(doc["rows"])} if doc.get("rows") else {})
def wise(req: WiseRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> WiseResult:
    """Accuracy and ECE of θ_pre + α·δ (WiSE-FT) and θ_pre + α·γ⊙δ (WiSE-graft) along α. With ``req.replicates``
    (the region from other mask seeds) once per region, every figure the mean over them, each region's kept."""
    req.validate()
    if req.replicates:
        paths = [req.region or str(latest_region()), *req.replicates]
        seeds = [(load_region(p).meta.request or {}).get("seed", i) for i, p in enumerate(paths)]
        runs = [wise(req.replace(region=p, replicates=None), part_progress(progress, i, len(paths), seed), cancel, guard)
                for i, (p, seed) in enumerate(zip(paths, seeds))]
        if len({(r.base, r.finetuned, r.task) for r in runs}) > 1:
            raise RegionError("--replicates: every region must come from the same fine-tuned model and task as --region")
        finish(progress)
        return replace(runs[0], request=req, seconds=sum(r.seconds for r in runs), replicates=paths,
                       notes=list(dict.fromkeys(n for r in runs for n in r.notes)),
                       rows=metrics.over_seeds([r.rows for r in runs], ("curve", "alpha", "task", "distribution")),
                       differences=metrics.differences_over_seeds([r.differences for r in runs]),
                       per_region=[{"region": p, "seed": seed, "k": r.k, "rows": r.rows, "differences": r.differences}
                                   for p, seed, r in zip(paths, seeds, runs)])
    start = time.time()
    path, record, base, finetuned, task, oods, pair, notes = _region_setting(req, guard, progress, cancel)
    alphas = sorted(set(float(a) for a in req.alphas))
    curves = (("WiSE-FT", None), ("WiSE-graft", record.indices))
    total, done, rows, predictions = len(alphas) * len(curves) * (1 + len(oods)), 0, [], {}
    for curve, region in curves:
        for alpha in alphas:
            with pair.interpolated(alpha, region):
                for t in (task, *oods):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled("WiSE curves cancelled")
                    if progress:
                        progress({"stage": f"{curve} α = {alpha:g} on {t.name}", "fraction": done / total})
                    probs, labels = scoring.predict(pair, t, "test", req.n, seed=TEST_SAMPLE_SEED)
                    predictions.setdefault((alpha, t.name), ({}, labels))[0][curve] = probs
                    m = metrics.metrics(probs, labels)
                    rows.append({"curve": curve, "alpha": alpha, "task": t.name, "distribution": "in" if t is task else "OOD",
                                 "n": m.n, "accuracy": m.accuracy, "ece": m.ece})
                    done += 1
    found = []  # the two curves at each α, on the same examples
    for (alpha, name), (probs, labels) in predictions.items():
        pairs = [("WiSE-graft", "WiSE-FT", metric) for metric in metrics.PAIRED_METRICS]
        found += [{**d, "alpha": alpha} for d in scoring.differences(probs, labels, pairs, name,
                                                                     "in" if name == task.name else "OOD")]
    finish(progress)
    return WiseResult(req, notes, time.time() - start, region=path, k=record.size, base=base, finetuned=finetuned,
                      task=task.name, ood=[o.name for o in oods], rows=rows, differences=found)


# -- graft re-training (Table 1) ------------------------------------------------------------------------
RETRAINED, BITFIT = "re-trained graft", "BitFit (biases)"


@dataclass
class RetrainResult(Result):
    region: str = ""
    base: str = ""
    finetuned: str = ""
    recipe: dict = field(default_factory=dict)
    trained: dict = field(default_factory=dict)  # model -> number of trained parameters
    rows: list[dict] = field(default_factory=list)
    reliability: dict = field(default_factory=dict)
    histogram: dict = field(default_factory=dict)
    task: str = ""
    ood: list[str] = field(default_factory=list)
    differences: list[dict] = field(default_factory=list)  # paired: each model − FT, − bare body; trained − graft
    disagreements: list[dict] = field(default_factory=list)  # test examples where a model decides unlike FT
    seeds: list[int] = field(default_factory=list)  # with --seeds: rows and differences are means over these
    per_seed: list[dict] = field(default_factory=list)  # with --seeds: each seed's rows and differences

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["card"] = card.retrain_card(out)
        if self.seeds:
            out["card"].append(f"Each figure is the mean over training seeds {', '.join(map(str, self.seeds))} (every "
                               "seed is scored on the same test examples); each seed's own numbers are under per_seed.")
        return out


def _region_setting(req, guard: Guard, progress, cancel):
    """The region, its pair and tasks: what WiSE and re-training share (defaults are the region's own)."""
    path = req.region or str(latest_region())
    record = load_region(path)
    meta = record.meta
    base = req.base or meta.base or DEFAULT_BASE
    finetuned = req.finetuned or meta.finetuned
    if not finetuned:
        raise ModelError("the region names no fine-tuned model; give --finetuned REF")
    check_model_ref(base)
    check_model_ref(finetuned)
    task_ref = req.task or meta.task
    if not task_ref:
        raise RegionError("the region names no task; give --task")
    notes: list[str] = []
    task = read_for(req.verb, task_ref, req.data_spec(), guard, notes)
    oods = ood_tasks(req, task_ref, task, guard, notes)
    pair = pair_for_regions(base, finetuned, [record], guard, progress, cancel)
    try:
        regions.check_fits(record, pair)
    except RegionError as err:
        raise RegionError(f"'{path}': {err}") from None
    check_build(record, pair, Path(path).name, notes, patch_values=False)
    scoring.check_labels(pair, task)
    return str(path), record, base, finetuned, task, oods, pair, notes


@verb(RetrainRequest, "train only the region from θ_pre (and BitFit), against FT and the graft", text.retrain)
def retrain(req: RetrainRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> RetrainResult:
    """From θ_pre, train only γ (and, for BitFit, only the biases); score them beside FT and the graft. With
    ``req.seeds`` once per training seed, every figure the mean over seeds with each seed's kept."""
    req.validate()
    if req.seeds:
        runs = each_seed(retrain, req, progress, cancel, guard)
        return replace(runs[0], request=req, seconds=sum(r.seconds for r in runs),
                       rows=metrics.over_seeds([r.rows for r in runs], ("model", "task", "distribution")),
                       differences=metrics.differences_over_seeds([r.differences for r in runs]),
                       seeds=list(req.seeds),
                       per_seed=[{"seed": s, "rows": r.rows, "differences": r.differences}
                                 for s, r in zip(req.seeds, runs)])
    start = time.time()
    path, record, base, finetuned, task, oods, pair, notes = _region_setting(req, guard, progress, cancel)
    recipe = req.recipe(seed=req.seed)
    make_batches, steps, _ = training.recipe_batches(pair.tokenizer, task, recipe)
    jobs = [(RETRAINED, record.indices)]
    if not req.no_bitfit:
        biases = {n: torch.arange(pair.param(n).numel()) for n in pair.graftable if n.endswith("bias")}
        if biases:
            jobs.append((BITFIT, biases))
        else:
            notes.append("the model has no graftable biases, so there is no BitFit baseline")
    models, trained = {"graft": record.indices}, {"graft": record.size}
    params = {n: pair.param(n) for n in pair.graftable}
    for j, (label, region) in enumerate(jobs):
        def step(i, loss, label=label, j=j):
            if progress:
                progress({"stage": f"training the {label}: step {i}/{steps}", "step": i, "steps": steps, "loss": loss,
                          "fraction": 0.7 * (j + i / steps) / len(jobs)})

        torch.manual_seed(recipe.seed)
        values = experiments.retrain_inside(pair.model, params, pair.pre, region, make_batches, recipe, step, cancel)
        models[label] = (region, values)
        trained[label] = region_size(region)
    comparison = scoring.compare(pair, task, models, ood=oods, n=req.n, seed=TEST_SAMPLE_SEED, cancel=cancel,
                                 contrasts=[(label, "graft") for label, _ in jobs],
                                 progress=(lambda d: progress({**d, "fraction": 0.7 + 0.3 * d.get("fraction", 0)}))
                                 if progress else None)
    finish(progress)
    return RetrainResult(req, notes, time.time() - start, region=path, base=base, finetuned=finetuned,
                         recipe=recipe.as_dict(), trained=trained, **comparison.as_dict())


# -- forget-free continual learning (§5.2) -------------------------------------------------------------
@dataclass
class ContinualResult(Result):
    tasks: list[str] = field(default_factory=list)
    checkpoints: dict[str, str] = field(default_factory=dict)  # task -> its independent fine-tune
    regions: dict[str, str] = field(default_factory=dict)  # task -> its region file
    finetuned_accuracy: list[float] = field(default_factory=list)  # each independent fine-tune on its own task
    trained: dict = field(default_factory=dict)  # arm -> parameters trained at each stage
    # [stage i][task j] = accuracy on t_j after learning t_1 … t_i (None for j > i)
    forget_free: list[list[float | None]] = field(default_factory=list)
    sequential: list[list[float | None]] = field(default_factory=list)
    forgetting: dict = field(default_factory=dict)  # arm -> [accuracy after its own stage − after the last], per task
    # paired on each task's test examples: forget-free − sequential after every stage; each arm's forgetting
    differences: list[dict] = field(default_factory=list)
    ece: dict = field(default_factory=dict)  # arm -> [stage i][task j] ECE beside each accuracy (None for j > i)
    seeds: list[int] = field(default_factory=list)  # with --seeds: every figure above is the mean over these
    per_seed: list[dict] = field(default_factory=list)  # with --seeds: each seed's own figures and region files
    spread: dict = field(default_factory=dict)  # with --seeds: the standard deviation across seeds of each figure

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["card"] = card.continual_card(out) + card.seeds_sentence(self.seeds, "mask seeds")
        return out


CONTINUAL_FIGURES = ("finetuned_accuracy", "trained", "forget_free", "sequential", "forgetting", "ece")


def _merge(patch: tuple[dict, dict], indices: dict, values: dict) -> tuple[dict, dict]:
    """(indices, values) with more coordinates written in (they must be new to the patch)."""
    idx, val = dict(patch[0]), dict(patch[1])
    for name, i in indices.items():
        if name in idx:
            order = torch.argsort(torch.cat([idx[name], i]))
            idx[name] = torch.cat([idx[name], i])[order]
            val[name] = torch.cat([val[name], values[name]])[order]
        else:
            idx[name], val[name] = i, values[name]
    return idx, val


def _values_at(patch: tuple[dict, dict], indices: dict) -> dict:
    """The patch's values at ``indices`` (sorted, and all held by the patch)."""
    return {name: patch[1][name][sets._isin(patch[0][name], idx)] for name, idx in indices.items()}


def _written(pre: dict, patch: tuple[dict, dict]) -> dict:
    """θ_pre with a patch's values written in (tensors not in the patch are θ_pre itself)."""
    out = dict(pre)
    for name, idx in patch[0].items():
        out[name] = pre[name].clone()
        out[name].view(-1)[idx.to(pre[name].device)] = patch[1][name].to(pre[name].device)
    return out


@verb(ContinualRequest, "forget-free continual learning with regions, against sequential fine-tuning", text.continual,
      figures=lambda doc: {"continual": fig.continual_curves(doc)} if doc.get("tasks") else {})
def continual(req: ContinualRequest, progress: Progress | None = None, cancel=None,
              guard: Guard = LOCAL) -> ContinualResult:
    """Learn t_1 … t_n one after another in two ways and score every earlier task after each stage.

    Both arms use the same recipe, data and heads (each task's head from its independent fine-tune,
    held fixed) and differ only in what they may train: forget-free trains γ_{t_n} \\ ∪_{i<n} γ_{t_i}
    and infers t_i with ∪_{j≤i} γ_{t_j}; naive sequential trains the whole body (not the embeddings).
    With ``req.seeds`` once per mask seed, every figure the mean over seeds, each seed's kept.
    """
    req.validate()
    if req.seeds:
        runs = each_seed(continual, req, progress, cancel, guard, out_folders=True)
        return replicated(runs, req, CONTINUAL_FIGURES, kept=("regions",))
    start = time.time()
    check_model_ref(req.base)
    refuse_language_model(req.base, "the continual-learning experiment", guard)
    notes: list[str] = []
    tasks = [read_for(req.verb, t, DataSpec(), guard, notes) for t in req.tasks]
    n = len(tasks)
    out_dir = Path(req.out).expanduser() if req.out else settings.subdir("regions")
    out_dir.mkdir(parents=True, exist_ok=True)
    done = [0]
    total = 2 * n + 2 * n  # fine-tunes and regions, then the stages of both arms

    def stage(what: str, **extra) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("continual learning cancelled")
        if progress:
            progress({"stage": what, "fraction": done[0] / total, **extra})

    # 1. each task's independent fine-tune (cached per recipe) and its region
    recipe = req.recipe()
    checkpoints, paths, gammas, ft_acc = {}, {}, [], []
    for name in req.tasks:
        stage(f"independent fine-tune on '{name}' (reused when built before)")
        ft = run_finetune(FinetuneRequest.make(base=req.base, task=name, lr=recipe.lr, epochs=recipe.epochs,
                                               train_examples=recipe.train_examples or 0, test_examples=req.n),
                          cancel=cancel, guard=guard)
        checkpoints[name], done[0] = ft.out, done[0] + 1
        ft_acc.append(ft.test_accuracy)
        stage(f"region of '{name}'")
        loc = run_localize(derive(LocalizeRequest, req, base=req.base, finetuned=ft.out, task=name, sparsity=req.sparsity,
                                  out=str(new_path(out_dir, f"continual-{slug(name)}", ".safetensors"))),
                           cancel=cancel, guard=guard)
        paths[name], done[0] = loc.path, done[0] + 1
        gammas.append(loc.region)
    spec = GraftableSpec(names=tuple(loc.record.shapes))  # the tensors every region was learned over

    def pair_of(i: int):
        return get_pair(req.base, checkpoints[req.tasks[i]], spec, guard, progress, cancel)

    def train_stage(i: int, region: dict, begin: dict, arm: str) -> dict:
        pair = pair_of(i)
        make_batches, steps, _ = training.recipe_batches(pair.tokenizer, tasks[i], recipe)
        on_step = (lambda s, loss: stage(f"{arm}: learning '{req.tasks[i]}' (stage {i + 1}/{n}), step {s}/{steps}",
                                         step=s, steps=steps, loss=loss))
        params = {p: pair.param(p) for p in pair.graftable}
        everything = {p: torch.arange(pair.param(p).numel()) for p in pair.graftable}
        with pair.grafted(everything, {p: begin[p].reshape(-1) for p in pair.graftable}):
            torch.manual_seed(recipe.seed)
            return experiments.retrain_inside(pair.model, params, begin, region, make_batches, recipe, on_step, cancel)

    predictions: dict[tuple[str, int, int], torch.Tensor] = {}  # (arm, stage, task) -> test predictions
    labels: dict[int, torch.Tensor] = {}

    def score(arm: str, i: int, j: int, indices: dict, values: dict) -> float:
        pair = pair_of(j)
        with pair.grafted(indices, values):
            predictions[(arm, i, j)], labels[j] = scoring.predict(pair, tasks[j], "test", req.n,
                                                                      seed=TEST_SAMPLE_SEED)
        return metrics.accuracy(predictions[(arm, i, j)], labels[j])

    # 2. forget-free: stage i trains only its new part; task j is inferred with the patch of stage j
    pre = pair_of(0).pre
    patch: tuple[dict, dict] = ({}, {})
    patches, forget_free, trained_ff = [], [[None] * n for _ in range(n)], []
    for i in range(n):
        new = experiments.new_part(gammas[i], gammas[:i])
        trained_ff.append(region_size(new))
        if new:
            patch = _merge(patch, new, train_stage(i, new, _written(pre, patch), "forget-free"))
        else:
            notes.append(f"the region of '{req.tasks[i]}' lies inside the earlier ones: stage {i + 1} trains nothing")
        patches.append(patch)
        for j in range(i + 1):  # task j with ∪_{l≤j} γ_l, its values read from the current patch
            stage(f"forget-free: scoring '{req.tasks[j]}' after stage {i + 1}")
            forget_free[i][j] = score("forget-free", i, j, patches[j][0], _values_at(patch, patches[j][0]))
        done[0] += 1

    # 3. naive sequential fine-tuning of the whole body, the same recipe and heads
    body = {name: pre[name] for name in spec.names}
    everything = {name: torch.arange(pre[name].numel()) for name in spec.names}
    sequential = [[None] * n for _ in range(n)]
    for i in range(n):
        values = train_stage(i, everything, body, "sequential")
        body = {name: values[name].view(pre[name].shape) for name in spec.names}
        for j in range(i + 1):
            stage(f"sequential: scoring '{req.tasks[j]}' after stage {i + 1}")
            sequential[i][j] = score("sequential", i, j, everything,
                                     {name: body[name].reshape(-1) for name in spec.names})
        done[0] += 1
    finish(progress)
    forgetting = {arm: [table[j][j] - table[n - 1][j] for j in range(n)]
                  for arm, table in (("forget-free", forget_free), ("sequential", sequential))}
    ece = {arm: [[None] * n for _ in range(n)] for arm in ("forget-free", "sequential")}
    for (arm, i, j), probs in predictions.items():
        ece[arm][i][j] = metrics.metrics(probs, labels[j]).ece
    found = []
    for (arm, i, j), probs in predictions.items():
        name = req.tasks[j]
        if arm == "forget-free":  # the two arms after the same stage
            found += [{**d, "stage": i + 1} for d in scoring.differences(
                {f"forget-free after {req.tasks[i]}": probs,
                 f"sequential after {req.tasks[i]}": predictions[("sequential", i, j)]}, labels[j],
                [(f"forget-free after {req.tasks[i]}", f"sequential after {req.tasks[i]}", "accuracy")], name,
                seed=req.seed)]
        if i == n - 1 and j < n - 1:  # forgetting: after its own stage − after the last
            own, last = f"{arm} after {name}", f"{arm} after {req.tasks[-1]}"
            found += [{**d, "forgetting": arm} for d in scoring.differences(
                {own: predictions[(arm, j, j)], last: probs}, labels[j], [(own, last, "accuracy")], name,
                seed=req.seed)]
    return ContinualResult(req, notes, time.time() - start, tasks=list(req.tasks), checkpoints=checkpoints, regions=paths,
                           finetuned_accuracy=ft_acc,
                           trained={"forget-free": trained_ff, "sequential": [sum(t.numel() for t in everything.values())] * n},
                           forget_free=forget_free, sequential=sequential, forgetting=forgetting,
                           differences=found, ece=ece)

