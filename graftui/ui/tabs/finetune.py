"""Fine-tune: make a fine-tuned model from a base, on the task chosen on the Models tab."""

from __future__ import annotations

import gradio as gr

from ... import figures
from ...config import DEFAULT_BASE, DEFAULT_TASK, INTERACTIVE, LR_FOR
from ...paths import short_ref
from ...requests import FinetuneRequest
from .. import forms, store
from ..wiring import job_picker, request_radio, submitted

INTRO = (
    "No fine-tuned model yet? Make one from the base on the task chosen in **Models**. "
    "The paper's SGD recipe leaves movement that a tiny region captures; AdamW needs an ℓ1 penalty on movement to do "
    "the same."
)
OPTIMIZERS = {"sgd": "SGD (paper recipe)", "adamw": "AdamW + ℓ1 movement penalty"}
KINDS, LATEST = ("finetune", "prepare"), "latest fine-tuning job"


def render_finetune(job) -> list:
    if job is None:
        return [figures.empty_figure("Press Fine-tune to train; the loss and accuracy appear here step by step.")]
    return [figures.finetune_progress(job.progress, title=job.title)]


def on_task(task):
    return f"Task: **{short_ref(task) or '?'}**, as chosen on the **Models** tab (its column mapping too)."


def build(page) -> gr.Tab:
    d, ft = page.defaults, FinetuneRequest.defaults()
    with gr.Tab("Fine-tune", elem_id="tab-finetune") as tab:
        gr.Markdown(INTRO)
        with gr.Row():
            ftn_base = gr.Dropdown(store.checkpoint_choices(include_base=True), value=DEFAULT_BASE, allow_custom_value=True,
                                   label="Base model to fine-tune", elem_id="finetune-base")
            ftn_task_md = gr.Markdown(on_task(DEFAULT_TASK), elem_id="finetune-task")
        with gr.Row():
            ftn_opt = request_radio(FinetuneRequest, "optimizer", OPTIMIZERS, label="Optimizer",
                                    elem_id="finetune-optimizer")
            ftn_lr = gr.Number(d["ft_lr"], label="Learning rate",
                               info=f"SGD ≈ {LR_FOR['sgd']:g}; AdamW ≈ {LR_FOR['adamw']:g}", elem_id="finetune-lr")
            ftn_l1 = gr.Number(ft["l1"], label="ℓ1 coefficient on |θ − θ_pre| (AdamW only)", visible=False,
                               elem_id="finetune-l1")
        with gr.Row():
            ftn_epochs = gr.Slider(1, 10, value=d["ft_epochs"], step=1, label="Epochs", elem_id="finetune-epochs")
            ftn_n = gr.Number(d["ft_train_examples"], precision=0, label="Training examples (stratified subsample; 0 = all)",
                              elem_id="finetune-examples")
            ftn_rank = gr.Number(ft["lora_rank"], precision=0, minimum=0, label="LoRA rank (0: the whole model)",
                                 info="completion tasks: an adapter on every linear layer; wants about 10× the lr",
                                 elem_id="finetune-lora-rank")
        with gr.Row():
            ftn_run = gr.Button("Fine-tune", variant="primary", elem_id="finetune-run", scale=0)
            ftn_cancel = gr.Button("Cancel", variant="secondary", interactive=False, elem_id="finetune-cancel",
                                         scale=0)
            ftn_job = job_picker(LATEST, "finetune")
        ftn_status = gr.Markdown("", elem_id="finetune-status")
        ftn_plot = gr.Plot(render_finetune(None)[0], label="Training curves", elem_id="finetune-plot")

    page.checkpoint_pickers.append((ftn_base, True))
    page.keep(ft_optimizer=ftn_opt, ft_lr=ftn_lr, ft_epochs=ftn_epochs, ft_examples=ftn_n, ft_lora_rank=ftn_rank)

    def on_optimizer(opt):
        if opt == "adamw":
            return gr.update(value=LR_FOR["adamw"]), gr.update(visible=True, value=INTERACTIVE["l1"])
        return gr.update(value=d["ft_lr"]), gr.update(visible=False, value=ft["l1"])

    page.on(ftn_opt.change, on_optimizer, [ftn_opt], [ftn_lr, ftn_l1])
    page.on(page.task.change, on_task, [page.task], [ftn_task_md], show_progress="hidden")
    # the base follows the pair picked on Models: a SmolLM2 pair is fine-tuned from SmolLM2 unless asked otherwise
    page.on(page.base.change, lambda base: gr.update(value=base) if base else gr.skip(), [page.base], [ftn_base],
            show_progress="hidden")

    @page.guard(beside=ftn_status, base=ftn_base, optimizer=ftn_opt, lr=ftn_lr, l1=ftn_l1, epochs=ftn_epochs,
                train_examples=ftn_n, lora_rank=ftn_rank)
    def on_finetune(base, task, text, pair, label, opt, lr, l1, epochs, n, rank, head, template, words):
        job = forms.submit_finetune(store.runner(), base=base, task=task,
                                    columns={**forms.data_columns(task, text, pair, label),
                                             **forms.prompt_fields(head, template, words)},
                                    optimizer=opt, lr=lr, epochs=epochs, train_examples=n, l1=l1, lora_rank=rank)
        return submitted(job, KINDS, LATEST)

    page.on(ftn_run.click, on_finetune, [ftn_base, page.task, *page.columns, ftn_opt, ftn_lr, ftn_l1, ftn_epochs, ftn_n,
                                         ftn_rank, *page.prompt], [page.status, ftn_job, ftn_status])
    page.cancel(ftn_cancel, ftn_job, KINDS)
    page.shows("finetune", ftn_job, [ftn_opt, ftn_lr, ftn_epochs, ftn_n, ftn_rank])
    page.panel("finetune", KINDS, ftn_job, ftn_status, [ftn_plot], render_finetune, LATEST)
    return tab
