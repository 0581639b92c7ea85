"""How a completion's answer is judged: the answer rule's filters (first line, extraction regex, regexes to ignore,
case, punctuation, whitespace) on hand-made generations, the three scores (exact match, contains, token F1) with
values worked out by hand, hostile regexes refused in one line, and a rule that round-trips through a region file."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

import graftui
from graftui import card, cli, regions
from graftui.tasks.completion import generation
from graftui.tasks.completion.data import Completions
from graftui.errors import DataError, RequestError
from graftui.tasks.completion.generation import REGEX_SECONDS, AnswerRule, judge
from graftui.requests import EvaluateRequest, LocalizeRequest
from graftui.kinds import COMPLETION_KIND, recorded_rule
from graftui.tasks.harness.kind import HARNESS
from graftui.ui.kinds import app_of

from lm_util import write_completion_task, write_lm_pair

pytestmark = pytest.mark.unit

DATE = "December 28, 1983"
BACKTRACKS = "(a|aa)+$"


def scores(generations, references, rule=AnswerRule()):
    j = judge(generations, references, rule)
    return j.exact.tolist(), j.contains.tolist(), j.token_f1.tolist()


# -- the filters ----------------------------------------------------------------------------------------------------
def test_quotes_count_against_an_answer_until_punctuation_is_ignored():
    quoted = [f'"{DATE}"', f"“{DATE}”", f"'{DATE}'."]
    assert scores(quoted, [DATE] * 3)[0] == [0.0, 0.0, 0.0]  # strict: the quotes are part of the answer
    assert scores(quoted, [DATE] * 3, AnswerRule(ignore_punctuation=True))[0] == [1.0, 1.0, 1.0]
    assert AnswerRule(ignore_punctuation=True).answer(f'"{DATE}"', DATE) == "December 28 1983"  # the same for both
    assert AnswerRule(ignore_punctuation=True).answer("—$1,000!", "x") == "1000"  # dashes and the harness's symbols


def test_regexes_to_ignore_are_removed_from_both_answers_in_order():
    rule = AnswerRule(regexes_to_ignore=(r"\b(a|an|the)\b", r"^\s*answer:"))
    assert rule.answer("answer: the Eiffel Tower", "Eiffel Tower") == "Eiffel Tower"
    assert scores(["answer: the Eiffel Tower", "an Eiffel Tower", "The Eiffel Tower"], ["the Eiffel Tower"] * 3,
                  rule)[0] == [1.0, 1.0, 0.0]  # 'The' is not 'the': case is folded after, as in the harness
    folded = AnswerRule(regexes_to_ignore=(r"(?i)\bthe\b",))
    assert scores(["The Eiffel Tower"], ["the Eiffel Tower"], folded)[0] == [1.0]


def test_case_first_line_the_extraction_regex_and_whitespace():
    assert scores(["JULY 4"], ["July 4"])[0] == [0.0]
    assert scores(["JULY 4"], ["July 4"], AnswerRule(ignore_case=True))[0] == [1.0]
    assert scores([" July 4\nDate: 2020"], [" July 4"])[0] == [1.0]  # one-line reference: the first line
    assert scores([" July 4\nDate: 2020"], [" July 4"], AnswerRule(first_line=False))[0] == [0.0]
    gsm = AnswerRule(regex=r"#### (\S+)")
    assert scores(["16 is 8 and 8.\n#### 16", "no answer"], ["8 plus 8 is 16.\n#### 16"] * 2, gsm) == (
        [1.0, 0.0], [1.0, 0.0], [1.0, 0.0])  # without an answer: no score at all
    assert scores(["1 000", "1  000"], ["1000"] * 2)[0] == [0.0, 0.0]
    assert scores(["1 000", "1  000"], ["1000"] * 2, AnswerRule(whitespace="remove"))[0] == [1.0, 1.0]
    assert scores(["a  b"], ["a b"], AnswerRule(first_line=False, whitespace="keep"))[0] == [0.0]
    assert scores(["a  b"], ["a b"], AnswerRule(first_line=False))[0] == [1.0]  # collapse, the default


def test_every_filter_at_once_and_the_order_it_is_applied_in():
    rule = AnswerRule(regex=r"Answer: (.*)", regexes_to_ignore=(r"\(.*?\)",), ignore_case=True,
                      ignore_punctuation=True, whitespace="collapse")
    assert rule.answer('Answer: "The  Beatles" (band).', "Answer: The Beatles") == "the beatles"
    assert rule.describe(16) == ("greedy, at most 16 new tokens; answer: the first match of 'Answer: (.*)' in the first "
                                 r"line (of one-line references); matches of '\(.*?\)' removed; case ignored; "
                                 "punctuation ignored; whitespace collapsed")
    assert AnswerRule().describe(32) == ("greedy, at most 32 new tokens; answer: the first line (of one-line "
                                         "references); whitespace collapsed")


# -- the three scores ------------------------------------------------------------------------------------------------
def test_contains_and_token_f1_by_hand():
    refs = ["the dog sat"] * 5
    exact, inside, f1 = scores(["the cat sat", "the dog sat", "he said the dog sat down", "dog", "nothing here"], refs)
    assert exact == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert inside == [0.0, 1.0, 1.0, 0.0, 0.0]
    assert f1 == pytest.approx([2 / 3, 1.0, 2 * (3 / 6) * 1 / (3 / 6 + 1), 2 * 1 * (1 / 3) / (1 + 1 / 3), 0.0])
    assert f1[0] == pytest.approx(2 / 3) and f1[2] == pytest.approx(2 / 3) and f1[3] == pytest.approx(0.5)
    assert generation.token_f1("a a b", "a b b") == pytest.approx(2 / 3)  # shared tokens count with repeats
    assert generation.token_f1("December 1983", "December 28 1983") == pytest.approx(0.8)  # P = 1, R = 2/3
    assert generation.token_f1("", "") == 1.0 and generation.token_f1("", "x") == 0.0
    assert generation.token_f1(None, "x") == 0.0 and not generation.contains(None, "x")
    assert generation.contains("14", "4")  # a substring: exact match or a regex tells '4' from '14'
    assert generation.contains("", "") and not generation.contains("x", "")
    # the example of the problem: quoted, the answer is wrong strictly, contains the reference, and shares one token
    # of three with it ('28,': '"December' and '1983"' keep their quotes), F1 1/3
    assert scores([f'"{DATE}"'], [DATE]) == ([0.0], [1.0], [pytest.approx(1 / 3)])
    assert scores([f'"{DATE}"'], [DATE], AnswerRule(ignore_punctuation=True)) == ([1.0], [1.0], [1.0])


def test_a_comparisons_rows_and_generations_carry_the_three_scores(monkeypatch):
    """compare_completions, each model's generations given: every row has the means and every shown example each
    model's answer and scores; contains and token F1 are paired against FT like exact match."""
    refs = [" July 4", " May 1", " June 2"]
    said = {"fine-tuned": [' "July 4"', " May 1", " June"], "pre-trained, same prompt": [" no", " no", " no"],
            "r": [" July 4", " it was May 1", " June 2"]}
    data = Completions(tuple((("user", f"q{i}"), ("assistant", r)) for i, r in enumerate(refs)))
    task = SimpleNamespace(name="dates", chat=False, splits={"test": data})

    def reading(texts, data, rule):
        ones = torch.ones(len(texts), dtype=torch.float64)
        forced = generation.TeacherForced(ones, ones, torch.zeros(len(texts), 10, dtype=torch.float64))
        return generation.Reading(texts, judge(texts, data.references, rule), forced)

    monkeypatch.setattr(generation, "fit", lambda *a, **k: ())
    monkeypatch.setattr(generation, "context_length", lambda model: None)
    monkeypatch.setattr(generation, "state_of", lambda pair, region: contextlib.nullcontext())
    monkeypatch.setattr(generation, "region_size", lambda region: 5)
    monkeypatch.setattr(generation, "read", lambda m, t, task, data, rule, *a: reading(said["r"], data, rule))
    monkeypatch.setattr(generation, "reference_read",
                        lambda pair, name, task, data, rule, *a: reading(said[name], data, rule))
    pair = SimpleNamespace(tokenizer=None, model=None)
    part = generation.compare_completions(pair, task, {"r": object()}, rule=AnswerRule())
    rows = {r["model"]: r for r in part["rows"]}
    assert rows["fine-tuned"]["exact_match"] == pytest.approx(1 / 3)  # the quotes and 'June' miss
    assert rows["fine-tuned"]["contains"] == pytest.approx(2 / 3)  # '"July 4"' holds 'July 4'
    # token F1: '"July' and '4"' share no token with 'July 4' (0), 'May 1' (1), 'June' against 'June 2' (P = 1,
    # R = 1/2: 2/3)
    assert rows["fine-tuned"]["token_f1"] == pytest.approx((0 + 1 + 2 / 3) / 3)
    assert rows["r"]["exact_match"] == pytest.approx(2 / 3) and rows["r"]["contains"] == 1.0
    assert rows["r"]["token_f1"] == pytest.approx((1 + 2 * (2 / 4) * 1 / (2 / 4 + 1) + 1) / 3)
    found = {(d["a"], d["b"], d["metric"]): d for d in part["differences"]}
    for metric in ("exact_match", "contains", "token_f1"):
        d = found[("r", "fine-tuned", metric)]
        assert d["diff"] == pytest.approx(rows["r"][metric] - rows["fine-tuned"][metric]) and len(d["ci"]) == 2
        assert (d["p"] is None) == (metric != "exact_match")  # McNemar's p: exact match's alone
    assert found[("r", "fine-tuned", "contains")]["share"] and not found[("r", "fine-tuned", "token_f1")]["share"]
    first = part["generations"][0]
    assert first["reference_answer"] == "July 4" and first["answer"]["fine-tuned"] == '"July 4"'
    assert first["exact"] == {"fine-tuned": False, "pre-trained, same prompt": False, "r": True}
    assert first["contains"]["fine-tuned"] and first["token_f1"]["fine-tuned"] == 0.0
    assert card.generation_cell(first, "fine-tuned") == '≈ «"July 4"»'
    assert card.generation_cell(part["generations"][1], "r") == "≈ «it was May 1»"
    assert card.generation_cell(part["generations"][2], "fine-tuned") == "✗ (F1 0.67) «June»"
    assert card.generation_cell(first, "r") == "✓ «July 4»"
    assert card.generation_cell({"x": "y", "exact": {"x": True}}, "x") == "✓ y"  # a result from before answers
    lines = COMPLETION_KIND.card(part, None, "fine-tuned")
    assert "contain it on 66.7 %" in lines[0] and "whitespace collapsed" in lines[0]
    assert lines[1].startswith("Exact match is undecided here: the fine-tuned model answers 1 more of the 3 items")
    assert "contains the reference's answer on 100.0 %" in lines[2] and "token F1 0.889" in lines[2]
    shown = app_of(COMPLETION_KIND).app_rows({"rows": part["rows"]})
    assert [r["contains ↑"] for r in shown] == ["66.7%", "0.0%", "100.0%"]
    assert [r["token F1 ↑"] for r in shown] == ["0.556", "0.000", "0.889"]
    assert json.loads(json.dumps(part))["rule"]["regexes_to_ignore"] == []


# -- hostile rules ---------------------------------------------------------------------------------------------------
def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_hostile_regexes_to_ignore_are_refused_in_one_line():
    began = time.monotonic()
    with pytest.raises(DataError, match="the ignore regex .* backtracks without end") as err:
        AnswerRule(regexes_to_ignore=(BACKTRACKS,)).answer("a" * 60 + "!")
    assert BACKTRACKS in one_line(err) and time.monotonic() - began < 20 * REGEX_SECONDS
    with pytest.raises(DataError, match="the ignore regex is 501 characters long, over 500") as err:
        AnswerRule(regexes_to_ignore=("a" * 501,)).ignored()
    one_line(err)
    with pytest.raises(DataError, match=r"repeats by counts \(\{n\}\) whose product is over 10,000") as err:
        AnswerRule(regexes_to_ignore=("x", "(?:(?:a{65535}){65535}){65535}")).ignored()
    one_line(err)
    with pytest.raises(DataError, match="the ignore regex '\\(' is not a regular expression") as err:
        AnswerRule(regexes_to_ignore=("(",)).ignored()
    one_line(err)
    with pytest.raises(DataError, match="9 regexes to ignore are over 8") as err:
        AnswerRule(regexes_to_ignore=("x",) * 9).ignored()
    one_line(err)
    with pytest.raises(DataError, match="leaves every reference's answer empty") as err:
        AnswerRule(regexes_to_ignore=(".*",)).check(["July 4", "May 1"])
    one_line(err)
    with pytest.raises(DataError, match="no way of comparing answers"):
        AnswerRule(whitespace="squash")
    with pytest.raises(DataError, match="regexes are text"):
        AnswerRule(regexes_to_ignore=(["(a"],))


@pytest.mark.parametrize("given, message", [
    (dict(ignore_regex=["("]), "the ignore regex '(' is not a regular expression"),
    (dict(ignore_regex=[BACKTRACKS, "a" * 501]), "over 500"),
    (dict(ignore_regex=["x"] * 9), "9 regexes to ignore are over 8"),
    (dict(ignore_regex="^the "), "--ignore-regex takes a list of regexes"),
    (dict(ignore_regex=[3]), "--ignore-regex takes a list of regexes"),
    (dict(answer_whitespace="squash"), "unknown answer whitespace 'squash'; choose from collapse, remove, keep"),
])
def test_a_request_with_a_bad_rule_is_refused_in_one_line(given, message):
    with pytest.raises(RequestError) as err:
        EvaluateRequest.make(**given).validate()
    assert message in one_line(err)


def test_the_command_line_reads_the_flags_and_refuses_a_bad_one_in_one_line(capsys):
    args = cli.build_parser().parse_args(["evaluate", "--ignore-regex", r"^the ", "--ignore-regex", "x", "--n", "3",
                                          "--ignore-punctuation", "--answer-whitespace", "remove"])
    rule = cli.request_from(args, EvaluateRequest).answer_rule()
    assert rule == AnswerRule(ignore_punctuation=True, regexes_to_ignore=("^the ", "x"), whitespace="remove")
    assert cli.main(["evaluate", "--ignore-regex", "(?:(?:a{65535}){65535}){65535}"]) != 0
    err = capsys.readouterr().err.strip()
    assert "whose product is over 10,000" in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_an_lm_eval_task_refuses_every_answer_flag_of_graftuis():
    with pytest.raises(RequestError, match="--ignore-punctuation, --ignore-regex: an lm-eval task is judged by the "
                                           "harness's own filters .*drop them") as err:
        HARNESS.judging(EvaluateRequest.make(ignore_punctuation=True, ignore_regex=["x"]))
    one_line(err)
    for given, flag in ((dict(answer_regex="(x)"), "--answer-regex"), (dict(answer_whitespace="keep"),
                                                                         "--answer-whitespace")):
        with pytest.raises(RequestError, match=f"^{flag}: .*drop it$"):
            HARNESS.judging(EvaluateRequest.make(**given))
    assert HARNESS.judging(EvaluateRequest.make())[0] == AnswerRule()


# -- the rule a region was made with ----------------------------------------------------------------------------------
MADE = dict(ignore_punctuation=True, ignore_regex=[r"\b(a|an|the)\b", ""], answer_whitespace="remove",
            ignore_case=True)
RULE = AnswerRule(ignore_case=True, ignore_punctuation=True, regexes_to_ignore=(r"\b(a|an|the)\b",),
                  whitespace="remove")


def meta_of(**request):
    return SimpleNamespace(request=request)


def test_a_recorded_rule_is_read_back_and_a_request_changes_only_what_it_says():
    made = LocalizeRequest.make(**MADE, max_new_tokens=5)
    assert made.answer_rule() == RULE
    meta = meta_of(**json.loads(json.dumps(made.as_dict())))  # as a region file holds it
    assert recorded_rule(meta) == (RULE, 5)
    assert COMPLETION_KIND.judging(EvaluateRequest.make(), meta) == (RULE, 5)  # silent: the region's own
    asked = EvaluateRequest.make(ignore_regex=[""], answer_whitespace="collapse", answer_regex="(\\w+)")
    assert COMPLETION_KIND.judging(asked, meta)[0] == AnswerRule(regex="(\\w+)", ignore_case=True,
                                                                 ignore_punctuation=True)
    assert COMPLETION_KIND.judging(EvaluateRequest.make(ignore_regex=["x"]), meta)[0].regexes_to_ignore == ("x",)
    assert COMPLETION_KIND.judging(EvaluateRequest.make()) == (AnswerRule(), generation.MAX_NEW_TOKENS)


@pytest.mark.parametrize("recorded", [
    dict(ignore_regex="the"), dict(ignore_regex=[1, 2]), dict(ignore_regex={"a": 1}), dict(answer_whitespace="squash"),
    dict(answer_whitespace=["remove"]), dict(ignore_punctuation="yes"), dict(answer_regex=5),
])
def test_a_recorded_value_of_the_wrong_kind_reads_as_the_default(recorded):
    assert recorded_rule(meta_of(**recorded)) == (AnswerRule(), generation.MAX_NEW_TOKENS)
    assert recorded_rule(SimpleNamespace(request=["not", "a", "dict"])) == (AnswerRule(), generation.MAX_NEW_TOKENS)


@pytest.mark.parametrize("pattern, message", [
    ("(", "the ignore regex '(' is not a regular expression"), ("a" * 501, "over 500"),
    ("(?:(?:a{65535}){65535}){65535}", "whose product is over 10,000"),
])
def test_a_recorded_hostile_ignore_regex_is_refused_in_one_line_before_any_model_runs(pattern, message):
    with pytest.raises(DataError) as err:
        COMPLETION_KIND.judging(EvaluateRequest.make(), meta_of(ignore_regex=[pattern]))
    assert message in one_line(err)
    with pytest.raises(DataError, match="over 8"):
        COMPLETION_KIND.judging(EvaluateRequest.make(), meta_of(ignore_regex=["x"] * 100))
    assert COMPLETION_KIND.judging(EvaluateRequest.make(ignore_regex=[""]), meta_of(ignore_regex=[pattern]))[0] == \
        AnswerRule()  # '' judges without the region's own


def test_a_region_made_with_a_rule_is_evaluated_and_reported_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    base, ft = write_lm_pair(tmp_path, "llama")
    task = write_completion_task(tmp_path / "opposites.csv")
    out = tmp_path / "r.safetensors"
    graftui.localize(base=str(base), finetuned=str(ft), task=str(task), method="top-movement", sparsity=0.05,
                     check_n=0, max_new_tokens=3, out=str(out), **MADE)
    assert recorded_rule(regions.load(out).meta) == (RULE, 3)
    ev = graftui.evaluate(regions=[str(out)], n=4).as_dict()
    assert ev["judging"] == [{"task": ev["task"], "rule": json.loads(json.dumps(asdict(RULE))), "max_new_tokens": 3}]
    assert AnswerRule(**ev["judging"][0]["rule"]) == RULE
    assert any(RULE.describe(3) in line for line in ev["card"])
    assert all({"exact_match", "contains", "token_f1"} <= set(r) for r in ev["rows"])
    assert all(0 <= r["exact_match"] <= r["contains"] <= 1 and r["exact_match"] <= r["token_f1"] <= 1 for r in ev["rows"])
    for g in ev["generations"]:
        assert g["reference_answer"] == RULE.answer(g["reference"], g["reference"])
        assert all(g["answer"][m] == RULE.answer(g[m], g["reference"]) for m in g["exact"])
    plain = graftui.evaluate(regions=[str(out)], n=4, ignore_regex=[""], answer_whitespace="collapse").as_dict()
    assert plain["judging"][0]["rule"]["regexes_to_ignore"] == [] and plain["judging"][0]["rule"]["whitespace"] == \
        "collapse" and plain["judging"][0]["rule"]["ignore_punctuation"]  # asked otherwise: only what was asked
