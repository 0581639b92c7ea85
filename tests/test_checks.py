"""Localize says at once whether its region works; FT's and the empty region's scores are computed once per pair and
sample; the empty region is named after the pair's kind, and the readings explain themselves."""

from __future__ import annotations

import pytest

from lm_util import MC_YAML, write_lm_pair, write_task

from graftui import card, flows, regions
from graftui.tasks.classification import scoring
from graftui.config import BODY_LABEL, FT_LABEL, LM_BODY_LABEL
from graftui.requests import EvaluateRequest, LocalizeRequest

WORDS = "negative= bad,positive= good"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("check")
    base, ft = write_lm_pair(root, "gpt2")
    return base, ft, write_task(root / "words.csv", n=60)


def test_localize_scores_its_region_at_once_as_evaluate_does_and_names_the_prompted_empty_region(gpt2, tmp_path,
                                                                                                 monkeypatch):
    """The held-out check: the start (top-movement) and the learned region beside FT and the zero-shot model, equal to
    evaluate's rows on the same n examples; FT and the empty region are scored once for both."""
    base, ft, task = gpt2
    calls = []
    predict = scoring.predict
    monkeypatch.setattr(scoring, "predict", lambda *a, **kw: calls.append(a[1].name) or predict(*a, **kw))
    events = []
    loc = flows.localize(LocalizeRequest(base=str(base), finetuned=str(ft), task=str(task), label_words=WORDS, steps=3,
                                         k=400, check_n=10, out=str(tmp_path / "r.safetensors")), progress=events.append)
    held = [e["heldout"] for e in events if "heldout" in e]
    assert [(h["step"], h["model"], h["n"]) for h in held] == [(0, "top-movement start", 10), (3, "this region", 10)]
    assert len(calls) == 4  # FT, the empty region, the start, the region: the references once
    check = loc.as_dict()["check"]
    assert [r["model"] for r in check["rows"]] == [FT_LABEL, LM_BODY_LABEL, "this region"] and check["n"] == 10
    assert held[-1]["accuracy"] == check["rows"][2]["accuracy"] and held[-1]["ft"] == check["rows"][0]["accuracy"]
    text = " ".join(loc.as_dict()["card"])
    assert "quick check on 10 held-out test examples" in text and "read through the same prompt (zero-shot)" in text
    # mask learning is the job's first part, as many of its passes as it has, then the check is told as its own stage: never 100 % while it scores
    from graftui.flows.single import learning_share
    from graftui.kinds import kind_named

    share = learning_share(LocalizeRequest(steps=3, check_n=10), kind_named("classification"), True)
    assert share == pytest.approx(3 * 16 * 3 / (3 * 16 * 3 + 10 * 3))  # its passes: the batches', then the check's

    first = next(i for i, e in enumerate(events) if e.get("step"))
    fractions = [e["fraction"] for e in events[first:] if "fraction" in e]  # from mask learning's first step on
    learning = [e["fraction"] for e in events if e.get("step")]
    assert learning and max(learning) == pytest.approx(share) and fractions == sorted(fractions)
    assert any(e.get("stage", "").startswith("held-out check on 10 examples") for e in events[-3:])

    logged = list(regions.latest_scores(tmp_path).values())  # the check is the region's first row in the table
    assert [(e["region"], e["n"], e["accuracy"]) for e in logged] == [("r.safetensors", 10, held[-1]["accuracy"])]
    calls.clear()
    ev = flows.evaluate(EvaluateRequest(regions=[loc.path], n=10, no_ood=True)).as_dict()
    assert len(calls) == 1  # only the graft: FT and the empty region come from the pair's references
    got = {r["model"]: (r["accuracy"], r["ece"]) for r in ev["rows"]}
    want = {r["model"]: (r["accuracy"], r["ece"]) for r in check["rows"]}
    assert got[FT_LABEL] == want[FT_LABEL] and got[LM_BODY_LABEL] == want[LM_BODY_LABEL]
    assert got["r"] == want["this region"]
    assert any(d["b"] == LM_BODY_LABEL for d in ev["differences"])


def test_references_are_kept_per_sample_content_not_per_task_name(gpt2, tmp_path):
    """Two tasks called alike with other sentences never share FT's scores; the same sample is served from the pair."""
    from graftui.tasks.classification.data import load_task

    base, ft, task = gpt2
    pair = flows.load_pair(str(base), str(ft), labels=("negative", "positive"))
    one = load_task(str(task))
    other_file = tmp_path / task.name  # the same file name, other sentences
    other_file.write_text(task.read_text().replace("movie", "film"))
    other = load_task(str(other_file))
    assert one.name == other.name
    a = scoring.reference_predict(pair, FT_LABEL, one, "test", 8)
    assert scoring.reference_predict(pair, FT_LABEL, one, "test", 8) is a
    b = scoring.reference_predict(pair, FT_LABEL, other, "test", 8)
    assert b is not a
    with pair.finetuned():
        direct = scoring.predict(pair, other, "test", 8)
    assert (b[0] == direct[0]).all()


def test_the_readings_explain_a_share_above_100_and_a_fine_tune_that_gained_nothing():
    from graftui.ui import tables

    def row(model, acc, size=None, task="t"):
        return {"model": model, "task": task, "distribution": "in", "n": 100, "accuracy": acc, "f1": acc, "ece": 0.1,
                "confidence": acc, "agreement_with_ft": 1.0, "region_size": size}

    above = card.annotate([row(FT_LABEL, 0.7), row(BODY_LABEL, 0.6), row("g", 0.85, 10)])
    assert above[2]["gain_recovered"] == pytest.approx(2.5)
    assert "above 100 % because the graft scores above the fine-tuned model itself" in " ".join(card.evaluate_card(above))
    lm = card.evaluate_card(card.annotate([row(FT_LABEL, 0.7), row(LM_BODY_LABEL, 0.6), row("g", 0.65, 10)]))
    assert "the pre-trained model read through the same prompt (zero-shot): 60.0 %" in lm[0]
    nothing = card.annotate([row(FT_LABEL, 0.5), row(BODY_LABEL, 0.6), row("g", 0.55, 10)])
    assert "Fine-tuning gained nothing on this task" in " ".join(card.evaluate_card(nothing))
    table = tables.compare_table({"rows": nothing})
    assert list(table["share of FT gain"]) == ["", "", "n/a: FT ≤ bare"]


def test_finetune_seeds_make_one_checkpoint_per_seed_equal_to_the_single_seed_fine_tune(gpt2, tmp_path):
    """The variance the paper reports is over fine-tunes: one checkpoint per seed, each the one --seed N makes."""
    from safetensors.torch import load_file

    from graftui.errors import RequestError
    from graftui.requests import FinetuneRequest

    base, _, task = gpt2
    common = dict(base=str(base), task=str(task), label_words=WORDS, template="{text} It was", epochs=1, lr=0.05,
                  train_examples=0)
    both = flows.finetune(FinetuneRequest(**common, seeds=[0, 1], out=str(tmp_path / "ft"))).as_dict()
    assert [(e["seed"], e["out"]) for e in both["per_seed"]] == [(s, str(tmp_path / f"ft-seed{s}")) for s in (0, 1)]
    accs = [e["test_accuracy"] for e in both["per_seed"]]
    assert both["test_accuracy"] == pytest.approx(sum(accs) / 2) and "over 2 fine-tunes" in both["card"][0]
    one = flows.finetune(FinetuneRequest(**common, seed=1, out=str(tmp_path / "single")))
    a, b = load_file(tmp_path / "ft-seed1" / "model.safetensors"), load_file(tmp_path / "single" / "model.safetensors")
    assert all(a[name].equal(b[name]) for name in a) and one.test_accuracy == accs[1]
    c = load_file(tmp_path / "ft-seed0" / "model.safetensors")
    assert any(not a[name].equal(c[name]) for name in a)  # another seed, another fine-tune
    with pytest.raises(RequestError, match="--seeds"):
        FinetuneRequest(**common, seeds=[]).validate()


def test_check_n_zero_skips_the_check_and_a_bad_one_is_one_line(gpt2, tmp_path):
    from graftui.errors import RequestError

    base, ft, task = gpt2
    events = []
    loc = flows.localize(LocalizeRequest(base=str(base), finetuned=str(ft), task=str(task), label_words=WORDS,
                                         method="top-movement", k=50, check_n=0, out=str(tmp_path / "r.safetensors")),
                         progress=events.append)
    assert loc.check is None and not any("heldout" in e for e in events) and not regions.latest_scores(tmp_path)
    assert "evaluate it (Compare, or graftui evaluate)" in loc.as_dict()["card"][0]
    for bad in (-1, 1.5, True):
        with pytest.raises(RequestError, match=r"^--check-n must be a whole number"):
            LocalizeRequest(check_n=bad).validate()


def _harness_task(folder) -> str:
    """A task YAML of ten test documents (and ten training ones)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": f"the movie was {w}", "label": i % 2}) + "\n"
                                                       for i, w in enumerate(["good", "bad"] * 5)))
    path = folder / "ten.yaml"
    path.write_text(MC_YAML.format(name="my_ten", folder=folder))
    return str(path)


@pytest.mark.parametrize("kind", ["classification", "completion", "lm-eval"])
def test_a_check_asked_for_more_examples_than_the_task_has_says_how_many_it_scores(kind, gpt2, tmp_path, monkeypatch):
    """The stage a localize job shows while its held-out check runs names the examples it scores: the task's, where
    it has fewer than --check-n asks (not 'held-out check on 200 examples' for a task of 10)."""
    from lm_util import write_completion_task

    from graftui.flows.common import LOCAL
    from graftui.kinds import KINDS, read_task

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    base, ft, classes = gpt2
    task, words = {"classification": (str(classes), WORDS),
                   "completion": (str(write_completion_task(tmp_path / "pairs.csv")), None),
                   "lm-eval": (_harness_task(tmp_path / "ten"), None)}[kind]
    events = []
    loc = flows.localize(LocalizeRequest(base=str(base), finetuned=str(ft), task=task, label_words=words,
                                         method="top-movement", k=50, check_n=200, out=str(tmp_path / "r.safetensors")),
                         progress=events.append)
    n = loc.check["n"]
    assert 0 < n < 200 and (n == 10 if kind == "lm-eval" else True)
    stages = [e["stage"] for e in events if e.get("stage", "").startswith("held-out check on")]
    assert stages and all(s.startswith(f"held-out check on {n} examples") for s in stages), stages
    read = read_task(LocalizeRequest(task=task), LOCAL)
    assert KINDS[kind].test_count(read, 200) == n and KINDS[kind].test_count(read, 3) == 3


@pytest.mark.unit
@pytest.mark.parametrize("kind, share, said, budget", [
    ("completion", 0.03, True, 0.01), ("classification", 0.2, True, 0.001), ("classification", 0.2, True, 0.2),
    ("completion", 0.5, False, 0.01), ("completion", None, False, 0.01)])
def test_a_region_that_lost_the_skill_on_held_out_examples_says_so_in_one_sentence(kind, share, said, budget):
    from graftui.flows.single import did_not_fit
    from graftui.kinds import kind_named

    rows = [{"model": FT_LABEL, "accuracy": 1.0}, {"model": "this region", "accuracy": 0.03, "gain_recovered": share}]
    notes = did_not_fit({"rows": rows, "n": 100}, kind_named(kind), 106203, round(106203 / budget))
    if not said:
        assert notes == []
        return
    score = "exact match" if kind == "completion" else "accuracy"
    assert notes == [f"the skill did not fit in k = 106,203 parameters: the region's held-out {score} is 3.0% against "
                     "the fine-tune's 100.0% (n = 100); try "
                     + {0.01: "a larger budget such as 10 % (ten times this one), ",
                        0.001: "a larger budget such as 1 % (ten times this one), ", 0.2: ""}[budget]
                     + "the budget-true method (--method budget-true), or a fine-tune with an ℓ1 penalty on the movement (finetune --optimizer "
                     "adamw --l1 1e-3)"]


@pytest.mark.unit
def test_a_phase_or_a_part_of_a_run_maps_its_progress_into_its_share_of_the_whole():
    from graftui.flows.common import part_progress, phase_progress

    events = []
    phase_progress(events.append, 0.9, 1.0, "held-out check")({"fraction": 0.5, "stage": "scoring FT"})
    phase_progress(events.append, 0.0, 0.9)({"step": 3, "steps": 6})
    phase_progress(events.append, 0.0, 0.9)({"stage": "loading"})  # says nothing of how far: no fraction
    part = part_progress(events.append, 1, 4, 7)
    part({"step": 5, "steps": 10, "stage": "mask learning"})
    part({"stage": "saving"})
    fractions = [e.get("fraction") for e in events]
    assert fractions[2] is None and fractions[:2] + fractions[3:] == pytest.approx([0.95, 0.45, 0.375, 0.25])
    assert [e.get("stage") for e in events] == ["held-out check: scoring FT", None, "loading",
                                               "seed 7 (2/4): mask learning", "seed 7 (2/4): saving"]
    assert events[3]["seed"] == 7 and phase_progress(None, 0, 1) is None and part_progress(None, 0, 2, 0) is None
