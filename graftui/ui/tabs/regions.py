"""Regions: download a saved region or skill patch, export it grafted onto its base, delete it, or upload one
and add it to this session's regions once it fits the current pair."""

from __future__ import annotations

import gradio as gr

from ... import figures
from ...paths import short_ref
from ...regions import LISTING_COLUMNS
from .. import actions, store
from ..wiring import TABLE_HEIGHT
from . import push

INTRO = (
    "Every finished localization is saved as a **skill patch** (region indices + fine-tuned values + head). "
    "Download one, upload one to inspect and use it, or export base + patch as a normal checkpoint."
)


DELETE = "Delete this region"  # the button; a first press arms it, a second deletes

def render_export(job) -> list:
    if job is None or not job.result:
        return [None]
    return [job.result.get("zip")]


# -- the regions table and their frontiers ------------------------------------------------------------
SORT_LABELS = {"id": "id", "base": "base model", "finetuned": "fine-tuned model", "task": "task", "method": "method",
               "k": "k (params)", "share_of_graftable": "share of graftable", "steps": "steps", "seed": "seed",
               "created": "created", "accuracy": "accuracy", "ece": "ECE", "share_of_ft": "share of FT gain"}
SORT_CHOICES = [("newest first", "")] + [(SORT_LABELS.get(c, c), c) for c in LISTING_COLUMNS]
FRONTIER_NOTE = (
    "Each point is one saved region: its size (share of the graftable parameters, log scale) against the accuracy of "
    "its graft at its latest evaluation in distribution (Compare, or `graftui evaluate`); a line joins the regions of "
    "one fine-tuned model, task and method, and the dotted line is the fine-tuned model's accuracy in that evaluation."
)


def render_table(words, sort, descending, last=None) -> tuple | None:
    """The regions table and the frontier plot for the filter and sort picked, and what they show (the signature the
    poll compares); None when that is ``last``, what is shown already."""
    rows = actions.regions_listing()
    sig = (tuple((r["id"], r["digest"], r["scored"], r["created"]) for r in rows), words or "", sort or "", bool(descending))
    if sig == last:
        return None
    shown = actions.regions_shown(rows, words, sort, descending)
    return actions.regions_table(shown), figures.region_frontiers(shown), sig


def build_table(page) -> None:
    """The saved regions as a table to filter and sort, and their accuracies against their sizes in one plot; both
    follow every region saved or deleted and every evaluation that ends."""
    gr.Markdown("### All regions and their latest scores\nEvery saved region with its pair, task, method and "
                "settings, and the accuracy, ECE and share of the fine-tuning gain of its graft at its latest evaluation "
                "(blank until one is scored on Compare), on the task it was scored on: its own unless another was "
                "asked for.")
    table, plot, sig = render_table("", "", False)
    with gr.Row():
        words = gr.Textbox("", label="Filter", placeholder="words every row shown holds, e.g. movies learned",
                           elem_id="regions-filter")
        sort = gr.Dropdown(SORT_CHOICES, value="", label="Sort by", elem_id="regions-sort")
        descending = gr.Checkbox(False, label="Largest, latest or last first", elem_id="regions-descending")
    frame = gr.Dataframe(table, interactive=False, wrap=True, max_height=TABLE_HEIGHT, label="Saved regions",
                         elem_id="regions-table")
    figure = gr.Plot(plot, label="Accuracy against region size", elem_id="regions-frontiers")
    gr.Markdown(FRONTIER_NOTE, elem_id="regions-frontiers-note")
    shown = page.state(sig)

    def refresh(text, by, desc, last):
        return render_table(text, by, desc, last) or (gr.skip(), gr.skip(), last)

    page.poll.add(refresh, [words, sort, descending, shown], [frame, figure, shown], tab="regions")
    for event in (words.submit, sort.change, descending.change):
        page.on(event, page.quiet(lambda *a: (*refresh(*a), gr.skip())), [words, sort, descending, shown],
                [frame, figure, shown, page.status], show_progress="hidden")


def build(page) -> gr.Tab:
    status = page.status
    with gr.Tab("Regions", elem_id="tab-regions") as tab:
        gr.Markdown(INTRO)
        build_table(page)
        gr.Markdown("### One region")
        with gr.Row():
            reg_sel = gr.Dropdown(store.region_choices(), allow_custom_value=True, label="Saved region",
                                  elem_id="regions-select")
        with gr.Row():
            reg_dl = gr.DownloadButton("Download skill patch (.safetensors)", value=None, elem_id="region-download")
            reg_dl_idx = gr.DownloadButton("Download region indices only (.safetensors)", value=None,
                                           elem_id="region-download-indices")
            reg_export = gr.Button("Export grafted checkpoint (.zip)", elem_id="region-export")
            reg_delete = gr.Button(DELETE, variant="stop", elem_id="region-delete")
        reg_meta = gr.Dataframe(actions.region_meta_table(None), interactive=False, label="Metadata of the selected region",
                                elem_id="regions-meta")
        reg_export_status = gr.Markdown("", elem_id="region-export-status")
        reg_export_file = gr.File(label="Grafted checkpoint (Hugging Face folder, zipped)", interactive=False,
                                  elem_id="region-export-file")
        gr.Markdown("### Upload a region or skill patch")
        reg_up = gr.File(label="Region file (.safetensors, written by graftui)", file_types=[".safetensors"],
                         elem_id="region-upload")
        reg_up_md = gr.Markdown("", elem_id="region-upload-info")
        reg_up_meta = gr.Dataframe(actions.region_meta_table(None), interactive=False, label="Metadata of the uploaded file",
                                   elem_id="region-upload-meta")
        reg_apply = gr.Button("Check against the current pair and add to my regions", elem_id="region-apply")

    page.region_pickers.append((reg_sel, False))

    @page.guard(region=reg_sel)
    def on_region_select(region_id):
        if not region_id:
            return gr.update(value=None), gr.update(value=None), actions.region_meta_table(None), gr.skip()
        record = store.load_region(region_id)
        path, indices = actions.region_file(region_id), actions.region_only_file(region_id)
        return gr.update(value=str(path)), gr.update(value=str(indices)), actions.region_meta_table(record), gr.skip()

    for event in (reg_sel.change, tab.select):
        page.on(event, on_region_select, [reg_sel], [reg_dl, reg_dl_idx, reg_meta, status])

    armed = page.state(None)  # the region a first press of Delete named; a second press deletes it

    @page.guard(region=reg_sel)
    def on_region_delete(region_id, named):
        path = store.region_path(region_id)  # an id outside this workspace is refused before anything else
        if named != region_id:
            return (gr.skip(), f"Press **{DELETE}** again to delete **{path.stem}** for good: it cannot be undone.",
                    region_id, gr.update(value=f"Confirm: delete {path.stem}"))
        store.delete_region(region_id)
        return gr.update(value=None), f"Deleted region **{path.stem}**.", None, gr.update(value=DELETE)

    page.on(reg_delete.click, on_region_delete, [reg_sel, armed], [reg_sel, status, armed, reg_delete])

    def disarm(region_id):  # another region picked: a press must name it first
        return None, gr.update(value=DELETE)

    page.on(reg_sel.change, disarm, [reg_sel], [armed, reg_delete], show_progress="hidden")

    @page.guard(beside=reg_export_status, region=reg_sel)
    def on_export(region_id):
        job = actions.submit_export(store.runner(), region_id=region_id)
        return actions.submitted_line(job), job.id, gr.skip()  # the panel writes the line (see ``submitted``)

    export_job = page.state("")  # the export this page started: its panel shows that one, not a picked one
    page.on(reg_export.click, on_export, [reg_sel], [status, export_job, reg_export_status])
    page.panel("regions", ("export",), None, reg_export_status, [reg_export_file], render_export, "",
               fixed_state=export_job)

    @page.guard(beside=reg_up_md, region=reg_up)
    def on_region_upload(file):
        if not file:
            return "", actions.region_meta_table(None), gr.skip()
        path, record = actions.read_region_upload(file)
        s = record.summary()
        md = (f"✓ **{path.name}** is a valid graftui {s['kind']}: k = {s['size']:,} of {s['graftable']:,} graftable "
              f"parameters ({s['fraction_of_graftable']:.4%}) in {s['tensors']} tensors. Press the button below to check "
              "it against the current pair and add it to your regions.")
        return md, actions.region_meta_table(record), f"✓ {path.name} is a valid region file."

    page.on(reg_up.upload, on_region_upload, [reg_up], [reg_up_md, reg_up_meta, status])

    @page.guard(beside=reg_up_md, region=reg_up)
    def on_region_apply(file, base, finetuned):
        if not file:
            raise ValueError("upload a region file first")
        saved = actions.adopt_region(file, base, finetuned)
        return (f"✓ Fits the current pair ({short_ref(base)} → {short_ref(finetuned)}); saved as **{saved.stem}** "
                "and listed in every region picker."), f"✓ Added region {saved.stem}."

    page.on(reg_apply.click, on_region_apply, [reg_up, page.base, page.finetuned], [reg_up_md, status])
    push.build(page, tab, reg_sel)  # Push to the Hub, for the selected region
    return tab
