"""What a hosted server's tabs offer, it queues: the Fine-tune tab with its defaults (and with a LoRA adapter), and
Localize on the offline lm-evaluation-harness tasks its list offers, pass the checks a server makes before a job is
queued; a harness task it does not run is refused there in one line that says why. No model is loaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from graftui import hosted, settings
from graftui.config import DEFAULT_BASE, DEFAULT_TASK, LR_FOR
from graftui.errors import RequestError
from graftui.requests import FinetuneRequest, LocalizeRequest
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
    """The test's own home (conftest: SmolLM2 is dequantised once for the run), served as a shared server."""
    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
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


@pytest.mark.parametrize("task, finetuned", [("lm-eval:graftui_dates", "smollm2-dates"),
                                             ("lm-eval:graftui_movies", "minilm-movies"),
                                             ("lm-eval:graftui_numbers,graftui_dates", "smollm2-dates")])
def test_hosted_localize_queues_the_offline_harness_tasks(hosted_server, task, finetuned):
    loc = LocalizeRequest.defaults()
    forms.submit_localize(hosted_server, base="smollm2" if "smollm2" in finetuned else DEFAULT_BASE,
                          finetuned=finetuned, task=task, columns={**forms.data_columns(task), **forms.prompt_fields()},
                          method=loc["method"], log_sparsity=-2, steps=loc["steps"], examples_per_class=None,
                          lr=loc["lr"])
    assert [p["task"] for p in hosted_server.params] == [task]


@pytest.mark.parametrize("task, named", [("lm-eval:hellaswag", "hellaswag"), ("lm-eval:graftui_dates,arc_easy", "arc_easy"),
                                         ("/etc/task.yaml", "/etc/task.yaml")])
def test_a_harness_task_a_shared_server_does_not_run_is_refused_before_queueing_in_one_line(hosted_server, task,
                                                                                           named):
    with pytest.raises(RequestError) as told:
        hosted.check_request(LocalizeRequest.make(base="smollm2", finetuned="smollm2-dates", task=task),
                             hosted.HostedGuard())
    assert str(told.value).splitlines() == [
        f"lm-eval task '{named}' is not one of the offline harness tasks, the only ones a shared server runs (a "
        "registry task downloads a dataset of any size, and a task YAML may run code): use lm-eval:graftui_movies, "
        "lm-eval:graftui_dates, lm-eval:graftui_numbers, or run graftui on your own machine"]
