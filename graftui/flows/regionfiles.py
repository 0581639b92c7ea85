"""Verbs on region files: what a region holds and where (anatomy), unions of regions (compose), and a
grafted checkpoint written from one (export)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import card, regions, scoring, sets, settings
from ..config import DEFAULT_BASE, DEFAULT_TASK
from ..errors import Cancelled, RegionError
from ..layout import Anatomy, anatomy as count_anatomy
from ..models import architecture, checkpoint_kind, load_classifier, load_lm
from ..paths import new_path, short_ref
from ..regions import RegionRecord
from ..requests import AnatomyRequest, ComposeRequest, ExportRequest
from . import text
from .common import (
    LOCAL, Guard, Progress, Result, check_build, check_model_ref, finish, get_task, labels_for, latest_region,
    load_region, loadable, merged_shapes, pair_for_regions, plain, same_regions,
)
from .registry import verb


# -- anatomy -------------------------------------------------------------------------------------
@dataclass
class AnatomyResult(Result):
    path: str = ""
    record: RegionRecord | None = None
    anatomy: Anatomy | None = None

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


@verb(AnatomyRequest, "where a region sits: layers × module types", text.anatomy)
def anatomy(req: AnatomyRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> AnatomyResult:
    """Where a region sits: its parameters per layer and module type."""
    req.validate()
    path = req.region or str(latest_region())
    record = load_region(path)
    return AnatomyResult(req, [], 0.0, str(path), record, count_anatomy(record.indices, record.shapes))


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
        out["card"] = card.compose_card(out)
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


@verb(ComposeRequest, "overlap of regions, their union, and the union graft scored", text.compose)
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
    if req.evaluate:
        records = [_as_patch(r, name, guard, progress, cancel) for r, name in zip(records, names)]
        scoring.check_composable(records)
        tasks = [get_task(r.meta.task or DEFAULT_TASK, regions.recorded_columns(r.meta), guard) for r in records]
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
    return ComposeResult(req, same_regions(names, records), time.time() - start, names, list(req.regions),
                         [r.kind for r in records], matrix["sizes"],
                         matrix["intersection_counts"], matrix["overlap"], matrix["iou"], union_size, graftable, report,
                         rows, written, found)


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


