"""What the app keeps under ``$GRAFTUI_HOME``: the shared job runner, checkpoints, regions, uploads.

Everything the pages list is read back from disk, so a reloaded page or a restarted server
shows the same jobs, checkpoints and regions. No maths here: only files and names.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from .. import settings

# -- defaults ------------------------------------------------------------------------------------


fast = settings.fast


def defaults() -> dict:
    """What the widgets start with: the requests' own defaults (GRAFTUI_FAST ones in that mode)."""
    import math

    from ..requests import INTERACTIVE, EvaluateRequest, FinetuneRequest, LocalizeRequest, SweepRequest

    loc, ft, ev = LocalizeRequest.defaults(), FinetuneRequest.defaults(), EvaluateRequest.defaults()
    recipe = FinetuneRequest(**ft).recipe()
    return {
        "steps": loc["steps"],
        "examples_per_class": loc["examples_per_class"],
        "test_examples": ev["n"] or INTERACTIVE["n"],
        "log_sparsity": math.log10(loc["sparsity"]),
        "mask_lr": loc["lr"],
        "ft_lr": recipe.lr,
        "ft_epochs": recipe.epochs,
        "ft_train_examples": recipe.train_examples or 0,
        "sweep_budgets": ", ".join(f"{s:g}" for s in SweepRequest.defaults()["sparsities"]),
    }


# -- the one job runner --------------------------------------------------------------------------
_runner = None
_runner_lock = threading.Lock()


def runner():
    """The app's single JobRunner, rooted at ``$GRAFTUI_HOME/jobs`` (created on first use)."""
    global _runner
    with _runner_lock:
        if _runner is None:
            from ..jobs import JobRunner

            settings.configure_torch()
            _runner = JobRunner(settings.subdir("jobs"))
        return _runner


# -- folders -------------------------------------------------------------------------------------
def regions_dir() -> Path:
    return settings.subdir("regions")


def checkpoints_dir() -> Path:
    return settings.subdir("checkpoints")


def uploads_dir() -> Path:
    return settings.subdir("uploads")


def downloads_dir() -> Path:
    return settings.subdir("downloads")


def served_dirs() -> list[str]:
    """The only folders under GRAFTUI_HOME whose files the page may download."""
    return [str(regions_dir()), str(downloads_dir()), str(settings.subdir("reports"))]


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str, limit: int = 60) -> str:
    name = _SAFE.sub("-", str(text)).strip("-.")[:limit]
    return name or "item"


# -- regions -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegionEntry:
    """A saved region as listed: its id (file stem), path and the metadata from its header."""

    id: str
    path: Path
    kind: str
    meta: dict

    @property
    def k(self) -> int | None:
        return self.meta.get("k")

    @property
    def label(self) -> str:
        m = self.meta
        k = m.get("k")
        frac = m.get("fraction_of_graftable")
        size = f"k={k:,}" if isinstance(k, int) else "k=?"
        if isinstance(frac, (int, float)):
            size += f" ({frac:.3%} of graftable)"
        parts = [str(m.get("task", "?")), str(m.get("method", "?")), size, short_ref(m.get("finetuned", "?"))]
        return " · ".join(parts) + f"  [{self.id}]"


def short_ref(ref: str) -> str:
    from ..flows import short_ref as short

    return short(ref)


def read_region_header(path: Path) -> RegionEntry | None:
    """Metadata of a region file without loading its tensors; None when it is not one of ours."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata() or {}
        meta = json.loads(header.get("meta", "{}"))
    except Exception:  # noqa: BLE001 - an unreadable file is simply not listed
        return None
    if "graftui_format" not in header or not isinstance(meta, dict):
        return None
    return RegionEntry(path.stem, path, header.get("kind", "region"), meta)


def list_regions() -> list[RegionEntry]:
    """Saved regions, newest first."""
    entries = []
    for path in regions_dir().glob("*.safetensors"):
        if path.name.startswith("."):
            continue
        entry = read_region_header(path)
        if entry is not None:
            entries.append(entry)
    return sorted(entries, key=lambda e: (e.meta.get("created", ""), e.path.stat().st_mtime), reverse=True)


def region_choices() -> list[tuple[str, str]]:
    return [(e.label, e.id) for e in list_regions()]


_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def region_path(region_id: str) -> Path:
    """The file of a saved region; refuses anything that is not a plain id in the regions folder."""
    from ..regions import RegionError

    region_id = (region_id or "").strip()
    if not region_id:
        raise RegionError("no region selected: pick one from the list (or run Localize first)")
    if not _ID.match(region_id):
        raise RegionError(f"'{region_id}' is not a region id")
    path = regions_dir() / f"{region_id}.safetensors"
    if not path.is_file():
        raise RegionError(f"region '{region_id}' is not saved here (any more)")
    return path


def load_region(region_id: str):
    from .. import regions

    return regions.load(region_path(region_id))


def save_region(record, stem: str | None = None) -> Path:
    """Save a region or skill patch under a new, readable id; returns its path."""
    from .. import flows, regions

    m = record.meta
    stem = stem or f"{short_ref(m.get('task', 'task'))}-{m.get('method', 'region')}-k{record.size}"
    return regions.save(record, flows.new_path(regions_dir(), stem, ".safetensors"))


# -- checkpoints ---------------------------------------------------------------------------------
def default_checkpoint():
    from ..requests import default_checkpoint_dir

    return default_checkpoint_dir()


def default_ready(key: str | None = None) -> bool:
    """Whether a default fine-tuned model (minilm-movies unless ``key`` says) is already built and cached."""
    from ..requests import default_checkpoint_dir

    if key is None:
        return (default_checkpoint() / "config.json").exists()
    return (default_checkpoint_dir(key.strip().lower()) / "config.json").exists()


def list_checkpoints() -> list[dict]:
    """Fine-tuned checkpoints under GRAFTUI_HOME/checkpoints (the cached default is 'minilm-movies')."""
    from ..models import checkpoint_record

    default = default_checkpoint().resolve()
    out = []
    for path in sorted(checkpoints_dir().iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
        if path.name.startswith(".") or not (path / "config.json").is_file() or path.resolve() == default:
            continue
        record = checkpoint_record(path) or {}
        out.append({"path": str(path), "name": path.name, "record": record})
    return out


def checkpoint_choices(include_base: bool = False) -> list[tuple[str, str]]:
    """Dropdown choices: the offline default (base or fine-tuned), then checkpoints made here."""
    from ..requests import DEFAULT_BASE, DEFAULT_FINETUNED_REFS

    if include_base:
        choices = [(f"{DEFAULT_BASE} (offline base model)", DEFAULT_BASE),
                   ("smollm2 (offline causal LM, read through a prompt)", "smollm2")]
    else:
        choices = [(f"{key} (offline default, {'cached' if default_ready(key) else 'built on first use'})", key)
                   for key in DEFAULT_FINETUNED_REFS]
    for c in list_checkpoints():
        rec = c["record"]
        desc = f"{rec.get('task', '?')} · {rec.get('config', {}).get('optimizer', '?')}" if rec else "checkpoint"
        choices.append((f"{c['name']} ({desc})", c["path"]))
    return choices


# -- parameter counts of pairs seen before (for k next to the budget slider) ------------------------
_counts_lock = threading.Lock()


def _counts_file() -> Path:
    return settings.home() / "pair_counts.json"


def remember_counts(base: str, finetuned: str, counts: dict) -> None:
    with _counts_lock:
        try:
            data = json.loads(_counts_file().read_text())
        except (OSError, ValueError):
            data = {}
        data[f"{base}|{finetuned}"] = {k: int(v) for k, v in counts.items()}
        from ..regions import atomic_write

        atomic_write(_counts_file(), lambda tmp: Path(tmp).write_text(json.dumps(data, indent=1)))


def known_counts(base: str, finetuned: str) -> dict | None:
    try:
        return json.loads(_counts_file().read_text()).get(f"{base}|{finetuned}")
    except (OSError, ValueError, AttributeError):
        return None


# -- what a hosted server lets through -----------------------------------------------------------
def is_managed(ref: str) -> bool:
    """A path this server wrote itself (a checkpoint it fine-tuned, a dataset uploaded to it)."""
    if not ref:
        return False
    try:
        path = Path(ref).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    for root in (checkpoints_dir(), uploads_dir()):
        root = root.resolve()
        if path != root and path.is_relative_to(root) and path.exists():
            return True
    return False


def data_allow_local(ref: str) -> bool:
    """allow_local for loading one dataset: always locally; on a hosted server only our uploads."""
    return not settings.hosted() or is_managed(ref)


def check_task_ref(ref: str) -> None:
    """Refuse, on a hosted server, a dataset reference that names a server path it did not write."""
    if settings.hosted() and not is_managed(ref):
        from .. import data

        data.check_reference(str(ref), allow_local=False)


def allow_local_for(models: list[str] = (), tasks: list[str] = ()) -> bool:
    """allow_local for a flow that loads ``models`` and ``tasks`` together.

    Locally: True. Hosted: every reference must be a Hub id, an offline default, or a path this
    server wrote itself; anything else raises the library's own clear error. True is returned
    only when such a managed path is actually needed.
    """
    if not settings.hosted():
        return True
    from ..models import resolve

    needs_local = False
    for ref in models:
        if is_managed(ref):
            needs_local = True
        else:
            resolve(ref, allow_local=False)
    for ref in tasks:
        if is_managed(ref):
            needs_local = True
        else:
            check_task_ref(ref)
    return needs_local


def check_model_size(ref: str) -> None:
    """On a hosted server, refuse a checkpoint over MAX_MODEL_PARAMS before loading it (when known)."""
    if not settings.hosted():
        return
    from ..models import ModelError

    path = Path(str(ref)).expanduser()
    total = None
    if is_managed(str(path)) and path.is_dir():
        total = safetensors_params(path)
    if total is not None and total > settings.MAX_MODEL_PARAMS:
        raise ModelError(
            f"'{short_ref(ref)}' has {total:,} parameters; this server takes at most {settings.MAX_MODEL_PARAMS:,}"
        )


def safetensors_params(folder: Path) -> int | None:
    """Parameter count from the safetensors headers of a checkpoint folder (no tensor is read)."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                shape = fh.get_slice(key).get_shape()
                n = 1
                for d in shape:
                    n *= int(d)
                total += n
    return total


def check_upload(path: str | Path, allowed: tuple[str, ...]) -> Path:
    """An uploaded file: the right kind by name and within MAX_UPLOAD_MB, or a clear error."""
    path = Path(path)
    if path.suffix.lower() not in allowed:
        raise ValueError(f"'{path.name}' is not one of the accepted file types ({', '.join(allowed)})")
    size_mb = path.stat().st_size / 2**20
    if size_mb > settings.MAX_UPLOAD_MB:
        raise ValueError(f"'{path.name}' is {size_mb:.1f} MB; uploads are limited to {settings.MAX_UPLOAD_MB:g} MB")
    return path


DATA_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".parquet")


def save_upload(path: str | Path) -> Path:
    """Copy an uploaded dataset into GRAFTUI_HOME/uploads under a content-derived name."""
    src = check_upload(path, DATA_SUFFIXES)
    digest = hashlib.sha256()
    with open(src, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    # one folder per content hash keeps the file's own name, which the data loader reads split names from
    dest = uploads_dir() / digest.hexdigest()[:12] / f"{safe_name(src.stem, 60)}{src.suffix.lower()}"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    return dest


def upload_choices() -> list[tuple[str, str]]:
    files = sorted(uploads_dir().glob("*/*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [(f"uploaded: {p.name} ({p.parent.name[:6]})", str(p)) for p in files if p.suffix.lower() in DATA_SUFFIXES]


# -- the guard every flow of the app runs under ------------------------------------------------------
def guard():
    """What the app's flows may read: everything locally; on a hosted server only Hub ids, offline
    defaults and the files this server wrote, within the size caps. Every pair loaded also leaves
    its parameter counts for the budget text next to the slider."""
    from ..flows import Guard

    class AppGuard(Guard):
        def allow_local(self, models=(), tasks=()) -> bool:
            for ref in models:
                check_model_size(ref)
            return allow_local_for(list(models), list(tasks))

        def checked_task(self, task):
            from ..data import DataError

            rows = sum(len(s) for s in task.splits.values())
            if settings.hosted() and rows > settings.MAX_DATASET_ROWS:
                raise DataError(f"'{task.name}' has {rows:,} rows; this server takes at most {settings.MAX_DATASET_ROWS:,}")
            return task

        def checked_pair(self, pair):
            from ..flows import clear_cache
            from ..models import ModelError

            counts = pair.counts()
            if settings.hosted() and counts["total"] > settings.MAX_MODEL_PARAMS:
                clear_cache()
                raise ModelError(f"this pair has {counts['total']:,} parameters; this server takes at most "
                                 f"{settings.MAX_MODEL_PARAMS:,}")
            remember_counts(pair.base_ref, pair.finetuned_ref, counts)
            return pair

    return AppGuard()
