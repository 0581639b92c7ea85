"""The Python API as a notebook user meets it: the example of docs/api.md, run exactly as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import link_shared_builds

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"

pytestmark = pytest.mark.e2e


def api_example() -> str:
    text = API_PAGE.read_text()
    section = text.split("# Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_example_runs_as_written(tmp_path, monkeypatch, capsys, shared_builds):
    import graftui
    from graftui import flows

    monkeypatch.setenv("GRAFTUI_HOME", str(link_shared_builds(tmp_path / "home", shared_builds)))  # its default
    # fine-tune is the session's, made once
    monkeypatch.setenv("GRAFTUI_FAST", "1")  # the quick default recipe and mask settings: same code, seconds
    monkeypatch.chdir(tmp_path)
    flows.clear_cache()
    try:
        exec(compile(api_example(), str(API_PAGE), "exec"), {})  # noqa: S102 - our own documentation
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
    with pytest.raises(graftui.GraftuiError, match="predict\\(\\) has no field 'region'; its fields are .*regions"):
        graftui.predict(region="r.safetensors")  # a field of another verb, named as that verb names it
