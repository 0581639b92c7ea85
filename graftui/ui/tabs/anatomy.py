"""Anatomy: where a region sits, per transformer layer and module type; the tensors and neurons holding most of
it; what each part is worth (the ablation, a job); how stable each part is across the seeds of its run."""

from __future__ import annotations

import gradio as gr
import pandas as pd

from ... import figures
from ...formatting import pct
from ...paths import short_ref
from ...requests import AnatomyRequest
from .. import forms, store, tables
from ..wiring import TABLE_HEIGHT, job_picker, submitted

INTRO = (
    "Where in the network does a region sit? Counts per transformer layer and module type, "
    "and the density (share of each cell's parameters that the region uses)."
)
TOP_NOTE = (
    "The tensors and neurons holding most of the region. A neuron is one output unit of a weight matrix, i.e. the "
    "weights into that unit: a row of a Linear weight (out × in), a column of GPT-2's Conv1D weight; its fan-in is "
    "how many weights it has. Embedding tables, biases and norms hold no neurons here."
)
ABLATION_NOTE = (
    "Drop one layer's (or one module type's) part of the region, putting those parameters back to θ_pre, and score "
    "the rest of the graft on test examples of the region's own task (the sample **Compare** scores with this n). "
    "The drop is the whole graft's accuracy minus that, with a paired 95 % bootstrap interval on the same examples; "
    "a part matters only where the interval excludes 0 (a red bar; grey: not distinguishable from 0)."
)
STABILITY_NOTE = (
    "When the region is one seed of a replicate run (**Localize** with several seeds), its other seeds are offered "
    "here: per layer and module type, the share of a seed's region there that every seed found (the core), against "
    "what random regions of the same sizes would share by chance."
)
KINDS, LATEST = ("anatomy",), "latest ablation"
TENSOR_COLUMNS = ["tensor", "layer", "module", "in region", "share of region", "density (in region / tensor size)"]
NEURON_COLUMNS = ["tensor", "unit", "module", "in region", "fan-in", "density (in region / fan-in)", "share of region"]
ABLATION_COLUMNS = ["without", "in region", "share of region", "accuracy without it", "drop [95 % CI]", "reading"]
STABILITY_COLUMNS = ["part", "mean per seed", "core (every seed)", "core / mean", "chance", "× chance"]


def tensors_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([[t["tensor"], t["layer"], t["module"], f"{t['parameters']:,}", pct(t["share"]),
                          pct(t["density"])] for t in rows], columns=TENSOR_COLUMNS)


def neurons_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([[u["tensor"], f"{u['axis']} {u['unit']}", u["module"], f"{u['parameters']:,}",
                          f"{u['fan_in']:,}", pct(u["density"]), pct(u["share"])] for u in rows], columns=NEURON_COLUMNS)


def _reading(r: dict) -> str:
    if not r["parameters"]:
        return "holds none of the region"
    if not r["distinguishable"]:
        return "no distinguishable drop"
    return "the graft needs it" if r["drop"] > 0 else "the graft is better without it"


def ablation_table(ablation: dict | None) -> pd.DataFrame:
    rows = (ablation or {}).get("rows") or []
    return pd.DataFrame([[r["label"] if r["by"] == "layer" else f"{r['label']} (all layers)", f"{r['parameters']:,}", pct(r["share"]), f"{r['accuracy']:.3f}",
                          f"{100 * r['drop']:+.1f} pts [{100 * r['ci'][0]:+.1f}, {100 * r['ci'][1]:+.1f}]", _reading(r)]
                         for r in rows], columns=ABLATION_COLUMNS)


def stability_table(stability: dict | None) -> pd.DataFrame:
    parts = [*((stability or {}).get("by_module") or {}).values(), *((stability or {}).get("by_layer") or {}).values()]
    return pd.DataFrame([[v["label"], f"{v['mean']:,.1f}", f"{v['core']:,}", pct(v["core_share"]), pct(v["chance_share"]),
                          "–" if v["over_chance"] is None else f"{v['over_chance']:,.1f}×"] for v in parts],
                        columns=STABILITY_COLUMNS)


def anatomy_outputs(region_id: str, mode: str) -> list:
    result = forms.anatomy_of(region_id)
    record, anat = result.record, result.anatomy
    m = record.meta
    summary = (f"Region **{region_id}**: k = **{record.size:,}** of {record.graftable:,} graftable parameters "
               f"({record.size / max(record.graftable, 1):.4%}); method {m.method or '?'}, task {m.task or '?'}, "
               f"fine-tuned model {short_ref(m.finetuned or '?')}.")
    return [figures.anatomy_heatmap(anat, mode), figures.module_bars(anat), tables.weight_bias_table(anat), summary,
            tensors_table(result.tensors), neurons_table(result.neurons)]


def render_ablation(job) -> list:
    if job is None or not job.result:
        msg = "Run the ablation to see what each part of the region is worth." if job is None else \
            "The chart appears when the ablation is done."
        return [figures.empty_figure(msg), ablation_table(None)]
    ablation = job.result.get("ablation")
    return [figures.ablation_bars(ablation), ablation_table(ablation)]


def stability_outputs(region_id: str, seed_ids: list[str]) -> list:
    if not region_id or not seed_ids:
        return [figures.part_stability_heatmap(None), stability_table(None),
                "No other seed of this region's run is saved: localize with several seeds to see how stable each part "
                "is." if region_id else ""]
    st = forms.stability_of(region_id, seed_ids).as_dict()["stability"]
    over = f" ({st['over_chance']:,.0f}× chance)" if st.get("over_chance") else ""
    line = (f"Seeds {', '.join(map(str, st['seed_numbers']))}: mean overlap **{pct(st['mean_overlap'])}** against "
            f"{pct(st['chance_overlap'])} for random regions of these sizes{over}; **{st['core']:,}** parameters "
            "found by every seed.")
    return [figures.part_stability_heatmap(st), stability_table(st), line]


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
            ana_kinds = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=tables.WEIGHT_BIAS_COLUMNS),
                                     interactive=False, label="Weights vs biases", elem_id="anatomy-kinds")
        gr.Markdown("### Top tensors and neurons\n" + TOP_NOTE)
        ana_tensors = gr.Dataframe(pd.DataFrame(columns=TENSOR_COLUMNS), interactive=False, wrap=True,
                                   max_height=TABLE_HEIGHT, label="Tensors holding most of the region",
                                   elem_id="anatomy-tensors")
        ana_neurons = gr.Dataframe(pd.DataFrame(columns=NEURON_COLUMNS), interactive=False, wrap=True,
                                   max_height=TABLE_HEIGHT, label="Neurons holding most of the region",
                                   elem_id="anatomy-neurons")
        gr.Markdown("### What each part of the region is worth\n" + ABLATION_NOTE)
        with gr.Row():
            abl_n = gr.Number(AnatomyRequest.defaults()["n"], precision=0, label="Test examples",
                              elem_id="anatomy-ablate-n")
            abl_run = gr.Button("Run ablation", variant="primary", elem_id="anatomy-ablate-run", scale=0)
            abl_cancel = gr.Button("Cancel", variant="secondary", interactive=False, elem_id="anatomy-ablate-cancel",
                                         scale=0)
            abl_job = job_picker(LATEST, "anatomy-ablate")
        abl_status = gr.Markdown("", elem_id="anatomy-ablate-status")
        abl_plot = gr.Plot(figures.ablation_bars(None), elem_id="anatomy-ablation-plot")
        abl_table = gr.Dataframe(pd.DataFrame(columns=ABLATION_COLUMNS), interactive=False, wrap=True,
                                 max_height=TABLE_HEIGHT, label="The graft without each part (drop = whole − without)",
                                 elem_id="anatomy-ablation")
        gr.Markdown("### Stability across seeds\n" + STABILITY_NOTE)
        st_seeds = gr.Dropdown([], value=[], multiselect=True, label="Other seeds of this region's run",
                               elem_id="anatomy-seeds")
        st_md = gr.Markdown("", elem_id="anatomy-stability-summary")
        with gr.Row():
            st_heat = gr.Plot(figures.part_stability_heatmap(None), elem_id="anatomy-stability-heatmap")
            st_table = gr.Dataframe(pd.DataFrame(columns=STABILITY_COLUMNS), interactive=False, wrap=True,
                                    max_height=TABLE_HEIGHT, label="Per module type, then per layer",
                                    elem_id="anatomy-stability")

    page.region_pickers.append((ana_region, False))

    @page.guard(beside=ana_md, region=ana_region)
    def on_anatomy(region_id, mode):
        if not region_id:
            return (gr.skip(), gr.skip(), gr.skip(), "Pick a region (run **Localize** first if the list is empty).",
                    gr.skip(), gr.skip(), gr.skip())
        return (*anatomy_outputs(region_id, mode), gr.skip())

    outputs = [ana_heat, ana_bars, ana_kinds, ana_md, ana_tensors, ana_neurons, page.status]
    for event in (ana_region.change, ana_mode.change, tab.select):
        page.on(event, on_anatomy, [ana_region, ana_mode], outputs)

    @page.guard(beside=st_md, region=ana_region, replicate=st_seeds)
    def on_region(region_id):
        seeds = forms.seeds_of_run(region_id) if region_id else []
        return (gr.update(choices=seeds, value=seeds), *stability_outputs(region_id, seeds), gr.skip())

    for event in (ana_region.change, tab.select):
        page.on(event, on_region, [ana_region], [st_seeds, st_heat, st_table, st_md, page.status])

    @page.guard(beside=st_md, region=ana_region, replicate=st_seeds)
    def on_seeds(region_id, seed_ids):
        return (*stability_outputs(region_id, seed_ids or []), gr.skip())

    page.on(st_seeds.input, on_seeds, [ana_region, st_seeds], [st_heat, st_table, st_md, page.status])

    @page.guard(beside=abl_status, region=ana_region, n=abl_n)
    def on_ablate(region_id, n):
        return submitted(forms.submit_ablation(store.runner(), region_id=region_id, n=n), KINDS, LATEST)

    page.on(abl_run.click, on_ablate, [ana_region, abl_n], [page.status, abl_job, abl_status])
    page.cancel(abl_cancel, abl_job, KINDS)
    page.panel("anatomy", KINDS, abl_job, abl_status, [abl_plot, abl_table], render_ablation, LATEST)
    return tab
