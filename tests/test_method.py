"""The method module on tiny models: exact grafts, exact budgets, the mask gradient, learning.

Mask learning here is the paper's as written, a logit for every graftable parameter (``--candidates all``);
tests/test_candidates.py holds the candidate-restricted learner, graftui's default, and its agreement with this one.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch
from torch.func import functional_call

from graftui import compute, learning, method
from graftui.errors import Cancelled
from graftui.method import LearnConfig as _LearnConfig


def LearnConfig(**fields):  # noqa: N802 - the paper's learner unless a test asks for candidates
    return _LearnConfig(**{"candidates": "all", **fields})

from conftest import mask_to_region, random_batches


def test_graft_is_pre_plus_gamma_delta_bit_exactly():
    gen = torch.Generator().manual_seed(0)
    pre = torch.randn(1000, generator=gen)
    ft = pre + torch.randn(1000, generator=gen) * 1e-3
    gamma = torch.rand(1000, generator=gen) < 0.3
    grafted = method.graft(pre, ft, gamma)
    # θ_pre + γ⊙δ in float64 is exact for float32 inputs; rounding it back must give the graft
    reference = (pre.double() + gamma.double() * (ft.double() - pre.double())).float()
    assert torch.equal(grafted, reference)
    assert torch.equal(grafted[gamma], ft[gamma]) and torch.equal(grafted[~gamma], pre[~gamma])


def test_top_k_is_exact_and_deterministic_with_ties():
    scores = {"a": torch.tensor([1.0, 5.0, 5.0, 0.0]), "b": torch.tensor([[5.0, 2.0], [5.0, 3.0]])}
    region = method.top_k(scores, 3)
    assert method.region_size(region) == 3
    # four scores tie at 5.0: the earliest three positions win (a[1], a[2], b[0])
    assert region["a"].tolist() == [1, 2] and region["b"].tolist() == [0]
    assert method.top_k(scores, 3)["b"].tolist() == [0]
    for k in range(0, 9):
        assert method.region_size(method.top_k(scores, k)) == k
    assert method.region_size(method.top_k(scores, 100)) == 8


def test_base_region_is_top_movement(tiny_pair):
    pair, _, _ = tiny_pair
    k = 137
    region = method.base_region(pair.pre, pair.ft, pair.graftable, k)
    assert method.region_size(region) == k
    moves = torch.cat([(pair.ft[n] - pair.pre[n]).abs().reshape(-1) for n in pair.graftable])
    threshold = moves.sort(descending=True).values[k - 1]
    for name, idx in region.items():
        assert bool(((pair.ft[name] - pair.pre[name]).abs().reshape(-1)[idx] >= threshold).all())


def test_relaxation_is_eq2_in_logit_form():
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(100, generator=gen) * 3
    base = torch.rand(100, generator=gen) < 0.5
    eq2 = base.float() * (1 - torch.sigmoid(s)) + (1 - base.float()) * torch.sigmoid(s)
    logit = torch.where(base, -s, s)
    assert torch.allclose(method.relaxed(logit), eq2, atol=1e-7)


def test_initial_logits_start_at_gamma_base():
    base = {"w": torch.tensor([0, 3])}
    logits = method.initial_logits(base, {"w": (2, 2), "v": (3,)}, bias=3.0)
    assert logits["w"].reshape(-1).tolist() == [3.0, -3.0, -3.0, 3.0]
    assert logits["v"].tolist() == [-3.0, -3.0, -3.0]
    region = method.binarise(logits, 2)
    assert list(region) == ["w"] and region["w"].tolist() == [0, 3]


def test_binarise_round_never_exceeds_budget():
    logits = {"w": torch.tensor([2.0, 1.0, -1.0, 0.5])}
    assert method.binarise(logits, 5, "round")["w"].tolist() == [0, 1, 3]
    assert method.binarise(logits, 2, "round")["w"].tolist() == [0, 1]
    with pytest.raises(ValueError):
        method.binarise(logits, 2, "nearest")


@pytest.mark.parametrize("chunk", [None, 37])
def test_logit_gradient_matches_autograd_through_the_relaxation(tiny_pair, monkeypatch, chunk):
    """Also when every element-wise pass goes through the tensors in many slices (odd-sized, with a ragged last one)."""
    if chunk:
        monkeypatch.setattr(compute, "CHUNK", chunk)
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    gen = torch.Generator().manual_seed(3)
    logits = {n: torch.randn(p.shape, generator=gen) for n, p in params.items()}
    batch = next(iter(random_batches()(0)))
    out, grads, (sq, peak) = method.logit_gradient(pair.model, params, pair.pre, pair.ft, logits, batch)
    ours = {n: grads[n].clone() for n in params}
    assert all(params[n].grad is None for n in params)  # consumed as it was made: no full gradient is left

    leaves = {n: l.clone().requires_grad_(True) for n, l in logits.items()}
    theta = {n: pair.pre[n] + torch.sigmoid(leaves[n]) * (pair.ft[n] - pair.pre[n]) for n in params}
    loss = functional_call(pair.model, theta, args=(), kwargs=batch).loss
    grads = torch.autograd.grad(loss, [leaves[n] for n in params])
    assert torch.allclose(loss, out.loss, atol=1e-6)
    for n, g in zip(params, grads):
        assert torch.allclose(ours[n], g, rtol=1e-4, atol=1e-9), n
    assert float(sq) == pytest.approx(sum(float(g.double().pow(2).sum()) for g in grads), rel=1e-4)
    assert float(peak) == pytest.approx(max(float(g.abs().max()) for g in grads), rel=1e-4)


def test_no_full_gradient_is_held_during_the_backward_pass(tiny_pair):
    """Each tensor's gradient is turned into ∇_ℓ and dropped as soon as it is complete (memory)."""
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    logits = method.initial_logits({}, {n: tuple(p.shape) for n, p in params.items()}, bias=3.0)
    alive = []
    # registered first, so each fires before graftui's own hook consumes that tensor's gradient
    hooks = [p.register_post_accumulate_grad_hook(lambda _: alive.append(sum(q.grad is not None for q in params.values())))
             for p in params.values()]
    try:
        method.logit_gradient(pair.model, params, pair.pre, pair.ft, logits, next(iter(random_batches()(0))))
    finally:
        for h in hooks:
            h.remove()
    assert len(alive) == len(params) and max(alive) == 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_logits_keep_the_budget_and_find_nearly_the_same_region(tiny_pair, dtype):
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    before = {n: p.detach().clone() for n, p in params.items()}
    found = {}
    for logit_dtype in ("float32", dtype):
        config = LearnConfig(steps=5, lr=0.5, logit_dtype=logit_dtype)
        found[logit_dtype], logits = learning.learn_region(pair.model, params, pair.pre, pair.ft, 200, random_batches(), config)
        assert all(l.dtype == getattr(torch, logit_dtype) for l in logits.values())
        assert method.region_size(found[logit_dtype]) == 200
    assert all(torch.equal(params[n].detach(), before[n]) for n in params)
    shared = sum(len(set(found["float32"].get(n, torch.tensor([])).tolist()) & set(i.tolist())) for n, i in found[dtype].items())
    assert shared >= 0.8 * 200  # the steps are far larger than 16-bit rounding
    with pytest.raises(ValueError, match="logit dtype"):
        method.MaskLearner(pair.model, params, pair.pre, pair.ft, 10, LearnConfig(logit_dtype="int8"))


@pytest.mark.parametrize("optimizer, forward", [("normalized", "relaxed"), ("adam", "relaxed"), ("sgd", "relaxed"), ("normalized", "hard")])
def test_learn_region_keeps_budget_and_restores_the_model(tiny_pair, optimizer, forward):
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    before = {n: p.detach().clone() for n, p in pair.model.named_parameters()}
    flags = {n: p.requires_grad for n, p in pair.model.named_parameters()}
    reports = []
    config = LearnConfig(steps=5, optimizer=optimizer, lr=1.0 if optimizer != "sgd" else 1e3, forward=forward)
    region, logits = learning.learn_region(
        pair.model, params, pair.pre, pair.ft, 50, random_batches(), config, progress=reports.append
    )
    assert method.region_size(region) == 50
    assert [r.step for r in reports] == [1, 2, 3, 4, 5]
    assert all(r.loss > 0 for r in reports)
    for n, p in pair.model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
        assert p.requires_grad == flags[n]
    if optimizer == "normalized":
        base = method.base_region(pair.pre, pair.ft, pair.graftable, 50)
        moved = sum(int((logits[n].reshape(-1)[i] != 3.0).sum()) for n, i in base.items())
        assert moved > 0  # the mask did learn something


@pytest.mark.parametrize("chunk", [None, 37])
def test_step_reports_count_the_region_and_an_uncounted_step_learns_the_same(tiny_pair, monkeypatch, chunk):
    """region_size = #{ℓ > 0} and swapped = those outside γ_base; count_region=False changes only the report."""
    if chunk:  # the count goes through the logits' buffer in slices
        monkeypatch.setattr(compute, "CHUNK", chunk)
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    batch = next(iter(random_batches()(0)))
    final = {}
    for count in (True, False):
        learner = method.MaskLearner(pair.model, params, pair.pre, pair.ft, 50, LearnConfig(lr=2.0))
        for _ in range(3):
            report = learner.step(batch, count_region=count)
        learner.finish()
        final[count] = learner.logits
        if count:
            positive = {n: (l.reshape(-1) > 0).nonzero().squeeze(1) for n, l in learner.logits.items()}
            size = sum(int(i.numel()) for i in positive.values())
            inside = sum(int(torch.isin(positive[n], i).sum()) for n, i in learner.base.items())
            assert report.region_size == size and report.swapped == size - inside
            assert report.swapped > 0  # a step of 2.0 moves some of the region out of γ_base
        else:
            assert report.region_size is None and report.swapped is None
    assert all(torch.equal(final[True][n], final[False][n]) for n in final[True])
    reports, config = [], LearnConfig(steps=3, lr=2.0)  # learn_region counts exactly when someone is told
    shown, _ = learning.learn_region(pair.model, params, pair.pre, pair.ft, 50, random_batches(), config, progress=reports.append)
    silent, _ = learning.learn_region(pair.model, params, pair.pre, pair.ft, 50, random_batches(), config)
    assert [type(r.region_size) for r in reports] == [int] * 3
    assert shown.keys() == silent.keys() and all(torch.equal(shown[n], silent[n]) for n in shown)


def test_learned_region_lowers_the_task_loss(tiny_pair):
    """On data the fine-tuned model fits, learning should beat γ_base at the same k."""
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    data = random_batches(n_batches=2, batch_size=16)
    region, _ = learning.learn_region(pair.model, params, pair.pre, pair.ft, 200, data, LearnConfig(steps=30, lr=0.5))
    base = method.base_region(pair.pre, pair.ft, pair.graftable, 200)

    def loss(r):
        with torch.no_grad(), pair.grafted(r) as model:
            return sum(float(model(**b).loss) for b in data(0))

    assert loss(region) < loss(base)


def test_cancel_stops_and_restores(tiny_pair):
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    before = {n: p.detach().clone() for n, p in params.items()}
    cancel = threading.Event()
    steps = []

    def progress(report):
        steps.append(report.step)
        if report.step == 2:
            cancel.set()

    with pytest.raises(Cancelled):
        learning.learn_region(pair.model, params, pair.pre, pair.ft, 10, random_batches(), LearnConfig(steps=10), progress, cancel)
    assert steps == [1, 2]
    assert all(torch.equal(params[n].detach(), before[n]) for n in params)


def test_region_mask_round_trip():
    region = {"a": torch.tensor([0, 5]), "b": torch.tensor([1])}
    shapes = {"a": (2, 3), "b": (4,), "c": (2,)}
    masks = method.region_to_mask(region, shapes)
    assert masks["a"].shape == (2, 3) and int(masks["c"].sum()) == 0
    back = mask_to_region(masks)
    assert set(back) == {"a", "b"} and back["a"].tolist() == [0, 5] and back["b"].tolist() == [1]


@pytest.mark.parametrize("chunk", [1 << 20, 4])
def test_top_k_equals_the_whole_sort_ties_included(chunk, monkeypatch):
    """However often the candidate pool is cut back (small k: at every tensor or slice; large k: never), and whether
    a tensor is read whole or a few values at a time, the region is exact."""
    from graftui import compute

    monkeypatch.setattr(compute, "CHUNK", chunk)
    gen = torch.Generator().manual_seed(3)

    def reference(scores, k):  # one sort of everything; ties to the earliest positions
        names = list(scores)
        flat = torch.cat([scores[n].reshape(-1) for n in names])
        order = sorted(range(flat.numel()), key=lambda i: (-float(flat[i]), i))[:k]
        chosen = torch.zeros(flat.numel(), dtype=torch.bool)
        chosen[order] = True
        out, start = {}, 0
        for n in names:
            idx = chosen[start:start + scores[n].numel()].nonzero().squeeze(1)
            if idx.numel():
                out[n] = idx
            start += scores[n].numel()
        return out

    for trial in range(6):
        scores = {f"t{i}": torch.randint(0, 6, (7 + i, 5), generator=gen).float() for i in range(4)}  # many ties
        for k in (1, 3, 9, 40, 150, 500):
            got, want = method.top_k(scores, k), reference(scores, k)
            assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in got), (trial, k)
    pre = {n: torch.zeros_like(t) for n, t in scores.items()}
    assert {n: i.tolist() for n, i in method.base_region(pre, scores, list(scores), 9).items()} == \
        {n: i.tolist() for n, i in reference(scores, 9).items()}


@pytest.mark.e2e
@pytest.mark.parametrize("candidates", ["all", "3"])
def test_data_parallel_mask_learning_gives_the_single_process_region(tmp_path, candidates):
    """Two gloo processes, each on its rows of the same global batch (7 rows: 4 and 3), learn one region, over every
    graftable parameter or over a candidate set (whose ∇ over C is one buffer, reduced at once)."""
    import subprocess
    import sys
    from pathlib import Path

    script = str(Path(__file__).with_name("dp_mask.py"))
    env = {k: v for k, v in __import__("os").environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    one = subprocess.run([sys.executable, script, str(tmp_path / "one.pt"), "fast", candidates], capture_output=True,
                         text=True, env=env, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    import socket

    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                          "127.0.0.1", "--master-port", port, script, str(tmp_path / "two.pt"), "lean", candidates],
                         capture_output=True, text=True, env=env, timeout=300)
    said = [line for line in two.stderr.splitlines() if any(w in line for w in ("terminate", "what()", "Error", "error"))]
    assert two.returncode == 0, "\n".join(said[:20]) + "\n" + two.stderr[-1500:]
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    for n in a["logits"]:
        torch.testing.assert_close(a["logits"][n], b["logits"][n], rtol=0, atol=1e-5)
    for key in ("region",) + (("candidates",) if candidates != "all" else ()):  # C is one buffer, reduced at once
        assert a[key].keys() == b[key].keys() and all(torch.equal(a[key][n], b[key][n]) for n in a[key]), key
    assert any(not torch.equal(l, l.sign() * 3.0) for l in a["logits"].values())  # the logits did move


@pytest.mark.parametrize("logit_dtype, optimizer, forward", [
    ("float32", "normalized", "relaxed"), ("float16", "normalized", "relaxed"), ("bfloat16", "adam", "relaxed"),
    ("float32", "sgd", "hard"), ("float16", "normalized", "hard")])
def test_fast_and_lean_memory_learn_the_same_logits_bit_for_bit(tiny_pair, logit_dtype, optimizer, forward):
    """Holding σ(ℓ) and δ is a speed choice only: the held values are the ones the lean path recomputes."""
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    found = {}
    for memory in ("fast", "lean"):
        config = LearnConfig(steps=4, lr=0.5 if optimizer != "sgd" else 1e3, optimizer=optimizer, forward=forward,
                             logit_dtype=logit_dtype, memory=memory)
        learner = method.MaskLearner(pair.model, params, pair.pre, pair.ft, 150, config)
        assert (learner.held is not None) == (memory == "fast")
        for batch in random_batches(n_batches=4)(0):
            learner.step(batch)
        found[memory] = (learner.finish(), learner.logits)
    (fast_region, fast), (lean_region, lean) = found["fast"], found["lean"]
    assert any(not torch.equal(l, method.initial_logits(method.base_region(pair.pre, pair.ft, list(params), 150),
                                                        {n: tuple(l.shape)}, 3.0, dtype=l.dtype)[n])
               for n, l in lean.items())  # the steps moved the logits
    assert all(torch.equal(fast[n], lean[n]) for n in params)
    assert fast_region.keys() == lean_region.keys() and all(torch.equal(fast_region[n], lean_region[n]) for n in fast_region)


@pytest.mark.parametrize("forward", ["relaxed", "hard"])
def test_sliced_passes_learn_what_whole_tensor_passes_learn(tiny_pair, monkeypatch, forward):
    """Slicing the element-wise passes (large tensors on CPU) changes rounding only: logits within float error,
    nearly the same region, and the two memory modes still agree bit for bit, because both slice alike."""
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    assert max(p.numel() for p in params.values()) > 4 * 37  # several slices per tensor
    found = {}
    for chunk, memory in ((compute.CHUNK, "lean"), (37, "lean"), (37, "fast")):
        monkeypatch.setattr(compute, "CHUNK", chunk)
        found[chunk, memory] = learning.learn_region(pair.model, params, pair.pre, pair.ft, 150, random_batches(),
                                                   LearnConfig(steps=4, lr=0.5, memory=memory, forward=forward))
    (whole, ell), (sliced, ell_sliced), (fast, ell_fast) = found.values()
    assert all(torch.equal(ell_sliced[n], ell_fast[n]) for n in params)
    assert all(torch.equal(sliced[n], fast[n]) for n in sliced) and sliced.keys() == fast.keys()
    assert any(not torch.equal(ell[n], ell[n].sign() * 3.0) for n in params)  # the logits moved
    for n in params:
        torch.testing.assert_close(ell_sliced[n], ell[n], rtol=1e-5, atol=1e-5)
    shared = sum(len(set(whole[n].tolist()) & set(i.tolist())) for n, i in sliced.items() if n in whole)
    assert shared >= 147  # of 150: a last-bit difference can only swap logits tied at the threshold


def test_region_counter_reads_one_buffer_or_the_tensors_themselves(monkeypatch):
    monkeypatch.setattr(compute, "CHUNK", 3)  # the buffer is read in slices
    logits = method.initial_logits({"a": torch.tensor([0, 4])}, {"a": (2, 3), "b": (4,)}, bias=1.0)
    logits["b"][1:3] = 0.5  # a, b: + - - - + -, - + + -
    counter = method.RegionCounter(logits, {"a": torch.tensor([0, 4]), "b": torch.tensor([0, 2])})
    assert len(counter.buffers) == 1 and counter(compute.Scratch()) == (4, 3)
    outer = torch.tensor([9.0, 1.0, -1.0, 9.0, 2.0, 0.0, 9.0])  # views that leave parts of their buffer out
    cut = {"a": outer[1:3], "b": outer[4:6].view(2, 1)}
    counter = method.RegionCounter(cut, {"a": torch.tensor([0, 1]), "b": torch.tensor([1])})
    assert len(counter.buffers) == 2 and counter(compute.Scratch()) == (2, 1)


def test_only_cpu_passes_are_sliced(monkeypatch):
    """A GPU pays per kernel launch and has no page faults to save: its passes take the whole tensor."""
    monkeypatch.setattr(compute, "CHUNK", 4)
    assert [(c.start, c.stop) for c in compute.chunks(torch.empty(10))] == [(0, 4), (4, 8), (8, 10)]
    assert compute.chunks(torch.empty(4)) == compute.chunks(torch.empty(10, device="meta")) == (slice(None),)


def test_logits_of_a_device_are_views_of_one_buffer():
    logits = method.initial_logits({"b": torch.tensor([1])}, {"a": (2, 3), "b": (4,)}, bias=2.0,
                                   device={"a": "cpu", "b": "cpu"})
    assert logits["a"]._base is logits["b"]._base and logits["a"]._base.numel() == 10
    assert logits["b"].tolist() == [-2.0, 2.0, -2.0, -2.0]


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads Linux's memory figures")
def test_the_full_learner_holds_sigma_and_delta_where_told_and_never_reads_the_memory_itself(tiny_pair, monkeypatch):
    with open("/proc/meminfo") as fh:
        total = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal:"))
    assert 0 < compute.free_memory(torch.device("cpu")) <= total
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}

    def unread(device):
        raise AssertionError("the learner read the free memory: that is the plan's to do")

    monkeypatch.setattr(compute, "free_memory", unread)
    for holds, config in ((False, LearnConfig()), (True, LearnConfig(memory="fast"))):
        learner = method.MaskLearner(pair.model, params, pair.pre, pair.ft, 10, config)
        assert (learner.held is not None) == holds
        learner.finish()
    learner = method.MaskLearner(pair.model, params, pair.pre, pair.ft, 10, LearnConfig(), holds=True)
    assert learner.held is not None  # as the plan says
    learner.finish()
    assert learner.held is None  # the copies are let go before binarising
    from graftui.requests import LocalizeRequest

    assert LocalizeRequest(memory="lean").learn_config().memory == "lean"  # the request's choice reaches the plan
    with pytest.raises(ValueError, match="memory mode"):
        method.MaskLearner(pair.model, params, pair.pre, pair.ft, 10, LearnConfig(memory="tiny"))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cgroup_room_is_the_limit_less_what_cannot_be_dropped(tmp_path, version):
    proc = tmp_path / "cgroup"
    if version == "v2":
        proc.write_text("0::/job\n")
        folder, names = tmp_path / "job", ("memory.max", "memory.current", "inactive_file")
    else:
        proc.write_text("9:cpu:/job\n4:memory:/job\n")
        folder, names = tmp_path / "memory" / "job", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    folder.mkdir(parents=True)
    (folder / names[0]).write_text("1000000\n")
    (folder / names[1]).write_text("600000\n")
    (folder / "memory.stat").write_text(f"anon 5\n\nactive_file 7\n{names[2]} 100000\n")
    assert list(compute.cgroup_room(str(proc), str(tmp_path))) == [500000]
    (folder / names[0]).write_text("max\n" if version == "v2" else f"{2**63 - 4096}\n")  # no limit
    assert list(compute.cgroup_room(str(proc), str(tmp_path))) == []
    assert list(compute.cgroup_room(str(tmp_path / "absent"), str(tmp_path))) == []


def _lm_with_layers(arch: str, seed: int = 0):
    """A tiny LM, its layers and each layer's feed-forward block; OPT calls dropout (p = 0.1) with the layer's own flag."""
    from lm_util import make_lm

    if arch != "opt":
        lm = make_lm(arch, 40, seed)
        layers = {"gpt2": lambda: lm.transformer.h, "llama": lambda: lm.model.layers,
                  "bert-mlm": lambda: lm.bert.encoder.layer}[arch]()
        return lm, list(layers), [getattr(layer, "mlp", None) or layer.intermediate for layer in layers]
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    lm = OPTForCausalLM(OPTConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                                  max_position_embeddings=64, word_embed_proj_dim=32, dropout=0.1, pad_token_id=1))
    return lm, list(lm.model.decoder.layers), [layer.fc1 for layer in lm.model.decoder.layers]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert-mlm", "opt"])
def test_checkpointed_layers_keep_no_activations_replay_and_learn_the_same_logits_bit_for_bit(arch):
    """Checkpointing trades a layer's activations for a replay of its forward; the gradients, so the logits, stay."""
    found, saved = {}, {}
    for every in (0, 1, 2):
        lm, layers, ffns = _lm_with_layers(arch)
        moved = dict(_lm_with_layers(arch, seed=1)[0].named_parameters())
        body = {n: p for n, p in lm.named_parameters() if ".h." in n or ".layers." in n or ".layer." in n}
        pre, ft = {n: p.detach().clone() for n, p in body.items()}, {n: moved[n].detach().clone() for n in body}
        replays = []
        for i, ffn in enumerate(ffns):  # the feed-forward block runs once per forward, again per replay
            ffn.forward = (lambda f, i: lambda *a, **k: (replays.append(i), f(*a, **k))[1])(ffn.forward, i)
        use_cache = lm.config.use_cache
        learner = method.MaskLearner(lm, body, pre, ft, 200, LearnConfig(steps=3, lr=0.5, memory="lean",
                                                                       checkpoint_every=every))
        gen, kept = torch.Generator().manual_seed(0), []
        pack = lambda t: (kept.append(t.numel() * t.element_size()), t)[1]  # noqa: E731 — saved for the backward pass
        for step in range(3):
            ids = torch.randint(3, 40, (4, 10), generator=gen)
            replays.clear()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                learner.step({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
            assert replays == list(range(len(layers))) + [i for i in reversed(range(len(layers))) if every and i % every == 0]
        saved[every] = sum(kept)
        found[every] = learner.finish(), learner.logits
        assert not any("forward" in layer.__dict__ for layer in layers) and lm.config.use_cache == use_cache
        replays.clear()
        lm(input_ids=ids, labels=ids).loss.backward()
        assert replays == list(range(len(layers)))  # put back: no more replays
    assert saved[1] < saved[0] / 4  # the activations are (nearly all) the layers', and checkpointed layers keep none
    assert saved[1] < saved[2] < saved[0]  # every 2nd layer: in between
    (region, logits), start = found[0], method.initial_logits(method.base_region(pre, ft, list(body), 200),
                                                              {n: tuple(p.shape) for n, p in body.items()}, 3.0)
    assert any(not torch.equal(logits[n], start[n]) for n in body)  # the steps moved the logits
    for every in (1, 2):
        assert all(torch.equal(found[every][1][n], logits[n]) for n in body)
        assert found[every][0].keys() == region.keys() and all(torch.equal(found[every][0][n], region[n]) for n in region)


def test_checkpointing_is_asked_for_through_the_request_and_refused_where_no_layer_can_be_checkpointed(tiny_pair):
    from graftui.errors import ModelError, RequestError
    from graftui.requests import LocalizeRequest

    assert LocalizeRequest(checkpoint_every=2).learn_config().checkpoint_every == 2
    with pytest.raises(RequestError, match="--checkpoint-every"):
        LocalizeRequest(checkpoint_every=-1).check_learning()
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    flat = torch.nn.Sequential(torch.nn.Linear(3, 3)).train()
    weight = flat[0].weight
    with pytest.raises(ModelError, match="--checkpoint-every"):  # refused before anything is changed
        method.MaskLearner(flat, {"0.weight": weight}, {"0.weight": weight.detach().clone()},
                           {"0.weight": weight.detach() + 1}, 1, LearnConfig(checkpoint_every=1))
    assert flat.training and weight.requires_grad
    flags = {n: p.requires_grad for n, p in pair.model.named_parameters()}
    layers = list(pair.model.bert.encoder.layer)
    hooked = layers[1].forward = lambda *a, **k: type(layers[1]).forward(layers[1], *a, **k)  # as a device hook would be
    learner = method.MaskLearner(pair.model, params, pair.pre, pair.ft, 10, LearnConfig(checkpoint_every=1))
    assert all("forward" in layer.__dict__ for layer in layers) and layers[1].forward is not hooked
    learner.finish()
    assert {n: p.requires_grad for n, p in pair.model.named_parameters()} == flags
    assert "forward" not in layers[0].__dict__ and layers[1].forward is hooked  # each layer's forward as it was
    del layers[1].forward


def test_nan_scores_are_refused_by_name():
    from graftui.errors import ModelError

    with pytest.raises(ModelError, match="'b' has NaN scores"):
        method.top_k({"a": torch.ones(4), "b": torch.tensor([1.0, float("nan")])}, 2)


@pytest.mark.parametrize("candidates, forward, logit_dtype", [("all", "hard", "float32"), ("all", "relaxed", "float32"),
                                                              ("3", "hard", "float32"), ("all", "hard", "bfloat16")])
def test_a_budget_true_learner_never_holds_more_than_k_parameters_at_half(tiny_pair, candidates, forward, logit_dtype):
    """After every step at most k parameters have γ = σ(ℓ) ≥ ½, counted here from the logits themselves; the shift
    keeps the order of ℓ, so the region is the top-k of what the same steps would give unshifted."""
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    k, batches = 40, random_batches(n_batches=2)
    counts, free_counts = [], []
    for within, seen in ((True, counts), (False, free_counts)):
        config = LearnConfig(lr=3.0, forward=forward, within_budget=within, candidates=candidates,
                             logit_dtype=logit_dtype)
        the_plan = learning.plan(pair.model, params, pair.pre, pair.ft, k, config)
        learner = learning.make_learner(the_plan, pair.model, params, pair.pre, pair.ft, k, config, batches=batches(0))
        for step, batch in zip(range(6), method.cycle_batches(batches)):
            report = learner.step(batch)
            gamma = [torch.sigmoid(l.float()) for l in learner.logits.values()]
            seen.append(sum(int((g >= 0.5).sum()) for g in gamma))
            assert report.region_size == sum(int((l > 0).sum()) for l in learner.logits.values())  # the live count
        region = learner.finish()
        assert method.region_size(region) == k
    assert max(counts) <= k
    assert max(free_counts) > k  # steps this large overshoot the budget when nothing holds them to it


def test_the_budget_true_shift_keeps_the_order_of_the_logits(tiny_pair):
    pair, _, _ = tiny_pair
    params = {n: pair.param(n) for n in pair.graftable}
    learner = method.MaskLearner(pair.model, params, pair.pre, pair.ft, 40, LearnConfig(within_budget=True))
    gen = torch.Generator().manual_seed(0)
    for ell in learner.logits.values():
        ell.copy_(torch.randn(ell.shape, generator=gen) * 4)
    before = torch.cat([l.reshape(-1).clone() for l in learner.logits.values()])
    learner._keep_within_budget()
    after = torch.cat([l.reshape(-1) for l in learner.logits.values()])
    shift = before - after
    assert torch.allclose(shift, shift[0].expand_as(shift)) and float(shift[0]) > 0
    assert int((after >= 0).sum()) <= 40 and float(after.sort(descending=True).values[40]) < 0
    learner.finish()


def test_the_budget_true_shift_keeps_its_margin_in_sixteen_bits():
    """5 + 0.01 is 5 in bfloat16: the shift is taken in float32, so tied logits at the (k+1)-th land below 0."""
    from types import SimpleNamespace

    for dtype in (torch.bfloat16, torch.float16):
        ell = torch.tensor([5.0, 5.0, 5.0, 5.0, -3.0], dtype=dtype)
        learner = SimpleNamespace(logits={"w": ell}, k=2)
        method.MaskLearner._keep_within_budget(learner)
        assert int((torch.sigmoid(ell.float()) >= 0.5).sum()) <= 2 and ell.dtype == dtype


def test_a_region_file_records_the_settings_the_budget_true_method_ran_with():
    from graftui.localizers import get_method

    info = get_method("budget-true")
    ran = info.configured(_LearnConfig(steps=7))
    assert (ran.forward, ran.within_budget, ran.steps) == ("hard", True, 7)
    assert get_method("learned").configured(_LearnConfig(steps=7)) == _LearnConfig(steps=7)
