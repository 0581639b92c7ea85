"""Judging completions: exact maths of the example-level paired intervals and the token-level calibration error,
the answer rule, and batched greedy generation and teacher forcing against plain transformers on tiny causal LMs."""

from __future__ import annotations

import math

import pytest
import torch

from graftui.tasks.completion import generation
from graftui import metrics
from graftui.tasks.completion.data import Completions
from graftui.errors import DataError
from graftui.tasks.completion.generation import AnswerRule

from lm_util import make_lm, make_tokenizer


# -- intervals ----------------------------------------------------------------------------------------------------
def test_identical_models_have_a_zero_width_interval_at_zero():
    hits = (torch.tensor([1.0, 0, 1, 1, 0]), torch.ones(5))
    d = metrics.paired_ratio_difference(hits, hits, "exact_match")
    assert d["diff"] == 0.0 and d["ci"] == [0.0, 0.0] and d["p"] == 1.0 and d["n"] == 5


def test_exact_match_gets_mcnemars_exact_p_value():
    a = torch.tensor([1.0] * 6 + [0.0] * 4)
    b = torch.tensor([0.0] * 5 + [1.0] + [0.0] * 4)  # right under A alone: 5 examples; under B alone: none
    d = metrics.paired_ratio_difference((a, torch.ones(10)), (b, torch.ones(10)), "exact_match")
    assert d["diff"] == pytest.approx(0.5)
    assert d["p"] == pytest.approx(2 / 2 ** 5)  # two-sided binomial tail of 5 discordant pairs all one way
    lo, hi = d["ci"]
    assert 0 <= lo < 0.5 < hi <= 1  # A never loses an example: no resample can go below zero


def test_a_loss_per_token_resamples_whole_examples():
    """The loss per token is Σ loss / Σ tokens over the examples drawn: a resample that draws example 0 twice counts
    its three tokens twice."""
    loss_sum, tokens = torch.tensor([3.0, 1.0, 2.0]), torch.tensor([3.0, 1.0, 4.0])
    assert metrics.ratio(loss_sum, tokens) == pytest.approx(6 / 8)
    w = torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, 0.0]], dtype=torch.float64)
    assert metrics.ratio(loss_sum, tokens, w).tolist() == pytest.approx([8 / 10, 1.0])
    shifted = metrics.paired_ratio_difference((loss_sum + torch.tensor([0.3, 0.1, 0.4]), tokens), (loss_sum, tokens),
                                              "loss")
    assert shifted["diff"] == pytest.approx(0.1) and shifted["ci"][0] == pytest.approx(0.1)  # 0.1 per token in each
    assert shifted["ci"][1] == pytest.approx(0.1) and shifted["p"] is None


def test_a_token_ece_with_one_token_per_example_is_the_classifier_ece():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(200, 5, generator=gen) * 2, dim=1)
    labels = torch.randint(0, 5, (200,), generator=gen)
    conf, pred = probs.max(dim=1)
    sums = metrics.calibration_sums(conf, (pred == labels).double(), torch.arange(200), 200)
    assert metrics.ratio(sums, torch.ones(200)) == pytest.approx(metrics.ece(probs, labels), abs=1e-12)


def test_a_paired_interval_covers_a_known_difference():
    """A has exact match 0.8 and B 0.5 on 400 examples: the interval holds 0.3 and excludes zero."""
    gen = torch.Generator().manual_seed(3)
    a = (torch.rand(400, generator=gen) < 0.8).double()
    b = a * (torch.rand(400, generator=gen) < 0.625).double()
    d = metrics.paired_ratio_difference((a, torch.ones(400)), (b, torch.ones(400)), "exact_match")
    lo, hi = d["ci"]
    assert lo < float(a.mean() - b.mean()) < hi and lo > 0 and metrics.distinguishable(d)


# -- the answer rule ----------------------------------------------------------------------------------------------
def test_the_answer_rule_cuts_the_first_line_extracts_and_folds_case():
    rule = AnswerRule()
    assert rule.answer(" July 4, 2019\nDate: 2020", " July 4, 2019") == "July 4, 2019"
    assert AnswerRule(first_line=False).answer(" July 4\nmore", " July 4") == "July 4 more"
    gsm = AnswerRule(regex=r"#### (\S+)")
    assert gsm.answer("He has 5 apples.\n#### 5", "x\n#### 5") == "5" and gsm.answer("no answer", "x") is None
    assert AnswerRule(ignore_case=True).answer("JULY", "july") == "july"
    hits = generation.exact_matches([" July 4, 2019\nnoise", "july 4, 2019", ""], [" July 4, 2019"] * 3, rule)
    assert hits.tolist() == [1.0, 0.0, 0.0]


def test_a_regex_that_finds_no_reference_answer_is_refused_in_one_line():
    with pytest.raises(DataError, match=r"matches none of the references.*fix the regex"):
        AnswerRule(regex=r"#### (\d+)").check(["July 4", "May 1"])
    with pytest.raises(DataError, match="not a regular expression"):
        AnswerRule(regex="(").compiled()


# -- generation and teacher forcing on tiny causal LMs -----------------------------------------------------------
@pytest.fixture(scope="module", params=["llama", "gpt2"])
def lm(request, tmp_path_factory):
    tok = make_tokenizer(tmp_path_factory.mktemp("tok"))
    return make_lm(request.param, len(tok)).eval(), tok


def _split(n: int = 7) -> Completions:
    words = "good bad great terrible fine awful movie film plot".split()
    return Completions(tuple((("user", " ".join(words[i % 9:] + words[:i % 4])), ("assistant", f" {words[(i * 2) % 9]}"))
                             for i in range(n)))


def test_batched_greedy_generation_equals_one_prompt_at_a_time(lm):
    model, tok = lm
    split = _split()
    batched = generation.generate(model, tok, split, False, max_new_tokens=5, batch_size=4, max_length=64)
    assert len(batched) == len(split.examples) == 7  # one answer per prompt: an empty result must not pass
    for example, got in zip(split.examples, batched, strict=True):
        ids = torch.tensor([generation.prompt_ids(tok, example, False, 64)])
        alone = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                               pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[0, ids.shape[1]:]
        assert got == tok.decode(alone, skip_special_tokens=True)


def test_teacher_forcing_sums_the_loss_transformers_averages(lm):
    from graftui.tasks.completion.data import batches

    model, tok = lm
    split = _split()
    forced = generation.teacher_forced(model, tok, split, False, max_length=64, batch_size=3)
    batch = next(batches(tok, split, False, len(split), 64))
    with torch.no_grad():
        loss = float(model(**batch).loss)  # the mean over every completion token of the split
    assert forced.loss() == pytest.approx(loss, rel=1e-5)
    assert forced.tokens.tolist() == [float((row[1:] != -100).sum()) for row in batch["labels"]]
    assert 0.0 <= forced.token_ece() <= 1.0 and math.isfinite(forced.token_ece())
