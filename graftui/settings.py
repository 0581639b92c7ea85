"""Where graftui keeps its files, and what a hosted deployment allows."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """Root for checkpoints, regions and runs: ``$GRAFTUI_HOME`` or ``~/.graftui``."""
    path = Path(os.environ.get("GRAFTUI_HOME") or Path.home() / ".graftui").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def subdir(name: str) -> Path:
    path = home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def hosted() -> bool:
    """A public deployment (``GRAFTUI_HOSTED=1``) must not read arbitrary server paths."""
    return os.environ.get("GRAFTUI_HOSTED", "").strip().lower() in {"1", "true", "yes", "on"}


# Caps for hosted mode: uploads are hostile until checked, and a Space has little memory.
MAX_UPLOAD_MB = float(os.environ.get("GRAFTUI_MAX_UPLOAD_MB", "200"))
MAX_DATASET_ROWS = int(os.environ.get("GRAFTUI_MAX_DATASET_ROWS", "50000"))
MAX_MODEL_PARAMS = int(os.environ.get("GRAFTUI_MAX_MODEL_PARAMS", str(400_000_000)))


def fast() -> bool:
    """``GRAFTUI_FAST=1``: small defaults (a quick default fine-tune, few steps) for tests and demos."""
    return os.environ.get("GRAFTUI_FAST", "").strip().lower() in {"1", "true", "yes", "on"}


def device() -> str:
    """GPU when there is one; ``GRAFTUI_DEVICE`` overrides (e.g. ``cpu`` for reproducible runs)."""
    forced = os.environ.get("GRAFTUI_DEVICE")
    if forced:
        return forced
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def configure_torch() -> None:
    """Every core this process may use, with idle OpenMP workers asleep (the CLI and the app alike).

    OMP_WAIT_POLICY must be set before torch starts its thread pool; the entry points set it
    first, this sets it for library users who did not.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    torch.set_num_threads(max(1, cores))
