"""Where graftui keeps its files, and what a hosted deployment allows.

Two kinds of folder live under ``$GRAFTUI_HOME``. Shared ones (:func:`shared`: models, the
default fine-tuned checkpoints, the job records) serve everyone. A person's own work
(:func:`subdir`: regions, uploads, checkpoints they fine-tune, exports, reports) goes to the
*workspace*: ``$GRAFTUI_HOME`` itself for the CLI, the library and a local app; on a hosted
server, the folder of the browser session that asked (set by the app around each request and
inherited by the jobs it submits), so strangers never see each other's files.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path

from .errors import SessionError


def home() -> Path:
    """Root for checkpoints, regions and runs: ``$GRAFTUI_HOME`` or ``~/.graftui``."""
    path = Path(os.environ.get("GRAFTUI_HOME") or Path.home() / ".graftui").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


NO_SESSION = Path("/nonexistent/graftui-no-session")  # the workspace of a hosted request whose session is unknown
_workspace: ContextVar[Path | None] = ContextVar("graftui_workspace", default=None)


def workspace() -> Path:
    """The caller's own folder: ``$GRAFTUI_HOME``, or the hosted session's folder while one is entered."""
    path = _workspace.get()
    if path is None:
        return home()
    if path == NO_SESSION:
        raise SessionError("this page has no live session (it expired, or the server restarted): reload the page")
    return path


def enter_workspace(path: Path | None):
    """Make ``path`` the workspace of this context (a token for :func:`leave_workspace`)."""
    return _workspace.set(path)


def leave_workspace(token) -> None:
    _workspace.reset(token)


def subdir(name: str) -> Path:
    """A folder of the caller's own work (regions, uploads, checkpoints, exports, reports)."""
    path = workspace() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def shared(name: str) -> Path:
    """A folder every user reads: models, default checkpoints, job records, sessions."""
    path = home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def hosted() -> bool:
    """A public deployment (``GRAFTUI_HOSTED=1``) must not read arbitrary server paths."""
    return os.environ.get("GRAFTUI_HOSTED", "").strip().lower() in {"1", "true", "yes", "on"}


# Limits on reading any data file, from every front end: the characters of one cell, and the megabytes a whole
# file decodes to, checked while the file is read, so a small compressed file cannot expand into gigabytes.
MAX_CELL_CHARS = int(os.environ.get("GRAFTUI_MAX_CELL_CHARS", "100000"))
MAX_DATA_MB = float(os.environ.get("GRAFTUI_MAX_DATA_MB", "512"))

# Caps for hosted mode: uploads are hostile until checked, and a Space has little memory.
MAX_UPLOAD_MB = float(os.environ.get("GRAFTUI_MAX_UPLOAD_MB", "200"))
MAX_DATASET_ROWS = int(os.environ.get("GRAFTUI_MAX_DATASET_ROWS", "50000"))
MAX_MODEL_PARAMS = int(os.environ.get("GRAFTUI_MAX_MODEL_PARAMS", str(400_000_000)))
# Per-session limits on a hosted server: jobs waiting or running, disk, and idle time before a
# workspace is removed; and how many jobs the whole server queues.
SESSION_JOBS = int(os.environ.get("GRAFTUI_SESSION_JOBS", "2"))
SESSION_MB = float(os.environ.get("GRAFTUI_SESSION_MB", "1024"))
SESSION_IDLE_HOURS = float(os.environ.get("GRAFTUI_SESSION_IDLE_HOURS", "24"))
MAX_JOBS = int(os.environ.get("GRAFTUI_MAX_JOBS", "8"))
CLIENT_JOBS = int(os.environ.get("GRAFTUI_CLIENT_JOBS", "4"))  # waiting or running per client address, whatever its sessions
# Proxies in front of the server that append the client's address to X-Forwarded-For (a Space has one); 0, the
# default: none, the socket's peer is the client and X-Forwarded-For is never read, whoever sends it (the loopback
# address included: the web server's own reading of the header is turned off, see ui.app.launch_options).
TRUSTED_PROXIES = int(os.environ.get("GRAFTUI_TRUSTED_PROXIES", "0"))
# Hosted ceilings on one job's work, so that no request holds the queue for long; and a wall-clock limit per job.
HOSTED_CEILINGS = {
    "steps": int(os.environ.get("GRAFTUI_MAX_STEPS", "200")),  # mask steps (and purification steps)
    "purify_steps": int(os.environ.get("GRAFTUI_MAX_STEPS", "200")),
    "examples_per_class": int(os.environ.get("GRAFTUI_MAX_EXAMPLES_PER_CLASS", "1024")),
    "train_examples": int(os.environ.get("GRAFTUI_MAX_TRAIN_EXAMPLES", "5000")),
    "epochs": int(os.environ.get("GRAFTUI_MAX_EPOCHS", "5")),
    "n": int(os.environ.get("GRAFTUI_MAX_TEST_EXAMPLES", "2000")),  # test examples per task
    "test_examples": int(os.environ.get("GRAFTUI_MAX_TEST_EXAMPLES", "2000")),
    "check_n": int(os.environ.get("GRAFTUI_MAX_TEST_EXAMPLES", "2000")),  # localize's quick held-out score
    "batch_size": int(os.environ.get("GRAFTUI_MAX_BATCH", "64")),
    "max_new_tokens": int(os.environ.get("GRAFTUI_MAX_NEW_TOKENS", "64")),  # generated per prompt, completion tasks
    "validation_n": int(os.environ.get("GRAFTUI_MAX_TEST_EXAMPLES", "2000")),  # stitching: examples that choose λ
}
MAX_CURVE_POINTS = int(os.environ.get("GRAFTUI_MAX_CURVE_POINTS", "24"))  # sweep budgets × methods, WiSE α values
MAX_LIST_ITEMS = int(os.environ.get("GRAFTUI_MAX_LIST_ITEMS", "8"))  # OOD tasks, regions, tasks or methods of one job
MAX_MAP_TEXTS = int(os.environ.get("GRAFTUI_MAX_MAP_TEXTS", "4"))  # sentences of one probe map (predict --by cell)
MAX_MAP_CELLS = int(os.environ.get("GRAFTUI_MAX_MAP_CELLS", "128"))  # its (layer, module) cells: each two passes a text


def job_seconds() -> float | None:
    """The wall-clock limit of one job: GRAFTUI_JOB_SECONDS (0: none); hosted, 1800 s unless set."""
    value = float(os.environ.get("GRAFTUI_JOB_SECONDS", "1800" if hosted() else "0"))
    return value or None


def quick_seconds() -> float | None:
    """How long a job may run in the quick lane before it is moved to the main lane: GRAFTUI_QUICK_SECONDS (unset or
    0: the runner's own, 120 s)."""
    return float(os.environ.get("GRAFTUI_QUICK_SECONDS", "0")) or None


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
    """Every core this process may use (or OMP_NUM_THREADS of them, where set), with idle OpenMP workers asleep (the
    CLI and the app alike).

    OMP_WAIT_POLICY must be set before torch starts its thread pool; the entry points set it
    first, this sets it for library users who did not.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    asked = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(max(1, min(int(asked), cores) if asked.isdigit() and int(asked) > 0 else cores))
