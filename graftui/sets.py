"""Set algebra on regions of several tasks (paper §5, Fig. 8a).

Regions found for different tasks on the same pre-trained model can be
compared (how much does task j's region share with task i's?) and combined
into one graft that carries several skills at once. A region maps parameter
name -> sorted, unique int64 tensor of flat indices. Every operation is
vectorised (``torch.isin`` / ``torch.unique``) because a region can hold
millions of indices per tensor. Outputs omit names that end up with no
indices.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import torch

from .layout import MODULE_LABELS, anatomy
from .weights import take

Region = dict[str, torch.Tensor]

RESOLVE_MODES = ("mean", "sum", "first", "last")


def region_size(region: Region) -> int:
    """Total number of parameters in a region."""
    return sum(int(idx.numel()) for idx in region.values())


def _isin(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mask of elements of a that occur in b (both on a's device)."""
    return torch.isin(a, b.to(a.device), assume_unique=True)


def _intersection_count(a: Region, b: Region) -> int:
    """|a ∩ b| without materialising the intersection."""
    return sum(int(_isin(a[n], b[n]).sum()) for n in a.keys() & b.keys())


def intersection(a: Region, b: Region) -> Region:
    """Indices present in both regions (sorted, since a's indices are)."""
    out: Region = {}
    for name in a:
        if name in b:
            keep = a[name][_isin(a[name], b[name])]
            if keep.numel():
                out[name] = keep
    return out


def difference(a: Region, b: Region) -> Region:
    """Indices of a that b does not hold (sorted, since a's indices are)."""
    out: Region = {}
    for name, idx in a.items():
        keep = idx[~_isin(idx, b[name])] if name in b else idx
        if keep.numel():
            out[name] = keep
    return out


def union(*regions: Region) -> Region:
    """Indices present in any region, sorted and unique per name."""
    per_name: dict[str, list[torch.Tensor]] = {}
    for region in regions:
        for name, idx in region.items():
            per_name.setdefault(name, []).append(idx.reshape(-1).long())
    out: Region = {}
    for name, parts in per_name.items():
        dev = parts[0].device
        merged = torch.unique(torch.cat([p.to(dev) for p in parts]), sorted=True)
        if merged.numel():
            out[name] = merged
    return out


def overlap(a: Region, b: Region) -> float:
    """|a ∩ b| / |b|: the share of b's region that a also uses (paper Fig. 8a); 0.0 if b is empty."""
    size_b = region_size(b)
    return _intersection_count(a, b) / size_b if size_b else 0.0


def iou(a: Region, b: Region) -> float:
    """Intersection over union, |a ∩ b| / |a ∪ b|; 0.0 if both are empty."""
    inter = _intersection_count(a, b)
    denom = region_size(a) + region_size(b) - inter
    return inter / denom if denom else 0.0


def overlap_matrix(regions: dict[str, Region]) -> dict:
    """Pairwise comparison of named regions, JSON-friendly.

    Returns names, sizes, intersection_counts[i][j] = |γi ∩ γj|,
    overlap[i][j] = |γi ∩ γj| / |γj| (the paper's asymmetric measure, 1.0 on
    the diagonal for non-empty regions) and the symmetric iou.
    """
    names = list(regions)
    sizes = [region_size(regions[n]) for n in names]
    k = len(names)
    inter = [[0] * k for _ in range(k)]
    for i in range(k):
        inter[i][i] = sizes[i]
        for j in range(i + 1, k):
            c = _intersection_count(regions[names[i]], regions[names[j]])
            inter[i][j] = inter[j][i] = c
    over = [[inter[i][j] / sizes[j] if sizes[j] else 0.0 for j in range(k)] for i in range(k)]
    jac = [
        [
            inter[i][j] / (sizes[i] + sizes[j] - inter[i][j])
            if sizes[i] + sizes[j] - inter[i][j]
            else 0.0
            for j in range(k)
        ]
        for i in range(k)
    ]
    return {"names": names, "sizes": sizes, "intersection_counts": inter, "overlap": over, "iou": jac}


def found_by(regions: list[Region]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per tensor name: the indices any region holds and how many of the regions hold each."""
    per_name: dict[str, list[torch.Tensor]] = {}
    for region in regions:
        for name, idx in region.items():
            per_name.setdefault(name, []).append(idx.reshape(-1).long())
    out = {}
    for name, parts in per_name.items():
        dev = parts[0].device
        out[name] = torch.unique(torch.cat([p.to(dev) for p in parts]), sorted=True, return_counts=True)
    return out


def core(regions: list[Region]) -> Region:
    """The indices every region holds (the intersection of all)."""
    n = len(regions)
    return {name: idx[count == n] for name, (idx, count) in found_by(regions).items() if int((count == n).sum())}


def stability(regions: list[Region], graftable: int) -> dict:
    """How alike regions found with different seeds are, against chance.

    ``pairwise_overlap[i][j]`` = |γi ∩ γj| / |γj|; two random regions of sizes ki and kj share
    E|γi ∩ γj| / |γj| = ki / N (``chance_overlap``, the mean over pairs); ``core`` counts the parameters
    every seed found, ``only_one`` those a single seed found, ``union`` those any seed found.
    """
    m = overlap_matrix({str(i): r for i, r in enumerate(regions)})
    n, sizes = len(regions), m["sizes"]
    counts = found_by(regions)
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    chance = sum(sizes[i] / graftable for i, _ in pairs) / len(pairs) if pairs and graftable else 0.0
    mean_overlap = sum(m["overlap"][i][j] for i, j in pairs) / len(pairs) if pairs else 1.0
    return {
        "seeds": n, "sizes": sizes, "pairwise_overlap": m["overlap"], "pairwise_iou": m["iou"],
        "mean_overlap": mean_overlap, "chance_overlap": chance,
        "over_chance": mean_overlap / chance if chance else None,
        "core": sum(int((c == n).sum()) for _, c in counts.values()),
        "only_one": sum(int((c == 1).sum()) for _, c in counts.values()),
        "union": sum(int(c.numel()) for _, c in counts.values()),
    }


def _part_stability(counts: list[int], kept: int, total: int, label: str) -> dict:
    """One part's stability: ``counts`` each seed's parameters there, ``kept`` the core's, ``total`` the graftable."""
    mean = sum(counts) / len(counts)
    chance = total * math.prod(c / total for c in counts) if total else 0.0  # E|core| of independent random regions
    return {"label": label, "total": total, "mean": mean, "core": kept, "core_share": kept / mean if mean else None,
            "chance_share": chance / mean if mean else None,
            "over_chance": (kept / chance if chance else None) if mean else None}


def stability_by_part(regions: list[Region], shapes: dict[str, tuple[int, ...]]) -> dict:
    """How stable each part of the network is across regions found with different seeds, against chance.

    Per module type (``by_module``) and per anatomy row (``by_layer``): ``mean`` the parameters a seed's region holds
    there, ``core`` those every seed found, ``core_share`` = core / mean (the share of a seed's region there that every
    seed found). Independent random regions with these counts c_1 … c_s among the part's N graftable parameters share
    E|core| = N · Π (c_i / N) (``chance_share`` = that / mean; ``over_chance`` = core / that). Parts where the seeds
    hold nothing are left out. ``grid`` gives core_share per (row, module) cell (None where no seed holds any).
    """
    each = [anatomy(r, shapes) for r in regions]
    kept = anatomy(core(regions), shapes)
    by_module, by_layer = {}, {}
    for j, m in enumerate(kept.modules):
        counts = [a.by_module[m] for a in each]
        if any(counts):
            by_module[m] = _part_stability(counts, kept.by_module[m], sum(row[j] for row in kept.totals),
                                           MODULE_LABELS.get(m, m))
    for i, row in enumerate(kept.layers):
        counts = [a.by_layer[i] for a in each]
        if any(counts):
            by_layer[row] = _part_stability(counts, kept.by_layer[i], sum(kept.totals[i]), row)
    grid = [[_part_stability([a.counts[i][j] for a in each], kept.counts[i][j], kept.totals[i][j], "")["core_share"]
             for j in range(len(kept.modules))] for i in range(len(kept.layers))]
    return {"by_module": by_module, "by_layer": by_layer,
            "grid": {"layers": list(kept.layers), "modules": list(kept.modules),
                     "module_labels": [MODULE_LABELS.get(m, m) for m in kept.modules], "core_share": grid}}


@dataclass(frozen=True)
class Contribution:
    """One task's region together with its fine-tuned checkpoint's values there.

    ``values[name]`` is aligned with ``indices[name]``: the fine-tuned value of
    ``param.view(-1)[indices[name]]``.
    """

    name: str
    indices: dict[str, torch.Tensor]
    values: dict[str, torch.Tensor]


def _check(c: Contribution) -> None:
    """Contributions must hold sorted unique indices with one value each."""
    if set(c.indices) != set(c.values):
        raise ValueError(f"contribution {c.name!r}: indices and values name different parameters")
    for pname, idx in c.indices.items():
        if idx.dim() != 1 or c.values[pname].reshape(-1).numel() != idx.numel():
            raise ValueError(f"contribution {c.name!r}: {pname} indices and values differ in length")
        if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
            raise ValueError(f"contribution {c.name!r}: {pname} indices are not sorted and unique")


def union_values(
    contributions: list[Contribution],
    base: dict[str, torch.Tensor],
    resolve: str = "mean",
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """Merge regions from different fine-tuned checkpoints of one base into one graft.

    Each index of the union takes the value of the contribution that claims
    it, bit for bit. Where several contributions claim the same index the
    conflict is resolved by ``resolve``:

    * ``"mean"``: base + mean of the contributors' deltas (value - base), i.e.
      task arithmetic restricted to the overlap; computed in float64
      (Localize-and-Stitch's rule).
    * ``"sum"``: base + their sum, θ_pre + Σ_i γ_i ⊙ δ_i as written: each
      task keeps its whole movement where the regions overlap.
    * ``"first"`` / ``"last"``: the earliest / latest contribution in the list wins.

    ``base`` maps parameter name -> pre-trained tensor (any shape; indexed
    flat); it is read only at overlapping indices in "mean" and "sum" modes.

    Returns (indices, values, report) where report holds ``overlap_params``
    (indices claimed by two or more contributions), ``per_pair``
    (``per_pair[a][b]`` = shared indices of contributions a and b, for a
    listed before b), ``sizes`` per contribution, ``union_params`` and
    ``resolve``.
    """
    if resolve not in RESOLVE_MODES:
        raise ValueError(f"resolve must be one of {RESOLVE_MODES}, got {resolve!r}")
    names = [c.name for c in contributions]
    if len(set(names)) != len(names):
        raise ValueError(f"contribution names must be unique, got {names}")
    for c in contributions:
        _check(c)

    out_idx: dict[str, torch.Tensor] = {}
    out_val: dict[str, torch.Tensor] = {}
    n_overlap = 0
    pnames = list(dict.fromkeys(p for c in contributions for p in c.indices))

    for pname in pnames:
        owners = [c for c in contributions if pname in c.indices and c.indices[pname].numel()]
        if not owners:
            continue
        dev = owners[0].indices[pname].device
        idx = torch.cat([c.indices[pname].to(dev).long() for c in owners])
        val = torch.cat([c.values[pname].reshape(-1).to(dev) for c in owners])
        if len(owners) == 1:
            out_idx[pname], out_val[pname] = idx, val
            continue
        uniq, inv, counts = torch.unique(idx, sorted=True, return_inverse=True, return_counts=True)
        pos = torch.arange(idx.numel(), device=dev)
        reduce = "amax" if resolve == "last" else "amin"
        init = torch.full((uniq.numel(),), -1 if reduce == "amax" else idx.numel(), device=dev)
        pick = init.scatter_reduce(0, inv, pos, reduce=reduce, include_self=True)
        merged = val[pick]  # exact contributor values; the overlap is fixed up below for "mean" and "sum"
        shared = counts > 1
        n_overlap += int(shared.sum())
        if resolve in ("mean", "sum") and bool(shared.any()):
            if pname not in base:
                raise KeyError(f"base has no parameter {pname!r}, needed to add overlapping deltas")
            base_at = take(base, pname, idx).to(dev).double()
            delta_sum = torch.zeros(uniq.numel(), dtype=torch.float64, device=dev)
            delta_sum.index_add_(0, inv, val.double() - base_at)
            delta = delta_sum[shared] / (counts[shared].double() if resolve == "mean" else 1.0)
            base_shared = take(base, pname, uniq[shared]).to(dev).double()
            merged[shared] = (base_shared + delta).to(merged.dtype)
        out_idx[pname], out_val[pname] = uniq, merged

    per_pair: dict[str, dict[str, int]] = {}
    for i, a in enumerate(contributions):
        per_pair[a.name] = {
            b.name: _intersection_count(a.indices, b.indices) for b in contributions[i + 1 :]
        }
    report = {
        "overlap_params": n_overlap,
        "per_pair": per_pair,
        "sizes": {c.name: region_size(c.indices) for c in contributions},
        "union_params": region_size(out_idx),
        "resolve": resolve,
    }
    return out_idx, out_val, report
