"""Names and writes: readable file names, new paths that collide with nothing, and atomic writes.

Regions, reports, checkpoints, records and uploads are written through :func:`atomic_write` or
:func:`atomic_dir`: made aside under a hidden temporary name in the same folder
(``.<name>.tmp-<host>-<pid>-<start>-…``) and renamed into place when complete, so a crash, a cancel or a full disk never leaves a half-written region,
report or checkpoint; an exclusive write never replaces a file another run wrote meanwhile; and
:func:`clean_stale` removes what a killed run left behind (its process is gone, or its pid now names
a process started later).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from .errors import first_line

DATA_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".parquet")  # the data files a task may be read from
_TEMP = re.compile(r"^\..+\.tmp-(?P<host>[\w-]+)-(?P<pid>\d+)-(?P<start>\d+)-[^.]+$")  # made aside by atomic_*


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


def without_stamp(stem: str) -> str:
    """A name ``new_path`` made, without the stamp it added ('r-20240101-100000-2' → 'r')."""
    return re.sub(r"-\d{8}-\d{6}(-\d+)?$", "", stem)


def _host() -> str:
    return re.sub(r"[^\w-]+", "-", socket.gethostname())[:40] or "host"


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when there is no such process: with the pid
    it names one process, even after a restart gives a new process the same pid (a container's pid 1)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _temp_prefix(path: Path) -> str:
    """A temporary name that says which process on which machine is writing it (see clean_stale)."""
    return f".{path.name}.tmp-{_host()}-{os.getpid()}-{_started(os.getpid()) or 0}-"


def _write_error(path: Path, err: BaseException) -> OSError:
    """The one line for a write that failed: the file asked for, never the temporary one; a full disk said so."""
    text = str(err)
    if getattr(err, "errno", None) == errno.ENOSPC or "No space left" in text:
        return OSError(f"cannot write '{path}': No space left on the device; free some space and run again")
    reason = getattr(err, "strerror", None) or first_line(err)
    return OSError(f"cannot write '{path}': {reason}")


class Exists(FileExistsError):
    """An exclusive write found its target written meanwhile; ``str`` is the one line for the user."""

    def __str__(self) -> str:
        return str(self.args[0])


def atomic_write(path: str | Path, write: Callable[[str], object], exclusive: bool = False) -> Path:
    """Write through a temporary file in the same folder, then rename: never a half-written file.

    ``exclusive``: the file must not exist when the write completes (another run's file is never replaced),
    else :class:`Exists`.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
    except OSError as err:
        raise _write_error(path, err) from None
    os.close(fd)
    try:
        write(tmp)
        if exclusive:
            os.link(tmp, path)  # fails if the name exists: the check and the write are one step
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except FileExistsError:
        Path(tmp).unlink(missing_ok=True)
        raise Exists(f"'{path}' exists (another run wrote it meanwhile); choose a new name, or add --overwrite "
                     "to replace it") from None
    except (KeyboardInterrupt, SystemExit):
        Path(tmp).unlink(missing_ok=True)
        raise
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) or "No space left" in str(err):
            raise _write_error(path, err) from None
        raise
    return path


@contextlib.contextmanager
def atomic_dir(out_dir: str | Path, replace: bool = False) -> Iterator[Path]:
    """A folder written aside and renamed to ``out_dir`` when the block ends without an error.

    ``out_dir`` may exist only as an empty folder (``replace``: as any folder, which is removed first); one
    another run filled meanwhile is never replaced (:class:`Exists`). The block fills the folder it is given.
    """
    out_dir = Path(out_dir)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(out_dir), dir=out_dir.parent))
    except OSError as err:
        raise _write_error(out_dir, err) from None
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary folder
    try:
        yield tmp
        if replace and out_dir.exists():
            shutil.rmtree(out_dir)
        try:
            os.rename(tmp, out_dir)  # replaces an empty folder only
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise Exists(f"'{out_dir}' exists and is not empty (another run wrote it meanwhile); choose a new "
                             "folder") from None
            raise
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, Exists) or isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        if isinstance(err, OSError) or "No space left" in str(err):
            raise _write_error(out_dir, err) from None
        raise


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Hold ``<path>.lock`` while the block runs, across processes (two runs building one default checkpoint
    take turns: the second finds it built)."""
    lock = Path(f"{path}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _stale(m: re.Match) -> bool:
    """A temporary name whose writer on this machine is gone: its pid runs no more, or runs another process (one
    started at another time). Another machine's names (a shared home) are never judged here."""
    if m["host"] != _host():
        return False
    started = _started(int(m["pid"]))
    return started is None or str(started) != m["start"]


def clean_stale(root: str | Path, depth: int = 3) -> list[Path]:
    """Remove the temporary files and folders that runs killed mid-write left under ``root``."""
    removed = []
    root = Path(root)
    if not root.is_dir():
        return removed
    for entry in list(root.iterdir()):
        m = _TEMP.match(entry.name)
        if m and _stale(m):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(entry)
        elif depth > 1 and entry.is_dir() and not entry.is_symlink() and not m:
            removed += clean_stale(entry, depth - 1)
    return removed


def file_sha256(*paths) -> str:
    """The sha256 of a file's bytes (of several files', one after another), read a megabyte at a time."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
