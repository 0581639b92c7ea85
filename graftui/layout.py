"""Where a region sits inside the network (paper Fig. 9-10).

A region is a set of flat indices per parameter. To read it as anatomy we map
every parameter name onto (transformer layer, module type, weight/bias) and
count region members per (layer, module) cell, next to the number of graftable
parameters in that cell so that density is comparable across cells of very
different sizes. Names follow ``model.named_parameters()`` of Hugging Face
sequence-classification models: BERT / RoBERTa, DistilBERT, GPT-2 and
Llama / Mistral; anything unrecognised falls into "other".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

MODULE_TYPES = ("query", "key", "value", "attn_out", "ffn_in", "ffn_out", "layernorm", "other")
MODULE_LABELS = {
    "query": "Query",
    "key": "Key",
    "value": "Value",
    "attn_out": "Attention output",
    "ffn_in": "FFN in",
    "ffn_out": "FFN out",
    "layernorm": "LayerNorm",
    "other": "Other",
}


def part_label(by: str, part: str) -> str:
    """A part of a region as tables name it: an anatomy row ("layer 3") as it is, a module type by its label."""
    return part if by == "layer" else MODULE_LABELS.get(part, part)


def cell_label(layer: str, module: str) -> str:
    """One (layer, module type) cell of a region as a probe map names it: "layer 3 · Attention output"."""
    return f"{part_label('layer', layer)} · {part_label('module', module)}"


# GPT-2's c_attn packs q|k|v side by side along the output (last) dimension.
_FUSED_QKV = ("query", "key", "value")

_LAYER_RE = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")
_EMBED_RE = re.compile(r"(?:^|\.)(?:embeddings|embed_tokens|embed_positions|wte|wpe)(?:\.|$)")
_LN_RE = re.compile(r"^ln(?:_\w+)?$")

# Leaf module name -> module type, for names that are unambiguous on their own.
_LEAF = {
    "query": "query", "q_lin": "query", "q_proj": "query",
    "key": "key", "k_lin": "key", "k_proj": "key",
    "value": "value", "v_lin": "value", "v_proj": "value",
    "out_lin": "attn_out", "o_proj": "attn_out", "out_proj": "attn_out",
    "lin1": "ffn_in", "c_fc": "ffn_in", "gate_proj": "ffn_in", "up_proj": "ffn_in",
    "fc1": "ffn_in", "dense_h_to_4h": "ffn_in",
    "lin2": "ffn_out", "down_proj": "ffn_out", "fc2": "ffn_out", "dense_4h_to_h": "ffn_out",
}


@dataclass(frozen=True)
class ParamRole:
    """What a parameter is: its block, its module type and whether it is a weight or bias.

    ``fused`` lists the module types packed into one tensor (GPT-2 ``c_attn``:
    query, key, value); ``module`` is then the first of them and counts must go
    through :func:`split_fused`. Empty for ordinary parameters.
    """

    layer: int | None
    module: str
    kind: str
    fused: tuple[str, ...] = field(default=())


def _is_norm(leaf: str) -> bool:
    return "norm" in leaf.lower() or bool(_LN_RE.match(leaf))


def param_role(name: str) -> ParamRole:
    """Map a parameter name to its (layer, module type, kind).

    Parameters outside transformer blocks (embeddings, pooler, classifier head,
    final norm) get ``layer=None`` and module "layernorm" or "other".
    """
    parts = name.split(".")
    kind = "bias" if parts[-1] == "bias" else "weight"
    leaf = parts[-2] if len(parts) >= 2 else parts[-1]
    parent = parts[-3] if len(parts) >= 3 else ""
    grand = parts[-4] if len(parts) >= 4 else ""
    m = _LAYER_RE.search(name)
    layer = int(m.group(1)) if m else None

    if _is_norm(leaf):
        return ParamRole(layer, "layernorm", kind)
    if layer is None:
        return ParamRole(None, "other", kind)
    if leaf == "c_attn":
        return ParamRole(layer, _FUSED_QKV[0], kind, _FUSED_QKV)
    if leaf in _LEAF:
        return ParamRole(layer, _LEAF[leaf], kind)
    if leaf == "c_proj":  # GPT-2: attn.c_proj vs mlp.c_proj
        return ParamRole(layer, "attn_out" if parent == "attn" else "ffn_out", kind)
    if leaf == "dense":  # BERT family: attention.output.dense / intermediate.dense / output.dense
        if parent == "intermediate":
            return ParamRole(layer, "ffn_in", kind)
        if parent == "output":
            return ParamRole(layer, "attn_out" if grand == "attention" else "ffn_out", kind)
        if parent == "attention":
            return ParamRole(layer, "attn_out", kind)
    return ParamRole(layer, "other", kind)


_ROW_GROUPS = ("embeddings", "pooler", "other")


def _row_group(name: str) -> str:
    """Row for a parameter outside the blocks: "embeddings", "pooler" (BERT's [CLS] head) or "other"."""
    if _EMBED_RE.search(name):
        return "embeddings"
    return "pooler" if ".pooler." in f".{name}" else "other"


def _fused_width(name: str, shape: tuple[int, ...], n_parts: int) -> int:
    """Size of one part along the fused (last) dimension."""
    if not shape or shape[-1] % n_parts:
        raise ValueError(f"{name}: last dimension of {tuple(shape)} is not divisible by {n_parts}")
    return shape[-1] // n_parts


def split_fused(name: str, shape: tuple[int, ...], flat_indices: torch.Tensor) -> dict[str, torch.Tensor]:
    """Split a parameter's region indices by module type.

    For GPT-2 ``c_attn`` (Conv1D weight (in, 3*out), bias (3*out,)) the column
    of each flat index says whether it belongs to the query, key or value
    projection; returns one entry per part (possibly empty). Ordinary
    parameters return ``{module: flat_indices}`` unchanged.
    """
    role = param_role(name)
    if not role.fused:
        return {role.module: flat_indices}
    width = _fused_width(name, tuple(shape), len(role.fused))
    col = flat_indices % shape[-1]
    part = torch.div(col, width, rounding_mode="floor")
    return {mod: flat_indices[part == i] for i, mod in enumerate(role.fused)}


def _fused_totals(name: str, shape: tuple[int, ...]) -> dict[str, int]:
    """Number of parameters per module type in one tensor."""
    role = param_role(name)
    numel = math.prod(shape)
    if not role.fused:
        return {role.module: numel}
    n = len(role.fused)
    _fused_width(name, shape, n)
    return {mod: numel // n for mod in role.fused}


@dataclass(frozen=True)
class Anatomy:
    """Region counts per (row, module type) next to graftable totals.

    Rows are "layer i" for every block index present in the graftable set
    (ascending), then "embeddings" and "other" if those hold graftable
    parameters. ``modules`` are the MODULE_TYPES present, in that order.
    """

    layers: tuple[str, ...]
    modules: tuple[str, ...]
    counts: list[list[int]]
    totals: list[list[int]]
    density: list[list[float]]
    weight_count: int
    bias_count: int
    weight_total: int
    bias_total: int
    by_module: dict[str, int]
    by_layer: list[int]

    def to_rows(self) -> list[dict]:
        """Flat table, one row per cell that holds graftable parameters."""
        return [
            {
                "layer": row,
                "module": mod,
                "count": self.counts[i][j],
                "total": self.totals[i][j],
                "density": self.density[i][j],
            }
            for i, row in enumerate(self.layers)
            for j, mod in enumerate(self.modules)
            if self.totals[i][j] > 0
        ]


def _row_label(name: str, layer: int | None) -> str:
    return f"layer {layer}" if layer is not None else _row_group(name)


def anatomy(region: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]]) -> Anatomy:
    """Tabulate a region by layer and module type.

    ``shapes`` must list every graftable parameter (it defines the totals);
    region indices are flat, sorted and unique per parameter.
    """
    unknown = sorted(set(region) - set(shapes))
    if unknown:
        raise KeyError(f"region names not in shapes: {unknown[:5]}")

    cell_total: dict[tuple[str, str], int] = {}
    cell_count: dict[tuple[str, str], int] = {}
    totals_by_kind = {"weight": 0, "bias": 0}
    counts_by_kind = {"weight": 0, "bias": 0}
    layer_ids: set[int] = set()
    groups: set[str] = set()

    for name, shape in shapes.items():
        shape = tuple(int(s) for s in shape)
        role = param_role(name)
        row = _row_label(name, role.layer)
        if role.layer is not None:
            layer_ids.add(role.layer)
        else:
            groups.add(row)
        numel = math.prod(shape)
        totals_by_kind[role.kind] += numel
        for mod, t in _fused_totals(name, shape).items():
            cell_total[(row, mod)] = cell_total.get((row, mod), 0) + t

        idx = region.get(name)
        if idx is None or idx.numel() == 0:
            continue
        if int(idx.max()) >= numel or int(idx.min()) < 0:
            raise ValueError(f"{name}: region index out of range for shape {shape}")
        counts_by_kind[role.kind] += int(idx.numel())
        for mod, sub in split_fused(name, shape, idx).items():
            cell_count[(row, mod)] = cell_count.get((row, mod), 0) + int(sub.numel())

    rows = tuple(f"layer {i}" for i in sorted(layer_ids)) + tuple(
        g for g in _ROW_GROUPS if g in groups
    )
    present = {mod for (_, mod), t in cell_total.items() if t > 0}
    modules = tuple(m for m in MODULE_TYPES if m in present)

    counts = [[cell_count.get((r, m), 0) for m in modules] for r in rows]
    totals = [[cell_total.get((r, m), 0) for m in modules] for r in rows]
    density = [
        [c / t if t else 0.0 for c, t in zip(crow, trow)] for crow, trow in zip(counts, totals)
    ]
    return Anatomy(
        layers=rows,
        modules=modules,
        counts=counts,
        totals=totals,
        density=density,
        weight_count=counts_by_kind["weight"],
        bias_count=counts_by_kind["bias"],
        weight_total=totals_by_kind["weight"],
        bias_total=totals_by_kind["bias"],
        by_module={m: sum(row[j] for row in counts) for j, m in enumerate(modules)},
        by_layer=[sum(row) for row in counts],
    )
