"""Task kinds are objects: every verb asks the task's kind, and an lm-evaluation-harness task is a third kind that
localizes on its training documents and is scored by the harness itself, agreeing with graftui's own scoring."""

from __future__ import annotations

from pathlib import Path

import pytest

import graftui
from graftui import regions
from graftui.card import ACCURACY
from graftui.tasks.completion.data import offline_skill
from graftui.tasks.classification.data import load_task
from graftui.errors import DataError, RequestError
from graftui.flows import text
from graftui.kinds import CLASSIFICATION, COMPLETION_KIND, HARNESS, KINDS, kind_in, kind_named, kind_of, region_kind
from graftui.tasks.harness.kind import load_harness, sample_ids

from cli_util import refused

TASK = "lm-eval:graftui_dates"


def test_each_task_is_read_by_exactly_its_own_kind():
    movies, dates, harness = load_task("movies"), offline_skill("dates"), load_harness(TASK)
    assert [kind_of(t) for t in (movies, dates, harness)] == [CLASSIFICATION, COMPLETION_KIND, HARNESS]
    assert set(KINDS) == {"classification", "completion", "lm-eval"}
    # a result that names no kind predates recorded kinds and was a classification; a name no kind has is refused
    assert kind_in({}) is CLASSIFICATION and kind_in({"task_kind": "completion"}) is COMPLETION_KIND
    for name in (None, "", "regression"):
        with pytest.raises(RequestError, match="unknown task kind"):
            kind_named(name)
    assert CLASSIFICATION.words is ACCURACY and COMPLETION_KIND.words.key == "exact_match"
    # a harness task learns on its training documents, never on those it is scored on
    assert len(harness.splits["train"]) == len(dates.splits["train"]) and not len(harness.splits["test"])
    assert harness.splits["train"].examples[0][-1][1].strip() == dates.splits["train"].examples[0][-1][1].strip()


def test_a_harness_task_scores_the_documents_graftui_samples():
    """The documents scored are graftui's test sample of the same size (a task's first documents are often one
    class), so the harness and graftui judge the same examples."""
    harness = load_harness(TASK).harness[0]
    import random

    assert sample_ids(harness, 8) == sorted(random.Random(0).sample(range(harness.n_eval), 8))
    assert sample_ids(harness, None) is None and sample_ids(harness, 10 ** 6) is None


def test_the_columns_of_a_kind_make_the_cli_table():
    rows = [{"model": "fine-tuned", "task": "t", "n": 8, "metric": "acc", "score": 0.5, "stderr": 0.1,
             "region_size": None},
            {"model": "r", "task": "t", "n": 8, "metric": "acc", "score": 0.25, "stderr": 0.1, "region_size": 12}]
    shown = text.rows_table({"rows": rows, "task_kind": "lm-eval"})
    assert shown.splitlines()[0].split() == ["model", "task", "n", "metric", "score", "harness", "stderr", "k"]
    assert "0.250" in shown and "12" in shown.splitlines()[-1]


@pytest.fixture(scope="module")
def harness_region(tmp_path_factory):
    """A region of SmolLM2's quick dates fine-tune learned on the harness task's training documents."""
    from graftui.flows.common import ensure_default

    root = tmp_path_factory.mktemp("harness-kind")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_FAST", "1")  # the quick fine-tune (seconds), named by its folder so every verb reads it
        finetuned = str(ensure_default("smollm2-dates"))
    loc = graftui.localize(base="smollm2", finetuned=finetuned, task=TASK, sparsity=0.01, steps=2,
                           examples_per_class=16, check_n=8, out=str(root / "r.safetensors"))
    return loc, root / "r.safetensors"


@pytest.mark.e2e
def test_a_region_is_learned_on_a_harness_task_and_checked_by_the_harness(harness_region):
    loc, path = harness_region
    record = regions.load(path)
    assert record.meta.task == TASK and record.meta.train_examples == 16 and region_kind(record.meta) is HARNESS
    rows = {r["model"]: r for r in loc.check["rows"]}
    assert set(rows) == {"fine-tuned", "pre-trained, same prompt", "this region"}
    assert all(r["n"] == 8 and r["metric"] == "exact_match,graftui-answer" and r["stderr"] is not None
               for r in rows.values())
    assert any(line.startswith("lm-evaluation-harness, graftui_dates") for line in loc.as_dict()["card"])


@pytest.mark.e2e
def test_the_harness_and_graftui_score_every_model_alike(harness_region):
    """The cross-check through the verbs: evaluate on the harness task and on graftui's own task give each model the
    same score, and the paired differences are the same, example for example."""
    _, path = harness_region
    by_harness = graftui.evaluate(regions=[str(path)], n=8).as_dict()
    by_graftui = graftui.evaluate(regions=[str(path)], task="dates", n=8).as_dict()
    assert by_harness["task_kind"] == "lm-eval" and by_graftui["task_kind"] == "completion"
    harness = {r["model"]: r["score"] for r in by_harness["rows"]}
    own = {r["model"]: r["exact_match"] for r in by_graftui["rows"]}
    assert harness == own and harness["fine-tuned"] > harness["pre-trained, same prompt"]
    paired = {(d["a"], d["b"]): d for d in by_harness["differences"]}
    for d in by_graftui["differences"]:
        if d["metric"] == "exact_match":
            mine = paired[(d["a"], d["b"])]
            assert (mine["diff"], mine["ci"], mine["p"]) == (d["diff"], d["ci"], d["p"])
    shown = text.evaluate(by_harness)
    assert "harness stderr" in shown and "exact_match,graftui-answer" in shown


@pytest.mark.e2e
def test_predict_generates_with_a_harness_region(harness_region):
    _, path = harness_region
    got = graftui.predict(regions=[str(path)], texts=["Write the date 3/4/1999 in words:"]).as_dict()
    assert got["kind"] == "lm-eval" and {r["model"] for r in got["rows"]} == {"fine-tuned",
                                                                              "pre-trained, same prompt", "r"}
    assert all(isinstance(r["generation"], str) for r in got["rows"])


@pytest.mark.e2e
def test_what_a_harness_task_cannot_do_is_said_in_one_line(harness_region, tmp_path):
    _, path = harness_region
    with pytest.raises(RequestError, match="works on classification, completion tasks"):
        graftui.anatomy(region=str(path), ablate=True, n=4)
    with pytest.raises(RequestError, match="judged by the harness's own filters"):
        graftui.evaluate(regions=[str(path)], n=4, answer_regex=r"(\d+)")
    refused(["evaluate", "--region", str(path), "--task", "lm-eval:no_such_task_here"],
            next(iter(_message(DataError, lambda: load_harness("lm-eval:no_such_task_here")))))


def _message(kind, call):
    try:
        call()
    except kind as err:
        yield str(err)


def test_the_documentation_s_table_of_verbs_by_kind_is_the_kinds_own():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text()
    table = page.split("<!-- verbs-by-kind -->")[1].split("<!-- /verbs-by-kind -->")[0].strip().splitlines()
    names = [c.strip() for c in table[0].strip("|").split("|")][1:]
    assert names == list(KINDS)
    for line in table[2:]:
        verb, *marks = [c.strip() for c in line.strip("|").split("|")]
        for name, mark in zip(names, marks):
            assert (mark == "✓") == (verb.split()[0] in KINDS[name].verbs), (verb, name)


def test_a_shared_server_runs_only_the_offline_harness_tasks(monkeypatch, tmp_path):
    """A registry task downloads a dataset of any size and a task YAML may run code: on a hosted server either is
    refused before anything is read, in one line naming the tasks that do run there."""
    from graftui import hosted, settings
    from graftui.kinds import read_task_as

    guard = hosted.HostedGuard()
    monkeypatch.setattr(settings, "hosted", lambda: True)
    with pytest.raises(RequestError, match="lm-eval task 'hellaswag' is not one of the offline harness tasks") as err:
        read_task_as("lm-eval:graftui_dates,hellaswag", None, guard)
    assert "lm-eval:graftui_dates" in str(err.value) and "\n" not in str(err.value)
    # a server file named as a task YAML is refused by its name, never opened (no "cannot read" that would tell
    # whether it exists)
    for path in (tmp_path / "absent.yaml", Path("/etc/hostname.yaml")):
        with pytest.raises(RequestError, match="is not one of the offline harness tasks") as err:
            read_task_as(str(path), None, guard)
        assert str(path) in str(err.value)
    assert guard.checked_harness(["graftui_dates", "graftui_movies"]) == ["graftui_dates", "graftui_movies"]
    monkeypatch.setattr(settings, "hosted", lambda: False)
    assert guard.checked_harness(["hellaswag"]) == ["hellaswag"]  # on one's own machine the registry is there


def test_a_kind_refuses_a_pair_read_the_other_way_naming_what_to_give():
    from types import SimpleNamespace

    from graftui.errors import ModelError

    classifier = SimpleNamespace(completion=False, finetuned_ref="minilm-movies")
    lm = SimpleNamespace(completion=True, finetuned_ref="smollm2-dates")
    HARNESS.check_pair(lm, load_harness(TASK))
    with pytest.raises(ModelError, match="is an lm-evaluation-harness task, which scores a causal language model"):
        HARNESS.check_pair(classifier, load_harness(TASK))
    with pytest.raises(ModelError, match="'smollm2-dates' was fine-tuned on completions, and 'movies' is a "
                                         "classification task"):
        CLASSIFICATION.check_pair(lm, load_task("movies"))
