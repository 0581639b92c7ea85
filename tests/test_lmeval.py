"""lm-evaluation-harness as a task source: references, the offline task files, training documents that never come
from the split a task is scored on, and — on the real SmolLM2 — harness scores equal to graftui's own, document by
document."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from graftui.tasks.completion import data as completion, generation
from graftui.tasks.classification import data
from graftui.tasks.harness import lmeval
from graftui import metrics
from graftui.config import PROMPT_LOADING
from graftui.errors import DataError
from graftui.prompts import PromptClassifier, PromptTokenizer, make_prompt
from lm_util import make_lm, make_tokenizer


@pytest.fixture
def task_home(tmp_path, monkeypatch):
    """A GRAFTUI_HOME of the test's own, so the offline task files are written there."""
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and text.strip() == text
    return text


# -- references ------------------------------------------------------------------------------------------------------
def test_a_harness_reference_names_its_tasks_in_order_each_once():
    assert lmeval.is_harness_ref("lm-eval:graftui_dates") and lmeval.is_harness_ref("  LM-Eval:hellaswag")
    assert not lmeval.is_harness_ref("movies") and not lmeval.is_harness_ref("data/lm-eval.csv")
    assert lmeval.harness_names("lm-eval:graftui_dates") == ["graftui_dates"]
    assert lmeval.harness_names("lm-eval: gsm8k , hellaswag,gsm8k,") == ["gsm8k", "hellaswag"]
    for bad in ("lm-eval:", "lm-eval: , ", "movies"):
        with pytest.raises(DataError) as err:
            lmeval.harness_names(bad)
        assert "lm-eval:NAME" in _one_line(err)


def test_an_unknown_offline_name_is_one_line_naming_the_offline_tasks(task_home):
    with pytest.raises(DataError) as err:
        lmeval.load_harness_task("graftui_date")
    text = _one_line(err)
    assert "unknown lm-eval task 'graftui_date'" in text and "did you mean graftui_dates" in text
    assert all(f"lm-eval:{name}" in text for name in lmeval.OFFLINE)


@pytest.mark.e2e  # indexes the harness's 14,000 task files: 5 s
def test_a_name_the_harness_does_not_know_either_is_one_line(task_home):
    with pytest.raises(DataError) as err:
        lmeval.load_harness_task("hellaswagg")
    text = _one_line(err)
    assert "unknown lm-eval task 'hellaswagg'" in text and "hellaswag" in text and "lm-eval:graftui_movies" in text


# -- the offline task files ------------------------------------------------------------------------------------------
def test_the_offline_tasks_are_written_once_and_read_back_by_the_harness(task_home):
    from lm_eval.tasks._yaml_loader import load_yaml

    folder = lmeval.offline_dir()
    assert folder.is_relative_to(task_home)
    for name, (_, source) in lmeval.OFFLINE.items():
        config = load_yaml(folder / name / "task.yaml")
        assert config["task"] == name
        files = config["dataset_kwargs"]["data_files"]
        splits = data.load_task(source).splits if name == "graftui_movies" else completion.offline_skill(source).splits
        for split in data.SPLIT_NAMES:
            rows = [json.loads(line) for line in Path(files[split]).read_text().splitlines()]
            assert len(rows) == len(splits[split]) > 0
        assert Path(config["dataset_kwargs"]["cache_dir"]).is_relative_to(task_home)
    dates = load_yaml(folder / "graftui_dates" / "task.yaml")
    assert dates["filter_list"][0]["filter"][0]["filter_fn"] is lmeval.answer_filter
    assert dates["generation_kwargs"] == {"until": [], "max_gen_toks": generation.MAX_NEW_TOKENS, "do_sample": False}

    stamps = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}
    test_file = folder / "graftui_numbers" / "test.jsonl"
    test_file.write_text("damaged\n")
    lmeval._written.clear()  # as a new process finds them
    assert lmeval.offline_dir() == folder
    assert test_file.read_text().count("\n") == len(completion.offline_skill("numbers").splits["test"])
    assert {p for p, t in stamps.items() if p.stat().st_mtime_ns != t} == {test_file}  # the rest left as they were


def test_an_offline_task_trains_on_graftui_s_own_training_split_and_is_scored_on_its_test_split(task_home):
    dates = lmeval.load_harness_task("graftui_dates")
    ours = completion.offline_skill("dates")
    assert (dates.output_type, dates.train_split, dates.eval_split) == ("generate_until", "train", "test")
    assert dates.train == ours.splits["train"] and dates.n_eval == len(ours.splits["test"]) and not dates.chat
    assert not set(dates.train.examples) & set(ours.splits["test"].examples + ours.splits["validation"].examples)

    movies = lmeval.load_harness_task("graftui_movies")
    task = data.load_task("movies")
    words = dict(p for p in (w.split("=") for w in PROMPT_LOADING.label_words.split(",")))
    train = task.splits["train"]
    assert movies.output_type == "multiple_choice" and movies.n_eval == len(task.splits["test"])
    assert movies.train.examples == tuple(
        (("user", PROMPT_LOADING.template.format(text=t)), ("assistant", words[task.label_names[y]]))
        for t, y in zip(train.texts, train.labels))


def _task_folder(root: Path, name: str, splits: dict[str, list[dict]]) -> Path:
    """A folder with one generate_until task YAML over the given splits, as a user writes one."""
    folder = root / name
    folder.mkdir(parents=True)
    for split, rows in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    roles = "".join(f"{role}_split: {split}\n" for role, split in
                    (("training", "train"), ("validation", "validation"), ("test", "test")) if split in splits)
    files = ", ".join(f'{s}: "{folder / s}.jsonl"' for s in splits)
    (folder / "task.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files: {{{files}}}\n"
        f'  cache_dir: "{root / "cache"}"\noutput_type: generate_until\n{roles}doc_to_text: "Q: {{{{q}}}}\\nA:"\n'
        'doc_to_target: a\ngeneration_kwargs:\n  until: ["\\n"]\nmetric_list:\n  - metric: exact_match\n')
    return folder


def test_training_documents_never_come_from_the_split_a_task_is_scored_on(tmp_path, task_home):
    rows = {s: [{"q": f"{s} {i}", "a": f"{s}-{i}"} for i in range(3)] for s in ("train", "validation", "test")}
    root = tmp_path / "tasks"
    _task_folder(root, "mine_all", rows)
    _task_folder(root, "mine_val_test", {s: rows[s] for s in ("validation", "test")})
    _task_folder(root, "mine_test", {"test": rows["test"]})
    _task_folder(root, "mine_val", {"validation": rows["validation"]})

    every = lmeval.load_harness_task("mine_all", include_path=root)
    assert (every.train_split, every.eval_split, every.n_eval, every.registry) == ("train", "test", 3, False)
    assert every.train.examples[1] == (("user", "Q: train 1\nA:"), ("assistant", " train-1"))
    no_train = lmeval.load_harness_task("mine_val_test", include_path=root)
    assert (no_train.train_split, no_train.eval_split) == ("validation", "test")
    assert no_train.train.references == (" validation-0", " validation-1", " validation-2")
    for name, scored in (("mine_test", "test"), ("mine_val", "validation")):  # nothing besides the scored split
        alone = lmeval.load_harness_task(name, include_path=root)
        assert (alone.train_split, len(alone.train), alone.eval_split, alone.n_eval) == (None, 0, scored, 3)


def test_a_task_the_user_wrote_is_read_from_its_yaml_or_by_name_from_graftui_home(tmp_path, task_home):
    """A harness task YAML of one's own works wherever a harness task does: named by its path (read from the folder
    it lies in), or by name once its folder is in $GRAFTUI_HOME/lm-eval; a missing file or one that names no task is
    one line."""
    from graftui.kinds import HARNESS, named_kind
    from graftui.tasks.harness.kind import load_harness

    rows = {s: [{"q": f"{s} {i}", "a": f"{s}-{i}"} for i in range(3)] for s in ("train", "validation", "test")}
    yaml = _task_folder(tmp_path / "mine", "my_task", rows) / "task.yaml"
    assert named_kind(str(yaml), "auto", set()) is HARNESS and named_kind("data.yml", "auto", set()) is not HARNESS
    skill = load_harness(str(yaml))
    assert skill.name == str(yaml.resolve()) and [t.name for t in skill.harness] == ["my_task"]  # read again by path
    assert skill.splits["train"].examples[0] == (("user", "Q: train 0\nA:"), ("assistant", " train-0"))
    assert skill.harness[0].include_path == (str(yaml.parent.resolve()),) and not skill.harness[0].registry

    shutil.copytree(yaml.parent, task_home / "lm-eval" / "my_task")
    by_name = load_harness("lm-eval:my_task")
    assert [(t.name, t.registry, t.n_eval) for t in by_name.harness] == [("my_task", False, 3)]

    # a second file of the same name beside it: the harness would read the first, so the one named is refused
    (yaml.parent / "a_copy.yaml").write_text(yaml.read_text())
    with pytest.raises(DataError) as err:
        load_harness(str(yaml))
    assert "a_copy.yaml" in _one_line(err) and "its own name" in str(err.value)
    (yaml.parent / "a_copy.yaml").write_text(yaml.read_text().replace("task: my_task", "task: my_copy"))
    assert [t.name for t in load_harness(str(yaml.parent / "a_copy.yaml")).harness] == ["my_copy"]  # seen at once

    (tmp_path / "group.yaml").write_text("group: mine\ntask:\n  - my_task\n")
    for ref, words in ((tmp_path / "absent.yaml", "cannot read"), (tmp_path / "group.yaml", "names no task")):
        with pytest.raises(DataError) as err:
            load_harness(str(ref))
        assert words in _one_line(err) and str(ref) in str(err.value)


# -- scoring ---------------------------------------------------------------------------------------------------------
class _Canned:
    """An lm_eval LM that answers each prompt with a given text, and keeps the generation settings it was asked for."""

    def __new__(cls, answers: dict[str, str]):
        from lm_eval.api.model import LM

        class Canned(LM):
            def __init__(self):
                super().__init__()
                self.asked = []

            def generate_until(self, requests, disable_tqdm=False):
                self.asked += [r.args[1] for r in requests]
                return [answers[r.args[0]] for r in requests]

            def loglikelihood(self, requests, disable_tqdm=False):
                raise AssertionError("a generative task asks for generations only")

            loglikelihood_rolling = loglikelihood

        return Canned()


def test_the_harness_judges_a_generation_as_graftui_does(task_home):
    """Exact match of the offline generative tasks is graftui's AnswerRule: the first line of the generation (after
    leading blank lines), whitespace collapsed, case kept — checked on generations that need each of these."""
    skill = completion.offline_skill("numbers")
    test = skill.splits["test"]
    ids = list(range(10))
    (_, prompt), (_, ref) = test.examples[0]
    variants = [ref, f"\n\n{ref}\nIn words: more", f"{ref}  ", ref.upper(), " " + ref.replace("-", " - "), "",
                f"{ref}{ref}", "  " + "  ".join(ref.split()), "\n", " zero"]
    texts = [variants[i].replace(ref, test.examples[i][1][1]) if variants[i] else "" for i in ids]
    lm = _Canned({test.examples[i][0][1]: texts[i] for i in ids})
    random.seed(7)
    torch.manual_seed(7)
    mine = random.random(), float(torch.rand(1))
    random.seed(7)
    torch.manual_seed(7)
    got = lmeval.score(lm, None, lmeval.load_harness_task("graftui_numbers"), doc_ids=ids)
    assert (random.random(), float(torch.rand(1))) == mine  # the harness seeds globally; the caller's state is kept
    ours = generation.exact_matches(texts, [test.examples[i][1][1] for i in ids], generation.AnswerRule())
    key = f"exact_match,{lmeval.ANSWER_FILTER}"
    assert got.primary == key and got.doc_ids == ids and got.responses == texts
    assert got.per_sample[key] == ours.tolist() and 0 < sum(ours.tolist()) < len(ids)
    assert got.metrics[key] == pytest.approx(float(ours.mean())) and got.stderr[key] > 0
    assert lm.asked and all(a == {"until": [], "max_gen_toks": generation.MAX_NEW_TOKENS, "do_sample": False}
                            for a in lm.asked)


def test_score_reads_the_model_as_it_is_in_memory_and_leaves_its_mode(tmp_path, task_home):
    """A tiny LM whose head is zeroed in place scores every choice alike (the first wins the tie), and its own weights
    give their own choices back afterwards: the harness scores the model object itself, never a copy or a reload."""
    tok = make_tokenizer(tmp_path / "tok")
    lm = make_lm("llama", len(tok)).train()
    task = lmeval.load_harness_task("graftui_movies")
    movies = data.load_task("movies").splits["test"]
    ids = sorted(i for i in range(len(movies)) if len(movies.texts[i]) < 60)[:6]  # the tiny LM holds 64 tokens
    called = []
    hook = lm.register_forward_hook(lambda module, args, out: called.append(module))  # a copy would call its own
    before = lmeval.score(lm, tok, task, doc_ids=ids, batch_size=4)
    hook.remove()
    assert lm.training and before.doc_ids == ids and called and all(m is lm for m in called)
    head = lm.lm_head.weight
    kept = head.detach().clone()
    with torch.no_grad():
        head.zero_()
    flat = lmeval.score(lm, tok, task, doc_ids=ids)
    first = [" bad", " good"][0]
    assert flat.responses == [first] * len(ids)
    assert flat.per_sample["acc"] == [float(movies.labels[i] == 0) for i in ids]
    with torch.no_grad():
        head.copy_(kept)
    assert lmeval.score(lm, tok, task, doc_ids=ids, batch_size=2).responses == before.responses


def test_score_refuses_a_limit_and_documents_together_and_documents_out_of_range(task_home):
    task = lmeval.load_harness_task("graftui_numbers")
    for kwargs, says in (({"limit": 3, "doc_ids": [0]}, "not both"), ({"doc_ids": [task.n_eval]}, "0–199"),
                         ({"limit": 0}, "at least 1")):
        with pytest.raises(DataError) as err:
            lmeval.score(None, None, task, **kwargs)
        assert says in _one_line(err)


# -- the cross-check on SmolLM2 --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    from graftui.models import load_lm, load_tokenizer

    return load_lm("smollm2", "causal-lm"), load_tokenizer("smollm2")


@pytest.mark.e2e
def test_harness_accuracy_on_movies_is_graftui_s_prompt_classifier_document_by_document(smollm2, task_home):
    """SmolLM2 read through the default prompt and label words ('{text} It was' → ' bad' / ' good') by graftui, and
    the harness's log-likelihood of each choice after the same context, choose the same word on every document."""
    lm, tok = smollm2
    task = data.load_task("movies")
    test = task.splits["test"]
    negative, positive = ([i for i, y in enumerate(test.labels) if y == label][:20] for label in (0, 1))
    ids = sorted(negative + positive)
    got = lmeval.score(lm, tok, lmeval.load_harness_task("graftui_movies"), doc_ids=ids)

    prompt = make_prompt("causal-lm", task.label_names, template=PROMPT_LOADING.template,
                         label_words=PROMPT_LOADING.label_words)
    reader = PromptTokenizer(tok, prompt)
    probs, labels = metrics.predict_proba(PromptClassifier(lm, reader).eval(),
                                          data.batches(reader, test.select(ids), 8, task.max_length))
    chosen = probs.argmax(-1)
    assert got.doc_ids == ids and got.responses == [prompt.words[i] for i in chosen.tolist()]
    assert got.per_sample["acc"] == (chosen == labels).double().tolist()
    assert got.metrics["acc"] == pytest.approx(float((chosen == labels).double().mean()))
    assert len(set(got.responses)) == 2  # both words chosen somewhere: the agreement is not one constant answer


@pytest.fixture(scope="module")
def dates_finetuned():
    """SmolLM2 after graftui's quick fine-tune on dates (GRAFTUI_FAST: 64 examples, seconds), which writes most dates
    out right: exact match is then not 0 everywhere, as it is for the pre-trained model."""
    from graftui.flows.common import ensure_default
    from graftui.models import load_lm

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_FAST", "1")
        folder = ensure_default("smollm2-dates")
    return load_lm(str(folder), "causal-lm")


@pytest.mark.e2e
def test_harness_generations_on_dates_are_graftui_s_greedy_generations_document_by_document(smollm2, dates_finetuned,
                                                                                            task_home):
    """The documents graftui samples, generated greedily by graftui and by the harness, with the pre-trained and the
    fine-tuned model: the same text on every document (so the same answer), and the same exact match."""
    base, tok = smollm2
    skill = completion.offline_skill("dates")
    n = 16
    sample = generation.sample(skill, "test", n, seed=0)
    ids = sorted(random.Random(0).sample(range(len(skill.splits["test"])), n))
    assert sample == skill.splits["test"].select(ids)
    task = lmeval.load_harness_task("graftui_dates")
    every = []
    for lm in (base, dates_finetuned):
        got = lmeval.score(lm, tok, task, doc_ids=ids)
        texts = generation.generate(lm, tok, sample, skill.chat, max_new_tokens=generation.MAX_NEW_TOKENS)
        hits = generation.exact_matches(texts, sample.references, generation.AnswerRule()).tolist()
        assert got.doc_ids == ids and got.responses == texts
        assert got.per_sample[got.primary] == hits and got.metrics[got.primary] == pytest.approx(sum(hits) / n)
        assert not lm.training
        every += hits
    assert 0 < sum(every) < len(every)  # right and wrong answers both judged alike
