"""The paper's experiments with regions, as small exact functions (§5, App. C of arXiv 2302.06600).

    Eq. 5  relative gain   Rel_{γ,t} = (P_{γ,t} − P_{0,t}) / (P_{1,t} − P_{0,t})
           P_{γ,t}: task t's performance of the graft θ̄(γ); P_0: the pre-trained body with the
           fine-tuned head (γ = ∅); P_1: the fine-tuned model (γ = everything).
    Fig. 7 WiSE           θ_pre + α·δ (WiSE-FT) and θ_pre + α·γ⊙δ (WiSE-graft), α ∈ [0, 1]
    §5.2   continual      task t_n trains only γ_{t_n} \\ ∪_{i<n} γ_{t_i}; inference uses ∪_{i≤n} γ_{t_i}

Overlap |γ_i ∩ γ_j| / |γ_j| (Fig. 8a) and unions live in ``sets``; the flows that run these
experiments on real models live in ``experiments``.
"""

from __future__ import annotations

import torch

from .method import Region
from .sets import difference, union


def relative_gain(p_graft: float, p_zero: float, p_one: float) -> float | None:
    """Eq. 5: how much of the fine-tuning gain on a task the graft recovers (1 = all, 0 = none).

    None when fine-tuning did not change the task's performance (P_1 = P_0): no gain to share.
    """
    gap = p_one - p_zero
    return (p_graft - p_zero) / gap if gap != 0 else None


def gain_matrix(scores: list[list[float]], p_zero: list[float], p_one: list[float]) -> list[list[float | None]]:
    """Rel[i][j] = Eq. 5 of region i on task j, from scores[i][j] = P_{γ_i, t_j}."""
    return [[relative_gain(row[j], p_zero[j], p_one[j]) for j in range(len(p_zero))] for row in scores]


def wise(pre: torch.Tensor, ft: torch.Tensor, alpha: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """θ_pre + α·δ, or θ_pre + α·γ⊙δ with a boolean ``mask`` γ.

    ``torch.lerp`` is exact at both ends (α = 0 gives θ_pre, α = 1 gives θ_ft bit for bit), so
    WiSE at α = 1 is the model or the graft itself, not a rounding of it.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"α must be in [0, 1], got {alpha}")
    mixed = torch.lerp(pre, ft, alpha)
    return mixed if mask is None else torch.where(mask, mixed, pre)


def new_part(region: Region, earlier: list[Region]) -> Region:
    """γ_{t_n} \\ ∪_{i<n} γ_{t_i}: the only parameters task t_n may train in forget-free learning."""
    return difference(region, union(*earlier)) if earlier else dict(region)
