"""The command line run in-process, as the tests drive it: exit code, stdout and stderr, and its one-line refusals."""

from __future__ import annotations

import contextlib
import io


def run_cli(*args) -> tuple[int, str, str]:
    from graftui import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def refused(args, line: str) -> str:
    """The command refuses in exactly this one line: exit 2, nothing on stdout, no traceback."""
    code, out, err = run_cli(*args)
    assert (code, out) == (2, ""), (code, out, err)
    assert err.strip().splitlines() == [f"graftui: error: {line}"], err
    return line
