"""Every verb, implemented once: ``flow(request, progress=None, cancel=None, guard=None) -> result``.

The CLI, the app and ``import graftui`` only build a request (``graftui.requests``), call the
flow and render its result. A flow validates its request, loads what it needs (models through a
small cache, since the app switches between regions constantly), reports progress as dicts
(``stage``, ``fraction``, and ``step``/``steps`` for plots), honours ``cancel`` between steps,
and returns a typed result with ``as_dict()``. Every file a flow writes embeds its request and
the library version, so :func:`run_file` can make it again.

A :class:`Guard` says what a flow may read: locally everything, on a hosted server only Hub ids,
offline defaults and the server's own files (``graftui.ui.store.guard()``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

from . import __version__, regions, settings
from .layout import MODULE_LABELS, Anatomy, anatomy as count_anatomy
from .data import OFFLINE_TASKS, Task, kshot, load_task
from .errors import Cancelled, DataError, ModelError, RegionError, RequestError
from .methods import Budget, get_method, run_method
from .method import data_parallel, region_size
from .models import GraftableSpec, ModelPair, architecture, pair_kind, resolve
from .regions import RegionRecord
from .requests import (
    DEFAULT_BASE, DEFAULT_EXAMPLES_PER_CLASS, DEFAULT_FINETUNED, DEFAULT_FINETUNED_REFS, DEFAULT_TASK, AnatomyRequest,
    ComposeRequest, EvaluateRequest, ExportRequest, FinetuneRequest, LoadOptions, LocalizeRequest, Request, SweepRequest,
    default_checkpoint_dir, from_dict,
)
from . import card, method, scoring, sets

Progress = Callable[[dict], None]


# -- what a flow may read ------------------------------------------------------------------------
class Guard:
    """Locally, a flow may read any model, data set and file; a hosted server narrows this."""

    def allow_local(self, models=(), tasks=()) -> bool:
        """Whether local paths may be loaded for ``models`` and ``tasks`` (raise to refuse one)."""
        return True

    def checked_task(self, task: Task) -> Task:
        return task

    def checked_pair(self, pair: ModelPair) -> ModelPair:
        return pair


LOCAL = Guard()


# -- shared steps --------------------------------------------------------------------------------
_pairs: "OrderedDict[tuple, ModelPair]" = OrderedDict()
_pairs_lock = threading.Lock()
PAIR_CACHE_SIZE = 2


def load_pair(base: str, finetuned: str, spec: GraftableSpec = GraftableSpec(), *, options: LoadOptions = LoadOptions(),
              labels=None, allow_local: bool = True) -> ModelPair:
    """A ModelPair, from a small cache: the working model is always left at pre body + FT head."""
    labels = tuple(labels) if labels else None
    if labels and pair_kind(finetuned, options, allow_local=allow_local) == "classifier":
        labels = None  # a classifier has its own labels: one cache entry whatever the task
    key = (base, finetuned, spec, options, labels, allow_local)
    with _pairs_lock:
        if key in _pairs:
            _pairs.move_to_end(key)
            return _pairs[key]
    pair = ModelPair.load(base, finetuned, spec, options=options, labels=labels, allow_local=allow_local)
    if not options.device_map:  # a device map has placed the model already
        pair.to(settings.device())
    with _pairs_lock:
        _pairs[key] = pair
        while len(_pairs) > PAIR_CACHE_SIZE:
            _pairs.popitem(last=False)
    return pair


def clear_cache() -> None:
    with _pairs_lock:
        _pairs.clear()


def is_default_finetuned(ref: str | None) -> bool:
    return (ref or "").strip().lower() in DEFAULT_FINETUNED_REFS


def check_model_ref(ref: str) -> None:
    """Fail early on a reference that names nothing; the default fine-tuned model is built later."""
    if not is_default_finetuned(ref):
        resolve(ref)


def ensure_models(refs, progress: Progress | None = None, cancel=None) -> None:
    """Build a default fine-tuned checkpoint named in ``refs`` on first use (a visible stage)."""
    from . import training

    for ref in refs:
        key = (ref or "").strip().lower()
        if key in DEFAULT_FINETUNED_REFS and not (default_checkpoint_dir(key) / "config.json").exists():
            def step(p, key=key):
                if progress:
                    progress({"stage": f"building the default fine-tuned model '{key}' (first use)",
                              "fraction": p.step / max(p.steps, 1)})

            training.ensure_default_finetuned(key, progress=step, cancel=cancel)


def get_task(ref: str, spec, guard: Guard) -> Task:
    """A task; column options given for an offline task must name its own columns (text, label)."""
    if str(ref).strip().lower() in OFFLINE_TASKS:
        for name, allowed in (("text_column", "text"), ("label_column", "label"), ("pair_column", None)):
            column = getattr(spec, name)
            if column is not None and column != allowed:
                raise DataError(f"column '{column}' ({name}) not found in the offline task '{ref}'; "
                                "its columns are text, label")
    return guard.checked_task(load_task(ref, spec, allow_local=guard.allow_local(tasks=[ref])))


def get_pair(base: str, finetuned: str, spec: GraftableSpec, guard: Guard, progress=None, cancel=None,
             options: LoadOptions = LoadOptions(), labels=None) -> ModelPair:
    """The pair, read as ``options`` say; ``labels`` (the task's) order a language model's label words."""
    allow = guard.allow_local(models=[base, finetuned])
    ensure_models([finetuned], progress, cancel)
    if progress:
        progress({"stage": f"loading {short_ref(base)} and {short_ref(finetuned)}"})
    return guard.checked_pair(load_pair(base, finetuned, spec, options=options, labels=labels, allow_local=allow))


def prompt_notes(pair: ModelPair) -> list[str]:
    """A note saying which prompt a language model was read with, when graftui chose its label words."""
    if pair.prompt is not None and pair.prompt.chosen:
        return [f"no label words given: {pair.prompt.describe()} (give --label-words to choose others)"]
    return []


def short_ref(ref) -> str:
    """A model or data reference as people read it: the last path component of a local path."""
    ref = str(ref)
    if "/" in ref and (ref.startswith(("/", ".", "~")) or ref.count("/") > 1):
        return Path(ref).name
    return ref


def slug(text) -> str:
    text = str(text).strip().rstrip("/\\")
    path = Path(text).expanduser()
    if path.suffix.lower() in {".csv", ".tsv", ".json", ".jsonl", ".parquet", ".safetensors"} or path.exists():
        text = path.stem or path.name
    return re.sub(r"[^\w.-]+", "_", text).strip("._") or "item"


def new_path(folder: Path, stem: str, suffix: str = "") -> Path:
    """A path in ``folder`` that does not exist yet: ``stem-<UTC stamp>[-n]<suffix>``."""
    stem = slug(stem)[:60]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path, n = folder / f"{stem}-{stamp}{suffix}", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{stamp}-{n}{suffix}"
    return path


def load_region(path: str) -> RegionRecord:
    try:
        return regions.load(Path(path).expanduser())
    except RegionError as err:
        text = str(err)
        raise RegionError(text if str(Path(path).name) in text else f"'{path}': {text}") from None


def latest_region() -> Path:
    folder = settings.subdir("regions")
    files = sorted(folder.glob("*.safetensors"), key=lambda f: f.stat().st_mtime)
    if not files:
        raise RequestError(f"no region given and none in {folder}; run 'graftui localize' first")
    return files[-1]


def labels_for(paths, records=None) -> list[str]:
    """Distinct display names for region files: their stems, numbered where they collide; with the
    records, runs of one method and k also carry the settings in which they differ."""
    out: list[str] = []
    for i, p in enumerate(paths):
        name = Path(p).stem or str(p)
        if records:
            me = records[i].meta
            twins = [r.meta for r in records if r is not records[i] and r.meta.get("method") == me.get("method")
                     and r.size == records[i].size]
            mine = regions.settings_of(me)
            differ = [x for x in mine if any(x not in regions.settings_of(t) for t in twins)]
            if differ:
                name += f" ({', '.join(differ)})"
        candidate, n = name, 2
        while candidate in out:
            candidate, n = f"{name} ({n})", n + 1
        out.append(candidate)
    return out


def side_by_side(labels, records) -> dict:
    """Several runs next to each other: their settings, overlap matrix and where each lies (per module type
    and per layer, as shares of the region), so their anatomy can be read as a difference."""
    matrix = sets.overlap_matrix({label: r.indices for label, r in zip(labels, records)})
    anatomies = [count_anatomy(r.indices, r.shapes) for r in records]
    modules = list(dict.fromkeys(m for a in anatomies for m in a.modules))
    layers = list(dict.fromkeys(layer for a in anatomies for layer in a.layers))
    return {**matrix,
            "settings": {label: regions.describe(r.meta) for label, r in zip(labels, records)},
            "modules": modules, "module_labels": [MODULE_LABELS.get(m, m) for m in modules], "layers": layers,
            "module_share": {label: [a.by_module.get(m, 0) / max(r.size, 1) for m in modules]
                             for label, a, r in zip(labels, anatomies, records)},
            "layer_share": {label: [dict(zip(a.layers, a.by_layer)).get(layer, 0) / max(r.size, 1) for layer in layers]
                            for label, a, r in zip(labels, anatomies, records)}}


def same_regions(labels, records) -> list[str]:
    """A note for each pair of inputs that hold one region (copies of one file, or one result twice)."""
    seen: dict[str, str] = {}
    notes = []
    for label, record in zip(labels, records):
        d = regions.digest(record.indices)
        if d in seen:
            notes.append(f"'{label}' is the same region as '{seen[d]}' (content id #{d}): their rows are equal by "
                         "construction")
        else:
            seen[d] = label
    return notes


def merged_shapes(records) -> dict:
    shapes: dict = {}
    for record in records:
        for name, shape in record.shapes.items():
            shape = tuple(shape)
            if name in shapes and shapes[name] != shape:
                raise RegionError(f"the regions were made for different models: {name} has shape {list(shapes[name])} "
                                  f"in one and {list(shape)} in another")
            shapes[name] = shape
    return shapes


def region_spec(records) -> list[GraftableSpec]:
    """Graftable sets to try for these regions: the one recorded by localize (it matches a cached
    pair), then the exact tensor names of the files."""
    exact = GraftableSpec(include_embeddings=True, names=tuple(merged_shapes(records)))
    recorded = [r.meta.get("graftable_spec") for r in records]
    if recorded and all(isinstance(d, dict) for d in recorded) and all(d == recorded[0] for d in recorded):
        d = recorded[0]
        try:
            spec = GraftableSpec(include_embeddings=bool(d.get("include_embeddings", False)),
                                 modules=tuple(d["modules"]) if d.get("modules") else None,
                                 names=tuple(d["names"]) if d.get("names") else None)
            return [spec, exact]
        except (TypeError, ValueError):
            pass
    return [exact]


def pair_for_regions(base, finetuned, records, guard: Guard, progress=None, cancel=None,
                     options: LoadOptions | None = None) -> ModelPair:
    """The pair whose graftable tensors are exactly those the regions were made over, read with their prompt."""
    specs = region_spec(records)
    options = options or regions.recorded_options(records[0].meta)
    labels = regions.recorded_labels(records[0].meta)
    pair = get_pair(base, finetuned, specs[0], guard, progress, cancel, options, labels)
    if len(specs) > 1 and set(pair.graftable) != set(merged_shapes(records)):
        pair = get_pair(base, finetuned, specs[1], guard, progress, cancel, options, labels)
    return pair


def recorded_request(record: RegionRecord) -> dict:
    req = record.meta.get("request")
    return req if isinstance(req, dict) else {}


def recorded_spec(record: RegionRecord):
    """The data columns a region's own task was read with."""
    from .data import DataSpec

    req = recorded_request(record)
    old = record.meta.get("data_spec") if isinstance(record.meta.get("data_spec"), dict) else {}
    pick = lambda k: req.get(k) or old.get(k)  # noqa: E731
    return DataSpec(config=pick("config"), text_column=pick("text_column"), pair_column=pick("pair_column"),
                    label_column=pick("label_column"))


def finish(progress: Progress | None) -> None:
    if progress:
        progress({"stage": "done", "fraction": 1.0})


# -- results ---------------------------------------------------------------------------------------
@dataclass
class Result:
    request: Request
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in self._private()}
        out["request"] = self.request.as_dict()
        return json.loads(json.dumps(out, default=_plain))

    def _private(self) -> set[str]:
        return set()

    def save(self, path) -> Path:
        """A JSON report with the request that made it (``graftui run`` makes it again); a ``.zip``
        path gets the report bundle (bundle.py: README, tables as CSV/JSON, figures as HTML)."""
        if str(path).lower().endswith(".zip"):
            from . import bundle

            return bundle.write(self.request.as_dict(), self.as_dict(), path)
        doc = {"graftui_version": __version__, "request": self.request.as_dict(), "result": self.as_dict()}
        return regions.atomic_write(Path(path).expanduser(), lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=2)))


def _plain(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


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

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["test_accuracy_ci"] = card.wilson(self.test_accuracy, self.test_examples)
        out["card"] = card.finetune_card(out)
        return out


def finetune(req: FinetuneRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> FinetuneResult:
    """Fine-tune ``req.base`` on ``req.task``; the default folder is per recipe and reused."""
    from . import training

    req.validate()
    start = time.time()
    config = req.recipe()
    check_model_ref(req.base)
    task = get_task(req.task, req.data_spec(), guard)
    allow = guard.allow_local(models=[req.base])
    options = req.load_options()
    reused = False
    if req.out:
        out = Path(req.out).expanduser()
    else:
        key = f"{slug(req.base)}-{slug(task.name)}"
        reading = {k: v for k, v in options.as_dict().items() if k != "device_map"}
        if reading != {k: v for k, v in LoadOptions().as_dict().items() if k != "device_map"}:
            key += "-" + hashlib.sha256(json.dumps(reading, sort_keys=True).encode()).hexdigest()[:6]
        out = default_checkpoint_dir(key, config)
        reused = (out / "config.json").exists()
    if not reused:
        def step(p):
            if progress:
                progress({"stage": f"fine-tuning on {task.name}", **asdict(p)})

        training.finetune(req.base, task, config, out, progress=step, cancel=cancel, allow_local=allow,
                          request=req.as_dict(), options=options)
    if progress:
        progress({"stage": "testing", "fraction": 0.99})
    from types import SimpleNamespace

    model, tokenizer, _, _ = training.load_trainable(str(out), task.label_names, LoadOptions(head=options.head,
                                                                                          dtype=options.dtype))
    checkpoint = SimpleNamespace(model=model.eval().to(settings.device()), tokenizer=tokenizer)
    probs, labels = scoring.predict(checkpoint, task, "test", req.test_examples)
    accuracy, n = scoring.metrics.accuracy(probs, labels), len(labels)
    chance = float(labels.bincount().max()) / n if n else None  # always answering the most frequent class
    notes = [f"fine-tuned through its prompt: {tokenizer.prompt.describe()}"] if getattr(tokenizer, "prompt", None) else []
    finish(progress)
    return FinetuneResult(req, notes, time.time() - start, str(out), reused, task.name, accuracy, n, config.as_dict(),
                          chance)


# -- localize --------------------------------------------------------------------------------------
@dataclass
class LocalizeResult(Result):
    path: str = ""
    record: RegionRecord | None = None

    @property
    def k(self) -> int:
        return self.record.size

    @property
    def region(self):
        """The region γ as flat indices per graftable tensor."""
        return self.record.indices

    def save(self, path) -> Path:
        """Write the region (or skill patch) to ``path``."""
        return regions.save(self.record, Path(path).expanduser())

    def _private(self) -> set[str]:
        return {"record"}

    def as_dict(self) -> dict:
        out = super().as_dict()
        r = self.record
        a = count_anatomy(r.indices, r.shapes)
        top = sorted(a.by_module.items(), key=lambda kv: -kv[1])[:3]
        out.update({
            "kind": "patch" if r.is_patch else "region",
            "method": self.request.method,
            "task": self.request.task,
            "k": r.size,
            "graftable_params": r.graftable,
            "total_params": int(r.meta.get("total_params") or r.graftable),
            "fraction_of_graftable": r.size / max(r.graftable, 1),
            "fraction_of_all": r.size / max(int(r.meta.get("total_params") or r.graftable), 1),
            "top_modules": [{"module": m, "label": MODULE_LABELS.get(m, m), "count": c, "share": c / max(r.size, 1)}
                            for m, c in top if c],
            "weights": a.weight_count,
            "biases": a.bias_count,
            "meta": json.loads(json.dumps(r.meta, default=_plain)),
        })
        out["card"] = card.localize_card(out)
        return out


def _examples_per_class(req, task: Task, notes: list[str]) -> int:
    """The k-shot size: as asked (and checked), or by default up to 256, all there are when fewer."""
    counts: dict[int, int] = {}
    for y in task.splits["train"].labels:
        counts[y] = counts.get(y, 0) + 1
    if not counts:
        raise DataError(f"task '{task.name}' has no training examples")
    fewest = min(counts.values())
    if req.examples_per_class is not None:
        if req.examples_per_class > fewest:
            short = min(counts, key=lambda c: counts[c])
            raise DataError(f"--examples-per-class {req.examples_per_class} is too large for task '{task.name}': "
                            f"class {task.label_names[short]} has only {fewest} training examples")
        return req.examples_per_class
    if fewest < DEFAULT_EXAMPLES_PER_CLASS:
        notes.append(f"task '{task.name}' has only {fewest} training examples in its smallest class: mask learning "
                     f"uses {fewest} per class (default {DEFAULT_EXAMPLES_PER_CLASS})")
        return fewest
    return DEFAULT_EXAMPLES_PER_CLASS


def kshot_batches(pair: ModelPair, task: Task, req, notes: list[str], seed_offset: int = 0):
    """Mask learning's data: the k-shot training sample of ``task`` and ``make_batches(epoch)`` over it."""
    from .data import batches

    config = req.learn_config()
    train = kshot(task.splits["train"], _examples_per_class(req, task, notes), config.seed)

    def make_batches(epoch: int):
        return batches(pair.tokenizer, train, config.batch_size, task.max_length,
                       shuffle_seed=config.seed + seed_offset + epoch)

    return make_batches, len(train)


def ood_tasks(req, task_ref: str, task: Task, guard: Guard, notes: list[str]) -> list[Task]:
    """The request's out-of-distribution tasks, in ``task``'s label space (a note for each mapping by position)."""
    out = []
    mapping = req.label_map()
    for ref in req.ood_tasks(task_ref):
        other, note = scoring.align_labels(task, get_task(ref, _default_spec(), guard), mapping)
        out.append(other)
        if note:
            notes.append(note)
    return out


def find_region(req, pair: ModelPair, task: Task | None, k: int, notes: list[str], progress=None, cancel=None):
    """Run ``req.method`` at budget k on ``pair``; returns the region and the metadata to record."""
    info = get_method(req.method)
    config = req.learn_config()
    make_batches, n_train = None, 0
    if info.needs_data:
        scoring.check_labels(pair, task)
        make_batches, n_train = kshot_batches(pair, task, req, notes)

    def on_step(report) -> None:
        progress({"stage": "mask learning", "k": k, **asdict(report)})

    region, _ = run_method(pair, Budget(k=k), req.method, make_batches=make_batches, config=config,
                           progress=on_step if progress else None, cancel=cancel)  # no one to report to: no count
    meta = {
        "method": req.method,
        "task": req.task,
        "budget": req.budget().describe(),
        "budget_k": k,
        "sparsity": req.sparsity if req.k is None else None,
        "train_examples": n_train,
        "learn": config.as_dict() if info.needs_data else None,
        "graftable_spec": asdict(req.graftable_spec()),
    }
    return region, meta


def region_record(req: LocalizeRequest, pair, region, meta: dict, notes: list[str], seconds: float) -> RegionRecord:
    """What a region file holds: the region, its settings and the request that re-makes it (and its patch)."""
    if req.method == "learned":  # it starts from top-movement: how far did mask learning move it?
        start_region = method.base_region(pair.pre, pair.ft, list(pair.graftable), region_size(region))
        meta["top_movement_overlap"] = sets.overlap(start_region, region)
    meta.update({"request": req.as_dict(), "notes": list(notes), "seconds": round(seconds, 3)})
    record = regions.make_record(pair, region, meta)
    return record if req.region_only else regions.with_patch(pair, record)


def localize(req: LocalizeRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> LocalizeResult:
    """Find the region of ``req.finetuned`` that carries ``req.task``, and save it."""
    req.validate()
    start = time.time()
    info = get_method(req.method)
    for ref in (req.base, req.finetuned):
        check_model_ref(ref)
    task = get_task(req.task, req.data_spec(), guard) if info.needs_data else None
    notes: list[str] = []
    if task is not None:
        _examples_per_class(req, task, [])  # a bad k-shot size fails before any model is loaded
    options = req.load_options()
    if task is None and not is_default_finetuned(req.finetuned) and \
            pair_kind(req.finetuned, options, allow_local=guard.allow_local(models=[req.finetuned])) != "classifier":
        task = get_task(req.task, req.data_spec(), guard)  # a language model's label words follow the task's labels
    pair = get_pair(req.base, req.finetuned, req.graftable_spec(), guard, progress, cancel, options,
                    task.label_names if task else None)
    notes += prompt_notes(pair)
    k = req.budget().resolve(pair.counts()["graftable"])
    if progress:
        progress({"stage": f"budget k = {k:,}", "k": k})
    region, meta = find_region(req, pair, task, k, notes, progress, cancel)
    record = region_record(req, pair, region, meta, notes, time.time() - start)
    out = Path(req.out).expanduser() if req.out else new_path(
        settings.subdir("regions"), f"{short_ref(req.task)}-{req.method}-k{record.size}", ".safetensors")
    world = data_parallel()
    if world is None or world.rank == 0:  # several processes learn one region; one writes it
        regions.save(record, out)
    finish(progress)
    return LocalizeResult(req, notes, time.time() - start, str(out), record)


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
    regions: dict = field(default_factory=dict)
    card: list[str] = field(default_factory=list)  # the result in sentences (card.py)
    side_by_side: dict | None = None  # two or more regions: their overlap and where each lies (side_by_side)


def _merge_patches(records, labels):
    """One patch holding every given patch's values, so each graft is exact on one pair."""
    sources = {r.meta.get("finetuned_sha256") or r.meta.get("finetuned") for r in records}
    if len(sources) > 1:
        raise RegionError("the patches come from different fine-tuned models; give --finetuned, or evaluate them one "
                          "at a time")
    shapes = merged_shapes(records)
    if len(records) == 1:
        return records[0]
    contributions = [sets.Contribution(label, r.indices, r.values) for label, r in zip(labels, records)]
    indices, values, _ = sets.union_values(contributions, {}, "first")
    return RegionRecord(indices, shapes, dict(records[0].meta), values, records[0].head)


def _loadable(ref: str | None) -> bool:
    if not ref or is_default_finetuned(ref):
        return bool(ref)
    try:
        resolve(ref)
        return True
    except ModelError:
        return False


def evaluate(req: EvaluateRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> EvaluateResult:
    """FT, the pre-trained body with FT's head and every region's graft, in and out of distribution."""
    req.validate()
    start = time.time()
    records = [load_region(p) for p in req.regions]
    labels = labels_for(req.regions, records)
    merged_shapes(records)
    first = records[0].meta if records else {}
    notes: list[str] = same_regions(labels, records)
    base = req.base or first.get("base") or DEFAULT_BASE
    task_ref = req.task or first.get("task") or DEFAULT_TASK
    spec = req.data_spec() if (req.task or not records) else recorded_spec(records[0])
    finetuned = req.finetuned
    from_patch = False
    if finetuned is None:
        recorded = {r.meta.get("finetuned") for r in records}
        if len(recorded) > 1 and not all(r.is_patch for r in records):
            raise RegionError("the regions come from different fine-tuned models; give --finetuned, or evaluate them "
                              "one at a time")
        finetuned = recorded.pop() if len(recorded) == 1 else (None if records else DEFAULT_FINETUNED)
        if not _loadable(finetuned):
            if not (records and all(r.is_patch for r in records)):
                raise ModelError(f"the fine-tuned model '{finetuned}' the regions were made from cannot be loaded here; "
                                 "give --finetuned REF")
            from_patch = True
    if from_patch and req.baselines:
        raise RequestError("--baselines needs the fine-tuned checkpoint (--finetuned REF): a skill patch holds only "
                           "its own region")
    check_model_ref(base)
    if not from_patch:
        check_model_ref(finetuned)
    task = get_task(task_ref, spec, guard)
    oods = ood_tasks(req, task_ref, task, guard, notes)
    options = req.load_options(regions.recorded_options(first) if records else None)
    if from_patch:
        if progress:
            progress({"stage": f"loading {short_ref(base)} with the patch"})
        pair = guard.checked_pair(regions.pair_from_patch(base, _merge_patches(records, labels), options,
                                                          allow_local=guard.allow_local(models=[base])))
        if not options.device_map:
            pair.to(settings.device())
        notes.append(f"the fine-tuned model '{first.get('finetuned')}' cannot be loaded here: '{scoring.FT_LABEL}' is "
                     "rebuilt from the patch (equal to the fine-tuned model inside the region only); give --finetuned "
                     "for the real one")
    elif records:
        pair = pair_for_regions(base, finetuned, records, guard, progress, cancel, options)
    else:
        pair = get_pair(base, finetuned, GraftableSpec(), guard, progress, cancel, options, task.label_names)
    notes += prompt_notes(pair)
    for path, record in zip(req.regions, records):
        try:
            regions.check_fits(record, pair)
        except RegionError as err:
            raise RegionError(f"'{path}': {err}") from None
    models = {label: record.indices for label, record in zip(labels, records)}
    kinds = {label: record.meta.get("method") for label, record in zip(labels, records)}
    start_overlap = {label: r.meta["top_movement_overlap"] for label, r in zip(labels, records)
                     if isinstance(r.meta.get("top_movement_overlap"), (int, float))}
    if req.baselines:
        budgets = sorted({r.size for r in records}) or [Budget(sparsity=req.sparsity).resolve(pair.counts()["graftable"])]
        for k in budgets:
            if progress:
                progress({"stage": f"building baselines at k = {k:,}"})
            for label, region in scoring.baseline_regions(pair, k, seed=req.seed).items():
                name = next(n for n in ("top-movement", "random") if get_method(n).label == label)
                label = f"{label} k={k:,}" if len(budgets) > 1 else label
                label = f"{label} (baseline)" if label in models else label
                models[label], kinds[label] = region, name
                if name == "top-movement":
                    for own, record in zip(labels, records):
                        if record.size == k and record.meta.get("method") == "learned":
                            start_overlap.setdefault(own, sets.overlap(region, record.indices))
    comparison = scoring.compare(pair, task, models, ood=oods, n=req.n, seed=req.seed, progress=progress, cancel=cancel)
    result = comparison.as_dict()
    for row in result["rows"]:
        row["method"] = kinds.get(row["model"])
    card.annotate(result["rows"])
    if from_patch:
        ft_name = f"{scoring.FT_LABEL} (from patch)"
        for row in result["rows"]:
            if row["model"] == scoring.FT_LABEL:
                row["model"] = ft_name
        for table in (result["reliability"], result["histogram"]):
            table[ft_name] = table.pop(scoring.FT_LABEL)
    side = side_by_side(labels, records) if len(records) > 1 else None
    finish(progress)
    lines = card.evaluate_card(result["rows"], graftable=pair.counts()["graftable"], start_overlap=start_overlap)
    if side:
        lines += card.compose_card({**side, "graftable_params": pair.counts()["graftable"], "rows": []})
    return EvaluateResult(req, notes, time.time() - start, **result, base=base,
                          finetuned=None if from_patch else finetuned,
                          regions={label: str(p) for label, p in zip(labels, req.regions)}, card=lines,
                          side_by_side=side)


def _default_spec():
    from .data import DataSpec

    return DataSpec()


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

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["card"] = card.sweep_card(out)
        return out


def sweep(req: SweepRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> SweepResult:
    """Accuracy, ECE and OOD accuracy against budget for several methods (Fig. 2, Tables 6–7); writes no file."""
    req.validate()
    start = time.time()
    for ref in (req.base, req.finetuned):
        check_model_ref(ref)
    task = get_task(req.task, req.data_spec(), guard)
    notes: list[str] = []
    oods = ood_tasks(req, req.task, task, guard, notes)
    methods = list(dict.fromkeys(req.methods))
    if any(get_method(m).needs_data for m in methods):
        _examples_per_class(req, task, [])
    pair = get_pair(req.base, req.finetuned, req.graftable_spec(), guard, progress, cancel, req.load_options(),
                    task.label_names)
    scoring.check_labels(pair, task)
    notes += prompt_notes(pair)

    def score(region):
        """(metrics in distribution, {OOD task: accuracy}) of a graft; ``None`` is the fine-tuned model."""
        with (pair.finetuned() if region is None else pair.grafted(region)):
            own = scoring.metrics.metrics(*scoring.predict(pair, task, "test", req.n))
            return own, {o.name: scoring.metrics.accuracy(*scoring.predict(pair, o, "test", req.n)) for o in oods}

    ft, ft_ood = score(None)
    bare, _ = score({})
    graftable = pair.counts()["graftable"]
    rows = []
    sparsities = sorted(set(req.sparsities))
    total = len(sparsities) * len(methods)
    for i, s in enumerate(sparsities):
        k = Budget(sparsity=s).resolve(graftable)
        for j, name in enumerate(methods):
            if progress:
                progress({"stage": f"{name} at sparsity {s:g}", "fraction": (i * len(methods) + j) / total})
            one = LocalizeRequest(**{f.name: getattr(req, f.name) for f in fields(LocalizeRequest) if hasattr(req, f.name)},
                                  method=name, sparsity=s)
            began = time.time()
            region, meta = find_region(one, pair, task, k, notes, cancel=cancel)
            kept = None
            if req.keep:  # the region as a file that `graftui run` re-makes, like one from localize
                kept = new_path(Path(req.keep).expanduser(), f"{short_ref(req.task)}-{name}-k{region_size(region)}",
                                ".safetensors")
                regions.save(region_record(one, pair, region, meta, [], time.time() - began), kept)
            own, ood = score(region)
            rows.append({"method": name, "region": None if kept is None else str(kept), "sparsity": s,
                         "k": region_size(region), "n": own.n, "accuracy": own.accuracy,
                         "accuracy_ci": card.wilson(own.accuracy, own.n), "ece": own.ece,
                         "calibration": card.calibration(own.accuracy, own.mean_confidence), "ood": ood,
                         "ft_accuracy": ft.accuracy, "retained": own.accuracy / ft.accuracy if ft.accuracy else None,
                         "gain_recovered": card.gain_recovered(own.accuracy, ft.accuracy, bare.accuracy)})
    finish(progress)
    return SweepResult(req, list(dict.fromkeys(notes)), time.time() - start, rows, ft.accuracy, ft.ece, ft_ood, task.name,
                       [o.name for o in oods], bare.accuracy, ft.n)


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
            "kind": "patch" if r.is_patch else "region", "k": r.size, "graftable_params": r.graftable,
            "fraction_of_graftable": r.size / max(r.graftable, 1), "by": self.request.by,
            "weights": {"count": a.weight_count, "total": a.weight_total},
            "biases": {"count": a.bias_count, "total": a.bias_total},
            "layers": list(a.layers), "modules": list(a.modules), "counts": a.counts, "totals": a.totals,
            "density": a.density, "by_module": a.by_module, "by_layer": dict(zip(a.layers, a.by_layer)),
            "cells": a.to_rows(), "meta": json.loads(json.dumps(r.meta, default=_plain)),
        })
        return out


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
            from .models import checkpoint_kind, load_classifier, load_lm

            if self.progress:
                self.progress({"stage": f"loading {short_ref(self.ref)} to average overlapping values"})
            kind = checkpoint_kind(self.ref, allow_local=self.allow_local)
            model = load_classifier(self.ref, allow_local=self.allow_local)[0] if kind == "classifier" else \
                load_lm(self.ref, kind, allow_local=self.allow_local)
            self._params = {n: p.detach() for n, p in model.named_parameters()}
        if name not in self._params:
            raise RegionError(f"base '{self.ref}' has no parameter {name}; pass the base the patches were made for")
        return self._params[name]


def _as_patch(record: RegionRecord, guard: Guard, progress=None, cancel=None) -> RegionRecord:
    """A skill patch from a region: values read from its own recorded fine-tuned checkpoint."""
    if record.is_patch:
        return record
    base, finetuned = record.meta.get("base"), record.meta.get("finetuned")
    if not _loadable(finetuned):
        raise RegionError(f"a region without values needs its fine-tuned model '{finetuned}', which cannot be loaded here")
    pair = pair_for_regions(base, finetuned, [record], guard, progress, cancel)
    regions.check_fits(record, pair)
    return regions.with_patch(pair, record)


def compose(req: ComposeRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> ComposeResult:
    """Overlap and union of regions; with ``evaluate``, the union graft scored on every region's task."""
    req.validate()
    start = time.time()
    records = [load_region(p) for p in req.regions]
    names = labels_for(req.regions, records)
    shapes = merged_shapes(records)
    bases = {r.meta.get("base") for r in records}
    base = req.base or (next(iter(bases)) if len(bases) == 1 else None) or DEFAULT_BASE
    matrix = sets.overlap_matrix({n: r.indices for n, r in zip(names, records)})
    union_size = sets.region_size(sets.union(*(r.indices for r in records)))
    graftable = sum(math.prod(s) for s in shapes.values())
    rows: list[dict] = []
    report = None
    union_idx = union_val = None
    if req.evaluate:
        records = [_as_patch(r, guard, progress, cancel) for r in records]
        scoring.check_composable(records)
        tasks = [get_task(r.meta.get("task") or DEFAULT_TASK, recorded_spec(r), guard) for r in records]
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
            rows += scoring.evaluate_on_pair(pair, task, record, name, union_idx, union_val, n=req.n)
            del pair
    written = None
    if req.out is not None:
        all_patches = all(r.is_patch for r in records)
        meta = {k: v for k, v in records[0].meta.items() if k not in {"seconds", "learn", "budget", "budget_k", "notes"}}
        meta.update({
            "method": "union", "sources": list(req.regions), "source_methods": [r.meta.get("method") for r in records],
            "task": "+".join(dict.fromkeys(str(r.meta.get("task", "?")) for r in records)),
            "k": union_size, "graftable_params": graftable, "fraction_of_graftable": union_size / max(graftable, 1),
            "library_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "request": req.as_dict(),
        })
        if meta.get("total_params"):
            meta["fraction_of_all"] = union_size / meta["total_params"]
        if len({r.meta.get("finetuned_sha256") for r in records}) > 1:
            meta["finetuned_sha256"] = None
            meta["finetuned"] = "several"
        if all_patches:
            if union_idx is None:
                pre = _LazyBase(base, shapes, guard.allow_local(models=[base]), progress)
                union_idx, union_val, report = sets.union_values(
                    [sets.Contribution(n, r.indices, r.values) for n, r in zip(names, records)], pre, req.resolve)
            meta.update({"resolve": req.resolve, "overlap_params": report["overlap_params"]})
            record = RegionRecord(union_idx, shapes, meta, union_val, records[0].head)
        else:
            record = RegionRecord(sets.union(*(r.indices for r in records)), shapes, meta)
        out = Path(req.out).expanduser()
        regions.save(record, out)
        written = {"path": str(out), "kind": "patch" if record.is_patch else "region", "k": record.size}
    finish(progress)
    return ComposeResult(req, same_regions(names, records), time.time() - start, names, list(req.regions),
                         ["patch" if r.is_patch else "region" for r in records], matrix["sizes"],
                         matrix["intersection_counts"], matrix["overlap"], matrix["iou"], union_size, graftable, report,
                         rows, written)


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


def export(req: ExportRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> ExportResult:
    """θ_pre + γ⊙(θ_ft − θ_pre) as a normal Hugging Face checkpoint folder."""
    req.validate()
    start = time.time()
    path = req.region or str(latest_region())
    record = load_region(path)
    base = req.base or record.meta.get("base") or DEFAULT_BASE
    if req.finetuned is None and not record.is_patch:
        raise RegionError(f"'{path}' is a region without values: give --finetuned REF to export it, or use a skill patch")
    out = Path(req.out).expanduser() if req.out else new_path(settings.subdir("exports"), Path(path).stem)
    check_model_ref(base)
    if req.finetuned is not None:
        check_model_ref(req.finetuned)
    if progress:
        progress({"stage": "loading models", "fraction": 0.1})
    options = req.load_options(regions.recorded_options(record.meta))
    if req.finetuned is None:
        pair = guard.checked_pair(regions.pair_from_patch(base, record, options,
                                                          allow_local=guard.allow_local(models=[base])))
    else:
        pair = pair_for_regions(base, req.finetuned, [record], guard, progress, cancel, options)
        regions.check_fits(record, pair)
    if progress:
        progress({"stage": "writing the grafted checkpoint", "fraction": 0.5})
    record.meta["export_request"] = req.as_dict()
    regions.export_graft(pair, record, out)
    finish(progress)
    return ExportResult(req, [], time.time() - start, str(out), str(path), base,
                        req.finetuned or f"patch:{record.meta.get('finetuned', '?')}", record.size, list(pair.label_names),
                        architecture(pair.model))


# -- one entry point for every verb ----------------------------------------------------------------
FLOWS: dict[str, Callable] = {"finetune": finetune, "localize": localize, "evaluate": evaluate, "sweep": sweep,
                              "anatomy": anatomy, "compose": compose, "export": export}
from . import experiments, hub, reproduction  # noqa: E402,F401  (add the paper's experiments, the Hub push and the report to FLOWS)


def run(req: Request, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> Result:
    """Run any request with the flow of its verb."""
    return FLOWS[req.verb](req, progress=progress, cancel=cancel, guard=guard)


def read_request(path, out: str | None = None) -> Request:
    """The request in a config (JSON or YAML), a report, a region file or a checkpoint folder.

    A request read back from a file graftui wrote gets a new output place (``out``, or the
    default), never the file it was read from.
    """
    p = Path(str(path)).expanduser()
    if not p.exists():
        raise RequestError(f"no file at '{path}'")
    written = True
    if p.is_dir():
        record = p / "graftui_record.json"
        if not record.exists():
            raise RequestError(f"'{path}' is a folder without a graftui_record.json; give a config, report or region file")
        data = json.loads(record.read_text()).get("request")
    elif p.suffix.lower() == ".safetensors":
        data = load_region(str(p)).meta.get("request")
    else:
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise RequestError(f"cannot read '{path}': {err}") from None
        try:
            if p.suffix.lower() in {".yaml", ".yml"}:
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except Exception as err:  # noqa: BLE001 - any parse error is the file's
            raise RequestError(f"'{path}' is not valid {'YAML' if p.suffix.lower() in {'.yaml', '.yml'} else 'JSON'}: "
                               f"{str(err).splitlines()[0]}") from None
        written = isinstance(data, dict) and "request" in data
        if written:
            data = data["request"]
    if not isinstance(data, dict):
        raise RequestError(f"'{path}' holds no graftui request: a config is a mapping with a 'verb' and its fields "
                           "(files graftui wrote hold theirs)")
    request = from_dict(data)
    if type(request).writes and (out is not None or written):
        request = request.replace(out=out)
    return request


def run_file(path, out: str | None = None, progress: Progress | None = None, cancel=None,
             guard: Guard = LOCAL) -> Result:
    """``graftui run FILE``: run the request a file holds, again."""
    return run(read_request(path, out), progress, cancel, guard)
