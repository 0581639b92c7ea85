"""Regions: every saved region in a table with its latest scores, and as a run (``ui.runs``: columns, groups, overlaid
mask-learning curves, the settings two runs differ in, tags and notes); download a saved region or skill patch,
export it grafted onto its base, delete it, or upload one and add it to this session's regions once it fits the
current pair."""

from __future__ import annotations

import time

import gradio as gr

from ... import figures
from ...paths import short_ref
from ...regions import LISTING_COLUMNS, MAX_NOTE_CHARS, MAX_TAG_CHARS, MAX_TAGS, group_runs
from .. import forms, jobwords, library, runs, store, tables
from ..wiring import TABLE_HEIGHT, in_session
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
    """The regions table and the frontier plot for the filter and sort picked, and what they show; None when that is
    ``last`` (``render_all`` without the runs)."""
    drawn = render_all(words, sort, descending, last)
    return None if drawn is None else (drawn[0], drawn[1], drawn[-1])


def render_all(words, sort, descending, last=None, by="", chosen=None, x="k", y="accuracy", colour="method"
               ) -> tuple | None:
    """The regions table, the frontier plot, the runs table with the columns chosen, its groups and its scatter (the
    metric ``y`` against ``x``, coloured by ``colour``) for the filter, sort and grouping picked, and what they show
    (the signature the poll compares); None when that is ``last``, what is shown already. The filter also finds a
    run by its tags and note."""
    rows = library.regions_listing()
    chosen = None if chosen is None else [c for c in chosen if isinstance(c, str)]
    sig = (tuple((r["id"], r["digest"], r["scored"], r["created"]) for r in rows), words or "", sort or "",
           bool(descending), by or "", runs.notes_signature(), runs.jobs_signature(),
           None if chosen is None else tuple(chosen), x, y, colour)
    if sig == last:
        return None
    shown = runs.shown(runs.runs(rows), words, sort, descending)
    groups = (gr.update(value=runs.groups_table(group_runs(shown, by), by), visible=True) if by else
              gr.update(value=runs.groups_table([], "method"), visible=False))
    return (library.regions_table(shown), figures.region_frontiers(shown), runs.runs_table(shown, chosen), groups,
            runs.runs_scatter(shown, x, y, colour), sig)


RUNS_NOTE = (
    "One row per saved region: its budget, the run over seeds it comes from (a run over seeds saves a region per "
    "seed, then their core and union: 'seeds 0, 1, 2 of r'), its score "
    "at its latest evaluation in distribution (accuracy, or exact match for a completion task), its ECE, its mean "
    "accuracy over the OOD tasks of the latest comparison that scored it out of distribution, whether its "
    "mask-learning curve was recorded, and its tags and note (written under **One region** below). The filter above "
    "also finds tags and notes. Group the runs to see each budget's, method's or seed's mean score and its spread. "
    "**Columns** chooses what the table shows (every setting and metric a run has), the CSV export writes it as "
    "numbers, and each run picked gets a link that opens this page with it picked."
)
CSV_SCOPES = [("the runs shown", "shown"), ("the runs picked", "picked")]
SCATTER_NOTE = (
    "One point per run shown (the filter above applies): the metric picked against the run's region size k, its "
    "sparsity (k as a share of the graftable parameters) or its mask steps, coloured by method, model pair or task; "
    "hover a point for its run. A run without a value on either axis is not drawn, and the title counts it."
)
CURVES_NOTE = (
    "The curves are the mask steps each run's region file keeps, or for an older region its localize job recorded "
    "(loss and training-batch accuracy, one colour per run). A region made by a data-free method, or an older one "
    f"whose job is gone, has {runs.NO_CURVE}. The table below it lists the settings in which the first two runs picked differ."
)


def build_table(page) -> tuple:
    """The saved regions as a table to filter and sort, their accuracies against their sizes in one plot, and the
    runs table (columns, groups, curves, settings diff); all follow every region saved or deleted, every job that
    ends and every tag written. Returns what a written note redraws: the refresh, its inputs and outputs, and the
    curves' handler, picker and outputs (redrawn when the tab opens: a job may have ended meanwhile)."""
    gr.Markdown("### All regions and their latest scores\nEvery saved region with its pair, task, method and "
                "settings, and the accuracy, ECE and share of the fine-tuning gain of its graft at its latest evaluation "
                "(blank until one is scored on Compare), on the task it was scored on: its own unless another was "
                "asked for.")
    table, plot, run_table, groups_update, scatter_figure, sig = render_all("", "", False)
    with gr.Row():
        words = gr.Textbox("", label="Filter", placeholder="words every row shown holds, e.g. movies learned",
                           elem_id="regions-filter")
        sort = gr.Dropdown(SORT_CHOICES, value="", label="Sort by", elem_id="regions-sort")
        descending = gr.Checkbox(False, label="Largest, latest or last first", elem_id="regions-descending")
    frame = gr.Dataframe(table, interactive=False, wrap=True, max_height=TABLE_HEIGHT, label="Saved regions",
                         elem_id="regions-table")
    figure = gr.Plot(plot, label="Accuracy against region size", elem_id="regions-frontiers")
    gr.Markdown(FRONTIER_NOTE, elem_id="regions-frontiers-note")
    gr.Markdown("### Runs\n" + RUNS_NOTE, elem_id="runs-note")
    group = gr.Radio(runs.GROUP_CHOICES, value="", label="Group by", elem_id="runs-group")
    groups = gr.Dataframe(groups_update["value"], interactive=False, wrap=True, label="Runs grouped: score per group",
                          visible=False, elem_id="runs-groups")
    columns = gr.CheckboxGroup(runs.column_labels(), value=runs.RUNS_COLUMNS, label="Columns",
                               info="the settings that made each run, then its metrics; the id is always shown",
                               elem_id="runs-columns")
    run_frame = gr.Dataframe(run_table, interactive=False, wrap=True, max_height=TABLE_HEIGHT, label="Runs",
                             elem_id="runs-table")
    with gr.Row():
        csv_scope = gr.Radio(CSV_SCOPES, value="shown", label="Export as CSV", elem_id="runs-csv-scope")
        csv_export = gr.Button("Export the runs as CSV", elem_id="runs-csv-export", scale=0)
    csv_file = gr.File(label="Runs (CSV: the columns chosen, as numbers)", interactive=False, elem_id="runs-csv")
    gr.Markdown(SCATTER_NOTE, elem_id="runs-scatter-note")
    with gr.Row():
        x_axis = gr.Dropdown(runs.SCATTER_X_CHOICES, value="k", label="x axis", elem_id="runs-scatter-x")
        y_axis = gr.Dropdown([(label, key) for label, key in runs.scatter_metrics()], value="accuracy",
                             label="y axis (a metric)", elem_id="runs-scatter-y")
        colour = gr.Dropdown(runs.COLOUR_CHOICES, value="method", label="Colour by", elem_id="runs-scatter-colour")
    scatter = gr.Plot(scatter_figure, label="A metric of the runs shown against their size or length",
                      elem_id="runs-scatter")
    picked = gr.Dropdown([], value=[], multiselect=True, allow_custom_value=True, label="Runs to overlay",
                         elem_id="runs-pick")
    links = gr.Markdown(runs.links_line([]), elem_id="runs-links")
    side = gr.Dataframe(runs.side_by_side([], []), interactive=False, wrap=True, max_height=TABLE_HEIGHT,
                        label="The runs picked side by side (the columns chosen)", elem_id="runs-side")
    curves = gr.Plot(runs.curves_figure([], {}), label="Mask learning of the runs picked", elem_id="runs-curves")
    gr.Markdown(CURVES_NOTE, elem_id="runs-curves-note")
    diff_line = gr.Markdown("", elem_id="runs-diff-note")
    diff = gr.Dataframe(runs.compare_settings([])[0], interactive=False, wrap=True, label="Settings that differ",
                        elem_id="runs-diff")
    shown = page.state(sig)
    # the columns chosen, as the server keeps them: what the poll, a pick and an export read (the boxes themselves
    # are read only when they change, so a poll is never handed a value the boxes' type refuses)
    chosen = page.state(list(runs.RUNS_COLUMNS))
    page.region_pickers.append((picked, True))  # its choices follow the saved regions; empty, it gets the newest
    outputs = [frame, figure, run_frame, groups, scatter, shown]
    refresh_in = [words, sort, descending, group, chosen, x_axis, y_axis, colour, shown]

    def refresh(text, by_sort, desc, by, columns_, x, y, by_colour, last):
        return render_all(text, by_sort, desc, last, by, columns_, x, y, by_colour) or (*[gr.skip()] * 5, last)

    page.poll.add(refresh, refresh_in, outputs, tab="regions")
    for event in (words.submit, sort.change, descending.change, group.change, x_axis.change, y_axis.change,
                  colour.change):
        page.on(event, page.quiet(lambda *a: (*refresh(*a), gr.skip())), refresh_in, [*outputs, page.status],
                show_progress="hidden")

    def picked_view(ids, columns_) -> tuple:
        listed = {e.id for e in store.list_regions()}  # a value typed into the picker is no run: never drawn
        ids = [i for i in ids or [] if isinstance(i, str) and i in listed]
        table_, line = runs.compare_settings(ids)
        return (runs.curves_figure(ids, runs.localize_curves(store.runner())), table_, line,
                runs.side_by_side(runs.runs(), ids, columns_), runs.links_line(ids))

    on_pick = page.quiet(lambda ids, columns_: (*picked_view(ids, columns_), gr.skip()))
    pick_in, pick_out = [picked, chosen], [curves, diff, diff_line, side, links]
    page.on(picked.change, on_pick, pick_in, [*pick_out, page.status], show_progress="hidden")

    @page.quiet
    def on_columns(columns_, ids, *rest):
        columns_ = [c.label for c in runs.chosen_columns(columns_)]
        text, by_sort, desc, by, _, x, y, by_colour, last = rest
        return (*refresh(text, by_sort, desc, by, columns_, x, y, by_colour, last), *picked_view(ids, columns_),
                columns_, gr.skip())

    page.on(columns.change, on_columns, [columns, picked, *refresh_in], [*outputs, *pick_out, chosen, page.status],
            show_progress="hidden")

    @page.guard()
    def on_csv(text, by_sort, desc, columns_, scope, ids):
        rows = runs.exported(text, by_sort, desc, scope, ids)
        path = runs.export_csv(rows, columns_)
        return str(path), f"✓ Wrote {len(rows)} run(s) with {len(runs.chosen_columns(columns_))} column(s) to {path.name}."

    page.on(csv_export.click, on_csv, [words, sort, descending, chosen, csv_scope, picked], [csv_file, page.status])
    return refresh, refresh_in, outputs, (on_pick, pick_in, pick_out)


OPEN_REGIONS_JS = ("() => { if (new URLSearchParams(window.location.search).has('run')) "
                   "document.getElementById('tab-regions-button')?.click(); }")


def open_linked_run(page, loaded, picked, select) -> None:
    """A page opened from a run's link (``?run=<region id>``, ``runs.run_link``) picks that run once its session is
    known: in the runs picker (its curve drawn) and in the Saved region picker, the Regions tab opened. An id that is
    no run of this session gets one line in the status line and nothing picked."""
    @page.quiet
    def open_run(run_id):
        run = runs.linked_run(run_id)
        choices = store.region_choices()
        return (gr.update(choices=choices, value=[run]), gr.update(choices=choices, value=run),
                f"Opened run **{run}** from its link: picked below its runs table and in Saved region.")

    def at_load(session, request: gr.Request = None):  # Gradio passes the page's request (its address)
        run_id = request.query_params.get("run") if request is not None else None
        if run_id is None:  # a page opened without a link: nothing to pick
            return gr.skip(), gr.skip(), gr.skip()
        return in_session(open_run, [picked, select, page.status])(session, run_id)

    loaded.then(at_load, [page.sid], [picked, select, page.status], show_progress="hidden").then(
        None, None, None, js=OPEN_REGIONS_JS)


def build(page) -> gr.Tab:
    status = page.status
    with gr.Tab("Regions", elem_id="tab-regions") as tab:
        gr.Markdown(INTRO)
        refresh, refresh_in, refresh_out, (on_pick, pick_in, pick_out) = build_table(page)
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
        with gr.Row():
            reg_tags = gr.Textbox("", label="Tags", placeholder="e.g. baseline, long run", max_lines=1,
                                  info=f"separated by commas; at most {MAX_TAGS} of {MAX_TAG_CHARS} characters",
                                  elem_id="region-tags")
            reg_note = gr.Textbox("", label="Note", lines=2, max_lines=8, max_length=MAX_NOTE_CHARS,
                                  info=f"at most {MAX_NOTE_CHARS:,} characters", elem_id="region-note")
            reg_note_save = gr.Button("Save tags and note", elem_id="region-note-save", scale=0)
        reg_note_status = gr.Markdown("", elem_id="region-note-status")
        reg_meta = gr.Dataframe(tables.region_meta_table(None), interactive=False, label="Metadata of the selected region",
                                elem_id="regions-meta")
        reg_export_status = gr.Markdown("", elem_id="region-export-status")
        reg_export_file = gr.File(label="Grafted checkpoint (Hugging Face folder, zipped)", interactive=False,
                                  elem_id="region-export-file")
        gr.Markdown("### Upload a region or skill patch")
        reg_up = gr.File(label="Region file (.safetensors, written by graftui)", file_types=[".safetensors"],
                         elem_id="region-upload")
        reg_up_md = gr.Markdown("", elem_id="region-upload-info")
        reg_up_meta = gr.Dataframe(tables.region_meta_table(None), interactive=False, label="Metadata of the uploaded file",
                                   elem_id="region-upload-meta")
        reg_apply = gr.Button("Check against the current pair and add to my regions", elem_id="region-apply")

    page.region_pickers.append((reg_sel, False))

    @page.guard(region=reg_sel)
    def on_region_select(region_id):
        """The selected region's downloads, metadata, and its tags and note to edit (one handler: a box typed into
        just after a pick is never reset by a later answer)."""
        if not region_id:
            return (gr.update(value=None), gr.update(value=None), tables.region_meta_table(None), "", "", "",
                    gr.skip())
        record = store.load_region(region_id)
        path, indices = library.region_file(region_id), library.region_only_file(region_id)
        said = runs.note_of(region_id)
        return (gr.update(value=str(path)), gr.update(value=str(indices)), tables.region_meta_table(record),
                ", ".join(said["tags"]), said["note"], "", gr.skip())

    for event in (reg_sel.change, tab.select):
        page.on(event, on_region_select, [reg_sel], [reg_dl, reg_dl_idx, reg_meta, reg_tags, reg_note, reg_note_status,
                                                     status])

    @page.guard(beside=reg_note_status, region=reg_sel)
    def on_note_save(region_id, tags, note, *shown_now):
        kept = runs.save_note(region_id, tags, note)
        drawn = refresh(*shown_now[:-1], None)
        line = (f"✓ Saved {len(kept['tags'])} tag(s) and a note of {len(kept['note']):,} characters for "
                f"**{region_id}**." if kept["tags"] or kept["note"] else f"✓ Cleared the tags and note of **{region_id}**.")
        return (", ".join(kept["tags"]), kept["note"], line, *drawn, line)

    page.on(reg_note_save.click, on_note_save, [reg_sel, reg_tags, reg_note, *refresh_in],
            [reg_tags, reg_note, reg_note_status, *refresh_out, status])
    page.on(tab.select, on_pick, pick_in, [*pick_out, status], show_progress="hidden")
    page.loads.append(lambda loaded: open_linked_run(page, loaded, pick_in[0], reg_sel))  # a run's link

    armed = page.state(None)  # (the region a first press of Delete named, when); a second press deletes it

    @page.guard(region=reg_sel)
    def on_region_delete(region_id, shown_label, named):
        path = store.region_path(region_id)  # an id outside this workspace is refused before anything else
        readers = store.jobs_reading(path)
        if not (jobwords.asks(shown_label) and jobwords.still_armed(named, region_id)):
            # the page's poll disarms the button CONFIRM_SECONDS after this press (``Page.disarms``)
            return (gr.skip(), f"Press **{jobwords.CONFIRM}: delete** again to delete **{path.stem}** for good (within "
                    f"{jobwords.CONFIRM_SECONDS:g} s): it cannot be undone{jobwords.reading_words(readers, True)}.",
                    (region_id, time.time()), gr.update(value=f"{jobwords.CONFIRM}: delete {path.stem}"))
        for job in readers:  # they would fail on the missing file: cancelled with it, as the press above said
            store.runner().cancel(job.id)
        store.delete_region(region_id)
        return (gr.update(value=None), f"Deleted region **{path.stem}**{jobwords.reading_words(readers, False)}.",
                None, gr.update(value=DELETE))

    page.confirm(reg_delete, on_region_delete, [reg_sel], armed, [reg_sel, status, armed, reg_delete],
                 "on_region_delete")

    def disarm(region_id, named):  # another region picked: a press must name it first
        if named is None or jobwords.still_armed(named, region_id):
            return gr.skip(), gr.skip()
        return None, gr.update(value=DELETE)

    page.on(reg_sel.change, disarm, [reg_sel, armed], [armed, reg_delete], show_progress="hidden",
            **page.one_at_a_time(armed))
    page.disarms(reg_delete, armed, lambda: gr.update(value=DELETE))

    @page.guard(beside=reg_export_status, region=reg_sel)
    def on_export(region_id):
        job = forms.submit_export(store.runner(), region_id=region_id)
        return jobwords.submitted_line(job), job.id, gr.skip()  # the panel writes the line (see ``submitted``)

    export_job = page.state("")  # the export this page started: its panel shows that one, not a picked one
    page.on(reg_export.click, on_export, [reg_sel], [status, export_job, reg_export_status])
    page.panel("regions", ("export",), None, reg_export_status, [reg_export_file], render_export, "",
               fixed_state=export_job)

    @page.guard(beside=reg_up_md, region=reg_up)
    def on_region_upload(file):
        if not file:
            return "", tables.region_meta_table(None), gr.skip()
        path, record = library.read_region_upload(file)
        s = record.summary()
        md = (f"✓ **{path.name}** is a valid graftui {s['kind']}: k = {s['size']:,} of {s['graftable']:,} graftable "
              f"parameters ({s['fraction_of_graftable']:.4%}) in {s['tensors']} tensors. Press the button below to check "
              "it against the current pair and add it to your regions.")
        return md, tables.region_meta_table(record), f"✓ {path.name} is a valid region file."

    page.on(reg_up.upload, on_region_upload, [reg_up], [reg_up_md, reg_up_meta, status])

    @page.guard(beside=reg_up_md, region=reg_up)
    def on_region_apply(file, base, finetuned):
        if not file:
            raise ValueError("upload a region file first")
        saved = library.adopt_region(file, base, finetuned)
        return (f"✓ Fits the current pair ({short_ref(base)} → {short_ref(finetuned)}); saved as **{saved.stem}** "
                "and listed in every region picker."), f"✓ Added region {saved.stem}."

    page.on(reg_apply.click, on_region_apply, [reg_up, page.base, page.finetuned], [reg_up_md, status])
    push.build(page, tab, reg_sel)  # Push to the Hub, for the selected region
    return tab
