"""Anatomy: where a region sits, per transformer layer and module type."""

from __future__ import annotations

import gradio as gr
import pandas as pd

from ... import figures
from ...paths import short_ref
from .. import actions, store
from ..wiring import TABLE_HEIGHT

INTRO = (
    "Where in the network does a region sit? Counts per transformer layer and module type, "
    "and the density (share of each cell's parameters that the region uses)."
)


def anatomy_outputs(region_id: str, mode: str) -> list:
    result = actions.anatomy_of(region_id)
    record, anat = result.record, result.anatomy
    m = record.meta
    summary = (f"Region **{region_id}**: k = **{record.size:,}** of {record.graftable:,} graftable parameters "
               f"({record.size / max(record.graftable, 1):.4%}); method {m.method or '?'}, task {m.task or '?'}, "
               f"fine-tuned model {short_ref(m.finetuned or '?')}.")
    return [figures.anatomy_heatmap(anat, mode), figures.module_bars(anat), actions.weight_bias_table(anat), summary]


def build(page) -> gr.Tab:
    with gr.Tab("Anatomy", elem_id="tab-anatomy") as tab:
        gr.Markdown(INTRO)
        with gr.Row():
            ana_region = gr.Dropdown(store.region_choices(), allow_custom_value=True, label="Region", elem_id="anatomy-region")
            ana_mode = gr.Radio([("counts", "counts"), ("density", "density")], value="counts", label="Colour by",
                                elem_id="anatomy-mode")
        ana_md = gr.Markdown("", elem_id="anatomy-summary")
        ana_heat = gr.Plot(figures.empty_figure("Pick a region."), elem_id="anatomy-heatmap")
        with gr.Row():
            ana_bars = gr.Plot(figures.empty_figure("Pick a region."), elem_id="anatomy-bars")
            ana_kinds = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=actions.WEIGHT_BIAS_COLUMNS),
                                     interactive=False, label="Weights vs biases", elem_id="anatomy-kinds")

    page.region_pickers.append((ana_region, False))

    @page.guard(beside=ana_md, region=ana_region)
    def on_anatomy(region_id, mode):
        if not region_id:
            return gr.skip(), gr.skip(), gr.skip(), "Pick a region (run **Localize** first if the list is empty).", gr.skip()
        return (*anatomy_outputs(region_id, mode), gr.skip())

    for event in (ana_region.change, ana_mode.change, tab.select):
        page.on(event, on_anatomy, [ana_region, ana_mode], [ana_heat, ana_bars, ana_kinds, ana_md, page.status])
    return tab
