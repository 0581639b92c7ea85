"""The learner chooses itself: candidates by the method's own gradient, growth, the memory plan, and no raw
out-of-memory — on tiny pairs built here (a linear classifier fine-tuned with AdamW, the tiny BERT)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from cli_util import refused, run_cli
from conftest import MINILM_DIR, make_tiny_bert, make_tiny_pair, random_batches
from graftui import compute, learning, regions
from graftui.candidates import CandidateLearner, Pool
from graftui.config import LearnConfig
from graftui.errors import ModelError

SKILL = [0, 1, 2, 3, 36, 37, 38, 39]  # lin.weight's flat positions of the four features the labels depend on


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(36, 2)

    def forward(self, x, labels):
        logits = self.lin(x)
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(logits, labels), logits=logits)


def adamw_pair():
    """A classifier whose label is a sign of features 0–3, fine-tuned with AdamW (weight decay 0.1). Features 12–35 are
    never on, and their pre-trained weights are 100: weight decay moves them most (δ ≈ 14) while the weights of the
    skill move about 1, so the largest movements miss the skill entirely, as on an AdamW fine-tune of a language
    model (docs/method.md)."""
    torch.manual_seed(0)
    model = Linear()
    with torch.no_grad():
        model.lin.weight.mul_(0.1)
        model.lin.weight[:, 12:] = 100.0 * torch.sign(torch.randn(2, 24))
    pre = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(256, 36)
    x[:, :4] = torch.randn(256, 4, generator=gen)
    labels = ((x[:, 0] + x[:, 1] - x[:, 2] - x[:, 3]) > 0).long()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    for _ in range(30):
        optimizer.zero_grad()
        model(x, labels).loss.backward()
        optimizer.step()
    ft = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(pre[n])

    def batches(epoch):
        order = torch.randperm(256, generator=torch.Generator().manual_seed(epoch))
        for i in range(0, 256, 32):
            yield {"x": x[order[i:i + 32]], "labels": labels[order[i:i + 32]]}

    return model, dict(model.named_parameters()), pre, ft, batches


def learn(config: LearnConfig, k: int = 8):
    model, params, pre, ft, batches = adamw_pair()
    details = {}
    region, _ = learning.learn_region(model, params, pre, ft, k, batches, config, details=details)
    assert all(torch.equal(p.detach(), pre[n]) for n, p in params.items())  # θ_pre back, whatever the learner
    return {n: i.tolist() for n, i in region.items()}, details


def test_the_gradient_ranked_candidates_find_the_full_learners_region_where_the_largest_movements_miss_it():
    full, details = learn(LearnConfig(steps=40, lr=0.5, candidates="all"))
    assert full == {"lin.weight": SKILL} and details["learner"] == "full"
    moved, details = learn(LearnConfig(steps=40, lr=0.5, candidates="3", rank="movement", grow_every=0))
    assert moved["lin.weight"] != SKILL and set(moved["lin.weight"]) <= set(range(12, 36)) | set(range(48, 72))
    ranked, details = learn(LearnConfig(steps=40, lr=0.5, candidates="3"))
    assert ranked == full
    assert details["learner"] == "candidate" and details["rule"] == "gradient" and details["start"] == 24
    assert details["ranked_on"] == LearnConfig().rank_examples == 256  # the whole first epoch of eight batches of 32
    assert details["plan"]["learner"] == "candidate" and details["plan"]["count"] == 24


def test_growth_adds_the_parameters_whose_gradient_dominates_outside_c():
    """C ranked by movement holds only the decayed weights; the growth pass finds the skill's weights outside it
    (their logit gradient is all there is), and they enter the region."""
    region, details = learn(LearnConfig(steps=40, lr=0.5, candidates="3", rank="movement", grow_every=10))
    assert region == {"lin.weight": SKILL}
    assert details["grown"] >= 1 and details["added"] >= len(SKILL) and details["size"] <= details["room"] == 32


def test_growth_keeps_adams_moments_and_the_logits_of_c_where_they_were():
    model, params, pre, ft, batches = adamw_pair()
    config = LearnConfig(steps=40, lr=1.0, optimizer="adam", candidates="3", rank="movement", grow_every=1000)
    the_plan = learning.plan(model, params, pre, ft, 8, config)
    learner = learning.make_learner(the_plan, model, params, pre, ft, 8, config, batches=batches(0))
    for batch in batches(0):
        learner.step(batch)
    before = {n: (i.clone(), learner.logits[n].clone(), learner._adam_views[0][n].clone())
              for n, i in learner.candidates.items()}
    added = learner.grow(next(iter(batches(1))))
    assert added > 0 and learner.size == 24 + added
    for n, (idx, ell, moment) in before.items():
        where = torch.searchsorted(learner.candidates[n], idx)
        assert torch.equal(learner.logits[n][where], ell) and torch.equal(learner._adam_views[0][n][where], moment)
        assert torch.equal(learner.pre_c[n], pre[n].reshape(-1)[learner.candidates[n]])
    learner.step(next(iter(batches(2))))  # the grown buffers take steps
    learner.finish()


def test_an_entrant_in_a_tensor_that_held_no_candidate_takes_gradients_at_the_next_step():
    """``--rank movement`` put C in lin.weight alone; growth admitted parameters of lin.bias, which then stayed frozen
    ("cannot register a hook on a tensor that doesn't require gradient")."""
    model, params, pre, ft, batches = adamw_pair()
    learner = CandidateLearner(model, params, pre, ft, 8, LearnConfig(candidates="2", rank="movement", steps=4),
                               count=16, room=24)
    assert "lin.bias" not in learner.candidates
    batch = next(iter(batches(0)))
    learner.step(batch)
    pool = Pool(2)
    pool.add("lin.bias", torch.tensor([5.0, 4.0]))
    added, _, _ = learner._admit(pool, 1e6)
    assert added == 2 and learner.candidates["lin.bias"].tolist() == [0, 1]
    learner.step(batch)
    assert learner.grads_c["lin.bias"].abs().sum() > 0  # the entrant's gradient reached its logit
    learner.finish()
    assert all(torch.equal(p.detach(), pre[n]) for n, p in params.items())


def test_the_pool_keeps_the_largest_running_sums_in_bounded_memory():
    pool = Pool(3)
    pool.add("a", torch.tensor([5.0, 1.0, 0.0, 4.0]))
    pool.add("b", torch.tensor([3.0, 2.0, 9.0]), barred=torch.tensor([2]))  # 9 may never enter
    assert pool.held() <= 6
    pool.add("a", torch.tensor([1.0, 1.0, 0.0, 1.0]))
    pool.add("b", torch.tensor([0.0, 0.0, 0.0]))
    region, sums = pool.top(3)
    assert {n: i.tolist() for n, i in region.items()} == {"a": [0, 3], "b": [0]}
    assert sums["a"].tolist() == [6.0, 5.0] and sums["b"].tolist() == [3.0]


def tiny():
    pair, _, _ = make_tiny_pair()
    return pair.model, {n: pair.param(n) for n in pair.graftable}, pair.pre, pair.ft


def budgets(model, params, pre, ft, k, sample):
    """Free memory figures under which the plan of two sessions ago took the full learner, took the candidate learner,
    and had no room for a step's activations beside C."""
    full = learning.plan(model, params, pre, ft, k, LearnConfig(candidates="all", memory="fast"), sample)
    everything = full.full_bytes + full.activation_bytes
    candidate = learning.plan(model, params, pre, ft, k, LearnConfig(), sample)
    return {"roomy": 4 * everything, "just short": 4 * everything - 4,
            "tight": 4 * (candidate.state_bytes + candidate.activation_bytes) - 4}


def test_the_same_localization_under_any_memory_budget_writes_the_same_region(monkeypatch):
    """A region belongs to the pair, the task and the settings: where the memory plan once took the full learner and
    where it took the candidate learner, with every layer recomputed or none, the same seed writes the same region, bit
    for bit, with the same logits; only how it ran differs."""
    model, params, pre, ft = tiny()
    sample = next(iter(random_batches()(0)))
    made, lines, plans = {}, {}, {}
    for name, free in budgets(model, params, pre, ft, 50, sample).items():
        monkeypatch.setattr(compute, "free_memory", lambda device, free=free: free)
        said, details = [], {}
        region, logits = learning.learn_region(model, params, pre, ft, 50, random_batches(), LearnConfig(steps=6),
                                               announce=said.append, details=details)
        made[name] = ({n: i.tolist() for n, i in region.items()}, {n: logits[n].clone() for n in logits})
        lines[name], plans[name] = said, details["plan"]
    first = made["roomy"]
    for name, (region, logits) in made.items():
        assert region == first[0], name
        assert all(torch.equal(logits[n], first[1][n]) for n in logits), name
        assert plans[name]["learner"] == "candidate" and plans[name]["count"] == 250, name
        assert len(lines[name]) == 1 and lines[name][0].startswith("mask learning: candidate learner, C = 250 of ")
    assert plans["roomy"]["checkpoint_every"] == 0 and plans["tight"]["checkpoint_every"] == 1  # only how it ran
    assert "every layer recomputed (a step's" in lines["tight"][0] and "recomputed" not in lines["roomy"][0]


def test_the_full_learner_writes_the_same_region_whether_it_keeps_sigma_and_delta_or_not(monkeypatch):
    model, params, pre, ft = tiny()
    config = LearnConfig(steps=4, candidates="all")
    least = learning.plan(model, params, pre, ft, 50, replace(config, memory="lean")).state_bytes
    kept = sum(p.numel() for p in params.values()) * (4 + 4)  # σ(ℓ) and δ in float32
    made = []
    for free in (4 * (least + kept), least):
        monkeypatch.setattr(compute, "free_memory", lambda device, free=free: free)
        details = {}
        region, _ = learning.learn_region(model, params, pre, ft, 50, random_batches(), config, details=details)
        made.append(({n: i.tolist() for n, i in region.items()}, details["plan"]["holds"]))
    assert [holds for _, holds in made] == [True, False]  # σ(ℓ) and δ kept where they have room
    assert made[0][0] == made[1][0]


def llama_of(size: str):
    """A Llama-shaped model of about ``size`` parameters whose weights are allocated and never touched (``to_empty``):
    what the plan reads of a model is its tensors' shapes, dtypes and devices."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {"330m": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24, num_attention_heads=16),
             "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)}[size]
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=32000 if size == "330m" else 100, num_key_value_heads=4,
                                             **shape))
    model.to_empty(device="cpu")
    params = dict(model.named_parameters())
    return model, params


def test_a_tiny_pair_and_a_330m_pair_name_the_same_learner_on_any_machine(monkeypatch):
    chosen = set()
    for size in ("tiny", "330m"):
        model, params = llama_of(size)
        graftable = sum(p.numel() for p in params.values())
        k = max(1, graftable // 1000)
        for free in (64 << 30, 8 << 30, 2 << 30, 400 << 20):  # a roomy server, a laptop, a busy laptop, a phone
            monkeypatch.setattr(compute, "free_memory", lambda device, free=free: free)
            try:
                the_plan = learning.plan(model, params, params, params, k, LearnConfig())
            except ModelError:
                assert size == "330m" and free < 1 << 30  # the one case the request cannot fit: refused, not changed
                continue
            chosen.add((the_plan.learner, the_plan.factor, the_plan.count))
            assert the_plan.count == learning.candidate_count(5, k, graftable)
        if size == "330m":
            assert graftable > 300_000_000
    assert {(learner, factor) for learner, factor, _ in chosen} == {("candidate", 5.0)}


def test_a_request_that_cannot_fit_is_refused_before_any_work_naming_what_would(monkeypatch):
    model, params, pre, ft = tiny()
    k = 50
    per_two = learning.plan(model, params, pre, ft, k, LearnConfig(candidates="2")).state_bytes  # C = 2k, room 3k
    monkeypatch.setattr(compute, "free_memory", lambda device: per_two)  # all of it holds c = 2, not 5
    with pytest.raises(ModelError) as err:
        learning.plan(model, params, pre, ft, k, LearnConfig())
    line = str(err.value)
    assert line.startswith("mask learning cannot fit on cpu: C = 250 candidates (c = 5) take ") and "\n" not in line
    assert "--candidates 2 fits (another region: a smaller C)" in line
    assert learning.plan(model, params, pre, ft, k, LearnConfig(candidates="2")).count == 100  # what it named fits
    monkeypatch.setattr(compute, "free_memory", lambda device: 10)
    steps = []
    for config, words in ((LearnConfig(), "mask learning cannot fit on cpu: C = 250 candidates (c = 5) take"),
                          (LearnConfig(candidates="3"), "mask learning cannot fit on cpu: C = 150 candidates (c = 3) "
                                                        "take"),
                          (LearnConfig(candidates="all"), "--candidates all cannot fit: a region logit per graftable "
                                                          "parameter takes")):
        with pytest.raises(ModelError) as err:
            learning.learn_region(model, params, pre, ft, k, random_batches(), config, progress=steps.append)
        assert str(err.value).startswith(words) and "\n" not in str(err.value)
    assert steps == []  # refused before the first step


def test_activations_are_recomputed_only_where_they_have_no_room_or_memory_lean_asks(monkeypatch):
    """No recomputation where the plan has room (a 135 M pair took 1.4–1.9× the time where it recomputed every layer
    with 14–18 GB free); every layer where a step's activations do not fit in a quarter of the free memory."""
    pair, _, _ = make_tiny_pair()
    params = {n: pair.param(n) for n in pair.graftable}
    batch = next(iter(random_batches()(0)))
    config = LearnConfig(candidates="5")
    the_plan = learning.plan(pair.model, params, pair.pre, pair.ft, 50, config, batch)
    assert the_plan.layers == 2 and the_plan.activation_bytes > 0 and the_plan.checkpoint_every == 0
    monkeypatch.setattr(compute, "free_memory", lambda device: 4 * (the_plan.state_bytes + the_plan.activation_bytes))
    assert learning.plan(pair.model, params, pair.pre, pair.ft, 50, config, batch).checkpoint_every == 0  # just room
    monkeypatch.setattr(compute, "free_memory", lambda device: 4 * (the_plan.state_bytes + the_plan.activation_bytes) - 4)
    assert learning.plan(pair.model, params, pair.pre, pair.ft, 50, config, batch).checkpoint_every == 1
    assert learning.plan(pair.model, params, pair.pre, pair.ft, 50, replace(config, memory="fast"),
                         batch).checkpoint_every == 0  # fast keeps, as asked
    monkeypatch.undo()
    assert learning.plan(pair.model, params, pair.pre, pair.ft, 50, replace(config, memory="lean"),
                         batch).checkpoint_every == 1  # lean recomputes, as asked
    assert learning.plan(pair.model, params, pair.pre, pair.ft, 50, replace(config, memory="lean", checkpoint_every=0),
                         batch).checkpoint_every == 0  # an explicit --checkpoint-every wins


def test_the_learners_read_nothing_of_the_machines_memory():
    """One memory plan, decided once (learning.plan): the paper's maths and the candidate set take it as given."""
    import ast
    from pathlib import Path

    import graftui

    for module in ("method.py", "candidates.py"):
        tree = ast.parse((Path(graftui.__file__).parent / module).read_text())
        called = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}  # compute.<name>
        called |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}  # a name imported from compute
        assert not called & {"fits", "free_memory", "SHARE"}, module
        assert "maps_blocks" not in {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}, module


def test_memory_is_read_by_the_plan_and_the_learners_obey_it(monkeypatch):
    """σ(ℓ) and δ are kept by the full learner where the plan says (room, or --memory fast), never by the learner's
    own look at the machine."""
    model, params, pre, ft = tiny()
    config = LearnConfig(candidates="all", logit_dtype="float16")
    least = learning.plan(model, params, pre, ft, 10, replace(config, memory="lean")).state_bytes
    need = sum(p.numel() for p in params.values()) * (4 + 2)  # δ in float32, σ in float16
    for free, holds in ((4 * (least + need), True), (4 * (least + need) - 4, False), (least, False)):
        monkeypatch.setattr(compute, "free_memory", lambda device, free=free: free)
        assert learning.plan(model, params, pre, ft, 10, config).holds is holds
    assert learning.plan(model, params, pre, ft, 10, replace(config, memory="fast")).holds  # an explicit choice
    assert not learning.plan(model, params, pre, ft, 10, replace(config, memory="lean")).holds
    with pytest.raises(ValueError, match="memory mode"):
        learning.plan(model, params, pre, ft, 10, replace(config, memory="tiny"))


def test_the_saved_activations_scale_with_the_rows_and_leave_the_model_as_it_was():
    pair, _, _ = make_tiny_pair()
    params = {n: pair.param(n) for n in pair.graftable}
    flags = {n: p.requires_grad for n, p in pair.model.named_parameters()}
    batch = next(iter(random_batches(batch_size=8)(0)))
    eight = compute.saved_activations(pair.model, batch, params.values())
    two = compute.saved_activations(pair.model, {key: v[:2] for key, v in batch.items()}, params.values())
    assert eight == 4 * two > 0
    assert compute.saved_activations(pair.model, batch, []) == 0  # no gradient taken: nothing kept
    assert flags == {n: p.requires_grad for n, p in pair.model.named_parameters()}


def test_running_out_of_memory_inside_the_learner_is_one_line_and_leaves_theta_pre(monkeypatch):
    model, params, pre, ft, batches = adamw_pair()

    def exhausted(self, batch, hard_k, need_peak):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 52.00 GiB. GPU 0 has a total capacity of "
                                     "79.19 GiB of which 3.10 GiB is free.")

    monkeypatch.setattr(CandidateLearner, "_gradient", exhausted)
    with pytest.raises(ModelError) as err:
        learning.learn_region(model, params, pre, ft, 8, batches, LearnConfig(candidates="5"))
    line = str(err.value)
    assert "\n" not in line and line.startswith("mask learning ran out of memory on cpu: it asked for 55.83 GB more")
    assert line.endswith("try --memory lean, --logit-dtype bfloat16, a smaller --batch-size; or --candidates 2.5, "
                         "which learns another region")
    assert all(torch.equal(p.detach(), pre[n]) for n, p in params.items())
    assert all(p.requires_grad for p in params.values())  # the flags are the model's again


@pytest.mark.parametrize("error, asked", [(MemoryError(), None),
                                          (RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                                                        "can't allocate memory: you tried to allocate 56000000000 "
                                                        "bytes. Error code 12 (Cannot allocate memory)"), 56000000000),
                                          (RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB"), 2 << 20)])
def test_out_of_memory_errors_are_recognised_with_what_they_asked_for(error, asked):
    assert compute.out_of_memory(error)
    assert compute.asked_bytes(error) == asked
    assert not compute.out_of_memory(RuntimeError("shape mismatch"))


@pytest.fixture
def tiny_folders(tmp_path):
    from transformers import AutoTokenizer

    from conftest import make_tiny_finetuned

    base = make_tiny_bert(vocab_size=30522)  # MiniLM's tokenizer
    for model, name in ((base, "base"), (make_tiny_finetuned(base), "ft")):
        model.save_pretrained(tmp_path / name)
        AutoTokenizer.from_pretrained(MINILM_DIR).save_pretrained(tmp_path / name)
    task = tmp_path / "task.csv"
    task.write_text("text,label\n" + "".join(f"a {'good' if i % 2 else 'bad'} sentence {i},{i % 2}\n"
                                             for i in range(80)))
    return tmp_path / "base", tmp_path / "ft", task


def localize_args(folders, out, *more):
    base, ft, task = folders
    return ["localize", "--base", base, "--finetuned", ft, "--task", task, "--steps", "12", "--check-n", "0",
            "--out", out, *more]


def test_localize_records_its_plan_and_c_and_says_the_plan_first(tiny_folders, tmp_path, monkeypatch):
    out = tmp_path / "region.safetensors"
    code, _, err = run_cli(*localize_args(tiny_folders, out, "--candidates", "3", "--sparsity", "0.01"))
    assert code == 0, err
    assert err.splitlines()[0].startswith("mask learning: candidate learner, C = ")
    meta = regions.load(out).meta
    assert meta.learner["learner"] == "candidate" and meta.learner["rule"] == "gradient"
    assert meta.learner["start"] == meta.learner["plan"]["count"] == 3 * meta.k
    assert meta.learner["grown"] >= 0 and meta.learner["size"] <= meta.learner["room"]
    assert meta.learn["candidates"] == "3" and meta.learn["rank"] == "gradient"
    code, _, err = run_cli(*localize_args(tiny_folders, tmp_path / "auto.safetensors"))
    assert code == 0 and err.splitlines()[0].startswith("mask learning: candidate learner, C = ")  # said always
    assert regions.load(tmp_path / "auto.safetensors").meta.learner["learner"] == "candidate"  # whatever is free
    code, _, err = run_cli(*localize_args(tiny_folders, tmp_path / "full.safetensors", "--candidates", "all"))
    assert code == 0 and err.splitlines()[0].startswith("mask learning: full learner (a logit per graftable parameter")
    assert regions.load(tmp_path / "full.safetensors").meta.learner["learner"] == "full"


@pytest.mark.parametrize("value, line", [
    ("0", "--candidates 0 cannot hold the budget: give 'auto', 'all' or a factor c ≥ 1 (C holds c·k parameters, and "
          "the region's k must fit in it)"),
    ("0.5", "--candidates 0.5 cannot hold the budget: give 'auto', 'all' or a factor c ≥ 1 (C holds c·k parameters, "
            "and the region's k must fit in it)"),
    ("abc", "--candidates 'abc' is not a factor: give 'auto', 'all' or a factor c ≥ 1 (C holds c·k parameters: the "
            "budget and those the gradient ranks next)")])
def test_bad_candidates_are_one_line_before_any_work(tiny_folders, tmp_path, value, line):
    out = tmp_path / "r.safetensors"
    refused(localize_args(tiny_folders, out, "--candidates", value), line)
    assert not out.exists()


def test_a_plan_that_cannot_fit_and_running_out_of_memory_are_one_line_and_write_nothing(tiny_folders, tmp_path,
                                                                                         monkeypatch):
    out = tmp_path / "r.safetensors"
    monkeypatch.setattr(compute, "free_memory", lambda device: 100)
    code, stdout, err = run_cli(*localize_args(tiny_folders, out))
    assert (code, stdout) == (2, "") and len(err.strip().splitlines()) == 1
    assert err.startswith("graftui: error: mask learning cannot fit on cpu: C = ") and not out.exists()
    monkeypatch.undo()

    def exhausted(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9000000000 bytes.")

    monkeypatch.setattr(learning.MaskLearner, "step", exhausted)
    code, stdout, err = run_cli(*localize_args(tiny_folders, out, "--candidates", "all"))
    plan_line, line = err.strip().splitlines()  # the plan's line, then the error
    assert (code, stdout) == (2, ""), err
    assert plan_line.startswith("mask learning: full learner")
    assert line.startswith("graftui: error: mask learning ran out of memory on cpu: it asked for 9.00 GB more with ")
    assert line.endswith("or --candidates 5 (C = 5·k instead of a logit per parameter), which learns another region")
    assert not out.exists()
