"""Names and writes: readable file names, new paths that collide with nothing, and atomic writes.

Every file or folder graftui writes goes through :func:`atomic_write` or :func:`atomic_dir`: it is
made aside under a hidden temporary name in the same folder and renamed into place when complete,
so a crash, a cancel or a full disk never leaves a half-written region, report or checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

DATA_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".parquet")  # the data files a task may be read from


def short_ref(ref) -> str:
    """A model or data reference as people read it: the last path component of a local path."""
    ref = str(ref)
    if "/" in ref and (ref.startswith(("/", ".", "~")) or ref.count("/") > 1):
        return Path(ref).name
    return ref


def slug(text) -> str:
    """A file-name-safe form of a reference: a path's stem, other characters as '_'."""
    text = str(text).strip().rstrip("/\\")
    path = Path(text).expanduser()
    if path.suffix.lower() in {*DATA_SUFFIXES, ".safetensors"} or path.exists():
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


def atomic_write(path: str | Path, write: Callable[[str], object]) -> Path:
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


@contextlib.contextmanager
def atomic_dir(out_dir: str | Path, replace: bool = False) -> Iterator[Path]:
    """A folder written aside and renamed to ``out_dir`` when the block ends without an error.

    ``out_dir`` may exist only as an empty folder (``replace``: as any folder, which is removed
    first); the block fills the temporary folder it is given.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary folder
    try:
        yield tmp
        if out_dir.exists():
            shutil.rmtree(out_dir) if replace else out_dir.rmdir()
        tmp.replace(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
