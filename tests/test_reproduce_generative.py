"""``graftui reproduce --section generative``: the paper's Fig. 5 on the completion skills, planned and reported.

The plan is read as requests (no model runs here); the report is built from hand-made step results whose
numbers are known, so every cell, pairing and the finding can be checked exactly.
"""

from __future__ import annotations

import json

import pytest

from graftui.errors import RequestError
from graftui.flows import reproduction as rep
from graftui.flows import reproduction_report as report_of
from graftui.requests import FinetuneRequest, ReproduceRequest, SweepRequest

pytestmark = pytest.mark.unit


def quick(monkeypatch):
    monkeypatch.delenv("GRAFTUI_FAST", raising=False)
    return rep.scale_of(ReproduceRequest(quick=True, section="generative"))


def test_the_plan_fine_tunes_every_skill_with_every_recipe_and_sweeps_each(monkeypatch):
    study, steps = rep.generative_plan(quick(monkeypatch), None)
    assert study.skills == ("dates", "numbers")
    assert [s.name for s in steps[:4]] == ["finetune-dates-adamw-lr0.0001", "sweep-dates-adamw-lr0.0001",
                                           "finetune-numbers-adamw-lr0.0001", "sweep-numbers-adamw-lr0.0001"]
    assert len(steps) == 2 * len(study.skills) * len(study.recipes)
    results = {}
    for step in steps:
        request = step.make(results)
        if step.name.startswith("finetune-"):
            assert isinstance(request, FinetuneRequest) and request.base == "smollm2"
            results[step.name] = {"out": f"/ckpt/{step.name}"}
        else:
            assert isinstance(request, SweepRequest)
            assert request.finetuned == f"/ckpt/finetune-{step.name[len('sweep-'):]}"
            assert request.methods == ["learned", "budget-true", "top-movement", "random"]
            assert request.sparsities == [1e-4, 1e-3, 1e-2] and request.n == 100 and request.seeds is None
    l1 = steps[[s.name for s in steps].index("finetune-dates-adamw-lr0.0001-l10.001")].make(results)
    assert (l1.optimizer, l1.lr, l1.l1, l1.epochs, l1.train_examples) == ("adamw", 1e-4, 1e-3, 1, 640)
    sgd = next(s for s in steps if s.name.startswith("finetune-dates-sgd")).make(results)
    assert sgd.optimizer == "sgd" and sgd.l1 == 0
    seeded, _ = rep.generative_plan(quick(monkeypatch), 3)
    assert seeded.seeds == 3 and steps[1].make(results).seeds is None
    assert rep.generative_plan(quick(monkeypatch), 3)[1][1].make(results).seeds == [0, 1, 2]


def sweep(ft: float, cells: dict, loss: float = 0.5) -> dict:
    """A saved sweep step: ``cells`` maps (method, sparsity) to exact match; each pair of methods differs by theirs."""
    rows = [{"method": m, "sparsity": x, "k": round(x * 1e6), "n": 100, "exact_match": v, "accuracy": v, "loss": loss,
             "retained": v / ft} for (m, x), v in cells.items()]
    found = [{"a": a, "b": b, "sparsity": x, "metric": "exact_match", "diff": va - vb, "ci": [va - vb - 0.05, va - vb + 0.05],
              "n": 100} for (a, x), va in cells.items() for (b, y), vb in cells.items() if x == y and a < b]
    found.append({"a": "learned", "b": "fine-tuned", "sparsity": 1e-3, "metric": "exact_match", "diff": -0.1,
                  "ci": [-0.2, 0.0], "n": 100})  # a model that is no method is not among the report's pairs
    return {"ft_accuracy": ft, "body_accuracy": 0.0, "rows": rows, "differences": found, "notes": []}


def test_the_report_gives_every_cell_the_pairs_and_the_best_region_at_the_budget(monkeypatch, tmp_path):
    study, _ = rep.generative_plan(quick(monkeypatch), None)
    study = rep.replace(study, skills=("dates",), recipes=study.recipes[:3], sparsities=(1e-3,),
                        methods=("learned", "top-movement"))
    adamw, l1, sgd = study.recipes
    R = {f"finetune-dates-{adamw.key}": {"out": "/a"}, f"finetune-dates-{l1.key}": {"out": "/b"},
         f"sweep-dates-{adamw.key}": sweep(1.0, {("learned", 1e-3): 0.03, ("top-movement", 1e-3): 0.0}),
         f"sweep-dates-{l1.key}": sweep(0.98, {("learned", 1e-3): 0.96, ("top-movement", 1e-3): 0.9}),
         f"finetune-dates-{sgd.key}": {"out": "/c"},  # the SGD fine-tune did not learn the skill: it cannot win
         f"sweep-dates-{sgd.key}": sweep(0.4, {("learned", 1e-3): 0.4, ("top-movement", 1e-3): 0.4})}
    log = [{"step": name, "title": name, "command": f"graftui {name}", "seconds": 60.0, "reused": False}
           for name in R]
    report = report_of.build_generative_report("quick", study, R, log, 360.0)
    recipes = report["skills"][0]["recipes"]
    assert [r["label"] for r in recipes] == ["AdamW", "AdamW + ℓ1 1e-3", "SGD"]
    assert [len(r["differences"]) for r in recipes] == [1, 1, 1]  # learned − top-movement; not − fine-tuned
    best = report["finding"]["best"]["dates"]
    assert (best["recipe"], best["method"], best["exact_match"]) == ("AdamW + ℓ1 1e-3", "learned", 0.96)
    assert best["retained"] == pytest.approx(0.96 / 0.98) and best["meets_target"]
    report_of.write_report(tmp_path, report)
    text = (tmp_path / "report.md").read_text()
    assert "| **AdamW + ℓ1 1e-3** | fine-tuned | **0.980** |" in text
    assert "|  | learned | 0.960 (0.50) |" in text and "|  | top-movement | 0.000 (0.50) |" in text
    assert "learned after AdamW + ℓ1 1e-3, exact match 0.960 of the fine-tune's 0.980 (98 %); the target of 80 % " \
           "is met" in text
    assert json.loads((tmp_path / "report.json").read_text())["finding"] == report["finding"]
    partial = report_of.build_generative_report("quick", study, {k: v for k, v in R.items() if "sgd" not in k},
                                                log[:4], 240.0)  # the steps saved so far
    assert [r["label"] for r in partial["skills"][0]["recipes"]] == ["AdamW", "AdamW + ℓ1 1e-3"]


def test_a_generative_run_and_a_paper_run_never_share_a_folder(tmp_path, monkeypatch):
    import graftui

    monkeypatch.delenv("GRAFTUI_FAST", raising=False)
    assert rep.run_name(ReproduceRequest(section="generative", quick=True)) == "generative-quick"
    assert rep.default_out(ReproduceRequest(section="generative")).name == "reproduce-generative-full"
    (tmp_path / "reproduce.json").write_text('{"mode": "quick"}')
    with pytest.raises(RequestError, match="holds a quick reproduce run, not a generative-quick one"):
        graftui.reproduce(out=str(tmp_path), quick=True, section="generative")
    with pytest.raises(RequestError, match="unknown section .poems.; choose from paper, generative"):
        ReproduceRequest(section="poems").validate()


def test_the_command_line_says_each_recipe_and_the_finding(monkeypatch):
    from graftui.flows import text

    study, _ = rep.generative_plan(quick(monkeypatch), None)
    study = rep.replace(study, skills=("dates",), recipes=study.recipes[:1], sparsities=(1e-3,),
                        methods=("learned", "top-movement"))
    key = study.recipes[0].key
    R = {f"finetune-dates-{key}": {"out": "/a"},
         f"sweep-dates-{key}": sweep(1.0, {("learned", 1e-3): 0.9, ("top-movement", 1e-3): 0.25})}
    log = [{"step": n, "title": n, "command": "graftui x", "seconds": 1.0, "reused": True} for n in R]
    report = report_of.build_generative_report("quick", study, R, log, 2.0)
    said = text.reproduce({"report": report, "out": "/r", "reused": list(R), "seconds": 60.0})
    assert "dates, AdamW" in said and "FT 1.000; learned 0.900; top-movement 0.250" in said
    assert "learned after AdamW: 0.900 of FT's 1.000 (90.0%; target 80.0% met)" in said


def test_a_pair_the_sweep_made_the_other_way_round_is_reported_turned_round():
    found = [{"a": "learned", "b": "budget-true", "sparsity": 1e-2, "metric": "exact_match", "diff": 0.47,
              "ci": [0.38, 0.56], "n": 100}]
    d = report_of._pair(found, "budget-true", "learned", 1e-2)
    assert (d["a"], d["b"], d["diff"], d["ci"]) == ("budget-true", "learned", -0.47, [-0.56, -0.38])
    assert report_of._pair(found, "learned", "budget-true", 1e-2) is found[0]
    assert report_of._pair(found, "learned", "budget-true", 1e-3) is None
