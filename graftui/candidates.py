"""Mask learning over a candidate set C: where the method's own first gradient points, and what it later finds.

The full learner keeps a region logit ℓ per graftable parameter. Eq. 2 starts every parameter at
ℓ = ±bias, where σ' is the same, so its first step moves the logit of parameter i by η·(∇_θL ⊙ δ)_i
times one constant: the parameters it starts moving are those with the largest first-order
attribution |∇_θL ⊙ δ| at the relaxation's start θ̄_0, not those with the largest |δ| (an AdamW
fine-tune moves every parameter a little). So C = γ_base ∪ the parameters that attribution ranks
highest, summed over a pass of training batches and read one tensor's gradient at a time into a
bounded pool (``Pool``: O(|C|), no second model). On ``smollm2-dates`` at 1 % such a C at c = 5 holds
98.7 % of the full learner's region, where the top 5·k of |δ| hold 89.9 % (docs/method.md). What C
still misses is found as the learner goes: every ``grow_every`` steps a pass over every tensor holds
the logit each parameter outside C would have reached at the pace of the steps so far against the
region's boundary, and those that would be inside join C, at their start.

Outside C the working model holds the relaxation's start, θ_pre + σ(−bias)·δ (θ_pre for a hard
forward pass), as the full learner's does before it moves them, so a step over C sees the model the
full learner would. Where C holds every parameter that moved, the region is the full learner's.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from typing import Iterable

import torch

from . import compute
from .config import LearnConfig
from .errors import Cancelled
from .compute import flat_views, offset_in
from .method import (MaskLearner, Movement, Region, RegionCounter, backward_with, base_region, binarise, gradient_size,
                     kth_largest, top_k)
from .weights import release, take

log = logging.getLogger(__name__)


def _largest(score: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``size`` largest of a flat ``score`` and their positions (in no order), a slice at a time: topk of a whole
    tensor sorts a copy of it with its indices (0.78 GB more for a 50 M-value embedding on CPU)."""
    parts = compute.chunks(score, everywhere=True)
    if len(parts) == 1:
        return torch.topk(score, size, sorted=False)
    values = index = None
    for part in parts:
        v, i = torch.topk(score[part], min(size, part.stop - part.start), sorted=False)
        i += part.start
        if values is not None:
            v, i = torch.cat([values, v]), torch.cat([index, i])
            if v.numel() > size:
                v, keep = torch.topk(v, size, sorted=False)
                i = i[keep]
        values, index = v, i
    return values, index


class Pool:
    """The positions with the largest running sum of a score over several passes, across tensors: at most about
    2·``size`` held, so the memory is O(size) whatever the model.

    A position's sum counts the passes since it entered; it enters among its tensor's ``size`` best until the pool
    is first cut, and after that when one pass scores it above the floor (the ``size``-th largest sum at the last cut). Cut back to the
    ``size`` best whenever it has doubled. The heavy hitters of a stream: exact for what stays, a lower bound for a
    late entrant, which only the floor it beat could have kept out.
    """

    def __init__(self, size: int, magnitude: bool = False):
        self.size, self.magnitude = max(0, int(size)), magnitude  # magnitude: rank by |sum|, not by sum
        self.index: dict[str, torch.Tensor] = {}
        self.sums: dict[str, torch.Tensor] = {}
        self.floor: float | None = None

    def held(self) -> int:
        return sum(i.numel() for i in self.index.values())

    @torch.no_grad()
    def add(self, name: str, score: torch.Tensor, barred: torch.Tensor | None = None) -> None:
        """One pass's ``score`` of every position of tensor ``name`` (flat float32, larger is better; overwritten
        here); ``barred`` positions never enter."""
        if self.size == 0:
            return
        held = self.index.get(name)
        if held is not None:
            self.sums[name] += score[held]
        signed = score
        if self.magnitude:  # entering is decided by size; the sum keeps its sign
            signed, score = score.clone(), score.abs_()
        for out in (held, barred):
            if out is not None and out.numel():
                score[out] = -math.inf
        if self.floor is None:  # the first pass: each tensor's best
            if score.numel() <= self.size:
                new = torch.isfinite(score).nonzero().squeeze(1)
            else:
                values, new = _largest(score, self.size)
                new = new[torch.isfinite(values)]
        else:
            new = (score > self.floor).nonzero().squeeze(1)
            if new.numel() > self.size:
                new = new[torch.topk(score[new], self.size, sorted=False).indices]
        if new.numel():
            values = signed[new]
            self.index[name] = new if held is None else torch.cat([held, new])
            self.sums[name] = values if held is None else torch.cat([self.sums[name], values])
        if self.held() > 2 * self.size:
            self.cut()

    def cut(self, size: int | None = None) -> None:
        """Keep the ``size`` (default: the pool's) largest sums, exactly that many (ties to the earliest entries)."""
        keep = top_k({n: s.abs() for n, s in self.sums.items()} if self.magnitude else self.sums,
                     self.size if size is None else size)
        sums = {n: self.sums[n][i.to(self.sums[n].device)] for n, i in keep.items()}
        self.floor = min((float(s.abs().min() if self.magnitude else s.min()) for s in sums.values()), default=None)
        self.index = {n: self.index[n][i.to(self.index[n].device)] for n, i in keep.items()}
        self.sums = sums

    def top(self, size: int) -> tuple[Region, dict[str, torch.Tensor]]:
        """The ``size`` best positions per tensor, sorted, with their sums in the same order."""
        self.cut(min(size, self.held()))
        region, sums = {}, {}
        for n, idx in self.index.items():
            order = torch.argsort(idx)
            region[n], sums[n] = idx[order], self.sums[n][order]
        return region, sums


def delta_of(pre: Mapping, ft: Mapping, name: str, like: torch.Tensor) -> torch.Tensor:
    """δ of one tensor, flat, in float32 on ``like``'s device; a mapped file's pages go back once read."""
    d = (ft[name].to(like.device).float() - pre[name].to(like.device).float()).reshape(-1)
    release(pre, name)
    release(ft, name)
    return d


def attribution_pass(model: torch.nn.Module, params: dict[str, torch.nn.Parameter], pre: Mapping, ft: Mapping,
                     pool: Pool, barred: Region, batches: Iterable[dict], scale: float = 1.0,
                     cancel: threading.Event | None = None) -> tuple[int, float, float]:
    """Forward/backward passes over ``batches`` at the working model's current values, adding each parameter's rise
    −∇_θL ⊙ δ (times ``scale``: with σ'(ℓ), the logit's rise) to ``pool``: one tensor's gradient at a time, none of it
    kept. Returns the examples read, and the sum of squares and the largest magnitude of the rises outside ``barred``
    (of the last batch)."""
    names = {id(p): n for n, p in params.items()}
    barred = {n: i.to(params[n].device) for n, i in barred.items()}
    size = [0.0, 0.0]

    @torch.no_grad()
    def score(p: torch.nn.Parameter) -> None:
        n = names[id(p)]
        rise = delta_of(pre, ft, n, p).mul_(p.grad.reshape(-1).float()).mul_(-scale)
        p.grad = None
        inside = barred.get(n)
        if inside is not None and inside.numel():
            rise[inside] = 0.0
        size[0] += float(torch.dot(rise, rise))
        size[1] = max(size[1], float(rise.abs().max())) if rise.numel() else size[1]
        pool.add(n, rise, inside)

    seen = 0
    for batch in batches:
        if cancel is not None and cancel.is_set():
            raise Cancelled("mask learning cancelled")
        size[:] = [0.0, 0.0]
        backward_with(model, {key: value.to(next(iter(params.values())).device) for key, value in batch.items()},
                      list(params.values()), score)
        compute.return_freed_memory()  # a pass's blocks, of another size each batch, would otherwise pile up
        seen += int(next(iter(batch.values())).shape[0])
    return seen, size[0], size[1]


def _sized(batches: Iterable[dict], examples: int) -> Iterable[dict]:
    """The first ``examples`` rows of ``batches``, whole batches (at least one)."""
    seen = 0
    for batch in batches:
        yield batch
        seen += int(next(iter(batch.values())).shape[0])
        if seen >= examples:
            return


class CandidateLearner(MaskLearner):
    """Eq. 3 with ℓ kept only over the candidate set C (see the module's notes): ``count`` parameters at the start,
    at most ``room`` once grown.

    The learner holds, per tensor with candidates, C's sorted flat indices, ℓ_C, θ_pre[C], θ_ft[C], ∇_ℓ L and θ[C]
    over C: O(|C|) beside the one working model (28 bytes a candidate in float32), and two scratch buffers. The values
    over C of all tensors on one device are views into one buffer each, so a step's element-wise work (σ, the graft's
    values, the chain rule, the update) is a few passes over C, not a few per tensor: per tensor, a step only writes
    θ[C] and gathers ∇_θ L at C. Only tensors holding candidates take a weight gradient, except in the ranking and
    growth passes and the pass before the first step that measures the gradient outside C: a normalized step is as
    long as the full learner's (``_whole``), and its "rms" scale averages over the whole graftable count.

    ``batches`` are the ranking pass's training batches (None: C is ranked by movement, as ``config.rank =
    "movement"`` asks). ``finish`` puts θ_pre back into every tensor the learner moved.
    """

    def __init__(self, model, params, pre, ft, k, config: LearnConfig = LearnConfig(), start: Region | None = None, *,
                 count: int, room: int | None = None, batches: Iterable[dict] | None = None,
                 cancel: threading.Event | None = None, maps_blocks: bool = False, within: Region | None = None,
                 laid: Region | None = None):
        layers = self._accept(model, params, pre, ft, k, config)
        if maps_blocks:  # before ranking: its per-tensor temporaries are the first to go back
            compute.map_large_blocks()
        self.room = max(count, room or count)
        self.grown = self.added = 0
        self.held = None
        self._enter(layers)
        self._outside = 0.0 if config.forward == "hard" else torch.sigmoid(torch.tensor(-config.sigmoid_bias)).item()
        self._moved = set()  # tensors whose values outside C are not θ_pre: finish restores them whole
        try:
            if start is None:  # γ_base: the top-k of |δ| (inside a given C, where the region must lie)
                start = base_region(pre, ft, self.names, k) if within is None else movement_inside(pre, ft, within, k)
            self.base = start
            self.rule = "within" if within is not None else \
                "movement" if batches is None or config.rank == "movement" else "gradient"
            self.ranked_on = None
            self._to_start(self.base)
            if laid is not None:  # C as a checkpoint kept it: neither ranked nor grown again (``load_state``)
                extra = laid
            elif within is not None:  # C given: a larger region the search over budgets learned first (sizing.py)
                extra = within
            elif count >= self.count:  # C is every graftable parameter: nothing to rank
                extra = {n: torch.arange(params[n].numel()) for n in self.names}
            elif self.rule == "movement":  # C = the top of |δ|, which holds the top-k of |δ|, and a given start
                extra = top_k(Movement(pre, ft, self.names), count)
            else:
                self._train_only(params.values())
                pool = Pool(max(count - sum(int(i.numel()) for i in self.base.values()), 0), magnitude=True)
                self.ranked_on, _, _ = attribution_pass(model, params, pre, ft, pool, self.base,
                                                        _sized(batches, config.rank_examples), cancel=cancel)
                extra, _ = pool.top(pool.size)
            self.adam = None
            self._lay_out(_union(self.base, extra))
            self.start_count = self.size
            self._train_only([params[n] for n in self.candidates])
            self._begin()
        except BaseException:
            self._leave()
            raise
        log.debug("mask learning over C: %s of %s graftable parameters in %d of %d tensors (ranked by %s), room for %s; %s",
                  f"{self.size:,}", f"{self.count:,}", len(self.candidates), len(self.names), self.rule,
                  f"{self.room:,}", compute.memory_in_use(self.device))

    @property
    def size(self) -> int:
        return sum(i.numel() for i in self.candidates.values())

    # -- where the working model starts ------------------------------------------------------------------------------
    @torch.no_grad()
    def _to_start(self, base: Region) -> None:
        """The relaxation's start in every graftable tensor: lerp(θ_pre, θ_ft, σ(±bias)) as the full learner's first
        forward pass grafts it (θ_pre + γ_base⊙δ for a hard forward pass), one tensor at a time."""
        inside = torch.sigmoid(torch.tensor(self.config.sigmoid_bias)).item() if self._outside else 1.0
        for n in self.names:
            p = self.params[n]
            if self._outside == 0.0 and n not in base:
                continue  # θ_pre already
            weight = torch.full((p.numel(),), self._outside, dtype=p.dtype, device=p.device)
            if n in base:
                weight[base[n].to(p.device)] = inside
            torch.lerp(self.pre[n].to(p.device).reshape(-1), self.ft[n].to(p.device).reshape(-1), weight,
                       out=p.data.view(-1))
            release(self.pre, n)
            release(self.ft, n)
            self._moved.add(n)

    # -- C's buffers ---------------------------------------------------------------------------------------------------
    def _lay_out(self, candidates: Region, carried: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """C's buffers for ``candidates`` (name -> flat indices, sorted): θ_pre[C] and θ_ft[C] read at C only, ℓ_C at its
        start (+bias on γ_base, −bias elsewhere), or, for a C that grows, the ``carried`` logits (old indices, old ℓ) and
        Adam's moments where they were."""
        params = self.params
        self.candidates = {n: candidates[n].to(params[n].device) for n in self.names
                           if n in candidates and candidates[n].numel()}
        on = {n: self.candidates[n].device for n in self.candidates}
        sizes = {n: (i.numel(),) for n, i in self.candidates.items()}
        dtypes = {n: params[n].dtype for n in sizes}
        self.pre_c, self._pre = flat_views(sizes, on, dtypes)
        self.ft_c, self._ft = flat_views(sizes, on, dtypes)
        old_moments = self._adam_views if carried is not None and self.adam is not None else None
        bias = self.config.sigmoid_bias
        self.logits, self._ell = flat_views(sizes, on, dict.fromkeys(sizes, getattr(torch, self.config.logit_dtype)))
        with torch.no_grad():
            for n, i in self.candidates.items():  # a few values of each tensor; a mapped file's pages go back after
                self.pre_c[n].copy_(take(self.pre, n, i))
                self.ft_c[n].copy_(take(self.ft, n, i))
                release(self.pre, n)
                release(self.ft, n)
            for buffer in self._ell.values():
                buffer.fill_(-bias)
            inside = {n: torch.searchsorted(self.candidates[n], idx.to(on[n])) for n, idx in self.base.items()
                      if n in self.candidates and idx.numel()}
            if carried is None:
                for n, pos in inside.items():
                    self.logits[n][pos] = bias
            if self.adam is not None:
                self._moments(sizes, on)
            for n, (old_idx, old_ell) in (carried or {}).items():
                where = torch.searchsorted(self.candidates[n], old_idx)
                self.logits[n][where] = old_ell
                if old_moments is not None:
                    for new, old in zip(self._adam_views, old_moments):
                        new[n][where] = old[n]
        self.counter = RegionCounter(self.logits, inside)  # the region's size and swaps, as the full learner counts them
        self.grads_c, self._grads = flat_views(sizes, on, dtypes)
        self.value_c, self._value = flat_views(sizes, on, dtypes)  # θ[C], reused

    def _moments(self, sizes: dict[str, tuple[int]], on: dict[str, torch.device]) -> None:
        """Adam's two moments over C, zero, as one buffer per device (what a step updates) and views per tensor (what a
        growing C carries)."""
        made = [flat_views(sizes, on, dict.fromkeys(sizes, torch.float32)) for _ in range(2)]
        for _, buffers in made:
            for b in buffers.values():
                b.zero_()
        self._adam_views = [views for views, _ in made]
        self.adam = {str(d): (made[0][1][d], made[1][1][d]) for d in made[0][1]}

    def _begin(self) -> None:
        super()._begin()
        self._inside = (0.0, 0.0)  # (Σ(∇_ℓ L)², max |∇_ℓ L|) over C at the last step
        self._beyond = (0.0, 0.0)  # those outside C over those inside, on the last batch measured
        self._measured = None  # outside C on the batch of the step to come
        if self.adam is not None:
            self._moments({n: (i.numel(),) for n, i in self.candidates.items()},
                          {n: i.device for n, i in self.candidates.items()})

    def _parts(self) -> dict[str, torch.Tensor]:
        """ℓ_C as one buffer per device: a step updates each in one pass."""
        return {str(d): ell for d, ell in self._ell.items()}

    # -- a step ------------------------------------------------------------------------------------------------------
    def _gradient(self, batch: dict[str, torch.Tensor], hard_k: int | None, need_peak: bool):
        """``logit_gradient`` over C: θ[C] written by index, ∇_θ L gathered at C in its hook, and the chain rule
        ∇_θ L[C] ⊙ δ_C ⊙ σ'(ℓ_C) taken once over each device's buffer when the backward pass is done."""
        hard = top_k(self.logits, hard_k) if hard_k else None  # positions inside C
        with torch.no_grad():  # θ[C] ← lerp(θ_pre[C], θ_ft[C], σ(ℓ_C)); outside C it stays at the start
            for d, ell in self._ell.items():
                lo, hi, value = self._pre[d], self._ft[d], self._value[d]
                if hard is not None:
                    chosen = torch.zeros(ell.numel(), dtype=torch.bool, device=ell.device)
                    for n, pos in hard.items():
                        if self.candidates[n].device == d:
                            chosen[pos.to(d) + offset_in(self.logits[n], ell)] = True
                    torch.where(chosen, hi, lo, out=value)
                else:
                    for c in compute.chunks(ell):  # on CPU a slice at a time, through reused buffers
                        s = torch.sigmoid(ell[c], out=self.scratch.take(0, ell[c]))
                        w = s if s.dtype == value.dtype else self.scratch.take(1, value[c]).copy_(s)
                        torch.lerp(lo[c], hi[c], w, out=value[c])
            for n, idx in self.candidates.items():
                p, value = self.params[n], self.value_c[n]
                p.data.view(-1).index_copy_(0, idx, value if value.dtype == p.dtype else value.to(p.dtype))
                p.grad = None
        names = {id(self.params[n]): n for n in self.candidates}
        seen: set[str] = set()

        @torch.no_grad()
        def gather(p: torch.nn.Parameter) -> None:  # ∇_θ L at C; the rest of ∇_θ L dropped at once
            n = names[id(p)]
            into = self.grads_c[n]
            if into.dtype == p.grad.dtype:
                torch.index_select(p.grad.reshape(-1), 0, self.candidates[n], out=into)
            else:  # a tensor narrower than others on its device
                into.copy_(torch.index_select(p.grad.reshape(-1), 0, self.candidates[n]))
            p.grad = None
            seen.add(n)

        out = backward_with(self.model, batch, [self.params[n] for n in self.candidates], gather)
        with torch.no_grad():
            for n in self.candidates:  # the loss does not depend on it: ∇ = 0, not the last step's
                if n not in seen:
                    self.grads_c[n].zero_()
            squares: dict[str, torch.Tensor] = {}
            peaks: dict[str, torch.Tensor] = {}
            for d, grad in self._grads.items():
                lo, hi, ell = self._pre[d], self._ft[d], self._ell[d]
                for c in compute.chunks(grad):  # ∇_θ L[C] ⊙ δ_C ⊙ σ'(ℓ_C), on CPU a slice at a time
                    g = grad[c].mul_(torch.sub(hi[c], lo[c], out=self.scratch.take(1, grad[c])))
                    torch.ops.aten.sigmoid_backward.grad_input(g, torch.sigmoid(ell[c], out=self.scratch.take(0, ell[c])),
                                                               grad_input=g)
                    flat = g.float()
                    part = torch.dot(flat, flat).double()
                    squares[str(d)] = part if str(d) not in squares else squares[str(d)] + part
                    if need_peak:
                        least, most = torch.aminmax(flat)
                        part = torch.maximum(-least, most)
                        peaks[str(d)] = part if str(d) not in peaks else torch.maximum(peaks[str(d)], part)
        size = gradient_size(squares, squares, peaks, need_peak, out.loss.device, lambda n: None)
        return out, {str(d): g for d, g in self._grads.items()}, size

    def step(self, batch: dict[str, torch.Tensor], count_region: bool = True):
        if self.steps_done == 0 and self.size < self.count and self.config.optimizer == "normalized":
            self._measured = self._outside_c(batch)
        report = super().step(batch, count_region)
        compute.return_freed_memory()  # what the step freed, before the next batch's blocks of other sizes
        every = self.config.grow_every
        if every and self.steps_done % every == 0 and self.steps_done < self.config.steps and self.size < self.room:
            self.grow(batch)
        return report

    def _whole(self, size):
        """The full learner's gradient size: C's, with the logit gradients outside C in it. The normalized step divides
        by the norm over every graftable parameter; over C alone it would be longer the more of the gradient lies outside
        C (on ``smollm2-dates`` at 0.1 % and c = 5, Σ(∇_ℓ L)² outside C is 0.12–0.18× C's). Outside C every logit is
        still at its start, so its share is measured on one batch (before the first step, and in each growth pass; with
        no growth the first measure stands) and held as a ratio to C's until the next."""
        sq, peak = size
        self._inside = size
        if self._measured is not None:
            if float(sq) == 0 and float(peak) == 0:  # no ratio to C's yet: the measure itself, for this step
                return sq + self._measured[0], torch.maximum(peak, torch.as_tensor(self._measured[1]).to(peak))
            self._beyond = _ratios(self._measured, size)
            self._measured = None
            log.debug("the logit gradient outside C: Σ(∇_ℓ L)² %.3g× C's", self._beyond[0])
        r_sq, r_peak = self._beyond
        return sq * (1.0 + r_sq), torch.maximum(peak, peak * r_peak)  # tensors, as every step's size is

    def _outside_c(self, batch: dict[str, torch.Tensor], pool: Pool | None = None) -> tuple[float, float]:
        """(Σ(∇_ℓ L)², max |∇_ℓ L|) outside C on ``batch``, at the working model's values: a pass over every tensor, each
        parameter's logit gradient offered to ``pool``. Several processes take rank 0's figures."""
        slope = torch.sigmoid(torch.tensor(-self.config.sigmoid_bias)).item()
        slope *= 1 - slope  # σ'(−bias): every parameter outside C is still at its start
        self._train_only(self.params.values())
        try:
            _, squares, peak = attribution_pass(self.model, self.params, self.pre, self.ft,
                                                pool if pool is not None else Pool(0), self.candidates, [batch],
                                                scale=slope)
        finally:
            self._train_only([self.params[n] for n in self.candidates])
        world = compute.data_parallel()
        return tuple(world.agree([squares, peak])) if world is not None else (squares, peak)

    # -- growing C -------------------------------------------------------------------------------------------------
    def grow(self, batch: dict[str, torch.Tensor]) -> int:
        """Add to C the parameters outside it that would be in the region now: a pass over every tensor finds the logit
        gradient ∇_ℓ L = ∇_θ L ⊙ δ ⊙ σ'(−bias) of each parameter outside C (still at its start), and the logit it would
        have reached by now at the pace of the steps so far (the step size the full learner would take, with those
        gradients in its norm) is held against the region's boundary (the k-th largest ℓ_C): those above it join C, the
        best first, as many as ``room`` allows. They join at their start, −bias, and earn their place as C's others did:
        set where one batch's gradient projects them, they pushed out better ones (measured: IoU with the full learner's
        region 0.915 against 0.957 on minilm-movies). Returns how many joined."""
        if self.steps_done == 0:
            return 0
        pool = Pool(self.room - self.size)
        squares, peak = self._outside_c(batch, pool)  # the batch of the last step: its size over C is known
        added, moved, largest = self._admit(pool, self._pace(squares, peak))
        sq, top = self._inside  # the entrants' gradients now count inside C
        self._beyond = _ratios((max(squares - moved, 0.0), peak), (float(sq) + moved, max(float(top), largest)))
        log.debug("the logit gradient outside C at step %d: Σ(∇_ℓ L)² %.3g× C's", self.steps_done, self._beyond[0])
        return added

    def _pace(self, squares: float, peak: float) -> float:
        """How far a logit has moved per unit of −∇_ℓ L over the steps so far, had the full learner taken them: its
        step size with the gradients outside C counted in the norm (Adam moves every coordinate by about lr a step)."""
        config, (sq_c, peak_c) = self.config, self._inside
        if config.optimizer == "sgd":
            return self.steps_done * config.lr
        if config.optimizer == "adam":
            return math.inf  # any rise: lr a step, whatever the gradient's size (see _admit)
        norm = math.sqrt((float(sq_c) + squares) / max(self.count, 1)) if config.norm == "rms" else \
            max(float(peak_c), peak)
        return self.steps_done * config.lr / norm if norm > 0 else 0.0

    def _admit(self, pool: Pool, pace: float) -> tuple[int, float, float]:
        """The pool's parameters whose logit, −bias + pace·(−∇_ℓ L), would lie above the region's boundary join C.
        Returns how many joined, the sum of their squared logit gradients and the largest of them."""
        bias = self.config.sigmoid_bias
        boundary = top_boundary(self.logits, self.k)
        chosen, rises = pool.top(pool.size)
        entering, moved, largest = {}, 0.0, 0.0
        for n, idx in chosen.items():
            if math.isinf(pace):  # Adam: lr a step for every coordinate the gradient lifts
                reached = torch.where(rises[n] > 0, -bias + self.steps_done * self.config.lr, -math.inf)
            else:
                reached = -bias + pace * rises[n]
            keep = reached > boundary
            if bool(keep.any()):
                entering[n] = (idx[keep], reached[keep])
                rise = rises[n][keep].float()
                moved += float(rise.pow(2).sum())
                largest = max(largest, float(rise.abs().max()))
        added = sum(int(i.numel()) for i, _ in entering.values())
        if not added:
            return 0, 0.0, 0.0
        carried = {n: (idx, self.logits[n]) for n, idx in self.candidates.items()}  # the old buffers, read once more
        self._lay_out(_union(self.candidates, {n: i for n, (i, _) in entering.items()}), carried)  # entrants at −bias
        self._train_only([self.params[n] for n in self.candidates])  # a tensor that held no candidate takes gradients now
        self.grown += 1
        self.added += added
        log.debug("C grew by %s at step %d (now %s); %s", f"{added:,}", self.steps_done, f"{self.size:,}",
                  compute.memory_in_use(self.device))
        return added, moved, largest

    # -- where it stands: what a checkpoint keeps --------------------------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The full learner's state over C, and C itself with all the next steps and growths read of it: the ratio of
        the gradient outside C to C's, a measure still to be taken in, C's size at its start, its growths so far."""
        tensors = {}
        for n, idx in self.candidates.items():
            tensors[f"candidates.{n}"] = idx
            tensors[f"logit.{n}"] = self.logits[n]
        if self.adam is not None:
            for n in self.candidates:
                tensors[f"adam_m.{n}"], tensors[f"adam_v.{n}"] = self._adam_views[0][n], self._adam_views[1][n]
        return tensors, {"learner": "candidate", "steps_done": self.steps_done, "scale": self.scale,
                         "inside": [float(x) for x in self._inside], "beyond": [float(x) for x in self._beyond],
                         "measured": None if self._measured is None else [float(x) for x in self._measured],
                         "grown": self.grown, "added": self.added, "start": self.start_count, "rule": self.rule,
                         "ranked_on": self.ranked_on, "room": self.room}

    @staticmethod
    def laid_out(tensors: dict[str, torch.Tensor]) -> Region:
        """C as a checkpoint's tensors keep it (to build the learner with ``laid``)."""
        return {name.partition(".")[2]: t for name, t in tensors.items() if name.startswith("candidates.")}

    @torch.no_grad()
    def load_state(self, tensors: dict[str, torch.Tensor], scalars: dict) -> None:
        """Take back what ``state`` gave, into a learner built with ``laid`` = that state's C."""
        own, _ = self.state()
        for name, into in own.items():
            if not name.startswith("candidates."):
                into.copy_(tensors[name].to(into.device))
        self.steps_done, self.scale = int(scalars["steps_done"]), float(scalars["scale"])
        self._inside, self._beyond = tuple(scalars["inside"]), tuple(scalars["beyond"])
        self._measured = None if scalars["measured"] is None else tuple(scalars["measured"])
        self.grown, self.added, self.start_count = int(scalars["grown"]), int(scalars["added"]), int(scalars["start"])
        self.rule, self.ranked_on = scalars["rule"], scalars["ranked_on"]

    # -- the end ---------------------------------------------------------------------------------------------------
    def _restore(self) -> None:
        for n, idx in getattr(self, "candidates", {}).items():
            if n not in self._moved:
                p = self.params[n]
                p.data.view(-1).index_copy_(0, idx, take(self.pre, n, idx).to(p.dtype))
                p.grad = None
        for n in self._moved:  # θ_pre back whole where the start was written
            self.params[n].data.copy_(self.pre[n])
            self.params[n].grad = None
            release(self.pre, n)

    def finish(self) -> Region:
        """Restore θ_pre and binarise: the top-k of ℓ_C, as flat indices of the parameters."""
        self.held = None
        self._leave()
        inside = binarise(self.logits, self.k, self.config.binarise)
        return {n: self.candidates[n][pos.to(self.candidates[n].device)].cpu() for n, pos in inside.items()}

    def full_logits(self) -> CandidateLogits:
        return CandidateLogits(self.logits, self.candidates, {n: tuple(self.params[n].shape) for n in self.names},
                               -self.config.sigmoid_bias)

    def record(self) -> dict:
        """What a region file says of C."""
        return {"learner": "candidate", "rule": self.rule, "start": self.start_count, "size": self.size,
                "room": self.room, "grown": self.grown, "added": self.added,
                "ranked_on": getattr(self, "ranked_on", None)}


def movement_inside(pre: Mapping, ft: Mapping, within: Region, k: int) -> Region:
    """The k parameters of ``within`` with the largest |δ|: γ_base where the region must lie inside a given set."""
    inside = {n: i for n, i in within.items() if i.numel()}
    scores = {n: delta_of(pre, ft, n, i).abs()[i] for n, i in inside.items()}
    return {n: inside[n][pos] for n, pos in top_k(scores, k).items()}


def _ratios(outside: tuple[float, float], inside) -> tuple[float, float]:
    """Outside C's (Σ(∇_ℓ L)², max |∇_ℓ L|) over C's, 0 where C's is 0."""
    sq, peak = float(inside[0]), float(inside[1])
    return (outside[0] / sq if sq > 0 else 0.0, outside[1] / peak if peak > 0 else 0.0)


def top_boundary(logits: Mapping, k: int) -> float:
    """The k-th largest logit: where the region ends (−∞ where every logit is inside)."""
    names = list(logits)
    if sum(logits[n].numel() for n in names) <= k:
        return -math.inf
    return float(kth_largest(logits, names, k))


def _union(a: Region, b: Region) -> Region:
    none = torch.empty(0, dtype=torch.int64)
    return {n: torch.unique(torch.cat([a.get(n, none).cpu(), b.get(n, none).cpu()])) for n in {**a, **b}}


class CandidateLogits(Mapping):
    """ℓ of a :class:`CandidateLearner` read as full tensors: ℓ_C at C and −bias (its start, σ ≈ 0) elsewhere.

    Each tensor is made only when it is read, so a caller that wants full-size logits holds one at a
    time; ``values`` and ``candidates`` are ℓ_C and C themselves.
    """

    def __init__(self, values: dict[str, torch.Tensor], candidates: Region, shapes: dict[str, tuple[int, ...]],
                 fill: float):
        self.values, self.candidates, self.shapes, self.fill = values, candidates, shapes, fill
        self._dtype = next(iter(values.values())).dtype if values else torch.float32

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self):
        return len(self.shapes)

    def numel(self, name: str) -> int:
        return math.prod(self.shapes[name])

    def __getitem__(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        if name not in self.candidates:
            return torch.full(shape, self.fill, dtype=self._dtype)
        ell = self.values[name]
        full = torch.full((math.prod(shape),), self.fill, dtype=ell.dtype, device=ell.device)
        full[self.candidates[name]] = ell
        return full.view(shape)

