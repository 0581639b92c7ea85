"""Localize: learn (or pick by a data-free rule) the region of k parameters that carries the skill; every
finished region is listed below, and the Compare tab's sweep reuses the mask settings."""

from __future__ import annotations

import gradio as gr

from ... import figures, settings
from ...config import DEFAULT_BASE, DEFAULT_EXAMPLES_PER_CLASS, DEFAULT_FINETUNED
from ...localizers import METHODS, get_method
from ...requests import LocalizeRequest
from ...kinds import CLASSIFICATION, named_kind
from .. import forms, jobwords, library, store, tables
from ..kinds import app_of
from ..wiring import job_picker, seeds_box, submitted

INTRO = (
    "Find the few parameters that carry the skill: a region of k parameters (the budget) whose graft "
    "keeps the fine-tuned model's accuracy. The learned method takes a few mask steps on a small training sample "
    "(so many examples per class, or prompts for a completion task)."
)
KINDS, LATEST = ("localize",), "latest localize job"
PLOT_NOTE = (
    "Mask learning relaxes the region to γ(S) = σ(S + ℓ) and steps ℓ on the task loss of the relaxed graft; the loss "
    "is that of one training batch, so it is noisy (the thick line is its running mean). The held-out check (◆) "
    "scores the region on a sample of test examples the mask never saw — once where learning starts (the "
    "**top-movement start**, the region learning begins from) and once at the end (the **learned region**) — beside "
    "the fine-tuned model and the empty region (dotted; their scores are reused from earlier runs of this pair and "
    "task). The panel's title says how far apart two scores must be for that sample to tell them apart (±, 95 %); "
    "below 100 examples it says the sample is too small for closer ones. The bottom panel counts parameters with "
    "γ ≥ 0.5, which is not the region: the saved region is the top k of ℓ, exactly k parameters, so a count above "
    "the budget k while learning is expected, not a fault. Whether the cut to k kept the skill is what the end ◆ "
    "says (a region that fitted only far above k can lose it there); the budget-true learner grafts exactly k in "
    "every step and stays at or below k."
)


def method_info(name: str) -> str:
    info = get_method(name)
    data = "uses training examples" if info.needs_data else "data-free"
    return f"**{info.label}** ({data}): {info.description}"


def method_choices() -> list[tuple[str, str]]:
    return [(m.label, name) for name, m in METHODS.items()]


def render_localize(job) -> list:
    k = next((p["k"] for p in reversed(job.progress) if "k" in p), None) if job is not None else None
    stability = (job.result or {}).get("stability") if job is not None else None
    heatmap = (gr.update(value=figures.stability_heatmap(stability, [f"seed {e['seed']}" for e in job.result["seeds"]]),
                         visible=True) if stability else gr.update(value=None, visible=False))
    made = gr.update(visible=bool(forms.seeds_made(job)))
    seeds = (gr.update(value=tables.seeds_table(job.result), visible=True) if stability else
             gr.update(value=None, visible=False))
    if job is None:
        return [figures.empty_figure("Press Run to learn a region; its loss, accuracy and size appear here step by step."),
                heatmap, made, seeds]
    if job.status in ("done",) and not any("step" in p or "heldout" in p for p in job.progress):
        return [figures.empty_figure(f"{job.title}: a data-free method, so there are no mask steps to plot."), heatmap,
                made, seeds]
    return [figures.localize_progress(job.progress, k=k, title=job.title), heatmap, made, seeds]


def on_budget(log_s, base, finetuned):
    return forms.budget_text(log_s, store.known_counts(base, finetuned))


def build(page) -> gr.Tab:
    d, method = page.defaults, LocalizeRequest.defaults()["method"]
    with gr.Tab("Localize", elem_id="tab-localize") as tab:
        gr.Markdown(INTRO)
        with gr.Row():
            loc_method = gr.Dropdown(method_choices(), value=method, label="Method", elem_id="localize-method")
            loc_method_md = gr.Markdown(method_info(method), elem_id="localize-method-info")
        with gr.Row():
            loc_budget = gr.Slider(-5, -1, value=d["log_sparsity"], step=0.25, label="Budget: log10 of sparsity",
                                   info="−5 = 0.001 % of graftable parameters, −1 = 10 %", elem_id="localize-budget")
            loc_budget_md = gr.Markdown(on_budget(d["log_sparsity"], DEFAULT_BASE, DEFAULT_FINETUNED),
                                        elem_id="localize-budget-info")
            loc_keep = gr.Number(0, minimum=0, maximum=1, label="Size the skill needs: keep this share of the gain",
                                 info="0: the budget above. 0.9: the smallest region that keeps 90 % of what fine-tuning "
                                      "gained on held-out examples, searched from the budget (a few localizations)",
                                 elem_id="localize-keep")
        with gr.Row():
            loc_steps = gr.Number(d["steps"], precision=0, label="Mask steps", elem_id="localize-steps")
            loc_epc = gr.Number(d["examples_per_class"], precision=0, label="Training examples per class",
                                info=f"k-shot sample for mask learning; {DEFAULT_EXAMPLES_PER_CLASS} (the default) takes "
                                     "all there are when a class has fewer, another number is used exactly",
                                elem_id="localize-examples")
            loc_lr = gr.Number(d["mask_lr"], label="Mask learning rate (logit units per step)", elem_id="localize-lr")
            loc_seeds = seeds_box("localize-seeds", "one region per seed (k-shot sample and batches), then their "
                                  "core, union and how alike they are against chance")
        with gr.Row():
            loc_run = gr.Button("Run", variant="primary", elem_id="localize-run", scale=0)
            loc_cancel = gr.Button("Cancel", variant="secondary", interactive=False, elem_id="localize-cancel",
                                         scale=0)
            loc_job = job_picker(LATEST, "localize")
        loc_status = gr.Markdown("", elem_id="localize-status")
        page.report("localize", loc_job, KINDS)
        loc_plot = gr.Plot(render_localize(None)[0], label="Mask learning, live", elem_id="localize-plot")
        gr.Markdown(PLOT_NOTE, elem_id="localize-plot-note")
        loc_stability = gr.Plot(None, label="Stability across seeds", visible=False, elem_id="localize-stability")
        loc_seed_table = gr.Dataframe(None, label="The seeds' regions, their mean ± spread, core and union",
                                      visible=False, interactive=False, wrap=True, elem_id="localize-seeds-table")
        loc_core = gr.Button("Score the core and the union beside the seeds (shown on Compare)", size="sm",
                             visible=False, elem_id="localize-score-core", scale=0, min_width=300)
        where = "in this browser's workspace" if settings.hosted() else f"under `{store.regions_dir()}`"
        gr.Markdown(f"### Saved regions\nEvery finished job is saved as a skill patch {where} and listed here, also "
                    "after a restart.")
        page.region_table = gr.Dataframe(library.region_list_rows(), interactive=False, elem_id="region-list")

    page.budget, page.budget_info, page.mask = loc_budget, loc_budget_md, (loc_steps, loc_epc, loc_lr)
    page.keep(method=loc_method, log_sparsity=loc_budget, steps=loc_steps, examples_per_class=loc_epc, mask_lr=loc_lr,
              seeds=loc_seeds, keep_share=loc_keep)

    for ev in (loc_budget.change, page.base.change, page.finetuned.change, tab.select):
        page.on(ev, page.quiet(lambda a, b, c: (on_budget(a, b, c), gr.skip())), [loc_budget, page.base, page.finetuned],
                [loc_budget_md, page.status])
    page.on(loc_method.change, page.safe(lambda m: (method_info(m), gr.skip())), [loc_method],
            [loc_method_md, page.status])

    def on_task(task):  # the sample is counted per class, or in prompts, as the task's kind counts it
        return gr.update(label=app_of(named_kind(task) or CLASSIFICATION).sample_label), gr.skip()

    for ev in (page.task.change, tab.select):
        page.on(ev, page.quiet(on_task), [page.task], [loc_epc, page.status], show_progress="hidden")

    @page.guard(beside=loc_status, method=loc_method, sparsity=loc_budget, k=loc_budget, steps=loc_steps,
                examples_per_class=loc_epc, lr=loc_lr, seeds=loc_seeds, keep=loc_keep)
    def on_localize(base, finetuned, task, text, pair, label, method, log_s, steps, epc, lr, head, template, words,
                    seeds, keep):
        job = forms.submit_localize(store.runner(), base=base, finetuned=finetuned, task=task,
                                      columns={**forms.data_columns(task, text, pair, label),
                                               **forms.prompt_fields(head, template, words)},
                                      method=method, log_sparsity=log_s, steps=steps, examples_per_class=epc, lr=lr,
                                      seeds=seeds, keep=keep)
        return submitted(job, KINDS, LATEST)

    page.on(loc_run.click, on_localize, [page.base, page.finetuned, page.task, *page.columns, loc_method, loc_budget,
                                         *page.mask, *page.prompt, loc_seeds, loc_keep],
            [page.status, loc_job, loc_status])
    page.cancel(loc_cancel, loc_job, KINDS)
    page.shows("localize", loc_job, [loc_method, loc_budget, *page.mask, loc_seeds, loc_keep])
    page.panel("localize", KINDS, loc_job, loc_status, [loc_plot, loc_stability, loc_core, loc_seed_table],
               render_localize, LATEST)

    @page.guard(beside=loc_status)
    def on_score_core(picked):  # the comparison's table is the Compare tab's; the banner names its job
        return jobwords.submitted_line(forms.submit_seed_regions(store.runner(), jobwords.shown_job(
            store.runner(), picked, KINDS))), gr.skip()

    page.on(loc_core.click, on_score_core, [loc_job], [page.status, loc_status])
    return tab
