"""The paper's experiments: exact maths on tiny models, and the flows end to end on a tiny multi-task model."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from conftest import MINILM_DIR, make_tiny_pair, mask_to_region, random_batches
from graftui import experiments, method, sets
from graftui.config import GraftableSpec


def region(**parts) -> dict:
    return {name: torch.tensor(idx, dtype=torch.long) for name, idx in parts.items()}


# -- Eq. 5, overlap, continual ---------------------------------------------------------------------
def test_relative_gain_is_eq5_and_none_without_a_gain():
    assert experiments.relative_gain(0.8, 0.5, 0.9) == pytest.approx(0.75)
    assert experiments.relative_gain(0.5, 0.5, 0.9) == 0.0 and experiments.relative_gain(0.9, 0.5, 0.9) == 1.0
    assert experiments.relative_gain(0.4, 0.5, 0.9) == pytest.approx(-0.25)  # worse than the bare body
    assert experiments.relative_gain(0.7, 0.6, 0.6) is None
    assert experiments.gain_matrix([[0.9, 0.6], [0.7, 0.8]], [0.5, 0.6], [0.9, 0.8]) == [
        [pytest.approx(1.0), pytest.approx(0.0)], [pytest.approx(0.5), pytest.approx(1.0)]]



def accuracy_of(pair, task, region, n: int) -> float:
    """Test accuracy of θ̄(region), or of the fine-tuned model when ``region`` is None."""
    from graftui import metrics
    from graftui.tasks.classification import scoring

    with (pair.finetuned() if region is None else pair.grafted(region)):
        return metrics.accuracy(*scoring.predict(pair, task, "test", n))


def metrics_of(pair, task, region, n: int):
    """Accuracy, ECE … of θ̄(region), or of the fine-tuned model when ``region`` is None."""
    from graftui import metrics
    from graftui.tasks.classification import scoring

    with (pair.finetuned() if region is None else pair.grafted(region)):
        return metrics.metrics(*scoring.predict(pair, task, "test", n))


def test_overlap_of_hand_made_regions_is_intersection_over_the_column_region():
    a = region(w=[0, 1, 2, 3], b=[0])  # 5 parameters
    b = region(w=[2, 3, 4], v=[7])  # 4 parameters, 2 shared with a
    m = sets.overlap_matrix({"a": a, "b": b})
    assert m["intersection_counts"] == [[5, 2], [2, 4]]
    assert m["overlap"] == [[1.0, 2 / 4], [2 / 5, 1.0]]


def test_continual_task_trains_only_what_no_earlier_region_holds():
    earlier = [region(w=[0, 1, 2]), region(w=[5], b=[1])]
    new = region(w=[1, 2, 3, 5, 9], b=[0, 1], v=[4])
    part = experiments.new_part(new, earlier)
    assert {n: i.tolist() for n, i in part.items()} == {"w": [3, 9], "b": [0], "v": [4]}
    assert experiments.new_part(new, []) == new
    assert sets._intersection_count(part, sets.union(*earlier)) == 0
    assert method.region_size(sets.union(part, *earlier)) == method.region_size(sets.union(new, *earlier))


# -- WiSE -------------------------------------------------------------------------------------------
def test_wise_ends_are_the_base_and_the_fine_tuned_model_bit_for_bit(tiny_pair):
    pair, base, ft = tiny_pair
    names = list(pair.ft)
    k_region = method.base_region(pair.pre, pair.ft, pair.graftable, 200)
    with pair.interpolated(0.0):
        assert all(torch.equal(pair.param(n), pair.pre[n]) for n in names)
    with pair.interpolated(1.0):
        assert all(torch.equal(pair.param(n), pair.ft[n]) for n in names)
    grafted = {}
    with pair.grafted(k_region):
        grafted = {n: pair.param(n).detach().clone() for n in names}
    with pair.interpolated(1.0, k_region):
        assert all(torch.equal(pair.param(n), grafted[n]) for n in names)
    with pair.interpolated(0.0, k_region):
        assert all(torch.equal(pair.param(n), pair.pre[n]) for n in names)
    with pair.interpolated(0.25, k_region):
        name, idx = next(iter(k_region.items()))
        got = pair.param(name).view(-1)
        want = pair.pre[name].view(-1) + 0.25 * (pair.ft[name].view(-1) - pair.pre[name].view(-1))
        assert torch.allclose(got[idx], want[idx], atol=1e-7)
        outside = torch.ones_like(got, dtype=torch.bool)
        outside[idx] = False
        assert torch.equal(got[outside], pair.pre[name].view(-1)[outside])
    assert all(torch.equal(pair.param(n), pair.pre[n]) for n in names)  # restored
    with pytest.raises(ValueError, match="α must be in"):
        method.wise(pair.pre[names[0]], pair.ft[names[0]], 1.5)


# -- graft re-training --------------------------------------------------------------------------------
def test_retraining_moves_only_the_region_and_leaves_the_model_at_the_base():
    from graftui.requests import FinetuneConfig

    pair, _, _ = make_tiny_pair()
    params = {n: pair.param(n) for n in pair.graftable}
    gamma = method.base_region(pair.pre, pair.ft, pair.graftable, 120)
    masks = method.region_to_mask(gamma, pair.shapes)
    flags = {n: p.requires_grad for n, p in pair.model.named_parameters()}
    leaks = []

    def check(step, loss):
        for n in pair.graftable:
            outside = ~masks[n]
            if not torch.equal(params[n].data[outside], pair.pre[n][outside]):
                leaks.append((step, n))

    recipe = FinetuneConfig(lr=0.5, epochs=2, batch_size=8, weight_decay=0.1)
    values = experiments.retrain_inside(pair.model, params, pair.pre, gamma, random_batches(), recipe, check)
    assert not leaks
    assert set(values) == set(gamma) and all(values[n].shape == gamma[n].shape for n in gamma)
    moved = sum(int((values[n] != pair.pre[n].view(-1)[gamma[n]]).sum()) for n in gamma)
    assert moved > 0.5 * method.region_size(gamma)
    assert all(torch.equal(params[n], pair.pre[n]) for n in pair.graftable)  # left at θ_pre
    assert {n: p.requires_grad for n, p in pair.model.named_parameters()} == flags and not pair.model.training


# -- mask learning from a given start, on a joint loss ------------------------------------------------
def test_mask_learning_starts_from_the_given_region():
    pair, _, _ = make_tiny_pair()
    params = {n: pair.param(n) for n in pair.graftable}
    empty = method.MaskLearner(pair.model, params, pair.pre, pair.ft, 50, method.LearnConfig(), start={})
    assert all(bool((ell < 0).all()) for ell in empty.logits.values())
    empty.finish()
    start = region(**{pair.graftable[0]: [0, 3], pair.graftable[2]: [1]})
    learner = method.MaskLearner(pair.model, params, pair.pre, pair.ft, 3, method.LearnConfig(), start=start)
    assert mask_to_region({n: ell > 0 for n, ell in learner.logits.items()}).keys() == start.keys()
    assert sum(int((ell > 0).sum()) for ell in learner.logits.values()) == 3
    learner.finish()


def test_joint_loss_is_the_sum_of_the_task_losses_on_one_shared_body():
    from conftest import make_tiny_bert

    from graftui.experiments import JointLoss

    one, two = make_tiny_bert(0, num_labels=2), make_tiny_bert(1, num_labels=3)
    two.bert = one.bert  # one body, two heads
    a = next(random_batches(seed=1)(0))
    b = next(random_batches(seed=2)(0))
    b["labels"] = b["labels"] % 3
    joint = JointLoss([one, two])
    out = joint(**{f"0:{k}": v for k, v in a.items()}, **{f"1:{k}": v for k, v in b.items()})
    assert torch.allclose(out.loss, one(**a).loss + two(**b).loss)
    out.loss.backward()
    assert one.bert.encoder.layer[0].output.dense.weight.grad is not None
    assert len({id(p) for p in joint.parameters()}) == len(list(joint.parameters()))


# -- the flows end to end on a tiny multi-task model --------------------------------------------------
@pytest.fixture(scope="module")
def tiny_multitask(tmp_path_factory):
    """A tiny BERT body (no head, like MiniLM) and a multi-task fine-tune of it on movies, amazon and bbc."""
    from transformers import BertConfig, BertModel

    from graftui import training
    from graftui.tasks.classification.data import load_task
    from graftui.requests import FinetuneConfig

    root = tmp_path_factory.mktemp("multitask")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=128)
    BertModel(config).save_pretrained(root / "base", safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(MINILM_DIR / f, root / "base" / f)
    tasks = [load_task(t) for t in ("movies", "amazon", "bbc")]
    recipe = FinetuneConfig(lr=0.05, epochs=1, train_examples=96, batch_size=16)
    seen = []
    out = training.finetune_multitask(str(root / "base"), tasks, recipe, root / "mt", progress=seen.append)
    return {"base": str(root / "base"), "checkpoint": str(out), "root": root, "progress": seen}


def test_multitask_fine_tune_writes_one_checkpoint_per_task_with_one_shared_body(tiny_multitask):
    from safetensors.torch import load_file

    folder = tiny_multitask["checkpoint"]
    states = {t: load_file(f"{folder}/{t}/model.safetensors") for t in ("movies", "amazon", "bbc")}
    body = [n for n in states["movies"] if n.startswith("bert.")]
    assert body and all(torch.equal(states["movies"][n], states[t][n]) for t in ("amazon", "bbc") for n in body)
    assert states["movies"]["classifier.weight"].shape[0] == 2 and states["bbc"]["classifier.weight"].shape[0] == 5
    assert not torch.equal(states["movies"]["classifier.weight"], states["amazon"]["classifier.weight"])
    record = json.loads((tiny_multitask["root"] / "mt" / "graftui_record.json").read_text())
    assert record["tasks"] == ["movies", "amazon", "bbc"] and record["train_examples"]["bbc"] == 96
    steps = tiny_multitask["progress"]
    assert len(steps) == 3 * 6 and {p.task for p in steps} == {"movies", "amazon", "bbc"}


def test_multitask_flow_matrices_agree_with_the_region_files_and_eq5(tiny_multitask, tmp_path, monkeypatch):
    from graftui import flows, regions
    from graftui.tasks.classification import scoring
    from graftui.tasks.classification.data import load_task
    from graftui.requests import MultitaskRequest

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    req = MultitaskRequest(base=tiny_multitask["base"], checkpoint=tiny_multitask["checkpoint"], sparsity=0.02, steps=3,
                           examples_per_class=8, group=["movies", "amazon"], purify_steps=2, n=48,
                           out=str(tmp_path / "regions"))
    res = flows.run(req).as_dict()
    tasks = res["tasks"]
    assert tasks == ["movies", "amazon", "bbc"] and set(res["regions"]) == {*tasks, "purified"}
    found = {t: regions.load(res["regions"][t]) for t in tasks}
    assert all(r.size == res["k"] for r in found.values())
    assert all(not any(n.startswith("classifier") for n in r.indices) for r in found.values())
    again = sets.overlap_matrix({t: found[t].indices for t in tasks})
    assert res["overlap"] == again["overlap"] and res["intersection_counts"] == again["intersection_counts"]
    for i in range(3):
        for j in range(3):
            want = experiments.relative_gain(res["scores"][i][j], res["p_zero"][j], res["p_one"][j])
            assert res["relative_gain"][i][j] == (pytest.approx(want) if want is not None else None)
    union = sets.union(found["movies"].indices, found["amazon"].indices)
    assert res["union"]["size"] == method.region_size(union) and res["union"]["group"] == ["movies", "amazon"]
    purified = regions.load(res["regions"]["purified"])
    assert purified.size == res["purified"]["size"] == res["union"]["size"]  # top-k keeps the union's size
    # P_1 and a graft's score are the plain accuracies of that task's pair
    pair = flows.load_pair(tiny_multitask["base"], f"{tiny_multitask['checkpoint']}/bbc",
                           GraftableSpec(names=tuple(found["bbc"].shapes)))
    bbc = load_task("bbc")
    assert res["p_one"][2] == accuracy_of(pair, bbc, None, n=48)
    assert res["scores"][0][2] == accuracy_of(pair, bbc, found["movies"].indices, n=48)
    assert found["movies"].meta["request"]["verb"] == "multitask"
    # an ECE beside every accuracy, and a card that reads Eq. 5
    assert res["ece"]["p_one"][2] == metrics_of(pair, bbc, None, n=48).ece
    assert res["ece"]["scores"][0][2] == metrics_of(pair, bbc, found["movies"].indices, n=48).ece
    assert len(res["ece"]["purified"]) == 3 and len(res["card"]) == 3 + 2  # a line per task, the overlap, the union
    for task, line, own in zip(tasks, res["card"], (res["relative_gain"][j][j] for j in range(3))):
        assert line.startswith(f"On {task}: its own region recovers {round(100 * own)} % of the multi-task model's gain"
                               if own is not None else f"On {task}: the multi-task model gains nothing"), line


def test_a_multitask_checkpoint_is_read_with_its_own_base(tiny_multitask, tmp_path, monkeypatch):
    from graftui import flows
    from graftui.errors import RequestError
    from graftui.requests import MultitaskRequest

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    with pytest.raises(RequestError, match="was fine-tuned from .* not 'minilm'; give --base"):
        flows.run(MultitaskRequest(base="minilm", checkpoint=tiny_multitask["checkpoint"], n=8))


def test_wise_flow_ends_match_the_fine_tuned_model_and_the_graft(tiny_multitask, tmp_path, monkeypatch):
    from graftui import flows
    from graftui.requests import LocalizeRequest, WiseRequest

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    ft = f"{tiny_multitask['checkpoint']}/movies"
    loc = flows.run(LocalizeRequest(base=tiny_multitask["base"], finetuned=ft, task="movies", method="top-movement",
                                    sparsity=0.05, out=str(tmp_path / "r.safetensors")))
    res = flows.run(WiseRequest(region=loc.path, alphas=[1.0, 0.0, 0.5], n=40)).as_dict()
    assert res["task"] == "movies" and res["ood"] == ["amazon", "tweets"]
    assert len(res["rows"]) == 2 * 3 * 3 and [r["alpha"] for r in res["rows"][:9:3]] == [0.0, 0.5, 1.0]
    from graftui.requests import EvaluateRequest

    ev = flows.run(EvaluateRequest(regions=[loc.path], n=40)).as_dict()
    acc = {(r["model"], r["task"]): r["accuracy"] for r in ev["rows"]}
    got = {(r["curve"], r["alpha"], r["task"]): r["accuracy"] for r in res["rows"]}
    for t in ("movies", "amazon", "tweets"):
        assert got[("WiSE-FT", 1.0, t)] == acc[("fine-tuned", t)]
        assert got[("WiSE-FT", 0.0, t)] == got[("WiSE-graft", 0.0, t)] == acc[("pre-trained body + FT head", t)]
        label = next(m for m, task in acc if task == t and m not in ("fine-tuned", "pre-trained body + FT head"))
        assert got[("WiSE-graft", 1.0, t)] == acc[(label, t)]
    paired = {(d["alpha"], d["task"], d["metric"]): d for d in res["differences"]}
    assert set(paired) == {(a, t, m) for a in (0.0, 0.5, 1.0) for t in ("movies", "amazon", "tweets")
                           for m in ("accuracy", "ece")}
    for t in ("movies", "amazon", "tweets"):  # at α = 0 both curves are θ_pre: nothing between them
        assert paired[(0.0, t, "accuracy")]["ci"] == [0.0, 0.0] and paired[(0.0, t, "ece")]["diff"] == 0
        d = paired[(1.0, t, "accuracy")]
        assert d["diff"] == pytest.approx(got[("WiSE-graft", 1.0, t)] - got[("WiSE-FT", 1.0, t)])
        assert d["ci"][0] <= d["diff"] <= d["ci"][1] and d["a"] == "WiSE-graft" and d["b"] == "WiSE-FT"
    assert len(res["card"]) == 3 + 1 and res["card"][0].startswith("movies (in distribution): WiSE-FT peaks at α = ")
    from graftui.formatting import difference

    d, e = paired[(1.0, "movies", "accuracy")], paired[(1.0, "movies", "ece")]
    assert f"At α = 1, WiSE-graft − WiSE-FT: {difference(d)}; ECE {difference(e)}." in res["card"][0]


def test_retrain_flow_scores_ft_graft_retrained_and_bitfit(tiny_multitask, tmp_path, monkeypatch):
    from graftui import flows, regions
    from graftui.requests import LocalizeRequest, RetrainRequest

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    ft = f"{tiny_multitask['checkpoint']}/movies"
    loc = flows.run(LocalizeRequest(base=tiny_multitask["base"], finetuned=ft, task="movies", method="top-movement",
                                    sparsity=0.05, out=str(tmp_path / "r.safetensors")))
    seen = []
    res = flows.run(RetrainRequest(region=loc.path, epochs=1, train_examples=32, n=32, no_ood=True),
                    progress=seen.append).as_dict()
    models = [r["model"] for r in res["rows"]]
    assert models == ["fine-tuned", "pre-trained body + FT head", "graft", "re-trained graft", "BitFit (biases)"]
    biases = sum(t.numel() for n, t in regions.load(loc.path).shapes.items() if n.endswith("bias")
                 for t in [torch.empty(t)])
    assert res["trained"] == {"graft": loc.k, "re-trained graft": loc.k, "BitFit (biases)": biases}
    assert any("training the re-trained graft" in p.get("stage", "") for p in seen)
    assert res["recipe"]["epochs"] == 1 and res["recipe"]["train_examples"] == 32
    acc = dict(zip(models, (r["accuracy"] for r in res["rows"])))
    paired = {(d["a"], d["b"], d["metric"]): d for d in res["differences"]}
    for trained in ("re-trained graft", "BitFit (biases)"):  # each trained model against the graft, paired
        d = paired[(trained, "graft", "accuracy")]
        assert d["diff"] == pytest.approx(acc[trained] - acc["graft"]) and d["ci"][0] <= d["diff"] <= d["ci"][1]
    assert ("graft", "fine-tuned", "ece") in paired and ("graft", "pre-trained body + FT head", "accuracy") in paired
    text = " ".join(res["card"])
    assert "The graft 'graft'" in text and "re-trained graft − the graft (accuracy): " in text and "BitFit trains" in text
    # replicates over the training seed: seed 0's rows are the single run's, every figure the mean over the seeds
    both = flows.run(RetrainRequest(region=loc.path, epochs=1, train_examples=32, n=32, no_ood=True, no_bitfit=True,
                                    seeds=[0, 1])).as_dict()
    assert [e["seed"] for e in both["per_seed"]] == [0, 1] and both["seeds"] == [0, 1]
    first = {r["model"]: r["accuracy"] for r in both["per_seed"][0]["rows"]}
    assert first == {m: a for m, a in acc.items() if m != "BitFit (biases)"}
    second = {r["model"]: r["accuracy"] for r in both["per_seed"][1]["rows"]}
    mean = {r["model"]: r for r in both["rows"]}
    assert mean["re-trained graft"]["accuracy"] == pytest.approx((first["re-trained graft"] + second["re-trained graft"]) / 2)
    assert mean["re-trained graft"]["accuracy_seeds"] == [first["re-trained graft"], second["re-trained graft"]]
    assert mean["graft"]["accuracy_std"] == 0.0  # the graft does not train: the same for every seed
    assert "mean over training seeds 0, 1" in both["card"][-1]


def test_multitask_replicates_average_the_seeds_and_keep_each_seeds_own_run(tiny_multitask, tmp_path, monkeypatch):
    from graftui import flows
    from graftui.requests import MultitaskRequest

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    common = dict(base=tiny_multitask["base"], checkpoint=tiny_multitask["checkpoint"], tasks=["movies", "bbc"],
                  sparsity=0.02, steps=2, examples_per_class=4, purify_steps=0, n=24)
    seen = []
    both = flows.run(MultitaskRequest(**common, seeds=[0, 1]), progress=seen.append).as_dict()
    one = flows.run(MultitaskRequest(**common, seed=1)).as_dict()
    assert both["seeds"] == [0, 1] and [e["seed"] for e in both["per_seed"]] == [0, 1]
    for name in ("overlap", "scores", "p_one", "ece"):  # seed 1 of the replicate run is the single seed-1 run
        assert both["per_seed"][1][name] == one[name]
    assert both["per_seed"][0]["regions"]["movies"] != both["per_seed"][1]["regions"]["movies"]  # each seed's own file
    s0, s1 = (e["scores"] for e in both["per_seed"])
    assert both["scores"][1][0] == pytest.approx((s0[1][0] + s1[1][0]) / 2)
    assert both["spread"]["scores"][1][0] == pytest.approx(abs(s0[1][0] - s1[1][0]) / 2 ** 0.5)
    # every seed is scored on the same test examples: what no region changes is the same for every seed
    assert both["p_one"] == one["p_one"] and both["spread"]["p_one"] == [0.0, 0.0]
    assert "mean over mask seeds 0, 1" in both["card"][-1]
    from graftui.flows import text

    assert "Every figure is the mean over mask seeds 0, 1" in text.multitask(both)
    assert any(str(e.get("stage", "")).startswith("seed 1 (2/2)") for e in seen)


def test_wise_replicates_are_the_mean_over_the_regions_of_several_mask_seeds(tiny_multitask, tmp_path, monkeypatch):
    from graftui import flows
    from graftui.errors import RequestError
    from graftui.requests import LocalizeRequest, WiseRequest

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    ft = f"{tiny_multitask['checkpoint']}/movies"
    loc = flows.run(LocalizeRequest(base=tiny_multitask["base"], finetuned=ft, task="movies", sparsity=0.05, steps=2,
                                    examples_per_class=4, seeds=[0, 1], out=str(tmp_path / "r.safetensors")))
    paths = [e["path"] for e in loc.seeds]
    alone = [flows.run(WiseRequest(region=p, alphas=[0.0, 1.0], n=24, no_ood=True)).as_dict() for p in paths]
    res = flows.run(WiseRequest(region=paths[0], replicates=paths[1:], alphas=[0.0, 1.0], n=24, no_ood=True)).as_dict()
    assert res["replicates"] == paths and [e["seed"] for e in res["per_region"]] == [0, 1]
    assert [e["rows"] for e in res["per_region"]] == [a["rows"] for a in alone]
    row = next(r for r in res["rows"] if (r["curve"], r["alpha"]) == ("WiSE-graft", 1.0))
    each = [next(r["accuracy"] for r in a["rows"] if (r["curve"], r["alpha"]) == ("WiSE-graft", 1.0)) for a in alone]
    assert row["accuracy"] == pytest.approx(sum(each) / 2) and row["accuracy_seeds"] == each
    ft_row = next(r for r in res["rows"] if (r["curve"], r["alpha"]) == ("WiSE-FT", 1.0))
    assert ft_row["accuracy_std"] == 0.0  # WiSE-FT holds no region: the same for every seed
    d = next(d for d in res["differences"] if d["alpha"] == 1.0 and d["metric"] == "accuracy")
    assert d["seeds"] == 2 and d["ci"][0] <= d["diff"] <= d["ci"][1]
    assert "mean over the regions of mask seeds 0, 1" in res["card"][-1]
    with pytest.raises(RequestError, match="--replicates"):
        WiseRequest(region=paths[0], replicates=[]).validate()


# -- front ends -------------------------------------------------------------------------------------
def test_cli_refuses_bad_experiment_requests_in_one_line(tmp_path, monkeypatch):
    from test_cli import assert_one_line_error, run_cli

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path))
    assert_one_line_error(*run_cli("multitask", "--tasks", "movies"), "two or more different tasks")
    assert_one_line_error(*run_cli("multitask", "--group", "movies,tweets"), "'tweets' is not one of --tasks")
    assert_one_line_error(*run_cli("multitask", "--purify-steps", "-1"), "--purify-steps")
    assert_one_line_error(*run_cli("multitask", "--group", "movies,movies"), "two or more different tasks")
    assert_one_line_error(*run_cli("wise", "--alphas", "0,1.5"), "[0, 1]")
    assert_one_line_error(*run_cli("wise", "--region", str(tmp_path / "none.safetensors")), "no region file")
    assert_one_line_error(*run_cli("retrain", "--train-examples", "-3"), "--train-examples")
    assert_one_line_error(*run_cli("retrain", "--ft-lr", "0"), "learning rate")
    assert_one_line_error(*run_cli("multitask", "--ft-lr", "-1"), "learning rate")


def test_python_api_offers_the_experiments():
    import graftui

    assert graftui.multitask.__doc__.startswith("One model fine-tuned on several tasks")
    assert graftui.MultitaskRequest().tasks == ["movies", "amazon", "bbc"]
    assert math.isclose(graftui.WiseRequest().alphas[-1], 1.0)


def test_continual_forget_free_keeps_every_earlier_task_exactly_and_trains_only_new_parts(tiny_multitask, tmp_path,
                                                                                          monkeypatch):
    from graftui import flows, regions
    from graftui.requests import ContinualRequest

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GRAFTUI_FAST", "1")
    res = flows.run(ContinualRequest(base=tiny_multitask["base"], tasks=["movies", "bbc"], sparsity=0.05, steps=2,
                                     examples_per_class=4, n=40, out=str(tmp_path / "regions"), memory="lean",
                                     logit_dtype="float16", checkpoint_every=1)).as_dict()
    for task in ("movies", "bbc"):  # every mask-learning setting the request accepts reaches the regions it learns
        learn = regions.load(res["regions"][task]).meta.learn
        assert (learn["memory"], learn["logit_dtype"], learn["checkpoint_every"], learn["steps"]) == ("lean", "float16", 1, 2)
    ff, seq = res["forget_free"], res["sequential"]
    assert ff[0][1] is None and seq[0][1] is None
    assert ff[1][0] == ff[0][0] and res["forgetting"]["forget-free"][0] == 0.0  # by construction, bit for bit
    assert res["forgetting"]["sequential"][0] == seq[0][0] - seq[1][0]
    gammas = [regions.load(res["regions"][t]).indices for t in ("movies", "bbc")]
    assert res["trained"]["forget-free"] == [method.region_size(gammas[0]),
                                             method.region_size(experiments.new_part(gammas[1], gammas[:1]))]
    assert res["trained"]["sequential"][0] == regions.load(res["regions"]["movies"]).graftable
    assert len(res["finetuned_accuracy"]) == 2 and all(0 <= a <= 1 for a in res["finetuned_accuracy"])
    paired = {(d["a"], d["b"], d["task"]): d for d in res["differences"]}
    for stage, done in ((0, ["movies"]), (1, ["movies", "bbc"])):  # the two arms after each stage, on each task
        after = ("movies", "bbc")[stage]
        for j, task in enumerate(done):
            d = paired[(f"forget-free after {after}", f"sequential after {after}", task)]
            assert d["diff"] == pytest.approx(ff[stage][j] - seq[stage][j]) and d["stage"] == stage + 1
    kept = paired[("forget-free after movies", "forget-free after bbc", "movies")]  # forgetting, paired
    assert kept["diff"] == 0 and kept["ci"] == [0.0, 0.0] and kept["forgetting"] == "forget-free"
    lost = paired[("sequential after movies", "sequential after bbc", "movies")]
    assert lost["diff"] == pytest.approx(res["forgetting"]["sequential"][0])
    ece = res["ece"]
    assert ece["forget-free"][0][1] is None and ece["forget-free"][1][0] == ece["forget-free"][0][0]  # the same model
    card = res["card"]
    assert card[0] == (f"After the last stage (bbc): forget-free movies {100 * ff[1][0]:.1f} %, bbc {100 * ff[1][1]:.1f} %; "
                       f"sequential fine-tuning movies {100 * seq[1][0]:.1f} %, bbc {100 * seq[1][1]:.1f} %.")
    assert card[1].startswith("On movies, forget-free − sequential after the last stage: ")
    assert "forget-free movies +0.0 pts" in card[2] and card[3].startswith("ECE after the last stage: forget-free movies")
    # replicates over the mask seed: seed 0's figures are the single run's, each figure the mean over the seeds
    both = flows.run(ContinualRequest(base=tiny_multitask["base"], tasks=["movies", "bbc"], sparsity=0.05, steps=2,
                                      examples_per_class=4, n=40, out=str(tmp_path / "seeds"), memory="lean",
                                      logit_dtype="float16", checkpoint_every=1, seeds=[0, 1])).as_dict()
    assert [Path(both["per_seed"][i]["regions"]["bbc"]).parent.name for i in (0, 1)] == ["seed0", "seed1"]
    assert both["per_seed"][0]["forget_free"] == ff and both["per_seed"][0]["sequential"] == seq
    other = both["per_seed"][1]["forget_free"]
    assert both["forget_free"][1][1] == pytest.approx((ff[1][1] + other[1][1]) / 2) and both["forget_free"][0][1] is None
    assert both["finetuned_accuracy"] == res["finetuned_accuracy"]  # the independent fine-tunes are the same
    assert both["spread"]["sequential"][0][0] == 0.0  # no region in the sequential arm; the same test examples
    assert "mean over mask seeds 0, 1" in both["card"][-1]


def test_fine_tuning_with_a_frozen_head_keeps_the_new_head_at_its_initialisation(tiny_multitask, tmp_path):
    from safetensors.torch import load_file

    from graftui import training
    from graftui.tasks.classification.data import load_task
    from graftui.models import load_classifier
    from graftui.requests import FinetuneConfig

    movies = load_task("movies")
    recipe = FinetuneConfig(lr=0.05, epochs=1, train_examples=32, batch_size=16, freeze_head=True, seed=3)
    out = training.finetune(tiny_multitask["base"], movies, recipe, tmp_path / "fixhead")
    torch.manual_seed(3)
    init, _ = load_classifier(tiny_multitask["base"], label_names=movies.label_names)
    saved = load_file(str(out / "model.safetensors"))
    assert torch.equal(saved["classifier.weight"], init.classifier.weight) and torch.equal(saved["classifier.bias"], init.classifier.bias)
    moved = [n for n, p in init.named_parameters() if n.startswith("bert.encoder") and not torch.equal(saved[n], p)]
    assert moved  # the body did train
    free = training.finetune(tiny_multitask["base"], movies, FinetuneConfig(lr=0.05, epochs=1, train_examples=32, batch_size=16,
                                                                            seed=3), tmp_path / "free")
    assert not torch.equal(load_file(str(free / "model.safetensors"))["classifier.weight"], init.classifier.weight)


def test_the_l1_penalty_adds_lambda_sign_of_the_movement_to_the_gradient():
    """λ·Σ|θ − θ_pre| contributes λ·sign(θ − θ_pre) per parameter, summed, not averaged over the parameters."""
    from graftui.training import l1_pull

    anchor = torch.tensor([0.0, 1.0, 2.0, 3.0])
    theta = torch.tensor([0.5, 1.0, 1.0, 3.25], requires_grad=True)
    theta.grad = torch.tensor([0.1, 0.2, 0.3, 0.4])
    untouched = torch.zeros(3, requires_grad=True)  # no gradient yet: gets the pull alone
    l1_pull([(theta, anchor), (untouched, torch.ones(3))], 0.01)
    assert torch.allclose(theta.grad, torch.tensor([0.11, 0.2, 0.29, 0.41]))
    assert torch.equal(untouched.grad, torch.full((3,), -0.01))
    assert torch.equal(theta.detach(), torch.tensor([0.5, 1.0, 1.0, 3.25]))


def test_adamw_with_l1_keeps_the_body_near_the_base_but_lets_the_new_head_train(tiny_multitask, tmp_path):
    from pathlib import Path

    from safetensors.torch import load_file

    from graftui import training
    from graftui.tasks.classification.data import load_task
    from graftui.models import load_classifier
    from graftui.requests import FinetuneConfig

    movies = load_task("movies")
    base = load_file(str(Path(tiny_multitask["base"]) / "model.safetensors"))
    torch.manual_seed(3)
    head = load_classifier(tiny_multitask["base"], label_names=movies.label_names)[0].classifier.weight.detach()
    moved = {}
    for l1 in (0.0, 1.0):
        recipe = FinetuneConfig(optimizer="adamw", lr=1e-2, epochs=2, train_examples=128, batch_size=16, l1=l1, seed=3)
        out = load_file(str(training.finetune(tiny_multitask["base"], movies, recipe, tmp_path / f"l1-{l1:g}") / "model.safetensors"))
        body = [n for n in out if n.startswith("bert.encoder")]
        moved[l1] = sum(float((out[n] - base[n.removeprefix("bert.")]).abs().sum()) for n in body) / sum(out[n].numel() for n in body)
        moved[f"head-{l1:g}"] = float((out["classifier.weight"] - head).abs().mean())
    # a λ far above the task gradient pins the body within about one AdamW step (lr) of θ_pre
    assert moved[1.0] < 0.25 * moved[0.0] and moved[1.0] < 1e-2
    # the new head is not pulled toward an initialisation it has no reason to keep
    assert moved["head-1"] > 0.5 * moved["head-0"] > 0
