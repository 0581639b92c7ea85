"""Skill localization by grafting — Panigrahi, Saunshi, Zhao & Arora, ICML 2023 (arXiv 2302.06600).

Notation of the paper:

    θ_pre, θ_ft                      base and fine-tuned parameters, δ = θ_ft − θ_pre (movement)
    Eq. 1  graft      θ̄(γ) = θ_pre + γ ⊙ δ                 γ ∈ {0,1}^d is the region
    Eq. 2  relaxation γ(S) = γ_base ⊙ (1 − σ(S)) + (1 − γ_base) ⊙ σ(S)
    Eq. 3  mask step  S ← S − η ∇_S L(θ̄(γ(S)))           a few steps on the task loss
    Eq. 4  binarise   γ = 1[γ(S) ≥ 0.5]
    Fig. 7 WiSE       θ_pre + α·δ and θ_pre + α·γ⊙δ, α ∈ [0, 1]

γ_base is the top-k of |δ|, and S starts where σ(S) ≈ 0 so the relaxed graft starts at γ_base.

Two implementation choices, both exact re-statements rather than changes:

* Eq. 2 equals γ = σ(ℓ) with the *region logit* ℓ = −S on γ_base and ℓ = +S elsewhere, and a
  gradient step on S is the same step on ℓ. We keep ℓ: it needs no γ_base mask in memory and its
  top-k *is* the region, so binarisation can keep the budget exactly (ties in a saturated
  sigmoid cannot break it).
* ∇_ℓ L = ∇_θ L ⊙ δ ⊙ σ'(ℓ) (chain rule through Eq. 1), so a mask step is one ordinary
  forward/backward of the working model plus a few element-wise passes: no autograd graph
  over the mask and no second copy of the model.

The paper's step is plain SGD with a learning rate tuned per model (1e7 for RoBERTa). Gradient
scale changes with the model, the loss and the movement, so the default here divides the step
by the root-mean-square of ∇_ℓ over the graftable parameters: one step size, in logit units,
serves every model.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch

from . import compute
from .errors import ModelError
from .config import LOGIT_DTYPES, MEMORY_MODES, LearnConfig
from .weights import release

log = logging.getLogger(__name__)

Region = dict[str, torch.Tensor]  # parameter name -> sorted flat indices inside the region
BUDGET_MARGIN = 0.01  # in logit units: where a budget-true learner leaves the (k+1)-th largest ℓ below 0


# -- Eq. 1 -------------------------------------------------------------------------------------
def graft(pre: torch.Tensor, ft: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """θ_pre + γ⊙δ for a binary γ: the fine-tuned value inside the region, the base one outside.

    Written as a selection so it is exact in floating point (``pre + (ft − pre)`` may round).
    """
    return torch.where(gamma.bool(), ft, pre)


def region_to_mask(region: Region, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """γ as one boolean tensor per graftable parameter (True inside the region)."""
    masks = {}
    for name, shape in shapes.items():
        m = torch.zeros(math.prod(shape), dtype=torch.bool)
        if name in region:
            m[region[name]] = True
        masks[name] = m.view(shape)
    return masks


def region_size(region: Region) -> int:
    return sum(int(i.numel()) for i in region.values())


# -- Fig. 7 ---------------------------------------------------------------------------------------
def wise(pre: torch.Tensor, ft: torch.Tensor, alpha: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """WiSE: θ_pre + α·δ, or θ_pre + α·γ⊙δ with a boolean ``mask`` γ.

    ``torch.lerp`` is exact at both ends (α = 0 gives θ_pre, α = 1 gives θ_ft bit for bit), so
    WiSE at α = 1 is the model or the graft itself, not a rounding of it.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"α must be in [0, 1], got {alpha}")
    mixed = torch.lerp(pre, ft, alpha)
    return mixed if mask is None else torch.where(mask, mixed, pre)


# -- exact top-k across tensors -----------------------------------------------------------------
def top_k(scores, k: int) -> Region:
    """The k largest scores over all tensors, exactly k of them.

    Ties at the threshold go to the earliest positions (tensor order, then flat index), so the
    result is deterministic and never larger than k. ``scores`` maps names to tensors, and may
    compute each on access (read three times): no concatenated copy of all scores is made, so
    finding a region costs memory per tensor and per k, not per model.
    """
    names = list(scores)
    total = sum(scores.numel(n) if hasattr(scores, "numel") else scores[n].numel() for n in names)
    k = max(0, min(int(k), total))
    if k == 0:
        return {}
    threshold = kth_largest(scores, names, k).cpu()  # a host scalar: compared with tensors on any device
    region: Region = {}
    need = k - sum(int((scores[n].detach() > threshold).sum()) for n in names)  # ties to fill, earliest first
    for name in names:  # on the scores' own device: a GPU's are not copied over whole
        flat = scores[name].detach().reshape(-1).float()
        chosen = flat > threshold
        if need > 0:
            ties = (flat == threshold).nonzero().squeeze(1)[:need]
            chosen[ties] = True
            need -= int(ties.numel())
        idx = chosen.nonzero().squeeze(1).cpu()
        if idx.numel():
            region[name] = idx
    return region


def kth_largest(scores, names, k: int) -> torch.Tensor:
    """The k-th largest score, reading the tensors once and holding about 2k candidates at a time.

    The k-th largest of the scores read so far (the floor) can only rise as more are read, and the
    pool already holds k scores at or above it: a later score can change the answer only by lying
    above the floor. So each slice of a tensor gives only those (whole, a 50 M-value embedding's
    kthvalue took 0.58 GB more), and the pool is cut back to the scores at or
    above its own k-th largest whenever it has doubled (and passed 2k). Equal scores, the bane of
    saturated logits, enter only while they can matter.
    """
    def kth(values: torch.Tensor) -> torch.Tensor:
        return torch.kthvalue(values, values.numel() - k + 1).values

    pool, held, floor, limit = [], 0, None, 2 * k
    where = None  # the pool stays on the first tensor's device (a GPU's scores are not copied to the host)
    for name in names:
        flat = scores[name].detach().reshape(-1).float()
        where = where or flat.device
        if bool(flat.isnan().any()):
            raise ModelError(f"'{name}' has NaN scores, so no region can be ranked: the checkpoint holds NaN weights, "
                             "or mask learning diverged (try float32 logits or a smaller --lr)")
        for part in compute.chunks(flat, everywhere=True):  # a slice at a time: kthvalue copies what it is given
            part = flat[part]
            part = (part if floor is None else part[part > floor.to(part.device)]).to(where)  # filtered, then moved
            pool.append(part)
            held += part.numel()
            if held >= limit:
                merged = torch.cat(pool)
                floor = kth(merged)
                kept = merged[merged >= floor]  # more than k only where scores tie at the floor
                pool, held, limit = [kept], kept.numel(), max(2 * k, 2 * kept.numel())
    return kth(torch.cat(pool))


class Movement:
    """|δ| per tensor, computed when read: the ranking behind γ_base without a second model in memory."""

    def __init__(self, pre, ft, names):
        self.pre, self.ft, self.names = pre, ft, list(names)

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)

    def numel(self, name) -> int:
        return self.pre.numel(name) if hasattr(self.pre, "numel") else self.pre[name].numel()

    def __getitem__(self, name):
        moved = (self.ft[name] - self.pre[name]).abs()
        release(self.pre, name)  # read from mapped files: their pages go back as each tensor is done
        release(self.ft, name)
        return moved


def movement(pre: dict[str, torch.Tensor], ft: dict[str, torch.Tensor], names: Iterable[str]) -> dict[str, torch.Tensor]:
    """|δ| per graftable tensor: the ranking behind γ_base."""
    return {n: (ft[n] - pre[n]).abs() for n in names}


def base_region(pre: dict[str, torch.Tensor], ft: dict[str, torch.Tensor], names: list[str], k: int) -> Region:
    """γ_base: the k parameters that moved most during fine-tuning."""
    return top_k(Movement(pre, ft, names), k)


# -- Eq. 2 -------------------------------------------------------------------------------------
def initial_logits(
    base: Region, shapes: dict[str, tuple[int, ...]], bias: float,
    device: torch.device | str | dict[str, torch.device] = "cpu", dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """ℓ = +bias on γ_base and −bias elsewhere, i.e. S = −bias everywhere (σ(S) ≈ 0).

    ``device`` is one device or one per tensor. The logits on a device are views into one buffer,
    so the region is counted in a few passes over it rather than a few per tensor.
    """
    where = {n: torch.device(device[n] if isinstance(device, dict) else device) for n in shapes}
    logits, flat = compute.flat_views(shapes, where, dict.fromkeys(shapes, dtype))
    for buffer in flat.values():
        buffer.fill_(-bias)
    for name, idx in base.items():
        if name in logits:
            logits[name].view(-1)[idx.to(where[name])] = bias
    return logits


def relaxed(logit: torch.Tensor) -> torch.Tensor:
    """γ(S) of Eq. 2 in logit form."""
    return torch.sigmoid(logit)


# -- Eq. 4 -------------------------------------------------------------------------------------
def binarise(logits: dict[str, torch.Tensor], k: int, rule: str = "topk") -> Region:
    """Exact top-k of the region logits (default), or the paper's rounding capped at k."""
    if rule == "topk":
        return top_k(logits, k)
    if rule == "round":
        rounded = {n: (l > 0).reshape(-1).nonzero().squeeze(1).cpu() for n, l in logits.items()}
        if region_size(rounded) <= k:
            return {n: i for n, i in rounded.items() if i.numel()}
        return top_k(logits, k)  # the budget is a promise: rounding that overshoots is cut to k
    raise ValueError(f"unknown binarisation rule '{rule}' (use 'topk' or 'round')")


class RegionCounter:
    """Counts #{ℓ > 0}, the size of the rounded region, and how many of those lie in ``base``.

    Reads the buffer the logits of a device are views of (``initial_logits``) a chunk at a time,
    through one reused bool buffer (a fresh bool copy of every tensor costs page faults at scale),
    and the base's positions in it, found once, in one gather. Logits that are not such views are
    read one by one.
    """

    def __init__(self, logits: dict[str, torch.Tensor], base: Region):
        cut = {n: l if l._base is None else l._base for n, l in logits.items()}  # the buffer each was cut from
        filled: dict[int, int] = {}
        for n, l in logits.items():
            filled[id(cut[n])] = filled.get(id(cut[n]), 0) + l.numel()
        root = {n: cut[n] if filled[id(cut[n])] == cut[n].numel() else l for n, l in logits.items()}
        roots = {id(r): r.view(-1) for r in root.values()}
        where: dict[int, list[torch.Tensor]] = {}
        for name, idx in base.items():
            offset = logits[name].storage_offset() - root[name].storage_offset()
            where.setdefault(id(root[name]), []).append(idx.to(root[name].device) + offset)
        self.buffers = list(roots.values())
        self.base = [(roots[r], torch.cat(i)) for r, i in where.items()]

    def __call__(self, scratch: compute.Scratch) -> tuple[int, int]:
        size = 0
        for flat in self.buffers:  # one buffer per device: each count is read on its own device
            here = 0  # count_nonzero: a bool .sum() widens every element to int64, 6× slower
            for c in compute.chunks(flat, everywhere=True):  # a GPU's count too: no int64 copy of ℓ
                here += torch.count_nonzero(torch.gt(flat[c], 0, out=scratch.take(2, flat[c], torch.bool)))
            size += int(here)
        kept = sum(int(torch.count_nonzero(flat[idx] > 0)) for flat, idx in self.base)
        return size, kept


# -- Eq. 3 -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepReport:
    """What the progress callback sees after each mask step."""

    step: int
    steps: int
    loss: float
    accuracy: float
    region_size: int | None  # parameters with γ(S) ≥ 0.5 (None when the step was not counted)
    swapped: int | None  # of those, how many lie outside γ_base


ProgressFn = Callable[[StepReport], None]


class CycledBatches(Iterator[dict]):
    """``make_batches(epoch)`` for epoch 0, 1, 2, …, one batch at a time, knowing where it stands (``epoch``, and
    ``position`` within it): a learning continued from a checkpoint continues its batches at the same place, by
    building that epoch's batches again and passing the ones already taken."""

    def __init__(self, make_batches: Callable[[int], Iterable[dict]], epoch: int = 0, position: int = 0):
        self.make_batches, self.epoch, self.position = make_batches, int(epoch), int(position)
        self._current: Iterator[dict] | None = None

    def __next__(self) -> dict:
        for _ in range(2):  # the epoch under way, then (once) a fresh one
            if self._current is None:
                self._current = iter(self.make_batches(self.epoch))
                for _ in range(self.position):  # batches a checkpoint's steps already took
                    if next(self._current, None) is None:
                        raise ValueError(f"epoch {self.epoch} has fewer than {self.position} batches now: the batches "
                                         "changed since the checkpoint was written")
            batch = next(self._current, None)
            if batch is not None:
                self.position += 1
                return batch
            if self.position == 0:
                raise ValueError("mask learning needs at least one training batch")
            self.epoch, self.position, self._current = self.epoch + 1, 0, None
        raise ValueError("mask learning needs at least one training batch")


def cycle_batches(make_batches: Callable[[int], Iterable[dict]], epoch: int = 0, position: int = 0) -> CycledBatches:
    """The batches of every epoch in turn, from ``position`` of ``epoch`` (see ``CycledBatches``)."""
    return CycledBatches(make_batches, epoch, position)


class MaskLearner:
    """Eq. 3 one step at a time, on the working model's graftable parameters.

    Holds the region logits ℓ (one value per graftable parameter, in ``config.logit_dtype``;
    two float32 more for Adam) and, where ``holds`` (or ``config.memory`` "fast") says so, σ(ℓ) and δ (see ``Held``);
    ``brings_over`` copies a lazy pair's θ_pre and θ_ft onto the device once. Both are the memory plan's to decide
    (``learning.plan``), never this class's: the region is the same either way.
    The working parameters are overwritten while learning and put back to θ_pre by ``finish``.
    This is the full learner; ``candidates.CandidateLearner`` keeps ℓ over a candidate set only, and
    the request picks one of the two (``config.candidates``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        params: dict[str, torch.nn.Parameter],
        pre: dict[str, torch.Tensor],
        ft: dict[str, torch.Tensor],
        k: int,
        config: LearnConfig = LearnConfig(),
        start: Region | None = None,
        *,
        holds: bool = False,
        brings_over: bool = False,
    ):
        layers = self._accept(model, params, pre, ft, k, config)
        if brings_over:  # θ_pre and θ_ft read whole at every step: copied onto the parameters' devices once
            with torch.no_grad():
                pre, ft = {n: pre[n] for n in params}, {n: ft[n] for n in params}
        self.pre, self.ft = pre, ft
        # γ_base: top-movement by default; the paper's multi-task runs start from ∅ (App. C.2),
        # purification from a union of regions
        self.base = base_region(pre, ft, self.names, k) if start is None else start
        shapes = {n: tuple(params[n].shape) for n in self.names}
        self.logits = initial_logits(self.base, shapes, config.sigmoid_bias, {n: params[n].device for n in self.names},
                                     getattr(torch, config.logit_dtype))
        self.counter = RegionCounter(self.logits, self.base)
        self.held = Held.make(params, pre, ft, self.logits) if holds or config.memory == "fast" else None
        self._enter(layers)
        self._train_only(params.values())
        self._begin()

    def _accept(self, model, params, pre, ft, k, config) -> list | None:
        """Refuse a bad config before any work, then keep what both learners share; returns the layers to checkpoint."""
        if config.optimizer not in {"normalized", "adam", "sgd"}:
            raise ValueError(f"unknown optimizer '{config.optimizer}' (use normalized, adam or sgd)")
        if config.logit_dtype not in LOGIT_DTYPES:
            raise ValueError(f"unknown logit dtype '{config.logit_dtype}' (use {', '.join(LOGIT_DTYPES)})")
        if config.memory not in MEMORY_MODES:
            raise ValueError(f"unknown memory mode '{config.memory}' (use {', '.join(MEMORY_MODES)})")
        if (config.checkpoint_every or 0) < 0:
            raise ValueError(f"checkpoint_every must be 0 (none) or a layer count >= 1, got {config.checkpoint_every}")
        LearnConfig.candidate_factor(config.candidates)
        layers = compute.checkpointable_layers(model) if config.checkpoint_every else None  # refused before any work
        self.model, self.params, self.pre, self.ft, self.k, self.config = model, params, pre, ft, k, config
        self.names = list(params)
        self.device = params[self.names[0]].device
        self.count = sum(p.numel() for p in params.values())  # the graftable count, which "rms" averages over
        self.scratch = compute.Scratch()  # reused by every step
        return layers

    def _enter(self, layers: list | None) -> None:
        """The working model set for mask learning: no dropout (the mask, not noise, should explain the loss), its
        layers checkpointed as asked; ``finish`` undoes both."""
        self.model.eval()
        self._saved_flags = {n: p.requires_grad for n, p in self.model.named_parameters()}
        self._uncheckpoint = compute.checkpoint_layers(self.model, layers, self.config.checkpoint_every) if layers else None

    def _train_only(self, trainable: Iterable[torch.nn.Parameter]) -> None:
        """Weight gradients only where ℓ can act."""
        ids = {id(p) for p in trainable}
        for p in self.model.parameters():
            p.requires_grad_(id(p) in ids)

    def _begin(self) -> None:
        """Adam's state over ℓ, in float32 (g² underflows in 16 bits)."""
        self.adam = {n: (torch.zeros_like(l, dtype=torch.float32), torch.zeros_like(l, dtype=torch.float32))
                     for n, l in self._parts().items()} if self.config.optimizer == "adam" else None
        self.steps_done, self.scale = 0, 0.0
        compute.return_freed_memory()  # what ranking the movement used is free again

    def _parts(self) -> dict[str, torch.Tensor]:
        """What a step updates, keyed as ``_gradient`` returns ∇_ℓ L: ℓ per tensor."""
        return self.logits

    def _whole(self, size: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(Σ(∇_ℓ L)², max |∇_ℓ L|) over every graftable parameter, from those of the logits a step updates: the
        same here."""
        return size

    def _gradient(self, batch: dict[str, torch.Tensor], hard_k: int | None, need_peak: bool):
        return logit_gradient(self.model, self.params, self.pre, self.ft, self.logits, batch, hard_k, need_peak,
                              self.held, self.scratch)

    def step(self, batch: dict[str, torch.Tensor], count_region: bool = True) -> StepReport:
        """One step of Eq. 3; ``count_region=False`` skips counting the region (a pass over every logit)."""
        self.steps_done += 1
        world = compute.data_parallel()
        if world is not None:  # every process gets the same global batch and keeps its own rows
            batch, share = world.shard(batch)
        batch = {key: value.to(self.device) for key, value in batch.items()}
        hard_k = self.k if self.config.forward == "hard" else None
        need_peak = self.config.optimizer == "normalized" and self.config.norm == "max"
        out, grads, sq = self._gradient(batch, hard_k, need_peak)
        loss = out.loss.detach()
        parts = self._parts()
        if world is not None:  # ∇_ℓ of the global batch's mean loss, the same in every process
            sq, loss = world.reduce([grads[n] for n in parts], share, loss, need_peak)
        with torch.no_grad():
            sq = self._whole(sq)
            self.scale = scale = _step_scale(self.config, sq, self.count)
            first = next(iter(parts), None)  # the step is taken in the wider of ℓ's and ∇'s dtypes
            largest = torch.finfo(torch.promote_types(parts[first].dtype, grads[first].dtype)).max \
                if first is not None else math.inf
            if not (math.isfinite(float(loss)) and scale <= largest and 10 * self.config.lr <= largest):  # stop now,
                # not after the last step (adam's first step is 10 lr)
                raise ModelError(f"mask learning diverged at step {self.steps_done} (loss {float(loss):g}, step "
                                 f"size {scale:g}) with --lr {self.config.lr:g}: lower --lr")
            for n, ell in parts.items():
                g = grads[n]
                if self.adam is not None:
                    m, v = self.adam[n]
                    m.mul_(0.9).add_(g, alpha=0.1)
                    v.mul_(0.999).addcmul_(g, g, value=0.001)
                    flat_v, flat_m, flat_ell = v.view(-1), m.view(-1), ell.view(-1)
                    for c in compute.chunks(flat_v):  # on CPU a slice at a time: no temporary the size of all of ℓ
                        denom = torch.div(flat_v[c], 1 - 0.999**self.steps_done, out=self.scratch.take(3, flat_v[c]))
                        flat_ell[c].addcdiv_(flat_m[c], denom.sqrt_().add_(1e-12),
                                             value=-self.config.lr / (1 - 0.9**self.steps_done))
                else:
                    ell.sub_(g, alpha=scale)
            if self.config.within_budget:
                self._keep_within_budget()
            size, kept = self.counter(self.scratch) if count_region else (None, None)
            accuracy = float(out.accuracy) if hasattr(out, "accuracy") else \
                float((out.logits.argmax(-1) == batch["labels"]).float().mean())
        return StepReport(self.steps_done, self.config.steps, float(loss), accuracy, size,
                          None if size is None else size - kept)

    # -- where it stands: what a checkpoint keeps --------------------------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Everything the next steps read, as (tensors, JSON scalars): ℓ, Adam's moments, ``steps_done`` and the last
        step's scale. The tensors are the learner's own (not copies): written out before the next step. A learner
        built the same way and given them back by ``load_state`` takes the steps this one would, bit for bit."""
        tensors = {f"logit.{n}": ell for n, ell in self.logits.items()}
        for n, (m, v) in (self.adam or {}).items():
            tensors[f"adam_m.{n}"], tensors[f"adam_v.{n}"] = m, v
        return tensors, {"learner": "full", "steps_done": self.steps_done, "scale": self.scale}

    @torch.no_grad()
    def load_state(self, tensors: dict[str, torch.Tensor], scalars: dict) -> None:
        """Take back what ``state`` gave (checked by the caller against this learner's own ``state``: names, shapes,
        dtypes)."""
        own, _ = self.state()
        for name, into in own.items():
            into.copy_(tensors[name].to(into.device))
        self.steps_done, self.scale = int(scalars["steps_done"]), float(scalars["scale"])
        if self.held is not None:  # σ(ℓ) as the logits now are
            for n, ell in self.logits.items():
                torch.sigmoid(ell, out=self.held.sigma[n])

    def _keep_within_budget(self) -> None:
        """Shift every logit down by one amount so that the (k+1)-th largest lies below 0: at most k parameters have
        γ = σ(ℓ) ≥ ½, and the order of ℓ (the region a hard forward pass or binarising takes) is unchanged."""
        names = list(self.logits)
        if sum(self.logits[n].numel() for n in names) <= self.k:
            return
        above = float(kth_largest(self.logits, names, self.k + 1))
        if above >= 0:
            shift = above + BUDGET_MARGIN
            for ell in self.logits.values():  # in float32: a 16-bit scalar may round the margin away (5 + 0.01 is 5)
                if ell.dtype == torch.float32:
                    ell.sub_(shift)
                else:
                    ell.copy_(ell.float().sub_(shift))

    def _restore(self) -> None:
        """θ_pre back into every working parameter ℓ acted on."""
        for n in self.names:
            self.params[n].data.copy_(self.pre[n])
            self.params[n].grad = None

    def finish(self) -> Region:
        """Restore the working model and binarise (Eq. 4)."""
        self.held = None  # binarising may need the room
        self._leave()
        return binarise(self.logits, self.k, self.config.binarise)

    def _leave(self) -> None:
        """The working model as it was: θ_pre, its layers' own forward passes, its gradient flags."""
        if self._uncheckpoint is not None:
            self._uncheckpoint()
            self._uncheckpoint = None
        with torch.no_grad():
            self._restore()
        for n, p in self.model.named_parameters():
            p.requires_grad_(self._saved_flags[n])

    def full_logits(self) -> dict[str, torch.Tensor]:
        """ℓ of every graftable parameter, shaped as the parameter."""
        return self.logits


def logit_gradient(
    model: torch.nn.Module,
    params: dict[str, torch.nn.Parameter],
    pre: dict[str, torch.Tensor],
    ft: dict[str, torch.Tensor],
    logits: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    hard_k: int | None = None,
    need_peak: bool = True,
    held: Held | None = None,
    scratch: compute.Scratch | None = None,
):
    """One forward/backward of the relaxed graft; returns the output, ∇_ℓ L per tensor and its size.

    With ``hard_k`` the forward pass uses the binarised region (top-k of ℓ) instead of σ(ℓ),
    and the gradient passes straight through to ℓ.

    No full gradient is ever held: as soon as a tensor's ∇_θ L is complete (a post-accumulate-grad
    hook) it becomes ∇_ℓ L and is written over that tensor's working values, which the backward
    pass no longer needs and the next step rewrites anyway. So the returned gradients are the
    working parameters' own storage (in the model's dtype), and mask learning holds the working
    copy, θ_pre, θ_ft and ℓ, plus one tensor's gradient at a time. With ``held`` the hook reads
    σ(ℓ) and δ from there instead of computing them again: the same values, two passes fewer.
    The size is (Σ(∇_ℓ L)², max |∇_ℓ L|); the max only when ``need_peak`` (the "max" norm).

    On CPU every element-wise pass goes through a tensor ``compute.CHUNK`` values at a time, the same
    chunks in both memory modes (σ of a slice can differ from a slice of σ in the last bit).
    """
    scratch = scratch or compute.Scratch()
    with torch.no_grad():  # θ ← θ_pre + σ(ℓ) ⊙ δ
        hard = region_to_mask(top_k(logits, hard_k), {n: tuple(l.shape) for n, l in logits.items()}) if hard_k else None
        for n, p in params.items():
            ell = logits[n].reshape(-1)
            if hard is not None:
                torch.where(hard[n].to(p.device), ft[n], pre[n], out=p.data)
                if held is not None:
                    for c in compute.chunks(ell):
                        torch.sigmoid(ell[c], out=held.sigma[n].view(-1)[c])
                p.grad = None
                continue
            work, lo, hi = p.data.view(-1), pre[n].reshape(-1), ft[n].reshape(-1)
            for c in compute.chunks(ell):  # σ(ℓ) in ℓ's precision, rounded to the model's dtype
                s = torch.sigmoid(ell[c], out=held.sigma[n].view(-1)[c] if held else scratch.take(0, ell[c]))
                w = s if s.dtype == p.dtype else scratch.take(1, work[c]).copy_(s)
                torch.lerp(lo[c], hi[c], w, out=work[c])
            p.grad = None
    names = {id(p): n for n, p in params.items()}
    squares: dict[str, torch.Tensor] = {}
    peaks: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def to_logit_gradient(p: torch.nn.Parameter) -> None:  # chain rule through Eq. 1 and 2: ∇_θ L ⊙ δ ⊙ σ'(ℓ)
        n = names[id(p)]
        grad, work, ell = p.grad.reshape(-1), p.data.view(-1), logits[n].reshape(-1)
        lo, hi = pre[n].reshape(-1), ft[n].reshape(-1)
        sq = peak = None
        for c in compute.chunks(work):
            if held is not None:
                s, d = held.sigma[n].view(-1)[c], held.delta[n].view(-1)[c]
            else:  # again, rather than held through the backward pass
                s = torch.sigmoid(ell[c], out=scratch.take(0, ell[c]))
                d = torch.sub(hi[c], lo[c], out=scratch.take(1, work[c]))
            g = torch.mul(grad[c], d, out=work[c])
            torch.ops.aten.sigmoid_backward.grad_input(g, s, grad_input=g)  # g ⊙ σ(1 − σ) in one pass
            flat = g.float()
            part = torch.dot(flat, flat).double()  # one pass, no float64 copy of the gradient
            sq = part if sq is None else sq + part
            if need_peak:  # max |g| without a copy of |g|
                least, most = torch.aminmax(flat)
                part = torch.maximum(-least, most)
                peak = part if peak is None else torch.maximum(peak, part)
        p.grad = None
        squares[n] = sq
        if need_peak:
            peaks[n] = peak.float()

    out = backward_with(model, batch, list(params.values()), to_logit_gradient)
    size = gradient_size(params, squares, peaks, need_peak, out.loss.device, lambda n: params[n].data.zero_())
    return out, {n: p.data for n, p in params.items()}, size


def backward_with(model: torch.nn.Module, batch: dict, hooked: list[torch.nn.Parameter], hook) -> object:
    """One forward/backward with ``hook`` run on each of ``hooked`` as soon as its gradient is complete."""
    hooks = [p.register_post_accumulate_grad_hook(hook) for p in hooked]
    try:
        out = model(**batch)
        if out.loss.requires_grad:  # false only when nothing is hooked (an empty candidate set)
            out.loss.backward()
    finally:
        for handle in hooks:
            handle.remove()
    return out


@torch.no_grad()
def gradient_size(names, squares: dict, peaks: dict, need_peak: bool, device, untouched) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ(∇_ℓ L)², max |∇_ℓ L|) over ``names``, summed in their order whatever order the backward pass took (a
    device map may spread them over devices); ``untouched(name)`` zeroes the gradient of a tensor the loss does not
    depend on."""
    sq = torch.zeros((), dtype=torch.float64, device=device)
    peak = torch.zeros((), dtype=torch.float32, device=device)
    for n in names:
        if n not in squares:
            untouched(n)
            continue
        sq += squares[n].to(device)
        if need_peak:
            peak = torch.maximum(peak, peaks[n].to(device))
    return sq, peak


@dataclass
class Held:
    """σ(ℓ) and δ kept for the whole of mask learning, so that each step computes σ once and δ never.

    Two more copies of the graftable set (σ in ℓ's dtype, δ in the model's): cheap for small models,
    so the memory plan holds them where they have room (``learning.plan``).
    The values are those the lean path computes, so both paths learn the same region.
    """

    sigma: dict[str, torch.Tensor]
    delta: dict[str, torch.Tensor]

    @staticmethod
    def make(params, pre, ft, logits) -> Held:
        with torch.no_grad():  # written now, so that their pages are not first touched inside a step
            return Held({n: torch.sigmoid(logits[n]) for n in params},
                        {n: torch.sub(ft[n], pre[n], out=torch.empty_like(params[n])) for n in params})


def _step_scale(config: LearnConfig, size: tuple[torch.Tensor, torch.Tensor], count: int) -> float:
    if config.optimizer == "sgd":
        return config.lr
    sq, peak = size
    norm = math.sqrt(float(sq) / max(count, 1)) if config.norm == "rms" else float(peak)
    return config.lr / norm if norm > 0 else 0.0
