"""The Python API as a notebook user meets it: the README's example, run exactly as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

pytestmark = pytest.mark.e2e


def readme_example() -> str:
    text = README.read_text()
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch, capsys):
    import graftui
    from graftui import flows

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRAFTUI_FAST", "1")  # the quick default recipe and mask settings: same code, seconds
    monkeypatch.chdir(tmp_path)
    flows.clear_cache()
    try:
        exec(compile(readme_example(), str(README), "exec"), {})  # noqa: S102 - our own README
    finally:
        flows.clear_cache()
    printed = capsys.readouterr().out
    assert "10795" in printed and os.fspath(tmp_path / "home" / "regions") in printed
    assert (tmp_path / "movies.safetensors").exists()
    for model in ("fine-tuned", "Top movement", "Random", "movies"):
        assert model in printed, model
    record = graftui.load_region(tmp_path / "movies.safetensors")
    assert record.meta["request"]["verb"] == "localize" and record.meta["request"]["sparsity"] == 0.001


def test_the_api_offers_every_verb_and_the_request_types():
    import graftui
    from graftui.flows import VERBS

    for verb, cls in ((name, v.request) for name, v in VERBS.items()):
        assert callable(getattr(graftui, verb)) and getattr(graftui, verb).__doc__ == cls.__doc__
        assert getattr(graftui, cls.__name__) is cls
    with pytest.raises(graftui.GraftuiError, match="sparsity"):
        graftui.localize(sparsity=2.0)
