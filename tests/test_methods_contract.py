"""One contract for every registered localization method, run on a tiny config-built pair.

A method registered tomorrow is held to the same promises without a new test: the region has
exactly k parameters (bias-only: at most the model's biases), the same seed gives the same
region, the working model is left exactly as it was, and a cancel is honoured within one step.
"""

from __future__ import annotations

import threading

import pytest
import torch

from conftest import make_tiny_pair, random_batches
from graftui import method
from graftui.errors import Cancelled
from graftui.config import Budget, LearnConfig
from graftui.localizers import METHODS, run_method
from graftui.requests import LocalizeRequest, choices_of

K = 200


def run(pair, name, seed=0, progress=None, cancel=None, steps=3):
    info = METHODS[name]
    return run_method(pair, Budget(k=K), name, make_batches=random_batches() if info.needs_data else None,
                      config=LearnConfig(steps=steps, seed=seed), progress=progress, cancel=cancel)


def snapshot(pair) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in pair.model.named_parameters()}


def test_the_request_names_every_registered_method():
    assert choices_of(LocalizeRequest, "method") == tuple(METHODS)


@pytest.mark.parametrize("name", list(METHODS))
def test_exact_budget_and_a_valid_region(name):
    pair, _, _ = make_tiny_pair()
    region, k = run(pair, name)
    size = method.region_size(region)
    biases = sum(pair.pre[n].numel() for n in pair.graftable if n.endswith("bias"))
    assert k == K
    assert size == (min(K, biases) if name == "bias-only" else K)
    for tensor, idx in region.items():
        assert tensor in pair.graftable
        assert idx.dtype == torch.int64 and idx.dim() == 1
        assert idx.numel() == torch.unique(idx).numel() and bool((idx[1:] > idx[:-1]).all())
        assert int(idx.min()) >= 0 and int(idx.max()) < pair.pre[tensor].numel()


@pytest.mark.parametrize("name", list(METHODS))
def test_same_seed_same_region(name):
    a, _ = run(make_tiny_pair()[0], name, seed=3)
    b, _ = run(make_tiny_pair()[0], name, seed=3)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("name", list(METHODS))
def test_the_working_model_is_restored(name):
    pair, _, _ = make_tiny_pair()
    before = snapshot(pair)
    run(pair, name)
    after = snapshot(pair)
    assert before.keys() == after.keys()
    for n in before:
        assert torch.equal(before[n], after[n]), n


@pytest.mark.parametrize("name", list(METHODS))
def test_cancel_is_honoured_within_one_step(name):
    pair, _, _ = make_tiny_pair()
    before = snapshot(pair)
    cancel = threading.Event()
    steps = []

    def progress(report):
        steps.append(report.step)
        cancel.set()  # asked during the first step

    if METHODS[name].needs_data:
        with pytest.raises(Cancelled):
            run(pair, name, progress=progress, cancel=cancel, steps=10)
        assert steps == [1]
    else:
        cancel.set()
        with pytest.raises(Cancelled):
            run(pair, name, cancel=cancel)
    assert all(torch.equal(before[n], p.detach()) for n, p in pair.model.named_parameters())
