"""Where a job keeps its place, so that work moved or interrupted continues rather than starts over.

The job runner sets a slot for each run of a job (``kept_in``: ``<job dir>/resume/``), as the app sets the workspace
(``settings.workspace()``): a context variable, so the code a job runs asks for its place without being handed it.
Each mask learning of that run takes a place named by what it learns (``place(key)``: ``learn-<key>-<n>``, the n-th
learning of that key in the run): a run of several seeds or budgets learns several regions, and a re-run that reads
some of them back from their region files, learning only the others, still finds each one's own place. With no slot
set (the CLI, the library, tests) there is no place, and nothing is written.

A learning's checkpoint is one safetensors file (``CHECKPOINT``): its tensors, and its scalars as JSON in the file's
metadata, so tensors and scalars are written in one atomic rename and never disagree. ``standing`` reads only that
header (no torch), so the runner can say from which step a job continues.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import struct
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

FOLDER = "resume"  # inside a job's folder
CHECKPOINT = "state.safetensors"  # inside a learning's place
SCALARS = "graftui_state"  # the metadata key holding the scalars as JSON
CHECKPOINT_SECONDS = 30.0  # of mask steps between two checkpoints: small against the minutes a restart would lose
HEADER_LIMIT = 16 << 20  # bytes of a safetensors header read before it is called damaged


@dataclass
class Slot:
    """One run of a job: its folder and how many learnings of each key it has started."""

    root: Path
    taken: dict[str, int] = field(default_factory=dict)


_slot: ContextVar[Slot | None] = ContextVar("graftui_resume", default=None)


@contextlib.contextmanager
def kept_in(root: str | Path | None):
    """Within the block, ``root`` is the place of this run of a job (None: none)."""
    token = _slot.set(None if root is None else Slot(Path(root)))
    try:
        yield
    finally:
        _slot.reset(token)


def place(key: str) -> Path | None:
    """The folder of this run's next mask learning of ``key`` (a digest of what it learns; not made yet), or None
    outside a job."""
    slot = _slot.get()
    if slot is None:
        return None
    n = slot.taken.get(key, 0)
    slot.taken[key] = n + 1
    return slot.root / f"learn-{key}-{n}"


def header(path: str | Path) -> dict:
    """A safetensors file's header (names → dtype, shape, offsets; ``__metadata__``), read without torch; raises
    ``ValueError`` for a file that is not one."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("it is shorter than a safetensors header")
        (size,) = struct.unpack("<Q", head)
        if size > HEADER_LIMIT:
            raise ValueError(f"its header claims {size} bytes")
        text = f.read(size)
    if len(text) != size:
        raise ValueError("its header is cut short")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("its header is not a table")
    return data


def scalars(path: str | Path) -> dict:
    """The scalars a checkpoint keeps (its metadata's JSON); ``ValueError`` when it has none."""
    meta = header(path).get("__metadata__") or {}
    data = json.loads(meta.get(SCALARS, "null"))
    if not isinstance(data, dict):
        raise ValueError("it keeps no learner state")
    return data


def standing(job_dir: str | Path) -> tuple[int, int] | None:
    """(steps done, steps) of the learning a job's folder last kept a checkpoint of; None where it keeps none, or none
    that can be read (the learning then says why, and starts over)."""
    folder = Path(job_dir) / FOLDER
    places = sorted(folder.glob(f"learn-*/{CHECKPOINT}"), key=_written)
    for path in reversed(places):
        try:
            data = scalars(path)
            done, steps = data["steps_done"], data["steps"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(done, int) and isinstance(steps, int):
            return done, steps
    return None


def forget(job_dir: str | Path) -> None:
    """Remove a job's places: it has ended, and nothing of it continues."""
    shutil.rmtree(Path(job_dir) / FOLDER, ignore_errors=True)


def _written(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
