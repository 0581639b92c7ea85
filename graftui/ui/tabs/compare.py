"""Compare: score grafts against the fine-tuned model and same-size baselines, in and out of distribution;
and the sparsity sweep (accuracy against budget) for the pair, task and mask settings of the earlier tabs."""

from __future__ import annotations

import gradio as gr
import pandas as pd

from ... import figures
from ...errors import RequestError
from ...paths import short_ref
from ...tasks import kind_named
from .. import actions, store
from ..wiring import TABLE_HEIGHT, answered, job_picker, submitted

INTRO = (
    "How good is a graft? Accuracy, F1, calibration (ECE) and agreement with the fine-tuned model, in distribution "
    "and on out-of-distribution tasks, next to random and top-movement regions of the same size."
)
GENERATIONS_NOTE = ("Greedy generations of each model on the first test examples, each cell the answer «…» the rule "
                    "read and the generation it came from: ✓ the answer is the reference's (exact match), ≈ it "
                    "contains it, ✗ neither (with its token F1 where above 0).")
DISAGREEMENTS_LABEL = "Test examples where a graft and the fine-tuned model disagree (click a header to sort)"
KINDS, LATEST = ("compare",), "latest comparison"
SWEEP_KINDS, SWEEP_LATEST = ("sweep",), "latest sweep"
PREDICT_KINDS, PREDICT_LATEST = ("predict",), "latest sentences"


def render_compare(job) -> list:
    empty = pd.DataFrame(columns=actions.COMPARE_COLUMNS)
    if job is None or not job.result:
        msg = "Run a comparison to fill this." if job is None else "Results appear when the job is done."
        return [empty, pd.DataFrame(columns=actions.DIFFERENCE_COLUMNS),
                gr.update(value=figures.empty_figure(msg), visible=True),
                gr.update(value=figures.empty_figure(msg), visible=True), "", figures.side_by_side(None), "",
                gr.update(value=pd.DataFrame(columns=actions.DISAGREEMENT_COLUMNS), label=DISAGREEMENTS_LABEL)]
    res = job.result
    kind = kind_named(res.get("task_kind"))
    note = kind.app_heading(res) + kind.app_note
    if res.get("notes"):
        note += "\n\n" + "\n\n".join(f"Note: {n}" for n in res["notes"])
    # a kind without a confidence per example (generations) has no diagram to draw: its boxes are not shown
    return [actions.compare_table(res), actions.differences_table(res),
            gr.update(value=figures.reliability_diagram(res["reliability"], res["task"]), visible=True)
            if res["reliability"] else gr.update(value=None, visible=False),
            gr.update(value=figures.confidence_histogram(res["histogram"], res["task"]), visible=True)
            if res["histogram"] else gr.update(value=None, visible=False),
            note, figures.side_by_side(res.get("side_by_side")),
            *((GENERATIONS_NOTE, gr.update(value=actions.generations_table(res), label=actions.GENERATIONS_LABEL))
              if res.get("generations") else (actions.disagreements_note(res),
                                              gr.update(value=actions.disagreements_table(res),
                                                        label=DISAGREEMENTS_LABEL)))]


def render_sweep(job) -> list:
    if job is None or not job.result:
        msg = "Run a sweep to fill this." if job is None else "The curve appears when the sweep is done."
        return [figures.empty_figure(msg), pd.DataFrame(columns=actions.SWEEP_COLUMNS)]
    rows = job.result["rows"]
    return [figures.sweep_figure(rows, short_ref(job.result.get("task", ""))), actions.sweep_table(rows)]


def render_predict(job) -> list:
    if job is None or not job.result:
        return [pd.DataFrame(columns=actions.PREDICT_COLUMNS)]
    return [actions.predict_table(job.result)]


def predict_kind_or_default(region_ids) -> str:
    """The Try box's kind for the picked regions; regions of both kinds read as classification until the button
    says why they cannot be tried together."""
    try:
        return actions.predict_kind(region_ids or [])
    except RequestError:
        return "classification"


def build(page) -> gr.Tab:
    d = page.defaults
    with gr.Tab("Compare", elem_id="tab-compare") as tab:
        gr.Markdown(INTRO)
        with gr.Row():
            cmp_regions = gr.Dropdown(store.region_choices(), allow_custom_value=True, multiselect=True,
                                      label="Regions to evaluate (one fine-tuned model, or the same regions of several fine-tunes)", elem_id="compare-regions")
            cmp_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="compare-n")
            cmp_base = gr.Checkbox(True, label="Add top-movement and random regions of the same k", elem_id="compare-baselines")
        gr.Markdown("The in-distribution task is the one each region was learned on; OOD tasks come from the **Models** tab.")
        with gr.Row():
            cmp_run = gr.Button("Evaluate", variant="primary", elem_id="compare-run", scale=0)
            cmp_job = job_picker(LATEST, "compare")
        cmp_status = gr.Markdown("", elem_id="compare-status")
        page.report("compare", cmp_job, KINDS)
        cmp_table = gr.Dataframe(pd.DataFrame(columns=actions.COMPARE_COLUMNS), interactive=False, wrap=True,
                                 max_height=TABLE_HEIGHT,
                                 label="Fine-tuned vs grafts vs baselines", elem_id="compare-table")
        cmp_diff = gr.Dataframe(pd.DataFrame(columns=actions.DIFFERENCE_COLUMNS), interactive=False, wrap=True,
                                max_height=TABLE_HEIGHT, elem_id="compare-differences",
                                label="Paired differences on the same test examples (a − b; bootstrap interval, "
                                      "McNemar's exact p for accuracy)")
        cmp_note = gr.Markdown("", elem_id="compare-note")
        cmp_side = gr.Plot(figures.side_by_side(None), elem_id="compare-side-by-side")
        with gr.Row():
            cmp_rel = gr.Plot(figures.empty_figure("Run a comparison to see the reliability diagram."),
                              elem_id="compare-reliability")
            cmp_hist = gr.Plot(figures.empty_figure("Run a comparison to see the confidence histogram."),
                               elem_id="compare-histogram")
        cmp_unlike_md = gr.Markdown("", elem_id="compare-disagreements-note")
        cmp_unlike = gr.Dataframe(pd.DataFrame(columns=actions.DISAGREEMENT_COLUMNS), interactive=False, wrap=True,
                                  max_height=TABLE_HEIGHT, elem_id="compare-disagreements",
                                  label=DISAGREEMENTS_LABEL)
        gr.Markdown("### Try sentences\nType sentences, one per line: the bare body, the fine-tuned model and the "
                    "graft of each region picked above classify them side by side (for a language model, its label "
                    "words' scores under its prompt). For completion regions the whole box is one prompt, and each "
                    "model's greedy generation for it is shown.")
        text_label, button, table_label = actions.PREDICT_WORDS["classification"]
        with gr.Row():
            prd_text = gr.Textbox("", lines=3, label=text_label, elem_id="predict-text")
            prd_run = gr.Button(button, elem_id="predict-run", scale=0)
            prd_job = job_picker(PREDICT_LATEST, "predict")
        prd_status = gr.Markdown("", elem_id="predict-status")
        prd_table = gr.Dataframe(pd.DataFrame(columns=actions.PREDICT_COLUMNS), interactive=False, wrap=True,
                                 max_height=TABLE_HEIGHT, label=table_label, elem_id="predict-table")
        gr.Markdown("### Sparsity sweep\nLearned vs top-movement vs random regions over several budgets, for the pair "
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
        swp_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=actions.SWEEP_COLUMNS),
                                 interactive=False, elem_id="sweep-table")

    page.region_pickers.append((cmp_regions, False))
    page.keep(n=cmp_n, baselines=cmp_base, sweep_budgets=swp_budgets, predict_text=prd_text)

    @page.guard(beside=cmp_status, regions=cmp_regions, region=cmp_regions, n=cmp_n, baselines=cmp_base)
    def on_compare(region_ids, ood, mapping, n, baselines):
        job = actions.submit_compare(store.runner(), region_ids=region_ids or [], ood=ood or [], n=n, baselines=baselines,
                                     ood_labels=mapping)
        return submitted(job, KINDS, LATEST)

    page.shows("compare", cmp_job, [cmp_regions, cmp_n, cmp_base])
    page.on(cmp_run.click, on_compare, [cmp_regions, page.ood, page.ood_labels, cmp_n, cmp_base],
            [page.status, cmp_job, cmp_status])

    @page.guard(beside=prd_status, regions=cmp_regions, region=cmp_regions, texts=prd_text, text=prd_text)
    def on_predict(region_ids, text):
        job = actions.submit_predict(store.runner(), region_ids=region_ids or [], text=text)
        return answered(job, PREDICT_KINDS, PREDICT_LATEST, render_predict)  # its answer at once, not at the next tick

    page.on(prd_run.click, on_predict, [cmp_regions, prd_text], [page.status, prd_job, prd_status, prd_table])

    def on_predict_kind(region_ids):  # the box, its button and the table say what the picked regions do
        text_label, button, table_label = actions.PREDICT_WORDS[predict_kind_or_default(region_ids)]
        return gr.update(label=text_label), gr.update(value=button), gr.update(label=table_label)

    page.on(cmp_regions.change, on_predict_kind, [cmp_regions], [prd_text, prd_run, prd_table], show_progress="hidden")

    @page.guard(beside=swp_status, sparsities=swp_budgets, steps=page.mask[0], examples_per_class=page.mask[1],
                lr=page.mask[2], n=cmp_n, keep=swp_keep)
    def on_sweep(base, finetuned, task, text, pair, label, budgets, steps, epc, lr, n, head, template, words, ood,
                 mapping, keep):
        job = actions.submit_sweep(store.runner(), base=base, finetuned=finetuned, task=task,
                                   columns={**actions.data_columns(task, text, pair, label),
                                            **actions.prompt_fields(head, template, words)},
                                   budgets=budgets, steps=steps, examples_per_class=epc, lr=lr, n=n, ood=ood or [],
                                   ood_labels=mapping, keep=keep)
        return submitted(job, SWEEP_KINDS, SWEEP_LATEST)

    page.on(swp_run.click, on_sweep, [page.base, page.finetuned, page.task, *page.columns, swp_budgets, *page.mask, cmp_n,
                                      *page.prompt, page.ood, page.ood_labels, swp_keep],
            [page.status, swp_job, swp_status])
    page.panel("compare", KINDS, cmp_job, cmp_status, [cmp_table, cmp_diff, cmp_rel, cmp_hist, cmp_note, cmp_side,
                                                           cmp_unlike_md, cmp_unlike],
               render_compare,
               LATEST)
    page.panel("compare", PREDICT_KINDS, prd_job, prd_status, [prd_table], render_predict, PREDICT_LATEST)
    page.panel("compare", SWEEP_KINDS, swp_job, swp_status, [swp_plot, swp_table], render_sweep, SWEEP_LATEST)
    return tab
