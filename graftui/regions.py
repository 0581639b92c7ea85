"""Regions on disk: safetensors files of flat indices, optionally with values (a skill patch).

Layout of a file (all tensors little-endian, as safetensors writes them):

    idx/<param>   int64 [k_p]   sorted flat indices of <param> inside the region
    val/<param>   float32 [k_p] fine-tuned values at those indices          (skill patch only)
    head/<param>  float32       parameters only the fine-tuned model has    (skill patch only)

and string metadata ``graftui_format`` (version), ``kind`` (``region`` | ``patch``), ``shapes``
(JSON: every graftable parameter's shape), ``region_digest`` (the content id of the indices) and
``meta`` (JSON of :class:`RegionMeta`: references, hashes, task, method, budget, counts,
hyper-parameters, the request, library version, time).

A patch rebuilds the graft bit-exactly from the base alone: base + patch = θ_pre + γ⊙δ.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from . import settings, tracking
from .config import FT_LABEL, HEADS, MAX_ABS_VALUE, GraftableSpec, LoadOptions, is_body
from .errors import RegionError, RequestError, first_line
from .weights import take
from .method import Region, region_size
from .metrics import mean_std
from .models import ModelPair, architecture, load_reader, pair_kind
from .paths import atomic_dir, atomic_write, file_lock, short_ref
from .version import __version__

FORMAT_VERSION = "1"
MAX_FILE_BYTES = 2 << 30  # a region file larger than this is not one we wrote
MAX_LABELS = 10_000


# -- what a region file says about itself ---------------------------------------------------------
_TYPES: dict[str, tuple] = {}  # field -> the JSON types its value may have (filled below from the annotations)


@dataclass
class RegionMeta(MutableMapping):
    """The one schema of a region file's ``meta``: where the region came from, what it is, how it was made.

    Written by :func:`make_record` (the one writer) and read back by :meth:`from_dict`, which checks
    every field's type (region files are untrusted); the typed readers below (:func:`recorded_options`,
    :func:`recorded_labels`, …) turn it into what the library uses. It also reads like the JSON
    mapping it is stored as (``meta["task"]``), and keys it does not know are kept in ``extra`` so a
    file from a newer graftui loses nothing.
    """

    # the pair
    base: str | None = None
    finetuned: str | None = None
    base_sha256: str | None = None
    finetuned_sha256: str | None = None  # sha256 of the fine-tuned weights the region (and a patch's values) came from
    architecture: str | None = None
    labels: list | None = None
    loading: dict | None = None  # how the pair was read (LoadFields names): its prompt, reused by later verbs
    prompt: dict | None = None  # prompts.Prompt.as_dict() of a language model
    # the region
    method: str | None = None
    task: str | None = None
    task_files: dict | None = None  # sha256 of each file the task was read from (a harness YAML, its includes), by path
    k: int | None = None
    graftable_params: int | None = None
    total_params: int | None = None
    fraction_of_graftable: float | None = None
    fraction_of_all: float | None = None
    budget: str | None = None
    budget_k: int | None = None
    sparsity: float | None = None
    train_examples: int | None = None
    learn: dict | None = None  # LearnConfig.as_dict() of a learned region
    learner: dict | None = None  # how it was learned: the memory plan (full or candidate learner) and C's size, rule, growth
    graftable_spec: dict | None = None  # GraftableSpec.as_dict() the region was learned over
    curve: list | None = None  # the mask-learning curve: [step, loss, training-batch accuracy] per step (``curve_points``)
    top_movement_overlap: float | None = None  # share of a learned region inside the top-movement region it started from
    size_search: dict | None = None  # localize --keep: the share asked, the k found and the curve of share against k
    nested_from: int | None = None  # localize --schedule nested: the k of the region it was learned inside
    tracker: dict | None = None  # --report-to: {report_to, where, project} keeping the run, named after the region
    # how it was made
    request: dict | None = None  # the request that makes it again (graftui run FILE)
    notes: list | None = None
    seconds: float | None = None
    library_version: str | None = None
    created: str | None = None
    format: str = FORMAT_VERSION
    # regions of a multi-task model (§5.1)
    start: str | None = None
    multitask_checkpoint: str | None = None
    group: list | None = None
    # a union of regions (compose)
    sources: list | None = None
    source_methods: list | None = None
    resolve: str | None = None
    overlap_params: int | None = None
    # a region uploaded in the app and checked against a pair
    original_base: str | None = None
    original_finetuned: str | None = None
    uploaded_as: str | None = None
    export_request: dict | None = None  # the export that wrote a checkpoint from it
    data_spec: dict | None = None  # the data columns, in files written before requests recorded them
    extra: dict = field(default_factory=dict)  # keys this version does not know

    # -- the JSON mapping -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data, file: str = "the region file") -> "RegionMeta":
        """The schema from a header's JSON; a field of the wrong type is a RegionError naming it."""
        if isinstance(data, RegionMeta):
            return data
        if not isinstance(data, Mapping):
            raise RegionError(f"'{file}' has unreadable metadata (not a JSON object)")
        known, extra = {}, {}
        for key, value in data.items():
            if key not in _TYPES:
                extra[str(key)] = value
            elif value is not None and not (isinstance(value, _TYPES[key]) and not (
                    isinstance(value, bool) and bool not in _TYPES[key])):
                raise RegionError(f"'{file}' has a malformed '{key}' in its metadata ({type(value).__name__}): "
                                  "a damaged or edited header")
            else:
                known[key] = value
        return cls(**known, extra=extra)

    def as_dict(self) -> dict:
        """The JSON object written into the file: every field that is set, and the unknown keys."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}

    def __getitem__(self, key: str):
        if key in _TYPES:
            value = getattr(self, key)
            if value is None:
                raise KeyError(key)
            return value
        return self.extra[key]

    def __setitem__(self, key: str, value) -> None:
        if key in _TYPES:
            setattr(self, key, value)
        else:
            self.extra[key] = value

    def __delitem__(self, key: str) -> None:
        if key in _TYPES:
            if getattr(self, key) is None:
                raise KeyError(key)
            setattr(self, key, None)
        else:
            del self.extra[key]

    def __iter__(self):
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


_TYPES.update({f.name: {"str": (str,), "int": (int,), "float": (int, float), "list": (list,), "dict": (dict,)}[
    str(f.type).split(" ")[0].split("[")[0]] for f in fields(RegionMeta) if f.name != "extra"})


# -- typed readers --------------------------------------------------------------------------------
MAX_CURVE_POINTS = 400  # a region file keeps at most this many steps of its curve (evenly spread, the last kept)


def curve_of(reports: list[dict]) -> list[list]:
    """A region file's ``curve`` from mask learning's step reports: [step, loss, accuracy] each, rounded, and at
    most MAX_CURVE_POINTS of them."""
    points = [[int(r["step"]), round(float(r["loss"]), 6), round(float(r["accuracy"]), 4)] for r in reports]
    if len(points) > MAX_CURVE_POINTS:  # evenly spread, the first and the last kept
        last = len(points) - 1
        points = [points[round(i * last / (MAX_CURVE_POINTS - 1))] for i in range(MAX_CURVE_POINTS)]
    return [p for p in points if math.isfinite(p[1]) and math.isfinite(p[2])]  # JSON has no NaN


def curve_points(meta) -> list[dict]:
    """A region's recorded curve as step reports ({step, loss, accuracy}); points that are not three numbers are
    left out (region files are untrusted), and a region without a curve has none."""
    out = []
    for p in ((meta.curve if isinstance(meta, RegionMeta) else None) or [])[:MAX_CURVE_POINTS]:
        if (isinstance(p, list) and len(p) == 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                         and math.isfinite(v) for v in p)):
            out.append({"step": p[0], "loss": p[1], "accuracy": p[2]})
    return out


def recorded_options(meta, **overrides) -> LoadOptions:
    """The LoadOptions a region was made with (its prompt), with ``overrides`` on top.

    Only the prompt is read (dtype and placement are the reader's), and only values of the right kind.
    """
    meta = RegionMeta.from_dict(meta)
    loading = meta.loading or {}
    known = {"head", "template", "label_words", "label_scoring"}
    values = {k: v for k, v in loading.items() if k in known and isinstance(v, str)}
    if values.get("head") not in HEADS:
        values.pop("head", None)
    return LoadOptions(**{**values, **{k: v for k, v in overrides.items() if v is not None}})


def recorded_labels(meta) -> tuple[str, ...] | None:
    """A region's recorded label names: a list of strings, or a RegionError (region files are untrusted)."""
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if labels is None or labels == []:
        return None
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels) or len(labels) > MAX_LABELS:
        raise RegionError("the region file's 'labels' are not a list of label names")
    return tuple(labels)


def recorded_spec(meta) -> GraftableSpec | None:
    """The graftable set a region was learned over, when it recorded one."""
    return GraftableSpec.from_dict(RegionMeta.from_dict(meta).graftable_spec)


def settings_of(meta) -> list[str]:
    """The settings that tell two runs of one method apart: steps, examples, learning rate, seed, learner; sources of a
    union."""
    meta = RegionMeta.from_dict(meta)
    learn, out = meta.learn, []
    if learn:
        lr = learn.get("lr")
        examples = "?" if meta.train_examples is None else meta.train_examples
        out += [f"{learn.get('steps')} steps", f"{examples} examples",
                f"lr {lr:g}" if isinstance(lr, (int, float)) else "lr ?",
                f"seeds {', '.join(map(str, learn['seeds']))}" if isinstance(learn.get("seeds"), list)  # a core, a union
                else f"seed {learn.get('seed')}"]
    how = meta.learner if isinstance(meta.learner, dict) else {}
    if how.get("learner") in ("full", "candidate"):  # the learner, which decides the region as much as the seed
        plan = how.get("plan") if isinstance(how.get("plan"), dict) else {}
        factor = plan.get("factor")
        inside = how.get("rule") == "within"
        out.append(f"{how['learner']} learner" + (" inside a larger region" if inside else
                                                  f" c={factor:.3g}" if how["learner"] == "candidate"
                                                  and isinstance(factor, (int, float)) else ""))
    if meta.method == "union" and meta.sources is not None:
        out.append(f"union of {len(meta.sources)}")
    return out


def describe(meta) -> str:
    """A region in one line: task · method · k · its settings."""
    meta = RegionMeta.from_dict(meta)
    k = meta.k
    task = "+".join(short_ref(t) for t in str(meta.task or "?").split("+"))  # a file by its name, never its folders
    return " · ".join([task, str(meta.method or "?"), f"k={k:,}" if isinstance(k, int) else "k=?", *settings_of(meta)])


# -- a region and its record ------------------------------------------------------------------------
@dataclass
class RegionRecord:
    """A region with everything needed to reproduce, inspect and re-apply it."""

    indices: Region
    shapes: dict[str, tuple[int, ...]]  # all graftable parameters, not only those in the region
    meta: RegionMeta = field(default_factory=RegionMeta)
    values: dict[str, torch.Tensor] | None = None  # fine-tuned values at ``indices`` (patch)
    head: dict[str, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.meta, RegionMeta):
            self.meta = RegionMeta.from_dict(dict(self.meta or {}))

    @property
    def size(self) -> int:
        return region_size(self.indices)

    @property
    def graftable(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())

    @property
    def is_patch(self) -> bool:
        return self.values is not None

    @property
    def kind(self) -> str:
        return "patch" if self.is_patch else "region"

    def summary(self) -> dict:
        m = self.meta
        return {
            "kind": self.kind,
            "size": self.size,
            "graftable": self.graftable,
            "fraction_of_graftable": self.size / max(self.graftable, 1),
            "tensors": len(self.indices),
            **{k: getattr(m, k) for k in ("method", "base", "finetuned", "task", "k", "budget") if getattr(m, k) is not None},
        }


def _fill(meta: RegionMeta, fields_: dict) -> None:
    for key, value in fields_.items():
        if key not in _TYPES:
            raise TypeError(f"a region record has no field '{key}'")
        setattr(meta, key, value)


def make_record(pair, indices: Region, fields_: dict | None = None) -> RegionRecord:
    """The one writer of a region's record: ``pair``'s standard metadata, then ``fields_`` (RegionMeta fields)."""
    counts = pair.counts()
    meta = RegionMeta(
        base=pair.base_ref, finetuned=pair.finetuned_ref, base_sha256=pair.hashes.get("base"),
        finetuned_sha256=pair.hashes.get("finetuned"), labels=list(pair.label_names), architecture=architecture(pair.model),
        loading=pair.loading_record(), prompt=pair.prompt.as_dict() if pair.prompt else None,
        k=region_size(indices), graftable_params=counts["graftable"], total_params=counts["total"],
        fraction_of_graftable=region_size(indices) / max(counts["graftable"], 1),
        fraction_of_all=region_size(indices) / max(counts["total"], 1),
        library_version=__version__, created=now_utc(), tracker=tracking.active(),
    )
    _fill(meta, fields_ or {})
    return RegionRecord(indices={n: i.cpu() for n, i in indices.items()}, shapes=pair.shapes, meta=meta)


PAIR_FIELDS = ("base", "finetuned", "base_sha256", "finetuned_sha256", "architecture", "labels", "loading", "prompt",
               "total_params", "graftable_spec")  # what a region made from others keeps of its source's record


def derived_record(source: RegionMeta, indices: Region, shapes: dict, fields_: dict, values=None, head=None) -> RegionRecord:
    """A record made from other regions (a union): ``source``'s pair, the counts of ``indices``, then ``fields_``."""
    size, graftable = region_size(indices), sum(math.prod(s) for s in shapes.values())
    meta = RegionMeta(**{key: getattr(source, key) for key in PAIR_FIELDS}, k=size, graftable_params=graftable,
                      fraction_of_graftable=size / max(graftable, 1), library_version=__version__,
                      created=now_utc(), tracker=tracking.active())
    meta.fraction_of_all = size / meta.total_params if meta.total_params else None
    _fill(meta, fields_)
    return RegionRecord(indices, shapes, meta, values, head)


def with_patch(pair, record: RegionRecord) -> RegionRecord:
    """The same region carrying the fine-tuned values and the head: a self-contained skill patch."""
    values = {n: take(pair.ft, n, i).detach().cpu().clone() for n, i in record.indices.items()}  # those values only
    head = {n: pair.param(n).detach().cpu().clone() for n in pair.head}
    return RegionRecord(record.indices, record.shapes, replace(record.meta, extra=dict(record.meta.extra)), values, head)


def digest(indices: Region) -> str:
    """A short id of a region's parameter set (not of its file): the same region has the same id."""
    h = hashlib.sha256()
    for name in sorted(indices):
        idx = indices[name].reshape(-1)
        if idx.numel():
            h.update(name.encode() + b"\0" + idx.to(torch.int64).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:8]


def save(record: RegionRecord, path: str | Path, exclusive: bool = False) -> Path:
    """Write a region file (``exclusive``: never over a file that exists, another run's included)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, idx in record.indices.items():
        tensors[f"idx/{name}"] = idx.to(torch.int64).contiguous()
        if record.values is not None:
            tensors[f"val/{name}"] = record.values[name].to(torch.float32).contiguous()
    for name, value in (record.head or {}).items():
        tensors[f"head/{name}"] = value.contiguous()
    metadata = {
        "graftui_format": FORMAT_VERSION,
        "kind": "patch" if record.is_patch else "region",
        "shapes": json.dumps({n: list(s) for n, s in record.shapes.items()}),
        "meta": json.dumps(record.meta.as_dict(), default=str),
        "region_digest": digest(record.indices),
    }
    if not tensors:  # safetensors needs one tensor; an empty region is still a valid answer
        tensors["empty"] = torch.zeros(0, dtype=torch.int64)
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), exclusive=exclusive)


# -- reading -----------------------------------------------------------------------------------
def load(path: str | Path) -> RegionRecord:
    """Read and validate a region file on its own terms (format, indices sorted and in bounds)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise RegionError(f"no region file at '{path}'")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise RegionError(f"'{path.name}' is too large to be a region file")
    try:
        with safe_open(str(path), framework="pt") as fh:
            metadata = fh.metadata() or {}
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}
    except Exception as err:  # noqa: BLE001 - any parse failure of an untrusted file
        raise RegionError(f"'{path.name}' is not a readable safetensors region file ({first_line(err)})") from err
    version = metadata.get("graftui_format")
    if version is None:
        raise RegionError(f"'{path.name}' is a safetensors file but not a graftui region (no format tag)")
    if version != FORMAT_VERSION:
        raise RegionError(f"'{path.name}' has region format {version}; this graftui reads format {FORMAT_VERSION}")
    try:
        shapes = {n: tuple(int(d) for d in s) for n, s in json.loads(metadata.get("shapes", "")).items()}
        meta = json.loads(metadata.get("meta", "{}"))
    except (ValueError, TypeError, AttributeError) as err:
        raise RegionError(f"'{path.name}' has unreadable metadata ({first_line(err)})") from err
    meta = RegionMeta.from_dict(meta, path.name)
    kind = metadata.get("kind", "region")
    indices, values, head = {}, {}, {}
    for key, tensor in tensors.items():
        group, _, name = key.partition("/")
        if group == "idx":
            indices[name] = tensor
        elif group == "val":
            values[name] = tensor
        elif group == "head":
            head[name] = tensor
        elif key != "empty":
            raise RegionError(f"'{path.name}' holds an unexpected tensor '{key}'")
    _check_totals(path.name, shapes, meta, indices)
    for name, idx in indices.items():
        _check_indices(path.name, name, idx, shapes)
        if kind == "patch":
            if name not in values or values[name].shape != idx.shape or not values[name].is_floating_point():
                raise RegionError(f"'{path.name}' is a patch without matching values for {name}")
    if kind == "patch" and set(values) - set(indices):
        raise RegionError(f"'{path.name}' has values for tensors outside its region")
    said = metadata.get("region_digest")
    if said is not None and said != digest(indices):
        raise RegionError(f"'{path.name}' says its region is #{said:.12} but its indices are #{digest(indices)}: the "
                          "file was altered after graftui wrote it; use the file as graftui wrote it")
    for group, tensors_ in (("values", values), ("head", head)):
        for name, tensor in tensors_.items():
            if not tensor.is_floating_point() or not tensor.numel():
                continue
            if not bool(torch.isfinite(tensor).all()):
                raise RegionError(f"'{path.name}' holds NaN or infinite {group} for {name}: not a usable skill patch")
            largest = float(tensor.abs().max())
            if largest > MAX_ABS_VALUE:
                raise RegionError(f"'{path.name}' holds {group} of magnitude {largest:.3g} for {name}, far beyond any trained "
                                  f"weight (at most {MAX_ABS_VALUE:g} here): not a usable skill patch")
    record = RegionRecord(indices, shapes, meta, values if kind == "patch" else None, head if kind == "patch" else None)
    return record


@dataclass(frozen=True)
class RegionHeader:
    """What a region file says about itself, read without its tensors (for listings)."""

    path: Path
    kind: str  # "region" | "patch"
    meta: RegionMeta
    digest: str  # content id of the indices (digest)


_DIGESTS: dict[tuple, str] = {}


def read_header(path: str | Path) -> RegionHeader | None:
    """The header of a region file; None when the file is not a readable graftui region."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata() or {}
        meta = RegionMeta.from_dict(json.loads(header.get("meta", "{}")), path.name)
    except Exception:  # noqa: BLE001 - an unreadable or forged file is simply not one of ours
        return None
    if "graftui_format" not in header:
        return None
    # the id is computed from the indices, never taken from the header: scores are kept under it, and a header can lie
    return RegionHeader(path, header.get("kind", "region"), meta, _indices_digest(path))


def _indices_digest(path: Path) -> str:
    """The content id of a file's indices (read once per file version: O(k))."""
    from safetensors import safe_open

    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _DIGESTS:
        try:
            with safe_open(str(path), framework="pt") as fh:
                _DIGESTS[key] = digest({k[4:]: fh.get_tensor(k) for k in fh.keys() if k.startswith("idx/")})
        except Exception:  # noqa: BLE001 - unreadable: no id
            _DIGESTS[key] = "?"
    return _DIGESTS[key]


MAX_GRAFTABLE = 10**13  # far beyond any model; a header claiming more is forged


def _check_totals(file: str, shapes: dict, meta: RegionMeta, indices: dict) -> None:
    """The header's totals must be the tensors' own: shapes of real sizes, and the recorded k and graftable
    count equal to what the indices and shapes hold (an inflated header would fake anatomy totals)."""
    if any(d < 1 for shape in shapes.values() for d in shape):
        raise RegionError(f"'{file}' has a graftable tensor of zero or negative size in its header")
    graftable = sum(math.prod(shape) for shape in shapes.values())
    if graftable > MAX_GRAFTABLE:
        raise RegionError(f"'{file}' claims {graftable:.3g} graftable parameters: its header is not a model's")
    size = sum(int(idx.numel()) for idx in indices.values())
    for key, actual, what in (("graftable_params", graftable, "its tensor shapes hold"), ("k", size, "its indices hold")):
        if key in meta and meta[key] != actual:
            raise RegionError(f"'{file}' says {key} = {meta[key]!r} but {what} {actual:,}: a damaged or edited header")
    if meta.total_params is not None and meta.total_params < graftable:
        raise RegionError(f"'{file}' says total_params = {meta.total_params:,}, fewer than its {graftable:,} graftable "
                          "parameters: a damaged or edited header")
    # the shares every listing prints are the tensors' own, never the header's word
    meta.fraction_of_graftable = size / max(graftable, 1)
    meta.fraction_of_all = size / meta.total_params if meta.total_params else None


def _check_indices(file: str, name: str, idx: torch.Tensor, shapes: dict) -> None:
    if name not in shapes:
        raise RegionError(f"'{file}' indexes {name}, which is not among its graftable tensors")
    if idx.dtype != torch.int64 or idx.dim() != 1:
        raise RegionError(f"'{file}': indices of {name} must be a 1-D int64 tensor")
    if idx.numel():
        bound = math.prod(shapes[name])
        if int(idx.min()) < 0 or int(idx.max()) >= bound:
            raise RegionError(f"'{file}': an index of {name} is outside its {bound} entries")
        if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
            raise RegionError(f"'{file}': indices of {name} are not sorted and unique")


def check_fits(record: RegionRecord, pair) -> None:
    """Refuse a region that was not made for this model: names and shapes must agree."""
    shapes = pair.shapes
    for name in record.indices:
        if name not in shapes:
            raise RegionError(f"the region indexes {name}, which this model has no graftable tensor named")
        if tuple(record.shapes[name]) != shapes[name]:
            raise RegionError(
                f"the region was made for {name} of shape {list(record.shapes[name])}, "
                f"this model's is {list(shapes[name])}"
            )
    if record.head:
        for name, value in record.head.items():
            if name not in dict(pair.model.named_parameters()):
                raise RegionError(f"the patch's head tensor {name} is not in this model")
            if tuple(value.shape) != tuple(pair.param(name).shape):
                raise RegionError(
                    f"the patch carries the head of '{record.meta.finetuned or '?'}' (task "
                    f"'{record.meta.task or '?'}', {name} of shape {list(value.shape)}), which does not fit this "
                    f"model's {list(pair.param(name).shape)}: use it with the base model "
                    f"'{record.meta.base or '?'}' and a task with the same labels")


# -- a pair from a patch, and export -------------------------------------------------------------
def pair_from_patch(base_ref: str, record: RegionRecord, options=None, **load_kwargs):
    """Base + patch as a ModelPair whose 'fine-tuned' values are the patch (exact inside the region)."""
    if not record.is_patch:
        raise RegionError("this file is a region without values: give the fine-tuned checkpoint too, or a skill patch")
    options = options or recorded_options(record.meta)
    labels = recorded_labels(record.meta)
    kind = pair_kind(base_ref, options, allow_local=load_kwargs.get("allow_local", True))
    base, tokenizer, new = load_reader(base_ref, kind, labels, options, **load_kwargs)
    finetuned, _, _ = load_reader(base_ref, kind, labels, options, tokenizer=tokenizer, **load_kwargs)
    prompt = getattr(tokenizer, "prompt", None)
    head_names = new | set(record.head or ())
    fixed = finetuned.head_names() if prompt else set()
    labels = prompt.labels if prompt else labels or ()
    params = dict(finetuned.named_parameters())
    spec = GraftableSpec(include_embeddings=True, names=tuple(record.shapes))
    with torch.no_grad():
        for name, value in (record.head or {}).items():
            if name not in params or params[name].shape != value.shape:
                raise RegionError(f"the patch's head tensor {name} does not fit base '{base_ref}'")
            params[name].data.copy_(value)
        for name, idx in record.indices.items():
            if name not in params:
                raise RegionError(f"the patch indexes {name}, which base '{base_ref}' does not have")
            if tuple(params[name].shape) != tuple(record.shapes[name]):
                raise RegionError(f"the patch was made for {name} of shape {list(record.shapes[name])}")
            params[name].data.view(-1)[idx] = record.values[name].to(params[name].dtype)
    pair = ModelPair.from_models(base, finetuned, tokenizer, head_names, spec, base_ref,
                                 f"patch:{record.meta.finetuned or '?'}", labels, fixed)
    pair.read_as(prompt, options)
    missing = set(record.shapes) - set(pair.graftable)
    if missing:
        raise RegionError(f"the patch expects graftable tensors this base lacks (first: {sorted(missing)[0]})")
    pair.hashes = {"base": None, "finetuned": record.meta.finetuned_sha256}
    return pair


def export_graft(pair, record: RegionRecord, out_dir: str | Path) -> Path:
    """Write θ_pre + γ⊙δ as a normal Hugging Face checkpoint directory (safetensors)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise RegionError(f"'{out_dir}' exists and is not empty; choose a new folder")
    with atomic_dir(out_dir) as tmp:
        with pair.grafted(record.indices, record.values) as model:  # a patch is its values
            model.save_pretrained(tmp, safe_serialization=True)
        pair.tokenizer.save_pretrained(tmp)
        (tmp / "graftui_region.json").write_text(json.dumps({**record.meta.as_dict(), "size": record.size}, indent=2,
                                                            default=str))
    return out_dir


# -- the score log: each region's latest evaluation, beside its file --------------------------------
SCORES_FILE = "scores.json"  # in a regions folder: content id -> the latest scores of that region's graft
SCORE_FIELDS = ("digest", "task", "accuracy", "ece", "share_of_ft", "n", "when")  # every entry has these
MAX_SCORES = 10_000  # entries one log keeps (the latest); a folder holds far fewer regions
MAX_SCORES_BYTES = 16 << 20  # a log larger than this is not one we wrote: read as empty


def now_utc() -> str:
    """The time as region files and score logs record it (UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def scores_path(folder: str | Path) -> Path:
    return Path(folder) / SCORES_FILE


def _read_scores(path: Path) -> dict[str, dict]:
    try:
        if path.stat().st_size > MAX_SCORES_BYTES:
            return {}
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    items = doc.get("scores") if isinstance(doc, dict) else None
    return {e["digest"]: e for e in (items if isinstance(items, list) else [])
            if isinstance(e, dict) and isinstance(e.get("digest"), str)}


def _write_scores(path: Path, log: dict[str, dict]) -> None:
    kept = sorted(log.values(), key=lambda e: str(e.get("when") or ""))[-MAX_SCORES:]
    text = json.dumps({"format": 1, "scores": kept}, indent=1, default=str)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def note_scores(folder: Path, entries: list[dict]) -> Path | None:
    """Remember each entry as the latest scores of its region (``entry["digest"]``, the content id) in the score log
    of ``folder``; an entry scored earlier than the one kept (``when``) does not replace it. Several writers take turns
    (a lock), and the log is replaced whole (atomically), so it is never half-written. Returns the log's path."""
    clean = []
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("digest"), str) or not entry["digest"]:
            raise ValueError("a score entry needs the content id of its region ('digest')")
        entry = json.loads(json.dumps({**{key: None for key in SCORE_FIELDS}, **entry}, default=str))
        entry["when"] = entry["when"] or now_utc()
        clean.append(entry)
    if not clean:
        return None
    path = scores_path(folder)
    with file_lock(path):
        log = _read_scores(path)
        for entry in clean:
            kept = log.get(entry["digest"])
            if kept is None or str(entry["when"]) >= str(kept.get("when") or ""):
                log.pop(entry["digest"], None)
                log[entry["digest"]] = entry
        _write_scores(path, log)
    return path


def latest_scores(folder: Path) -> dict[str, dict]:
    """The score log of ``folder``: content id -> the latest entry ({} when nothing was scored there)."""
    return _read_scores(scores_path(folder))


def forget_scores(folder: Path, digests) -> None:
    """Drop the entries of regions no file in ``folder`` holds any more (a deleted region leaves no row behind)."""
    path, digests = scores_path(folder), set(digests)
    if not path.exists() or not digests:
        return
    with file_lock(path):
        log = _read_scores(path)
        if digests & set(log):
            _write_scores(path, {d: e for d, e in log.items() if d not in digests})


def score_folder(region_file: str | Path) -> Path:
    """Where a region's scores are remembered: beside its file; on a hosted server in the session's own regions
    folder, whichever file was scored (a gallery region's file is the server's, and no session writes there)."""
    if settings.hosted():
        return settings.subdir("regions")
    return Path(region_file).expanduser().resolve().parent


def evaluation_entries(rows: list[dict], files: list, labels: list[str], records: list, with_ft: bool = True,
                       when: str | None = None) -> dict[Path, list[dict]]:
    """Score folder -> an entry for each region scored in distribution in an evaluation's ``rows`` (as scoring.compare
    and card.annotate write them): its accuracy, ECE, share of the fine-tuning gain, n and task, with the fine-tuned
    and bare accuracies of that task (``with_ft`` False: the fine-tuned model was rebuilt from the patches, so it is
    no reference and the share is not known)."""
    when = when or now_utc()
    out: dict[Path, list[dict]] = {}
    for file, label, record in zip(files, labels, records):
        for row in rows:
            if row.get("model") != label or row.get("distribution") != "in":
                continue
            task = [r for r in rows if r.get("task") == row["task"] and r.get("distribution") == "in"]
            ft = next((r["accuracy"] for r in task if r.get("model") == FT_LABEL), None) if with_ft else None
            bare = next((r["accuracy"] for r in task if is_body(r.get("model"))), None)
            out.setdefault(score_folder(file), []).append({
                "digest": digest(record.indices), "task": row["task"], "accuracy": row.get("accuracy"),
                "ece": row.get("ece"), "share_of_ft": row.get("gain_recovered") if with_ft else None,
                "n": row.get("n"), "when": when, "region": Path(str(file)).name, "ft_accuracy": ft,
                "bare_accuracy": bare, "f1": row.get("f1")})
    return out


# -- tags and notes: what a person wrote about each run, beside the regions --------------------------
ANNOTATIONS_FILE = "annotations.json"  # in a regions folder: region id -> its tags and note
MAX_TAGS = 12  # tags one run keeps
MAX_TAG_CHARS = 32
MAX_NOTE_CHARS = 2000
MAX_ANNOTATIONS = 10_000  # entries one file keeps (the latest); a folder holds far fewer regions
MAX_ANNOTATIONS_BYTES = 8 << 20  # a file larger than this is not one we wrote: read as empty
_TAG = re.compile(r"^\w(?:[\w.+-]| (?! ))*$")  # letters, digits, . _ + - and single spaces inside; no markup, no path
_NOT_TAG = re.compile(r"[\w.+\- ]")  # what a tag may hold: the rest is named in a refusal
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")  # kept out of notes


def clean_tags(tags) -> list[str]:
    """Tags as kept: comma-separated text or a list, trimmed, each once (any case), at most MAX_TAGS; a tag that is
    too long or holds markup or path characters is a RequestError naming it and what a tag may hold."""
    items = str(tags or "").split(",") if isinstance(tags, str) or tags is None else [str(t) for t in tags]
    out: list[str] = []
    for raw in items:
        tag = " ".join(raw.split())
        if not tag:
            continue
        if len(tag) > MAX_TAG_CHARS:
            raise RequestError(f"the tag '{tag[:MAX_TAG_CHARS]}…' is longer than {MAX_TAG_CHARS} characters: shorten it")
        if not _TAG.match(tag):  # named by its place and its characters: the message never carries markup whole
            bad = sorted(set(_NOT_TAG.sub("", tag))) or [tag[0]]
            raise RequestError(f"tag {len(out) + 1} holds characters a tag cannot ({' '.join(map(repr, bad))}) or "
                               "starts with one: use letters, digits, '.', '_', '+', '-' and spaces, starting with a "
                               "letter or digit, and separate tags with commas")
        if tag.lower() not in (t.lower() for t in out):
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise RequestError(f"{len(out)} tags given; a run keeps at most {MAX_TAGS}: drop some")
    return out


def clean_note(note) -> str:
    """A note as kept: its text without control or direction-changing characters, trimmed; longer than
    MAX_NOTE_CHARS is a RequestError that says by how much."""
    text = _CONTROL.sub("", str(note or "").replace("\r\n", "\n").replace("\r", "\n")).strip()
    if len(text) > MAX_NOTE_CHARS:
        raise RequestError(f"the note has {len(text):,} characters; a note holds at most {MAX_NOTE_CHARS:,}: "
                           f"shorten it by {len(text) - MAX_NOTE_CHARS:,}")
    return text


def annotations_path(folder: str | Path) -> Path:
    return Path(folder) / ANNOTATIONS_FILE


def read_annotations(folder: str | Path) -> dict[str, dict]:
    """Region id -> {"digest", "tags", "note", "when"} of ``folder`` ({} when none was written, or the file is not
    one we wrote); entries that do not hold what ours hold are left out."""
    path = annotations_path(folder)
    try:
        if path.stat().st_size > MAX_ANNOTATIONS_BYTES:
            return {}
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    items = doc.get("runs") if isinstance(doc, dict) else None
    out = {}
    for e in items if isinstance(items, list) else []:
        if (isinstance(e, dict) and isinstance(e.get("id"), str) and isinstance(e.get("digest"), str)
                and isinstance(e.get("tags"), list) and all(isinstance(t, str) for t in e["tags"])
                and isinstance(e.get("note"), str)):
            out[e["id"]] = e
    return out


def annotation_of(annotations: Mapping, region_id: str, content_id: str) -> dict:
    """The tags and note written about ``region_id`` while it held the region ``content_id``: a file saved later
    under the same id (the first one deleted) does not inherit them."""
    entry = annotations.get(region_id)
    if entry is None or entry.get("digest") != content_id:
        return {"tags": [], "note": ""}
    return {"tags": list(entry["tags"]), "note": entry["note"]}


def annotate(folder: str | Path, region_id: str, content_id: str, tags, note, keep=None) -> dict:
    """Write the tags and note of ``region_id`` (whose region is ``content_id``) into ``folder``'s annotations, both
    checked first (``clean_tags``, ``clean_note``); empty ones remove its entry. Writers take turns (a lock) and the
    file is replaced whole (atomically), never half-written. ``keep``: the ids still saved, when known (the entries
    of others go). Returns what was kept for it."""
    tags, note = clean_tags(tags), clean_note(note)
    if not isinstance(region_id, str) or not region_id or not isinstance(content_id, str) or not content_id:
        raise RequestError("a note needs the id and content id of a saved region")
    path = annotations_path(folder)
    with file_lock(path):
        kept = read_annotations(folder)
        kept.pop(region_id, None)
        if keep is not None:
            kept = {i: e for i, e in kept.items() if i in set(keep)}
        if tags or note:
            kept[region_id] = {"id": region_id, "digest": content_id, "tags": tags, "note": note, "when": now_utc()}
        entries = sorted(kept.values(), key=lambda e: str(e.get("when") or ""))[-MAX_ANNOTATIONS:]
        text = json.dumps({"format": 1, "runs": entries}, indent=1, ensure_ascii=False)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return {"tags": tags, "note": note}


# -- a folder of regions as a table ------------------------------------------------------------------
LISTING_COLUMNS = ("id", "base", "finetuned", "task", "method", "k", "share_of_graftable", "steps", "seed", "created",
                   "accuracy", "ece", "share_of_ft")  # what a listing sorts by


def _whole(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def listing_row(path: Path, kind: str, meta: RegionMeta, content_id: str, score: Mapping | None = None) -> dict:
    """A region file as a row of the regions table: what its header says and its latest scores (None: never scored)."""
    learn = meta.learn if isinstance(meta.learn, dict) else {}
    score = score or {}
    frac = meta.fraction_of_graftable
    if frac is None and meta.k is not None and meta.graftable_params:
        frac = meta.k / meta.graftable_params
    return {
        "id": path.stem, "file": str(path), "kind": kind, "digest": content_id, "base": meta.base,
        "finetuned": meta.finetuned, "task": meta.task, "method": meta.method, "k": meta.k, "budget": budget_of(meta),
        "share_of_graftable": frac, "steps": _whole(learn.get("steps")), "seed": _whole(learn.get("seed")),
        "created": meta.created,
        **{key: score.get(key) for key in ("accuracy", "ece", "share_of_ft", "ft_accuracy")},
        "scored_task": score.get("task"), "n": score.get("n"), "scored": score.get("when"),
    }


# -- runs: the regions as the runs that made them -------------------------------------------------------
def budget_of(meta) -> str:
    """A run's budget as it is grouped: its sparsity as a share of the graftable parameters, else its k."""
    if isinstance(meta.sparsity, (int, float)) and not isinstance(meta.sparsity, bool):
        return f"{meta.sparsity:.3%}"
    if meta.budget:
        return str(meta.budget)
    return f"k={meta.k:,}" if isinstance(meta.k, int) else "?"


GROUPS = {"budget": "budget (sparsity)", "method": "method", "seed": "seed"}


def group_key(run: dict, by: str) -> str:
    value = {"budget": run["budget"], "method": run["method"], "seed": run["seed"]}[by]
    return "(none)" if value is None or value == "" else str(value)


def group_runs(runs_: list[dict], by: str) -> list[dict]:
    """One row per value of ``by`` (budget, method or seed), in the order the runs come: how many runs and how many
    scored, the mean, sample standard deviation, least and most of their score (accuracy, or exact match), and the
    means of their ECE and OOD accuracy (where the rows have one). A run never scored counts in ``runs`` only."""
    if by not in GROUPS:
        raise RequestError(f"cannot group by '{by}': choose {', '.join(GROUPS)}")
    groups: dict[str, list[dict]] = {}
    for r in runs_:
        groups.setdefault(group_key(r, by), []).append(r)
    out = []
    for key, members in groups.items():
        scores = [r["accuracy"] for r in members if r["accuracy"] is not None]
        mean, std = mean_std(scores)
        out.append({"group": key, "runs": len(members), "scored": len(scores), "mean": mean, "std": std,
                    "min": min(scores) if scores else None, "max": max(scores) if scores else None,
                    "ece": mean_std([r["ece"] for r in members])[0],
                    "ood": mean_std([r.get("ood_accuracy") for r in members])[0]})
    return out


SETTING_FIELDS = ("base", "finetuned", "finetuned_sha256", "task", "method", "budget", "sparsity", "k",
                  "train_examples", "start", "group", "sources", "resolve", "uploaded_as", "library_version")
NESTED = ("request", "learn", "graftable_spec", "loading")  # read field by field, as 'request.steps'
NOT_SETTINGS = {"request.out", "request.overwrite"}  # where a run wrote its file, not how it was made
ABSENT = "—"


def _shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def run_settings(meta) -> dict[str, str]:
    """A region's settings field by field: what made it (pair, task, method, budget) and every field of its request,
    mask-learning config, graftable set and loading, as text."""
    meta = RegionMeta.from_dict(meta)
    out = {}
    for name in SETTING_FIELDS:
        value = getattr(meta, name)
        if value is not None:
            out[name] = _shown(value)
    for name in NESTED:
        nested = getattr(meta, name)
        for key, value in (nested if isinstance(nested, dict) else {}).items():
            if f"{name}.{key}" not in NOT_SETTINGS and value is not None:
                out[f"{name}.{key}"] = _shown(value)
    return out


def settings_diff(a, b) -> list[tuple[str, str, str]]:
    """(field, a's value, b's value) for each setting of two regions' metadata that differs, a field only one has
    shown as '—' for the other; in the order of ``run_settings``."""
    sa, sb = run_settings(a), run_settings(b)
    names = list(dict.fromkeys([*sa, *sb]))
    return [(n, sa.get(n, ABSENT), sb.get(n, ABSENT)) for n in names if sa.get(n, ABSENT) != sb.get(n, ABSENT)]


def listing(folder: str | Path) -> list[dict]:
    """Every region file of ``folder`` as a row (``listing_row``), newest first, with its latest scores."""
    folder = Path(folder)
    scores = latest_scores(folder)
    rows = []
    for path in folder.glob("*.safetensors"):
        header = None if path.name.startswith(".") else read_header(path)
        if header is not None:
            rows.append(listing_row(path, header.kind, header.meta, header.digest, scores.get(header.digest)))
    return sorted(rows, key=lambda r: (r["created"] or "", r["id"]), reverse=True)
