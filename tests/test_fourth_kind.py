"""A task kind is one folder (here one module) and one registration: a fourth kind, written in a temporary module
outside the package, is found by every part of graftui that asks which kind a task is, with no edit anywhere else."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import SimpleNamespace

import pytest

from graftui import kinds
from graftui.errors import RequestError
from graftui.requests import LocalizeRequest
from graftui.kinds import KINDS
from graftui.ui import runs  # imported before the fourth kind: the page's columns are those of the kinds it knew

from cli_util import run_cli

ECHO = '''
from dataclasses import dataclass

from graftui.card import Words
from graftui.tasks.base import TaskKind, register_kind


@dataclass
class EchoTask:
    name: str
    notes: tuple = ()


class Echo(TaskKind):
    """Each prompt's answer is the prompt itself."""
    name = "echo"
    words = Words(score="echo match", calibration="-", reference="pre-trained", scored_by="whether it repeats")
    task_type = EchoTask
    verbs = ("localize", "evaluate")
    order, tried = 5, None
    fields = ("echo_column",)

    def names(self, key):
        return key.startswith("echo:")

    def read(self, ref, spec, guard):
        return guard.checked_task(EchoTask(ref))

    def made(self, meta):
        return (meta.task or "").startswith("echo:")

    def offline(self):
        return {"echo:abc": "repeats its prompt"}


ECHO = register_kind(Echo())
'''


@pytest.fixture
def echo(tmp_path):
    path = tmp_path / "echo_kind.py"
    path.write_text(ECHO)
    spec = importlib.util.spec_from_file_location("echo_kind", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["echo_kind"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        KINDS.pop("echo", None)
        sys.modules.pop("echo_kind", None)


def test_a_fourth_kind_is_one_module_and_one_registration(echo, capsys):
    from graftui.flows.common import LOCAL

    kind = echo.ECHO
    assert kinds.named_kind("echo:abc") is kind and kinds.named_kind("movies") is kinds.CLASSIFICATION
    task = kinds.read_task(LocalizeRequest(task="echo:abc"), LOCAL)
    assert isinstance(task, echo.EchoTask) and kinds.kind_of(task) is kind
    assert kinds.read_task_as("echo:abc", None, LOCAL).name == "echo:abc"
    assert kinds.region_kind(SimpleNamespace(task="echo:abc", loading={})) is kind
    assert kinds.region_kind(SimpleNamespace(task="movies", loading={})) is kinds.CLASSIFICATION

    assert "echo" in kinds.task_kinds()  # --task-kind offers it, and a request may name it
    LocalizeRequest(task="x.csv", task_kind="echo").validate()
    with pytest.raises(RequestError, match="unknown task kind 'nope'; choose from auto, classification, completion, "
                                           "echo"):
        LocalizeRequest(task="x.csv", task_kind="nope").validate()
    with pytest.raises(RequestError, match="--prompt-column, --completion-column and --messages-column are for "
                                           "completion tasks; drop them or use --task-kind completion"):
        LocalizeRequest(task="x.csv", task_kind="echo", prompt_column="q").validate()
    with pytest.raises(RequestError, match="'echo:abc' is a echo task, and sweep works on classification, "
                                           "completion tasks"):
        kind.supports("sweep", task)

    code, out, _ = run_cli("tasks", "--json")  # graftui tasks lists its offline tasks
    assert code == 0
    assert {"name": "echo:abc", "kind": "echo", "description": "repeats its prompt"} in json.loads(out)["tasks"]

    row = {"id": "r", "task": "echo:abc", "method": "learned", "budget": "0.01", "k": 5, "seed": 0, "run": "",
           "accuracy": 0.42, "score_name": kind.words.score, "ece": None, "ood_accuracy": None, "curve": False,
           "tags": [], "note": ""}
    table = runs.runs_table([row])  # its score under its own name in the app's runs table
    assert table["echo match"].tolist() == ["42.0%"] and table["accuracy"].tolist() == [""]
    KINDS.pop("echo")
    assert "echo" not in kinds.task_kinds() and "echo match" not in runs.runs_table([]).columns
