"""The one reader of an error's first line and the one file digest every module uses."""

from __future__ import annotations

import hashlib

from graftui.errors import first_line
from graftui.paths import file_sha256


def test_the_first_line_of_an_error_is_its_message_cut_or_its_class():
    assert first_line(ValueError("  bad value\nTraceback and more")) == "bad value"
    assert first_line(KeyError()) == "KeyError"  # no message: its class
    assert first_line(OSError("x" * 5000)) == "x" * 199 + "…"  # a megabyte of input is never echoed
    assert first_line("one\ntwo", width=2) == "o…"


def test_a_files_digest_is_its_bytes_and_of_several_files_their_bytes_in_turn(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * (3 << 20) + b"tail")  # more than one block
    b.write_bytes(b"second")
    assert file_sha256(a) == hashlib.sha256(a.read_bytes()).hexdigest()
    assert file_sha256(a, b) == hashlib.sha256(a.read_bytes() + b.read_bytes()).hexdigest()
