"""What a hosted server's tabs offer, it queues: the Fine-tune tab with its defaults (and with a LoRA adapter) passes
the checks a server makes before a job is queued. No model is loaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from graftui import settings
from graftui.config import DEFAULT_BASE, DEFAULT_TASK, LR_FOR
from graftui.requests import FinetuneRequest
from graftui.ui import forms, store


class Queue:
    """A job runner that queues nothing: the requests the forms hand it, after the server's checks."""

    def __init__(self):
        self.params = []

    def history(self) -> list:
        return []

    def quick_held(self) -> int:
        return 0

    def submit(self, kind, title, fn, params=None, **lane):
        self.params.append(params)
        return SimpleNamespace(id=str(len(self.params)), kind=kind, title=title)


@pytest.fixture
def hosted_server(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path))
    monkeypatch.setattr(store, "checkpoints_dir", lambda: tmp_path / "checkpoints")  # a session's own folder
    return Queue()


def test_the_fine_tune_tab_queues_a_job_with_its_defaults_and_with_a_lora_adapter(hosted_server):
    d, ft = store.defaults(), FinetuneRequest.defaults()
    tab = {"optimizer": ft["optimizer"], "lr": d["ft_lr"], "epochs": d["ft_epochs"],
           "train_examples": d["ft_train_examples"], "l1": ft["l1"], "lora_rank": ft["lora_rank"]}
    for base, task, choices in ((DEFAULT_BASE, DEFAULT_TASK, {}),
                                ("smollm2", "dates", {"optimizer": "adamw", "lr": 10 * LR_FOR["adamw"], "l1": 0,
                                                      "lora_rank": 8})):
        forms.submit_finetune(hosted_server, base=base, task=task,
                              columns={**forms.data_columns(task), **forms.prompt_fields()}, **{**tab, **choices})
    whole, lora = hosted_server.params
    assert (whole["lora_rank"], lora["lora_rank"]) == (0, 8)
    for request in (whole, lora):  # scored on the app's comparison size, within the server's ceiling
        assert request["test_examples"] == d["test_examples"] <= settings.HOSTED_CEILINGS["test_examples"]
