"""Mask learning as it runs on a machine: the memory plan that picks the learner, and the loop that runs it.

Two learners take the same steps (Eq. 3): the full learner (``method.MaskLearner``) keeps a region
logit for every graftable parameter, the candidate learner (``candidates.CandidateLearner``) only over
a candidate set C that the method's own first gradient ranks. ``plan`` picks one by what fits: the
full learner where all it holds — ℓ, σ(ℓ) and δ kept between passes, θ_pre and θ_ft where a pair
reads them from files at every step, and a step's activations — takes at most a quarter of the
memory free on each device (``compute.fits``); otherwise the candidate learner, with C = 5·k where
that fits (fewer where not), the activations of each layer recomputed where a step's would take more
than a quarter of the model, and large blocks mapped where the model itself is large for the machine.
A plan that cannot fit at all is refused in one line before any work, and running out of memory all
the same becomes one line that names the need and the flags that would fit.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable

import torch

from . import compute
from .candidates import CandidateLearner
from .config import AUTO_FACTOR, LearnConfig
from .errors import Cancelled, ModelError
from .formatting import memory
from .method import MaskLearner, ProgressFn, Region, cycle_batches

log = logging.getLogger(__name__)

INDEX_BYTES = 8  # a candidate's flat index (int64)
POOL_BYTES = 24  # the ranking pool: up to two entries (index and float32 sum) per ranked candidate
ACTIVATION_SHARE = 4  # a step's activations above a quarter of the model: the lean learner recomputes them


def candidate_count(factor: float, k: int, graftable: int) -> int:
    """|C| = min(⌈c·k⌉, graftable): 1.1·10 is 11, not 12."""
    return min(math.ceil(round(factor * k, 6)), graftable)


@dataclass(frozen=True)
class Plan:
    """Which learner runs, over how many candidates, and what it is expected to hold (bytes)."""

    learner: str  # "full" or "candidate"
    asked: str  # the request's --candidates: "auto", "all" or a factor
    device: str
    graftable: int
    model_bytes: int
    state_bytes: int  # what the learner holds beside the working model at most
    full_bytes: int  # what the full learner would hold (all it keeps, read or made between passes, and a step's
    # activations where they were measured)
    free_bytes: int  # free on the device that decided
    count: int | None = None  # |C| at the start
    room: int | None = None  # |C| at most, once grown
    factor: float | None = None
    rank: str | None = None
    activation_bytes: int | None = None  # what one step's forward pass keeps for the backward pass
    checkpoint_every: int = 0
    layers: int = 0
    maps_blocks: bool = False

    @property
    def peak(self) -> float:
        """The expected resident peak in model sizes: the working model, the learner's state and a step's activations
        (as many as the checkpointing keeps), the interpreter and libraries not counted."""
        act = _kept(self.activation_bytes or 0, self.checkpoint_every, self.layers)
        return (self.model_bytes + self.state_bytes + act) / max(self.model_bytes, 1)

    @property
    def worth_saying(self) -> bool:
        """Whether the plan departs from a logit per parameter with every activation kept: only then is its line
        printed before the work (it is recorded in the region file either way)."""
        return self.learner != "full" or bool(self.checkpoint_every)

    def describe(self) -> str:
        """The line that says the plan."""
        step = " with a step's activations" if self.activation_bytes else ""
        if self.learner == "full":
            why = {"all": "as asked"}.get(self.asked, f"its {memory(self.full_bytes)}{step} fit in a quarter of the "
                                                      f"{memory(self.free_bytes)} free")
            head = f"full learner ({why})"
        else:
            grows = f", grows to {self.room:,}" if self.room and self.room > (self.count or 0) else ""
            why = "" if self.asked != "auto" else \
                f"; the full learner's {memory(self.full_bytes)}{step} would not fit in a quarter of the " \
                f"{memory(self.free_bytes)} free"
            head = (f"candidate learner, C = {self.count:,} of {self.graftable:,} (c = {self.factor:g}, ranked by "
                    f"{self.rank}{grows}{why})")
        extra = [f"every {'' if self.checkpoint_every == 1 else f'{self.checkpoint_every}-th '}layer recomputed"] \
            if self.checkpoint_every else []
        known = "" if self.activation_bytes is not None else " before activations"
        return (f"mask learning: {head}, expected peak {self.peak:.2f} model sizes{known} on {self.device}"
                + "".join(f", {e}" for e in extra))

    def record(self) -> dict:
        """What a region file keeps of the plan."""
        keep = asdict(self)
        keep["peak"] = round(self.peak, 3)
        return keep

    def lighter(self) -> str:
        """The flags that hold less, for a line about running out of memory."""
        if self.learner == "full":
            return f"--candidates {AUTO_FACTOR:g} (C = 5·k instead of a logit per parameter)"
        flags = [f"--candidates {max(1.0, (self.factor or AUTO_FACTOR) / 2):g}"]
        if self.layers and not self.checkpoint_every:
            flags.append("--checkpoint-every 1")
        flags += ["--logit-dtype bfloat16", "a smaller --batch-size"]
        return ", ".join(flags)


def _kept(activations: int, every: int, layers: int) -> int:
    """A step's activations that stay resident where every ``every``-th of ``layers`` layers is recomputed."""
    if every and layers:
        return int(activations * (1 - 1 / every) + activations / layers)
    return activations


def _bytes(params, each: Callable[[torch.nn.Parameter], int]) -> dict[torch.device, int]:
    """Per device, ``each(p)`` bytes for every value of every parameter there."""
    need: dict[torch.device, int] = {}
    for p in params.values():
        need[p.device] = need.get(p.device, 0) + p.numel() * each(p)
    return need


def plan(model: torch.nn.Module, params: dict[str, torch.nn.Parameter], pre, ft, k: int,
         config: LearnConfig = LearnConfig(), sample: dict | None = None) -> Plan:
    """The learner that fits (see the module's notes); a ``ModelError`` in one line where none can.

    ``sample`` is a training batch: one row of it measures a step's activations (``compute.saved_activations``), which
    the full learner keeps beside its state and the candidate learner recomputes where they are large."""
    asked = str(config.candidates).strip().lower()
    factor = LearnConfig.candidate_factor(asked)
    graftable = sum(p.numel() for p in params.values())
    on = _bytes(params, lambda p: 1)  # values per device
    device = max(on, key=on.get)
    logit = torch.empty((), dtype=getattr(torch, config.logit_dtype)).element_size()
    adam = 8 if config.optimizer == "adam" else 0
    lazy = 0 if isinstance(pre, dict) and isinstance(ft, dict) else 2
    full_need = _bytes(params, lambda p: 2 * logit + adam + p.element_size() * (1 + lazy))
    full_least = _bytes(params, lambda p: logit + adam)
    layers, activations = 0, None
    try:
        layers = len(compute.checkpointable_layers(model))
    except ModelError:
        pass
    if sample is not None:
        activations = compute.saved_activations(model, sample, params.values())
    kept = _kept(activations or 0, config.checkpoint_every or 0, layers)  # a step's activations that the full
    # learner keeps beside its state: a 330 M pair's state alone fit a quarter of 22.65 GB free by 10 MB, and its run
    # peaked at 7.7 model sizes
    with_step = {**full_need, device: full_need.get(device, 0) + kept}
    widest = max(p.element_size() for p in params.values())
    per_candidate = INDEX_BYTES + logit + 4 * widest + adam
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    free = compute.free_memory(device)
    common = dict(asked=asked, device=str(device), graftable=graftable, model_bytes=model_bytes,
                  full_bytes=sum(full_need.values()) + kept, free_bytes=free)

    def candidate_need(count: int, room: int) -> dict[torch.device, int]:  # C spread over devices as the parameters
        top = max(2 * room * per_candidate, count * (per_candidate + POOL_BYTES))  # a growing C holds two layouts
        return {d: math.ceil(top * n / graftable) for d, n in on.items()}

    def candidate(c: float) -> tuple[int, int]:
        count = candidate_count(c, k, graftable)
        return count, min(graftable, count + k) if config.grow_every else count

    if asked == "all" or (asked == "auto" and compute.fits(with_step)):
        if asked == "all" and not compute.fits(full_least, share=1):
            raise ModelError(f"--candidates all cannot fit: a region logit per graftable parameter takes "
                             f"{memory(sum(full_least.values()))} and {memory(free)} are free on {device}; "
                             f"leave --candidates at auto, or give a factor such as {AUTO_FACTOR:g}")
        return Plan("full", state_bytes=sum((full_need if asked == "auto" else full_least).values()),
                    activation_bytes=activations, checkpoint_every=config.checkpoint_every or 0, layers=layers, **common)
    if factor is None:  # auto: the largest factor up to AUTO_FACTOR whose C fits in the share
        factor = AUTO_FACTOR
        while factor > 1 and not compute.fits(candidate_need(*candidate(factor))):
            factor = max(1.0, factor - 1)
    count, room = candidate(factor)
    need = candidate_need(count, room)
    if not compute.fits(need, share=1):  # auto's factor fits in the share unless it is down to 1
        raise ModelError(f"mask learning cannot fit on {device}: C = {count:,} candidates (c = {factor:g}) take "
                         f"{memory(sum(need.values()))} with {memory(free)} free; try "
                         + ("a smaller --candidates factor, " if factor > 1 else "")
                         + "--logit-dtype bfloat16, a smaller budget, or a machine with more memory")
    rank = config.rank
    every = config.checkpoint_every
    if every is None:  # recompute the activations where a step's would take more than a quarter of the model
        every = 1 if layers and activations is not None and ACTIVATION_SHARE * activations > model_bytes else 0
    return Plan("candidate", state_bytes=sum(need.values()), count=count, room=room, factor=factor, rank=rank,
                activation_bytes=activations, checkpoint_every=every, layers=layers,
                maps_blocks=compute.maps_blocks(config.memory, params), **common)


def make_learner(the_plan: Plan, model, params, pre, ft, k: int, config: LearnConfig, start: Region | None = None,
                 batches: Iterable[dict] | None = None, cancel: threading.Event | None = None) -> MaskLearner:
    """The learner ``the_plan`` names, with the checkpointing it chose."""
    config = replace(config, checkpoint_every=the_plan.checkpoint_every)
    if the_plan.learner == "full":
        return MaskLearner(model, params, pre, ft, k, config, start)
    return CandidateLearner(model, params, pre, ft, k, config, start, count=the_plan.count, room=the_plan.room,
                            batches=batches if config.rank == "gradient" else None, cancel=cancel,
                            maps_blocks=the_plan.maps_blocks)


def learn_region(
    model: torch.nn.Module,
    params: dict[str, torch.nn.Parameter],
    pre: dict[str, torch.Tensor],
    ft: dict[str, torch.Tensor],
    k: int,
    make_batches: Callable[[int], Iterable[dict]],
    config: LearnConfig = LearnConfig(),
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    start: Region | None = None,
    announce: Callable[[str], None] | None = None,
    details: dict | None = None,
) -> tuple[Region, dict[str, torch.Tensor]]:
    """Learn a region of exactly ``k`` graftable parameters (Eq. 2–4) with the learner that fits.

    ``make_batches(epoch)`` yields model inputs with ``labels``. ``start`` replaces γ_base
    (top-movement) as the region the relaxation starts from. The working parameters are left
    at θ_pre afterwards, also when cancelled or out of memory. ``announce`` gets the plan's line before any work
    where the plan is worth saying,
    ``details`` (a dict) what the region file keeps of the plan and of C. Returns the region and the final logits ℓ,
    one tensor per graftable parameter (for the candidate learner a ``CandidateLogits`` that makes each when read).
    """
    sample = next(iter(make_batches(0)), None)
    the_plan = plan(model, params, pre, ft, k, config, sample)
    del sample
    if announce is not None and the_plan.worth_saying:
        announce(the_plan.describe())
    log.debug("%s; %s", the_plan.describe(), compute.memory_in_use(the_plan.device))
    learner = None
    try:
        learner = make_learner(the_plan, model, params, pre, ft, k, config, start, make_batches(0), cancel)
        log.debug("learner built; %s", compute.memory_in_use(the_plan.device))
        batches = cycle_batches(make_batches)
        try:
            for _ in range(config.steps):
                if cancel is not None and cancel.is_set():
                    raise Cancelled("mask learning cancelled")
                report = learner.step(next(batches), count_region=progress is not None)
                if progress is not None:
                    progress(report)
        finally:
            region = learner.finish()
        log.debug("mask learning done; %s", compute.memory_in_use(the_plan.device))
    except Exception as err:
        if compute.out_of_memory(err):
            raise ModelError(out_of_memory_line(err, the_plan, "mask learning")) from None
        raise
    if details is not None:
        details.update({"plan": the_plan.record(), **(learner.record() if hasattr(learner, "record") else
                                                       {"learner": "full"})})
    return region, learner.full_logits()


def out_of_memory_line(err: BaseException, the_plan: Plan | None, doing: str) -> str:
    """One line for running out of memory: where, what was asked against what is free, and what holds less."""
    asked = compute.asked_bytes(err)
    device = torch.device(the_plan.device if the_plan else "cpu")
    free = compute.free_memory(device)
    need = f"it asked for {memory(asked)} more with {memory(free)} free" if asked else f"{memory(free)} are free now"
    fix = the_plan.lighter() if the_plan else "--dtype bfloat16, a smaller --batch-size or --check-n"
    return f"{doing} ran out of memory on {device}: {need}; try {fix}"


@contextlib.contextmanager
def out_of_memory_as_error(doing: str):
    """Running out of memory inside the block becomes one line (a ``ModelError``) naming the need."""
    try:
        yield
    except Exception as err:
        if compute.out_of_memory(err):
            raise ModelError(out_of_memory_line(err, None, doing)) from None
        raise
