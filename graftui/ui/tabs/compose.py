"""Compose: how much regions of different tasks overlap, and their union grafted and scored on every task."""

from __future__ import annotations

import gradio as gr
import pandas as pd

from ... import figures
from ...requests import ComposeRequest
from .. import forms, store, tables
from ..wiring import TABLE_HEIGHT, job_controls, request_radio, submitted

INTRO = (
    "Regions of different tasks on one base barely overlap, so their union carries several skills at once. "
    "See the overlap, build the union graft and score it on every task involved."
)
RESOLVE = {"mean": "mean of movements", "first": "first region wins", "last": "last region wins"}
KINDS, LATEST = ("compose",), "latest composition"


def render_compose(job) -> list:
    if job is None or not job.result:
        return ["" if job is None else "Results appear when the job is done.", pd.DataFrame(columns=tables.COMPOSE_COLUMNS)]
    return [tables.compose_report_text(job.result.get("report")), tables.compose_table(job.result)]


def build(page) -> gr.Tab:
    with gr.Tab("Compose", elem_id="tab-compose") as tab:
        gr.Markdown(INTRO)
        with gr.Row():
            cmp_sel = gr.Dropdown(store.region_choices(), allow_custom_value=True, multiselect=True,
                                  label="Regions to compose (one base model)", elem_id="compose-regions")
            cps_measure = gr.Radio([("|γi ∩ γj| / |γj|", "overlap"), ("IoU", "iou")], value="overlap",
                                   label="Overlap measure", elem_id="compose-measure")
        cps_heat = gr.Plot(figures.empty_figure("Pick two or more regions to compare their overlap."),
                           elem_id="compose-overlap")
        cps_pairs = gr.Dataframe(max_height=TABLE_HEIGHT, value=tables.overlap_summary(None), interactive=False,
                                 label="Shared parameters per pair", elem_id="compose-overlap-table")
        with gr.Row():
            cps_resolve = request_radio(ComposeRequest, "resolve", RESOLVE, label="Parameters claimed by several regions",
                                        elem_id="compose-resolve")
            cps_n = gr.Number(page.defaults["test_examples"], precision=0, label="Test examples per task",
                              elem_id="compose-n")
            cps_stitch = gr.Checkbox(False, label="Stitch: against each fine-tune, task arithmetic, TIES, DARE and "
                                     "consensus (their settings chosen on validation examples); always on for "
                                     "completion tasks",
                                     elem_id="compose-stitch")
        cps_run, cps_job, cps_status = job_controls("Build union and evaluate", "compose", LATEST)
        page.report("compose", cps_job, KINDS)
        cps_report = gr.Markdown("", elem_id="compose-report")
        cps_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=tables.COMPOSE_COLUMNS),
                                 interactive=False, label="Each task with its own head: region alone vs union graft vs "
                                 "bare body", elem_id="compose-table")

    page.region_pickers.append((cmp_sel, True))  # a union: several regions

    @page.guard(regions=cmp_sel, region=cmp_sel)
    def on_overlap(region_ids, measure):
        if not region_ids or len(region_ids) < 2:
            return figures.overlap_heatmap({"names": []}), tables.overlap_summary(None), gr.skip()
        matrix = forms.overlap_for(region_ids)
        return figures.overlap_heatmap(matrix, measure), tables.overlap_summary(matrix), gr.skip()

    for ev in (cmp_sel.change, cps_measure.change, tab.select):
        page.on(ev, on_overlap, [cmp_sel, cps_measure], [cps_heat, cps_pairs, page.status])

    @page.guard(beside=cps_status, regions=cmp_sel, region=cmp_sel, resolve=cps_resolve, n=cps_n, stitch=cps_stitch)
    def on_compose(region_ids, resolve, n, stitch):
        job = forms.submit_compose(store.runner(), region_ids=region_ids or [], resolve=resolve, n=n,
                                     stitch=bool(stitch))
        return submitted(job, KINDS, LATEST)

    page.on(cps_run.click, on_compose, [cmp_sel, cps_resolve, cps_n, cps_stitch], [page.status, cps_job, cps_status])
    page.panel("compose", KINDS, cps_job, cps_status, [cps_report, cps_table], render_compose, LATEST)
    return tab
