"""One registry for localization methods: the learned region of the paper and its baselines.

(The mathematics of the learned region is ``method.py``; this module names the methods and runs one.)

Every method answers the same question with the same budget: which k graftable parameters
carry the skill? A method is a function ``(MethodContext) -> Region`` registered under a name;
the CLI, the app and the sweep all look methods up here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import method
from .config import Budget, LearnConfig
from .errors import BudgetError
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


@dataclass(frozen=True)
class MethodInfo:
    name: str
    label: str
    description: str
    needs_data: bool
    fn: Callable[[MethodContext], Region]


METHODS: dict[str, MethodInfo] = {}


def register_method(name: str, *, label: str, description: str, needs_data: bool = False):
    """Decorator: make a localization method available everywhere under ``name``."""

    def wrap(fn: Callable[[MethodContext], Region]) -> Callable[[MethodContext], Region]:
        if name in METHODS:
            raise ValueError(f"a localization method named '{name}' is already registered")
        METHODS[name] = MethodInfo(name, label, description, needs_data, fn)
        return fn

    return wrap


def get_method(name: str) -> MethodInfo:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method '{name}'; choose from {', '.join(METHODS)}") from None


def _scores(ctx: MethodContext, score: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: score(n) for n in ctx.pair.graftable}


@register_method(
    "learned",
    label="Learned (paper)",
    description="Eq. 2–4: start from the top-movement region and take mask steps on the task loss.",
    needs_data=True,
)
def learned(ctx: MethodContext) -> Region:
    pair = ctx.pair
    params = {n: pair.param(n) for n in pair.graftable}
    region, _ = method.learn_region(
        pair.model, params, pair.pre, pair.ft, ctx.k, ctx.make_batches, ctx.config, ctx.progress, ctx.cancel
    )
    return region


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
    gen = torch.Generator().manual_seed(ctx.config.seed)
    return method.top_k(_scores(ctx, lambda n: torch.rand(ctx.pair.pre[n].shape, generator=gen)), ctx.k)


@register_method(
    "bias-only",
    label="Bias only",
    description="The largest-movement bias terms only (BitFit-style); smaller than k when the model has fewer biases.",
)
def bias_only(ctx: MethodContext) -> Region:
    biases = {n: (ctx.pair.ft[n] - ctx.pair.pre[n]).abs() for n in ctx.pair.graftable if n.endswith("bias")}
    budget = min(ctx.k, sum(t.numel() for t in biases.values()))
    return method.top_k(biases, budget) if biases else {}


@register_method(
    "magnitude",
    label="Largest magnitude",
    description="The k parameters with the largest fine-tuned magnitude |θ_ft|.",
)
def magnitude(ctx: MethodContext) -> Region:
    return method.top_k(_scores(ctx, lambda n: ctx.pair.ft[n].abs()), ctx.k)


def run_method(
    pair,
    budget: Budget,
    name: str = "learned",
    *,
    make_batches: Callable[[int], object] | None = None,
    config: LearnConfig = LearnConfig(),
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
) -> tuple[Region, int]:
    """Run one registered method on ``pair``; returns the region and the budget k it honoured."""
    info = get_method(name)
    k = budget.resolve(pair.counts()["graftable"])
    if info.needs_data and make_batches is None:
        raise ValueError(f"method '{name}' needs training data")
    if cancel is not None and cancel.is_set():
        raise method.Cancelled(f"{name} cancelled before it started")
    region = info.fn(MethodContext(pair, k, make_batches, config, progress, cancel))
    if method.region_size(region) > k:  # the budget is a promise to the user, not an internal check
        raise BudgetError(f"method '{name}' returned {method.region_size(region):,} parameters for a budget of {k:,}")
    return region, k
