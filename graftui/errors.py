"""One family of errors a user can act on, and the one function that turns any error into a line.

Every promise graftui makes to its users (a budget honoured, a file that fits, a task with the
right labels) is broken loudly with a :class:`GraftuiError` whose message names the problem
and the fix. The CLI, the app and the job runner all show :func:`message` of whatever was
raised, so the wording is decided once, where the error is raised.
"""

from __future__ import annotations


class GraftuiError(ValueError):
    """Bad input or a broken promise; ``str(err)`` is the one line shown to the user."""


class RequestError(GraftuiError):
    """A request field out of range, unknown or contradicting another field."""


class DataError(GraftuiError):
    """A task cannot be found, read or used as asked."""


class ColumnsMissing(DataError):
    """A source lacks the columns of the task kind it was read as. ``fits``: it holds some of them, so of the kinds
    tried on it (``kinds.read_task``), this one's words are told."""

    def __init__(self, message: str, fits: bool = False):
        super().__init__(message)
        self.fits = fits


class ModelError(GraftuiError):
    """A checkpoint cannot be found, loaded or paired; the message says which and why."""


class RegionError(GraftuiError):
    """A region file is corrupt, from another format, or does not fit the model."""


class BudgetError(GraftuiError):
    """A sparsity or k that no region can honour."""


class SessionError(GraftuiError):
    """On a hosted server: a request without a live session, or beyond its quota."""


class Cancelled(RuntimeError):
    """Raised inside a flow when its cancel event is set; not a failure."""


class Paused(Cancelled):
    """Work stopped to continue elsewhere (a job moved to another lane): what it has done is kept, so mask learning
    saves its place before it stops."""


MAX_LINE = 1000  # characters of a one-line error: what a user typed is quoted, never a whole file of it


def message(err: BaseException) -> str:
    """One line a person can act on, never a traceback.

    A GraftuiError, a ValueError from a library about the input, or the OS error of a file the
    user named says what it says; anything else is an internal error and is named as one.
    """
    if out_of_memory(err):
        return "ran out of memory: try a smaller model, fewer examples or a smaller batch"
    text = str(err.args[0]) if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
    if is_user_error(err) or isinstance(err, Cancelled):
        line = " ".join(text[:4 * MAX_LINE].split()) or type(err).__name__
        return line if len(line) <= MAX_LINE else line[:MAX_LINE - 1] + "…"  # a megabyte of input is never echoed
    return f"internal error ({type(err).__name__}: {first_line(text) if text.strip() else ''})"


def first_line(err: BaseException | str, width: int = 200) -> str:
    """The first line of an error's message (its class name where it has none), cut to ``width`` characters: what a
    message quotes of a library's error."""
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return line if len(line) <= width else line[:width - 1] + "…"


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is about the input (exit code 2), not a fault of graftui (exit code 1): running out of memory is
    the input's size against the machine's."""
    return isinstance(err, (ValueError, OSError)) or out_of_memory(err)


def out_of_memory(err: BaseException) -> bool:
    """The host's MemoryError, or torch's for a device (named so: this module imports no torch)."""
    return isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"
