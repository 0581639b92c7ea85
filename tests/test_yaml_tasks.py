"""Task YAMLs a user writes for lm-evaluation-harness: each way one can be wrong is refused in one line that names the
problem and the fix, before any model loads, and what the harness reads of a task file is recorded with a region."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from graftui.errors import DataError
from graftui.tasks.harness.kind import load_harness

from cli_util import refused, run_cli
from lm_util import MC_YAML


@pytest.fixture
def task_home(tmp_path, monkeypatch):
    """A GRAFTUI_HOME of the test's own (the offline task files and the datasets cache are written there)."""
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _rows(folder: Path) -> dict[str, str]:
    """A train and a test split of three documents each, as JSONL files in ``folder``: their absolute paths."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"q": f"{split} {i}", "a": f"{split}-{i}"}) + "\n"
                                                       for i in range(3)))
    return {s: str(folder / f"{s}.jsonl") for s in ("train", "test")}


def _yaml(folder: Path, name: str, *, files: dict[str, str] | None = None, metric: str = "exact_match",
          extra: str = "", filters: str = "") -> Path:
    """A generate-until task YAML over ``files`` (the JSONL splits beside it by default)."""
    files = files or _rows(folder)
    path = folder / f"{name}.yaml"
    path.write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files: {json.dumps(files)}\n"
                    f"  cache_dir: {json.dumps(str(folder / 'cache'))}\noutput_type: generate_until\n"
                    'training_split: train\ntest_split: test\ndoc_to_text: "Q: {{q}}\\nA:"\ndoc_to_target: a\n'
                    f"{extra}{filters}metric_list:\n  - metric: {metric}\n    aggregation: mean\n"
                    "    higher_is_better: true\n")
    return path


def _refused(path, words: list[str], absent: list[str] = ()) -> str:
    with pytest.raises(DataError) as err:
        load_harness(str(path))
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    assert not any(w in text for w in absent), text
    return text


# -- what the file is ------------------------------------------------------------------------------------------------
def test_an_include_that_is_no_task_yaml_is_named_and_never_quoted(tmp_path, task_home):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:the secret words:/root:/bin/bash\n")
    path = tmp_path / "inc.yaml"
    for include, why in ((secret, "is not a task YAML"), (tmp_path / "absent.yaml", "cannot be read")):
        path.write_text(f"include: {include}\ntask: my_inc\n")
        text = _refused(path, [f"the include '{include}'", why, "an include names a task YAML beside it"],
                        ["unknown lm-eval task", "secret words", "root:x"])
    refused(["localize", "--task", path, "--out", tmp_path / "r.safetensors"], text)
    assert not (tmp_path / "r.safetensors").exists()


def test_a_task_yaml_that_is_not_utf8_says_so(tmp_path, task_home):
    path = tmp_path / "latin.yaml"
    path.write_bytes("task: my_latin\ndoc_to_text: \"caf\xe9\"\n".encode("latin-1"))
    _refused(path, ["is not UTF-8 text (byte 0xe9", "save it as UTF-8"], ["unknown lm-eval task"])


# -- what the harness makes of it ------------------------------------------------------------------------------------
def test_a_metric_the_harness_does_not_know_is_named_with_the_known_ones(tmp_path, task_home, capsys):
    path = _yaml(tmp_path / "m", "my_metric", metric="exact_mtch")
    _refused(path, ["metric 'exact_mtch' is none the harness knows", "did you mean exact_match?", "acc_norm"],
             ["Hugging Face Hub"])
    assert "exact_mtch" not in capsys.readouterr().err  # the harness's own log line is not shown besides


def test_a_key_the_harness_rejects_is_named(tmp_path, task_home):
    path = _yaml(tmp_path / "k", "my_key", extra="num_fewshots: 3\n")
    _refused(path, ["takes no key 'num_fewshots'", "did you mean num_fewshot?"], ["Hugging Face Hub"])


def test_local_data_files_are_read_and_a_relative_one_is_explained(tmp_path, task_home, monkeypatch):
    folder = tmp_path / "d"
    skill = load_harness(str(_yaml(folder, "my_local")))  # absolute paths: read as the harness reads them
    assert skill.harness[0].n_eval == 3 and len(skill.splits["train"]) == 3
    monkeypatch.chdir(tmp_path)
    path = _yaml(folder, "my_relative", files={"train": "train.jsonl", "test": "test.jsonl"})
    _refused(path, ["data file 'train.jsonl' is not found", "from the folder it runs in", "absolute path",
                    str(folder / "train.jsonl")], ["Hugging Face Hub"])


def test_a_harness_prefix_before_a_yaml_path_is_named_already(tmp_path):
    """Covered as well in test_hostile_inputs: the prefix names registered tasks, and the fix is its path alone."""
    with pytest.raises(DataError, match="drop the prefix"):
        load_harness("lm-eval:path/to/x.yaml")


# -- a region and its task file --------------------------------------------------------------------------------------
def _region(tmp_path: Path, task: str) -> Path:
    from conftest import make_tiny_pair
    from graftui import regions
    from graftui.localizers import Budget, run_method

    pair, _, _ = make_tiny_pair()
    region, _ = run_method(pair, Budget(k=20), "top-movement")
    record = regions.with_patch(pair, regions.make_record(pair, region, {"method": "top-movement", "task": task}))
    return regions.save(record, tmp_path / "r.safetensors")


def test_a_relative_task_path_a_region_recorded_says_task_mends_it(tmp_path, task_home, monkeypatch):
    (tmp_path / "mine").mkdir()
    _yaml(tmp_path / "mine", "x")
    path = _region(tmp_path, "mine/x.yaml")  # as it was named from tmp_path
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    code, out, err = run_cli("evaluate", "--region", path, "--n", "2")
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1, err
    assert "cannot read 'mine/x.yaml'" in err and "r.safetensors recorded" in err and "--task PATH" in err


# -- the pair a harness task reads -----------------------------------------------------------------------------------
def test_a_classifier_pair_on_a_harness_task_is_told_the_task_s_own_output_type(tmp_path, task_home):
    from conftest import make_tiny_bert
    from lm_util import make_tokenizer

    folder = tmp_path / "classifier"
    folder.mkdir()
    make_tokenizer(folder)
    make_tiny_bert().save_pretrained(folder)
    out = tmp_path / "r.safetensors"
    code, stdout, err = run_cli("localize", "--base", folder, "--finetuned", folder, "--task", "lm-eval:graftui_movies",
                                "--out", out)
    assert (code, stdout) == (2, "") and len(err.strip().splitlines()) == 1, err
    assert "graftui_movies: multiple choice" in err and "a completion task" not in err and "is a classifier" in err
    assert not out.exists()


# -- a region learned on a task YAML ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_lms(tmp_path_factory):
    """A tiny GPT-2 pair (seconds to score) and a folder for task YAMLs over four short reviews."""
    from lm_util import write_lm_pair

    root = tmp_path_factory.mktemp("yaml-tasks")
    base, ft = write_lm_pair(root, "gpt2")
    folder = root / "task"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"text": f"the movie was {w}", "label": i % 2, "answer": w}) + "\n"
            for i, w in enumerate(("good", "bad", "fun", "dull"))))
    return base, ft, folder


def test_a_region_records_its_task_file_and_notes_it_changed_since(tiny_lms, tmp_path, monkeypatch):
    import graftui
    from graftui import regions

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    base, ft, folder = tiny_lms
    path = folder / "mc.yaml"
    path.write_text(MC_YAML.format(name="my_mc", folder=folder))
    out = tmp_path / "r.safetensors"
    graftui.localize(base=str(base), finetuned=str(ft), task=str(path), steps=1, examples_per_class=2, check_n=0,
                     k=50, out=str(out))
    recorded = regions.load(out).meta.task_files
    assert recorded == {str(path.resolve()): hashlib.sha256(path.read_bytes()).hexdigest()}
    assert regions.RegionMeta.from_dict({"task": "movies"}).task_files is None  # a file from before still loads

    same = graftui.evaluate(regions=[str(out)], n=4).as_dict()
    assert not any("changed since" in note for note in same["notes"])
    path.write_text(path.read_text().replace("it was", "so it was"))
    edited = graftui.evaluate(regions=[str(out)], n=4).as_dict()  # scored, with a note
    assert [n for n in edited["notes"] if "changed since" in n] == [
        f"the task file {path.resolve()} changed since r was learned on it: it is scored on the file as it is now"]
    assert {r["model"] for r in edited["rows"]} >= {"fine-tuned", "r"}


GEN_YAML = """task: my_two_filters
dataset_path: json
dataset_kwargs:
  data_files: {{train: {folder}/train.jsonl, test: {folder}/test.jsonl}}
  cache_dir: {folder}/cache
output_type: generate_until
training_split: train
test_split: test
doc_to_text: "{{{{text}}}} it was"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 3
  do_sample: false
filter_list:
  - name: raw
    filter:
      - function: take_first
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
{more}"""
BLEU = "  - metric: bleu\n    aggregation: bleu\n    higher_is_better: true\n"


@pytest.fixture(scope="module")
def two_filters(tiny_lms, tmp_path_factory):
    """An evaluation of a tiny pair with no region on a task YAML of two filters (raw, then strip)."""
    import graftui

    base, ft, folder = tiny_lms
    path = folder / "gen.yaml"
    path.write_text(GEN_YAML.format(folder=folder, more=""))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(tmp_path_factory.mktemp("home")))
        return graftui.evaluate(base=str(base), finetuned=str(ft), task=str(path), n=4).as_dict()


def test_every_filter_s_score_is_shown_and_the_first_is_the_one_compared(two_filters):
    from graftui.flows import text
    from graftui.kinds import HARNESS
    from graftui.ui.tables import compare_table

    rows = two_filters["rows"]
    assert all(r["metric"] == "exact_match,raw" for r in rows)
    assert all({"exact_match,raw", "exact_match,strip"} <= set(r["harness"]) for r in rows)
    shown = text.evaluate(two_filters)
    assert "exact_match,strip: fine-tuned" in shown and "its first filter" in shown
    card = HARNESS.card(two_filters, None, "fine-tuned")
    assert any("exact_match,strip" in line and "the one compared above" in line for line in card)
    table = compare_table(two_filters)
    assert "exact_match,strip (not compared)" in set(table["metric"])


def test_a_score_that_is_no_share_prints_as_its_number(two_filters):
    """The app's table and the card print a share (exact match) in % and its change in points, and a metric that is
    none (BLEU, 0–100) as the number it is, its change a plain difference (``metrics.METRICS``)."""
    from graftui import metrics
    from graftui.kinds import HARNESS
    from graftui.ui.tables import compare_table

    assert metrics.metric_of("exact_match,strip").share and not metrics.metric_of("bleu,raw").share
    rows = [{**r, "metric": "bleu,raw", "score": 42.5 + i, "stderr": 1.25, "share": False,
             "accuracy_ci": None} for i, r in enumerate(two_filters["rows"])]
    doc = {**two_filters, "rows": rows, "differences": []}
    table = compare_table(doc)
    first = table[table["metric"] == "bleu,raw"]
    assert "42.500" in set(first["score ↑ [95 % CI]"]) and not any("%" in v for v in first["score ↑ [95 % CI]"])
    assert {v for v in first["Δ vs FT"] if v} <= {"+0.000", "+1.000", "+2.000"} and "+1.000" in set(first["Δ vs FT"])
    card = " ".join(HARNESS.card(doc, None, "fine-tuned"))
    assert "BLEU, over the corpus: bleu,raw" in card and "42.500 ± 1.250" in card and "4250" not in card
    share = compare_table(two_filters)
    assert all(v.endswith("%") or "[" in v for v in share[share["metric"] == "exact_match,raw"]["score ↑ [95 % CI]"])


@pytest.mark.e2e  # the harness bootstraps BLEU's stderr in a pool of processes
def test_scoring_a_corpus_metric_prints_nothing_on_stdout(tiny_lms, tmp_path, monkeypatch, capsys):
    """The harness prints as it bootstraps BLEU's stderr; stdout is where graftui writes a --json report."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graftui.tasks.harness import lmeval

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    base, ft, folder = tiny_lms
    path = folder / "bleu.yaml"
    path.write_text(GEN_YAML.format(folder=folder, more=BLEU).replace("my_two_filters", "my_bleu"))
    task = load_harness(str(path)).harness[0]
    found = lmeval.score(AutoModelForCausalLM.from_pretrained(ft), AutoTokenizer.from_pretrained(ft), task, limit=2,
                         bootstrap_iters=10)
    assert "bleu,strip" in found.metrics and capsys.readouterr().out == ""


# -- a task YAML checked before any job ------------------------------------------------------------------------------
def test_a_task_yaml_is_checked_as_the_harness_reads_it_before_any_job(tmp_path, task_home):
    """Named in the task box (or --task), a task YAML is read by the loader the jobs use: its documents per split, the
    score compared and its first test document as the model reads it, worded as an upload's check; a YAML the harness
    refuses gives that same one line, and a task of another kind is left unread."""
    from graftui import flows
    from graftui.requests import TaskFields
    from graftui.ui import forms

    path = _yaml(tmp_path / "c", "my_checked")
    (part,) = flows.preview_task(TaskFields(task=str(path)))
    assert part == {"name": "my_checked", "form": "generate_until", "splits": {"train": 3, "test": 3},
                    "scored": "test", "n": 3, "metric": "exact_match",
                    "first": {"context": "Q: test 0\nA:", "target": " test-0", "choices": [], "gold": None}}
    shown = forms.task_check(str(path), {})
    assert shown.startswith("✓ **my_checked**: generate_until task, 3 test documents scored (documents per split: "
                            "train 3, test 3); metric compared: exact_match.")
    assert "First test document as the model reads it:\n\n```\nQ: test 0\nA:\n```" in shown
    assert "Target: ` ' test-0' `" in shown
    assert forms.task_check("movies", {}) is None and flows.preview_task(TaskFields(task="movies")) is None

    mc = tmp_path / "c" / "mc.yaml"  # a multiple-choice task: its choices, the answer marked
    mc.write_text(MC_YAML.format(name="my_choice", folder=_mc_rows(tmp_path / "c")))
    (part,) = flows.preview_task(TaskFields(task=str(mc)))
    # the harness's default target delimiter (a space) goes before each choice, which has its own: the model reads two
    assert part["first"] == {"context": "the movie was good it was", "target": "  good", "choices": ["  good", "  bad"],
                             "gold": 0} and part["metric"] == "acc"
    assert "Choices, each scored after it: ` '  good' ` (the answer), ` '  bad' `" in forms.task_check(str(mc), {})

    bad = _yaml(tmp_path / "b", "my_bad", metric="exact_mtch")
    said = _refused(bad, ["metric 'exact_mtch' is none the harness knows"])
    with pytest.raises(DataError) as err:
        forms.task_check(str(bad), {})
    assert str(err.value) == said


def _mc_rows(folder: Path) -> Path:
    """Two short reviews per split, labelled for MC_YAML's choices (' good' is 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": f"the movie was {w}", "label": i}) + "\n"
                                                       for i, w in enumerate(("good", "bad"))))
    return folder


def test_a_shared_server_checks_only_the_offline_harness_tasks(tmp_path, task_home, monkeypatch):
    """The check obeys the rule the jobs do: on a hosted server a task YAML is refused by its path, never opened."""
    from graftui import flows, hosted, settings
    from graftui.errors import RequestError
    from graftui.requests import TaskFields

    path = _yaml(tmp_path / "h", "my_hosted")
    monkeypatch.setattr(settings, "hosted", lambda: True)
    with pytest.raises(RequestError, match="is not one of the offline harness tasks") as err:
        flows.preview_task(TaskFields(task=str(path)), hosted.HostedGuard())
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    (part,) = flows.preview_task(TaskFields(task="lm-eval:graftui_numbers"), hosted.HostedGuard())
    assert part["name"] == "graftui_numbers" and part["n"] == part["splits"]["test"] > 0
    assert part["first"]["context"].startswith("Number: ") and part["metric"] == "exact_match,graftui-answer"


def test_the_pair_verb_shows_a_task_yaml_s_check(tiny_lms, tmp_path, monkeypatch):
    """``graftui pair --task X.yaml``: the pair, then the task as the harness reads it."""
    import graftui
    from graftui.flows import text

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    base, ft, folder = tiny_lms
    path = folder / "pair.yaml"
    path.write_text(MC_YAML.format(name="my_pair", folder=folder))
    doc = graftui.pair(base=str(base), finetuned=str(ft), task=str(path)).as_dict()
    (part,) = doc["task_preview"]
    assert (part["name"], part["n"], part["first"]["context"]) == ("my_pair", 4, "the movie was good it was")
    printed = text.pair(doc)
    assert "✓ my_pair: multiple_choice, 4 test documents scored (train 4, test 4); compared by acc" in printed
    assert "first test document as the model reads it:\n  the movie was good it was\nchoices scored after it: " \
           "'  good' (the answer), '  bad'" in printed
