"""Bad or partial input told in the words of what was given, through the CLI on tiny config-built models: a completion
file missing one of its columns, --head completion on a classification task, a region scored on a task of the other
kind, and a localization with one seed (which has no core or union to write)."""

from __future__ import annotations

import json

import pytest

from graftui.config import COMPLETION_SPARSITY, DEFAULT_SPARSITY
from graftui.kinds import CLASSIFICATION, COMPLETION_KIND, HARNESS, named_kind
from graftui.ui import forms


from cli_util import refused, run_cli
from lm_util import write_completion_task, write_lm_pair, write_task


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny GPT-2 pair, a classification and a completion task, and a region of each (top movement: no training)."""
    root = tmp_path_factory.mktemp("kinds")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(root / "home"))
        base, ft = write_lm_pair(root, "gpt2")
        words, opposites = write_task(root / "words.csv"), write_completion_task(root / "opposites.csv")
        common = ["--base", base, "--finetuned", ft, "--method", "top-movement", "--sparsity", "0.05", "--check-n", "0"]
        code, _, err = run_cli("localize", *common, "--task", words, "--label-words", "negative= bad,positive= good",
                               "--out", root / "words.safetensors")
        assert code == 0, err
        code, _, err = run_cli("localize", *common, "--task", opposites, "--head", "completion",
                               "--out", root / "opposites.safetensors")
        assert code == 0, err
        yield {"root": root, "base": str(base), "ft": str(ft), "words": words, "opposites": opposites,
               "common": common}


def test_a_completion_file_missing_a_column_says_which_and_names_the_completion_options(setup, tmp_path, no_models):
    prompts, answers = tmp_path / "prompts.csv", tmp_path / "answers.csv"
    prompts.write_text("prompt,notes\n" + "say hi,x\n" * 12)
    answers.write_text("completion,notes\n" + " hi,x\n" * 12)
    out = tmp_path / "r.safetensors"
    refused(["localize", "--base", setup["base"], "--finetuned", setup["ft"], "--task", prompts, "--out", out],
            "prompts.csv has a prompt column ('prompt') but no completion column: name it with --completion-column (and "
            "the prompt's with --prompt-column if it is not 'prompt'); available columns: prompt, notes")
    refused(["localize", "--base", setup["base"], "--finetuned", setup["ft"], "--task", answers, "--out", out],
            "answers.csv has a completion column ('completion') but no prompt column: name it with --prompt-column "
            "(and the completion's with --completion-column if it is not 'completion'); available columns: "
            "completion, notes")
    texts = tmp_path / "texts.csv"  # a classification file without its label is still told in classification words
    texts.write_text("text,target\n" + "good,1\n" * 12)
    refused(["localize", "--base", setup["base"], "--finetuned", setup["ft"], "--task", texts, "--out", out],
            "could not guess the label column of texts.csv; set label_column (--label-column) to one of: text, target")
    assert not out.exists()


@pytest.fixture
def no_models(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr("graftui.models.ModelPair.load", refuse)


def test_head_completion_on_a_classification_task_says_what_is_true(setup, tmp_path, no_models):
    line = ("--head completion reads a causal LM on its own completions, and 'words.csv' is a classification task: drop "
            "--head completion, or give a completion task as --task")
    for verb, extra in (("localize", ["--finetuned", setup["ft"], "--out", tmp_path / "r.safetensors"]),
                        ("finetune", ["--out", tmp_path / "ft"]),
                        ("sweep", ["--finetuned", setup["ft"]])):
        assert "fine-tuned on completions" not in refused(
            [verb, "--base", setup["base"], "--task", setup["words"], "--head", "completion", *extra], line)
    refused(["evaluate", "--region", setup["root"] / "words.safetensors", "--head", "completion"], line)
    assert not (tmp_path / "r.safetensors").exists() and not (tmp_path / "ft").exists()


def test_a_region_scored_on_a_task_of_the_other_kind_is_told_so_without_options_never_given(setup):
    root = setup["root"]
    for verb, extra in (("evaluate", []), ("predict", ["--text", "good is not"])):
        line = refused([verb, "--region", root / "words.safetensors", "--task", setup["opposites"], *extra],
                       f"'words.safetensors' was learned on the classification task '{setup['words']}', and "
                       "'opposites.csv' is a completion task: score it on its own task (drop --task), or give a region "
                       "learned on a completion task")
        assert "--template" not in line and "--label-words" not in line
        refused([verb, "--region", root / "opposites.safetensors", "--task", setup["words"], *extra],
                f"'opposites.safetensors' was learned on the completion task '{setup['opposites']}', and 'words.csv' "
                "is a classification task: score it on its own task (drop --task), or give a region learned on a "
                "classification task")
    # the options a request does give are the ones it is told to drop
    refused(["evaluate", "--region", root / "opposites.safetensors", "--template", "{text} It was"],
            "--template read a language model as a classifier; a completion task scores the model's own completions: "
            "drop it")


def test_one_seed_writes_its_region_alone_and_two_write_their_core_and_union(setup, tmp_path):
    args = ["localize", *setup["common"], "--method", "random", "--task", setup["words"],
            "--label-words", "negative= bad,positive= good"]
    code, out, err = run_cli(*args, "--seeds", "1", "--out", tmp_path / "one.safetensors", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["one-seed1.safetensors"]
    assert doc["path"] == str(tmp_path / "one-seed1.safetensors") and doc["stability"] is None
    assert [e["seed"] for e in doc["seeds"]] == [1]
    assert "one seed (1): its region is written alone; give two or more --seeds for their core, union and " \
           "stability" in doc["notes"]
    code, out, err = run_cli(*args, "--seeds", "1", "--out", tmp_path / "one.safetensors")  # read back, printed
    assert code == 0 and "one-seed1.safetensors  (read back)" in out and "found by every seed" not in out
    code, out, err = run_cli(*args, "--seeds", "0,1", "--out", tmp_path / "two.safetensors", "--json")
    assert code == 0, err
    assert {"two-seed0.safetensors", "two-seed1.safetensors", "two-core.safetensors", "two-union.safetensors"} <= {
        p.name for p in tmp_path.iterdir()}


@pytest.mark.parametrize("ref, kind, columns, named", [
    ("dates", "auto", False, "completion"), ("numbers", "auto", False, "completion"),
    ("movies", "auto", False, "classification"), ("BBC", "auto", False, "classification"),
    ("lm-eval:graftui_dates", "auto", False, "lm-eval"), ("my.csv", "auto", False, None),
    ("my.csv", "auto", True, "completion"), ("my.csv", "classification", False, "classification"),
    ("movies", "completion", False, "completion"), (None, "auto", False, None)])
def test_a_task_names_its_kind_before_it_is_read_where_its_name_can(ref, kind, columns, named):
    found = named_kind(ref, kind, {"prompt_column"} if columns else ())
    assert (found.name if found is not None else None) == named


def test_each_kind_has_its_budget_and_the_app_follows_it_until_one_is_chosen_by_hand():
    assert COMPLETION_KIND.sparsity == HARNESS.sparsity == COMPLETION_SPARSITY  # a harness task's regions are learned
    assert CLASSIFICATION.sparsity == DEFAULT_SPARSITY  # on the completion loss, as a completion task's are
    assert forms.budget_for("dates", -3) == -2 and forms.budget_for("movies", -2) == -3
    assert forms.budget_for("my.csv", -3) is None  # only reading the file could tell its kind
    assert forms.budget_for("dates", -2.5) is None  # a budget chosen by hand stays


def test_a_fine_tune_picked_brings_its_base_task_and_their_ood_tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path))
    assert forms.pair_of("smollm2-dates") == ("smollm2", "dates") and forms.pair_of("minilm-movies") == \
        ("minilm", "movies")
    assert forms.pair_of("someone/a-hub-model") is None
    made = tmp_path / "checkpoints" / "mine"
    made.mkdir(parents=True)
    (made / "config.json").write_text("{}")
    (made / "graftui_record.json").write_text(json.dumps({"base": "smollm2", "task": "numbers"}))
    assert forms.pair_of(str(made)) == ("smollm2", "numbers")
    assert CLASSIFICATION.scores_ood and not COMPLETION_KIND.scores_ood and not HARNESS.scores_ood
    assert forms.default_ood("movies") == ["amazon", "tweets"] and forms.default_ood("dates") == []
    assert forms.default_ood("bbc") == [] and forms.default_ood("my.csv") == []
    said = forms.ood_preview("dates", {}, ["amazon"], None)
    assert "'dates' is a completion task" in said and "clear the out-of-distribution tasks" in said


@pytest.mark.parametrize("verb, tasks, kind", [("multitask", "movies,dates", "completion"),
                                              ("continual", "lm-eval:graftui_dates,movies", "lm-eval")])
def test_the_laboratory_asks_the_kind_and_refuses_a_task_of_another_before_any_work(verb, tasks, kind):
    """The paper's experiments run on classification tasks: a completion or harness task is named, with the kinds the
    verb works on, before a model is loaded."""
    code, out, err = run_cli(verb, "--tasks", tasks)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"is a {kind} task, and {verb} works on classification tasks" in err
