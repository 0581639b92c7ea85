"""The learner chooses itself: candidates by the method's own gradient, growth, the memory plan, and no raw
out-of-memory — on tiny pairs built here (a linear classifier fine-tuned with AdamW, the tiny BERT)."""

from __future__ import annotations

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


def test_a_small_memory_budget_picks_the_candidate_learner_and_says_so(monkeypatch):
    model, params, pre, ft = tiny()
    sample = next(iter(random_batches()(0)))
    free = learning.plan(model, params, pre, ft, 50, LearnConfig(), sample).full_bytes * 4  # the full learner just fits
    monkeypatch.setattr(compute, "free_memory", lambda device: free)
    assert learning.plan(model, params, pre, ft, 50, LearnConfig(), sample).learner == "full"
    monkeypatch.setattr(compute, "free_memory", lambda device: free - 4)
    lines = []
    details = {}
    region, _ = learning.learn_region(model, params, pre, ft, 50, random_batches(), LearnConfig(steps=3),
                                      announce=lines.append, details=details)
    graftable = sum(p.numel() for p in params.values())
    assert len(lines) == 1 and lines[0].startswith(f"mask learning: candidate learner, C = 250 of {graftable:,} (c = 5, "
                                                   "ranked by gradient, grows to 300; the full learner's ")
    assert "would not fit in a quarter of the" in lines[0] and "expected peak" in lines[0] and "model sizes" in lines[0]
    assert details["plan"]["learner"] == details["learner"] == "candidate" and details["plan"]["free_bytes"] == free - 4
    assert sum(i.numel() for i in region.values()) == 50


def test_the_full_learner_is_taken_only_where_its_state_and_a_steps_activations_fit(monkeypatch):
    """The full learner keeps a step's activations beside its logits: where its state alone fits in a quarter of the
    free memory but not with them, the candidate learner runs (a 330 M pair on 24 GB flipped between the two with
    the page cache, and the full learner's run peaked at 7.7 model sizes)."""
    model, params, pre, ft = tiny()
    sample = next(iter(random_batches()(0)))
    measured = learning.plan(model, params, pre, ft, 50, LearnConfig(), sample)
    state = learning.plan(model, params, pre, ft, 50, LearnConfig()).full_bytes  # no sample: no activations known
    assert measured.activation_bytes > 0 and measured.full_bytes == state + measured.activation_bytes
    monkeypatch.setattr(compute, "free_memory", lambda device: 4 * state)  # the state alone just fits
    chosen = learning.plan(model, params, pre, ft, 50, LearnConfig(), sample)
    assert chosen.learner == "candidate"
    assert "the full learner's" in chosen.describe() and "with a step's activations would not fit" in chosen.describe()
    monkeypatch.setattr(compute, "free_memory", lambda device: 4 * measured.full_bytes)
    full = learning.plan(model, params, pre, ft, 50, LearnConfig(), sample)
    assert full.learner == "full" and full.peak > (full.model_bytes + full.state_bytes) / full.model_bytes


def test_the_plan_lowers_c_to_what_fits_and_refuses_what_cannot_fit_before_any_work(monkeypatch):
    model, params, pre, ft = tiny()
    k = 50
    per_two = learning.plan(model, params, pre, ft, k, LearnConfig(candidates="2")).state_bytes  # C = 2k, room 3k
    monkeypatch.setattr(compute, "free_memory", lambda device: 4 * per_two)  # the quarter holds c = 2, not 5
    fitted = learning.plan(model, params, pre, ft, k, LearnConfig())
    assert fitted.learner == "candidate" and fitted.factor == 2 and fitted.count == 100
    monkeypatch.setattr(compute, "free_memory", lambda device: 10)
    steps = []
    for config, words in ((LearnConfig(), "mask learning cannot fit on cpu: C = 50 candidates (c = 1) take"),
                          (LearnConfig(candidates="3"), "mask learning cannot fit on cpu: C = 150 candidates (c = 3) "
                                                        "take"),
                          (LearnConfig(candidates="all"), "--candidates all cannot fit: a region logit per graftable "
                                                          "parameter takes")):
        with pytest.raises(ModelError) as err:
            learning.learn_region(model, params, pre, ft, k, random_batches(), config, progress=steps.append)
        assert str(err.value).startswith(words) and "\n" not in str(err.value)
    assert steps == []  # refused before the first step


def test_the_lean_learner_recomputes_activations_only_where_they_are_large(monkeypatch):
    """A step's activations, measured on one row, above a quarter of the model: every layer recomputed."""
    pair, _, _ = make_tiny_pair()
    params = {n: pair.param(n) for n in pair.graftable}
    batch = next(iter(random_batches()(0)))
    config = LearnConfig(candidates="5")
    the_plan = learning.plan(pair.model, params, pair.pre, pair.ft, 50, config, batch)
    assert the_plan.layers == 2 and the_plan.activation_bytes > 0
    big = 4 * the_plan.activation_bytes > the_plan.model_bytes
    assert the_plan.checkpoint_every == (1 if big else 0)
    monkeypatch.setattr(compute, "saved_activations", lambda *a: the_plan.model_bytes)  # as large as the model
    assert learning.plan(pair.model, params, pair.pre, pair.ft, 50, config, batch).checkpoint_every == 1
    assert learning.plan(pair.model, params, pair.pre, pair.ft, 50, LearnConfig(candidates="5", checkpoint_every=0),
                         batch).checkpoint_every == 0  # asked: kept
    assert learning.plan(pair.model, params, pair.pre, pair.ft, 50, LearnConfig(), batch).checkpoint_every == 0  # full


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
    assert line.endswith("try --candidates 2.5, --logit-dtype bfloat16, a smaller --batch-size")
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
    code, _, err = run_cli(*localize_args(tiny_folders, tmp_path / "full.safetensors"))
    assert code == 0 and "mask learning:" not in err  # the default fits here: nothing worth a line before the work
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
    code, stdout, err = run_cli(*localize_args(tiny_folders, out))
    line, = err.strip().splitlines()  # a full learner with every activation kept is not worth a line: only the error
    assert (code, stdout) == (2, ""), err
    assert line.startswith("graftui: error: mask learning ran out of memory on cpu: it asked for 9.00 GB more with ")
    assert line.endswith("try --candidates 5 (C = 5·k instead of a logit per parameter)") and not out.exists()
