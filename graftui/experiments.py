"""The maths of the paper's experiments with regions, as small exact functions (§5, App. C of arXiv 2302.06600).

    Eq. 5  relative gain   Rel_{γ,t} = (P_{γ,t} − P_{0,t}) / (P_{1,t} − P_{0,t})
           P_{γ,t}: task t's performance of the graft θ̄(γ); P_0: the pre-trained body with the
           fine-tuned head (γ = ∅); P_1: the fine-tuned model (γ = everything).
    Fig. 8d purification  mask steps on Σ_{i∈G} L_i over task heads that share one body
    Table 1 re-training   train only the coordinates inside γ, from θ_pre
    §5.2   continual      task t_n trains only γ_{t_n} \\ ∪_{i<n} γ_{t_i}; inference uses ∪_{i≤n} γ_{t_i}
    ablation   drop part  θ_pre + (γ − γ_P) ⊙ δ: part P of γ (one layer, one module type) back to θ_pre
    stitching  θ_pre + Σ_i γ_i ⊙ δ_i (Localize-and-Stitch, He et al. 2024), against task arithmetic
               θ_pre + λ Σ_i δ_i (Ilharco et al. 2023), TIES (Yadav et al. 2023), DARE (Yu et al. 2024) and
               consensus merging with TALL masks (Wang et al. 2024), λ and their settings chosen on validation data

The maths of localization itself (Eq. 1–4, and WiSE of Fig. 7) is ``method``; overlap
|γ_i ∩ γ_j| / |γ_j| (Fig. 8a) and unions are ``sets``; the flows that run these experiments on
real models are ``flows.laboratory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch

from .layout import anatomy, split_fused
from .method import Region, region_to_mask
from .sets import difference, union
from .training import optimizer, optimizer_step


def relative_gain(p_graft: float, p_zero: float, p_one: float) -> float | None:
    """Eq. 5: how much of the fine-tuning gain on a task the graft recovers (1 = all, 0 = none).

    None when fine-tuning did not change the task's performance (P_1 = P_0): no gain to share.
    """
    gap = p_one - p_zero
    return (p_graft - p_zero) / gap if gap != 0 else None


def task_arithmetic(pre: dict[str, torch.Tensor], finetuned: list[dict[str, torch.Tensor]], lam: float,
                    names) -> dict[str, torch.Tensor]:
    """θ_pre + λ Σ_i (θ_i − θ_pre) for each tensor of ``names``: the merge that stitching is measured against."""
    out = {}
    for name in names:
        moved = torch.zeros_like(pre[name])
        for ft in finetuned:
            moved += ft[name].to(moved.device) - pre[name]
        out[name] = pre[name] + lam * moved
    return out


def ties_merge(pre: dict[str, torch.Tensor], finetuned: list[dict[str, torch.Tensor]], lam: float, density: float,
               names) -> dict[str, torch.Tensor]:
    """TIES-merging (Yadav et al. 2023): each task vector δ_i trimmed to its ``density`` share of largest |δ_i| (per
    tensor), each parameter's sign elected by the sign of Σ_i of the trimmed δ_i, and the mean of the trimmed
    entries that agree with it (a disjoint mean): θ_pre + λ·that."""
    out = {}
    for name in names:
        moved = torch.stack([ft[name].to(pre[name].device) - pre[name] for ft in finetuned]).float()
        flat = moved.view(len(finetuned), -1)
        keep = max(1, round(density * flat.shape[1]))
        if keep < flat.shape[1]:  # the keep-th largest |δ_i| of each task vector, ties kept
            floor = flat.abs().kthvalue(flat.shape[1] - keep + 1, dim=1, keepdim=True).values
            flat = torch.where(flat.abs() >= floor, flat, torch.zeros_like(flat))
        elected = torch.sign(flat.sum(0))
        agree = (torch.sign(flat) == elected) & (flat != 0)
        merged = (flat * agree).sum(0) / agree.sum(0).clamp(min=1)
        out[name] = (pre[name].float() + lam * merged.view(pre[name].shape)).to(pre[name].dtype)
    return out


def dare_merge(pre: dict[str, torch.Tensor], finetuned: list[dict[str, torch.Tensor]], lam: float, density: float,
               names, seed: int = 0) -> dict[str, torch.Tensor]:
    """DARE (Yu et al. 2024) before task arithmetic: each entry of each δ_i kept with probability ``density`` and
    rescaled by 1/density (the rest dropped), then θ_pre + λ Σ_i of them; the drop is seeded per tensor and task."""
    out = {}
    for position, name in enumerate(names):
        moved = torch.zeros_like(pre[name], dtype=torch.float32)
        for i, ft in enumerate(finetuned):
            gen = torch.Generator().manual_seed((seed * 1_000_003 + position * 101 + i) % 2**63)
            kept = torch.rand(pre[name].shape, generator=gen) < density
            moved += torch.where(kept.to(moved.device), (ft[name].to(moved.device) - pre[name]).float() / density, 0.0)
        out[name] = (pre[name].float() + lam * moved).to(pre[name].dtype)
    return out


def consensus_merge(pre: dict[str, torch.Tensor], finetuned: list[dict[str, torch.Tensor]], lam: float, tall: float,
                    names) -> dict[str, torch.Tensor]:
    """Consensus merging with TALL masks (Wang et al. 2024): task i claims a parameter where its own movement
    outweighs what the other tasks add there, |δ_i| ≥ tall·|Σ_j δ_j − δ_i|; a parameter claimed by two or more
    tasks is kept, one claimed by a single task ("selfish") or by none dropped; θ_pre + λ·(kept ⊙ Σ_i δ_i)."""
    out = {}
    for name in names:
        moved = torch.stack([ft[name].to(pre[name].device) - pre[name] for ft in finetuned]).float()
        total = moved.sum(0)
        claimed = (moved.abs() >= tall * (total - moved).abs()).sum(0)
        out[name] = (pre[name].float() + lam * torch.where(claimed >= 2, total, 0.0)).to(pre[name].dtype)
    return out


@dataclass(frozen=True)
class Merge:
    """A merging method stitching is measured against: ``make(pre, finetuned, λ, setting, names)`` gives its tensors.
    Its second setting, where it has one, is chosen from the ComposeRequest grid ``grid``, recorded under ``key`` and
    named ``words`` in a row's label."""

    name: str  # as a row names it
    make: Callable
    grid: str | None = None
    key: str | None = None
    words: str | None = None

    def label(self, lam: float, setting: float | None) -> str:
        """The merge as a model's name in the rows: "task arithmetic (λ = 0.6)", "TIES (λ = 1, density 0.2)"."""
        return f"{self.name} (λ = {lam:g}" + (f", {self.words} {setting:g})" if self.grid and setting else ")")


MERGES = {
    "task-arithmetic": Merge("task arithmetic", lambda pre, fts, lam, _, names: task_arithmetic(pre, fts, lam, names)),
    "ties": Merge("TIES", ties_merge, "densities", "density", "density"),
    "dare": Merge("DARE", dare_merge, "densities", "density", "density"),
    "consensus": Merge("consensus", consensus_merge, "talls", "tall", "TALL λ"),
}


def best_lambda(scores: dict[float, float]) -> float:
    """The λ with the best validation score; of equal scores the smallest λ (the merge that moves least)."""
    return min(scores, key=lambda lam: (-scores[lam], lam))


def gain_matrix(scores: list[list[float]], p_zero: list[float], p_one: list[float]) -> list[list[float | None]]:
    """Rel[i][j] = Eq. 5 of region i on task j, from scores[i][j] = P_{γ_i, t_j}."""
    return [[relative_gain(row[j], p_zero[j], p_one[j]) for j in range(len(p_zero))] for row in scores]


def new_part(region: Region, earlier: list[Region]) -> Region:
    """γ_{t_n} \\ ∪_{i<n} γ_{t_i}: the only parameters task t_n may train in forget-free learning."""
    return difference(region, union(*earlier)) if earlier else dict(region)


def row_of(name: str, shape) -> str:
    """The anatomy row a tensor lies in ("layer 3", "embeddings", "pooler" or "other"), as ``layout.anatomy`` names it."""
    return anatomy({}, {name: tuple(int(s) for s in shape)}).layers[0]


def part_mask(region: Region, shapes: dict, layer: str | None = None, module: str | None = None) -> dict[str, torch.Tensor]:
    """γ_P: which indices of γ lie in part P, one anatomy row (``layer``), one module type (``module``), or both
    (neither: all of γ). Per tensor of γ, a boolean tensor aligned with its indices; a fused tensor (GPT-2's
    ``c_attn``) is split into query, key and value by column, as the anatomy splits it."""
    out = {}
    for name, idx in region.items():
        idx = idx.reshape(-1)
        shape = tuple(shapes[name])
        if layer is not None and row_of(name, shape) != layer:
            out[name] = torch.zeros(idx.numel(), dtype=torch.bool, device=idx.device)
        elif module is None:
            out[name] = torch.ones(idx.numel(), dtype=torch.bool, device=idx.device)
        else:
            inside = split_fused(name, shape, idx).get(module)
            out[name] = torch.isin(idx, inside) if inside is not None else torch.zeros(
                idx.numel(), dtype=torch.bool, device=idx.device)
    return out


def drop_part(region: Region, shapes: dict, layer: str | None = None, module: str | None = None,
              values: dict[str, torch.Tensor] | None = None) -> tuple[Region, dict[str, torch.Tensor] | None]:
    """γ − γ_P (and a skill patch's ``values`` kept alike): the region whose graft θ_pre + (γ − γ_P) ⊙ δ puts part P's
    parameters back to θ_pre and keeps every other graft value. Tensors left with no index are omitted."""
    masks = part_mask(region, shapes, layer, module)
    return _kept(region, {n: ~masks[n] for n in region}, values)


def only_part(region: Region, shapes: dict, layer: str | None = None, module: str | None = None,
              values: dict[str, torch.Tensor] | None = None) -> tuple[Region, dict[str, torch.Tensor] | None]:
    """γ_P (and a skill patch's ``values`` kept alike): the region whose graft θ_pre + γ_P ⊙ δ grafts part P of the
    region alone, what one layer or one module type of the region does by itself."""
    return _kept(region, part_mask(region, shapes, layer, module), values)


def _kept(region: Region, kept: dict[str, torch.Tensor], values: dict[str, torch.Tensor] | None
          ) -> tuple[Region, dict[str, torch.Tensor] | None]:
    """The indices of γ (and their ``values``) where ``kept`` holds; tensors left with no index are omitted."""
    out = {n: region[n].reshape(-1)[keep] for n, keep in kept.items() if bool(keep.any())}
    if values is None:
        return out, None
    return out, {n: values[n].reshape(-1)[kept[n].to(values[n].device)] for n in out}


def retrain_inside(
    model: torch.nn.Module,
    params: dict[str, torch.nn.Parameter],
    start: dict[str, torch.Tensor],
    region: Region,
    make_batches,
    config,
    progress=None,
    cancel=None,
) -> dict[str, torch.Tensor]:
    """Train only the coordinates inside ``region``, from the values ``start`` the model holds.

    Graft re-training (Table 1) starts from θ_pre; a continual-learning stage (§5.2) starts from
    the body the earlier stages left. ``config`` is a fine-tuning recipe (``FinetuneConfig``);
    every other coordinate stays where it is (and the head as given): after each optimiser step
    the coordinates outside the region are put back, so weight decay and momentum cannot leak out
    of it. Returns the trained values at the region's indices; the model is left at ``start``.
    """
    names = [n for n in region if region[n].numel()]
    masks = region_to_mask({n: region[n] for n in names}, {n: tuple(params[n].shape) for n in names})
    masks = {n: m.to(params[n].device) for n, m in masks.items()}
    if not names:
        return {}
    start = {n: start[n].to(params[n].device) for n in names}  # read once (a GPU pair's θ_pre lives on the host)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    trainable = {id(params[n]) for n in names}
    chosen = [params[n] for n in names]
    step = 0
    try:
        for p in model.parameters():
            p.requires_grad_(id(p) in trainable)
        opt = optimizer(chosen, config)
        model.train()
        for epoch in range(config.epochs):
            for batch in make_batches(epoch):
                step += 1
                out = optimizer_step(model, opt, batch, chosen[0].device, config, step, "re-training", cancel)
                with torch.no_grad():
                    for n in names:
                        torch.where(masks[n], params[n].data, start[n], out=params[n].data)
                if progress is not None:
                    progress(step, float(out.loss.detach()))
        return {n: params[n].detach().view(-1)[region[n].to(params[n].device)].clone() for n in names}
    finally:
        with torch.no_grad():
            for n in names:
                params[n].data.copy_(start[n])
                params[n].grad = None
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])
        model.eval()


class JointLoss(torch.nn.Module):
    """Σ_{i∈G} L_i over task heads that share one body: the objective of purification (Fig. 8d).

    A batch holds one sub-batch per task, its keys prefixed with the task's position ("0:input_ids").
    """

    def __init__(self, models: list[torch.nn.Module]):
        super().__init__()
        self.heads = torch.nn.ModuleList(models)

    def forward(self, **batch):
        loss, correct, seen = 0.0, 0, 0
        for i, model in enumerate(self.heads):
            part = {key.split(":", 1)[1]: v for key, v in batch.items() if key.startswith(f"{i}:")}
            out = model(**part)
            loss = loss + out.loss
            correct += int((out.logits.argmax(-1) == part["labels"]).sum())
            seen += int(part["labels"].numel())
        return SimpleNamespace(loss=loss, accuracy=correct / max(seen, 1))
