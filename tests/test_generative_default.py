"""The offline generative default end to end on the real SmolLM2-135M-Instruct: its two skills built on first use,
each localized on the completion loss, evaluated by generation beside its baselines, laid out by layer, the two stitched
against task arithmetic, and the stitched patch exported as a checkpoint that generates what the stitched graft
generated. GRAFTUI_FAST keeps it to minutes: a 4-step fine-tune per skill (docs/tasks.md reports the full recipe)."""

from __future__ import annotations

import pytest

import graftui
from graftui import flows, settings
from graftui.tasks.completion import generation
from graftui.tasks.completion.data import offline_skill
from graftui.models import load_lm, load_tokenizer

pytestmark = pytest.mark.e2e

N = 6  # test examples per reading: the flows, not the figures, are under test here
NEW = 10  # the skills' answers are a few words


@pytest.fixture(scope="module")
def skills(tmp_path_factory):
    root = tmp_path_factory.mktemp("skills")
    shared = settings.shared("checkpoints")  # the session's: every test home links this folder
    (root / "home").mkdir()
    (root / "home" / "models").symlink_to(settings.shared("models"), target_is_directory=True)  # SmolLM2, made once
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(root / "home"))
        mp.setenv("GRAFTUI_FAST", "1")
        flows.clear_cache()
        made = {}
        for skill in ("dates", "numbers"):
            out = root / f"{skill}.safetensors"
            stages = []
            made[skill] = graftui.localize(base="smollm2", finetuned=f"smollm2-{skill}", task=skill, sparsity=1e-2, steps=3, check_n=N,
                                           max_new_tokens=NEW, out=str(out), progress=stages.append)
            made[f"{skill} stages"] = [s.get("stage", "") for s in stages if isinstance(s, dict)]
        _share_checkpoints(root / "home" / "checkpoints", shared)
        yield root, made
        flows.clear_cache()


def _share_checkpoints(built, shared):
    """The skills built here on first use join the session's ``shared`` checkpoints (moved there, linked back), so no
    later test builds them again."""
    for folder in built.iterdir():
        if not folder.is_symlink() and not (shared / folder.name).exists():
            folder.rename(shared / folder.name)
            folder.symlink_to(shared / folder.name, target_is_directory=True)


def test_each_skill_is_built_on_first_use_and_localized_on_its_completion_loss(skills):
    root, made = skills
    for skill in ("dates", "numbers"):
        loc = made[skill]
        assert any("building the default fine-tuned model" in s for s in made[f"{skill} stages"])
        meta = loc.record.meta
        assert (meta.base, meta.task, meta.loading) == ("smollm2", skill, {"head": "completion"}) and loc.k > 0
        rows = {r["model"]: r for r in loc.check["rows"]}
        assert set(rows) == {"fine-tuned", "pre-trained, same prompt", "this region"}
        assert all(r["n"] == N for r in rows.values())
        # even four steps of fine-tuning lower the skill's loss; the region keeps part of that
        assert rows["fine-tuned"]["loss"] < rows["this region"]["loss"] < rows["pre-trained, same prompt"]["loss"]


def test_a_skill_region_is_evaluated_by_generation_beside_its_baselines_and_laid_out(skills):
    root, made = skills
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(root / "home"))
        ev = graftui.evaluate(regions=[made["dates"].path], baselines=True, n=N).as_dict()
        rows = {r["model"]: r for r in ev["rows"]}
        assert set(rows) == {"fine-tuned", "pre-trained, same prompt", "dates", "Top movement", "Random"}
        assert ev["judging"][0]["max_new_tokens"] == NEW  # the region's own length, unasked
        assert len(ev["generations"]) == N and all(g["reference"] for g in ev["generations"])
        assert {(d["a"], d["b"], d["metric"]) for d in ev["differences"]} >= {("dates", "fine-tuned", "exact_match"),
                                                                              ("dates", "Top movement", "loss")}
        anatomy = graftui.anatomy(region=made["dates"].path, by="layer").as_dict()  # (its ablation: tiny models)
        assert anatomy["k"] == made["dates"].k and {f"layer {i}" for i in range(30)} <= set(anatomy["layers"])  # 30 blocks
        assert 0 < sum(anatomy["by_layer"].values()) <= anatomy["k"]


def test_two_skills_are_stitched_against_task_arithmetic_and_the_export_generates_the_same(skills, tmp_path):
    root, made = skills
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(root / "home"))
        stitched = tmp_path / "stitched.safetensors"
        doc = graftui.compose(regions=[made["dates"].path, made["numbers"].path], stitch=True, n=N, validation_n=4,
                              lambdas=[0.5, 1.0], merges=["task-arithmetic"], out=str(stitched)).as_dict()
        arithmetic = f"task arithmetic (λ = {doc['stitch']['lambda']:g})"
        for skill, other in (("dates", "numbers"), ("numbers", "dates")):
            rows = {r["model"]: r for r in doc["rows"] if r["task"] == skill}
            assert {"stitched", "fine-tuned", arithmetic, f"fine-tuned for {other}"} <= set(rows)
            assert all(r["n"] == N for r in rows.values())
        exported = graftui.export(region=str(stitched), out=str(tmp_path / "export"))
        model, tok = load_lm(exported.out, "causal-lm"), load_tokenizer(exported.out)
        for skill in ("dates", "numbers"):
            shown = [g["stitched"] for g in doc["generations"] if g["task"] == skill]
            data = generation.sample(offline_skill(skill), "test", N, 0)
            assert shown and generation.generate(model, tok, data, False, max_new_tokens=NEW)[:len(shown)] == shown
