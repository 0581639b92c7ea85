"""Verbs on region files: what a region holds and where (anatomy), unions of regions (compose), and a
grafted checkpoint written from one (export)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import card, figures as fig, regions, sets, settings
from ..tasks.classification import scoring
from ..tasks.grafts import TEST_SAMPLE_SEED
from ..config import DEFAULT_BASE, DEFAULT_TASK
from ..errors import Cancelled, ModelError, RegionError, RequestError
from ..experiments import MERGES, best_lambda, drop_part, row_of
from ..layout import MODULE_LABELS, Anatomy, anatomy as count_anatomy, param_role, part_label
from ..metrics import distinguishable
from ..models import architecture, checkpoint_kind, load_classifier, load_lm
from ..paths import new_path, short_ref
from ..regions import RegionRecord
from ..requests import AnatomyRequest, ComposeRequest, EvaluateRequest, ExportRequest, RegionsRequest
from ..kinds import kind_named, kind_of, read_task_as, recorded_columns, region_kind
from . import text
from .common import (
    LOCAL, Guard, Progress, Result, check_build, check_model_ref, finish, get_task, labels_for, latest_region,
    load_region, loadable, merged_shapes, pair_for_regions, plain, same_regions,
)
from .registry import verb
from .replicates import replicate_groups
from .single import regions_pair, regions_setting


# -- anatomy -------------------------------------------------------------------------------------
TOP = 10  # tensors and neurons listed
CONV1D_LEAVES = ("c_attn", "c_fc", "c_proj")  # GPT-2's Conv1D: weight (in × out), an output unit is a column


@dataclass
class AnatomyResult(Result):
    path: str = ""
    record: RegionRecord | None = None
    anatomy: Anatomy | None = None
    tensors: list[dict] = field(default_factory=list)  # the tensors holding most of the region (top_tensors)
    neurons: list[dict] = field(default_factory=list)  # the output units holding most of the region (top_neurons)
    stability: dict | None = None  # with --replicate: per module type and layer across the seeds (sets.stability_by_part)
    ablation: dict | None = None  # with --ablate: the graft without each layer's and module type's part (ablate)

    def _private(self) -> set[str]:
        return {"record", "anatomy"}

    def as_dict(self) -> dict:
        out = super().as_dict()
        a, r = self.anatomy, self.record
        out.update({
            "kind": r.kind, "k": r.size, "graftable_params": r.graftable,
            "fraction_of_graftable": r.size / max(r.graftable, 1), "by": self.request.by,
            "weights": {"count": a.weight_count, "total": a.weight_total},
            "biases": {"count": a.bias_count, "total": a.bias_total},
            "layers": list(a.layers), "modules": list(a.modules), "counts": a.counts, "totals": a.totals,
            "density": a.density, "by_module": a.by_module, "by_layer": dict(zip(a.layers, a.by_layer)),
            "cells": a.to_rows(), "meta": json.loads(json.dumps(r.meta.as_dict(), default=plain)),
        })
        return out


def _module_words(name: str) -> str:
    role = param_role(name)
    return "/".join(MODULE_LABELS.get(m, m) for m in (role.fused or (role.module,)))


def top_tensors(region: dict, shapes: dict, n: int = TOP) -> list[dict]:
    """The ``n`` tensors holding most of the region: its parameters in each, their share of the region and the
    tensor's density (region parameters / the tensor's size); the largest first, ties by name."""
    k = max(sets.region_size(region), 1)
    rows = []
    for name, idx in region.items():
        count, size = int(idx.numel()), math.prod(shapes[name])
        if count:
            rows.append({"tensor": name, "layer": row_of(name, shapes[name]), "module": _module_words(name),
                         "kind": param_role(name).kind, "parameters": count, "size": size, "share": count / k,
                         "density": count / size})
    return sorted(rows, key=lambda r: (-r["parameters"], r["tensor"]))[:n]


def top_neurons(region: dict, shapes: dict, n: int = TOP) -> list[dict]:
    """The ``n`` neurons holding most of the region. A neuron is one output unit of a weight matrix, i.e. the weights
    into that unit: a row of a Linear weight (out × in), a column of GPT-2's Conv1D weight (in × out). Embedding
    tables and one-dimensional tensors (biases, norms) hold no neurons here. Each: its tensor, ``unit`` (the row or
    column), the region's parameters among its weights, its density (those / its fan-in) and share of the region."""
    k = max(sets.region_size(region), 1)
    found = []
    for name, idx in region.items():
        shape = tuple(shapes[name])
        if len(shape) != 2 or not idx.numel() or row_of(name, shape) == "embeddings":
            continue
        role = param_role(name)
        columns = bool(role.fused) or (name.split(".")[-2] if "." in name else "") in CONV1D_LEAVES
        units = (idx % shape[1]) if columns else torch.div(idx, shape[1], rounding_mode="floor")
        per_unit = torch.bincount(units.long(), minlength=shape[1] if columns else shape[0])
        fan_in = shape[0] if columns else shape[1]
        top = torch.topk(per_unit, min(n, int((per_unit > 0).sum())))
        width = shape[1] // len(role.fused) if role.fused else 0
        for count, unit in zip(top.values.tolist(), top.indices.tolist()):
            module = role.fused[unit // width] if role.fused else role.module
            found.append({"tensor": name, "layer": row_of(name, shape), "module": MODULE_LABELS.get(module, module),
                          "axis": "column" if columns else "row", "unit": unit, "parameters": count, "fan_in": fan_in,
                          "density": count / fan_in, "share": count / k})
    return sorted(found, key=lambda r: (-r["parameters"], r["tensor"], r["unit"]))[:n]


def seed_stability(paths: list[str], records: list[RegionRecord]) -> dict:
    """Per module type and layer, how much of a seed's region every seed found, against chance; the files must be
    regions of one localize run (or one request) differing only in their seed."""
    names = labels_for(paths, records)
    merged_shapes(records)
    groups = replicate_groups(names, records)
    if len(records) < 2 or not any(len(members) == len(records) for members in groups.values()):
        raise RequestError(f"{', '.join(repr(str(p)) for p in paths)} are not regions of one localize run differing "
                           "only in their seed; give the seed files of one 'graftui localize --seeds' run (its "
                           "-seedN files) as --region and --replicate")
    indices = [r.indices for r in records]
    return {"regions": [str(p) for p in paths], "seed_numbers": [r.meta.request.get("seed") for r in records],
            **sets.stability(indices, records[0].graftable), **sets.stability_by_part(indices, records[0].shapes)}


def ablate(req: AnatomyRequest, path: str, record: RegionRecord, anat: Anatomy, notes: list[str], progress=None,
           cancel=None, guard: Guard = LOCAL) -> dict:
    """The region's graft scored whole and, for every layer and every module type, with that part dropped
    (``experiments.drop_part``: its parameters back to θ_pre), on ``req.n`` test examples of the region's own task
    (the sample evaluate scores); each drop with a paired 95 % interval on the same examples."""
    if not record.is_patch and not loadable(record.meta.finetuned):
        raise ModelError(f"--ablate grafts the fine-tuned model '{record.meta.finetuned}' the region was made from, "
                         "which cannot be loaded here; use the region's skill patch (localize saves one by default)")
    ev = EvaluateRequest.make(regions=[str(path)], n=req.n)
    grafts = regions_setting(ev, guard)
    task = next(iter(grafts.tasks.values()))
    kind = kind_of(task)
    kind.supports("anatomy", task)  # before any model loads
    pair = regions_pair(ev, grafts, task, guard, progress, cancel)
    scorer = kind.scorer(pair, task, "test", req.n, kind.judging(req, record.meta, guard), notes)  # what the model's
    # context cannot hold is refused before the first drop is scored
    notes += [note for note in grafts.notes if note not in notes]
    values = record.values if record.is_patch else None
    parts = [("layer", row) for row in anat.layers] + [("module", m) for m in anat.modules]
    totals = {("layer", row): sum(anat.totals[i]) for i, row in enumerate(anat.layers)}
    totals.update({("module", m): sum(row[j] for row in anat.totals) for j, m in enumerate(anat.modules)})

    def score(indices, vals):
        with pair.grafted(indices) if vals is None else pair.grafted(indices, vals):
            return scorer()

    if progress:
        progress({"stage": "scoring the whole graft", "fraction": 0.0})
    full = score(record.indices, values)
    rows = []
    for i, (by, part) in enumerate(parts):
        if cancel is not None and cancel.is_set():
            raise Cancelled("ablation cancelled")
        label = part_label(by, part)
        if progress:
            progress({"stage": f"without {label}", "fraction": (i + 1) / (len(parts) + 1), "step": i + 1,
                      "steps": len(parts)})
        kept, kept_values = drop_part(record.indices, record.shapes, **{by: part}, values=values)
        dropped = record.size - sets.region_size(kept)
        without = full if not dropped else score(kept, kept_values)
        d = kind.paired(full, without, TEST_SAMPLE_SEED)
        rows.append({"by": by, "part": part, "label": label, "parameters": dropped, "graftable": totals[(by, part)],
                     "share": dropped / max(record.size, 1), "accuracy": without.score,
                     "drop": d["diff"], "ci": d["ci"], "p": d["p"], "distinguishable": distinguishable(d)})
    finish(progress)
    return {"task": task.name, "n": full.n, "accuracy": full.score, "accuracy_ci": card.wilson(full.score, full.n),
            "metric": kind.words.key, "rows": rows}


@verb(AnatomyRequest, "where a region sits: layers × module types", text.anatomy)
def anatomy(req: AnatomyRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> AnatomyResult:
    """Where a region sits: its parameters per layer and module type, the tensors and neurons holding most of it;
    with ``replicates`` its stability across seeds per part, with ``ablate`` what each part is worth."""
    req.validate()
    start = time.time()
    path = req.region or str(latest_region())
    record = load_region(path)
    anat = count_anatomy(record.indices, record.shapes)
    notes: list[str] = []
    stability = None
    if req.replicates:
        paths = [str(path), *req.replicates]
        stability = seed_stability(paths, [record, *(load_region(p) for p in req.replicates)])
    ablation = ablate(req, str(path), record, anat, notes, progress, cancel, guard) if req.ablate else None
    return AnatomyResult(req, notes, time.time() - start, str(path), record, anat,
                         top_tensors(record.indices, record.shapes), top_neurons(record.indices, record.shapes),
                         stability, ablation)


# -- compose -------------------------------------------------------------------------------------
@dataclass
class ComposeResult(Result):
    names: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    intersection_counts: list[list[int]] = field(default_factory=list)
    overlap: list[list[float]] = field(default_factory=list)  # |γi ∩ γj| / |γj|
    iou: list[list[float]] = field(default_factory=list)
    union_size: int = 0
    graftable_params: int = 0
    report: dict | None = None  # how overlaps were settled (sets.union_values)
    rows: list[dict] = field(default_factory=list)  # with evaluate: each task alone / in the union / bare body
    written: dict | None = None
    differences: list[dict] = field(default_factory=list)  # with evaluate: union and bare body − region alone, paired
    stitch: dict | None = None  # with --stitch: each merge's λ and density (chosen on validation) and its grid's scores
    generations: list[dict] = field(default_factory=list)  # stitched completion tasks: each model's generations
    task_kind: str = "classification"  # the kind its rows are scored by (kinds.KINDS)

    def files_written(self) -> list[str]:
        return [self.written["path"]] if isinstance(self.written, dict) and self.written.get("path") else []

    def matrix(self) -> dict:
        """The overlap matrix as sets.overlap_matrix returns it."""
        return {k: getattr(self, k) for k in ("names", "sizes", "intersection_counts", "overlap", "iou")}

    def as_dict(self) -> dict:
        out = super().as_dict()
        for row in out["rows"]:
            row["accuracy_ci"] = card.wilson(row["accuracy"], row["n"])
            row.setdefault("gain_recovered", None)  # the fine-tuned models are not scored here
        # |γi ∩ γj| / |γj| expected for random regions of these sizes: |γi| / N
        out["chance_overlap"] = [[card.chance_overlap(si, self.graftable_params) for _ in self.sizes] for si in self.sizes]
        out["card"] = card.compose_card(out, kind_named(self.task_kind).words)
        return out


class _LazyBase:
    """Pre-trained tensors by name, loaded only if averaging overlapping patch values needs them."""

    def __init__(self, ref: str, names, allow_local: bool, progress=None):
        self.ref, self.names, self.allow_local, self.progress = ref, set(names), allow_local, progress
        self._params: dict | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __getitem__(self, name: str):
        if self._params is None:
            if self.progress:
                self.progress({"stage": f"loading {short_ref(self.ref)} to average overlapping values"})
            kind = checkpoint_kind(self.ref, allow_local=self.allow_local)
            model = load_classifier(self.ref, allow_local=self.allow_local)[0] if kind == "classifier" else \
                load_lm(self.ref, kind, allow_local=self.allow_local)
            self._params = {n: p.detach() for n, p in model.named_parameters()}
        if name not in self._params:
            raise RegionError(f"base '{self.ref}' has no parameter {name}; pass the base the patches were made for")
        return self._params[name]


def _as_patch(record: RegionRecord, name: str, guard: Guard, progress=None, cancel=None) -> RegionRecord:
    """A skill patch from a region (``name``: its file): values read from its own recorded fine-tuned checkpoint."""
    if record.is_patch:
        return record
    base, finetuned = record.meta.base, record.meta.finetuned
    if not loadable(finetuned):
        raise RegionError(f"a region without values needs its fine-tuned model '{finetuned}', which cannot be loaded here")
    pair = pair_for_regions(base, finetuned, [record], guard, progress, cancel)
    regions.check_fits(record, pair)
    check_build(record, pair, name, [])
    return regions.with_patch(pair, record)


STITCHED = "stitched"


def _score(pair, task, models: dict, n, contrasts, judging, progress=None, cancel=None) -> dict:
    """Every model of ``models`` (and FT, the pre-trained model) on ``task``, as evaluate scores it."""
    return kind_of(task).compare(pair, task, models, n=n, contrasts=contrasts, judging=judging, progress=progress,
                                 cancel=cancel)


def _validation(pair, task, values: dict, n: int, judging) -> float:
    """One merge's score on ``n`` validation examples (accuracy, exact match: the task kind's score)."""
    with pair.holding(values):
        return kind_of(task).scorer(pair, task, "validation", n, judging)().score


def _setting(merge: str, value: float | None) -> dict:
    """A merge's second setting as its record holds it ({"density": 0.2}, {"tall": 0.4}; none for task arithmetic)."""
    key = MERGES[merge].key
    return {key: value or None} if key else {}


@dataclass
class Stitched:
    rows: list[dict]
    differences: list[dict]
    chosen: dict  # each merge's λ and density and the validation score of each setting tried
    patches: list[RegionRecord]  # the members as skill patches
    union: tuple  # (indices, values) of θ_pre + Σ_i γ_i ⊙ δ_i
    report: dict  # how overlaps were settled (sets.union_values)
    generations: list[dict]  # completion tasks: prompt, reference and each model's generation
    task_kind: str  # the kind every member's task is


def stitch(req: ComposeRequest, records: list[RegionRecord], names: list[str], base: str, guard: Guard,
           notes: list[str], progress=None, cancel=None) -> Stitched:
    """Localize-and-Stitch as an experiment: θ_pre + Σ_i γ_i ⊙ δ_i scored on every member's task beside each
    fine-tune alone, each region alone, the pre-trained model and the merges of ``req.merges`` (task arithmetic
    θ_pre + λ Σ_i δ_i, TIES, DARE, consensus; their settings chosen on validation examples of every task); what the
    reader should know goes to ``notes``."""
    finetunes = [r.meta.finetuned for r in records]
    again = next((i for i, f in enumerate(finetunes) if f in finetunes[:i]), None)
    if again is not None:
        first = finetunes.index(finetunes[again])
        raise RegionError(f"'{names[first]}' and '{names[again]}' are regions of one fine-tune "
                          f"('{short_ref(finetunes[again])}'): stitching adds each member's movement, so it would count "
                          "twice; give one region per fine-tune")
    missing = next((f for f in finetunes if not loadable(f)), None)
    if missing is not None:
        raise RegionError(f"stitching compares the stitched model with each fine-tune and merge, so every "
                          f"region's fine-tuned model must load; '{missing}' cannot: give regions made here")
    tasks = [read_task_as(r.meta.task or DEFAULT_TASK, recorded_columns(r.meta), guard) for r in records]
    kinds = {kind_of(t).name: kind_of(t) for t in tasks}
    if len(kinds) > 1:
        raise RegionError("stitching chooses each merge's λ on one score for every task: give regions of "
                          f"{' tasks only, or of '.join(sorted(kinds, reverse=True))} tasks only")
    kind = next(iter(kinds.values()))
    kind.supports("compose", tasks[0])
    judging = [kind.judging(req, r.meta, guard) for r in records]  # each region's own, unless asked
    pairs = []
    for i, (record, name, finetuned) in enumerate(zip(records, names, finetunes)):
        if progress:
            progress({"stage": f"loading {short_ref(base)} and {short_ref(finetuned)}", "fraction": i / len(records) / 4})
        pair = pair_for_regions(base, finetuned, [record], guard, progress, cancel)
        regions.check_fits(record, pair)
        check_build(record, pair, name, notes)
        pairs.append(pair)
    for pair, task, record in zip(pairs, tasks, records):  # no room for a prompt: refused before any merge
        kind.check_context(pair, task, req, notes, 0, record.meta, guard)
    graftable = [n for n in pairs[0].graftable if all(n in p.ft for p in pairs)]
    patches = [regions.with_patch(p, r) if not r.is_patch else r for p, r in zip(pairs, records)]
    union_idx, union_val, report = scoring.union_of(patches, names, pairs[0].pre, req.resolve)
    ft_values = [{n: p.ft[n] for n in graftable} for p in pairs]
    grid = [(m, lam, d) for m in req.merges for lam in req.lambdas
            for d in (getattr(req, MERGES[m].grid) if MERGES[m].grid else [None])]
    scores: dict[str, dict[tuple, float]] = {m: {} for m in req.merges}
    for j, (m, lam, d) in enumerate(grid):  # every setting of every merge on validation examples, never on test
        if cancel is not None and cancel.is_set():
            raise Cancelled("stitching cancelled")
        if progress:
            progress({"stage": f"{MERGES[m].label(lam, d)} on validation examples",
                      "fraction": 0.25 + 0.25 * j / len(grid)})
        merged = MERGES[m].make(pairs[0].pre, ft_values, lam, d, graftable)
        scores[m][(lam, d or 0.0)] = sum(_validation(p, t, merged, req.validation_n, jd)
                                         for p, t, jd in zip(pairs, tasks, judging)) / len(pairs)
        del merged  # one merged model at a time while the grid runs
    best = {m: best_lambda(scores[m]) for m in req.merges}
    merges = {MERGES[m].label(lam, d): (m, lam, d) for m, (lam, d) in best.items()}
    made = {label: MERGES[m].make(pairs[0].pre, ft_values, lam, d or None, graftable)
            for label, (m, lam, d) in merges.items()}
    rows, found, shown = [], [], []
    for i, (pair, task, record, name) in enumerate(zip(pairs, tasks, records, names)):
        models = {STITCHED: (union_idx, union_val), f"{name} alone": record.indices,
                  **{label: (lambda p=pair, v=values: p.holding(v)) for label, values in made.items()}}
        models.update({f"fine-tuned for {names[j]}": (lambda p=pair, v=ft_values[j]: p.holding(v))
                       for j in range(len(pairs)) if j != i})
        part = _score(pair, task, models, req.n, [*((STITCHED, label) for label in made), (STITCHED, f"{name} alone")],
                      judging[i], progress, cancel)
        notes += [n for n in part["notes"] if n not in notes]
        for row in part["rows"]:
            row["head"] = name
        rows += part["rows"]
        found += [{**d, "head": name} for d in part["differences"]]
        shown += [{**g, "task": task.name} for g in part.get("generations", ())]
    arithmetic = next((label for label, (m, _, _) in merges.items() if m == "task-arithmetic"), None)
    chosen = {"validation_n": req.validation_n,
              "merges": [{"merge": m, "model": label, "lambda": lam, **_setting(m, d),
                          "grid": [{"lambda": x, **_setting(m, y), "validation": v} for (x, y), v in scores[m].items()]}
                         for label, (m, lam, d) in merges.items()]}
    if arithmetic is not None:  # task arithmetic's own keys, as before there were other merges
        lam = merges[arithmetic][1]
        chosen.update({"lambda": lam, "model": arithmetic,
                       "lambdas": [{"lambda": x, "validation": v} for (x, _), v in scores["task-arithmetic"].items()]})
    return Stitched(rows, found, chosen, patches, (union_idx, union_val), report, shown, kind.name)


def _overlap_figure(doc: dict) -> dict:
    keys = ("names", "sizes", "intersection_counts", "overlap", "iou")
    return {"overlap": fig.overlap_heatmap({k: doc[k] for k in keys})} if doc.get("names") else {}


@verb(ComposeRequest, "overlap of regions, their union, and the union graft scored", text.compose,
      figures=_overlap_figure)
def compose(req: ComposeRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> ComposeResult:
    """Overlap and union of regions; with ``evaluate``, the union graft scored on every region's task."""
    req.validate()
    start = time.time()
    records = [load_region(p) for p in req.regions]
    names = labels_for(req.regions, records)
    shapes = merged_shapes(records)
    bases = {r.meta.base for r in records}
    base = req.base or (next(iter(bases)) if len(bases) == 1 else None) or DEFAULT_BASE
    matrix = sets.overlap_matrix({n: r.indices for n, r in zip(names, records)})
    union_size = sets.region_size(sets.union(*(r.indices for r in records)))
    graftable = sum(math.prod(s) for s in shapes.values())
    rows: list[dict] = []
    found: list[dict] = []
    report = None
    union_idx = union_val = None
    stitched, generations, notes, task_kind = None, [], [], "classification"
    if req.stitch or (req.evaluate and any(region_kind(r.meta).stitches_only for r in records)):
        done = stitch(req, records, names, base, guard, notes, progress, cancel)
        rows, found, stitched, records, report = done.rows, done.differences, done.chosen, done.patches, done.report
        union_idx, union_val = done.union
        generations, task_kind = done.generations, done.task_kind
    elif req.evaluate:
        records = [_as_patch(r, name, guard, progress, cancel) for r, name in zip(records, names)]
        scoring.check_composable(records)
        tasks = [get_task(r.meta.task or DEFAULT_TASK, recorded_columns(r.meta), guard) for r in records]
        for i, (record, name, task) in enumerate(zip(records, names, tasks)):
            if cancel is not None and cancel.is_set():
                raise Cancelled("composition cancelled")
            if progress:
                progress({"stage": f"loading {short_ref(base)} + patch '{name}'", "fraction": i / len(records)})
            allow = guard.allow_local(models=[base])
            pair = guard.checked_pair(regions.pair_from_patch(base, record, allow_local=allow))
            if not pair.options.device_map:
                pair.to(settings.device())
            if union_idx is None:
                union_idx, union_val, report = scoring.union_of(records, names, pair.pre, req.resolve)
            if progress:
                progress({"stage": f"evaluating on {task.name} with the head of '{name}'",
                          "fraction": (i + 0.5) / len(records)})
            scored, paired = scoring.evaluate_on_pair(pair, task, record, name, union_idx, union_val, n=req.n)
            rows, found = rows + scored, found + paired
            del pair
    written = None
    if req.out is not None:
        made = {"method": "union", "sources": list(req.regions), "source_methods": [r.meta.method for r in records],
                "task": "+".join(dict.fromkeys(str(r.meta.task or "?") for r in records)), "request": req.as_dict()}
        if len({r.meta.finetuned_sha256 for r in records}) > 1:
            made.update({"finetuned_sha256": None, "finetuned": "several"})
        if all(r.is_patch for r in records):
            if union_idx is None:
                pre = _LazyBase(base, shapes, guard.allow_local(models=[base]), progress)
                union_idx, union_val, report = sets.union_values(
                    [sets.Contribution(n, r.indices, r.values) for n, r in zip(names, records)], pre, req.resolve)
            made.update({"resolve": req.resolve, "overlap_params": report["overlap_params"]})
            record = regions.derived_record(records[0].meta, union_idx, shapes, made, union_val, records[0].head)
        else:
            record = regions.derived_record(records[0].meta, sets.union(*(r.indices for r in records)), shapes, made)
        out = Path(req.out).expanduser()
        regions.save(record, out, exclusive=not req.overwrite)
        written = {"path": str(out), "kind": record.kind, "k": record.size}
    finish(progress)
    return ComposeResult(req, same_regions(names, records) + notes, time.time() - start, names, list(req.regions),
                         [r.kind for r in records], matrix["sizes"],
                         matrix["intersection_counts"], matrix["overlap"], matrix["iou"], union_size, graftable, report,
                         rows, written, found, stitched, generations, task_kind)


# -- export ----------------------------------------------------------------------------------------
@dataclass
class ExportResult(Result):
    out: str = ""
    region: str = ""
    base: str = ""
    finetuned: str = ""
    k: int = 0
    labels: list[str] = field(default_factory=list)
    architecture: str = ""  # the exported checkpoint's class (a *ForCausalLM / *ForMaskedLM for a language model)


@verb(ExportRequest, "write a grafted model as a Hugging Face checkpoint", text.export)
def export(req: ExportRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> ExportResult:
    """θ_pre + γ⊙(θ_ft − θ_pre) as a normal Hugging Face checkpoint folder."""
    req.validate()
    start = time.time()
    path = req.region or str(latest_region())
    record = load_region(path)
    base = req.base or record.meta.base or DEFAULT_BASE
    if req.finetuned is None and not record.is_patch:
        raise RegionError(f"'{path}' is a region without values: give --finetuned REF to export it, or use a skill patch")
    out = Path(req.out).expanduser() if req.out else new_path(settings.subdir("exports"), Path(path).stem)
    check_model_ref(base)
    if req.finetuned is not None:
        check_model_ref(req.finetuned)
    if progress:
        progress({"stage": "loading models", "fraction": 0.1})
    options = req.load_options(regions.recorded_options(record.meta))
    notes: list[str] = []
    if req.finetuned is None:
        pair = guard.checked_pair(regions.pair_from_patch(base, record, options,
                                                          allow_local=guard.allow_local(models=[base])))
    else:
        pair = pair_for_regions(base, req.finetuned, [record], guard, progress, cancel, options)
        regions.check_fits(record, pair)
        check_build(record, pair, Path(path).name, notes)
    if progress:
        progress({"stage": "writing the grafted checkpoint", "fraction": 0.5})
    record.meta.export_request = req.as_dict()
    regions.export_graft(pair, record, out)
    finish(progress)
    return ExportResult(req, notes, time.time() - start, str(out), str(path), base,
                        f"patch:{record.meta.finetuned or '?'}" if record.is_patch else req.finetuned, record.size,
                        list(pair.label_names),
                        architecture(pair.model))




# -- regions: the table of saved regions and their latest scores --------------------------------------
@dataclass
class RegionsResult(Result):
    folder: str = ""
    regions: list[dict] = field(default_factory=list)  # regions.listing_row of each region shown, in order
    total: int = 0  # regions in the folder, before the filters
    groups: list[dict] = field(default_factory=list)  # with --group-by: regions.group_runs of the regions shown
    diff: list[dict] = field(default_factory=list)  # with --diff A,B: {setting, a, b} for each setting that differs


FILTERS = ("task", "method", "finetuned")  # request field = the row's column it filters on


def _matches(value, wanted: str) -> bool:
    """A filter value names a column's value exactly, or its last path part (a task or model file by its name)."""
    if value is None:
        return False
    wanted = str(wanted).strip().lower()
    return wanted in (str(value).lower(), short_ref(value).lower(), Path(str(value)).stem.lower())


def select_regions(rows: list[dict], task: str | None = None, method: str | None = None, finetuned: str | None = None,
                   sort: str | None = None, descending: bool = False, where: str = "here") -> list[dict]:
    """The rows that pass every filter given, sorted by ``sort`` (None: as given); a filter that names a value no
    row has is a RequestError listing the values there are. Rows without a value in ``sort`` come last."""
    wanted = {"task": task, "method": method, "finetuned": finetuned}
    for name, value in wanted.items():
        if value is None:
            continue
        if not any(_matches(r[name], value) for r in rows):
            known = sorted({short_ref(r[name]) for r in rows if r[name] is not None})
            raise RequestError(f"--{name} '{value}': no saved region {where} has it; "
                               + (f"choose from {', '.join(known)}" if known else "there are no saved regions to filter"))
        rows = [r for r in rows if _matches(r[name], value)]
    if sort is None:
        return list(rows)
    if sort not in regions.LISTING_COLUMNS:
        raise RequestError(f"--sort '{sort}': not a column; choose from {', '.join(regions.LISTING_COLUMNS)}")
    known = [r for r in rows if r[sort] is not None]
    key = (lambda r: str(r[sort]).lower()) if any(isinstance(r[sort], str) for r in known) else (lambda r: r[sort])
    return sorted(known, key=key, reverse=descending) + [r for r in rows if r[sort] is None]


def with_words(rows: list[dict], words: str | None) -> list[dict]:
    """The rows that hold every word of ``words`` (any case) in their id, pair, task, method or settings."""
    wanted = str(words or "").lower().split()

    def said(r: dict) -> str:
        return " ".join(str(r[key]) for key in ("id", "base", "finetuned", "task", "method", "k", "steps", "seed",
                                                "scored_task", "created")).lower()

    return [r for r in rows if all(w in said(r) for w in wanted)]


@verb(RegionsRequest, "every saved region with its latest scores, filtered and sorted", text.regions)
def regions_table(req: RegionsRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> RegionsResult:
    """The table of saved regions: what each is (pair, task, method, k, steps, seed) and how its graft scored when it
    was last evaluated in distribution (graftui evaluate, the app's Compare)."""
    req.validate()
    start = time.time()
    folder = Path(req.folder).expanduser() if req.folder else settings.subdir("regions")
    rows = regions.listing(folder)
    shown = select_regions(rows, req.task, req.method, req.finetuned, req.sort, req.descending, f"in {folder}")
    notes = [] if rows else [f"no region files in {folder}; 'graftui localize' writes one there"]
    groups = regions.group_runs(shown, req.group_by) if req.group_by else []
    diff = []
    if req.diff:
        a, b = (_listed(rows, name, folder) for name in req.diff)
        diff = [{"setting": n, "a": x, "b": y} for n, x, y in regions.settings_diff(a, b)]
    return RegionsResult(req, notes, time.time() - start, str(folder), shown, len(rows), groups, diff)


def _listed(rows: list[dict], name: str, folder: Path):
    """The header of the region ``name`` (its id, or its file's name) among the rows listed."""
    found = next((r for r in rows if r["id"] == name or Path(r["file"]).name == name.strip()), None)
    if found is None:
        raise RequestError(f"--diff: no region '{name}' in {folder}; give the ids 'graftui runs' lists")
    return regions.read_header(Path(found["file"])).meta
