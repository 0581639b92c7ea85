"""One registry for localization methods: the learned region of the paper and its baselines.

(The mathematics of the learned region is ``method.py``; this module names the methods and runs one.)

Every method answers the same question with the same budget: which k graftable parameters
carry the skill? A method is a function ``(MethodContext) -> Region`` registered under a name;
the CLI, the app and the sweep all look methods up here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from . import learning, method
from .config import Budget, LearnConfig
from .errors import BudgetError, Cancelled
from .method import ProgressFn, Region


@dataclass
class MethodContext:
    """Everything a method may use. Data-free methods ignore ``make_batches``."""

    pair: "object"  # models.ModelPair
    k: int
    make_batches: Callable[[int], object] | None = None
    config: LearnConfig = field(default_factory=LearnConfig)
    progress: ProgressFn | None = None
    cancel: threading.Event | None = None
    announce: Callable[[str], None] | None = None  # a milestone worth a line of its own (the learner's plan)
    details: dict = field(default_factory=dict)  # what the method tells the region file of how it ran
    within: Region | None = None  # a larger region the region must lie in (a search over budgets); data-free methods
    # rank the whole graftable set regardless


@dataclass(frozen=True)
class MethodInfo:
    name: str
    label: str
    description: str
    needs_data: bool
    fn: Callable[[MethodContext], Region]
    learning: dict = field(default_factory=dict)  # LearnConfig fields the method sets whatever the request asks

    def configured(self, config: LearnConfig) -> LearnConfig:
        """The mask-learning settings the method runs with: what a region file records as its ``learn``."""
        return replace(config, **self.learning)


METHODS: dict[str, MethodInfo] = {}


def register_method(name: str, *, label: str, description: str, needs_data: bool = False,
                    learning: dict | None = None):
    """Decorator: make a localization method available everywhere under ``name``; ``learning`` names the LearnConfig
    fields it fixes (the method then gets a config with them set)."""

    def wrap(fn: Callable[[MethodContext], Region]) -> Callable[[MethodContext], Region]:
        if name in METHODS:
            raise ValueError(f"a localization method named '{name}' is already registered")
        METHODS[name] = MethodInfo(name, label, description, needs_data, fn, dict(learning or {}))
        return fn

    return wrap


def get_method(name: str) -> MethodInfo:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method '{name}'; choose from {', '.join(METHODS)}") from None


class _Scores:
    """Scores per graftable tensor, computed each time one is read (``top_k`` reads them three times): a
    baseline's ranking costs one tensor's scores at a time, not a model's worth."""

    def __init__(self, ctx: MethodContext, score: Callable[[int, str], torch.Tensor]):
        self.names, self.score = list(ctx.pair.graftable), score
        self.sizes = {n: ctx.pair.param(n).numel() for n in self.names}
        self.position = {n: i for i, n in enumerate(self.names)}

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)

    def numel(self, name: str) -> int:
        return self.sizes[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.score(self.position[name], name)


@register_method(
    "learned",
    label="Learned (paper)",
    description="Eq. 2–4: start from the top-movement region and take mask steps on the task loss.",
    needs_data=True,
)
def learned(ctx: MethodContext) -> Region:
    pair = ctx.pair
    params = {n: pair.param(n) for n in pair.graftable}
    region, _ = learning.learn_region(pair.model, params, pair.pre, pair.ft, ctx.k, ctx.make_batches, ctx.config,
                                      ctx.progress, ctx.cancel, announce=ctx.announce, details=ctx.details,
                                      within=ctx.within)
    return region


@register_method(
    "budget-true",
    label="Budget-true learned",
    description="Eq. 2–4 held to the budget while learning: each forward pass grafts the top-k of ℓ (straight-through), "
                "and ℓ is shifted after each step so that at most k parameters have γ ≥ ½.",
    needs_data=True,
    learning={"forward": "hard", "within_budget": True},
)
def budget_true(ctx: MethodContext) -> Region:
    return learned(ctx)  # the paper's steps, with the config its registration fixes


@register_method(
    "top-movement",
    label="Top movement",
    description="γ_base alone: the k parameters with the largest |θ_ft − θ_pre|.",
)
def top_movement(ctx: MethodContext) -> Region:
    return method.base_region(ctx.pair.pre, ctx.pair.ft, ctx.pair.graftable, ctx.k)


@register_method(
    "random",
    label="Random",
    description="k graftable parameters drawn uniformly at random (seeded).",
)
def random_region(ctx: MethodContext) -> Region:
    def draw(position: int, name: str) -> torch.Tensor:  # the same draw each time a tensor is read: seeded by both
        gen = torch.Generator().manual_seed((ctx.config.seed * 1_000_003 + position) % 2**63)
        return torch.rand(ctx.pair.param(name).shape, generator=gen)

    return method.top_k(_Scores(ctx, draw), ctx.k)


@register_method(
    "bias-only",
    label="Bias only",
    description="The largest-movement bias terms only (BitFit-style); smaller than k when the model has fewer biases.",
)
def bias_only(ctx: MethodContext) -> Region:
    biases = [n for n in ctx.pair.graftable if n.endswith("bias")]
    budget = min(ctx.k, sum(ctx.pair.param(n).numel() for n in biases))
    return method.base_region(ctx.pair.pre, ctx.pair.ft, biases, budget) if biases else {}


@register_method(
    "magnitude",
    label="Largest magnitude",
    description="The k parameters with the largest fine-tuned magnitude |θ_ft|.",
)
def magnitude(ctx: MethodContext) -> Region:
    return method.top_k(_Scores(ctx, lambda _, n: ctx.pair.ft[n].abs()), ctx.k)


def run_method(
    pair,
    budget: Budget,
    name: str = "learned",
    *,
    make_batches: Callable[[int], object] | None = None,
    config: LearnConfig = LearnConfig(),
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    announce: Callable[[str], None] | None = None,
    details: dict | None = None,
    within: Region | None = None,
) -> tuple[Region, int]:
    """Run one registered method on ``pair``; returns the region and the budget k it honoured. ``details`` (a dict)
    receives what the method tells of how it ran (a learner's plan and candidate set)."""
    info = get_method(name)
    k = budget.resolve(pair.counts()["graftable"])
    if info.needs_data and make_batches is None:
        raise ValueError(f"method '{name}' needs training data")
    if cancel is not None and cancel.is_set():
        raise Cancelled(f"{name} cancelled before it started")
    ctx = MethodContext(pair, k, make_batches, info.configured(config), progress, cancel, announce, within=within)
    region = info.fn(ctx)
    if details is not None:
        details.update(ctx.details)
    if method.region_size(region) > k:  # the budget is a promise to the user, not an internal check
        raise BudgetError(f"method '{name}' returned {method.region_size(region):,} parameters for a budget of {k:,}")
    return region, k
