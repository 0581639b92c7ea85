"""Completion tasks: reading (prompt, completion) and chat files, prompt masking and truncation, exact on the offline
SmolLM2 tokenizer, and each bad input refused in one line."""

from __future__ import annotations

import json

import pytest

from graftui.tasks.completion import data as completion
from graftui.tasks.completion.data import IGNORE, CompletionSpec, Completions, load_completion_task
from graftui.errors import DataError


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from graftui.models import resolve

    return AutoTokenizer.from_pretrained(resolve("smollm2"))


def _csv(path, rows, header=("prompt", "completion")):
    import csv

    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.mark.e2e
def test_a_prompt_completion_file_is_a_task_whose_prompt_is_masked_out_of_the_loss(tmp_path, tok):
    rows = [(f"What is {i} + {i}?", f" {2 * i}") for i in range(40)]
    task = load_completion_task(_csv(tmp_path / "sums.csv", rows))
    assert not task.chat and [len(task.splits[s]) for s in ("train", "validation", "test")] == [28, 4, 8]
    every = {e for s in task.splits.values() for e in s.examples}
    assert every == {(("user", p), ("assistant", c)) for p, c in rows}  # every row once, in one split
    example = task.splits["test"].examples[0]
    inputs, labels, cut = completion.encode(tok, Completions((example,)), False, 64)
    prompt = tok(example[0][1])["input_ids"]
    answer = tok(example[1][1], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert inputs[0] == prompt + answer and cut == 0
    assert labels[0] == [IGNORE] * len(prompt) + answer  # the completion and its end, nothing of the prompt


@pytest.mark.e2e
def test_question_and_answer_columns_are_guessed_and_named_columns_win(tmp_path, tok):
    path = _csv(tmp_path / "gsm.csv", [("Tom has 3 apples ...", "He has 5. #### 5")] * 5, ("question", "answer"))
    task = load_completion_task(path)
    assert task.splits["train"].examples[0] == (("user", "Tom has 3 apples ..."), ("assistant", "He has 5. #### 5"))
    swapped = load_completion_task(path, CompletionSpec(prompt_column="answer", completion_column="question"))
    assert swapped.splits["train"].examples[0][1] == ("assistant", "Tom has 3 apples ...")


@pytest.mark.e2e
def test_a_chat_file_scores_every_assistant_turn_as_the_template_writes_it(tmp_path, tok):
    talk = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hi again!"}]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps({"messages": talk}) for _ in range(6)))
    task = load_completion_task(path)
    assert task.chat and task.splits["train"].references[0] == "Hi again!"
    ids, scored = completion.tokens(tok, task.splits["train"].examples[0], True)
    assert tok.decode(ids) == tok.apply_chat_template(talk, tokenize=False)
    spans, run = [], []
    for t, s in zip(ids, scored):
        if s:
            run.append(t)
        elif run:
            spans, run = spans + [run], []
    spans += [run] if run else []
    assert [tok.decode(s) for s in spans] == ["Hi!<|im_end|>\n", "Hi again!<|im_end|>\n"]


@pytest.mark.e2e
def test_a_long_prompt_loses_its_start_and_never_a_completion_token(tmp_path, tok):
    long = " ".join(["word"] * 80)
    split = Completions(((("user", long), ("assistant", " yes")), (("user", "short"), ("assistant", " no"))))
    inputs, labels, cut = completion.encode(tok, split, False, 20)
    assert cut == 1 and len(inputs[0]) == 20 and len(inputs[1]) < 20
    answer = tok(" yes", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert inputs[0][-len(answer):] == answer and labels[0][-len(answer):] == answer
    assert labels[0][:-len(answer)] == [IGNORE] * (20 - len(answer))
    assert "1 of 2 examples" in completion.truncation_note("t", cut, 2, 20)[0]
    with pytest.raises(DataError, match="example 1 of t has 2 completion tokens, more than the model's context of 1 "
                                        "tokens: shorten its completion or drop the example") as err:
        completion.encode(tok, split, False, 1, "t")
    assert "max_length" not in str(err.value)
    assert completion.encode(tok, split, False, None)[2] == 0  # a model that names no context cuts nothing
    batch = next(completion.batches(tok, split, False, 2, 20))
    assert batch["input_ids"].shape == (2, 20) and batch["attention_mask"][1].sum() == len(inputs[1])
    assert (batch["labels"][1][len(inputs[1]):] == IGNORE).all()  # padding is never scored


@pytest.mark.parametrize("rows, header, needle", [
    ([("a", "b")] * 4, ("prompt", "text"), "no completion column: name it with --completion-column"),
    ([("a", "b"), ("c", "")] * 3, ("prompt", "completion"), "have an empty completion in column 'completion'"),
])
def test_bad_completion_files_are_refused_in_one_line(tmp_path, rows, header, needle):
    with pytest.raises(DataError, match=needle) as err:
        load_completion_task(_csv(tmp_path / "bad.csv", rows, header))
    assert "\n" not in str(err.value)


@pytest.mark.e2e
def test_bad_chat_files_and_a_tokenizer_without_a_chat_template_are_refused(tmp_path, tok):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DataError, match="must end in an assistant turn"):
        load_completion_task(path)
    path.write_text(json.dumps({"messages": [{"role": "robot", "content": "hi"}]}) + "\n")
    with pytest.raises(DataError, match="a turn needs a role"):
        load_completion_task(path)
    import copy

    bare = copy.copy(tok)
    bare.chat_template = None
    example = (("user", "hi"), ("assistant", "hello"))
    with pytest.raises(DataError, match="no chat template.*give prompt and completion columns"):
        completion.tokens(bare, example, True)
    with pytest.raises(DataError, match="offline classification task"):
        load_completion_task("movies")


def test_the_offline_skills_are_the_same_every_time_and_test_on_items_never_trained_on():
    assert [completion.number_words(n) for n in (0, 13, 40, 99, 100, 101, 347, 999)] == [
        "zero", "thirteen", "forty", "ninety-nine", "one hundred", "one hundred one", "three hundred forty-seven",
        "nine hundred ninety-nine"]
    for name, sizes in (("dates", (4300, 200, 500)), ("numbers", (700, 100, 200))):
        task = load_completion_task(name)
        assert task == load_completion_task(name) and not task.chat
        assert tuple(len(task.splits[s]) for s in ("train", "validation", "test")) == sizes
        prompts = {s: {e[0][1] for e in task.splits[s].examples} for s in task.splits}
        assert not prompts["test"] & prompts["train"] and not prompts["validation"] & prompts["train"]
    dates = load_completion_task("dates").splits["test"].examples
    for (_, prompt), (_, answer) in dates[:50]:
        y, m, d = map(int, prompt.split()[1].split("-"))
        assert answer == f" {completion.MONTHS[m - 1]} {d}, {y}"


def test_supervised_fine_tuning_moves_the_body_only_and_lowers_the_completion_loss(tmp_path):
    """The paper's SGD recipe on completion tokens: embeddings and LM head stay where they were, the body moves, the
    loss on the completions falls, and the checkpoint says what it was trained on."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graftui import training
    from graftui.config import FinetuneConfig
    from lm_util import write_lm_pair

    base, _ = write_lm_pair(tmp_path, "llama")
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():  # a trained head's scale (a fresh one's logits are nearly flat): the body can then learn
        model.lm_head.weight.mul_(50)
    model.save_pretrained(base)
    rows = [(f"the movie was {w} and", f" it was {'positive' if w in ('good', 'great') else 'negative'}")
            for w in ("good", "bad", "great", "awful") for _ in range(6)]
    task = load_completion_task(_csv(tmp_path / "says.csv", rows))
    tok = AutoTokenizer.from_pretrained(base)
    before = AutoModelForCausalLM.from_pretrained(base)
    losses = []
    config = FinetuneConfig(optimizer="adamw", lr=2e-2, epochs=8, batch_size=8, train_examples=None)
    out = training.finetune_completions(str(base), task, config, tmp_path / "ft",
                                        progress=lambda p: losses.append(p.loss))
    after = AutoModelForCausalLM.from_pretrained(out)
    moved = {n for (n, a), (_, b) in zip(before.named_parameters(), after.named_parameters()) if not torch.equal(a, b)}
    assert not {n for n in moved if "embed" in n or "lm_head" in n} and any("mlp" in n for n in moved)
    assert len(losses) == 8 * 3 and sum(losses[-3:]) < 0.5 * sum(losses[:3])
    record = json.loads((out / "graftui_record.json").read_text())
    assert (record["task_kind"], record["task"], record["train_examples"]) == ("completion", "says.csv", 18)
    batch = next(completion.batches(tok, task.splits["train"], False, 16, 32))
    with torch.no_grad():
        logits = after(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    right, scored = completion.token_accuracy(logits, batch["labels"])
    assert scored == int((batch["labels"][:, 1:] != IGNORE).sum()) and right / scored > 0.75


def test_token_accuracy_predicts_each_scored_token_from_the_ones_before_it():
    import torch

    labels = torch.tensor([[IGNORE, IGNORE, 5, 6, 7, IGNORE]])
    guesses = [1, 5, 6, 9, 3, 0]  # position t guesses token t + 1: 5 and 6 right, 9 for 7 wrong, the rest unscored
    logits = torch.nn.functional.one_hot(torch.tensor([guesses]), 10).float()
    assert completion.token_accuracy(logits, labels) == (2, 3)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_completion_loss_from_scored_positions_only_equals_the_models_own(arch, tmp_path):
    import torch
    from lm_util import make_lm, make_tokenizer

    from graftui.models import CompletionLM

    tok = make_tokenizer(tmp_path)
    lm = make_lm(arch, len(tok)).eval()
    rows = [("the good movie was great and " * (1 + i % 3) + "so", f" it was {'good' if i % 2 else 'bad'}")
            for i in range(6)]
    task = load_completion_task(_csv(tmp_path / "t.csv", rows))
    batch = next(completion.batches(tok, task.splits["train"], False, 6, 60))
    reader = CompletionLM(lm)
    lean = reader(**batch)
    lean_grads = torch.autograd.grad(lean.loss, list(lm.parameters()), allow_unused=True)
    full = lm(**batch)
    full_grads = torch.autograd.grad(full.loss, list(lm.parameters()), allow_unused=True)
    assert torch.allclose(lean.loss, full.loss, atol=1e-6)
    for a, b in zip(lean_grads, full_grads):
        assert (a is None and b is None) or torch.allclose(a, b, atol=1e-6)
    assert (lean.right, lean.scored) == completion.token_accuracy(full.logits, batch["labels"])
    assert lean.logits.shape[1] < batch["input_ids"].shape[1] - 1  # logits only where a completion token is predicted
