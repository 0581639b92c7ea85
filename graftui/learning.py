"""Mask learning as it runs on a machine: the one memory plan, and the loop that runs the learner it names.

Two learners take the same steps (Eq. 3): the full learner (``method.MaskLearner``) keeps a region logit for every
graftable parameter, the candidate learner (``candidates.CandidateLearner``) only over a candidate set C that the
method's own first gradient ranks. The request picks one — ``--candidates all`` the paper's full relaxation, a factor c
or ``auto`` (c = 5) the candidate learner — never the machine: a region is a claim about the pair, the task and the
settings, so the same seed gives the same region whatever the free memory. ``plan`` is the one place that reads the
memory for mask learning, once, with a sample batch, and decides only how the learner runs: σ(ℓ) and δ kept or
recomputed, θ_pre and θ_ft copied onto the device or read at each step, each layer's activations kept or recomputed,
large blocks mapped — each kept where it has room in a quarter of the free memory, or as ``--memory`` says (``fast``
keeps, ``lean`` recomputes). A request that cannot fit at all is refused in one line before any work, naming what
would fit, and running out of memory all the same becomes one line that names the need and the flags that hold less.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

import torch
from safetensors import safe_open

from . import compute, resume
from .candidates import CandidateLearner
from .config import AUTO_FACTOR, MEMORY_MODES, LearnConfig
from .errors import Cancelled, ModelError, Paused
from .formatting import memory
from .method import MaskLearner, ProgressFn, Region, cycle_batches
from .paths import atomic_write
from .weights import DTYPES
from .weights import Placed

log = logging.getLogger(__name__)

INDEX_BYTES = 8  # a candidate's flat index (int64)
POOL_BYTES = 24  # the ranking pool: up to two entries (index and float32 sum) per ranked candidate


def candidate_count(factor: float, k: int, graftable: int) -> int:
    """|C| = min(⌈c·k⌉, graftable): 1.1·10 is 11, not 12."""
    return min(math.ceil(round(factor * k, 6)), graftable)


@dataclass(frozen=True)
class Plan:
    """How mask learning runs: the learner the request names, over how many candidates, and what memory decided (what
    is kept or recomputed, mapped or copied), with what it is expected to hold (bytes). Only the last part reads the
    machine: the region is the request's, the same whatever the free memory."""

    learner: str  # "full" (--candidates all) or "candidate" (auto or a factor): the request's choice alone
    asked: str  # the request's --candidates: "auto", "all" or a factor
    device: str
    graftable: int
    model_bytes: int
    state_bytes: int  # what the learner holds beside the working model at most
    full_bytes: int  # what the full learner would hold (its logits, σ(ℓ) and δ, θ_pre and θ_ft read between passes)
    free_bytes: int  # free on the device that decided
    count: int | None = None  # |C| at the start
    room: int | None = None  # |C| at most, once grown
    factor: float | None = None
    rank: str | None = None
    activation_bytes: int | None = None  # what one step's forward pass keeps for the backward pass
    checkpoint_every: int = 0
    layers: int = 0
    maps_blocks: bool = False
    memory: str = "auto"  # the request's --memory: "fast" keeps, "lean" recomputes, "auto" keeps what has room
    holds: bool = False  # the full learner keeps σ(ℓ) and δ between passes
    brings_over: bool = False  # θ_pre and θ_ft of a lazy pair copied onto the device once, not read at every step
    checkpoint_asked: bool = False  # --checkpoint-every was given: the plan did not decide it

    @property
    def peak(self) -> float:
        """The expected resident peak in model sizes: the working model, the learner's state and a step's activations
        (as many as the checkpointing keeps), the interpreter and libraries not counted."""
        act = _kept(self.activation_bytes or 0, self.checkpoint_every, self.layers)
        return (self.model_bytes + self.state_bytes + act) / max(self.model_bytes, 1)

    def describe(self) -> str:
        """The line that says the plan: which learner (the request's) and how it runs (the machine's)."""
        if self.learner == "full":
            head = "full learner (a logit per graftable parameter, as --candidates all asks)"
        else:
            grows = f", grows to {self.room:,}" if self.room and self.room > (self.count or 0) else ""
            ranked = "inside the larger region" if self.rank == "the larger region" else f"ranked by {self.rank}"
            head = (f"candidate learner, C = {self.count:,} of {self.graftable:,} (c = {self.factor:.3g}, "
                    f"{ranked}{grows})")
        how = []
        if self.holds:
            how.append("σ(ℓ) and δ kept between passes")
        if self.brings_over:
            how.append("θ_pre and θ_ft copied onto the device")
        if self.checkpoint_every:
            every = "every" if self.checkpoint_every == 1 else f"every {self.checkpoint_every}-th"
            why = "as --memory lean asks" if self.memory == "lean" and not self.checkpoint_asked else "as asked"
            if self.memory == "auto" and self.activation_bytes is not None and not self.checkpoint_asked:
                why = (f"a step's {memory(self.activation_bytes)} of activations would not fit in a quarter of the "
                       f"{memory(self.free_bytes)} free")
            how.append(f"{every} layer recomputed ({why})")
        if self.maps_blocks:
            how.append("large blocks mapped")
        known = "" if self.activation_bytes is not None else " before activations"
        return (f"mask learning: {head}, expected peak {self.peak:.2f} model sizes{known} on {self.device}"
                + "".join(f", {h}" for h in how))

    def record(self) -> dict:
        """What a region file keeps of the plan."""
        keep = asdict(self)
        keep["peak"] = round(self.peak, 3)
        return keep

    def lighter(self) -> str:
        """The flags that hold less, for a line about running out of memory (a smaller C is another region: said as
        such)."""
        flags = [] if self.checkpoint_every or not self.layers else ["--checkpoint-every 1"]
        if self.memory != "lean":
            flags.append("--memory lean")
        flags += ["--logit-dtype bfloat16", "a smaller --batch-size"]
        other = (f"--candidates {AUTO_FACTOR:g} (C = {AUTO_FACTOR:g}·k instead of a logit per parameter)"
                 if self.learner == "full" else
                 f"--candidates {max(1.0, (self.factor or AUTO_FACTOR) / 2):g}")
        return ", ".join(flags) + f"; or {other}, which learns another region"


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


def _plus(*needs: dict[torch.device, int]) -> dict[torch.device, int]:
    out: dict[torch.device, int] = {}
    for need in needs:
        for d, b in need.items():
            out[d] = out.get(d, 0) + b
    return out


def plan(model: torch.nn.Module, params: dict[str, torch.nn.Parameter], pre, ft, k: int,
         config: LearnConfig = LearnConfig(), sample: dict | None = None, within: Region | None = None) -> Plan:
    """The learner the request names, run as the machine allows (see the module's notes); a ``ModelError`` in one
    line, naming what would fit, where even the request cannot.

    ``sample`` is a training batch: one row of it measures a step's activations (``compute.saved_activations``), which
    the learner recomputes layer by layer where they have no room. ``within`` is C given (a larger region, inside which
    a search over budgets learns a smaller one): the candidate learner over it, neither ranked nor grown."""
    asked = str(config.candidates).strip().lower()
    factor = LearnConfig.candidate_factor(asked)
    learner = "full" if asked == "all" and within is None else "candidate"
    if learner == "candidate" and factor is None:
        factor = AUTO_FACTOR
    mode = config.memory
    if mode not in MEMORY_MODES:
        raise ValueError(f"unknown memory mode '{mode}' (use {', '.join(MEMORY_MODES)})")
    graftable = sum(p.numel() for p in params.values())
    on = _bytes(params, lambda p: 1)  # values per device
    device = max(on, key=on.get)
    logit = torch.empty((), dtype=getattr(torch, config.logit_dtype)).element_size()
    adam = 8 if config.optimizer == "adam" else 0
    lazy = not (isinstance(pre, dict) and isinstance(ft, dict))
    placed = isinstance(pre, Placed) or isinstance(ft, Placed)
    full_least = _bytes(params, lambda p: logit + adam)  # ℓ (and Adam's moments): what the full learner cannot do without
    held = _bytes(params, lambda p: logit + p.element_size())  # σ(ℓ) and δ
    copies = _bytes(params, lambda p: 2 * p.element_size())  # θ_pre and θ_ft on the device
    layers, activations = 0, None
    try:
        layers = len(compute.checkpointable_layers(model))
    except ModelError:
        pass
    if sample is not None:
        activations = compute.saved_activations(model, sample, params.values())
    widest = max(p.element_size() for p in params.values())
    per_candidate = INDEX_BYTES + logit + 4 * widest + adam
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    free = compute.free_memory(device)
    full_bytes = sum(_plus(full_least, held, copies if lazy else {}).values())

    def spread(top: int) -> dict[torch.device, int]:  # C's bytes spread over devices as the parameters are
        return {d: math.ceil(top * n / graftable) for d, n in on.items()}

    def candidate_need(c: float) -> tuple[int, int, dict[torch.device, int]]:
        count = candidate_count(c, k, graftable)
        room = min(graftable, count + k) if config.grow_every else count
        return count, room, spread(max(2 * room * per_candidate, count * (per_candidate + POOL_BYTES)))  # a growing C
        # holds two layouts

    # which learner: the request's; refused where even it cannot fit
    count = room = None
    if learner == "full":
        state = full_least
        if not compute.fits(state, share=1):
            raise ModelError(f"--candidates all cannot fit: a region logit per graftable parameter takes "
                             f"{memory(sum(state.values()))} and {memory(free)} are free on {device}; "
                             f"give a factor such as --candidates {AUTO_FACTOR:g} (another region: the candidate "
                             "learner's), or a machine with more memory")
    elif within is not None:
        count = sum(int(i.numel()) for i in within.values())
        factor, room = count / max(k, 1), count
        state = spread(count * (per_candidate + POOL_BYTES))
        if not compute.fits(state, share=1):
            raise ModelError(f"mask learning cannot fit on {device}: the {count:,} parameters of the larger region "
                             f"take {memory(sum(state.values()))} with {memory(free)} free; try --logit-dtype bfloat16 "
                             "or a machine with more memory")
    else:
        count, room, state = candidate_need(factor)
        if not compute.fits(state, share=1):
            raise ModelError(_cannot_fit(factor, count, state, free, device, candidate_need))
    # how it runs: what the machine decides, each piece kept where it has room beside what is already kept
    holds = brings_over = False
    if learner == "full":
        if placed and mode != "lean" and compute.fits(_plus(state, copies)):
            brings_over, state = True, _plus(state, copies)
        if mode == "fast" or (mode == "auto" and compute.fits(_plus(state, held))):
            holds, state = True, _plus(state, held)
    every = config.checkpoint_every
    if every is None:
        if not layers:
            every = 0
        elif mode == "auto":
            every = 1 if activations is not None and not compute.fits(_plus(state, {device: activations})) else 0
        else:
            every = 1 if mode == "lean" else 0
    maps = learner == "candidate" and compute.maps_blocks(mode, params)
    return Plan(learner, asked, str(device), graftable, model_bytes, sum(state.values()), full_bytes, free,
                count=count, room=room, factor=factor,
                rank=None if learner == "full" else "the larger region" if within is not None else config.rank,
                activation_bytes=activations, checkpoint_every=every, layers=layers, maps_blocks=maps, memory=mode,
                holds=holds, brings_over=brings_over, checkpoint_asked=config.checkpoint_every is not None)


def _cannot_fit(factor: float, count: int, need: dict, free: int, device, candidate_need) -> str:
    """The line for a candidate set that cannot fit at all: what it takes, and the largest factor that would fit."""
    fitting = None
    for c in sorted({max(1.0, math.floor(factor * 2 ** -i)) for i in range(1, 12)}, reverse=True):
        if c < factor and compute.fits(candidate_need(c)[2], share=1):
            fitting = c
            break
    instead = (f"--candidates {fitting:g} fits (another region: a smaller C), " if fitting else "")
    return (f"mask learning cannot fit on {device}: C = {count:,} candidates (c = {factor:g}) take "
            f"{memory(sum(need.values()))} with {memory(free)} free; {instead}or try --logit-dtype bfloat16, a "
            "smaller budget, or a machine with more memory")


def make_learner(the_plan: Plan, model, params, pre, ft, k: int, config: LearnConfig, start: Region | None = None,
                 batches: Iterable[dict] | None = None, cancel: threading.Event | None = None,
                 within: Region | None = None, laid: Region | None = None) -> MaskLearner:
    """The learner ``the_plan`` names, run as it decided; ``laid``: the candidate set a checkpoint kept (not ranked
    again)."""
    config = replace(config, checkpoint_every=the_plan.checkpoint_every)
    if the_plan.learner == "full":
        return MaskLearner(model, params, pre, ft, k, config, start, holds=the_plan.holds,
                           brings_over=the_plan.brings_over)
    return CandidateLearner(model, params, pre, ft, k, config, start, count=the_plan.count, room=the_plan.room,
                            batches=batches if config.rank == "gradient" and laid is None else None, cancel=cancel,
                            maps_blocks=the_plan.maps_blocks, within=within, laid=laid)


# -- checkpoints: a learning that is moved or interrupted continues where it was -----------------------------------
SAME_REGION = ("memory", "checkpoint_every")  # settings that change how a learner runs, never what it learns
_DTYPES = {dtype: name for name, dtype in DTYPES.items()}  # as a safetensors header names them


def identity(region: Region | None) -> str | None:
    """A digest of a region (names and flat indices), to tell that a checkpoint started where this learning does."""
    if region is None:
        return None
    digest = hashlib.sha256()
    for name in sorted(region):
        digest.update(name.encode() + b"\0" + region[name].to(torch.int64).cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _settings(config: LearnConfig) -> dict:
    return {n: v for n, v in json.loads(json.dumps(asdict(config), default=str)).items() if n not in SAME_REGION}


def _graftable(params: dict) -> str:
    return hashlib.sha256(json.dumps([[n, list(p.shape), str(p.dtype)] for n, p in params.items()]).encode()).hexdigest()


def write_checkpoint(path: Path, tensors: dict[str, torch.Tensor], scalars: dict) -> int:
    """One safetensors file holding ``tensors`` and, in its metadata, ``scalars`` as JSON; written atomically, one
    tensor at a time (ℓ's tensors are views into one buffer: no copy of the whole state is made). Returns its bytes."""
    names = sorted(tensors)
    header, offset = {}, 0
    for name in names:
        t = tensors[name]
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {resume.SCALARS: json.dumps(scalars)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for name in names:
                t = tensors[name].detach().to("cpu").contiguous().reshape(-1)
                f.write(t.view(torch.uint8).numpy().data if t.numel() else b"")

    atomic_write(path, write)
    return 8 + len(text) + offset


class Keeper:
    """The checkpoint of one mask learning in a job: read once when the learning starts (checked before it is
    trusted: a file on disk is data, never authority), written every CHECKPOINT_SECONDS of steps, when the job is
    stopped to continue elsewhere, and once the last step is done (a re-run of the job then skips this learning).
    Outside a job (no place) it does nothing."""

    def __init__(self, k: int, config: LearnConfig, params: dict, start: Region | None, within: Region | None):
        self.expected = {"k": int(k), "steps": int(config.steps), "config": _settings(config),
                         "graftable": _graftable(params), "start_region": identity(start),
                         "within_region": identity(within)}
        key = hashlib.sha256(json.dumps(self.expected, sort_keys=True).encode()).hexdigest()[:16]
        place = resume.place(key)  # what it learns names its place: a re-run finds it whichever learnings it skips
        self.path = None if place is None else place / resume.CHECKPOINT
        self.saved_at = time.monotonic()
        self.tensors: dict[str, torch.Tensor] | None = None
        self.scalars: dict | None = None
        if self.path is not None and self.path.is_file():
            self._read()

    def _read(self) -> None:
        try:
            scalars = resume.scalars(self.path)
            for name, value in self.expected.items():
                if scalars.get(name) != value:
                    raise ValueError(f"its {name} is not this learning's")
            done = scalars.get("steps_done")
            if not isinstance(done, int) or not 0 < done <= self.expected["steps"]:
                raise ValueError(f"its step count {done!r} is not one of 1..{self.expected['steps']}")
            with safe_open(str(self.path), framework="pt", device="cpu") as f:
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except Exception as err:  # noqa: BLE001 - any damage: the learning starts over
            self.ignore(err)
            return
        self.tensors, self.scalars = tensors, scalars

    def ignore(self, why: BaseException | str) -> None:
        log.warning("mask learning starts over: the checkpoint %s cannot be used (%s)", self.path, why)
        self.tensors = self.scalars = None

    @property
    def learner(self) -> str | None:
        """The learner the checkpoint kept (None: none to continue)."""
        return None if self.scalars is None else self.scalars.get("learner")

    def laid(self, params: dict) -> Region | None:
        """The candidate set the checkpoint kept, checked against the graftable tensors (None: none, or one that does
        not fit, said in the log)."""
        if self.tensors is None:
            return None
        laid = CandidateLearner.laid_out(self.tensors)
        for name, idx in laid.items():
            size = params[name].numel() if name in params else 0
            if not (name in params and idx.dtype == torch.int64 and idx.dim() == 1 and idx.numel()
                    and int(idx[0]) >= 0 and int(idx[-1]) < size and bool((idx[1:] > idx[:-1]).all())):
                self.ignore(f"its candidate set in '{name}' is not a set of that tensor's positions")
                return None
        return laid

    def restore(self, learner: MaskLearner) -> tuple[int, int] | None:
        """Put the checkpoint into ``learner``; returns where its batches stand (epoch, position), None where it does
        not fit (said in the log: the learning starts over)."""
        try:
            own, _ = learner.state()
            if identity(learner.base) != self.scalars.get("base"):
                raise ValueError("it started from another region")
            if set(own) | {"rng"} != set(self.tensors) | {"rng"}:
                raise ValueError("its tensors are not this learner's")
            for name, t in own.items():
                got = self.tensors[name]
                if got.dtype != t.dtype or got.shape != t.shape:
                    raise ValueError(f"'{name}' is {got.dtype} {tuple(got.shape)}, not {t.dtype} {tuple(t.shape)}")
            if not all(bool(torch.isfinite(t).all()) for n, t in self.tensors.items() if n.startswith(("logit.", "adam_"))):
                raise ValueError("it holds values that are not finite")
            epoch, position = self.scalars["epoch"], self.scalars["position"]
            if not (isinstance(epoch, int) and isinstance(position, int) and epoch >= 0 and position >= 0):
                raise ValueError("its batch position is not one")
            learner.load_state(self.tensors, self.scalars)
        except Exception as err:  # noqa: BLE001
            self.ignore(err)
            return None
        rng = self.tensors.get("rng")
        if rng is not None and rng.dtype == torch.uint8:
            with contextlib.suppress(RuntimeError):  # another torch's generator: the steps draw nothing from it
                torch.set_rng_state(rng)
        self.tensors = None  # held once: the learner has them now
        log.info("mask learning continues from step %d of %d (%s)", learner.steps_done, self.expected["steps"],
                 self.path)
        return epoch, position

    def save(self, learner: MaskLearner, batches, force: bool = False) -> None:
        """Write the learner's state where this learning keeps it, if CHECKPOINT_SECONDS have passed (or ``force``)."""
        if self.path is None or (not force and time.monotonic() - self.saved_at < resume.CHECKPOINT_SECONDS):
            return
        tensors, scalars = learner.state()
        scalars = {**scalars, **self.expected, "base": identity(learner.base), "epoch": batches.epoch,
                   "position": batches.position}
        began = time.perf_counter()
        try:
            size = write_checkpoint(self.path, {**tensors, "rng": torch.get_rng_state()}, scalars)
        except OSError as err:  # a full disk: the learning goes on, only less of it is kept
            log.warning("mask learning could not keep its place at step %d: %s", learner.steps_done, err)
        else:
            log.debug("mask learning kept its place at step %d: %s in %.3f s", learner.steps_done, memory(size),
                      time.perf_counter() - began)
        self.saved_at = time.monotonic()


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
    within: Region | None = None,
) -> tuple[Region, dict[str, torch.Tensor]]:
    """Learn a region of exactly ``k`` graftable parameters (Eq. 2–4) with the learner the request names.

    ``make_batches(epoch)`` yields model inputs with ``labels``. ``start`` replaces γ_base
    (top-movement) as the region the relaxation starts from. The working parameters are left
    at θ_pre afterwards, also when cancelled or out of memory. ``announce`` gets the plan's line before any work,
    ``details`` (a dict) what the region file keeps of the plan and of C; ``within`` a C given (see ``plan``). Returns the region and the final logits ℓ,
    one tensor per graftable parameter (for the candidate learner a ``CandidateLogits`` that makes each when read).
    """
    sample = next(iter(make_batches(0)), None)
    the_plan = plan(model, params, pre, ft, k, config, sample, within)
    del sample
    if announce is not None:
        announce(the_plan.describe())
    log.debug("%s; %s", the_plan.describe(), compute.memory_in_use(the_plan.device))
    learner = None
    keeper = Keeper(k, config, params, start, within)
    try:
        learner, batches = _learner(keeper, the_plan, model, params, pre, ft, k, config, start, make_batches, cancel,
                                    within)
        log.debug("learner built; %s", compute.memory_in_use(the_plan.device))
        try:
            while learner.steps_done < config.steps:
                if cancel is not None and cancel.is_set():
                    raise Cancelled("mask learning cancelled")
                report = learner.step(next(batches), count_region=progress is not None)
                try:
                    if progress is not None:
                        progress(report)
                except Paused:  # stopped to continue elsewhere: from this step
                    keeper.save(learner, batches, force=True)
                    raise
                keeper.save(learner, batches, force=learner.steps_done == config.steps)
        finally:
            region = learner.finish()
        log.debug("mask learning done; %s", compute.memory_in_use(the_plan.device))
    except Exception as err:
        if compute.out_of_memory(err):
            raise ModelError(out_of_memory_line(err, the_plan, "mask learning")) from None
        raise
    if details is not None:
        details.update({"plan": the_plan.record(), "line": the_plan.describe(),
                        **(learner.record() if hasattr(learner, "record") else {"learner": "full"})})
    return region, learner.full_logits()


def _learner(keeper: Keeper, the_plan: Plan, model, params, pre, ft, k, config, start, make_batches, cancel, within):
    """The learner and its batches: continued from ``keeper``'s checkpoint where it has one that fits, else new."""
    if keeper.learner is not None and keeper.learner != the_plan.learner:
        keeper.ignore(f"it was kept by the {keeper.learner} learner, and the {the_plan.learner} learner runs")
    laid = keeper.laid(params) if keeper.learner == "candidate" else None
    learner = make_learner(the_plan, model, params, pre, ft, k, config, start, make_batches(0), cancel, within,
                           laid=laid)
    if keeper.scalars is None:
        return learner, cycle_batches(make_batches)
    at = keeper.restore(learner)
    if at is not None:
        return learner, cycle_batches(make_batches, *at)
    if laid is not None:  # built around the checkpoint's C: built again, ranking its own
        learner._leave()
        learner = make_learner(the_plan, model, params, pre, ft, k, config, start, make_batches(0), cancel, within)
    return learner, cycle_batches(make_batches)


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
