"""Compare: score grafts against the fine-tuned model and same-size baselines, in and out of distribution;
and the sparsity sweep (accuracy against budget) for the pair, task and mask settings of the earlier tabs."""

from __future__ import annotations

import gradio as gr
import pandas as pd

from ... import figures
from ...errors import RequestError
from ...localizers import get_method
from ...paths import short_ref
from ...kinds import kind_in
from .. import forms, store, tables
from ..kinds import app_of
from ..wiring import TABLE_HEIGHT, answered, job_picker, submitted

INTRO = (
    "How good is a graft? Accuracy, F1, calibration (ECE) and agreement with the fine-tuned model, in distribution "
    "and on out-of-distribution tasks, next to random and top-movement regions of the same size."
)
GENERATIONS_NOTE = ("Greedy generations of each model on the first test examples, each cell the answer «…» the rule "
                    "read and the generation it came from: ✓ the answer is the reference's (exact match), ≈ it "
                    "contains it, ✗ neither (with its token F1 where above 0).")
DISAGREEMENTS_LABEL = ("Test examples where a graft and the fine-tuned model disagree, the graft's most confident first "
                       "(a header click sorts the page shown)")
DIFFERENCES_LABEL = ("Paired differences on the same test examples (a − b; bootstrap interval, McNemar's exact p for "
                     "accuracy)")
KINDS, LATEST = ("compare",), "latest comparison"
PAGE_ROWS = 10  # disagreements shown at once: a row of a long sentence is about 200 px tall in an 800 px window
ALL_COMPARISONS = "every comparison"
SWEEP_KINDS, SWEEP_LATEST = ("sweep",), "latest sweep"
PREDICT_KINDS, PREDICT_LATEST = ("predict",), "latest sentences"


def table_value(df: pd.DataFrame, label: str = "", page_rows: int | None = None) -> dict:
    """A result table as the page keeps it between the job and what is shown (a filter, a page of ``page_rows``
    rows, or all): plain lists, so an unchanged table redrawn by the poll is the same value and leaves the filter
    and the page alone."""
    cells = df.astype(object).where(df.notna(), "")
    return {"label": label, "columns": [str(c) for c in df.columns], "rows": cells.values.tolist(),
            "page_rows": page_rows}


def _frame(table: dict | None, rows: list | None = None, columns: list | None = None) -> pd.DataFrame:
    cols = (table or {}).get("columns") or columns or []
    return pd.DataFrame((table or {}).get("rows", []) if rows is None else rows, columns=cols)


def comparison_choices(table: dict | None) -> list[str]:
    """The comparisons (a − b) a differences table holds, each once in order, after "every comparison"."""
    rows = (table or {}).get("rows") or []
    return [ALL_COMPARISONS, *dict.fromkeys(str(r[0]) for r in rows)]


TOP_MOVEMENT = get_method("top-movement").label  # the paper's baseline: a graft against it is its comparison


def comparison_shown(choices: list[str], picked: str | None) -> str | None:
    """The comparison a new result shows: the one picked where the result has it (every comparison included), else
    the paper's (the first graft against the top-movement region of its size), else its first (the first graft
    against the fine-tuned model), so a long table opens on the one it is read by."""
    if picked in choices:
        return picked
    papers = next((c for c in choices[1:] if c.partition(" − ")[2].startswith(TOP_MOVEMENT)), None)
    return papers or (choices[1] if len(choices) > 1 else None)  # no result yet: the first one picks


def filter_differences(table: dict | None, comparison: str | None, words: str | None) -> tuple[pd.DataFrame, str]:
    """The rows of one comparison (or all), holding every word typed (any column, any case), and a line saying
    how many of how many are shown."""
    rows = (table or {}).get("rows") or []
    wanted = (words or "").lower().split()
    shown = [r for r in rows
             if (not comparison or comparison == ALL_COMPARISONS or str(r[0]) == comparison)
             and all(w in " ".join(map(str, r)).lower() for w in wanted)]
    line = "" if not rows else (f"All {len(rows):,} differences shown." if len(shown) == len(rows) else
                                f"{len(shown):,} of {len(rows):,} differences shown.")
    return _frame(table, shown, tables.DIFFERENCE_COLUMNS), line


def page_of(table: dict | None, page: int) -> tuple[pd.DataFrame, int, str, bool, bool]:
    """One page of a long table, of the size the table says (all its rows if none): (its rows, the page number kept
    within range, a line saying which rows of how many, whether there is a page before, whether there is one after)."""
    rows = (table or {}).get("rows") or []
    size = (table or {}).get("page_rows") or max(len(rows), 1)
    pages = max(1, -(-len(rows) // size))
    page = min(max(int(page or 0), 0), pages - 1)
    first, last = page * size, min(len(rows), (page + 1) * size)
    line = "" if not rows else (f"All {len(rows):,} rows shown." if pages == 1 else
                                f"Rows {first + 1:,}–{last:,} of {len(rows):,} (page {page + 1} of {pages}).")
    return (_frame(table, rows[first:last], tables.DISAGREEMENT_COLUMNS), page, line, page > 0,
            page < pages - 1)


def render_compare(job) -> list:
    empty = pd.DataFrame(columns=tables.COMPARE_COLUMNS)
    if job is None or not job.result:
        msg = "Run a comparison to fill this." if job is None else "Results appear when the job is done."
        return [empty, pd.DataFrame(columns=tables.DIFFERENCE_COLUMNS),
                gr.update(value=figures.empty_figure(msg), visible=True),
                gr.update(value=figures.empty_figure(msg), visible=True), "",
                gr.update(value=None, visible=False), "",
                gr.update(value=pd.DataFrame(columns=tables.DISAGREEMENT_COLUMNS), label=DISAGREEMENTS_LABEL)]
    res = job.result
    kind = kind_in(res)
    note = app_of(kind).app_heading(res) + app_of(kind).app_note
    if res.get("notes"):
        note += "\n\n" + "\n\n".join(f"Note: {n}" for n in res["notes"])
    # a kind without a confidence per example (generations) has no diagram to draw: its boxes are not shown; one
    # region has no side-by-side figure, and takes no room for it
    side = res.get("side_by_side")
    return [tables.compare_table(res), tables.differences_table(res),
            gr.update(value=figures.reliability_diagram(res["reliability"], res["task"]), visible=True)
            if res["reliability"] else gr.update(value=None, visible=False),
            gr.update(value=figures.confidence_histogram(res["histogram"], res["task"]), visible=True)
            if res["histogram"] else gr.update(value=None, visible=False),
            note, gr.update(value=figures.side_by_side(side), visible=True) if side else gr.update(value=None, visible=False),
            *((GENERATIONS_NOTE, gr.update(value=tables.generations_table(res), label=tables.GENERATIONS_LABEL))
              if res.get("generations") else (tables.disagreements_note(res),
                                              gr.update(value=tables.disagreements_table(res),
                                                        label=DISAGREEMENTS_LABEL)))]


def render_compare_panel(job) -> list:
    """``render_compare`` as the panel keeps it: the differences and the disagreements (or generations) as table
    values, which the filter and the pages show from (the disagreements a page at a time, the generations whole)."""
    out = render_compare(job)
    unlike = out[-1]
    paged = PAGE_ROWS if unlike["label"] == DISAGREEMENTS_LABEL else None
    return [out[0], table_value(out[1]), *out[2:-1], table_value(unlike["value"], unlike["label"], paged)]


def render_sweep(job) -> list:
    if job is None or not job.result:
        msg = "Run a sweep to fill this." if job is None else "The curve appears when the sweep is done."
        return [figures.empty_figure(msg), pd.DataFrame(columns=tables.SWEEP_COLUMNS)]
    rows = job.result["rows"]
    return [figures.sweep_figure(rows, short_ref(job.result.get("task", ""))), tables.sweep_table(rows)]


def render_predict(job) -> list:
    """The Try table, and the probe map's heatmaps beside it when the result has them (a probe by layer × module)."""
    if job is None or not job.result:
        return [pd.DataFrame(columns=tables.PREDICT_COLUMNS), gr.update(visible=False)]
    mapped = bool(job.result.get("parts"))
    return [tables.predict_table(job.result),
            gr.update(value=figures.probe_map(job.result), visible=True) if mapped else gr.update(visible=False)]


def predict_kind_or_default(region_ids) -> str:
    """The Try box's kind for the picked regions; regions of both kinds read as classification until the button
    says why they cannot be tried together."""
    try:
        return forms.predict_kind(region_ids or [])
    except RequestError:
        return "classification"


PHONE_CLOSED = "phone-closed"  # an accordion open on a desk and closed on a phone (``pagescript``): secondary parts


def build(page) -> gr.Tab:
    d = page.defaults
    with gr.Tab("Compare", elem_id="tab-compare") as tab:
        gr.Markdown(INTRO)
        with gr.Row():
            cmp_regions = gr.Dropdown(store.region_choices(), allow_custom_value=True, multiselect=True,
                                      label="Regions to evaluate (one fine-tuned model, or the same regions of several fine-tunes)", elem_id="compare-regions")
            cmp_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="compare-n")
            cmp_base = gr.Checkbox(True, label="Add top-movement and random regions of the same k", elem_id="compare-baselines")
        gr.Markdown("The in-distribution task is the one each region was learned on; OOD tasks come from the **Models** "
                    "tab, for classification regions (a completion skill is scored on its own task only).")
        with gr.Row():
            cmp_run = gr.Button("Evaluate", variant="primary", elem_id="compare-run", scale=0)
            cmp_cancel = gr.Button("Cancel", variant="secondary", interactive=False, elem_id="compare-cancel", scale=0)
            cmp_job = job_picker(LATEST, "compare")
        cmp_status = gr.Markdown("", elem_id="compare-status")
        page.report("compare", cmp_job, KINDS)
        cmp_table = gr.Dataframe(pd.DataFrame(columns=tables.COMPARE_COLUMNS), interactive=False, wrap=True,
                                 max_height=TABLE_HEIGHT,
                                 label="Fine-tuned vs grafts vs baselines", elem_id="compare-table")
        cmp_note = gr.Markdown("", elem_id="compare-note")
        with gr.Accordion("Paired differences", open=True, elem_id="compare-differences-section",
                          elem_classes=[PHONE_CLOSED]):
            with gr.Row(elem_id="compare-differences-filter"):
                diff_pick = gr.Dropdown([ALL_COMPARISONS], value=None, label="Show the differences of",
                                        elem_id="compare-differences-pick")
                diff_words = gr.Textbox("", label="… holding the words", placeholder="e.g. OOD, accuracy, amazon, random",
                                        elem_id="compare-differences-words")
            diff_count = gr.Markdown("", elem_id="compare-differences-count")
            cmp_diff = gr.Dataframe(pd.DataFrame(columns=tables.DIFFERENCE_COLUMNS), interactive=False, wrap=True,
                                    max_height=TABLE_HEIGHT, elem_id="compare-differences", label=DIFFERENCES_LABEL)
        cmp_side = gr.Plot(None, visible=False, elem_id="compare-side-by-side")
        with gr.Accordion("Calibration: reliability diagram and confidence histogram", open=True,
                          elem_id="compare-calibration-section", elem_classes=[PHONE_CLOSED]):
            with gr.Row(elem_id="compare-calibration"):
                cmp_rel = gr.Plot(figures.empty_figure("Run a comparison to see the reliability diagram."),
                                  elem_id="compare-reliability")
                cmp_hist = gr.Plot(figures.empty_figure("Run a comparison to see the confidence histogram."),
                                   elem_id="compare-histogram")
        with gr.Accordion("Test examples the models disagree on", open=True, elem_id="compare-disagreements-section",
                          elem_classes=[PHONE_CLOSED]):
            cmp_unlike_md = gr.Markdown("", elem_id="compare-disagreements-note")
            cmp_unlike = gr.Dataframe(pd.DataFrame(columns=tables.DISAGREEMENT_COLUMNS), interactive=False, wrap=True,
                                      max_height=TABLE_HEIGHT, elem_id="compare-disagreements",
                                      label=DISAGREEMENTS_LABEL)
            with gr.Row(elem_id="compare-disagreements-pager"):
                unlike_prev = gr.Button("◀ Previous", size="sm", interactive=False, scale=0, min_width=120,
                                        elem_id="compare-disagreements-prev")
                unlike_line = gr.Markdown("", elem_id="compare-disagreements-page")
                unlike_next = gr.Button("Next ▶", size="sm", interactive=False, scale=0, min_width=120,
                                        elem_id="compare-disagreements-next")
        gr.Markdown("### Try sentences\nType sentences, one per line: the bare body, the fine-tuned model and the "
                    "graft of each region picked above classify them side by side.", elem_id="predict-intro")
        with gr.Accordion("How sentences are tried, and how to probe a region", open=False, elem_id="predict-how"):
            gr.Markdown("For a language model, the label words' scores under its prompt are shown. For completion "
                        "regions the whole box is one prompt, and each model's greedy generation for it is shown. To "
                        "probe a region, add the fine-tuned model with the region knocked out (θ_ft − γ⊙δ), or the "
                        "graft of one of its layers or module types at a time (one region picked); the layer × module "
                        "map shows, for the first sentence, how much each part alone moves the probability of the "
                        "fine-tuned model's answer, grafted onto the pre-trained model and knocked out of the "
                        "fine-tuned one (× where the answer flips).")
        text_label, button, table_label = forms.PREDICT_WORDS["classification"]
        with gr.Row():
            prd_text = gr.Textbox("", lines=3, label=text_label, elem_id="predict-text")
            prd_run = gr.Button(button, elem_id="predict-run", scale=0)
            prd_job = job_picker(PREDICT_LATEST, "predict")
        with gr.Row():
            prd_knock = gr.Checkbox(False, label="Knock the region out (fine-tuned − region)", elem_id="predict-knockout",
                                    scale=0, min_width=260)
            prd_by = gr.Radio(list(forms.PROBE_BY), value=next(iter(forms.PROBE_BY)), label="Graft the region",
                              elem_id="predict-by")
        prd_status = gr.Markdown("", elem_id="predict-status")
        prd_table = gr.Dataframe(pd.DataFrame(columns=tables.PREDICT_COLUMNS), interactive=False, wrap=True,
                                 max_height=TABLE_HEIGHT, label=table_label, elem_id="predict-table")
        prd_map = gr.Plot(visible=False, elem_id="predict-map", label="Probe map: Δp of the fine-tuned answer")
        with gr.Accordion("Sparsity sweep: accuracy against budget", open=False, elem_id="sweep-section"):
            gr.Markdown("Learned vs top-movement vs random regions over several budgets, for the pair "
                        "and task of the **Models** tab, with the mask settings of the **Localize** tab.")
            with gr.Row():
                swp_budgets = gr.Textbox(d["sweep_budgets"], label="Budgets (fractions of graftable parameters)",
                                         elem_id="sweep-budgets")
                swp_keep = gr.Checkbox(False, label="Keep the swept regions (saved with the others)", elem_id="sweep-keep",
                                       scale=0)
                swp_run = gr.Button("Run sparsity sweep", elem_id="sweep-run", scale=0)
                swp_job = job_picker(SWEEP_LATEST, "sweep")
            swp_status = gr.Markdown("", elem_id="sweep-status")
            page.report("sweep", swp_job, SWEEP_KINDS)
            swp_plot = gr.Plot(figures.empty_figure("Run a sparsity sweep to see accuracy against budget."), elem_id="sweep-plot")
            swp_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=tables.SWEEP_COLUMNS),
                                     interactive=False, elem_id="sweep-table")

    page.region_pickers.append((cmp_regions, False))
    page.keep(n=cmp_n, baselines=cmp_base, sweep_budgets=swp_budgets, predict_text=prd_text, predict_knockout=prd_knock)

    @page.guard(beside=cmp_status, regions=cmp_regions, region=cmp_regions, n=cmp_n, baselines=cmp_base)
    def on_compare(region_ids, ood, mapping, n, baselines):
        job = forms.submit_compare(store.runner(), region_ids=region_ids or [], ood=ood or [], n=n, baselines=baselines,
                                     ood_labels=mapping)
        return submitted(job, KINDS, LATEST)

    page.shows("compare", cmp_job, [cmp_regions, cmp_n, cmp_base])
    page.cancel(cmp_cancel, cmp_job, KINDS)
    page.on(cmp_run.click, on_compare, [cmp_regions, page.ood, page.ood_labels, cmp_n, cmp_base],
            [page.status, cmp_job, cmp_status])

    @page.guard(beside=prd_status, regions=cmp_regions, region=cmp_regions, texts=prd_text, text=prd_text,
                knockout=prd_knock, by=prd_by)
    def on_predict(region_ids, text, knockout, by):
        job = forms.submit_predict(store.runner(), region_ids=region_ids or [], text=text, knockout=knockout, by=by)
        return answered(job, PREDICT_KINDS, PREDICT_LATEST, render_predict)  # its answer at once, not at the next tick

    page.on(prd_run.click, on_predict, [cmp_regions, prd_text, prd_knock, prd_by],
            [page.status, prd_job, prd_status, prd_table, prd_map])

    def on_predict_kind(region_ids):  # the box, its button and the table say what the picked regions do
        text_label, button, table_label = forms.PREDICT_WORDS[predict_kind_or_default(region_ids)]
        return gr.update(label=text_label), gr.update(value=button), gr.update(label=table_label)

    page.on(cmp_regions.change, on_predict_kind, [cmp_regions], [prd_text, prd_run, prd_table], show_progress="hidden")

    def on_pair(finetuned, picked):  # another pair on the Models tab: the last pair's regions are no longer picked
        kept = forms.of_pair(picked, finetuned)
        return (gr.skip() if kept == list(picked or []) else gr.update(value=kept)), gr.skip()

    page.on(page.finetuned.change, page.quiet(on_pair), [page.finetuned, cmp_regions], [cmp_regions, page.status],
            show_progress="hidden")

    @page.guard(beside=swp_status, sparsities=swp_budgets, steps=page.mask[0], examples_per_class=page.mask[1],
                lr=page.mask[2], n=cmp_n, keep=swp_keep)
    def on_sweep(base, finetuned, task, text, pair, label, budgets, steps, epc, lr, n, head, template, words, ood,
                 mapping, keep):
        job = forms.submit_sweep(store.runner(), base=base, finetuned=finetuned, task=task,
                                   columns={**forms.data_columns(task, text, pair, label),
                                            **forms.prompt_fields(head, template, words)},
                                   budgets=budgets, steps=steps, examples_per_class=epc, lr=lr, n=n, ood=ood or [],
                                   ood_labels=mapping, keep=keep)
        return submitted(job, SWEEP_KINDS, SWEEP_LATEST)

    page.on(swp_run.click, on_sweep, [page.base, page.finetuned, page.task, *page.columns, swp_budgets, *page.mask, cmp_n,
                                      *page.prompt, page.ood, page.ood_labels, swp_keep],
            [page.status, swp_job, swp_status])
    diff_table, unlike_table, unlike_page = page.state(None), page.state(None), page.state(0)
    page.panel("compare", KINDS, cmp_job, cmp_status, [cmp_table, diff_table, cmp_rel, cmp_hist, cmp_note,
                                                       cmp_side, cmp_unlike_md, unlike_table],
               render_compare_panel, LATEST)
    wire_differences(page, diff_table, diff_pick, diff_words, diff_count, cmp_diff)
    wire_pages(page, unlike_table, unlike_page, unlike_prev, unlike_next, unlike_line, cmp_unlike)
    page.panel("compare", PREDICT_KINDS, prd_job, prd_status, [prd_table, prd_map], render_predict, PREDICT_LATEST)
    page.panel("compare", SWEEP_KINDS, swp_job, swp_status, [swp_plot, swp_table], render_sweep, SWEEP_LATEST)
    return tab


def wire_differences(page, table, pick, words, count, shown) -> None:
    """The differences table shows the comparison picked and the rows holding the words typed; a new result offers
    its own comparisons (``comparison_shown``)."""

    @page.quiet
    def on_result(value, picked, typed):
        choices = comparison_choices(value)
        picked = comparison_shown(choices, picked)
        rows, line = filter_differences(value, picked, typed)
        return gr.update(choices=choices, value=picked), rows, line, gr.skip()

    @page.quiet
    def on_filter(value, picked, typed):
        rows, line = filter_differences(value, picked, typed)
        return rows, line, gr.skip()

    page.on(table.change, on_result, [table, pick, words], [pick, shown, count, page.status], show_progress="hidden")
    for event in (pick.input, words.input):
        page.on(event, on_filter, [table, pick, words], [shown, count, page.status], show_progress="hidden",
                trigger_mode="always_last")


def wire_pages(page, table, number, prev, following, line, shown) -> None:
    """A long table shown PAGE_ROWS rows at a time, with a button to each side; a new result starts on its first page."""

    def show(value, at):
        rows, at, words, before, after = page_of(value, at)
        label = (value or {}).get("label") or DISAGREEMENTS_LABEL
        return (gr.update(value=rows, label=label), at, words, gr.update(interactive=before),
                gr.update(interactive=after), gr.skip())

    outputs = [shown, number, line, prev, following, page.status]
    page.on(table.change, page.quiet(lambda value: show(value, 0)), [table], outputs, show_progress="hidden")
    page.on(prev.click, page.quiet(lambda value, at: show(value, (at or 0) - 1)), [table, number], outputs,
            show_progress="hidden")
    page.on(following.click, page.quiet(lambda value, at: show(value, (at or 0) + 1)), [table, number], outputs,
            show_progress="hidden")
