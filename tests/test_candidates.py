"""Candidate-restricted mask learning (``LearnConfig.candidates``) and the streamed baselines, on tiny pairs.

ℓ is kept only over C: γ_base and the parameters the first step's gradient (or, with ``rank="movement"``, the
movement) ranks next, grown as the learner goes: the same region as the full learner when C holds every parameter
that moved, and memory for C rather than for the model.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import make_tiny_pair, random_batches
from graftui import candidates as cand
from graftui import learning, method
from graftui.config import Budget, LearnConfig
from graftui.errors import RequestError
from graftui.localizers import run_method

K = 50


def partly_moved_pair():
    """A tiny pair where fine-tuning moved only some parameters: every third tensor not at all, the rest in
    about 30% of their coordinates. So C can hold every parameter that moved and still be a strict subset."""
    pair, _, _ = make_tiny_pair()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for i, n in enumerate(pair.graftable):
            keep = torch.zeros(pair.ft[n].shape, dtype=torch.bool) if i % 3 == 0 else \
                torch.rand(pair.ft[n].shape, generator=gen) < 0.3
            pair.ft[n].copy_(torch.where(keep, pair.ft[n], pair.pre[n]))
    return pair


def moved(pair) -> int:
    return sum(int((pair.ft[n] != pair.pre[n]).sum()) for n in pair.graftable)


def params_of(pair):
    return {n: pair.param(n) for n in pair.graftable}


def flat_outside(learner, name) -> torch.Tensor:
    """Positions of tensor ``name`` outside C."""
    outside = torch.ones(learner.params[name].numel(), dtype=torch.bool)
    if name in learner.candidates:
        outside[learner.candidates[name].cpu()] = False
    return outside


def candidate_learner(pair_or_model, k, config, start=None, params=None, pre=None, ft=None, batches=None):
    """The candidate learner a config with a factor c asks for, as ``learn_region`` builds it."""
    if params is None:
        pair = pair_or_model
        model, params, pre, ft = pair.model, params_of(pair), pair.pre, pair.ft
    else:
        model = pair_or_model
    the_plan = learning.plan(model, params, pre, ft, k, config)
    assert the_plan.learner == "candidate"
    return learning.make_learner(the_plan, model, params, pre, ft, k, config, start,
                                 (batches or random_batches())(0))


def same_region(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("optimizer, forward", [("normalized", "relaxed"), ("adam", "relaxed"), ("normalized", "hard")])
def test_the_region_is_the_full_learners_when_c_holds_every_parameter_that_moved(optimizer, forward):
    """Outside C, δ = 0: ∇_ℓ = 0 there and θ = θ_pre whatever ℓ is, so the full learner's steps are the restricted
    one's. The losses agree to float32 rounding only: a CPU σ of a gathered vector may differ from the same element's σ
    in the whole tensor in the last bit (vectorised and scalar tails), and the RMS is summed in another order."""
    pair = partly_moved_pair()
    params = params_of(pair)
    factor = moved(pair) / K  # ⌈c·k⌉ = every moved parameter, and a few that did not move (ties, earliest first)
    runs = {}
    for candidates in ("all", f"{factor:.4f}"):
        reports = []
        config = LearnConfig(steps=5, lr=1.0, optimizer=optimizer, forward=forward, candidates=candidates,
                             rank="movement")  # C holds every moved parameter, ranked by |δ|
        region, logits = learning.learn_region(pair.model, params, pair.pre, pair.ft, K, random_batches(), config,
                                             progress=reports.append)
        runs[candidates] = region, logits, reports
    (full, _, full_reports), (restricted, logits, reports) = runs.values()
    assert isinstance(logits, cand.CandidateLogits)
    c_size = method.region_size(logits.candidates)
    assert moved(pair) <= c_size < pair.counts()["graftable"]  # a strict subset holding everything that moved
    assert same_region(restricted, full)
    assert [(r.step, r.region_size, r.swapped) for r in reports] == [(r.step, r.region_size, r.swapped)
                                                                     for r in full_reports]
    assert [r.loss for r in reports] == pytest.approx([r.loss for r in full_reports], rel=1e-6, abs=0)
    assert any(r.swapped for r in reports)  # the steps did change the region


def test_the_first_step_over_c_is_the_full_learners_with_the_gradient_outside_c_in_its_norm():
    """The full learner's normalized step divides by the RMS of ∇_ℓ L over every graftable parameter. Over C alone
    that norm is smaller the more of the gradient lies outside C, and the step longer. So before its first step the
    candidate learner measures the gradient outside C on that batch: its first step over C is then the full
    learner's, where every parameter moved and C holds 3·k of them."""
    pair, _, _ = make_tiny_pair()
    params = params_of(pair)
    found = {}
    for candidates in ("all", "3"):
        config = LearnConfig(steps=1, lr=0.5, candidates=candidates, grow_every=0)
        found[candidates] = learning.learn_region(pair.model, params, pair.pre, pair.ft, K, random_batches(), config)
    (_, full), (_, logits) = found.values()
    assert 0 < method.region_size(logits.candidates) < moved(pair)  # much of what moved lies outside C
    inside = outside = 0.0
    for n, idx in logits.candidates.items():
        mine, theirs = logits.values[n].cpu(), full[n].reshape(-1)[idx.cpu()]
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
        inside += float((theirs.abs() - 3.0).abs().sum())
    for n in params:
        rest = full[n].reshape(-1)[flat_outside(SimpleNamespace(params=params, candidates=logits.candidates), n)]
        outside += float((rest + 3.0).abs().sum())
    assert inside > 0 and outside > 0  # both learners moved ℓ in C; the full one outside C too


def test_a_factor_past_the_graftable_count_keeps_every_parameter_and_learns_the_full_logits():
    pair, _, _ = make_tiny_pair()
    params = params_of(pair)
    graftable = pair.counts()["graftable"]
    assert learning.candidate_count(1000, K, graftable) == graftable
    assert learning.candidate_count(1.1, 10, graftable) == 11  # ⌈c·k⌉, not one more for rounding
    found = {}
    for candidates in ("all", "1000"):
        config = LearnConfig(steps=4, lr=0.5, candidates=candidates)
        found[candidates] = learning.learn_region(pair.model, params, pair.pre, pair.ft, K, random_batches(), config)
    (full, full_logits), (region, logits) = found.values()
    assert method.region_size(logits.candidates) == graftable
    assert same_region(region, full)
    # the same maths, but over one buffer, not tensor by tensor: σ vectorises other positions (the last bit may
    # differ) and the "rms" scale sums ∇² in one pass; four steps keep that within a few parts in a million
    for n in params:
        torch.testing.assert_close(logits[n], full_logits[n], rtol=1e-5, atol=1e-5)


def test_the_region_is_exactly_k_inside_c_and_c_holds_the_start():
    pair = partly_moved_pair()
    params = params_of(pair)
    unmoved = {pair.graftable[0]: torch.tensor([0, 5, 7])}  # in a tensor that did not move: not top-movement
    for start, k in ((None, K), (None, moved(pair) + 5), (unmoved, 3)):  # k past the moved: γ_base takes ties of 0
        learner = candidate_learner(pair, k, LearnConfig(candidates="2"), start)
        assert isinstance(learner, cand.CandidateLearner)
        m = math.ceil(2 * k)
        assert m <= method.region_size(learner.candidates) <= learner.room == m + k  # grown by one budget at most
        base = method.base_region(pair.pre, pair.ft, pair.graftable, k) if start is None else start
        assert same_region(learner.base, base)  # γ_base found inside C is the top-k of all |δ|
        for n, idx in base.items():
            assert bool(torch.isin(idx, learner.candidates[n].cpu()).all()), n  # γ_base ⊆ C
        for batch in random_batches()(0):
            learner.step(batch)
        region = learner.finish()
        assert method.region_size(region) == k
        for n, idx in region.items():
            c = learner.candidates[n].cpu()
            assert bool(torch.isin(idx, c).all()) and bool((idx[1:] > idx[:-1]).all()) and idx.dtype == torch.int64
    rounded = learning.learn_region(pair.model, params, pair.pre, pair.ft, K, random_batches(),
                                  LearnConfig(steps=3, lr=2.0, candidates="2", binarise="round"))[0]
    assert method.region_size(rounded) <= K


@pytest.mark.parametrize("forward", ["relaxed", "hard"])
def test_only_candidate_tensors_take_gradients_and_the_model_stays_at_the_start_outside_c(forward):
    """Outside C the working model holds the relaxation's start, lerp(θ_pre, θ_ft, σ(−bias)), as the full learner's
    first forward pass grafts it (θ_pre for a hard forward pass); finish puts θ_pre back everywhere."""
    pair = partly_moved_pair()
    params = params_of(pair)
    before = {n: p.detach().clone() for n, p in pair.model.named_parameters()}
    flags = {n: p.requires_grad for n, p in pair.model.named_parameters()}
    learner = candidate_learner(pair, K, LearnConfig(lr=1.0, candidates="2", forward=forward, grow_every=0))
    assert set(learner.candidates) < set(params)  # some tensors hold no candidate
    weight = torch.sigmoid(torch.tensor(-3.0)).item() if forward == "relaxed" else 0.0
    seen = []
    handle = pair.model.register_forward_pre_hook(
        lambda *_: seen.append({n for n, p in pair.model.named_parameters() if p.requires_grad}))
    try:
        for batch in random_batches()(0):
            learner.step(batch)
            assert all(p.grad is None for p in pair.model.parameters())  # consumed in the hook, never made elsewhere
            for n in params:
                outside = flat_outside(learner, n)
                start = torch.lerp(pair.pre[n], pair.ft[n], torch.full_like(pair.pre[n], weight)).reshape(-1)
                assert torch.equal(params[n].detach().reshape(-1)[outside], start[outside]), n
    finally:
        handle.remove()
    whole = [i for i, s in enumerate(seen) if s != set(learner.candidates)]
    assert whole == [0]  # one pass over every tensor, before the first step: the size of the logit gradient outside
    # C, which the full learner's step divides by
    assert seen[0] == set(params)
    assert any(not torch.equal(params[n].detach(), pair.pre[n]) for n in learner.candidates)  # C was written
    learner.finish()
    for n, p in pair.model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
        assert p.requires_grad == flags[n]


def _held_tensors(value, seen=None):
    """Every tensor reachable through dicts, lists, tuples and plain objects, once each."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, type)) and \
            type(value).__module__.startswith("graftui"):
        items = vars(value).values()
    else:
        return []
    return [t for item in items for t in _held_tensors(item, seen)]


@pytest.mark.parametrize("optimizer", ["normalized", "adam"])
def test_the_learner_holds_memory_for_c_not_for_the_model(optimizer):
    pair = partly_moved_pair()
    params = params_of(pair)
    learner = candidate_learner(pair, 20, LearnConfig(candidates="3", optimizer=optimizer, memory="fast", grow_every=0))
    for batch in random_batches()(0):
        learner.step(batch)
    c = method.region_size(learner.candidates)
    graftable = pair.counts()["graftable"]
    assert c == 60 and learner.held is None
    shared = {"model", "params", "pre", "ft"}  # the caller's: the working model and the two parameter sets
    held = _held_tensors({a: v for a, v in vars(learner).items() if a not in shared})
    assert held and all(t.numel() <= c for t in held)  # no tensor of a parameter's full size
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() // t.element_size() for t in held}
    assert sum(storages.values()) <= 13 * c < graftable  # O(|C|): indices, ℓ, θ_pre, θ_ft, ∇, θ[C], three scratch
    # buffers (σ, δ, Adam's denominator), Adam's moments and the start
    keyed = [getattr(learner, a) for a in ("logits", "pre_c", "ft_c", "grads_c", "value_c")]
    assert all(set(d) == set(learner.candidates) for d in keyed)  # nothing for a tensor without candidates
    if learner.adam is not None:  # Adam's moments: one buffer over C per device, as ℓ_C
        assert [m.numel() for m, _ in learner.adam.values()] == [c]
    learner.finish()
    full = learner.full_logits()  # full size only where asked, one tensor at a time
    n = next(n for n in params if n not in learner.candidates)
    assert torch.equal(full[n], torch.full(params[n].shape, -3.0))
    assert method.top_k(full, 20).keys() <= set(learner.candidates)


@pytest.mark.parametrize("value, words", [("0.5", "cannot hold the budget"), ("0", "cannot hold the budget"),
                                          ("abc", "is not a factor"), ("nan", "is not a factor"),
                                          ("-3", "cannot hold the budget")])
def test_candidates_refusals_through_the_request(value, words):
    from graftui.requests import LocalizeRequest

    with pytest.raises(RequestError) as err:
        LocalizeRequest.make(candidates=value).validate()
    text = str(err.value)
    assert "\n" not in text and text.startswith((f"--candidates {value} ", f"--candidates '{value}' "))
    assert words in text and "give 'auto', 'all' or a factor c ≥ 1" in text
    pair, _, _ = make_tiny_pair()
    with pytest.raises(ValueError, match="--candidates"):  # the learner refuses it too, before any work
        learning.plan(pair.model, params_of(pair), pair.pre, pair.ft, 10, LearnConfig(candidates=value))


def test_candidates_reach_the_learner_through_the_request_and_the_registry():
    from graftui.requests import LocalizeRequest

    assert LocalizeRequest.make().learn_config().candidates == LearnConfig().candidates == "auto"  # see docs/method.md
    assert LocalizeRequest.make(candidates="4").validate().learn_config().candidates == "4"
    assert LocalizeRequest.make(candidates=" ALL ").validate().learn_config().candidates == "all"
    assert "candidates" in LocalizeRequest.help("candidates") or "C" in LocalizeRequest.help("candidates")
    pair, _, _ = make_tiny_pair()
    before = {n: p.detach().clone() for n, p in pair.model.named_parameters()}
    region, k = run_method(pair, Budget(k=K), "learned", make_batches=random_batches(),
                           config=LearnConfig(steps=2, candidates="4"))
    assert method.region_size(region) == k == K
    assert all(torch.equal(p.detach(), before[n]) for n, p in pair.model.named_parameters())


@pytest.mark.parametrize("name", ["random", "magnitude"])
def test_streamed_baselines_are_deterministic_per_seed_and_exactly_k(name):
    pair, _, _ = make_tiny_pair()

    def region(seed):
        return run_method(pair, Budget(k=K), name, config=LearnConfig(seed=seed))[0]

    first = region(3)
    assert method.region_size(first) == K
    assert same_region(first, region(3))
    if name == "random":
        assert not same_region(first, region(4))
    else:
        want = method.top_k({n: pair.ft[n].abs() for n in pair.graftable}, K)  # the materialised ranking
        assert same_region(first, want) and same_region(region(4), want)


def test_random_scores_are_drawn_again_identically_on_every_read(monkeypatch):
    """``top_k`` reads the scores three times: each read of a tensor must draw the same values."""
    from graftui import localizers

    pair, _, _ = make_tiny_pair()
    reads = []
    real = method.top_k

    def reading_twice(scores, k):
        reads.extend([{n: scores[n].clone() for n in scores} for _ in range(2)])
        return real(scores, k)

    monkeypatch.setattr(localizers.method, "top_k", reading_twice)
    localizers.random_region(localizers.MethodContext(pair, K, config=LearnConfig(seed=1)))
    first, again = reads
    assert first.keys() == again.keys() == set(pair.graftable)
    assert all(torch.equal(first[n], again[n]) for n in first)
    same_shape = [n for n in pair.graftable if first[n].shape == first[pair.graftable[1]].shape]
    assert len(same_shape) > 1 and not torch.equal(first[same_shape[0]], first[same_shape[1]])  # a stream per tensor


def test_large_blocks_are_mapped_only_where_memory_is_short(monkeypatch):
    """Mapping every large block spares heap and costs every later step of the process: memory "lean" asks for it,
    "fast" never, and "auto" only when the model takes more than a quarter of the free memory."""
    from graftui import compute

    params = {"w": torch.nn.Parameter(torch.zeros(1000))}  # 4,000 bytes
    assert compute.maps_blocks("lean", params) and not compute.maps_blocks("fast", params)
    monkeypatch.setattr(compute, "free_memory", lambda device: 20_000)
    assert not compute.maps_blocks("auto", params)
    monkeypatch.setattr(compute, "free_memory", lambda device: 15_000)
    assert compute.maps_blocks("auto", params)


class _Mixed(torch.nn.Module):
    """A float32 layer feeding a bfloat16 one, as models that keep some modules in float32 run."""

    def __init__(self):
        super().__init__()
        self.wide, self.narrow = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3).bfloat16()

    def forward(self, x, labels):
        logits = self.narrow(torch.tanh(self.wide(x)).bfloat16()).float()
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(logits, labels), logits=logits)


def test_a_model_keeping_some_tensors_in_float32_learns_over_c_with_each_tensor_in_its_own_dtype():
    """C's buffers on a device take the widest dtype there; each tensor is written and read in its own."""
    torch.manual_seed(0)
    model = _Mixed()
    params = dict(model.named_parameters())
    pre = {n: p.detach().clone() for n, p in params.items()}
    ft = {n: (p + torch.randn_like(p) * torch.rand_like(p).pow(4)).detach() for n, p in pre.items()}
    gen = torch.Generator().manual_seed(1)
    x, labels = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    learner = candidate_learner(model, 10, LearnConfig(steps=3, lr=0.5, candidates="4"), params=params, pre=pre, ft=ft,
                                batches=lambda _: [{"x": x, "labels": labels}])
    assert {t.dtype for t in learner.pre_c.values()} == {torch.float32}  # one buffer, the wider dtype
    reports = [learner.step({"x": x, "labels": labels}) for _ in range(3)]
    assert all(math.isfinite(r.loss) for r in reports) and learner.grads_c["narrow.weight"].abs().sum() > 0
    region = learner.finish()
    assert method.region_size(region) == 10 and "narrow.weight" in learner.candidates
    assert all(params[n].dtype == pre[n].dtype and torch.equal(params[n].data, pre[n]) for n in params)


def test_a_candidate_tensor_the_loss_does_not_reach_gets_a_zero_gradient_not_the_last_steps():
    torch.manual_seed(0)
    model = _Mixed()
    model.idle = torch.nn.Linear(6, 4)  # moved by the fine-tune, never used by the forward pass
    params = dict(model.named_parameters())
    pre = {n: p.detach().clone() for n, p in params.items()}
    ft = {n: (p + torch.randn_like(p) * torch.rand_like(p).pow(4)).detach() for n, p in pre.items()}
    gen = torch.Generator().manual_seed(1)
    batch = {"x": torch.randn(16, 6, generator=gen), "labels": torch.randint(0, 3, (16,), generator=gen)}
    learner = candidate_learner(model, 10, LearnConfig(lr=0.5, candidates="1000"), params=params, pre=pre, ft=ft,
                                batches=lambda _: [batch])
    assert "idle.weight" in learner.candidates
    learner.grads_c["idle.weight"].fill_(7.0)  # what a stale buffer would hold
    before = learner.logits["idle.weight"].clone()
    learner.step(batch)
    assert torch.count_nonzero(learner.grads_c["idle.weight"]) == 0
    assert torch.equal(learner.logits["idle.weight"], before)  # no step where the loss cannot reach
    assert torch.count_nonzero(learner.grads_c["wide.weight"]) > 0


@pytest.mark.parametrize("chunk", [1 << 20, 7, 1000])
def test_a_pools_first_pass_keeps_each_tensors_best_read_whole_or_in_slices(chunk, monkeypatch):
    """A tensor's first entrants are its ``size`` best whether topk reads it whole or a slice at a time (whole, it
    sorts a copy with its indices: 0.78 GB more for a 50 M-value embedding)."""
    from graftui import compute

    monkeypatch.setattr(compute, "CHUNK", chunk)
    score = torch.randperm(5000, generator=torch.Generator().manual_seed(0)).float()
    pool = cand.Pool(300)
    pool.add("w", score.clone())
    assert sorted(pool.index["w"].tolist()) == sorted(torch.topk(score, 300).indices.tolist())
    assert torch.equal(pool.sums["w"], score[pool.index["w"]])
