"""Regions on disk: safetensors files of flat indices, optionally with values (a skill patch).

Layout of a file (all tensors little-endian, as safetensors writes them):

    idx/<param>   int64 [k_p]   sorted flat indices of <param> inside the region
    val/<param>   float32 [k_p] fine-tuned values at those indices          (skill patch only)
    head/<param>  float32       parameters only the fine-tuned model has    (skill patch only)

and string metadata ``graftui_format`` (version), ``kind`` (``region`` | ``patch``), ``shapes``
(JSON: every graftable parameter's shape) and ``meta`` (JSON: references, hashes, task, method,
budget, counts, hyper-parameters, library version, time).

A patch rebuilds the graft bit-exactly from the base alone: base + patch = θ_pre + γ⊙δ.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import __version__
from .errors import RegionError
from .method import Region, region_size

FORMAT_VERSION = "1"
MAX_FILE_BYTES = 2 << 30  # a region file larger than this is not one we wrote


@dataclass
class RegionRecord:
    """A region with everything needed to reproduce, inspect and re-apply it."""

    indices: Region
    shapes: dict[str, tuple[int, ...]]  # all graftable parameters, not only those in the region
    meta: dict = field(default_factory=dict)
    values: dict[str, torch.Tensor] | None = None  # fine-tuned values at ``indices`` (patch)
    head: dict[str, torch.Tensor] | None = None

    @property
    def size(self) -> int:
        return region_size(self.indices)

    @property
    def graftable(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())

    @property
    def is_patch(self) -> bool:
        return self.values is not None

    def summary(self) -> dict:
        return {
            "kind": "patch" if self.is_patch else "region",
            "size": self.size,
            "graftable": self.graftable,
            "fraction_of_graftable": self.size / max(self.graftable, 1),
            "tensors": len(self.indices),
            **{k: v for k, v in self.meta.items() if k in {"method", "base", "finetuned", "task", "k", "budget"}},
        }


def make_record(pair, indices: Region, meta: dict) -> RegionRecord:
    """Attach shapes and the standard metadata of ``pair`` to a region."""
    from .models import architecture

    counts = pair.counts()
    full = {
        "format": FORMAT_VERSION,
        "base": pair.base_ref,
        "finetuned": pair.finetuned_ref,
        "base_sha256": pair.hashes.get("base"),
        "finetuned_sha256": pair.hashes.get("finetuned"),
        "labels": list(pair.label_names),
        "architecture": architecture(pair.model),
        "loading": pair.loading_record(),
        "prompt": pair.prompt.as_dict() if pair.prompt else None,
        "k": region_size(indices),
        "graftable_params": counts["graftable"],
        "total_params": counts["total"],
        "fraction_of_graftable": region_size(indices) / max(counts["graftable"], 1),
        "fraction_of_all": region_size(indices) / max(counts["total"], 1),
        "library_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    full.update(meta)
    return RegionRecord(indices={n: i.cpu() for n, i in indices.items()}, shapes=pair.shapes, meta=full)


def with_patch(pair, record: RegionRecord) -> RegionRecord:
    """The same region carrying the fine-tuned values and the head: a self-contained skill patch."""
    values = {n: pair.ft[n].reshape(-1)[i.to(pair.ft[n].device)].detach().cpu().clone() for n, i in record.indices.items()}
    head = {n: pair.param(n).detach().cpu().clone() for n in pair.head}
    return RegionRecord(record.indices, record.shapes, dict(record.meta), values, head)


# -- writing -----------------------------------------------------------------------------------
def atomic_write(path: str | Path, write) -> Path:
    """Write through a temporary file in the same folder, then rename: never a half-written file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as err:
        raise OSError(err.errno, f"cannot write '{path}': {err.strerror}") from None
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:  # name the file asked for, never the temporary one
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, f"cannot write '{path}': {err.strerror or err}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def digest(indices: Region) -> str:
    """A short id of a region's parameter set (not of its file): the same region has the same id."""
    h = hashlib.sha256()
    for name in sorted(indices):
        idx = indices[name].reshape(-1)
        if idx.numel():
            h.update(name.encode() + b"\0" + idx.to(torch.int64).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:8]


def settings_of(meta: dict) -> list[str]:
    """The settings that tell two runs of one method apart: steps, examples, learning rate, seed; sources of a union."""
    learn = meta.get("learn") if isinstance(meta.get("learn"), dict) else None
    out = []
    if learn:
        lr = learn.get("lr")
        out += [f"{learn.get('steps')} steps", f"{meta.get('train_examples', '?')} examples",
                f"lr {lr:g}" if isinstance(lr, (int, float)) else "lr ?", f"seed {learn.get('seed')}"]
    if meta.get("method") == "union" and isinstance(meta.get("sources"), list):
        out.append(f"union of {len(meta['sources'])}")
    return out


def describe(meta: dict) -> str:
    """A region in one line: task · method · k · its settings."""
    k = meta.get("k")
    return " · ".join([str(meta.get("task", "?")), str(meta.get("method", "?")),
                       f"k={k:,}" if isinstance(k, int) else "k=?", *settings_of(meta)])


def save(record: RegionRecord, path: str | Path) -> Path:
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
        "meta": json.dumps(record.meta, default=str),
        "region_digest": digest(record.indices),
    }
    if not tensors:  # safetensors needs one tensor; an empty region is still a valid answer
        tensors["empty"] = torch.zeros(0, dtype=torch.int64)
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


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
        raise RegionError(f"'{path.name}' is not a readable safetensors region file ({_first_line(err)})") from err
    version = metadata.get("graftui_format")
    if version is None:
        raise RegionError(f"'{path.name}' is a safetensors file but not a graftui region (no format tag)")
    if version != FORMAT_VERSION:
        raise RegionError(f"'{path.name}' has region format {version}; this graftui reads format {FORMAT_VERSION}")
    try:
        shapes = {n: tuple(int(d) for d in s) for n, s in json.loads(metadata.get("shapes", "")).items()}
        meta = json.loads(metadata.get("meta", "{}"))
    except (ValueError, TypeError, AttributeError) as err:
        raise RegionError(f"'{path.name}' has unreadable metadata ({_first_line(err)})") from err
    if not isinstance(meta, dict):
        raise RegionError(f"'{path.name}' has unreadable metadata (not a JSON object)")
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
    for group, tensors_ in (("values", values), ("head", head)):
        for name, tensor in tensors_.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise RegionError(f"'{path.name}' holds NaN or infinite {group} for {name}: not a usable skill patch")
    record = RegionRecord(indices, shapes, meta, values if kind == "patch" else None, head if kind == "patch" else None)
    return record


MAX_GRAFTABLE = 10**13  # far beyond any model; a header claiming more is forged


def _check_totals(file: str, shapes: dict, meta: dict, indices: dict) -> None:
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
                    f"the patch carries the head of '{record.meta.get('finetuned', '?')}' (task "
                    f"'{record.meta.get('task', '?')}', {name} of shape {list(value.shape)}), which does not fit this "
                    f"model's {list(pair.param(name).shape)}: use it with the base model "
                    f"'{record.meta.get('base', '?')}' and a task with the same labels")


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


# -- a pair from a patch, and export -------------------------------------------------------------
def recorded_options(meta: dict, **overrides):
    """The LoadOptions a region was made with (its prompt), with ``overrides`` on top."""
    from .requests import HEADS, LoadOptions

    loading = meta.get("loading") if isinstance(meta.get("loading"), dict) else {}

    known = {"head", "template", "label_words", "label_scoring"}  # the prompt; dtype and placement are the reader's
    values = {k: v for k, v in loading.items() if k in known and isinstance(v, str)}
    if values.get("head") not in HEADS:
        values.pop("head", None)
    return LoadOptions(**{**values, **{k: v for k, v in overrides.items() if v is not None}})


def recorded_labels(meta: dict) -> tuple[str, ...] | None:
    """A region's recorded label names: a list of strings, or a RegionError (region files are untrusted)."""
    labels = meta.get("labels")
    if labels is None or labels == []:
        return None
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels) or len(labels) > 10_000:
        raise RegionError("the region file's 'labels' are not a list of label names")
    return tuple(labels)


def pair_from_patch(base_ref: str, record: RegionRecord, options=None, **load_kwargs):
    """Base + patch as a ModelPair whose 'fine-tuned' values are the patch (exact inside the region)."""
    from .models import GraftableSpec, ModelPair, load_reader, pair_kind

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
                                 f"patch:{record.meta.get('finetuned', '?')}", labels, fixed)
    pair.prompt, pair.options = prompt, options
    missing = set(record.shapes) - set(pair.graftable)
    if missing:
        raise RegionError(f"the patch expects graftable tensors this base lacks (first: {sorted(missing)[0]})")
    pair.hashes = {"base": None, "finetuned": record.meta.get("finetuned_sha256")}
    return pair


def export_graft(pair, record: RegionRecord, out_dir: str | Path) -> Path:
    """Write θ_pre + γ⊙δ as a normal Hugging Face checkpoint directory (safetensors)."""
    import shutil

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise RegionError(f"'{out_dir}' exists and is not empty; choose a new folder")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary folder
    try:
        with pair.grafted(record.indices) as model:
            model.save_pretrained(tmp, safe_serialization=True)
        pair.tokenizer.save_pretrained(tmp)
        (tmp / "graftui_region.json").write_text(json.dumps({**record.meta, "size": record.size}, indent=2, default=str))
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
