"""Inputs a visitor hands over, each one line or the right behaviour, nothing written: what the last hostile round found
partial (a task string of megabytes, a prompt on a classifier on a hosted server, a budget a method cannot meet, a
completion upload, a warning's HTML, a damaged job record, --check-n 0 with seeds, a harness task on a classifier)."""

from __future__ import annotations

import json

import pytest

from cli_util import refused, run_cli
from test_learner_plan import localize_args, tiny_folders  # noqa: F401 - the fixture


def test_a_megabyte_task_string_is_not_echoed_back(tmp_path):
    code, out, err = run_cli("localize", "--task", "x" * 5_000_000, "--out", tmp_path / "r.safetensors")
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1
    assert len(err) < 1100 and "(5,000,000 characters, longer than any file name)" in err, len(err)
    assert not (tmp_path / "r.safetensors").exists()


def test_seeds_with_check_n_0_check_no_seed(tiny_folders, tmp_path, monkeypatch):  # noqa: F811
    from graftui.flows import single

    calls = []
    real = single.quick_check
    monkeypatch.setattr(single, "quick_check", lambda *a, **k: calls.append(a) or real(*a, **k))
    code, _, err = run_cli(*localize_args(tiny_folders, tmp_path / "r.safetensors", "--seeds", "0,1", "--steps", "2"))
    assert code == 0, err
    assert calls == []
    code, _, err = run_cli(*localize_args(tiny_folders, tmp_path / "s.safetensors", "--seeds", "0,1", "--steps", "2",
                                          "--check-n", "8"))
    assert code == 0 and len(calls) >= 2, err  # asked for: each seed checks


def test_a_budget_the_method_cannot_meet_is_said(tiny_folders, tmp_path):  # noqa: F811
    code, out, err = run_cli(*localize_args(tiny_folders, tmp_path / "r.safetensors", "--method", "bias-only",
                                            "--sparsity", "0.5"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    note = next(n for n in doc["notes"] if "fewer than the budget" in n)
    assert note.startswith(f"the method 'bias-only' gave {doc['k']:,} parameters (") and "it has no more to give" in note


def test_a_prompt_on_a_classifier_is_refused_before_a_hosted_job_is_queued(monkeypatch, tmp_path):
    from graftui import hosted
    from graftui.errors import ModelError
    from graftui.requests import LocalizeRequest

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path))
    guard = hosted.HostedGuard()
    with pytest.raises(ModelError, match="'minilm' is a sequence classifier: --template, --label-words and "
                                         "--label-scoring are for causal or masked language models"):
        hosted.check_request(LocalizeRequest.make(finetuned="minilm", template="{text} It was"), guard)
    hosted.check_request(LocalizeRequest.make(finetuned="minilm"), guard)  # without a prompt: queued


def test_a_harness_task_on_a_classifier_pair_names_what_the_harness_scores():
    from types import SimpleNamespace

    from graftui.kinds import kind_named

    harness = kind_named("lm-eval")
    pair = SimpleNamespace(finetuned_ref="minilm-movies", completion=False)
    line = harness.misread(pair, SimpleNamespace(name="lm-eval:graftui_movies"))
    assert line.startswith("'lm-eval:graftui_movies' is an lm-evaluation-harness task, which scores a causal language "
                           "model") and "'minilm-movies' is read as a classifier" in line


@pytest.mark.parametrize("header, said", [
    ("prompt,completion\n", "the prompt column 'prompt' and the completion column 'completion'"),
    ("question,answer\n", "the prompt column 'question' and the completion column 'answer'"),
])
def test_a_completion_upload_is_read_as_one(tmp_path, monkeypatch, header, said):
    from graftui.ui import forms

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    source = tmp_path / "skills.csv"
    source.write_text(header + "".join(f"what is {i} plus one?,{i + 1}\n" for i in range(40)))
    path, info = forms.read_data_upload(str(source))
    assert not any("could not guess" in w for w in info["warnings"]), info["warnings"]
    text, status = forms.upload_summary(path, info)
    assert f"read as a completion task, by {said}" in text and status == f"✓ Read {path.name}."


def test_a_chat_upload_is_read_as_one(tmp_path, monkeypatch):
    from graftui.ui import forms

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"},
                                                       {"role": "assistant", "content": f"hello {i}"}]}) + "\n"
                              for i in range(40)))
    path, info = forms.read_data_upload(str(source))
    assert "could not guess" not in " ".join(info["warnings"])
    assert "read as a completion task, by the chat column 'messages'" in forms.upload_summary(path, info)[0]


def test_a_warning_shows_a_form_value_as_text_not_html(monkeypatch):
    import gradio as gr

    from graftui.errors import RequestError
    from graftui.ui import wiring

    shown = []
    monkeypatch.setattr(gr, "Warning", shown.append)
    status = object()

    @wiring.guarded(status)
    def handler():
        raise RequestError("unknown task '<img src=x onerror=alert(1)><b>bold</b><a href=//x>link</a>'")

    out = handler()
    for text in (shown[0], out[status]):
        assert "<img" not in text and "<b>" not in text and "<a " not in text
        assert "&lt;img src=x onerror=alert(1)&gt;&lt;b&gt;bold&lt;/b&gt;" in text


def test_a_damaged_job_record_stays_listed_to_its_own_session(tmp_path):
    from graftui.jobs import FAILED, JobRunner

    runner = JobRunner(tmp_path)
    owner = "a" * 32
    job = runner.submit("localize", "t", lambda ctx: {}, owner=owner)
    runner.wait(job.id, timeout=30)
    (tmp_path / job.id / "job.json").write_text("{not json")
    again = JobRunner(tmp_path).get(job.id)
    assert again.status == FAILED and again.kind == "damaged" and again.owner == owner
    assert "the record of this job is damaged" in again.error


# -- the partial cases of a later round: each one line that names the problem and the fix, nothing written ------------
def test_a_task_name_longer_than_any_file_name_says_no_such_file_exists(tmp_path):
    """A name the file system cannot even look up (Errno 36) names no file: said so, in a line that does not echo it."""
    from graftui import localize
    from graftui.errors import DataError, message

    with pytest.raises(DataError) as told:
        localize(task="a" * 200_000, out=str(tmp_path / "r.safetensors"))
    assert message(told.value) == ("no such file or folder: '" + "a" * 60 + "…' (200,000 characters, longer than any "
                                   "file name); name an offline task, a file or a Hugging Face dataset id")
    assert not list(tmp_path.iterdir())


def test_a_task_yaml_given_after_lm_eval_is_told_to_drop_the_prefix(tmp_path):
    refused(("localize", "--task", "lm-eval:path/to/x.yaml", "--out", tmp_path / "r.safetensors"),
            "'lm-eval:path/to/x.yaml' gives a task YAML after 'lm-eval:', which names the harness's registered tasks: "
            "drop the prefix and give the file's path alone (--task path/to/x.yaml)")
    assert not list(tmp_path.iterdir())


def test_a_head_the_checkpoint_does_not_have_is_refused_before_work(tiny_folders, tmp_path, monkeypatch):  # noqa: F811
    """--head causal-lm on a sequence classifier read it as a causal LM at chance (FT, base and region alike); on a
    shared server the job's notes said nothing. Refused before a model is loaded, and before a hosted job is queued."""
    from graftui import hosted
    from graftui.errors import ModelError
    from graftui.requests import LocalizeRequest

    base, ft, task = tiny_folders
    out = tmp_path / "r.safetensors"
    line = (f"'{ft}' is a classifier, with no causal LM head for --head causal-lm to read it by: drop --head (auto "
            "reads a checkpoint as what it is)")
    refused(localize_args(tiny_folders, out, "--head", "causal-lm"), line)
    assert not out.exists()
    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    with pytest.raises(ModelError, match="'minilm' is a classifier, with no masked LM head for --head masked-lm"):
        hosted.check_request(LocalizeRequest.make(finetuned="minilm", head="masked-lm"), hosted.HostedGuard())


def test_a_probe_by_layer_of_two_regions_is_told_in_words_the_page_reads(monkeypatch):
    """The Try box of a page with two regions picked and 'one layer at a time': the line names its widgets by their
    labels, and still reads (it said "give one Regions to evaluate (got 2)")."""
    from graftui import requests
    from graftui.errors import RequestError
    from graftui.ui.wiring import in_words

    monkeypatch.setattr(requests, "check_region_file", lambda path: None)
    with pytest.raises(RequestError) as told:
        requests.PredictRequest.make(regions=["a.safetensors", "b.safetensors"], texts=["x"], by="layer").validate()
    assert str(told.value) == "--by looks into one region, part by part, and 2 are given in --region: keep one"
    labels = {"by": "Graft the region", "region": "Regions to evaluate (one fine-tuned model, or the same regions of "
                                                  "several fine-tunes)"}
    assert in_words(str(told.value), labels) == ("Graft the region looks into one region, part by part, and 2 are "
                                                 "given in Regions to evaluate: keep one")
