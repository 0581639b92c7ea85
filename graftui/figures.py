"""Plotly figures from library results. Plotting only: every number comes from the library."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .config import BODY_LABEL, FT_LABEL, LM_BODY_LABEL
from .formatting import SMALL_N, resolution
from .layout import MODULE_LABELS
from .paths import short_ref

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]
MODEL_COLOURS = {FT_LABEL: "#1f77b4", BODY_LABEL: "#7f7f7f", LM_BODY_LABEL: "#7f7f7f"}


def _layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        height=height,
        margin={"l": 60, "r": 20, "t": 56, "b": 50},
        template="plotly_white",
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0},
        hovermode="closest",
    )
    return fig


def empty_figure(message: str = "Nothing to show yet.", height: int = 300) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"size": 14, "color": "#666"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, "", height)


def _colour(label: str, i: int) -> str:
    return MODEL_COLOURS.get(label, PALETTE[(i + 2) % len(PALETTE)])


# -- live training curves ----------------------------------------------------------------------
def _trend(values: list[float], window: int = 5) -> list[float]:
    """A centred running mean: the trend of a noisy per-batch curve."""
    half = window // 2
    return [sum(values[max(0, i - half):i + half + 1]) / len(values[max(0, i - half):i + half + 1])
            for i in range(len(values))]


HELDOUT_NAMES = {"top-movement start": "top-movement start", "this region": "learned region"}


def _heldout_label(h: dict, last_step: int) -> str:
    """The name a held-out diamond carries on the plot: where learning started, or the region it ended with."""
    name = HELDOUT_NAMES.get(h["model"], h["model"])
    if h["model"] == "this region" and not h["step"] and not last_step:
        name = "region"  # a data-free method: no learning, the region itself
    return f"{name} {h['accuracy']:.1%}"


LABEL_ROOM = 0.13  # of the accuracy axis (0–105 %): the height a line's label takes above or below it


def _label_heights(taken: list[float]) -> list[float] | None:
    """Two heights on the accuracy axis for the diamonds' names, apart from each other and from what ``taken``
    holds (the dotted lines with their labels, the diamonds): below all of it where there is room, else above it;
    None where neither has room (the names then sit beside the diamonds)."""
    low, high = min(taken) - LABEL_ROOM, max(taken) + LABEL_ROOM
    if low >= 0.26:
        return [low / 2 + 0.07, low / 2 - 0.07]
    if 1.05 - high >= 0.26:
        return [(high + 1.05) / 2 + 0.07, (high + 1.05) / 2 - 0.07]
    return None


def localize_progress(progress: list[dict], k: int | None = None, title: str = "Mask learning") -> go.Figure:
    """Loss (with its trend), batch accuracy with the held-out checks beside FT and the empty region, and the
    relaxed region's size per mask step (the job's progress events), every trace named in the legend.

    The bottom panel counts γ(S) ≥ 0.5, which is not the region: the region saved is the top k of the learned
    logits (``method.binarise``), so a count above k while learning is expected and is said so on the plot."""
    seed = next((p["seed"] for p in reversed(progress) if "seed" in p), None)
    if seed is not None:  # a replicate run: the seed under way (each seed's steps start again at 1)
        progress = [p for p in progress if p.get("seed") == seed]
        title = f"{title} · seed {seed}"
    steps = [p for p in progress if "step" in p and "loss" in p]
    held = [p["heldout"] for p in progress if isinstance(p.get("heldout"), dict)]
    if not steps and not held:
        return empty_figure("Waiting for the first mask step… (models and data load first)")
    x = [p["step"] for p in steps]
    n = held[0]["n"] if held else None
    half = resolution(n) if n else None  # how far apart the check must put two models to tell them apart
    fig = make_subplots(
        rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.09,
        subplot_titles=(
            "Loss of the relaxed graft per batch",
            "Accuracy: training batch" + ("" if not held else f"; held-out ◆, n = {n:,} (±{100 * half:.0f} pts)"
                                          + ("<br>too few to tell models closer than that apart"
                                             if n < SMALL_N else "")),
            "Parameters with γ ≥ 0.5 (not the region: the top k of ℓ)",
        ),
    )
    fig.update_annotations(font={"size": 13})  # the panels' titles, before any other annotation is added
    if steps:
        losses = [p["loss"] for p in steps]
        fig.add_trace(go.Scatter(x=x, y=losses, mode="lines+markers", name="loss per batch", line={"width": 1},
                                 marker={"size": 4}, hovertemplate="step %{x}<br>loss %{y:.4f}<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=_trend(losses), mode="lines", name="loss, running mean", line={"width": 3},
                                 hovertemplate="step %{x}<br>running mean %{y:.4f}<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[p["accuracy"] for p in steps], mode="lines+markers", name="batch accuracy",
                                 line={"color": PALETTE[2]},
                                 hovertemplate="step %{x}<br>accuracy %{y:.1%}<extra></extra>"), row=2, col=1)
        region_note = f"the saved region: the top {k:,} by ℓ" if k else "the saved region: the top k by ℓ"
        fig.add_trace(go.Scatter(x=x, y=[p.get("region_size") for p in steps], mode="lines+markers",
                                 name="γ ≥ 0.5 count", line={"color": PALETTE[3]},
                                 hovertemplate=f"step %{{x}}<br>%{{y:,}} parameters with γ ≥ 0.5<br>({region_note})"
                                               "<extra></extra>"), row=3, col=1)
    if held:
        refs = {name: held[-1][name] for name in ("ft", "bare")}
        upper = max(refs, key=refs.get)
        for name, colour in (("ft", MODEL_COLOURS[FT_LABEL]), ("bare", MODEL_COLOURS[BODY_LABEL])):
            words = "fine-tuned" if name == "ft" else "empty region"
            # labelled mid-plot, the higher line's label above it and the lower's below: apart from each other and
            # from the diamonds, which sit at the first and the last step
            fig.add_hline(y=refs[name], line_dash="dot", line_color=colour, row=2, col=1,
                          annotation_text=f"{words} {refs[name]:.1%}", annotation_font={"color": colour, "size": 11},
                          annotation_position="top" if name == upper else "bottom")
        last = max([h["step"] for h in held] + x)
        labels = [_heldout_label(h, last) for h in held]
        heights = _label_heights([*refs.values(), *(h["accuracy"] for h in held)])
        fig.add_trace(go.Scatter(x=[h["step"] for h in held], y=[h["accuracy"] for h in held],
                                 mode="markers" if heights else "markers+text", text=labels,
                                 textposition=["middle right" if h["step"] < last or not last else "middle left"
                                               for h in held], textfont={"size": 11},
                                 name="held-out", marker={"symbol": "diamond", "size": 12, "color": PALETTE[1]},
                                 customdata=[[HELDOUT_NAMES.get(h["model"], h["model"]), h["n"]] for h in held],
                                 hovertemplate="%{customdata[0]} (step %{x})<br>held-out accuracy %{y:.1%} on "
                                               "%{customdata[1]} examples<extra></extra>"), row=2, col=1)
        for i, (h, label) in enumerate(zip(held, labels) if heights else ()):
            # each diamond named where nothing else is written, a thin arrow pointing at it; the start's name runs
            # to the right of the first step, the end's to the left of the last
            at_end = h["step"] == last and last > 0
            fig.add_annotation(text=label, x=h["step"], y=h["accuracy"], ax=h["step"], ay=heights[i % 2],
                               xref="x2", yref="y2", axref="x2", ayref="y2", showarrow=True, arrowhead=0,
                               arrowwidth=1, arrowcolor=PALETTE[1], standoff=6, xanchor="right" if at_end else "left",
                               font={"size": 11, "color": PALETTE[1]})
    if k:
        fig.add_hline(y=k, line_dash="dot", line_color="#444", row=3, col=1,
                      annotation_text=f"budget k = {k:,}", annotation_position="bottom right")
        if any((p.get("region_size") or 0) > k for p in steps):
            fig.add_annotation(text="above k is expected: the saved region<br>is cut to the top k of ℓ",
                               xref="x3 domain", yref="y3 domain", x=0.01, y=0.98, xanchor="left", yanchor="top",
                               showarrow=False, align="left", font={"size": 10, "color": "#666"})
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=2, col=1)
    fig.update_yaxes(tickformat=",", row=3, col=1)
    fig.update_xaxes(tick0=1, dtick=max(1, len(x) // 10))
    fig.update_xaxes(title_text="mask step", row=3, col=1)
    if len(title) > 50 and " · " in title:  # a job's long title on two lines, so a phone-wide plot shows all of it
        head, _, tail = title.rpartition(" · ")
        title = f"{head}<br>{tail}" if len(head) <= 60 else title.replace(" · ", "<br>", 1)
    return _layout(fig, title, height=600).update_layout(
        showlegend=True, legend={"orientation": "h", "yanchor": "top", "y": -0.1, "x": 0, "font": {"size": 11}},
        margin={"b": 110, "t": 76})


def finetune_progress(progress: list[dict], title: str = "Fine-tuning") -> go.Figure:
    """Training loss and running accuracy per optimizer step."""
    steps = [p for p in progress if "step" in p and "loss" in p]
    if not steps:
        return empty_figure("Waiting for the first training step… (model and data load first)")
    x = [p["step"] for p in steps]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("Training loss (cross-entropy, per batch)", "Running training accuracy (this epoch)"))
    fig.add_trace(go.Scatter(x=x, y=[p["loss"] for p in steps], mode="lines", name="loss",
                             customdata=[[p.get("epoch")] for p in steps],
                             hovertemplate="step %{x} (epoch %{customdata[0]})<br>loss %{y:.4f}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=[p["accuracy"] for p in steps], mode="lines", name="accuracy", line={"color": PALETTE[2]},
                             hovertemplate="step %{x}<br>accuracy %{y:.1%}<extra></extra>"), row=2, col=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="optimizer step", row=2, col=1)
    return _layout(fig, title, height=460).update_layout(showlegend=False)


# -- calibration ---------------------------------------------------------------------------------
def reliability_diagram(reliability: dict[str, list[dict]], task: str = "") -> go.Figure:
    """Accuracy against confidence per bin, one line per model; the diagonal is perfect calibration."""
    if not reliability:
        return empty_figure("Run a comparison to see the reliability diagram.")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration",
                             line={"dash": "dash", "color": "#999"}, hoverinfo="skip"))
    for i, (label, bins) in enumerate(reliability.items()):
        used = [b for b in bins if b.get("count")]
        fig.add_trace(go.Scatter(
            x=[b["confidence"] for b in used], y=[b["accuracy"] for b in used], mode="lines+markers", name=label,
            line={"color": _colour(label, i)},
            customdata=[[b["lo"], b["hi"], b["count"], b["gap"]] for b in used],
            hovertemplate=(f"<b>{label}</b><br>bin (%{{customdata[0]:.1f}}, %{{customdata[1]:.1f}}]"
                           "<br>mean confidence %{x:.3f}<br>accuracy %{y:.3f}<br>examples %{customdata[2]}"
                           "<br>confidence − accuracy %{customdata[3]:+.3f}<extra></extra>"),
        ))
    fig.update_xaxes(title_text="mean confidence in bin (max probability)", range=[0, 1])
    fig.update_yaxes(title_text="accuracy in bin", range=[0, 1.02])
    where = f" on {task} (test)" if task else ""
    return _layout(fig, f"Reliability diagram{where}: 10 equal-width confidence bins", height=470).update_layout(margin={"b": 130})


def reliability_side_by_side(panels: list[tuple[str, dict[str, list[dict]]]]) -> go.Figure:
    """One reliability diagram per setting (title, {model: bins}), side by side on shared axes."""
    panels = [(title, rel) for title, rel in panels if rel]
    if not panels:
        return empty_figure("No reliability data.")
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _ in panels], shared_yaxes=True)
    for c, (title, reliability) in enumerate(panels, 1):
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration", showlegend=c == 1,
                                 line={"dash": "dash", "color": "#999"}, hoverinfo="skip"), row=1, col=c)
        for i, (label, bins) in enumerate(reliability.items()):
            used = [b for b in bins if b.get("count")]
            fig.add_trace(go.Scatter(
                x=[b["confidence"] for b in used], y=[b["accuracy"] for b in used], mode="lines+markers",
                name=label, legendgroup=label, showlegend=c == 1, line={"color": _colour(label, i)},
                customdata=[[b["count"], b["gap"]] for b in used],
                hovertemplate=(f"<b>{label}</b>, {title}<br>mean confidence %{{x:.3f}}<br>accuracy %{{y:.3f}}"
                               "<br>examples %{customdata[0]}<br>confidence − accuracy %{customdata[1]:+.3f}<extra></extra>"),
            ), row=1, col=c)
        fig.update_xaxes(title_text="mean confidence in bin", range=[0, 1], row=1, col=c)
    fig.update_yaxes(title_text="accuracy in bin", range=[0, 1.02], row=1, col=1)
    return _layout(fig, "Reliability diagrams: fine-tuned model and graft in each head setting", height=470)


def confidence_histogram(histogram: dict[str, list[dict]], task: str = "") -> go.Figure:
    """Share of test examples per confidence bin, one bar group per model."""
    if not histogram:
        return empty_figure("Run a comparison to see the confidence histogram.")
    fig = go.Figure()
    for i, (label, bins) in enumerate(histogram.items()):
        fig.add_trace(go.Bar(
            x=[(b["lo"] + b["hi"]) / 2 for b in bins], y=[b["fraction"] for b in bins], name=label,
            marker_color=_colour(label, i), width=0.1 / max(len(histogram), 1) * 0.9,
            customdata=[[b["lo"], b["hi"], b["count"]] for b in bins],
            hovertemplate=(f"<b>{label}</b><br>confidence (%{{customdata[0]:.1f}}, %{{customdata[1]:.1f}}]"
                           "<br>%{y:.1%} of examples (%{customdata[2]})<extra></extra>"),
        ))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="confidence (max probability)", range=[0, 1], dtick=0.1)
    fig.update_yaxes(title_text="share of test examples", tickformat=".0%")
    where = f" on {task} (test)" if task else ""
    return _layout(fig, f"Confidence histogram{where}", height=470).update_layout(margin={"b": 130})


SWEEP_DASHES = ("solid", "dash", "dot", "dashdot")
SWEEP_SYMBOLS = ("circle", "square", "diamond", "triangle-up")


def sweep_figure(rows: list[dict], task: str = "") -> go.Figure:
    """Test accuracy against region budget (log x) per method, with fine-tuned accuracy for reference; bars are the
    95 % Wilson interval of one run, or mean ± std over seeds where the rows are replicates (``accuracy_seeds``)."""
    if not rows:
        return empty_figure("Run a sparsity sweep to see accuracy against budget.")
    fig = go.Figure()
    methods = list(dict.fromkeys(r["method"] for r in rows))
    seeds = max((len(r.get("accuracy_seeds") or ()) for r in rows), default=0)
    for i, name in enumerate(methods):
        pts = sorted((r for r in rows if r["method"] == name), key=lambda r: r["sparsity"])
        cis = [r.get("accuracy_ci") for r in pts]
        if seeds:  # replicates: the paper's mean (std) over seeds
            error = {"type": "data", "array": [r.get("accuracy_std") or 0.0 for r in pts], "thickness": 1, "width": 4}
        else:
            error = None if not all(cis) else {"type": "data", "symmetric": False, "thickness": 1, "width": 4,
                                               "array": [ci[1] - r["accuracy"] for ci, r in zip(cis, pts)],
                                               "arrayminus": [r["accuracy"] - ci[0] for ci, r in zip(cis, pts)]}
        fig.add_trace(go.Scatter(  # each method its own dash and symbol: methods that agree stay visible, one over another
            x=[r["sparsity"] for r in pts], y=[r["accuracy"] for r in pts], mode="lines+markers", name=name,
            line={"color": PALETTE[i % len(PALETTE)], "dash": SWEEP_DASHES[i % len(SWEEP_DASHES)]},
            marker={"symbol": SWEEP_SYMBOLS[i % len(SWEEP_SYMBOLS)], "size": 11 - 2 * (i % 3)}, error_y=error,
            customdata=[[r["k"], r.get("retained"), r.get("ece")] for r in pts],
            hovertemplate=(f"<b>{name}</b><br>sparsity %{{x:.0e}} (k = %{{customdata[0]:,}})<br>accuracy %{{y:.1%}}"
                           "<br>retained %{customdata[1]:.1%} of FT accuracy<br>ECE %{customdata[2]:.3f}<extra></extra>"),
        ))
    ft = rows[0].get("ft_accuracy")
    if ft is not None:
        fig.add_hline(y=ft, line_dash="dash", line_color="#1f77b4",
                      annotation_text=f"fine-tuned model: {ft:.1%}", annotation_position="top left")
    budgets = sorted({r["sparsity"] for r in rows})
    fig.update_xaxes(type="log", title_text="region budget (fraction of graftable parameters, log scale)",
                     tickvals=budgets, ticktext=[f"{b:.0e}" for b in budgets])
    fig.update_yaxes(title_text="test accuracy of the graft", tickformat=".0%", range=[0, 1.02])
    where = f" on {task}" if task else ""
    bars = f"mean ± std over {seeds} {rows[0].get('over', 'seeds')}" if seeds else "95 % intervals"
    return _layout(fig, f"Sparsity sweep{where}: accuracy of θ_pre + γ⊙δ against budget ({bars})",
                   height=440).update_layout(margin={"b": 110})


# -- anatomy -------------------------------------------------------------------------------------
def compact_count(v: int) -> str:
    """A count in at most four characters (``987``, ``1.2k``, ``12k``, ``3.4M``): a heatmap cell holds it at a
    readable size even on a phone."""
    for size, unit in ((1_000_000, "M"), (1_000, "k")):
        if abs(v) >= size:
            scaled = v / size
            return f"{scaled:.1f}".rstrip("0").rstrip(".") + unit if abs(scaled) < 10 else f"{scaled:.0f}{unit}"
    return f"{v:,}"


def anatomy_heatmap(anat, mode: str = "counts", title: str = "") -> go.Figure:
    """Layers × module types; colour is the region count or its density, short numbers in the cells (they stay
    readable in a narrow window), exact numbers on hover. The title is short and the colour bar thin, so a
    phone-wide plot keeps both."""
    if not anat.layers:
        return empty_figure("This region has no graftable parameters to place.")
    cols = [MODULE_LABELS.get(m, m) for m in anat.modules]
    z = anat.density if mode == "density" else anat.counts
    custom = [[[anat.counts[i][j], anat.totals[i][j], anat.density[i][j]] for j in range(len(cols))]
              for i in range(len(anat.layers))]
    text = [[(f"{100 * v:.2g}%" if mode == "density" else compact_count(v)) if anat.totals[i][j] else "–"
             for j, v in enumerate(row)] for i, row in enumerate(z)]
    fig = go.Figure(go.Heatmap(
        z=z, x=cols, y=list(anat.layers), customdata=custom, text=text, texttemplate="%{text}",
        textfont={"size": 11}, colorscale="Blues",
        colorbar={"thickness": 10, "tickformat": ".1%" if mode == "density" else "~s", "nticks": 4},
        hovertemplate=("<b>%{y} · %{x}</b><br>in region: %{customdata[0]:,}<br>graftable in cell: %{customdata[1]:,}"
                       "<br>density: %{customdata[2]:.4%}<extra></extra>"),
        xgap=2, ygap=2,
    ))
    fig.update_yaxes(autorange="reversed", automargin=True)  # the tick labels name the layers
    fig.update_xaxes(title_text="module type", side="bottom", automargin=True)
    what = "density (share of the cell)" if mode == "density" else "region parameters per cell"
    return _layout(fig, title or f"Layer × module: {what}", height=140 + 42 * len(anat.layers)).update_layout(
        title={"font": {"size": 14}}, margin={"l": 10, "r": 10})


def module_bars(anat, title: str = "") -> go.Figure:
    """Region parameters per module type, with each type's density on hover."""
    if not anat.modules:
        return empty_figure("This region has no graftable parameters to place.")
    cols = [MODULE_LABELS.get(m, m) for m in anat.modules]
    counts = [anat.by_module[m] for m in anat.modules]
    totals = [sum(row[j] for row in anat.totals) for j in range(len(anat.modules))]
    fig = go.Figure(go.Bar(
        x=cols, y=counts, marker_color=PALETTE[0],
        customdata=[[t, (c / t if t else 0.0)] for c, t in zip(counts, totals)],
        hovertemplate="<b>%{x}</b><br>in region: %{y:,}<br>graftable: %{customdata[0]:,}<br>density: %{customdata[1]:.4%}<extra></extra>",
    ))
    fig.update_yaxes(title_text="region parameters", tickformat=",")
    fig.update_xaxes(title_text="module type (all layers)")
    return _layout(fig, title or "Region parameters per module type", height=360)


def ablation_bars(ablation: dict | None) -> go.Figure:
    """What each part of the region is worth: the accuracy the graft loses without each layer's and each module
    type's part of the region (back to θ_pre), in points, with the paired 95 % interval as whiskers."""
    if not ablation or not ablation.get("rows"):
        return empty_figure("Run the ablation to see what each part of the region is worth.")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=("per layer", "per module type"))
    for col, by in ((1, "layer"), (2, "module")):
        rows = [r for r in ablation["rows"] if r["by"] == by]
        drop = [100 * r["drop"] for r in rows]
        fig.add_trace(go.Bar(
            x=[r["label"] for r in rows], y=drop, name=f"per {by}", showlegend=False,
            marker_color=[PALETTE[1] if r["distinguishable"] else "#bbbbbb" for r in rows],
            error_y={"type": "data", "symmetric": False, "array": [100 * r["ci"][1] - d for r, d in zip(rows, drop)],
                     "arrayminus": [d - 100 * r["ci"][0] for r, d in zip(rows, drop)], "color": "#444"},
            customdata=[[r["parameters"], r["share"], r["accuracy"], 100 * r["ci"][0], 100 * r["ci"][1]] for r in rows],
            hovertemplate=("<b>without %{x}</b><br>%{customdata[0]:,} region parameters (%{customdata[1]:.1%})"
                           "<br>accuracy %{customdata[2]:.3f}<br>drop %{y:+.1f} pts [%{customdata[3]:+.1f}, "
                           "%{customdata[4]:+.1f}]<extra></extra>")), row=1, col=col)
    fig.update_yaxes(title_text="accuracy drop (pts)", row=1, col=1)
    fig.update_xaxes(tickangle=-30, row=1, col=2)  # module names are long
    fig.add_hline(y=0, line_color="#888", line_width=1)
    title = (f"What each part of the region is worth: accuracy lost without it ({ablation['n']:,} examples of "
             f"{ablation['task']}, whole graft {ablation['accuracy']:.3f})")
    return _layout(fig, title, height=420)


def part_stability_heatmap(stability: dict | None) -> go.Figure:
    """Per layer × module type: the share of a seed's region there that every seed found (the core)."""
    grid = (stability or {}).get("grid")
    if not grid or not grid["layers"]:
        return empty_figure("Pick other seeds of this region's localize run to see how stable each part is.")
    z = grid["core_share"]
    fig = go.Figure(go.Heatmap(
        z=z, x=grid["module_labels"], y=grid["layers"], zmin=0, zmax=1, colorscale="Greens",
        text=[["–" if v is None else f"{v:.0%}" for v in row] for row in z], texttemplate="%{text}",
        colorbar={"tickformat": ".0%", "title": {"text": "core / mean"}},
        hovertemplate="<b>%{y} · %{x}</b><br>found by every seed: %{z:.1%}<extra></extra>", xgap=2, ygap=2))
    fig.update_yaxes(autorange="reversed", title_text="transformer layer")
    fig.update_xaxes(title_text="module type")
    return _layout(fig, f"Stability across {stability['seeds']} seeds: share of a seed's region found by every seed",
                   height=140 + 42 * len(grid["layers"]))


def side_by_side(side: dict | None) -> go.Figure:
    """Runs next to each other: where each region lies (share per module type) and how much they overlap."""
    if not side:
        return empty_figure("Pick two or more regions to see them side by side: where each lies and their overlap.")
    names = side["names"]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.12,
                        subplot_titles=("Share of each region per module type", "Overlap |γi ∩ γj| / |γj|"))
    for i, name in enumerate(names):
        fig.add_trace(go.Bar(x=side["module_labels"], y=side["module_share"][name], name=name,
                             marker_color=PALETTE[i % len(PALETTE)], hovertext=side["settings"][name],
                             hovertemplate="<b>%{x}</b><br>%{y:.1%} of the region<br>%{hovertext}<extra>" + name + "</extra>"),
                      row=1, col=1)
    short = [f"#{i + 1}" for i in range(len(names))]
    fig.add_trace(go.Heatmap(z=side["overlap"], x=short, y=short, zmin=0, zmax=1, colorscale="Reds", showscale=False,
                             text=[[f"{v:.0%}" for v in row] for row in side["overlap"]], texttemplate="%{text}",
                             customdata=[[[names[i], names[j]] for j in range(len(names))] for i in range(len(names))],
                             hovertemplate="γi = %{customdata[0]}<br>γj = %{customdata[1]}<br>%{z:.1%}<extra></extra>"),
                  row=1, col=2)
    fig.update_yaxes(tickformat=".0%", row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_layout(barmode="group")
    title = "Runs side by side: " + ", ".join(f"{s} = {n}" for s, n in zip(short, names))
    return _layout(fig, title, height=420)


# -- composition ---------------------------------------------------------------------------------
def overlap_heatmap(matrix: dict, which: str = "overlap") -> go.Figure:
    """``compose.overlap_matrix`` as a heatmap: |γi ∩ γj| / |γj| (paper Fig. 8a) or IoU."""
    names = matrix.get("names") or []
    if not names:
        return empty_figure("Pick two or more regions to compare their overlap.")
    z = matrix["iou"] if which == "iou" else matrix["overlap"]
    inter = matrix["intersection_counts"]
    sizes = matrix["sizes"]
    custom = [[[inter[i][j], sizes[i], sizes[j]] for j in range(len(names))] for i in range(len(names))]
    fig = go.Figure(go.Heatmap(
        z=z, x=names, y=names, zmin=0, zmax=1, colorscale="Reds", customdata=custom,
        text=[[f"{v:.1%}" for v in row] for row in z], texttemplate="%{text}",
        colorbar={"tickformat": ".0%"},
        hovertemplate=("row γi = %{y}<br>column γj = %{x}<br>|γi ∩ γj| = %{customdata[0]:,}"
                       "<br>|γi| = %{customdata[1]:,}, |γj| = %{customdata[2]:,}<br>value %{z:.2%}<extra></extra>"),
        xgap=2, ygap=2,
    ))
    fig.update_yaxes(autorange="reversed", title_text="γi")
    fig.update_xaxes(title_text="γj")
    title = ("Intersection over union |γi ∩ γj| / |γi ∪ γj|" if which == "iou"
             else "Overlap |γi ∩ γj| / |γj|: share of column region j also in row region i")
    return _layout(fig, title, height=200 + 50 * len(names))


def stability_heatmap(stability: dict, names: list[str]) -> go.Figure:
    """The regions of several seeds: |γi ∩ γj| / |γj| per pair, against the overlap of random regions of the sizes."""
    z = stability["pairwise_overlap"]
    fig = go.Figure(go.Heatmap(
        z=z, x=names, y=names, zmin=0, zmax=1, colorscale="Reds", colorbar={"tickformat": ".0%"},
        text=[[f"{v:.1%}" for v in row] for row in z], texttemplate="%{text}", xgap=2, ygap=2,
        hovertemplate="%{y} ∩ %{x}: %{z:.1%} of %{x}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    title = (f"Overlap across seeds (mean {stability['mean_overlap']:.1%}; random regions: "
             f"{stability['chance_overlap']:.3%}); core {stability['core']:,}")
    return _layout(fig, title, height=200 + 50 * len(names))


def gain_heatmap(doc: dict) -> go.Figure:
    """Eq. 5 as a heatmap (paper Fig. 8b): the row region's share of the fine-tuning gain on the column task."""
    tasks = doc.get("tasks") or []
    if not tasks:
        return empty_figure("Run the multi-task experiment to see how much of each task's skill every region carries.")
    gain, scores = doc["relative_gain"], doc["scores"]
    custom = [[[scores[i][j], doc["p_zero"][j], doc["p_one"][j]] for j in range(len(tasks))] for i in range(len(tasks))]
    fig = go.Figure(go.Heatmap(
        z=[[g if g is not None else None for g in row] for row in gain], x=tasks, y=tasks, zmid=0, zmin=-1, zmax=1,
        colorscale="RdBu", customdata=custom,
        text=[["–" if g is None else f"{g:.2f}" for g in row] for row in gain], texttemplate="%{text}",
        hovertemplate=("region of %{y} on task %{x}<br>relative gain %{z:.3f}<br>accuracy %{customdata[0]:.3f}"
                       "<br>P₀ (body + head) %{customdata[1]:.3f}, P₁ (multi-task) %{customdata[2]:.3f}<extra></extra>"),
        xgap=2, ygap=2,
    ))
    fig.update_yaxes(autorange="reversed", title_text="region γi of task")
    fig.update_xaxes(title_text="evaluated on task tj")
    return _layout(fig, "Relative gain (P_γi,tj − P₀,tj) / (P₁,tj − P₀,tj), Eq. 5", height=200 + 50 * len(tasks))


def wise_curves(rows: list[dict]) -> go.Figure:
    """Accuracy along α for WiSE-FT and WiSE-graft, one colour per task (paper Fig. 7)."""
    if not rows:
        return empty_figure("Run WiSE to see accuracy along θ_pre + α·δ and θ_pre + α·γ⊙δ.")
    fig = go.Figure()
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    for c, task in enumerate(tasks):
        for curve, dash in (("WiSE-FT", "dot"), ("WiSE-graft", "solid")):
            pts = sorted((r["alpha"], r["accuracy"], r["ece"], r["distribution"]) for r in rows
                         if r["task"] == task and r["curve"] == curve)
            if not pts:
                continue
            dist = "in distribution" if pts[0][3] == "in" else "OOD"
            fig.add_trace(go.Scatter(
                x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=f"{curve} · {task} ({dist})",
                line={"color": PALETTE[c % len(PALETTE)], "dash": dash}, customdata=[[p[2]] for p in pts],
                hovertemplate=f"{curve} on {task}<br>α %{{x:.2f}}<br>accuracy %{{y:.3f}}<br>ECE %{{customdata[0]:.3f}}<extra></extra>"))
    fig.update_xaxes(title_text="α", range=[-0.02, 1.02])
    fig.update_yaxes(title_text="test accuracy", tickformat=".0%")
    return _layout(fig, "WiSE: θ_pre + α·δ (dotted) and θ_pre + α·γ⊙δ (solid)", height=420)


def continual_curves(doc: dict) -> go.Figure:
    """Accuracy on each task after each stage, forget-free (solid) against sequential fine-tuning (dotted)."""
    tasks = doc.get("tasks") or []
    if not tasks:
        return empty_figure("Run continual learning to see what each stage does to the earlier tasks.")
    fig = go.Figure()
    stages = [f"after {t}" for t in tasks]
    for c, task in enumerate(tasks):
        for key, label, dash in (("forget_free", "forget-free", "solid"), ("sequential", "sequential", "dot")):
            ys = [row[c] for row in doc[key]]
            fig.add_trace(go.Scatter(
                x=stages, y=ys, mode="lines+markers", name=f"{task} · {label}",
                line={"color": PALETTE[c % len(PALETTE)], "dash": dash},
                hovertemplate=f"{task}, {label}<br>%{{x}}<br>accuracy %{{y:.3f}}<extra></extra>"))
    fig.update_yaxes(title_text="test accuracy", tickformat=".0%")
    fig.update_xaxes(title_text="stage of the task sequence")
    return _layout(fig, "Forgetting: forget-free regions (solid) against sequential fine-tuning (dotted)", height=420)


# -- the regions table: accuracy against region size ------------------------------------------------
def region_frontiers(rows: list[dict]) -> go.Figure:
    """Each scored region's latest accuracy against its size (share of the graftable parameters, log x), one line per
    (fine-tuned model, task, method) through its regions from the smallest to the largest; the fine-tuned model's
    accuracy on each task, where the evaluation measured it, as a dotted reference. ``rows``: regions.listing_row."""
    points = [r for r in rows if r.get("accuracy") is not None and (r.get("share_of_graftable") or 0) > 0]
    if not points:
        return empty_figure("No region here has been evaluated yet: score one on Compare (or with graftui evaluate) "
                            "and it appears here.")
    groups: dict[tuple, list[dict]] = {}
    for r in points:
        groups.setdefault((r.get("finetuned") or "?", r.get("scored_task") or r.get("task") or "?",
                           r.get("method") or "?"), []).append(r)
    fig = go.Figure()
    for i, ((ft, task, method), members) in enumerate(groups.items()):
        members = sorted(members, key=lambda r: r["share_of_graftable"])
        words = [[r["id"], f"{r['k']:,}" if isinstance(r.get("k"), int) else "?",
                  "–" if r.get("ece") is None else f"{r['ece']:.3f}",
                  "–" if r.get("share_of_ft") is None else f"{r['share_of_ft']:.0%}", str(r.get("n") or "?")]
                 for r in members]
        fig.add_trace(go.Scatter(
            x=[r["share_of_graftable"] for r in members], y=[r["accuracy"] for r in members], mode="lines+markers",
            name=f"{short_ref(ft)} · {short_ref(task)} · {method}", customdata=words,
            line={"color": PALETTE[i % len(PALETTE)], "dash": SWEEP_DASHES[i % len(SWEEP_DASHES)]},
            marker={"symbol": SWEEP_SYMBOLS[i % len(SWEEP_SYMBOLS)], "size": 10},
            hovertemplate=("<b>%{customdata[0]}</b><br>k = %{customdata[1]} (%{x:.3%} of graftable)<br>accuracy "
                           "%{y:.1%} on " + short_ref(task) + " (n = %{customdata[4]})<br>ECE %{customdata[2]}<br>"
                           "share of FT gain %{customdata[3]}<extra></extra>")))
    references = {}
    for r in points:
        if r.get("ft_accuracy") is not None:
            references[(r.get("finetuned") or "?", r.get("scored_task") or r.get("task") or "?")] = r["ft_accuracy"]
    for (ft, task), accuracy in references.items():
        fig.add_hline(y=accuracy, line_dash="dot", line_color=MODEL_COLOURS[FT_LABEL],
                      annotation_text=f"fine-tuned {short_ref(ft)} on {short_ref(task)}: {accuracy:.1%}",
                      annotation_position="top left")
    sizes = sorted({r["share_of_graftable"] for r in points})
    ticks = sizes if len(sizes) <= 6 else [10.0 ** e for e in range(-8, 1) if sizes[0] / 10 < 10.0 ** e < sizes[-1] * 10]
    fig.update_xaxes(type="log", title_text="region size (share of graftable parameters, log scale)", tickvals=ticks,
                     ticktext=[f"{100 * t:.2g}%" for t in ticks])
    fig.update_yaxes(title_text="latest test accuracy of the graft", tickformat=".0%", range=[0, 1.02])
    return _layout(fig, "Saved regions: accuracy against region size, one line per fine-tuned model · task · method",
                   height=460).update_layout(margin={"b": 120})


def probe_map(doc: dict) -> go.Figure:
    """predict --by cell as two layer × module heatmaps side by side: Δp of the fine-tuned model's answer with each
    part alone grafted onto the pre-trained model, and with it alone knocked out of FT; "×" where the part changes
    the answer of the model it is measured against, the exact Δp, p and the part's parameters in the region on hover. One heatmap per sentence
    would crowd the page: the first sentence's is drawn, and the title says so."""
    answers, parts = doc.get("answers") or [], doc.get("parts") or []
    if not answers or not parts:
        return empty_figure("Probe a region --by cell (layer × module) to see where its parts move the answer.")
    first = answers[0]
    mine = [p for p in parts if p["text"] == first["text"]]
    layers = list(dict.fromkeys(p["layer"] for p in mine))
    modules = [m for m in MODULE_LABELS if m in {p["module"] for p in mine}]
    at = {(p["layer"], p["module"]): p for p in mine}
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("graft one part onto θ_pre: Δp vs pre-trained",
                                        "knock one part out of θ_ft: Δp vs fine-tuned"))
    top = max([abs(p[f"{w}_delta"]) for p in mine for w in ("graft", "knockout")] + [1e-9])
    for col, which in enumerate(("graft", "knockout"), start=1):
        cell = lambda l, m, key: at[(l, m)][key] if (l, m) in at else None  # noqa: E731
        fig.add_trace(go.Heatmap(
            z=[[cell(l, m, f"{which}_delta") for m in modules] for l in layers],
            x=[MODULE_LABELS[m] for m in modules], y=layers, zmin=-top, zmax=top, zmid=0, colorscale="RdBu",
            text=[["×" if cell(l, m, f"{which}_flips") else "" for m in modules] for l in layers],
            texttemplate="%{text}", textfont={"size": 16},
            customdata=[[[at[(l, m)]["part"], at[(l, m)][f"{which}_p"], at[(l, m)]["k"],
                          at[(l, m)][f"{which}_answer"]] if (l, m) in at else ["", None, 0, ""] for m in modules]
                        for l in layers],
            hovertemplate=("<b>%{customdata[0]}</b><br>Δp: %{z:+.4f}<br>p: %{customdata[1]:.4f}<br>answer: "
                           "%{customdata[3]}<br>parameters in region: %{customdata[2]:,}<extra>"
                           + which + "</extra>"),
            showscale=col == 2, colorbar={"thickness": 10, "title": {"text": "Δp"}}, xgap=2, ygap=2,
            name=which), row=1, col=col)
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_xaxes(title_text="module type", automargin=True)
    n = len(answers)
    which_text = "the sentence" if n == 1 else f"sentence 1 of {n} (the others' maps are in the text and JSON)"
    return _layout(fig, f"Δp of the fine-tuned answer '{first['answer']}' on {which_text}; × the part changes the answer",
                   height=180 + 36 * len(layers))


def runs_scatter(points: list[dict], x_title: str, y_title: str, by: str, x_share: bool = False,
                 y_share: bool = False, x_log: bool = False, left_out: int = 0) -> go.Figure:
    """One point per run at (``x``, ``y``), one colour and legend entry per value of its ``group`` (named ``by``), the
    run's id on hover. ``points``: dicts with ``id``, ``x``, ``y``, ``group``; ``left_out``: the runs shown that have
    no value on one of the axes, said in the title. A log x axis keeps only the points above zero."""
    drawn = [p for p in points if _finite(p.get("x")) and _finite(p.get("y")) and (not x_log or p["x"] > 0)]
    left_out += len(points) - len(drawn)
    if not drawn:
        why = (f"None of the {left_out} run(s) shown has both a {x_title} and a {y_title}" if left_out else
               "No run is shown: save a region, or clear the filter")
        return empty_figure(f"{why}: nothing to draw.")
    groups: dict[str, list[dict]] = {}
    for p in drawn:
        groups.setdefault(str(p.get("group") or "(none)"), []).append(p)
    fig = go.Figure()
    x_fmt, y_fmt = (".3%" if x_share else ",.4g"), (".1%" if y_share else ",.4g")
    for i, (group, members) in enumerate(groups.items()):
        fig.add_trace(go.Scatter(
            x=[p["x"] for p in members], y=[p["y"] for p in members], mode="markers", name=f"{by}: {group}",
            customdata=[[p["id"], group] for p in members],
            marker={"color": PALETTE[i % len(PALETTE)], "symbol": SWEEP_SYMBOLS[i % len(SWEEP_SYMBOLS)], "size": 11},
            hovertemplate=(f"<b>%{{customdata[0]}}</b><br>{by}: %{{customdata[1]}}<br>{x_title} %{{x:{x_fmt}}}<br>"
                           f"{y_title} %{{y:{y_fmt}}}<extra></extra>")))
    fig.update_xaxes(title_text=x_title + (" (log scale)" if x_log else ""), type="log" if x_log else "linear",
                     tickformat=".2%" if x_share else None)
    fig.update_yaxes(title_text=y_title, tickformat=".0%" if y_share else None)
    more = f" · {left_out} run(s) without both not drawn" if left_out else ""
    return _layout(fig, f"{y_title} against {x_title}, {len(drawn)} run(s){more}", height=420)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
