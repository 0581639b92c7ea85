"""``graftui reproduce``: every experiment on the offline default, one report, resumable.

One reduced run (GRAFTUI_FAST: same code, tiny fine-tunes) is interrupted, resumed and read back;
the report's words are checked against its numbers; commands in the report make their requests again.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
import torch

from graftui.flows import reproduction as rep
from graftui.flows import reproduction_report as report_of
from graftui.errors import Cancelled
from graftui.requests import (
    ContinualRequest, EvaluateRequest, FinetuneRequest, LocalizeRequest, MultitaskRequest, ReproduceRequest,
    RetrainRequest, SweepRequest, WiseRequest, command_line,
)


@pytest.mark.parametrize("request_", [
    FinetuneRequest(task="amazon", lr=0.015, epochs=1, train_examples=1000, freeze_head=True, test_examples=500),
    SweepRequest(finetuned="/tmp/a b/ckpt", sparsities=[1e-5, 0.001], methods=["learned", "top-movement"], no_ood=True),
    LocalizeRequest(finetuned="ft", sparsity=0.0003, out="/tmp/r.safetensors", steps=7, seed=3),
    EvaluateRequest(regions=["a.safetensors", "b.safetensors"], baselines=True, ood=["amazon", "tweets"], n=500),
    WiseRequest(region="a.safetensors", alphas=[0.0, 0.25, 1.0], n=500),
    RetrainRequest(region="a.safetensors", ft_lr=0.015, epochs=1, train_examples=1000, n=500),
    MultitaskRequest(ft_lr=0.015, epochs=1, train_examples=1000, n=500, out="/tmp/mt"),
    ContinualRequest(tasks=["movies", "bbc"], train_examples=0, out="/tmp/cl"),
    ReproduceRequest(quick=True, out="/tmp/report dir"),
])
def test_a_reported_command_makes_the_same_request(request_, monkeypatch):
    import shlex

    from graftui.cli import build_parser, request_from

    monkeypatch.delenv("GRAFTUI_FAST", raising=False)
    words = shlex.split(command_line(request_))
    assert words[:2] == ["graftui", request_.verb]
    args = build_parser().parse_args(words[1:])
    assert request_from(args, args.request_cls) == request_


def test_recipe_fields_change_only_what_they_name(monkeypatch):
    from graftui.requests import DEFAULT_RECIPE

    monkeypatch.delenv("GRAFTUI_FAST", raising=False)
    assert MultitaskRequest().recipe() == DEFAULT_RECIPE
    quick = ContinualRequest(ft_lr=0.015, epochs=1, train_examples=0).recipe()
    assert (quick.lr, quick.epochs, quick.train_examples) == (0.015, 1, None)
    assert quick.optimizer == DEFAULT_RECIPE.optimizer and quick.batch_size == DEFAULT_RECIPE.batch_size
    assert RetrainRequest(seed=4).recipe(seed=4).seed == 4


def tiny_causal_lm(folder):
    """A config-built GPT-2 with the few-word tokenizer, long enough for the offline sentences: the prompt-based
    steps' base in tests (the real runs use SmolLM2)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from lm_util import make_tokenizer

    tok = make_tokenizer(folder)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=256, resid_pdrop=0,
                               embd_pdrop=0, attn_pdrop=0, pad_token_id=0)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reduced_run(tmp_path_factory):
    """A reduced run that is cancelled in its fourth step, then resumed, then read back whole."""
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("home")
    mp.setenv("GRAFTUI_HOME", str(home))
    mp.setenv("GRAFTUI_FAST", "1")
    out = tmp_path_factory.mktemp("report") / "run"
    mp.setattr(rep, "TINY", replace(rep.TINY, prompt={**rep.TINY.prompt, "base": str(tiny_causal_lm(home / "tiny-lm"))}))
    cancel, events = threading.Event(), []

    def progress(event):
        events.append(event)
        if str(event.get("stage", "")).startswith("[4/"):
            cancel.set()

    import graftui

    try:
        with pytest.raises(Cancelled):
            graftui.reproduce(out=str(out), progress=progress, cancel=cancel)
        saved_after_cancel = sorted(p.stem for p in (out / "steps").glob("*.json"))
        resumed = graftui.reproduce(out=str(out))
        again = graftui.reproduce(out=str(out))
        yield {"out": out, "events": events, "saved_after_cancel": saved_after_cancel, "resumed": resumed,
               "again": again}
    finally:
        mp.undo()


@pytest.mark.slow
def test_reduced_run_writes_the_report_with_every_experiment(reduced_run):
    out = reduced_run["out"]
    doc = json.loads((out / "report.json").read_text())
    for key in ("single_task", "calibration", "wise", "multitask", "retrain", "continual"):
        assert doc[key], key
    mt = doc["multitask"]
    n = len(mt["tasks"])
    assert mt["tasks"] == ["movies", "amazon"]  # the reduced run's multi-task model (the full run adds bbc)
    for matrix in (mt["overlap"], mt["relative_gain"]):
        assert len(matrix) == n and all(len(row) == n for row in matrix)
    assert all(mt["overlap"][i][i] == 1.0 for i in range(n))
    assert mt["union"]["size"] >= max(mt["sizes"]) and len(mt["purified"]["relative_gain"]) == n
    assert [c["setting"].split(" (")[0] for c in doc["calibration"]["settings"]] == ["standard head", "frozen head",
                                                                                     "prompt-based"]
    assert doc["calibration"]["not_measured"] == []
    prompt, ev = doc["prompt"], json.loads((out / "steps" / "evaluate-prompt.json").read_text())["result"]
    by = {r["model"]: r for r in ev["rows"]}
    assert prompt["models"]["ft"]["accuracy"] == by["fine-tuned"]["accuracy"]
    assert prompt["models"]["zero_shot"]["ece"] == by["pre-trained, same prompt"]["ece"]
    assert prompt["sparsity"] == 1e-4 and prompt["k"] == next(r["region_size"] for r in ev["rows"]
                                                             if r.get("method") == "learned")
    paired = prompt["graft_minus_top_movement"]["accuracy"]
    assert paired["b"] == next(r["model"] for r in ev["rows"] if r.get("method") == "top-movement")
    assert paired["ci"][0] <= paired["diff"] <= paired["ci"][1]
    assert doc["calibration"]["settings"][2]["ft"]["ece"] == by["fine-tuned"]["ece"]
    assert doc["continual"]["forgetting"]["forget-free"] == [0.0] * len(doc["continual"]["tasks"])
    text = (out / "report.md").read_text()
    for heading in ("## 1.", "## 1b. The paper's main setting: prompt-based fine-tuning", "## 2. Calibration", "## 4. WiSE", "## 5. Multi-task", "## 6. Re-training",
                    "## 7. Forget-free", "## What did not reproduce"):
        assert heading in text
    for step in doc["steps"]:  # every step names the command that makes it again
        assert step["command"].startswith("graftui ") and f"`{step['command']}`" in text
    assert {f"figures/{name}.html" for name in ("calibration", "wise", "continual")} <= set(doc["figures"])
    assert all((out / f).stat().st_size > 1000 for f in doc["figures"]) and (out / "figures" / "plotly.min.js").exists()


@pytest.mark.slow
def test_reduced_run_announces_its_plan_and_resumes_where_it_stopped(reduced_run):
    first = reduced_run["events"][0]
    assert first["announce"] and "steps, about" in first["stage"]
    fractions = [e["fraction"] for e in reduced_run["events"] if "fraction" in e]
    assert fractions == sorted(fractions) and fractions[-1] < 1  # it stopped part way
    assert reduced_run["saved_after_cancel"] == ["finetune", "localize", "sweep"]
    resumed = reduced_run["resumed"]
    assert resumed.reused == ["finetune", "sweep", "localize"]
    assert reduced_run["again"].reused == [s["step"] for s in resumed.report["steps"]]  # nothing ran the third time
    assert reduced_run["again"].report["single_task"] == resumed.report["single_task"]


@pytest.mark.slow
def test_one_step_re_runs_from_its_saved_request(reduced_run, monkeypatch, tmp_path):
    from graftui import flows

    monkeypatch.setenv("GRAFTUI_FAST", "1")
    saved = json.loads((reduced_run["out"] / "steps" / "wise.json").read_text())
    again = flows.run_file(reduced_run["out"] / "steps" / "wise.json")
    assert again.as_dict()["rows"] == saved["result"]["rows"]


@pytest.mark.slow
def test_the_report_says_what_did_not_reproduce(reduced_run, tmp_path):
    """Make the graft worse calibrated than FT in the saved numbers: the report must say so."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reduced_run["out"], out)
    path = out / "steps" / "evaluate.json"
    doc = json.loads(path.read_text())
    for row in doc["result"]["rows"]:
        row["ece"] = 0.01 if row["model"] == "fine-tuned" else 0.2
    paired = [d for d in doc["result"]["differences"] if d["b"] == "fine-tuned" and d["metric"] == "ece"
              and d["task"] == doc["result"]["task"]]
    assert paired  # the evaluate step holds each graft's ECE − FT's with its paired interval
    for d in paired:
        d.update(diff=0.19, ci=[0.15, 0.23])
    path.write_text(json.dumps(doc))
    results = {p.stem: json.loads(p.read_text())["result"] for p in (out / "steps").glob("*.json")}
    results["multitask"]["p_one"][1] = results["multitask"]["p_zero"][1] + 0.01  # a task the model did not learn
    report = report_of.build_report(rep.TINY, results, reduced_run["resumed"].report["steps"], 1.0)
    text = report_of.write_markdown(report)
    assert "the finding **does not reproduce** in this setting" in text
    assert any(x.startswith("the multi-task model did not learn amazon") for x in report["problems"])
    assert "## Problems with this run" in text
    assert any("lower ECE for the graft with a standard head" in x for x in report["did_not_reproduce"])
    assert report["calibration"]["settings"][0]["ece_change"] == pytest.approx((0.2 - 0.01) / 0.01)
    assert report["calibration"]["settings"][0]["verdict"] == "contradicted" and "+0.190 [+0.150, +0.230]" in text
    # an interval holding zero decides nothing, whatever the sign of the difference
    for d in paired:
        d.update(diff=0.19, ci=[-0.01, 0.4])
    path.write_text(json.dumps(doc))
    results["evaluate"] = doc["result"]
    report = report_of.build_report(rep.TINY, results, reduced_run["resumed"].report["steps"], 1.0)
    assert report["calibration"]["settings"][0]["verdict"] == "undecided"
    assert not any("lower ECE for the graft with a standard head" in x for x in report["did_not_reproduce"])
    assert "the finding **is not decided at this n**" in report_of.write_markdown(report)
    assert report_of.verdict({"ci": [0.01, 0.02]}, 1) == "reproduces" and report_of.verdict({"ci": [-0.3, -0.1]}, 1) == "contradicted"


def test_reproduce_refuses_a_folder_it_did_not_write(tmp_path):
    from graftui.errors import RequestError

    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(RequestError, match="not empty"):
        ReproduceRequest(out=str(tmp_path)).validate()
    (tmp_path / "file").write_text("x")
    with pytest.raises(RequestError, match="is a file"):
        ReproduceRequest(out=str(tmp_path / "file")).validate()
    assert (tmp_path / "precious.txt").read_text() == "keep me"


@pytest.mark.slow
def test_the_app_shows_a_finished_report_and_offers_its_files(reduced_run, tmp_path):
    from types import SimpleNamespace

    from graftui.ui.tabs import laboratory

    doc = reduced_run["again"].as_dict()
    files, text = laboratory.render_reproduce(SimpleNamespace(result=doc))
    assert [f.rsplit("/", 1)[1] for f in files] == ["report.md", "report.json"]
    assert text == (reduced_run["out"] / "report.md").read_text() and "## 5. Multi-task" in text
    assert laboratory.render_reproduce(None) == [None, ""]
    gone = laboratory.render_reproduce(SimpleNamespace(result={**doc, "out": str(tmp_path / "deleted")}))
    assert gone == [None, "The report file is gone."]


@pytest.mark.slow
def test_a_resumed_run_reruns_every_step_after_a_missing_one(reduced_run, tmp_path, monkeypatch):
    import shutil

    import graftui
    from graftui.errors import RequestError

    monkeypatch.setenv("GRAFTUI_FAST", "1")
    out = tmp_path / "run"
    shutil.copytree(reduced_run["out"], out)
    for saved in (out / "steps").glob("*.json"):  # the copy's steps name the copy's files, as a moved run would
        saved.write_text(saved.read_text().replace(str(reduced_run["out"]), str(out)))
    names = [s["step"] for s in reduced_run["again"].report["steps"]]
    (out / "steps" / f"{names[-2]}.json").unlink()
    again = graftui.reproduce(out=str(out))
    assert again.reused == names[:-2]  # the missing step and the one after it ran again
    (out / "reproduce.json").write_text('{"mode": "quick"}')
    with pytest.raises(RequestError, match="holds a quick reproduce run, not a tiny one"):
        graftui.reproduce(out=str(out))


def test_a_saved_step_from_before_a_request_field_existed_is_reused_at_that_fields_default(tmp_path):
    """A field added to a request later counts as its default in a saved step; another value is a new request."""
    from graftui.flows.reproduction import _saved
    from graftui.requests import LocalizeRequest

    request = LocalizeRequest(task="movies", sparsity=0.001)
    old = {k: v for k, v in json.loads(json.dumps(request.as_dict())).items() if k != "logit_dtype"}
    path = tmp_path / "localize.json"
    path.write_text(json.dumps({"request": old, "result": {"k": 7}}))
    assert _saved(path, request) == {"k": 7}
    path.write_text(json.dumps({"request": {**old, "logit_dtype": "float16"}, "result": {"k": 7}}))
    assert _saved(path, request) is None
    path.write_text(json.dumps({"request": {**old, "sparsity": 0.01}, "result": {"k": 7}}))
    assert _saved(path, request) is None
    path.write_text(json.dumps({"request": {**old, "memory": "lean"}, "result": {"k": 7}}))
    assert _saved(path, request) == {"k": 7}  # the memory mode changes the speed, not the result


@pytest.mark.slow
def test_seeds_replicate_the_single_task_steps_and_the_report_reads_them_together(reduced_run, monkeypatch,
                                                                                  tmp_path):
    """``--seeds N`` runs sweep, localize and evaluate once per mask-learning seed; the report gives mean (std)
    and decides each finding by the interval over seeds."""
    from dataclasses import replace

    from graftui.errors import RequestError

    monkeypatch.setenv("GRAFTUI_FAST", "1")
    assert rep.FULL.seeds == 3 and rep.QUICK.seeds == 1 and rep.scale_of(ReproduceRequest(seeds=2)).seeds == 2
    with pytest.raises(RequestError, match="--seeds: give a number of seeds from 1 to"):
        ReproduceRequest(seeds=0).validate()
    scale = replace(rep.TINY, seeds=2)
    steps = {s.name: s for s in rep.plan(scale, tmp_path)}
    R = {"finetune": {"out": "ft"}, "finetune-frozen-head": {"out": "ft2"},
         "localize": {"path": "r.safetensors", "seeds": [{"path": "r-seed0.safetensors"}, {"path": "r-seed1.safetensors"}]}}
    assert steps["sweep"].make(R).seeds == [0, 1] and steps["localize"].make(R).seeds == [0, 1]
    assert steps["evaluate"].make(R).regions == ["r-seed0.safetensors", "r-seed1.safetensors"]
    assert rep.cost_of(scale, steps["localize"]) == 2 * rep.cost_of(rep.TINY, steps["localize"])
    assert rep.cost_of(scale, steps["finetune"]) == rep.cost_of(rep.TINY, steps["finetune"])
    assert rep.plan(rep.TINY, tmp_path)[1].make(R).seeds is None  # one seed: the request the single run makes

    # the evaluate step as two seeds' regions would leave it: a replicate group, its rows and differences
    results = {p.stem: json.loads(p.read_text())["result"] for p in (reduced_run["out"] / "steps").glob("*.json")}
    ev = results["evaluate"]
    label = report_of._label_of(ev["rows"])
    group = "movies-learned (seeds 0, 1)"
    rows = [{**r, "model": group, "accuracy_std": 0.02, "ece_std": 0.004, "accuracy_seeds": [r["accuracy"]] * 2}
            for r in ev["rows"] if r["model"] == label]
    diffs = [{**d, "a": group, "seeds": 2, "diff": -0.05, "ci": [-0.09, -0.01]} for d in ev["differences"]
             if d["a"] == label]
    ev["replicates"] = [{"name": group, "regions": [label, label], "rows": rows, "differences": diffs}]
    report = report_of.build_report(scale, results, reduced_run["resumed"].report["steps"], 1.0)
    single = report["single_task"]
    assert single["seeds"] == 2 and single["graft_std"]["accuracy"] == 0.02
    assert single["graft_minus_ft"]["ece"]["a"] == group and single["graft_minus_ft"]["ece"]["seeds"] == 2
    assert report["calibration"]["settings"][0]["verdict"] == "reproduces"  # ECE −0.05 [−0.09, −0.01]
    text = report_of.write_markdown(report)
    assert "(mean (std) over 2 mask-learning seeds)" in text and "graft − FT ECE: " in text
    assert f"{single['accuracy']['graft']:.3f} (0.020)" in text
