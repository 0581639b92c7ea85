"""The graftui command end to end on the real offline model and data (small subsets), and its errors.

One small fine-tune (through `graftui finetune`) and two regions are made once for the module;
most flows call `cli.main` in-process so the model pair cache is shared, and a few run the
installed console script to prove it works.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from graftui import __version__, cli, flows, regions
from graftui.config import DEFAULT_SPARSITY, Budget, default_checkpoint_dir, default_recipe as default_config

from conftest import MINILM_DIR, make_tiny_bert

pytestmark = pytest.mark.e2e

SCRIPT = Path(sys.executable).with_name("graftui")
# AdamW trains MiniLM on 256 movie sentences in one epoch; SGD at the paper's rate needs more steps.
FT_ARGS = ["--optimizer", "adamw", "--lr", "1e-4", "--epochs", "1", "--train-examples", "256", "--seed", "0"]
K = 3000


def run_cli(*args: str) -> tuple[int, str, str]:
    """cli.main in-process; returns (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def run_json(*args: str) -> dict:
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, (code, err)
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("graftui: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# -- fixtures (made once per module) ------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def home(tmp_path_factory):
    path = tmp_path_factory.mktemp("graftui_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(path))
        yield path
    flows.clear_cache()


@pytest.fixture(scope="module")
def ft_dir(tmp_path_factory):
    """A quick fine-tune of minilm on movies, made by the command itself."""
    out = tmp_path_factory.mktemp("ft") / "minilm-movies-small"
    doc = run_json("finetune", "--base", "minilm", "--task", "movies", *FT_ARGS, "--test-examples", "128",
                   "--out", out)
    assert doc["out"] == str(out) and not doc["reused"]
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    assert doc["test_examples"] == 128
    assert doc["test_accuracy"] > 0.6, doc  # it learned something the regions can carry
    return out


@pytest.fixture(scope="module")
def learned(ft_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("regions") / "learned.safetensors"
    doc = run_json("localize", "--finetuned", ft_dir, "--task", "movies", "--k", K, "--method", "learned",
                   "--steps", "3", "--examples-per-class", "8", "--out", path)
    return path, doc


@pytest.fixture(scope="module")
def top(ft_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("regions") / "top.safetensors"
    doc = run_json("localize", "--finetuned", ft_dir, "--k", K, "--method", "top-movement", "--out", path)
    return path, doc


def _params(folder) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def ft_params(ft_dir):
    return _params(ft_dir)


@pytest.fixture
def no_models(monkeypatch):
    """Fail loudly if a command loads a model: cheap checks must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr("graftui.training.load_classifier", refuse)  # first: imports training with the real one
    monkeypatch.setattr("graftui.models.ModelPair.load", refuse)
    monkeypatch.setattr("graftui.models.load_classifier", refuse)
    monkeypatch.setattr("graftui.training.ensure_default_finetuned", refuse)
    monkeypatch.setattr("graftui.training.finetune", refuse)


# -- console script -----------------------------------------------------------------------------
def test_console_script_help_and_version(home):
    env = {**os.environ, "GRAFTUI_HOME": str(home)}
    assert SCRIPT.exists(), f"console script missing at {SCRIPT}"
    done = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    for command in ("finetune", "localize", "evaluate", "anatomy", "compose", "export", "sweep", "methods", "tasks"):
        assert command in done.stdout
    done = subprocess.run([SCRIPT, "localize", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "--sparsity" in done.stdout and "--region-only" in done.stdout
    assert "learned" in done.stdout and "top-movement" in done.stdout  # --method choices come from the registry
    done = subprocess.run([SCRIPT, "--version"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"graftui {__version__}"


def test_console_script_error_is_one_line_and_exit_2(home):
    env = {**os.environ, "GRAFTUI_HOME": str(home)}
    done = subprocess.run([SCRIPT, "localize", "--sparsity", "1.5"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert_one_line_error(done.returncode, done.stdout, done.stderr, "sparsity", "1.5")
    assert not any((home / "checkpoints").glob("*")), "a bad budget must fail before any model is built"


# -- flows --------------------------------------------------------------------------------------
def test_listings():
    code, out, _ = run_cli("methods")
    assert code == 0
    for name in ("learned", "top-movement", "random"):
        assert name in out
    doc = run_json("methods")
    assert {m["name"] for m in doc["methods"]} >= {"learned", "top-movement", "random"}
    assert next(m for m in doc["methods"] if m["name"] == "learned")["needs_data"] is True
    doc = run_json("tasks")
    assert [t["name"] for t in doc["tasks"]][:3] == ["movies", "amazon", "tweets"]
    assert {(t["name"], t["kind"]) for t in doc["tasks"]} >= {("dates", "completion"), ("movies", "classification")}
    code, out, _ = run_cli("tasks")
    assert code == 0 and out.splitlines()[0].split() == ["task", "kind", "description"]


def test_finetune_default_folder_is_per_recipe_and_reused(ft_dir, home):
    config = dataclasses.replace(default_config(), optimizer="adamw", lr=1e-4, epochs=1, train_examples=256, seed=0)
    expected = default_checkpoint_dir("minilm-movies", config)
    assert expected.parent == home / "checkpoints"
    shutil.copytree(ft_dir, expected)  # as if built before: same recipe, same folder, nothing retrained
    code, out, err = run_cli("finetune", *FT_ARGS, "--test-examples", "32")
    assert code == 0, err
    assert str(expected) in out and "reused" in out and "test accuracy" in out
    assert "Held-out accuracy" in out and "chance (the most frequent class) is" in out
    shutil.rmtree(expected)


def test_localize_learned_writes_a_patch_of_exactly_k(learned, ft_dir):
    path, doc = learned
    assert path.exists() and doc["path"] == str(path)
    assert doc["kind"] == "patch" and doc["method"] == "learned"
    assert doc["k"] == K
    assert doc["fraction_of_graftable"] == pytest.approx(K / doc["graftable_params"])
    assert doc["fraction_of_all"] == pytest.approx(K / doc["total_params"])
    assert doc["graftable_params"] < doc["total_params"]
    assert len(doc["top_modules"]) == 3 and sum(t["count"] for t in doc["top_modules"]) <= K
    assert doc["weights"] + doc["biases"] == K
    record = regions.load(path)
    assert record.is_patch and record.size == K
    assert record.meta["method"] == "learned" and record.meta["learn"]["steps"] == 3
    assert record.meta["train_examples"] == 16
    curve = record.meta.curve  # the mask-learning curve, step by step, kept with the region
    assert [p[0] for p in curve] == [1, 2, 3] and all(p[1] > 0 and 0 <= p[2] <= 1 for p in curve), curve


def test_a_classification_region_takes_its_kinds_budget_where_the_request_names_none(ft_dir, tmp_path):
    path = tmp_path / "default.safetensors"
    code, out, err = run_cli("localize", "--finetuned", ft_dir, "--method", "top-movement", "--region-only",
                             "--out", str(path))
    assert code == 0, err
    record = regions.load(path)
    assert record.meta["sparsity"] == DEFAULT_SPARSITY and record.meta["request"]["sparsity"] is None
    assert record.size == Budget(sparsity=DEFAULT_SPARSITY).resolve(record.meta["graftable_params"])


def test_localize_default_out_region_only_and_sparsity(ft_dir, home):
    code, out, err = run_cli("localize", "--finetuned", ft_dir, "--method", "top-movement", "--sparsity", "1e-4",
                             "--region-only")
    assert code == 0, err
    files = list((home / "regions").glob("minilm-movies-small-top-movement-*.safetensors"))
    assert len(files) == 1  # named by the fine-tune it was learned in (which names the task), its method and size
    record = regions.load(files[0])
    assert not record.is_patch
    graftable = record.meta["graftable_params"]
    assert record.size == round(1e-4 * graftable)
    assert files[0].name.startswith(f"minilm-movies-small-top-movement-k{record.size}-")
    assert f"k = {record.size:,}" in out and "anatomy" in out and "% of" in out and "time" in out
    assert not out.lstrip().startswith("{")
    # the newest region is what anatomy and export use when no --region is given
    code, out, err = run_cli("anatomy", "--by", "module")
    assert code == 0, err
    assert str(files[0]) in out and f"k = {record.size:,}" in out
    files[0].unlink()


def moved_patch(path, folder):
    """A copy of a skill patch that names a fine-tuned model no longer on disk."""
    record = regions.load(path)
    record.meta["finetuned"] = str(folder / "deleted-checkpoint")
    return regions.save(record, folder / "learned.safetensors")


def test_evaluate_regions_with_baselines_in_and_out_of_distribution(ft_dir, learned, top, tmp_path):
    doc = run_json("evaluate", "--finetuned", ft_dir, "--region", learned[0], "--region", top[0],
                   "--ood", "amazon", "--n", "64", "--baselines")
    rows = {(r["model"], r["task"]): r for r in doc["rows"]}
    models = ["fine-tuned", "pre-trained body + FT head", "learned", "top", "Top movement", "Random"]
    assert set(rows) == {(m, t) for m in models for t in ("movies", "amazon")}
    for (model, task), r in rows.items():
        assert r["n"] == 64
        assert r["distribution"] == ("in" if task == "movies" else "OOD")
        assert 0 <= r["accuracy"] <= 1 and 0 <= r["ece"] <= 1 and 0 <= r["f1"] <= 1
    assert rows[("fine-tuned", "movies")]["agreement_with_ft"] == 1.0
    assert rows[("learned", "movies")]["region_size"] == K == rows[("Random", "movies")]["region_size"]
    # top-movement at the same k is the same region as the file written by `localize --method top-movement`
    assert rows[("Top movement", "amazon")]["accuracy"] == rows[("top", "amazon")]["accuracy"]
    assert "reliability" in doc and set(doc["reliability"]) >= {"learned", "fine-tuned"}
    # the result card's readings, on every graft row, for scripts to rely on
    for (model, task), r in rows.items():
        lo, hi = r["accuracy_ci"]
        assert lo <= r["accuracy"] <= hi and hi - lo > 0.05  # 64 examples: a wide interval
        if model not in ("fine-tuned", "pre-trained body + FT head"):
            ft, bare = rows[("fine-tuned", task)]["accuracy"], rows[("pre-trained body + FT head", task)]["accuracy"]
            assert r["gain_recovered"] == (pytest.approx((r["accuracy"] - bare) / (ft - bare)) if ft > bare else None)
            assert r["ft_kept"] == pytest.approx(r["accuracy"] / ft)
    learned_row = rows[("learned", "movies")]
    assert learned_row["vs_random"] == pytest.approx(learned_row["accuracy"] - rows[("Random", "movies")]["accuracy"])
    assert rows[("Random", "movies")]["vs_random"] is None and rows[("Random", "movies")]["method"] == "random"
    # every difference with a paired interval on the same examples: each graft − FT and − the bare body, each
    # region − the baselines of its size, and region − region
    paired = {(d["a"], d["b"], d["task"], d["metric"]): d for d in doc["differences"]}
    for (a, b, task, metric), d in paired.items():
        assert d["ci"][0] <= d["diff"] <= d["ci"][1] and d["n"] == 64
        if metric == "accuracy":
            assert d["diff"] == pytest.approx(rows[(a, task)]["accuracy"] - rows[(b, task)]["accuracy"])
            assert 0 < d["p"] <= 1
        else:
            assert d["diff"] == pytest.approx(rows[(a, task)]["ece"] - rows[(b, task)]["ece"]) and d["p"] is None
    grafts = ["learned", "top", "Top movement", "Random"]
    assert {k[:2] for k in paired} == {*((g, "fine-tuned") for g in grafts),
                                       *((g, "pre-trained body + FT head") for g in grafts),
                                       *((r, b) for r in ("learned", "top") for b in ("Top movement", "Random")),
                                       ("learned", "top")}
    learned_vs_top = paired[("learned", "top", "movies", "accuracy")]
    assert learned_vs_top["diff"] == pytest.approx(rows[("learned", "movies")]["accuracy"] -
                                                   rows[("top", "movies")]["accuracy"])
    same = paired[("top", "Top movement", "movies", "accuracy")]  # the same region twice: no difference at all
    assert same["diff"] == 0 and same["ci"] == [0.0, 0.0] and same["p"] == 1.0
    assert any("keeps" in line and "'learned'" in line and re.search(r"pts \[[^]]+\] against a random region", line)
               for line in doc["card"])
    # two runs side by side: their overlap (as compose computes it) and where each lies
    side = doc["side_by_side"]
    composed = run_json("compose", "--region", learned[0], "--region", top[0])
    assert side["names"] == ["learned", "top"] and side["overlap"] == composed["overlap"]
    for name in side["names"]:
        assert sum(side["module_share"][name]) == pytest.approx(1.0) and sum(side["layer_share"][name]) == pytest.approx(1.0)
    assert "steps" in side["settings"]["learned"] and side["settings"]["top"].endswith(f"k={K:,}")
    assert side["settings"]["learned"].endswith("seed 0 · candidate learner c=5")  # the learner beside the seed
    assert learned[1]["plan"].startswith("mask learning: candidate learner, C = ")  # said under --json too

    # with no --finetuned the region's own pair and task are used
    own = run_json("evaluate", "--region", learned[0], "--no-ood", "--n", "64")
    assert own["finetuned"] == str(ft_dir) and own["task"] == "movies" and not own["notes"]
    assert {r["model"]: r["accuracy"] for r in own["rows"]}["learned"] == rows[("learned", "movies")]["accuracy"]

    # a skill patch whose fine-tuned model is gone: the graft rebuilt from base + patch is the same model
    patch_doc = run_json("evaluate", "--region", moved_patch(learned[0], tmp_path), "--no-ood", "--n", "64")
    prow = {r["model"]: r for r in patch_doc["rows"]}
    assert set(prow) == {"fine-tuned (from patch)", "pre-trained body + FT head", "learned"}
    assert prow["learned"]["accuracy"] == rows[("learned", "movies")]["accuracy"]
    assert prow["learned"]["ece"] == pytest.approx(rows[("learned", "movies")]["ece"], abs=1e-6)
    assert prow["pre-trained body + FT head"]["accuracy"] == rows[("pre-trained body + FT head", "movies")]["accuracy"]
    assert patch_doc["notes"] and "--finetuned" in patch_doc["notes"][0]

    code, out, err = run_cli("evaluate", "--finetuned", ft_dir, "--region", learned[0], "--ood", "tweets", "--n", "16")
    assert code == 0, err
    header = out.splitlines()[0].split()
    assert header[:3] == ["model", "task", "dist"] and "accuracy" in header and "ECE" in header
    assert "paired differences a − b" in out and re.search(r"learned +fine-tuned +tweets +accuracy +16 ", out)
    table_lines = out.split("\n\n")[0].splitlines()  # the card's sentences follow the table
    assert len([line for line in table_lines if " movies " in line or " tweets " in line]) == 6
    for word in ("OOD", "learned", "3,000", "pre-trained body + FT head"):
        assert word in out


def test_evaluate_baselines_need_the_finetuned_model_with_a_patch(learned, no_models, tmp_path):
    assert_one_line_error(*run_cli("evaluate", "--region", moved_patch(learned[0], tmp_path), "--baselines"), "--finetuned")


def test_anatomy_counts_add_up(learned):
    path, _ = learned
    doc = run_json("anatomy", "--region", path)
    assert doc["k"] == K and doc["kind"] == "patch"
    assert sum(sum(row) for row in doc["counts"]) == K
    assert sum(doc["by_module"].values()) == K == sum(doc["by_layer"].values())
    assert doc["weights"]["count"] + doc["biases"]["count"] == K
    assert doc["weights"]["total"] + doc["biases"]["total"] == doc["graftable_params"]
    assert all(0 <= c["density"] <= 1 and c["count"] <= c["total"] for c in doc["cells"])
    assert [f"layer {i}" for i in range(6)] == doc["layers"][:6]
    code, out, _ = run_cli("anatomy", "--region", path)
    assert code == 0 and "FFN in" in out and "density" in out and "biases" in out
    assert [line.split()[:2] for line in out.splitlines() if re.match(r"layer \d", line)] == [
        ["layer", str(i)] for i in range(6)
    ]
    code, out, _ = run_cli("anatomy", "--region", path, "--by", "layer")
    assert code == 0 and "layer 5" in out and "share of region" in out
    code, out, _ = run_cli("anatomy", "--region", path, "--by", "module")
    assert code == 0 and "Query" in out and "FFN out" in out


def test_compose_overlap_and_union_patch(learned, top, ft_params, tmp_path):
    a, b = regions.load(learned[0]), regions.load(top[0])
    shared = sum(int(torch.isin(a.indices[n], b.indices[n]).sum()) for n in a.indices if n in b.indices)
    doc = run_json("compose", "--region", learned[0], "--region", top[0])
    assert doc["sizes"] == [K, K] and doc["names"] == ["learned", "top"]
    assert doc["intersection_counts"][0][1] == shared
    assert doc["overlap"][0][1] == pytest.approx(shared / K) and doc["overlap"][0][0] == 1.0
    assert doc["iou"][0][1] == pytest.approx(shared / (2 * K - shared))
    assert doc["union_size"] == 2 * K - shared
    assert 0 < shared <= K  # learning starts from the top-movement region

    out = tmp_path / "union.safetensors"
    code, text, err = run_cli("compose", "--region", learned[0], "--region", top[0], "--out", out,
                              "--resolve", "first")
    assert code == 0, err
    assert "IoU" in text and f"union: {2 * K - shared:,}" in text and "skill patch" in text
    chance = K / doc["graftable_params"]
    assert doc["chance_overlap"][0][1] == pytest.approx(chance)
    assert f"would share {100 * chance:.3f} %" in text  # the card: overlap against what chance gives
    union = regions.load(out)
    assert union.is_patch and union.size == 2 * K - shared and union.meta["method"] == "union"
    for name, idx in union.indices.items():
        assert torch.equal(union.values[name], ft_params[name].reshape(-1)[idx])
        want = torch.unique(torch.cat([r.indices[name] for r in (a, b) if name in r.indices]))
        assert torch.equal(idx, want)
    assert set(union.head) == {"classifier.weight", "classifier.bias"}

    # a region without values in the mix: the union is a region file
    region_only = tmp_path / "top-region.safetensors"
    regions.save(regions.RegionRecord(b.indices, b.shapes, b.meta), region_only)
    out2 = tmp_path / "union2.safetensors"
    code, text, err = run_cli("compose", "--region", learned[0], "--region", region_only, "--out", out2)
    assert code == 0, err
    union2 = regions.load(out2)
    assert not union2.is_patch and union2.size == union.size


def test_export_from_a_patch_is_the_graft(learned, ft_params, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path / "grafted"
    code, text, err = run_cli("export", "--region", learned[0], "--out", out)
    assert code == 0, err
    assert str(out) in text and "from_pretrained" in text
    model = AutoModelForSequenceClassification.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    record = regions.load(learned[0])
    ft = ft_params
    base = _params(MINILM_DIR)
    changed = 0
    for name, param in model.named_parameters():
        value = param.detach()
        if name in ("classifier.weight", "classifier.bias"):
            assert torch.equal(value, ft[name]), name
            continue
        pre = base[name]
        expected = pre.clone().reshape(-1)
        if name in record.indices:
            expected[record.indices[name]] = ft[name].reshape(-1)[record.indices[name]]
            changed += int((expected != pre.reshape(-1)).sum())
        assert torch.equal(value.reshape(-1), expected), name
    assert changed > 0
    meta = json.loads((out / "graftui_region.json").read_text())
    assert meta["size"] == K and meta["method"] == "learned"


def test_export_with_finetuned_matches_export_from_patch(learned, ft_dir, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli("export", "--region", learned[0], "--out", a)[0] == 0
    doc = run_json("export", "--region", learned[0], "--finetuned", ft_dir, "--out", b)
    assert doc["k"] == K and doc["out"] == str(b)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)


def test_sweep_table(ft_dir):
    doc = run_json("sweep", "--finetuned", ft_dir, "--methods", "top-movement,random", "--sparsities", "1e-2,1e-3",
                   "--n", "32")
    assert sorted(doc["request"]["sparsities"]) == [1e-3, 1e-2]
    assert [(r["method"], r["sparsity"]) for r in doc["rows"]] == [
        ("top-movement", 1e-3), ("random", 1e-3), ("top-movement", 1e-2), ("random", 1e-2)]
    ks = {r["sparsity"]: r["k"] for r in doc["rows"]}
    assert ks[1e-2] == pytest.approx(10 * ks[1e-3], abs=10)
    assert all(0 <= r["accuracy"] <= 1 and r["ft_accuracy"] == doc["ft_accuracy"] for r in doc["rows"])
    for r in doc["rows"]:
        assert r["accuracy_ci"][0] <= r["accuracy"] <= r["accuracy_ci"][1] and r["n"] == 32
        gap = doc["ft_accuracy"] - doc["body_accuracy"]
        assert r["gain_recovered"] == (pytest.approx((r["accuracy"] - doc["body_accuracy"]) / gap) if gap > 0 else None)
    assert any(line.startswith("top-movement:") for line in doc["card"])
    by = {(r["method"], r["sparsity"]): r for r in doc["rows"]}
    paired = {(d["a"], d["b"], d["sparsity"], d["metric"]): d for d in doc["differences"]}
    assert set(paired) == {(a, b, s, m) for s in (1e-3, 1e-2) for m in ("accuracy", "ece")
                           for a, b in (("top-movement", "fine-tuned"), ("random", "fine-tuned"),
                                        ("top-movement", "random"))}
    for s in (1e-3, 1e-2):
        d = paired[("top-movement", "random", s, "accuracy")]
        assert d["diff"] == pytest.approx(by[("top-movement", s)]["accuracy"] - by[("random", s)]["accuracy"])
        assert d["ci"][0] <= d["diff"] <= d["ci"][1] and d["n"] == 32
        assert paired[("random", "fine-tuned", s, "ece")]["diff"] == pytest.approx(by[("random", s)]["ece"]
                                                                                 - doc["ft_ece"])
    assert all(r["region"] is None for r in doc["rows"])  # nothing kept unless asked
    code, out, err = run_cli("sweep", "--finetuned", ft_dir, "--methods", "top-movement", "--sparsities", "1e-3",
                             "--n", "8")
    assert code == 0, err
    assert out.splitlines()[0].split() == ["sparsity", "k", "top-movement"] and "fine-tuned" in out


def test_sweep_keeps_its_regions_as_files_that_score_and_rerun_alike(ft_dir, tmp_path):
    kept = tmp_path / "kept"
    doc = run_json("sweep", "--finetuned", ft_dir, "--methods", "top-movement", "--sparsities", "1e-3", "--n", "16",
                   "--no-ood", "--keep", kept)
    (row,) = doc["rows"]
    path = Path(row["region"])
    assert path.parent == kept and path.suffix == ".safetensors"
    record = regions.load(path)
    assert record.size == row["k"] and record.meta["method"] == "top-movement" and record.is_patch
    again = run_json("evaluate", "--finetuned", ft_dir, "--region", path, "--n", "16", "--no-ood")
    assert [r["accuracy"] for r in again["rows"] if r.get("method") == "top-movement"] == [row["accuracy"]]
    rerun = run_json("run", path, "--out", tmp_path / "again.safetensors")
    assert regions.digest(regions.load(rerun["path"]).indices) == regions.digest(record.indices)
    (tmp_path / "afile").write_text("x")
    code, _, err = run_cli("sweep", "--finetuned", ft_dir, "--keep", tmp_path / "afile")
    assert code == 2 and "--keep" in err and "Traceback" not in err


def test_report_bundle_holds_request_tables_figures_and_readme(learned, top, ft_dir, tmp_path):
    import zipfile

    out = tmp_path / "cmp.zip"
    code, text, err = run_cli("evaluate", "--finetuned", ft_dir, "--region", learned[0], "--region", top[0], "--ood",
                              "amazon", "--n", "32", "--baselines", "--report", out)
    assert code == 0, err
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        assert {"cmp/README.md", "cmp/request.json", "cmp/result.json", "cmp/tables/rows.csv", "cmp/tables/rows.json",
                "cmp/figures/reliability.html", "cmp/figures/confidence.html", "cmp/figures/plotly.min.js",
                "cmp/figures/side_by_side.html", "cmp/tables/side_by_side_modules.csv"} <= names
        request = json.loads(zf.read("cmp/request.json"))
        result = json.loads(zf.read("cmp/result.json"))
        rows = zf.read("cmp/tables/rows.csv").decode().splitlines()
        readme = zf.read("cmp/README.md").decode()
    assert request["verb"] == "evaluate" and request["n"] == 32
    assert request["regions"] == [f"inputs/{Path(learned[0]).name}", f"inputs/{Path(top[0]).name}"]  # in the bundle
    assert {f"cmp/{name}" for name in request["regions"]} <= names
    header = rows[0].split(",")
    assert {"accuracy_ci_lo", "accuracy_ci_hi", "gain_recovered"} <= set(header) and len(rows) == 1 + len(result["rows"])
    for path in (learned[0], top[0]):
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() in readme
    assert result["card"][0] in readme and "graftui run request.json" in readme
    # the bundle's request makes the same result again
    again = flows.run(flows.read_request(_unzipped(out, tmp_path) / "cmp" / "request.json"))
    assert [r["accuracy"] for r in again.as_dict()["rows"]] == [r["accuracy"] for r in result["rows"]]


def test_a_localizations_report_bundle_holds_its_region_check_and_mask_curve(ft_dir, tmp_path):
    """What a localize run made is in its bundle: the region file it wrote, the held-out check and the curve of mask
    learning as tables, the curve as a figure; the README lists only the folders the bundle has."""
    import zipfile

    code, _, err = run_cli("localize", "--finetuned", ft_dir, "--task", "movies", "--k", K, "--method", "learned",
                           "--steps", "3", "--examples-per-class", "8", "--check-n", "16",
                           "--out", tmp_path / "r.safetensors", "--report", tmp_path / "loc.zip")
    assert code == 0, err
    with zipfile.ZipFile(tmp_path / "loc.zip") as zf:
        names = set(zf.namelist())
        assert zf.read("loc/outputs/r.safetensors") == (tmp_path / "r.safetensors").read_bytes()
        curve = list(csv.DictReader(io.StringIO(zf.read("loc/tables/mask_curve.csv").decode())))
        check = list(csv.DictReader(io.StringIO(zf.read("loc/tables/heldout_check.csv").decode())))
        readme = zf.read("loc/README.md").decode()
    assert {"loc/figures/mask_curve.html", "loc/tables/top_modules.csv"} <= names
    assert [int(r["step"]) for r in curve] == [1, 2, 3] and {r["model"] for r in check} >= {"fine-tuned", "this region"}
    assert "`outputs/`" in readme and "`inputs/`" not in readme  # it read no region file


REPORTED = {  # every verb cheap enough here, with what it needs
    "localize": lambda ft, regions_, tmp: ["--finetuned", ft, "--k", K, "--method", "top-movement", "--check-n", "16",
                                           "--out", tmp / "r.safetensors", "--overwrite"],
    "evaluate": lambda ft, regions_, tmp: ["--finetuned", ft, "--region", regions_[0], "--n", "16"],
    "predict": lambda ft, regions_, tmp: ["--finetuned", ft, "--region", regions_[0], "--text", "a fine film"],
    "pair": lambda ft, regions_, tmp: ["--finetuned", ft],
    "anatomy": lambda ft, regions_, tmp: ["--region", regions_[0]],
    "compose": lambda ft, regions_, tmp: ["--region", *regions_, "--out", tmp / "u.safetensors", "--overwrite"],
    "runs": lambda ft, regions_, tmp: [],
}


@pytest.mark.parametrize("verb", sorted(REPORTED))
@pytest.mark.parametrize("suffix", [".zip", ".json"])
def test_every_verbs_report_is_a_report_bundle_or_json_that_opens(verb, suffix, learned, top, ft_dir, tmp_path):
    """``--report`` writes the verb's report (a localize result's own ``save`` writes its region, never here)."""
    import zipfile

    out = tmp_path / f"{verb}{suffix}"
    code, _, err = run_cli(verb, *REPORTED[verb](ft_dir, [learned[0], top[0]], tmp_path), "--report", out)
    assert code == 0, err
    if suffix == ".zip":
        with zipfile.ZipFile(out) as zf:
            names = set(zf.namelist())
            request = json.loads(zf.read(f"{verb}/request.json"))
            result = json.loads(zf.read(f"{verb}/result.json"))
        assert {f"{verb}/README.md", f"{verb}/request.json", f"{verb}/result.json"} <= names
        own = {"compose": "figures/overlap.html"}.get(verb)  # a figure only this verb draws, registered with it
        assert own is None or f"{verb}/{own}" in names, names
    else:
        doc = json.loads(out.read_text())
        request, result = doc["request"], doc["result"]
        assert flows.read_request(out).verb == verb  # 'graftui run FILE' reads it back
    assert request["verb"] == verb and result["request"]["verb"] == verb


def test_no_result_writes_its_report_another_way():
    from graftui.flows.common import Result

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    assert [c.__name__ for c in subclasses(Result) if c.write_report is not Result.write_report] == []


def _unzipped(archive, folder):
    import zipfile

    with zipfile.ZipFile(archive) as zf:
        zf.extractall(folder / "unzipped")
    return folder / "unzipped"


def test_push_builds_card_files_and_commit_without_storing_the_token(learned, ft_dir, tmp_path, monkeypatch):
    import huggingface_hub

    calls = {}
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_for_the_test")
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo",
                        lambda self, repo_id, **kw: calls.setdefault("repo", (repo_id, kw)))

    def create_commit(self, repo_id, operations, **kw):
        calls["commit"] = (repo_id, [(op.path_in_repo, Path(op.path_or_fileobj).read_bytes()) for op in operations], kw)
        return huggingface_hub.CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/abc", commit_message="m",
                                          commit_description="", oid="abc")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", create_commit)
    doc = run_json("push", "--repo", "someone/movies-skill", "--region", learned[0], "--finetuned", ft_dir, "--n", "16")
    assert calls["repo"] == ("someone/movies-skill", {"private": False, "exist_ok": True})
    repo, files, kw = calls["commit"]
    files = dict(files)
    assert repo == "someone/movies-skill" and set(files) == {"README.md", "request.json", "skill_patch.safetensors"}
    assert files["skill_patch.safetensors"] == Path(learned[0]).read_bytes()
    card = files["README.md"].decode()
    record = regions.load(learned[0])
    assert card.startswith("---\n") and "graftui" in card.split("---")[1]  # YAML metadata first
    for needle in (f"k = {K:,}", "fine-tuned model", "| task | `movies` |", "graftui run request.json", "## Metrics",
                   "| fine-tuned | movies | 16 |"):
        assert needle in card, needle
    assert json.loads(files["request.json"]) == record.meta["request"]
    assert all(b"hf_secret_token_for_the_test" not in body for body in files.values())
    assert doc["url"].endswith("/commit/abc")

    # --out writes the same files and stops before the network
    calls.clear()
    out = tmp_path / "staged"
    code, text, err = run_cli("push", "--repo", "someone/movies-skill", "--region", learned[0], "--n", "0", "--out", out)
    assert code == 0, err
    assert not calls
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "request.json", "skill_patch.safetensors"]
    assert "## Metrics" not in (out / "README.md").read_text() and "nothing was pushed" in text
    assert_one_line_error(*run_cli("push", "--repo", "not a repo", "--region", learned[0]), "--repo", "owner/name")


def test_a_hosted_server_never_pushes_with_its_own_token(learned, monkeypatch):
    from graftui import settings
    from graftui.flows import hub
    from graftui.errors import RequestError
    from graftui.requests import PushRequest

    monkeypatch.setattr(settings, "hosted", lambda: True)
    monkeypatch.setenv("HF_TOKEN", "hf_the_servers_own")
    with pytest.raises(RequestError, match=f"^{hub.SIGN_IN}$"):  # only with the visitor's sign-in (tests/test_push.py)
        hub.push(PushRequest(repo="someone/x", region=str(learned[0])))


# -- bad input: exit 2, one line naming the problem, no traceback, no model loaded -----------------
@pytest.fixture
def bad_files(tmp_path):
    csv = tmp_path / "reviews.csv"
    csv.write_text("text,label\ngreat film,1\nawful film,0\nfine,1\nbad,0\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x00\x01 not a safetensors file at all" * 10)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    return {"csv": csv, "empty": empty, "corrupt": corrupt, "full": full, "missing": tmp_path / "nope.safetensors"}


@pytest.mark.parametrize(
    "args, needles",
    [
        (["localize", "--sparsity", "0"], ["sparsity", "0"]),
        (["localize", "--sparsity", "1.5"], ["sparsity", "1.5"]),
        (["localize", "--sparsity", "-0.01"], ["sparsity", "-0.01"]),
        (["localize", "--k", "0"], ["--k", "0"]),
        (["sweep", "--sparsities", "1e-3,2"], ["sparsity", "2"]),
        (["sweep", "--sparsities", "1e-3,abc"], ["abc"]),
        (["localize", "--method", "nope"], ["nope", "learned"]),
        (["sweep", "--methods", "learned,nope"], ["nope"]),
        (["localize", "--finetuned", "./no-such-model"], ["no-such-model"]),
        (["localize", "--base", "/no/such/base"], ["/no/such/base"]),
        (["localize", "--task", "{csv}", "--text-column", "body"], ["body", "text_column"]),
        (["localize", "--task", "{csv}", "--label-column", "stars"], ["stars"]),
        (["localize", "--task", "movies", "--text-column", "body"], ["body"]),
        (["localize", "--task", "{empty}"], ["empty.csv", "empty"]),
        (["localize", "--task", "moviez"], ["moviez", "movies"]),
        (["localize", "--modules", "query,attention"], ["attention"]),
        (["localize", "--examples-per-class", "100000"], ["100000"]),
        (["localize", "--memory", "tiny"], ["--memory", "tiny", "lean"]),
        (["localize", "--checkpoint-every", "-1"], ["--checkpoint-every", "-1"]),
        (["localize", "--checkpoint-every", "all"], ["--checkpoint-every", "all"]),
        (["run", "{missing}"], ["nope.safetensors"]),
        (["run", "{csv}"], ["reviews.csv", "JSON"]),
        (["evaluate", "--ood", "bbc", "--task", "{csv}"], ["bbc", "same labels"]),
        (["evaluate", "--region", "{corrupt}"], ["corrupt.safetensors"]),
        (["evaluate", "--region", "{missing}"], ["nope.safetensors"]),
        (["anatomy", "--region", "{corrupt}"], ["corrupt.safetensors"]),
        (["compose", "--region", "{missing}", "--region", "{corrupt}"], ["nope.safetensors"]),
        (["compose", "--region", "{corrupt}"], ["two"]),
        (["export", "--region", "{missing}"], ["nope.safetensors"]),
        (["finetune", "--out", "{full}"], ["not empty", "full"]),
        (["finetune", "--optimizer", "sgd", "--l1", "0.1"], ["AdamW"]),
        (["evaluate", "--n", "0"], ["--n", "0"]),
        (["anatomy", "--by", "row"], ["row"]),
        ([], ["command"]),
    ],
)
def test_bad_input_is_one_line_exit_2_before_loading_models(args, needles, bad_files, no_models):
    args = [a.format(**bad_files) for a in args]
    assert_one_line_error(*run_cli(*args), *needles)


def test_export_errors(learned, bad_files, tmp_path, no_models):
    region_only = tmp_path / "indices.safetensors"
    record = regions.load(learned[0])
    regions.save(regions.RegionRecord(record.indices, record.shapes, record.meta), region_only)
    assert_one_line_error(*run_cli("export", "--region", region_only, "--out", tmp_path / "x"),
                          "indices.safetensors", "--finetuned")
    assert_one_line_error(*run_cli("export", "--region", learned[0], "--out", bad_files["full"]), "not empty")
    assert not (tmp_path / "x").exists()


def test_mismatched_pair_is_one_line(tmp_path):
    tiny = tmp_path / "tiny-bert"
    make_tiny_bert().save_pretrained(tiny)
    code, out, err = run_cli("localize", "--finetuned", tiny, "--method", "top-movement", "--k", "10")
    assert_one_line_error(code, out, err, "different parameters")


def test_region_for_another_model_is_refused(learned, tmp_path):
    record = regions.load(learned[0])
    name = next(iter(record.indices))
    shapes = {**record.shapes, name: (7, 7)}
    indices = {name: torch.tensor([0, 1])}
    other = tmp_path / "other.safetensors"
    regions.save(regions.RegionRecord(indices, shapes, {}), other)
    code, out, err = run_cli("compose", "--region", learned[0], "--region", other)
    assert_one_line_error(code, out, err, name)


def test_unexpected_error_points_to_debug_and_debug_raises(monkeypatch):
    def boom(args):
        raise RuntimeError("something odd")

    monkeypatch.setattr(cli, "cmd_tasks", boom)
    code, out, err = run_cli("tasks")
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [
        "graftui: error: unexpected RuntimeError: something odd (run with --debug for the traceback)"
    ]
    with pytest.raises(RuntimeError, match="something odd"):
        run_cli("--debug", "tasks")
    with pytest.raises(RuntimeError, match="something odd"):
        run_cli("tasks", "--debug")


def test_ctrl_c_exits_130_with_one_line(monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_methods", interrupted)
    code, out, err = run_cli("methods")
    assert code == 130 and err.strip() == "graftui: interrupted"


# -- one front door: re-runs, small data, integer labels ------------------------------------------
def test_run_remakes_a_region_bit_for_bit_from_its_file_and_from_a_config(learned, ft_dir, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)  # a config writes beneath the folder it is run from

    original = regions.load(learned[0])
    request = original.meta["request"]
    assert request["verb"] == "localize" and request["steps"] == 3 and request["seed"] == 0
    assert original.meta["library_version"] == __version__

    again = tmp_path / "again.safetensors"
    doc = run_json("run", learned[0], "--out", again)
    assert doc["path"] == str(again)
    copy = regions.load(again)
    assert set(copy.indices) == set(original.indices)
    for name in original.indices:
        assert torch.equal(copy.indices[name], original.indices[name]), name
        assert torch.equal(copy.values[name], original.values[name]), name
    assert regions.load(learned[0]).meta["created"] == original.meta["created"]  # the file read is never rewritten

    config = tmp_path / "localize.yaml"
    config.write_text(yaml.safe_dump({**request, "out": str(tmp_path / "from-config.safetensors")}))
    assert run_cli("run", config)[0] == 0
    from_config = regions.load(tmp_path / "from-config.safetensors")
    assert all(torch.equal(from_config.indices[n], original.indices[n]) for n in original.indices)

    report = tmp_path / "report.json"
    code, out, err = run_cli("anatomy", "--region", learned[0], "--report", report)
    assert code == 0 and str(report) in out
    saved = json.loads(report.read_text())
    assert saved["request"] == {"verb": "anatomy", "region": str(learned[0]), "by": "cell", "replicates": [],
                                "ablate": False, "n": 200, "max_new_tokens": None}
    assert run_json("run", report)["k"] == K


def test_a_small_csv_localizes_with_the_defaults_and_says_so(ft_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("GRAFTUI_FAST", raising=False)
    from graftui.tasks.classification.data import load_task

    movies = load_task("movies").splits["train"]
    small = tmp_path / "small.csv"
    rows = [("text", "label")] + [(t.replace(",", " "), y) for t, y in zip(movies.texts[:64], movies.labels[:64])]
    small.write_text("\n".join(f"{t},{y}" for t, y in rows) + "\n")
    doc = run_json("localize", "--finetuned", ft_dir, "--task", small, "--steps", "1", "--out", tmp_path / "r.safetensors")
    per_class = doc["meta"]["train_examples"] // 2
    assert 0 < per_class < 256 and doc["k"] > 0
    assert doc["notes"] and f"uses {per_class} per class" in doc["notes"][0]
    code, out, err = run_cli("localize", "--finetuned", ft_dir, "--task", small, "--steps", "1",
                             "--out", tmp_path / "r2.safetensors")
    assert code == 0 and "note: task 'small.csv' has only" in out


def test_an_ood_file_with_integer_labels_maps_onto_named_labels(ft_dir, tmp_path):
    from graftui.tasks.classification.data import load_task

    amazon = load_task("amazon").splits["test"]
    ood = tmp_path / "mine.csv"
    ood.write_text("text,label\n" + "\n".join(f"{t.replace(',', ' ')},{y}" for t, y in
                                                zip(amazon.texts[:40], amazon.labels[:40])) + "\n")
    doc = run_json("evaluate", "--finetuned", ft_dir, "--task", "movies", "--ood", ood, "--n", "16")
    assert {r["task"] for r in doc["rows"]} == {"movies", "mine.csv"}
    assert doc["notes"] == ["labels of 'mine.csv' matched by position to those of 'movies': 0 → negative, 1 → positive"]
    named = run_json("evaluate", "--finetuned", ft_dir, "--task", "movies", "--ood", "amazon", "--n", "16")
    by_task = lambda d: {r["model"]: r["accuracy"] for r in d["rows"] if r["distribution"] == "OOD"}  # noqa: E731
    assert set(by_task(doc)) == set(by_task(named))
    assert_one_line_error(*run_cli("evaluate", "--finetuned", ft_dir, "--ood", "bbc", "--n", "8"), "bbc", "same labels")
    # an explicit mapping wins: swapping the labels turns every OOD hit into a miss
    swapped = run_json("evaluate", "--finetuned", ft_dir, "--task", "movies", "--ood", ood, "--n", "16",
                       "--ood-labels", "0=positive,1=negative")
    assert "mapped as asked: 0 → positive, 1 → negative" in swapped["notes"][0]
    for model, acc in by_task(swapped).items():
        assert acc == pytest.approx(1 - by_task(doc)[model])
    assert_one_line_error(*run_cli("evaluate", "--finetuned", ft_dir, "--ood", ood, "--n", "8", "--ood-labels", "0=good"),
                          "not mapped", "'1'")
    assert_one_line_error(*run_cli("evaluate", "--ood-labels", "0:negative"), "--ood-labels", "old=new")


@pytest.mark.parametrize("content, needles", [
    ('{"verb": "localise"}', ["localise", "localize"]),
    ('{"verb": "localize", "sparsty": 0.1}', ["sparsty"]),
    ('{"verb": "localize", "sparsity": 2}', ["sparsity", "2"]),
    ('{"verb": "localize", "steps": "many"}', ["--steps", "many"]),
    ("{not json", ["config.json", "JSON"]),
    ("[1, 2]", ["verb"]),
])
def test_run_refuses_a_bad_config_in_one_line(content, needles, tmp_path, no_models):
    config = tmp_path / "config.json"
    config.write_text(content)
    assert_one_line_error(*run_cli("run", config), *needles)


# -- replicates ---------------------------------------------------------------------------------------
def test_localize_seeds_are_the_single_seed_regions_with_their_stability(ft_dir, learned, tmp_path):
    from graftui import regions, sets

    args = ["--finetuned", ft_dir, "--task", "movies", "--k", K, "--method", "learned", "--steps", "3",
            "--examples-per-class", "8"]
    doc = run_json("localize", *args, "--seeds", "0,1", "--out", tmp_path / "r.safetensors")
    paths = [tmp_path / "r-seed0.safetensors", tmp_path / "r-seed1.safetensors"]
    assert [e["seed"] for e in doc["seeds"]] == [0, 1] and [e["path"] for e in doc["seeds"]] == list(map(str, paths))
    single1 = run_json("localize", *args, "--seed", "1", "--out", tmp_path / "single1.safetensors")
    for path, single in ((paths[0], learned[0]), (paths[1], single1["path"])):  # bit for bit the single-seed regions
        a, b = regions.load(path), regions.load(single)
        assert a.indices.keys() == b.indices.keys() and all(torch.equal(a.indices[n], b.indices[n]) for n in a.indices)
        assert all(torch.equal(a.values[n], b.values[n]) for n in a.values)
    r0, r1 = (regions.load(p).indices for p in paths)
    st = doc["stability"]
    both = sets.region_size(sets.intersection(r0, r1))
    assert st["core"] == both and st["union"] == 2 * K - both and st["only_one"] == 2 * (K - both)
    assert st["pairwise_overlap"][0][1] == pytest.approx(both / K) and st["pairwise_overlap"][0][0] == 1.0
    graftable = regions.load(paths[0]).graftable
    assert st["chance_overlap"] == pytest.approx(K / graftable) and st["over_chance"] == pytest.approx(both / K / (K / graftable))
    core, union = regions.load(st["core_path"]), regions.load(st["union_path"])
    assert core.size == both and union.size == 2 * K - both and core.is_patch and union.is_patch
    ft = dict(_params(ft_dir))
    for name, idx in union.indices.items():  # the union patch holds the fine-tuned values
        assert torch.equal(union.values[name], ft[name].reshape(-1)[idx])
    assert sum(v["core"] for v in st["by_module"].values()) == both
    assert any("found by every seed" in line for line in doc["card"])
    # run again: every seed is read back, nothing is recomputed or written twice
    again = run_json("localize", *args, "--seeds", "0,1", "--out", tmp_path / "r.safetensors")
    assert [e["reused"] for e in again["seeds"]] == [True, True] and again["stability"] == st
    assert sorted(p.name for p in tmp_path.glob("r-*")) == ["r-core.safetensors", "r-seed0.safetensors",
                                                            "r-seed1.safetensors", "r-union.safetensors"]
    # another setting on the same files is refused, and hostile seed lists are one line
    assert_one_line_error(*run_cli("localize", *args, "--steps", "4", "--seeds", "0,1", "--out", tmp_path / "r.safetensors"),
                          "r-seed0.safetensors", "not made by this request", "--overwrite")
    assert_one_line_error(*run_cli("localize", "--seeds", "1,1"), "--seeds", "twice")
    assert_one_line_error(*run_cli("localize", "--seeds", "0,x"), "'x' is not a whole number")

    # the seeds read together by evaluate: mean ± std over the two regions, differences over seeds
    ev = run_json("evaluate", "--region", paths[0], "--region", paths[1], "--n", "64", "--no-ood", "--baselines")
    (group,) = ev["replicates"]
    assert group["regions"] == [r["model"] for r in ev["rows"] if r["model"].startswith("r-seed")][:2]
    acc = {r["model"]: r["accuracy"] for r in ev["rows"]}
    row = group["rows"][0]
    assert row["accuracy"] == pytest.approx((acc[group["regions"][0]] + acc[group["regions"][1]]) / 2)
    assert row["accuracy_seeds"] == [acc[m] for m in group["regions"]]
    vs_ft = next(d for d in group["differences"] if d["b"] == "fine-tuned" and d["metric"] == "accuracy")
    assert vs_ft["seeds"] == 2 and vs_ft["diff_seeds"] == pytest.approx([acc[m] - acc["fine-tuned"] for m in group["regions"]])
    assert vs_ft["ci"][0] <= vs_ft["diff"] <= vs_ft["ci"][1] and vs_ft["ci_kind"] == "seeds and test examples"
    assert any(line.startswith("Read together, 'r (seeds 0, 1)'") for line in ev["card"])


def test_regions_of_two_fine_tunes_are_evaluated_as_replicates_over_fine_tunes(ft_dir, top, tmp_path):
    """Regions of the same experiment on two fine-tunes (fine-tune seeds): each fine-tune is scored with its own
    region, FT and baselines, and every figure is the mean over the two, its own runs kept."""
    from safetensors.torch import save_file

    other = tmp_path / "ft-other"
    shutil.copytree(ft_dir, other)
    weights = load_file(str(other / "model.safetensors"))
    save_file({n: (t * 1.01 if t.is_floating_point() else t) for n, t in weights.items()},
              str(other / "model.safetensors"), metadata={"format": "pt"})
    loc = run_json("localize", "--finetuned", ft_dir, "--finetuned-replicates", other, "--k", K, "--method",
                   "top-movement", "--out", tmp_path / "r.safetensors")
    paths = [tmp_path / f"r-ft{i}.safetensors" for i in (0, 1)]
    assert [e["path"] for e in loc["finetunes"]] == [str(p) for p in paths] and loc["path"] == str(paths[0])
    assert regions.load(paths[0]).indices.keys() == regions.load(top[0]).indices.keys()
    assert regions.digest(regions.load(paths[0]).indices) == regions.digest(regions.load(top[0]).indices)
    st = loc["finetune_stability"]
    assert st["seeds"] == 2 and st["mean_overlap"] > st["chance_overlap"]
    assert any("Across 2 fine-tunes" in line for line in loc["card"])
    each = [run_json("evaluate", "--region", p, "--baselines", "--n", "32", "--no-ood") for p in paths]
    both = run_json("evaluate", "--region", *paths, "--baselines", "--n", "32", "--no-ood")
    assert both["finetunes"] == [str(ft_dir), str(other)] and len(both["per_finetune"]) == 2
    for model, own in (("fine-tuned", "fine-tuned"), ("r", "r-ft0"), ("Random", "Random")):
        row = next(r for r in both["rows"] if r["model"] == model)
        alone = [next(r for r in e["rows"] if r["model"] in (own, own.replace("ft0", f"ft{i}")))["accuracy"]
                 for i, e in enumerate(each)]
        assert row["accuracy_seeds"] == alone and row["accuracy"] == pytest.approx(sum(alone) / 2), model
    d = next(d for d in both["differences"] if (d["a"], d["b"], d["metric"]) == ("r", "fine-tuned", "accuracy"))
    alone = [next(x for x in e["differences"] if x["b"] == "fine-tuned" and x["metric"] == "accuracy"
                  and x["a"].startswith("r-ft"))["diff"] for e in each]
    assert d["over"] == "fine-tunes" and d["seeds"] == 2 and d["diff"] == pytest.approx(sum(alone) / 2)
    assert d["ci"][0] <= d["diff"] <= d["ci"][1]
    assert any("over 2 fine-tunes" in line for line in both["card"])
    assert any("pts over 2 fine-tunes, n = 32]" in line for line in both["card"])  # a row's spread is the fine-tunes'
    code, out, err = run_cli("evaluate", "--region", *paths, "--n", "16", "--no-ood")
    assert code == 0, err
    assert "means over 2 fine-tunes" in out and "fine-tunes ≠ 0" in out
    sw = run_json("sweep", "--finetuned", ft_dir, "--finetuned-replicates", other, "--methods", "top-movement,random",
                  "--sparsities", "1e-3", "--n", "32", "--no-ood")
    assert sw["finetunes"] == [str(ft_dir), str(other)] and len(sw["per_finetune"]) == 2
    for row in sw["rows"]:
        own = [next(r for r in p["rows"] if r["method"] == row["method"])["accuracy"] for p in sw["per_finetune"]]
        assert row["accuracy_seeds"] == own and row["accuracy"] == pytest.approx(sum(own) / 2)
    from graftui import figures

    assert "over 2 fine-tunes" in figures.sweep_figure(sw["rows"], sw["task"]).layout.title.text
    assert_one_line_error(*run_cli("sweep", "--finetuned", ft_dir, "--finetuned-replicates", ft_dir, "--n", "8"),
                          "names a fine-tune twice")
    again = run_json("localize", "--finetuned", ft_dir, "--finetuned-replicates", other, "--k", K, "--method",
                     "top-movement", "--out", tmp_path / "r.safetensors")  # the files of this request: read back
    assert [e["path"] for e in again["finetunes"]] == [str(p) for p in paths] and again["finetunes"][0]["seconds"] == 0
    # fine-tunes × seeds: every (fine-tune, seed) is one run of the mean; seed replicates are read together over all
    rnd = run_json("localize", "--finetuned", ft_dir, "--finetuned-replicates", other, "--k", K, "--method", "random",
                   "--seeds", "0,1", "--out", tmp_path / "rr.safetensors")
    assert [len(e["seeds"]) for e in rnd["finetunes"]] == [2, 2]
    files = [tmp_path / f"rr-ft{i}-seed{s}.safetensors" for i in (0, 1) for s in (0, 1)]
    ev = run_json("evaluate", "--region", *files, "--n", "16", "--no-ood")
    group = ev["replicates"][0]
    assert group["name"] == "rr (seeds 0, 1)" and len(group["rows"][0]["accuracy_seeds"]) == 4
    runs = run_json("evaluate", "--region", *paths, "--n", "16", "--no-ood", "--seeds", "0,1", "--baselines")
    assert [(e["finetuned"], e["seed"]) for e in runs["per_finetune"]] == [(str(f), s) for f in (ft_dir, other)
                                                                          for s in (0, 1)]
    d = next(d for d in runs["differences"] if d["a"] == "r" and d["b"] == "Random" and d["metric"] == "accuracy")
    assert d["over"] == "runs" and d["seeds"] == 4 and d["ci_kind"] == "runs and test examples"
    # not the same experiment on each fine-tune: refused in one line, nothing scored
    run_json("localize", "--finetuned", other, "--k", K // 2, "--method", "top-movement", "--out", tmp_path / "small.safetensors")
    assert_one_line_error(*run_cli("evaluate", "--region", paths[0], tmp_path / "small.safetensors", "--n", "16"),
                          "not the same regions on each", "--finetuned")


def test_a_cancelled_replicate_run_keeps_its_finished_seeds_and_resumes(ft_dir, tmp_path):
    import threading

    from graftui.errors import Cancelled
    from graftui.requests import LocalizeRequest

    req = LocalizeRequest.make(finetuned=str(ft_dir), task="movies", k=K, method="learned", steps=2,
                               examples_per_class=8, seeds=[3, 4], out=str(tmp_path / "c.safetensors"))
    cancel, seen = threading.Event(), []

    def progress(event):
        seen.append(event)
        if event.get("seed") == 4:
            cancel.set()  # the second seed has begun: stop

    with pytest.raises(Cancelled, match=r"kept seed 3 \(c-seed3.safetensors\): run it again with the same --out"):
        flows.localize(req, progress=progress, cancel=cancel)
    assert (tmp_path / "c-seed3.safetensors").exists() and not (tmp_path / "c-seed4.safetensors").exists()
    fractions = [e["fraction"] for e in seen if "fraction" in e]
    assert all(0 <= f <= 1 for f in fractions) and any(e["stage"].startswith("seed 3 (1/2)") for e in seen)
    done = flows.localize(req).as_dict()
    assert [(e["seed"], e["reused"]) for e in done["seeds"]] == [(3, True), (4, False)]


def test_sweep_and_evaluate_over_seeds_report_mean_and_std_with_each_seed_kept(ft_dir, top, tmp_path):
    sw = run_json("sweep", "--finetuned", ft_dir, "--methods", "top-movement,random", "--sparsities", "1e-3",
                  "--n", "32", "--no-ood", "--seeds", "0,1")
    assert sw["seeds"] == [0, 1] and [p["seed"] for p in sw["per_seed"]] == [0, 1]
    for row in sw["rows"]:
        each = [next(r for r in p["rows"] if r["method"] == row["method"])["accuracy"] for p in sw["per_seed"]]
        assert row["accuracy_seeds"] == each and row["accuracy"] == pytest.approx(sum(each) / 2)
        assert row["accuracy_std"] == pytest.approx(abs(each[0] - each[1]) / 2 ** 0.5)
    d = next(d for d in sw["differences"] if (d["a"], d["b"], d["metric"]) == ("top-movement", "random", "accuracy"))
    assert d["seeds"] == 2 and len(d["ci_seeds"]) == 2 and d["sparsity"] == 1e-3
    from graftui import figures

    fig = figures.sweep_figure(sw["rows"], sw["task"])
    assert "mean ± std over 2 seeds" in fig.layout.title.text
    assert list(fig.data[0].error_y.array) == [sw["rows"][0]["accuracy_std"]]

    ev = run_json("evaluate", "--region", top[0], "--baselines", "--n", "32", "--no-ood", "--seeds", "0,1")
    rand = [next(r for r in p["rows"] if r["model"] == "Random")["accuracy"] for p in ev["per_seed"]]
    row = next(r for r in ev["rows"] if r["model"] == "Random")
    assert row["accuracy"] == pytest.approx(sum(rand) / 2) and row["accuracy_seeds"] == rand
    ft = [next(r for r in p["rows"] if r["model"] == "fine-tuned")["accuracy"] for p in ev["per_seed"]]
    assert ev["request"]["seeds"] == [0, 1] and len(ev["per_seed"]) == 2 and len(set(ft)) >= 1
    code, out, err = run_cli("evaluate", "--region", top[0], "--n", "16", "--no-ood", "--seeds", "0,1")
    assert code == 0, err
    assert "means over seeds 0, 1" in out and "±" in out
