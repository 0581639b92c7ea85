"""Models: the pair (base and fine-tuned model), how a language model is read, the task and its OOD tasks.

Every other tab runs on these choices, so the widgets go on the :class:`~graftui.ui.wiring.Page`.
"""

from __future__ import annotations

import gradio as gr
import pandas as pd

from ... import settings
from ...config import DEFAULT_BASE, DEFAULT_FINETUNED, DEFAULT_TASK
from ...tasks.classification.data import OFFLINE_TASKS
from ...paths import short_ref
from ...requests import EvaluateRequest, LoadFields, choices_of
from ...kinds import KINDS
from .. import forms, store, tables
from ..kinds import app_of
from ..wiring import guarded, skip_none

INTRO = (
    "A **pair** is a pre-trained base θ_pre and a fine-tuned model θ_ft of the same architecture. "
    "Grafting keeps θ_pre everywhere except in a tiny region γ, where it takes θ_ft's values: "
    "θ_pre + γ⊙(θ_ft − θ_pre). Pick the pair and the task here; the other tabs use these choices."
)


UNCHECKED = "Press **Check pair** to load both models and count their parameters."


def task_choices() -> list[tuple[str, str]]:
    """Every task of every kind that needs no download (a kind other than classification named beside it), then the
    uploads."""
    return [(f"{name} ({kind.name}): {about}" if app_of(kind).named_in_lists else f"{name}: {about}", name)
            for kind in KINDS.values() for name, about in kind.offline().items()] + store.upload_choices()


def ood_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in OFFLINE_TASKS] + store.upload_choices()


def build(page) -> gr.Tab:
    with gr.Tab("Models", elem_id="tab-models") as tab:
        gr.Markdown(INTRO)
        with gr.Row():
            base_dd = gr.Dropdown(store.checkpoint_choices(include_base=True), value=DEFAULT_BASE, allow_custom_value=True,
                                  label="Base model θ_pre", info="offline default, a checkpoint made here, a Hub id"
                                  + ("" if settings.hosted() else " or a local folder"), elem_id="models-base")
            ft_dd = gr.Dropdown(store.checkpoint_choices(), value=DEFAULT_FINETUNED, allow_custom_value=True,
                                label="Fine-tuned model θ_ft", info="must share the base's architecture",
                                elem_id="models-finetuned")
        with gr.Row():
            check_btn = gr.Button("Check pair", variant="primary", elem_id="models-check", scale=0)
            pair_md = gr.Markdown(UNCHECKED, elem_id="models-pair-info")
        counts_df = gr.Dataframe(tables.counts_table({}), label="Parameter counts of the pair", interactive=False,
                                 elem_id="models-counts")
        with gr.Accordion("Language models: prompt and label words", open=False, elem_id="models-prompt") as prompt_acc:
            gr.Markdown("A causal or masked LM (e.g. `smollm2`) is read as the paper does: the example inside a "
                        "template, each class scored by its label word under the LM's own fixed head. Leave the "
                        "fields empty to use the checkpoint's own prompt, else `{text} It was` and each label's "
                        "name as its word (said in every result).")
            with gr.Row():
                prompt_head = gr.Dropdown(list(choices_of(LoadFields, "head")), value=LoadFields.defaults()["head"],
                                          label="Read the models as", info="auto: their own kind",
                                          elem_id="models-prompt-head", scale=0)
                prompt_template = gr.Textbox("", label="Template", placeholder="{text} It was",
                                             info="{text}, optional {text_pair}; {mask} for a masked LM",
                                             elem_id="models-prompt-template")
                prompt_words = gr.Textbox("", label="Label words", placeholder="negative= bad,positive= good",
                                          info="label=word pairs, words verbatim (leading space included)",
                                          elem_id="models-prompt-words")
            with gr.Row():
                preview_btn = gr.Button("Preview prompt", elem_id="models-prompt-preview", scale=0)
                preview_md = gr.Markdown("", elem_id="models-prompt-info")
        gr.Markdown("### Task")
        with gr.Row():
            task_dd = gr.Dropdown(task_choices(), value=DEFAULT_TASK, allow_custom_value=True, label="Task (in-distribution)",
                                  info="offline task, an uploaded file or a Hugging Face dataset id", elem_id="models-task")
            ood_dd = gr.Dropdown(ood_choices(), value=EvaluateRequest.make().ood_tasks(DEFAULT_TASK), multiselect=True,
                                 allow_custom_value=True, label="Out-of-distribution tasks",
                                 info="offline tasks and uploaded files", elem_id="models-ood")
        task_md = gr.Markdown("", elem_id="models-task-info")
        with gr.Row():
            ood_map = gr.Textbox("", label="OOD label mapping (optional)", placeholder="0=negative, 1=positive",
                                 info="old=new pairs; default: equal names, integer labels 0…n−1 by position",
                                 elem_id="models-ood-labels")
            ood_md = gr.Markdown("", elem_id="models-ood-info")
        with gr.Accordion("Upload a dataset (CSV, TSV, JSONL, JSON, Parquet)", open=False):
            gr.Markdown(f"Uploads up to {settings.MAX_UPLOAD_MB:g} MB. Pick which column holds the text, the optional "
                        "second text (for pair tasks) and the label; a single file is split into train / validation / "
                        "test with a fixed seed.")
            data_file = gr.File(label="Dataset file", file_types=list(store.DATA_SUFFIXES), elem_id="models-data-upload")
            with gr.Row():
                text_col = gr.Dropdown(["(guess)"], value="(guess)", label="Text column", elem_id="models-text-col")
                pair_col = gr.Dropdown(["(none)"], value="(none)", label="Second text column (pair tasks)",
                                       elem_id="models-pair-col")
                label_col = gr.Dropdown(["(guess)"], value="(guess)", label="Label column", elem_id="models-label-col")
            data_preview = gr.Dataframe(pd.DataFrame(columns=["(upload a file)"]), label="First rows of the file",
                                        interactive=False, elem_id="models-data-preview")
            with gr.Row():
                mapping_btn = gr.Button("Check column mapping", elem_id="models-data-check", scale=0)
                mapping_md = gr.Markdown("", elem_id="models-data-info")

    page.base, page.finetuned, page.task, page.ood, page.ood_labels = base_dd, ft_dd, task_dd, ood_dd, ood_map
    page.columns, page.prompt = (text_col, pair_col, label_col), (prompt_head, prompt_template, prompt_words)
    page.checkpoint_pickers += [(base_dd, True), (ft_dd, False)]
    page.keep(base=base_dd, finetuned=ft_dd, task=task_dd, ood=ood_dd, ood_labels=ood_map, text_column=text_col,
              pair_column=pair_col, label_column=label_col, head=prompt_head, template=prompt_template,
              label_words=prompt_words)
    columns, status = forms.data_columns, page.status

    @page.guard(beside=pair_md)
    def on_check(base, finetuned, log_s, task, text, pair, label, head, template, words):
        desc = forms.check_pair(base, finetuned, forms.prompt_fields(head, template, words), task,
                                  columns(task, text, pair, label))
        counts = {k: desc[f"{k}_params"] for k in ("graftable", "head", "excluded", "total")}
        read = (f"head = {', '.join(desc['head_tensors']) or 'none'}" if desc["prompt"] is None else
                f"a {desc['kind']} read through its prompt `{desc['prompt']['template']}`, label words "
                + ", ".join(f"{lab} → `{w!r}`" for lab, w in zip(desc["prompt"]["labels"], desc["prompt"]["words"]))
                + (" (chosen from the label names)" if desc["prompt"]["chosen"] else "")
                + "; its own LM head and the embeddings stay fixed")
        info = (f"✓ **{desc['architecture']}** pair: base `{short_ref(base)}`, fine-tuned `{short_ref(finetuned)}`, "
                f"labels {', '.join(desc['labels'])}; {desc['graftable_tensors']} graftable tensors, {read}.")
        return (tables.counts_table(counts), info, "✓ Pair checked.", forms.budget_text(log_s, counts),
                gr.update(open=True) if desc["prompt"] is not None else gr.skip())

    page.after_tabs(lambda: page.on(  # the check also sizes the Localize tab's budget
        check_btn.click, on_check, [base_dd, ft_dd, page.budget, task_dd, *page.columns, *page.prompt],
        [counts_df, pair_md, status, page.budget_info, prompt_acc]))

    @page.quiet
    def on_finetuned(finetuned, log_s):
        """A fine-tuned model picked by hand brings the base and task it was made from, and their OOD tasks and
        budget; the last pair check is of another pair."""
        made = forms.pair_of(finetuned)
        base, task = made if made else (None, None)
        return (skip_none(base), skip_none(task), forms.default_ood(task) if task else gr.skip(),
                skip_none(forms.budget_for(task, log_s) if task else None), UNCHECKED, tables.counts_table({}),
                gr.skip())

    @page.quiet
    def on_task(task, log_s):
        """A task picked by hand brings its OOD tasks (none for a completion task) and its kind's budget."""
        return forms.default_ood(task), skip_none(forms.budget_for(task, log_s)), gr.skip()

    page.after_tabs(lambda: page.on(ft_dd.input, on_finetuned, [ft_dd, page.budget],  # a restored form keeps its own
                                    [base_dd, task_dd, ood_dd, page.budget, pair_md, counts_df, status]))
    page.after_tabs(lambda: page.on(task_dd.input, on_task, [task_dd, page.budget], [ood_dd, page.budget, status]))

    @page.guard(beside=preview_md)
    def on_preview(finetuned, task, text, pair, label, head, template, words):
        p = forms.preview_prompt(finetuned, task, columns(task, text, pair, label),
                                   forms.prompt_fields(head, template, words))
        tokens = "; ".join(f"{lab}: `{' '.join(map(repr, toks))}`" for lab, toks in p["label_tokens"].items())
        return (f"**{p['describe']}**\n\nFirst training example as the model reads it:\n\n```\n{p['prompt']}\n```\n\n"
                f"Label tokens ({p['scored']} is scored): {tokens}"), "✓ Prompt previewed."

    page.on(preview_btn.click, on_preview, [ft_dd, task_dd, *page.columns, *page.prompt], [preview_md, status])

    @page.guard(beside=mapping_md)
    def on_data_upload(file):
        if not file:
            return (gr.skip(),) * 8
        path, info = forms.read_data_upload(file)
        cols, guess = info["columns"], info["guess"]
        md, line = forms.upload_summary(path, info)
        return (
            gr.update(choices=task_choices(), value=str(path)), gr.update(choices=ood_choices()),
            gr.update(choices=["(guess)", *cols], value=guess.text_column or "(guess)"),
            gr.update(choices=["(none)", *cols], value=guess.pair_column or "(none)"),
            gr.update(choices=["(guess)", *cols], value=guess.label_column or "(guess)"),
            pd.DataFrame(info["rows"]), md, line,
        )

    page.on(data_file.upload, on_data_upload, [data_file], [task_dd, ood_dd, *page.columns, data_preview, mapping_md,
                                                               status])

    @guarded(ood_md, toast=False, fields=page.named())  # the message stays beside the mapping that caused it
    def on_ood(task, text, pair, label, ood, mapping):
        return forms.ood_preview(task, columns(task, text, pair, label), ood or [], mapping)

    for event in (ood_dd.change, ood_map.submit, ood_map.blur, task_dd.change):
        page.on(event, on_ood, [task_dd, *page.columns, ood_dd, ood_map], [ood_md], show_progress="hidden")

    @page.guard(beside=mapping_md)
    def on_check_mapping(task, text, pair, label):
        checked = forms.task_check(task, columns(task, text, pair, label))  # a harness task: no columns to map
        if checked is not None:
            return checked, "✓ Task checked."
        t = forms.load_task_checked(task, columns(task, text, pair, label))
        return forms.task_summary(t), "✓ Column mapping checked."

    @guarded(task_md, toast=False, fields=page.named())  # its one-line error stays beside the task that caused it
    def on_task_named(task, text, pair, label):
        """A task named in the box that its kind checks on sight (a harness task YAML or lm-eval name) is read as
        a job will read it, and its first test document shown; any other task is checked with its columns."""
        return forms.task_check(task, columns(task, text, pair, label)) or ""

    page.on(task_dd.change, on_task_named, [task_dd, *page.columns], [task_md], show_progress="hidden")

    page.on(mapping_btn.click, on_check_mapping, [task_dd, *page.columns], [mapping_md, status])
    return tab
