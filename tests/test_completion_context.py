"""The model's context is the limit of a completion task, on a GPT-2 of 128 positions: prompts longer than it keep
their end (training, mask learning and the loss: the whole context; generation: the context less the tokens to
generate), the cut is noted with the real numbers, and what the context cannot hold (a completion longer than it,
more tokens to generate than it has) is refused in one line before any work, naming the context and the option."""

from __future__ import annotations

import json

import pytest
import torch

from graftui.tasks.completion import data as completion, generation
from graftui.flows import text
from graftui.tasks.completion.data import Completions
from graftui.errors import DataError

from cli_util import refused, run_cli
from lm_util import OPPOSITES, WORDS, _write_pairs, make_lm, make_tokenizer

CONTEXT = 128
PROMPT_WORDS = 150  # every prompt is longer than the context


def gpt2(vocab: int, positions: int = CONTEXT):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=positions,
                                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, pad_token_id=0)).eval()


def long_prompt(i: int, word: str) -> str:
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(PROMPT_WORDS)) + f" {word} is not"


def write_long_task(path, n: int = 249):
    words = list(OPPOSITES)
    return _write_pairs(path, ((long_prompt(i, w), f" {OPPOSITES[w]}") for i, w in ((i, words[i % len(words)])
                                                                                   for i in range(n))))


@pytest.fixture(scope="module")
def long(tmp_path_factory):
    """A GPT-2 base of 128 positions, a 249-item completion file whose every prompt is longer than that, and the base
    fine-tuned on it through the CLI (the default recipe, one epoch)."""
    root = tmp_path_factory.mktemp("context")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(root / "home"))
        base = root / "base"
        tok = make_tokenizer(base)
        gpt2(len(tok)).save_pretrained(base)
        task = write_long_task(root / "long.csv")
        code, out, err = run_cli("finetune", "--base", base, "--task", task, "--epochs", "1", "--max-new-tokens", "8",
                                 "--out", root / "ft", "--json")
        assert code == 0, err
        yield {"root": root, "base": str(base), "task": str(task), "ft": str(root / "ft"), "finetune": json.loads(out),
               "tok": tok}


def test_the_context_is_read_from_the_config_and_bounds_the_tokens_to_generate():
    tok_vocab = 64
    assert completion.context_length(gpt2(tok_vocab)) == CONTEXT  # n_positions
    assert completion.context_length(make_lm("llama", tok_vocab)) == 64  # max_position_embeddings
    assert completion.context_length(object()) is None
    assert completion.prompt_room(CONTEXT, 32) == 96 and completion.prompt_room(CONTEXT, 127) == 1
    assert completion.prompt_room(None, 10_000) is None
    for new in (128, 200):
        with pytest.raises(DataError) as err:
            completion.prompt_room(CONTEXT, new)
        assert str(err.value) == (f"--max-new-tokens {new} leaves no room for a prompt in the model's context of 128 "
                                  "tokens: give --max-new-tokens 127 or fewer")


def test_a_prompt_longer_than_the_context_is_generated_from_its_last_tokens_and_scored_on_its_last_128(tmp_path):
    tok = make_tokenizer(tmp_path / "tok")
    model = gpt2(len(tok))
    example = (("user", long_prompt(0, "good")), ("assistant", " bad"))
    ids, scored = completion.tokens(tok, example, False)
    assert len(ids) > CONTEXT
    got = generation.generate(model, tok, Completions((example,)), False, max_new_tokens=16)  # was an IndexError
    prompt = torch.tensor([ids[:scored.index(True)][-(CONTEXT - 16):]])  # the context less the 16 new tokens
    by_hand = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                             do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    assert got == [tok.decode(by_hand[0, prompt.shape[1]:], skip_special_tokens=True)]
    forced = generation.teacher_forced(model, tok, Completions((example,)), False)
    window = torch.tensor([ids[-CONTEXT:]])  # the example's last 128 tokens, the completion whole
    labels = torch.tensor([[t if s else -100 for t, s in zip(ids[-CONTEXT:], scored[-CONTEXT:])]])
    with torch.no_grad():
        loss = float(model(input_ids=window, labels=labels).loss)
    assert forced.loss() == pytest.approx(loss, rel=1e-5) and forced.tokens.tolist() == [float(sum(scored))]
    notes = generation.fit(tok, completion.CompletionTask("t", {s: Completions((example,)) for s in
                                                                ("train", "validation", "test")}, "here"),
                           Completions((example,)), CONTEXT, 16)
    assert notes == ("t: 1 of 1 examples were longer than the model's context of 128 tokens and lost the start of "
                     "their prompt (never a completion token)",
                     "t: 1 of 1 prompts were longer than the 112 tokens the model's context of 128 leaves beside 16 "
                     "new tokens, and were generated from their last tokens (lower --max-new-tokens to keep more of "
                     "them)")


def test_a_fine_tune_notes_the_cut_and_reports_the_examples_it_trained_on(long):
    doc = long["finetune"]
    task = completion.load_completion_task(long["task"])
    n_train, n_test = len(task.splits["train"]), len(task.splits["test"])
    assert (n_train, n_test) == (176, 49)  # 249 items, 20 % test and 10 % validation cut from them
    assert doc["train_examples"] == n_train and doc["config"]["train_examples"] == 2000  # the cap, not the count
    assert doc["test_examples"] == n_test and doc["task_kind"] == "completion"
    assert f"long.csv: {n_train} of {n_train} examples were longer than the model's context of 128 tokens and lost " \
           "the start of their prompt (never a completion token)" in doc["notes"]
    assert f"long.csv: {n_test} of {n_test} prompts were longer than the 120 tokens the model's context of 128 " \
           "leaves beside 8 new tokens, and were generated from their last tokens (lower --max-new-tokens to keep " \
           "more of them)" in doc["notes"]
    record = json.loads((long["root"] / "ft" / "graftui_record.json").read_text())
    assert record["train_examples"] == n_train and record["notes"][0].startswith(f"long.csv: {n_train} of {n_train}")
    shown = text.finetune(doc)  # what the CLI printed
    assert f"1 epoch(s), batch 16, {n_train} training examples" in shown and "2000" not in shown


def test_localize_refuses_more_new_tokens_than_the_context_before_mask_learning(long, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("mask learning started")

    monkeypatch.setattr("graftui.flows.single.run_method", never)
    out = tmp_path / "r.safetensors"
    for new in ("200", "128"):
        refused(["localize", "--base", long["base"], "--finetuned", long["ft"], "--task", long["task"], "--steps", "2",
                 "--max-new-tokens", new, "--out", out],
                f"--max-new-tokens {new} leaves no room for a prompt in the model's context of 128 tokens: give "
                "--max-new-tokens 127 or fewer")
    assert not out.exists()
    refused(["finetune", "--base", long["base"], "--task", long["task"], "--epochs", "1", "--max-new-tokens", "200",
             "--out", tmp_path / "ft"], "--max-new-tokens 200 leaves no room for a prompt in the model's context of "
                                        "128 tokens: give --max-new-tokens 127 or fewer")
    assert not (tmp_path / "ft").exists()  # refused before any fine-tuning step


def test_long_prompts_localize_and_evaluate_with_the_cut_noted(long, tmp_path):
    out = tmp_path / "r.safetensors"
    code, stdout, err = run_cli("localize", "--base", long["base"], "--finetuned", long["ft"], "--task", long["task"],
                                "--steps", "2", "--check-n", "4", "--max-new-tokens", "16", "--out", out, "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert out.exists() and len(doc["check"]["generations"]) == 4
    assert doc["notes"][:2] == [
        "long.csv: 4 of 4 examples were longer than the model's context of 128 tokens and lost the start of their "
        "prompt (never a completion token)",
        "long.csv: 4 of 4 prompts were longer than the 112 tokens the model's context of 128 leaves beside 16 new "
        "tokens, and were generated from their last tokens (lower --max-new-tokens to keep more of them)"]
    assert "long.csv: 176 of 176 examples were longer than the model's context of 128 tokens and lost the start of " \
           "their prompt (never a completion token)" in doc["notes"]  # mask learning's examples
    code, stdout, err = run_cli("evaluate", "--region", out, "--n", "6", "--json")  # the region's own 16 new tokens
    assert code == 0, err
    ev = json.loads(stdout)
    assert [r["n"] for r in ev["rows"]] == [6, 6, 6] and ev["judging"][0]["max_new_tokens"] == 16
    assert "long.csv: 6 of 6 prompts were longer than the 112 tokens the model's context of 128 leaves beside 16 " \
           "new tokens, and were generated from their last tokens (lower --max-new-tokens to keep more of them)" \
           in ev["notes"]
    refused(["evaluate", "--region", out, "--n", "6", "--max-new-tokens", "200"],
            "--max-new-tokens 200 leaves no room for a prompt in the model's context of 128 tokens: give "
            "--max-new-tokens 127 or fewer")


def test_a_completion_longer_than_the_context_is_refused_before_any_work(long, tmp_path, monkeypatch):
    """A completion of 150 tokens: under the old 256-token cut, over the model's 128 (an IndexError mid-run)."""
    def never(*args, **kwargs):
        raise AssertionError("work started")

    monkeypatch.setattr("graftui.flows.single.run_method", never)
    monkeypatch.setattr("graftui.training.train_epochs", never)
    answers = tmp_path / "answers.csv"
    _write_pairs(answers, ((f"say {w}", " good" * 149) for w in list(OPPOSITES) * 3))
    line = ("example 1 of answers.csv has 150 completion tokens, more than the model's context of 128 tokens: shorten "
            "its completion or drop the example (a completion is never cut), or give a model with a longer context")
    refused(["localize", "--base", long["base"], "--finetuned", long["ft"], "--task", answers, "--steps", "2",
             "--out", tmp_path / "r.safetensors"], line)
    refused(["finetune", "--base", long["base"], "--task", answers, "--out", tmp_path / "ft"], line)
    assert not (tmp_path / "r.safetensors").exists() and not (tmp_path / "ft").exists()


@pytest.mark.e2e  # two fine-tunes through the CLI
def test_ablation_and_stitching_check_the_context_first_and_note_what_it_cut(long, tmp_path):
    """The two region-file verbs that generate (anatomy --ablate, with the region's own generation length, and compose
    --stitch) check the context before they score anything, and say what it cut."""
    regions = []
    for seed, ft in ((0, long["ft"]), (1, str(tmp_path / "ft-1"))):
        if seed:
            code, _, err = run_cli("finetune", "--base", long["base"], "--task", long["task"], "--epochs", "1",
                                   "--seed", "1", "--max-new-tokens", "8", "--out", ft)
            assert code == 0, err
        regions.append(tmp_path / f"r{seed}.safetensors")
        code, _, err = run_cli("localize", "--base", long["base"], "--finetuned", ft, "--task", long["task"], "--steps",
                               "1", "--check-n", "0", "--max-new-tokens", "8", "--out", regions[-1])
        assert code == 0, err
    code, out, err = run_cli("anatomy", "--region", regions[0], "--ablate", "--n", "4", "--json")
    assert code == 0, err
    assert "long.csv: 4 of 4 prompts were longer than the 120 tokens the model's context of 128 leaves beside 8 new " \
           "tokens, and were generated from their last tokens (lower --max-new-tokens to keep more of them)" \
           in json.loads(out)["notes"]
    code, out, err = run_cli("compose", "--region", regions[0], "--region", regions[1], "--stitch", "--n", "4",
                             "--validation-n", "4", "--lambdas", "1", "--json")
    assert code == 0, err
    assert "long.csv: 4 of 4 prompts were longer than the 120 tokens the model's context of 128 leaves beside 8 new " \
           "tokens, and were generated from their last tokens (lower --max-new-tokens to keep more of them)" \
           in json.loads(out)["notes"]


def test_a_regions_recorded_generation_length_beyond_the_context_is_told_with_an_option_the_verb_has(long, tmp_path):
    """anatomy and compose take --max-new-tokens too, so the line that refuses a region's recorded 200 names a fix."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    made = tmp_path / "r.safetensors"
    code, _, err = run_cli("localize", "--base", long["base"], "--finetuned", long["ft"], "--task", long["task"],
                           "--steps", "1", "--check-n", "0", "--max-new-tokens", "8", "--out", made)
    assert code == 0, err
    with safe_open(str(made), framework="pt") as fh:
        header, tensors = dict(fh.metadata()), {k: fh.get_tensor(k) for k in fh.keys()}
    meta = json.loads(header["meta"])
    meta["request"]["max_new_tokens"] = 200  # as a file from elsewhere may say
    header["meta"] = json.dumps(meta)
    edited = tmp_path / "r200.safetensors"
    save_file(tensors, str(edited), metadata=header)
    refused(["anatomy", "--region", edited, "--ablate", "--n", "2"],
            "--max-new-tokens 200 leaves no room for a prompt in the model's context of 128 tokens: give "
            "--max-new-tokens 127 or fewer")
    code, out, err = run_cli("anatomy", "--region", edited, "--ablate", "--n", "2", "--max-new-tokens", "8", "--json")
    assert code == 0, err
    refused(["anatomy", "--region", edited, "--max-new-tokens", "2000"],
            "--max-new-tokens 2000 is more than 1024; an answer this long is no exact-match task")
    refused(["compose", "--region", edited, "--region", made, "--max-new-tokens", "0"],
            "--max-new-tokens must be at least 1, got 0")
