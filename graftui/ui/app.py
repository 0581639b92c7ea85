"""The Gradio Blocks app: layout and wiring only.

Tabs: Models, Fine-tune, Localize, Compare, Anatomy, Compose, Regions, with one jobs panel
below them. Long work goes through the shared JobRunner (``store.runner()``); a gr.Timer polls
it, so a reloaded page sees running and finished jobs. Every handler is wrapped by
:func:`guarded`, which turns any exception into a one-line message (a toast and the
``status-message`` box), never a traceback.
"""

from __future__ import annotations

import math
import functools
import json
import logging
import time
from pathlib import Path

import gradio as gr
import pandas as pd

from .. import figures, flows, regions, settings
from ..config import DEFAULT_BASE, DEFAULT_EXAMPLES_PER_CLASS, DEFAULT_FINETUNED, HEADS, INTERACTIVE, LR_FOR
from ..data import OFFLINE_TASKS, preview
from ..errors import message
from ..hosted import check_rows, check_upload, safe_name, save_upload
from ..localizers import METHODS, get_method
from ..paths import short_ref
from ..regions import settings_of
from ..requests import ContinualRequest, MultitaskRequest, WiseRequest
from . import actions, pagescript, store

OFFLINE_TASK_NAMES = list(OFFLINE_TASKS)

log = logging.getLogger(__name__)

TAB_NAMES = ("Models", "Fine-tune", "Localize", "Compare", "Anatomy", "Compose", "Laboratory", "Regions")
POLL_SECONDS = 2.0  # status lines and job lists: often enough to watch
# A plot redraw costs the browser a few hundred ms of CPU; on a small machine that is taken from the job.
LIVE_REDRAW_SECONDS = 8.0

INTRO = {
    "Models": (
        "A **pair** is a pre-trained base θ_pre and a fine-tuned model θ_ft of the same architecture. "
        "Grafting keeps θ_pre everywhere except in a tiny region γ, where it takes θ_ft's values: "
        "θ_pre + γ⊙(θ_ft − θ_pre). Pick the pair and the task here; the other tabs use these choices."
    ),
    "Fine-tune": (
        "No fine-tuned model yet? Make one from the base on the task chosen in **Models**. "
        "The paper's SGD recipe leaves movement that a tiny region captures; AdamW needs an ℓ1 penalty on movement to do the same."
    ),
    "Localize": (
        "Find the few parameters that carry the skill: a region of k parameters (the budget) whose graft "
        "keeps the fine-tuned model's accuracy. The learned method takes a few mask steps on k examples per class."
    ),
    "Compare": (
        "How good is a graft? Accuracy, F1, calibration (ECE) and agreement with the fine-tuned model, in distribution "
        "and on out-of-distribution tasks, next to random and top-movement regions of the same size."
    ),
    "Anatomy": (
        "Where in the network does a region sit? Counts per transformer layer and module type, "
        "and the density (share of each cell's parameters that the region uses)."
    ),
    "Compose": (
        "Regions of different tasks on one base barely overlap, so their union carries several skills at once. "
        "See the overlap, build the union graft and score it on every task involved."
    ),
    "Laboratory": (
        "The paper's experiments with regions. **Multi-task** (§5.1): one model fine-tuned on several tasks (built "
        "once, a few CPU minutes); each task's region, how much they overlap, how much of each task's skill every "
        "region carries (Eq. 5), and the union of a group of tasks before and after purification. **WiSE** (Fig. 7): "
        "accuracy along θ_pre + α·δ and θ_pre + α·γ⊙δ, in and out of distribution. **Re-training** (Table 1), "
        "**continual learning** (§5.2), and **all of them in one report** at the bottom."
    ),
    "Regions": (
        "Every finished localization is saved as a **skill patch** (region indices + fine-tuned values + head). "
        "Download one, upload one to inspect and use it, or export base + patch as a normal checkpoint."
    ),
}


# -- error handling ----------------------------------------------------------------------------
def friendly_message(err: BaseException) -> str:
    """One line a person can act on (graftui.errors.message); the traceback goes to the server log only."""

    if isinstance(err, gr.Error):
        return str(err.message)
    return message(err)


def guarded(status, toast: bool = True, beside=None):
    """Decorator: run a handler; on any exception show a warning and put the message in ``status``,
    and in ``beside`` too (the message line next to the control that failed, which also loses
    whatever it said before, so no stale "✓" stays).

    The handler's outputs must include ``status`` (and ``beside``); on failure only they are updated
    (Gradio's dict return), every other output keeps its value. Polling handlers pass
    ``toast=False`` so a persistent problem does not raise a toast every second.
    """

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - the page must never show a traceback
                log.warning("handler %s failed", fn.__name__, exc_info=True)
                message = friendly_message(err)
                if toast:
                    gr.Warning(message)
                return {status: f"⚠️ {message}", **({beside: f"⚠️ {message}"} if beside is not None else {})}

        return run

    return wrap


# -- small pure helpers (tested without a browser) -------------------------------------------------
TABLE_HEIGHT = 4000  # px: result tables show every row; the page scrolls, not the table
CSS = """
/* headers wrap between words, never inside one; a wide table scrolls sideways instead of clipping */
.gradio-container table th, .gradio-container table th * { word-break: normal !important; overflow-wrap: normal !important;
                                                          hyphens: none; }
.gradio-container .table-wrap { overflow-x: auto !important; }
"""


REGION_LIST_COLUMNS = ["id", "task", "method", "k (params)", "share of graftable", "settings", "content id",
                       "fine-tuned model", "created (UTC)"]


def region_list_rows() -> pd.DataFrame:

    rows, entries = [], store.list_regions()
    digests = [e.digest for e in entries]
    for e in entries:
        m = e.meta
        frac = m.fraction_of_graftable
        rows.append({
            "id": e.id,
            "task": short_ref(m.task or ""),
            "method": m.method or "",
            "k (params)": f"{m.k:,}" if m.k is not None else "",
            "share of graftable": f"{frac:.3%}" if isinstance(frac, (int, float)) else "",
            "settings": " · ".join(settings_of(m)),
            "content id": f"#{e.digest}" + (" (same as another)" if digests.count(e.digest) > 1 else ""),
            "fine-tuned model": short_ref(m.finetuned or ""),
            "created (UTC)": m.created or "",
        })
    return pd.DataFrame(rows, columns=REGION_LIST_COLUMNS)


def method_info(name: str) -> str:

    info = get_method(name)
    data = "uses training examples" if info.needs_data else "data-free"
    return f"**{info.label}** ({data}): {info.description}"


def method_choices() -> list[tuple[str, str]]:

    return [(m.label, name) for name, m in METHODS.items()]


def task_choices() -> list[tuple[str, str]]:

    return [(f"{name}: {desc}", name) for name, desc in OFFLINE_TASKS.items()] + store.upload_choices()


def ood_choices() -> list[tuple[str, str]]:

    return [(name, name) for name in OFFLINE_TASKS] + store.upload_choices()


def default_selection(entries, several: bool) -> list[str]:
    """Region ids a picker starts with: the newest, or for composition up to three newest of its base."""
    if not entries:
        return []
    if not several:
        return [entries[0].id]
    base = entries[0].meta.base
    return [e.id for e in entries if e.meta.base == base][:3]


def render_localize(job) -> list:
    k = next((p["k"] for p in reversed(job.progress) if "k" in p), None) if job is not None else None
    if job is None:
        return [figures.empty_figure("Press Run to learn a region; its loss, accuracy and size appear here step by step.")]
    if job.status in ("done",) and not any("step" in p for p in job.progress):
        return [figures.empty_figure(f"{job.title}: a data-free method, so there are no mask steps to plot.")]
    return [figures.localize_progress(job.progress, k=k, title=job.title)]


def render_finetune(job) -> list:
    if job is None:
        return [figures.empty_figure("Press Fine-tune to train; the loss and accuracy appear here step by step.")]
    return [figures.finetune_progress(job.progress, title=job.title)]


def render_compare(job) -> list:
    empty = pd.DataFrame(columns=actions.COMPARE_COLUMNS)
    if job is None or not job.result:
        msg = "Run a comparison to fill this." if job is None else "Results appear when the job is done."
        return [empty, figures.empty_figure(msg), figures.empty_figure(msg), "", figures.side_by_side(None)]
    res = job.result
    note = f"In-distribution task: **{res['task']}**; OOD tasks: **{', '.join(res['ood']) or 'none'}**. "
    note += ("Accuracy and agreement (with the fine-tuned model's predictions) are shares of the n test examples, with a "
             "95 % Wilson interval; share of FT gain = (graft − bare) / (FT − bare), bare being the pre-trained body with "
             "the fine-tuned head (k = 0); Δ is the accuracy difference to the fine-tuned model on the same task; F1 of "
             "the positive class (macro if more than two); ECE is the expected calibration error over 10 equal-width "
             "confidence bins (lower is better); calibration compares mean confidence with accuracy.")
    if res.get("notes"):
        note += "\n\n" + "\n\n".join(f"Note: {n}" for n in res["notes"])
    return [actions.compare_table(res), figures.reliability_diagram(res["reliability"], res["task"]),
            figures.confidence_histogram(res["histogram"], res["task"]), note, figures.side_by_side(res.get("side_by_side"))]


def render_sweep(job) -> list:
    if job is None or not job.result:
        msg = "Run a sweep to fill this." if job is None else "The curve appears when the sweep is done."
        return [figures.empty_figure(msg), pd.DataFrame(columns=actions.SWEEP_COLUMNS)]
    rows = job.result["rows"]
    return [figures.sweep_figure(rows, short_ref(job.result.get("task", ""))), actions.sweep_table(rows)]


def render_compose(job) -> list:
    if job is None or not job.result:
        return ["" if job is None else "Results appear when the job is done.", pd.DataFrame(columns=actions.COMPOSE_COLUMNS)]
    return [actions.compose_report_text(job.result.get("report")), actions.compose_table(job.result)]


MULTITASK_COLUMNS = ["region", "size", *("task", "relative gain", "accuracy")]


def render_multitask(job) -> list:
    if job is None or not job.result:
        msg = "Run the experiment to fill this." if job is None else "The matrices appear when the job is done."
        return [figures.empty_figure(msg), figures.empty_figure(msg), pd.DataFrame(columns=MULTITASK_COLUMNS), ""]
    res = job.result
    rows = []
    for label, key in (("union", "union"), ("purified union", "purified")):
        u = res.get(key) or {}
        for task, gain, acc in zip(res["tasks"], u.get("relative_gain", []), u.get("accuracy", [])):
            rows.append({"region": f"{label} of {', '.join(u['group'])}", "size": f"{u['size']:,}", "task": task,
                         "relative gain": "–" if gain is None else f"{gain:.3f}", "accuracy": f"{acc:.3f}"})
    note = (f"Multi-task model `{short_ref(res['checkpoint'])}`; every region has k = **{res['k']:,}** parameters. "
            "Relative gain 1 means the graft recovers all of what multi-task fine-tuning gained on that task, 0 none of it.")
    if res.get("notes"):
        note += "\n\n" + "\n\n".join(f"Note: {n}" for n in res["notes"])
    matrix = {"names": res["tasks"], "overlap": res["overlap"], "intersection_counts": res["intersection_counts"],
              "sizes": res["sizes"], "iou": res["overlap"]}
    return [figures.overlap_heatmap(matrix), figures.gain_heatmap(res), pd.DataFrame(rows, columns=MULTITASK_COLUMNS), note]


def render_wise(job) -> list:
    if job is None or not job.result:
        return [figures.wise_curves([])]
    return [figures.wise_curves(job.result["rows"])]


def render_retrain(job) -> list:
    if job is None or not job.result:
        msg = "Run the re-training to fill this." if job is None else "Results appear when the job is done."
        return [pd.DataFrame(columns=actions.COMPARE_COLUMNS), figures.empty_figure(msg)]
    res = job.result
    return [actions.compare_table(res), figures.reliability_diagram(res["reliability"], res["task"])]


CONTINUAL_COLUMNS = ["arm", "stage", "parameters trained", "task", "accuracy"]


def render_continual(job) -> list:
    if job is None or not job.result:
        msg = "Run continual learning to fill this." if job is None else "Results appear when the job is done."
        return [figures.empty_figure(msg), pd.DataFrame(columns=CONTINUAL_COLUMNS)]
    res = job.result
    rows = []
    for arm, key in (("forget-free", "forget_free"), ("sequential", "sequential")):
        for i, stage in enumerate(res["tasks"]):
            for task, acc in zip(res["tasks"], res[key][i]):
                if acc is not None:
                    rows.append({"arm": arm, "stage": f"{i + 1}: {stage}", "parameters trained": f"{res['trained'][arm][i]:,}",
                                 "task": task, "accuracy": f"{acc:.3f}"})
    return [figures.continual_curves(res), pd.DataFrame(rows, columns=CONTINUAL_COLUMNS)]


def render_reproduce(job) -> list:
    """The report's files and its text, once the job is done."""
    if job is None or not job.result:
        return [None, "" if job is None else "The report appears here when the run is done."]
    folder = Path(job.result["out"])
    files = [str(folder / name) for name in ("report.md", "report.json") if (folder / name).exists()]
    text = (folder / "report.md").read_text() if (folder / "report.md").exists() else "The report file is gone."
    return [files or None, text]


def render_export(job) -> list:
    if job is None or not job.result:
        return [None]
    return [job.result.get("zip")]


def anatomy_outputs(region_id: str, mode: str) -> list:
    result = actions.anatomy_of(region_id)
    record, anat = result.record, result.anatomy
    m = record.meta
    summary = (f"Region **{region_id}**: k = **{record.size:,}** of {record.graftable:,} graftable parameters "
               f"({record.size / max(record.graftable, 1):.4%}); method {m.method or '?'}, task {m.task or '?'}, "
               f"fine-tuned model {short_ref(m.finetuned or '?')}.")
    return [figures.anatomy_heatmap(anat, mode), figures.module_bars(anat), actions.weight_bias_table(anat), summary]


# -- the app -------------------------------------------------------------------------------------
def build_app() -> gr.Blocks:

    d = store.defaults()
    hosted = settings.hosted()
    ood_default = [t for t in ("amazon", "tweets") if t in OFFLINE_TASKS]
    mode_note = " · hosted mode: server paths are refused, uploads are capped" if hosted else ""
    fast_note = " · small-data mode (GRAFTUI_FAST)" if store.fast() else ""

    # hosted: Gradio's copies of uploads and downloads are removed after an hour
    with gr.Blocks(title="graftui · skill localization by grafting", delete_cache=(3600, 3600) if hosted else None) as demo:
        gr.Markdown(
            "# graftui · skill localization by grafting\n"
            "Find the tiny region of a fine-tuned language model that carries its skill "
            "(Panigrahi, Saunshi, Zhao & Arora, *Task-Specific Skill Localization in Fine-tuned Language Models*, ICML 2023)."
            f"{mode_note}{fast_note}"
        )
        status = gr.Markdown("Loading…", elem_id="status-message")
        safe = guarded(status)
        quiet = guarded(status, toast=False)
        # The page's session id (hosted mode), issued on load and kept by the browser, encrypted.
        sid = gr.BrowserState("", storage_key="graftui-session", secret=store.browser_secret())

        def on(event, fn, inputs, outputs, **kwargs):
            """Wire ``fn`` to ``event`` as this page's session: the id travels with the inputs and is entered
            around the call, so everything ``fn`` lists, reads, writes or submits is the session's own."""
            return event(in_session(fn), [sid, *(inputs or [])], outputs, **kwargs)

        with gr.Tabs(elem_id="tabs"):
            # ---------------------------------------------------------------- Models
            with gr.Tab("Models", elem_id="tab-models") as models_tab:
                gr.Markdown(INTRO["Models"])
                with gr.Row():
                    base_dd = gr.Dropdown(store.checkpoint_choices(include_base=True), value=DEFAULT_BASE, allow_custom_value=True,
                                          label="Base model θ_pre", info="offline default, a checkpoint made here, a Hub id"
                                          + ("" if hosted else " or a local folder"), elem_id="models-base")
                    ft_dd = gr.Dropdown(store.checkpoint_choices(), value=DEFAULT_FINETUNED, allow_custom_value=True,
                                        label="Fine-tuned model θ_ft", info="must share the base's architecture", elem_id="models-finetuned")
                with gr.Row():
                    check_btn = gr.Button("Check pair", variant="primary", elem_id="models-check", scale=0)
                    pair_md = gr.Markdown("Press **Check pair** to load both models and count their parameters.", elem_id="models-pair-info")
                counts_df = gr.Dataframe(actions.counts_table({}), label="Parameter counts of the pair", interactive=False,
                                         elem_id="models-counts")
                with gr.Accordion("Language models: prompt and label words", open=False,
                                  elem_id="models-prompt") as prompt_acc:
                    gr.Markdown("A causal or masked LM (e.g. `smollm2`) is read as the paper does: the example inside a "
                                "template, each class scored by its label word under the LM's own fixed head. Leave the "
                                "fields empty to use the checkpoint's own prompt, else `{text} It was` and each label's "
                                "name as its word (said in every result).")
                    with gr.Row():
                        prompt_head = gr.Dropdown(list(HEADS), value="auto", label="Read the models as",
                                                  info="auto: their own kind", elem_id="models-prompt-head", scale=0)
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
                    task_dd = gr.Dropdown(task_choices(), value="movies", allow_custom_value=True, label="Task (in-distribution)",
                                          info="offline task, an uploaded file or a Hugging Face dataset id", elem_id="models-task")
                    ood_dd = gr.Dropdown(ood_choices(), value=ood_default, multiselect=True, allow_custom_value=True,
                                         label="Out-of-distribution tasks", info="offline tasks and uploaded files",
                                         elem_id="models-ood")
                with gr.Row():
                    ood_map = gr.Textbox("", label="OOD label mapping (optional)", placeholder="0=negative, 1=positive",
                                         info="old=new pairs; default: equal names, integer labels 0…n−1 by position",
                                         elem_id="models-ood-labels")
                    ood_md = gr.Markdown("", elem_id="models-ood-info")
                with gr.Accordion("Upload a dataset (CSV, TSV, JSONL, JSON, Parquet)", open=False):
                    gr.Markdown(f"Uploads up to {settings.MAX_UPLOAD_MB:g} MB. Pick which column holds the text, the optional "
                                "second text (for pair tasks) and the label; a single file is split into train / validation / test with a fixed seed.")
                    data_file = gr.File(label="Dataset file", file_types=list(store.DATA_SUFFIXES), elem_id="models-data-upload")
                    with gr.Row():
                        text_col = gr.Dropdown(["(guess)"], value="(guess)", label="Text column", elem_id="models-text-col")
                        pair_col = gr.Dropdown(["(none)"], value="(none)", label="Second text column (pair tasks)", elem_id="models-pair-col")
                        label_col = gr.Dropdown(["(guess)"], value="(guess)", label="Label column", elem_id="models-label-col")
                    data_preview = gr.Dataframe(pd.DataFrame(columns=["(upload a file)"]), label="First rows of the file", interactive=False,
                                                elem_id="models-data-preview")
                    with gr.Row():
                        mapping_btn = gr.Button("Check column mapping", elem_id="models-data-check", scale=0)
                        mapping_md = gr.Markdown("", elem_id="models-data-info")

            # ---------------------------------------------------------------- Fine-tune
            with gr.Tab("Fine-tune", elem_id="tab-finetune") as finetune_tab:
                gr.Markdown(INTRO["Fine-tune"])
                with gr.Row():
                    ftn_base = gr.Dropdown(store.checkpoint_choices(include_base=True), value=DEFAULT_BASE, allow_custom_value=True,
                                           label="Base model to fine-tune", elem_id="finetune-base")
                    ftn_task_md = gr.Markdown("Task: **movies**, as chosen on the **Models** tab (its column mapping too).",
                                              elem_id="finetune-task")
                with gr.Row():
                    ftn_opt = gr.Radio([("SGD (paper recipe)", "sgd"), ("AdamW + ℓ1 movement penalty", "adamw")], value="sgd",
                                       label="Optimizer", elem_id="finetune-optimizer")
                    ftn_lr = gr.Number(d["ft_lr"], label="Learning rate", info=f"SGD ≈ {LR_FOR['sgd']:g}; AdamW ≈ {LR_FOR['adamw']:g}", elem_id="finetune-lr")
                    ftn_l1 = gr.Number(0.0, label="ℓ1 coefficient on |θ − θ_pre| (AdamW only)", visible=False, elem_id="finetune-l1")
                with gr.Row():
                    ftn_epochs = gr.Slider(1, 10, value=d["ft_epochs"], step=1, label="Epochs", elem_id="finetune-epochs")
                    ftn_n = gr.Number(d["ft_train_examples"], precision=0, label="Training examples (stratified subsample; 0 = all)",
                                      elem_id="finetune-examples")
                with gr.Row():
                    ftn_run = gr.Button("Fine-tune", variant="primary", elem_id="finetune-run", scale=0)
                    ftn_cancel = gr.Button("Cancel", variant="stop", elem_id="finetune-cancel", scale=0)
                    ftn_job = job_picker("latest fine-tuning job", "finetune")
                ftn_status = gr.Markdown("", elem_id="finetune-status")
                ftn_plot = gr.Plot(render_finetune(None)[0], label="Training curves", elem_id="finetune-plot")

            # ---------------------------------------------------------------- Localize
            with gr.Tab("Localize", elem_id="tab-localize") as localize_tab:
                gr.Markdown(INTRO["Localize"])
                with gr.Row():
                    loc_method = gr.Dropdown(method_choices(), value="learned", label="Method", elem_id="localize-method")
                    loc_method_md = gr.Markdown(method_info("learned"), elem_id="localize-method-info")
                with gr.Row():
                    loc_budget = gr.Slider(-5, -1, value=d["log_sparsity"], step=0.25, label="Budget: log10 of sparsity",
                                           info="−5 = 0.001 % of graftable parameters, −1 = 10 %", elem_id="localize-budget")
                    loc_budget_md = gr.Markdown(actions.budget_text(d["log_sparsity"], store.known_counts(DEFAULT_BASE, DEFAULT_FINETUNED)),
                                                elem_id="localize-budget-info")
                with gr.Row():
                    loc_steps = gr.Number(d["steps"], precision=0, label="Mask steps", elem_id="localize-steps")
                    loc_epc = gr.Number(d["examples_per_class"], precision=0, label="Training examples per class",
                                        info=f"k-shot sample for mask learning; {DEFAULT_EXAMPLES_PER_CLASS} (the default) takes all "
                                             "there are when a class has fewer, another number is used exactly",
                                        elem_id="localize-examples")
                    loc_lr = gr.Number(d["mask_lr"], label="Mask learning rate (logit units per step)", elem_id="localize-lr")
                with gr.Row():
                    loc_run = gr.Button("Run", variant="primary", elem_id="localize-run", scale=0)
                    loc_cancel = gr.Button("Cancel", variant="stop", elem_id="localize-cancel", scale=0)
                    loc_job = job_picker("latest localize job", "localize")
                loc_status = gr.Markdown("", elem_id="localize-status")
                reports = [report_controls("localize", loc_job, ("localize",))]
                loc_plot = gr.Plot(render_localize(None)[0], label="Mask learning, live", elem_id="localize-plot")
                gr.Markdown("### Saved regions\nEvery finished job is saved as a skill patch under "
                            f"`{store.regions_dir()}` and listed here, also after a restart.")
                region_table = gr.Dataframe(region_list_rows(), interactive=False, elem_id="region-list")

            # ---------------------------------------------------------------- Compare
            with gr.Tab("Compare", elem_id="tab-compare") as compare_tab:
                gr.Markdown(INTRO["Compare"])
                with gr.Row():
                    cmp_regions = gr.Dropdown(store.region_choices(), allow_custom_value=True, multiselect=True,
                                              label="Regions to evaluate (same fine-tuned model)",
                                              elem_id="compare-regions")
                    cmp_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="compare-n")
                    cmp_base = gr.Checkbox(True, label="Add top-movement and random regions of the same k", elem_id="compare-baselines")
                gr.Markdown("The in-distribution task is the one each region was learned on; OOD tasks come from the **Models** tab.")
                with gr.Row():
                    cmp_run = gr.Button("Evaluate", variant="primary", elem_id="compare-run", scale=0)
                    cmp_job = job_picker("latest comparison", "compare")
                cmp_status = gr.Markdown("", elem_id="compare-status")
                reports.append(report_controls("compare", cmp_job, ("compare",)))
                cmp_table = gr.Dataframe(pd.DataFrame(columns=actions.COMPARE_COLUMNS), interactive=False, wrap=True,
                                         max_height=TABLE_HEIGHT, column_widths=actions.COMPARE_WIDTHS,
                                         label="Fine-tuned vs grafts vs baselines", elem_id="compare-table")
                cmp_note = gr.Markdown("", elem_id="compare-note")
                cmp_side = gr.Plot(figures.side_by_side(None), elem_id="compare-side-by-side")
                with gr.Row():
                    cmp_rel = gr.Plot(figures.empty_figure("Run a comparison to see the reliability diagram."), elem_id="compare-reliability")
                    cmp_hist = gr.Plot(figures.empty_figure("Run a comparison to see the confidence histogram."), elem_id="compare-histogram")
                gr.Markdown("### Sparsity sweep\nLearned vs top-movement vs random regions over several budgets, for the pair "
                            "and task of the **Models** tab, with the mask settings of the **Localize** tab.")
                with gr.Row():
                    swp_budgets = gr.Textbox(d["sweep_budgets"], label="Budgets (fractions of graftable parameters)", elem_id="sweep-budgets")
                    swp_keep = gr.Checkbox(False, label="Keep the swept regions (saved with the others)", elem_id="sweep-keep",
                                           scale=0)
                    swp_run = gr.Button("Run sparsity sweep", elem_id="sweep-run", scale=0)
                    swp_job = job_picker("latest sweep", "sweep")
                swp_status = gr.Markdown("", elem_id="sweep-status")
                reports.append(report_controls("sweep", swp_job, ("sweep",)))
                swp_plot = gr.Plot(figures.empty_figure("Run a sparsity sweep to see accuracy against budget."), elem_id="sweep-plot")
                swp_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=actions.SWEEP_COLUMNS), interactive=False, elem_id="sweep-table")

            # ---------------------------------------------------------------- Anatomy
            with gr.Tab("Anatomy", elem_id="tab-anatomy") as anatomy_tab:
                gr.Markdown(INTRO["Anatomy"])
                with gr.Row():
                    ana_region = gr.Dropdown(store.region_choices(), allow_custom_value=True, label="Region", elem_id="anatomy-region")
                    ana_mode = gr.Radio([("counts", "counts"), ("density", "density")], value="counts", label="Colour by",
                                        elem_id="anatomy-mode")
                ana_md = gr.Markdown("", elem_id="anatomy-summary")
                ana_heat = gr.Plot(figures.empty_figure("Pick a region."), elem_id="anatomy-heatmap")
                with gr.Row():
                    ana_bars = gr.Plot(figures.empty_figure("Pick a region."), elem_id="anatomy-bars")
                    ana_kinds = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=actions.WEIGHT_BIAS_COLUMNS), interactive=False,
                                             label="Weights vs biases", elem_id="anatomy-kinds")

            # ---------------------------------------------------------------- Compose
            with gr.Tab("Compose", elem_id="tab-compose") as compose_tab:
                gr.Markdown(INTRO["Compose"])
                with gr.Row():
                    cmp_sel = gr.Dropdown(store.region_choices(), allow_custom_value=True, multiselect=True, label="Regions to compose (one base model)",
                                          elem_id="compose-regions")
                    cps_measure = gr.Radio([("|γi ∩ γj| / |γj|", "overlap"), ("IoU", "iou")], value="overlap",
                                           label="Overlap measure", elem_id="compose-measure")
                cps_heat = gr.Plot(figures.empty_figure("Pick two or more regions to compare their overlap."), elem_id="compose-overlap")
                cps_pairs = gr.Dataframe(max_height=TABLE_HEIGHT, value=actions.overlap_summary(None), interactive=False, label="Shared parameters per pair",
                                         elem_id="compose-overlap-table")
                with gr.Row():
                    cps_resolve = gr.Radio([("mean of movements", "mean"), ("first region wins", "first"), ("last region wins", "last")],
                                           value="mean", label="Parameters claimed by several regions", elem_id="compose-resolve")
                    cps_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="compose-n")
                cps_run, cps_job, cps_status = job_controls("Build union and evaluate", "compose", "latest composition")
                reports.append(report_controls("compose", cps_job, ("compose",)))
                cps_report = gr.Markdown("", elem_id="compose-report")
                cps_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=actions.COMPOSE_COLUMNS), interactive=False,
                                         label="Each task with its own head: region alone vs union graft vs bare body", elem_id="compose-table")

            # ---------------------------------------------------------------- Laboratory
            with gr.Tab("Laboratory", elem_id="tab-lab") as lab_tab:
                gr.Markdown(INTRO["Laboratory"])
                gr.Markdown("### Multi-task regions and skill transfer")
                with gr.Row():
                    mt_tasks = gr.Dropdown(OFFLINE_TASK_NAMES, value=list(MultitaskRequest().tasks), multiselect=True,
                                           label="Tasks of the multi-task model", elem_id="lab-tasks")
                    mt_group = gr.Dropdown(OFFLINE_TASK_NAMES, value=[], multiselect=True, label="Union of (empty: all tasks)",
                                           elem_id="lab-group")
                    mt_start = gr.Radio([("∅ (paper)", "empty"), ("top movement", "top-movement")], value="empty",
                                        label="Mask starts from", elem_id="lab-start")
                with gr.Row():
                    mt_budget = gr.Slider(-5, -1, value=d["log_sparsity"], step=0.5, label="log10 sparsity per task",
                                          elem_id="lab-budget")
                    mt_steps = gr.Number(d["steps"], precision=0, label="Mask steps", elem_id="lab-steps")
                    mt_purify = gr.Number(MultitaskRequest().purify_steps, precision=0, label="Purification steps",
                                          elem_id="lab-purify")
                    mt_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="lab-n")
                mt_run, mt_job, mt_status = job_controls("Run multi-task experiment", "lab-multitask", "latest multi-task run")
                reports.append(report_controls("lab-multitask", mt_job, ("multitask",)))
                with gr.Row():
                    mt_overlap = gr.Plot(figures.empty_figure("Run the experiment to fill this."), elem_id="lab-overlap")
                    mt_gain = gr.Plot(figures.gain_heatmap({}), elem_id="lab-gain")
                mt_note = gr.Markdown("", elem_id="lab-multitask-note")
                mt_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=MULTITASK_COLUMNS), interactive=False,
                                        label="Union of the group, before and after purification", elem_id="lab-union-table")
                gr.Markdown("### WiSE: interpolating towards the fine-tuned model and the graft")
                with gr.Row():
                    ws_region = gr.Dropdown(store.region_choices(), allow_custom_value=True, label="Region γ", elem_id="lab-wise-region")
                    ws_alphas = gr.Textbox(", ".join(f"{a:g}" for a in WiseRequest().alphas), label="α values",
                                           elem_id="lab-wise-alphas")
                    ws_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="lab-wise-n")
                ws_run, ws_job, ws_status = job_controls("Run WiSE", "lab-wise", "latest WiSE run")
                reports.append(report_controls("lab-wise", ws_job, ("wise",)))
                ws_plot = gr.Plot(figures.wise_curves([]), elem_id="lab-wise-plot")
                gr.Markdown("### Re-training the region from θ_pre, against BitFit (Table 1)")
                with gr.Row():
                    rt_region = gr.Dropdown(store.region_choices(), allow_custom_value=True, label="Region γ", elem_id="lab-retrain-region")
                    rt_epochs = gr.Number(d["ft_epochs"], precision=0, label="Epochs", elem_id="lab-retrain-epochs")
                    rt_train = gr.Number(d["ft_train_examples"], precision=0, label="Training examples (0 = all)",
                                         elem_id="lab-retrain-train")
                    rt_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="lab-retrain-n")
                rt_run, rt_job, rt_status = job_controls("Re-train region and BitFit", "lab-retrain", "latest re-training")
                reports.append(report_controls("lab-retrain", rt_job, ("retrain",)))
                rt_table = gr.Dataframe(max_height=TABLE_HEIGHT, column_widths=actions.COMPARE_WIDTHS, value=pd.DataFrame(columns=actions.COMPARE_COLUMNS), interactive=False, wrap=True,
                                        label="Fine-tuned, graft, re-trained graft and BitFit", elem_id="lab-retrain-table")
                rt_rel = gr.Plot(figures.empty_figure("Run the re-training to fill this."), elem_id="lab-retrain-reliability")
                gr.Markdown("### Forget-free continual learning (§5.2)")
                with gr.Row():
                    cl_tasks = gr.Dropdown(OFFLINE_TASK_NAMES, value=list(ContinualRequest().tasks), multiselect=True,
                                           label="Task sequence, in order", elem_id="lab-continual-tasks")
                    cl_budget = gr.Slider(-5, -1, value=d["log_sparsity"], step=0.5, label="log10 sparsity per task",
                                          elem_id="lab-continual-budget")
                    cl_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="lab-continual-n")
                cl_run, cl_job, cl_status = job_controls("Run continual learning", "lab-continual", "latest continual run")
                reports.append(report_controls("lab-continual", cl_job, ("continual",)))
                cl_plot = gr.Plot(figures.continual_curves({}), elem_id="lab-continual-plot")
                cl_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=CONTINUAL_COLUMNS), interactive=False,
                                        label="Accuracy on each task after each stage", elem_id="lab-continual-table")
                gr.Markdown("### Every experiment in one report (`graftui reproduce`)\n"
                            "Runs all of the above on the offline default, one after another, and writes a report with "
                            "tables, findings in words, figures and the command behind every number. Steps are saved as "
                            "they finish: run it again after a stop or a cancel and it resumes.")
                with gr.Row():
                    rp_quick = gr.Checkbox(True, label="Quick (short fine-tunes, 300 test examples; about 15 min on 2 "
                                           "CPU cores; the full run takes up to 2 hours)", elem_id="lab-reproduce-quick")
                rp_run, rp_job, rp_status = job_controls("Run every experiment", "lab-reproduce", "latest report")
                rp_files = gr.File(label="report.md and report.json", interactive=False, file_count="multiple",
                                   elem_id="lab-reproduce-files")
                rp_report = gr.Markdown("", elem_id="lab-reproduce-report")

            # ---------------------------------------------------------------- Regions
            with gr.Tab("Regions", elem_id="tab-regions") as regions_tab:
                gr.Markdown(INTRO["Regions"])
                with gr.Row():
                    reg_sel = gr.Dropdown(store.region_choices(), allow_custom_value=True, label="Saved region", elem_id="regions-select")
                with gr.Row():
                    reg_dl = gr.DownloadButton("Download skill patch (.safetensors)", value=None, elem_id="region-download")
                    reg_dl_idx = gr.DownloadButton("Download region indices only (.safetensors)", value=None,
                                                   elem_id="region-download-indices")
                    reg_export = gr.Button("Export grafted checkpoint (.zip)", elem_id="region-export")
                    reg_delete = gr.Button("Delete this region", variant="stop", elem_id="region-delete")
                reg_meta = gr.Dataframe(actions.region_meta_table(None), interactive=False, label="Metadata of the selected region",
                                        elem_id="regions-meta")
                reg_export_status = gr.Markdown("", elem_id="region-export-status")
                reg_export_file = gr.File(label="Grafted checkpoint (Hugging Face folder, zipped)", interactive=False,
                                          elem_id="region-export-file")
                gr.Markdown("### Upload a region or skill patch")
                reg_up = gr.File(label="Region file (.safetensors, written by graftui)", file_types=[".safetensors"], elem_id="region-upload")
                reg_up_md = gr.Markdown("", elem_id="region-upload-info")
                reg_up_meta = gr.Dataframe(actions.region_meta_table(None), interactive=False, label="Metadata of the uploaded file",
                                           elem_id="region-upload-meta")
                reg_apply = gr.Button("Check against the current pair and add to my regions", elem_id="region-apply")

        # -------------------------------------------------------------------- jobs panel
        with gr.Accordion("Jobs", open=True, elem_id="jobs-panel"):
            gr.Markdown("Jobs run one at a time in the background, in the order submitted; they keep running when you "
                        "close or reload the page, and stay listed after a restart.")
            jobs_df = gr.Dataframe(actions.job_rows(store.runner()), interactive=False, wrap=True, elem_id="jobs-table",
                                   column_widths=["15%", "7%", "31%", "8%", "7%", "7%", "25%"])
            with gr.Row():
                job_sel = gr.Dropdown(actions.job_choices(store.runner()), label="Job", elem_id="jobs-select",
                                      allow_custom_value=True)  # see job_picker
                job_cancel = gr.Button("Cancel selected job", variant="stop", elem_id="jobs-cancel", scale=0)
            job_md = gr.Markdown("", elem_id="jobs-detail")
            with gr.Accordion("Request of the selected job (re-run it with `graftui run FILE`)", open=False):
                job_req = gr.Code("", language="json", interactive=False, elem_id="jobs-request")
                job_req_dl = gr.DownloadButton("Download request (JSON)", value=None, elem_id="jobs-request-download")
            with gr.Row():
                job_bundle = gr.Button("Make report bundle of the selected job", elem_id="jobs-bundle", scale=0)
                job_bundle_file = gr.File(label="Report bundle (.zip: README, request, tables as CSV and JSON, figures)",
                                          interactive=False, elem_id="jobs-bundle-file")

        poll = Poll()
        region_sig = gr.State(None)
        ckpt_sig = gr.State(None)
        jobs_sig = gr.State(None)

        # ---------------------------------------------------------------- shared inputs
        columns = actions.data_columns

        # ---------------------------------------------------------------- page load
        @safe
        def on_load(current):
            session = store.resume(current)  # the browser's own id while it lives, else a new workspace
            with store.session(session):
                job = actions.submit_prepare(store.runner())
            msg = "Ready. Start on **Models** (the offline default pair is preselected), then **Localize**."
            if job is not None:
                msg = ("The default fine-tuned model (**minilm-movies**) is being prepared once, in the background "
                       "(about two minutes on a CPU; see **Jobs** below). Everything that needs it waits for it.")
            if hosted:
                msg += (" Your regions, uploads and jobs are private to this browser and kept "
                        f"{settings.SESSION_IDLE_HOURS:g} h after your last visit.")
            return msg, session

        loaded = demo.load(on_load, [sid], [status, sid])

        # ---------------------------------------------------------------- the form, across reloads
        # The browser keeps the form's values (pair, task, OOD tasks and mapping, columns, prompt, settings);
        # a reload puts them back once the session is known, so an uploaded task is among the choices again.
        form = gr.BrowserState({}, storage_key="graftui-form")
        kept = {"base": base_dd, "finetuned": ft_dd, "task": task_dd, "ood": ood_dd, "ood_labels": ood_map,
                "text_column": text_col, "pair_column": pair_col, "label_column": label_col, "head": prompt_head,
                "template": prompt_template, "label_words": prompt_words, "method": loc_method, "log_sparsity": loc_budget,
                "steps": loc_steps, "examples_per_class": loc_epc, "mask_lr": loc_lr, "n": cmp_n, "baselines": cmp_base,
                "sweep_budgets": swp_budgets, "ft_optimizer": ftn_opt, "ft_lr": ftn_lr, "ft_epochs": ftn_epochs,
                "ft_examples": ftn_n}
        columns_kept = {"text_column", "pair_column", "label_column"}

        def remember(*values):
            return dict(zip(kept, values))

        gr.on([c.change for c in kept.values()], remember, list(kept.values()), [form], show_progress="hidden",
              queue=False)

        def restore(saved):
            saved = saved if isinstance(saved, dict) else {}
            out = []
            for key, comp in kept.items():
                value = saved.get(key)
                if key not in saved or value is None:
                    out.append(gr.skip())
                elif key == "task":
                    out.append(gr.update(choices=task_choices(), value=value))
                elif key == "ood":
                    out.append(gr.update(choices=ood_choices(), value=[v for v in value if isinstance(v, str)]
                                         if isinstance(value, list) else []))
                elif key in columns_kept:  # a column of an uploaded file: offered again with its value
                    names = dict.fromkeys([*(c[1] for c in comp.choices), str(value)])
                    out.append(gr.update(choices=[(n, n) for n in names], value=str(value)))
                else:
                    out.append(gr.update(value=value))
            return out

        on(loaded.then, restore, [form], list(kept.values()), show_progress="hidden")

        # ---------------------------------------------------------------- Models
        @guarded(status, beside=pair_md)
        def on_check(base, finetuned, log_s, task, text, pair, label, head, template, words):
            desc = actions.check_pair(base, finetuned, actions.prompt_fields(head, template, words), task,
                                      columns(task, text, pair, label))
            counts = {k: desc[f"{k}_params"] for k in ("graftable", "head", "excluded", "total")}
            read = (f"head = {', '.join(desc['head_tensors']) or 'none'}" if desc["prompt"] is None else
                    f"a {desc['kind']} read through its prompt `{desc['prompt']['template']}`, label words "
                    + ", ".join(f"{lab} → `{w!r}`" for lab, w in zip(desc["prompt"]["labels"], desc["prompt"]["words"]))
                    + (" (chosen from the label names)" if desc["prompt"]["chosen"] else "")
                    + "; its own LM head and the embeddings stay fixed")
            info = (f"✓ **{desc['architecture']}** pair: base `{short_ref(base)}`, fine-tuned `{short_ref(finetuned)}`, "
                    f"labels {', '.join(desc['labels'])}; {desc['graftable_tensors']} graftable tensors, {read}.")
            return (actions.counts_table(counts), info, "✓ Pair checked.", actions.budget_text(log_s, counts),
                    gr.update(open=True) if desc["prompt"] is not None else gr.skip())

        prompt_inputs = [prompt_head, prompt_template, prompt_words]
        on(check_btn.click, on_check, [base_dd, ft_dd, loc_budget, task_dd, text_col, pair_col, label_col, *prompt_inputs],
           [counts_df, pair_md, status, loc_budget_md, prompt_acc])

        @guarded(status, beside=preview_md)
        def on_preview(finetuned, task, text, pair, label, head, template, words):
            p = actions.preview_prompt(finetuned, task, columns(task, text, pair, label),
                                       actions.prompt_fields(head, template, words))
            tokens = "; ".join(f"{lab}: `{' '.join(map(repr, toks))}`" for lab, toks in p["label_tokens"].items())
            return (f"**{p['describe']}**\n\nFirst training example as the model reads it:\n\n```\n{p['prompt']}\n```\n\n"
                    f"Label tokens ({p['scored']} is scored): {tokens}"), "✓ Prompt previewed."

        on(preview_btn.click, on_preview, [ft_dd, task_dd, text_col, pair_col, label_col, *prompt_inputs], [preview_md, status])

        @guarded(status, beside=mapping_md)
        def on_data_upload(file):

            if not file:
                return (gr.skip(),) * 8
            def read(path):  # a file refused here is deleted again by save_upload
                info = preview(str(path), allow_local=True)
                rows = sum(info["splits"].values())
                check_rows(path.name, rows)
                return info

            path, info = save_upload(file, read)
            cols, guess = info["columns"], info["guess"]
            frame = pd.DataFrame(info["rows"])
            splits = ", ".join(f"{k}: {v:,} rows" for k, v in info["splits"].items())
            md = f"Read **{path.name}** ({splits}). Check the guessed columns, then press **Check column mapping**."
            return (
                gr.update(choices=task_choices(), value=str(path)), gr.update(choices=ood_choices()),
                gr.update(choices=["(guess)", *cols], value=guess.text_column or "(guess)"),
                gr.update(choices=["(none)", *cols], value=guess.pair_column or "(none)"),
                gr.update(choices=["(guess)", *cols], value=guess.label_column or "(guess)"),
                frame, md, f"✓ Read {path.name}.",
            )

        on(data_file.upload, on_data_upload, [data_file], [task_dd, ood_dd, text_col, pair_col, label_col, data_preview,
                                                           mapping_md, status])

        @guarded(ood_md, toast=False)  # the message stays beside the mapping that caused it
        def on_ood(task, text, pair, label, ood, mapping):
            return actions.ood_preview(task, columns(task, text, pair, label), ood or [], mapping)

        for event in (ood_dd.change, ood_map.submit, ood_map.blur, task_dd.change):
            on(event, on_ood, [task_dd, text_col, pair_col, label_col, ood_dd, ood_map], [ood_md], show_progress="hidden")

        @guarded(status, beside=mapping_md)
        def on_check_mapping(task, text, pair, label):
            t = actions.load_task_checked(task, columns(task, text, pair, label))
            sizes = ", ".join(f"{k} {len(s):,}" for k, s in t.splits.items())
            kind = "text-pair" if t.is_pair else "single-text"
            return (f"✓ **{t.name}**: {kind} task with {t.num_labels} labels ({', '.join(t.label_names)}); "
                    f"examples per split: {sizes}. Source: {t.source}."), "✓ Column mapping checked."

        on(mapping_btn.click, on_check_mapping, [task_dd, text_col, pair_col, label_col], [mapping_md, status])

        # ---------------------------------------------------------------- Fine-tune
        def on_optimizer(opt):
            if opt == "adamw":
                return gr.update(value=LR_FOR["adamw"]), gr.update(visible=True, value=INTERACTIVE["l1"])
            return gr.update(value=d["ft_lr"]), gr.update(visible=False, value=0.0)

        on(ftn_opt.change, on_optimizer, [ftn_opt], [ftn_lr, ftn_l1])

        def on_task(task):
            return f"Task: **{short_ref(task) or '?'}**, as chosen on the **Models** tab (its column mapping too)."

        on(task_dd.change, on_task, [task_dd], [ftn_task_md], show_progress="hidden")

        @guarded(status, beside=ftn_status)
        def on_finetune(base, task, text, pair, label, opt, lr, l1, epochs, n, head, template, words):
            job = actions.submit_finetune(store.runner(), base=base, task=task,
                                          columns={**columns(task, text, pair, label),
                                                   **actions.prompt_fields(head, template, words)},
                                          optimizer=opt, lr=lr, epochs=epochs, train_examples=n, l1=l1)
            return submitted(job), picker_for(("finetune", "prepare"), "latest fine-tuning job", job), actions.job_status_line(job)

        on(ftn_run.click, on_finetune, [ftn_base, task_dd, text_col, pair_col, label_col, ftn_opt, ftn_lr, ftn_l1, ftn_epochs, ftn_n,
           *prompt_inputs],
           [status, ftn_job, ftn_status])

        # ---------------------------------------------------------------- Localize
        def on_budget(log_s, base, finetuned):
            return actions.budget_text(log_s, store.known_counts(base, finetuned))

        for ev in (loc_budget.change, base_dd.change, ft_dd.change, localize_tab.select):
            on(ev, quiet(lambda a, b, c: (on_budget(a, b, c), gr.skip())), [loc_budget, base_dd, ft_dd], [loc_budget_md, status])

        on(loc_method.change, safe(lambda m: (method_info(m), gr.skip())), [loc_method], [loc_method_md, status])

        @guarded(status, beside=loc_status)
        def on_localize(base, finetuned, task, text, pair, label, method, log_s, steps, epc, lr, head, template, words):
            job = actions.submit_localize(store.runner(), base=base, finetuned=finetuned, task=task,
                                          columns={**columns(task, text, pair, label),
                                                   **actions.prompt_fields(head, template, words)}, method=method, log_sparsity=log_s, steps=steps,
                                          examples_per_class=epc, lr=lr)
            return submitted(job), picker_for(("localize",), "latest localize job", job), actions.job_status_line(job)

        on(loc_run.click, on_localize, [base_dd, ft_dd, task_dd, text_col, pair_col, label_col, loc_method, loc_budget, loc_steps, loc_epc,
           loc_lr, *prompt_inputs], [status, loc_job, loc_status])

        def cancel_shown(kinds):
            @safe
            def run(picked):
                runner = store.runner()
                job = actions.shown_job(runner, picked, kinds)
                if job is None:
                    return "Nothing to cancel."
                ok = runner.cancel(job.id)
                return f"Cancel requested for **{job.title}**." if ok else f"**{job.title}** has already finished ({job.status})."

            return run

        on(loc_cancel.click, cancel_shown(("localize",)), [loc_job], [status])
        on(ftn_cancel.click, cancel_shown(("finetune", "prepare")), [ftn_job], [status])

        # ---------------------------------------------------------------- Compare
        @guarded(status, beside=cmp_status)
        def on_compare(region_ids, ood, mapping, n, baselines):
            job = actions.submit_compare(store.runner(), region_ids=region_ids or [], ood=ood or [], n=n, baselines=baselines,
                                         ood_labels=mapping)
            return submitted(job), picker_for(("compare",), "latest comparison", job), actions.job_status_line(job)

        def shows(kind, picker, widgets):
            """A picked job puts its own settings into the form above it ("latest" leaves the form alone)."""
            def fill(picked):
                return [*job_form(kind, store.runner().get(picked) if picked else None), gr.skip()]

            on(picker.input, quiet(fill), [picker], [*widgets, status], show_progress="hidden")

        shows("localize", loc_job, [loc_method, loc_budget, loc_steps, loc_epc, loc_lr])
        shows("compare", cmp_job, [cmp_regions, cmp_n, cmp_base])
        shows("finetune", ftn_job, [ftn_opt, ftn_lr, ftn_epochs, ftn_n])

        on(cmp_run.click, on_compare, [cmp_regions, ood_dd, ood_map, cmp_n, cmp_base], [status, cmp_job, cmp_status])

        @guarded(status, beside=swp_status)
        def on_sweep(base, finetuned, task, text, pair, label, budgets, steps, epc, lr, n, head, template, words, ood,
                     mapping, keep):
            job = actions.submit_sweep(store.runner(), base=base, finetuned=finetuned, task=task,
                                       columns={**columns(task, text, pair, label),
                                                **actions.prompt_fields(head, template, words)}, budgets=budgets, steps=steps, examples_per_class=epc,
                                       lr=lr, n=n, ood=ood or [], ood_labels=mapping, keep=keep)
            return submitted(job), picker_for(("sweep",), "latest sweep", job), actions.job_status_line(job)

        on(swp_run.click, on_sweep, [base_dd, ft_dd, task_dd, text_col, pair_col, label_col, swp_budgets, loc_steps, loc_epc, loc_lr, cmp_n,
           *prompt_inputs, ood_dd, ood_map, swp_keep],
           [status, swp_job, swp_status])

        # ---------------------------------------------------------------- Anatomy
        @guarded(status, beside=ana_md)
        def on_anatomy(region_id, mode):
            if not region_id:
                return gr.skip(), gr.skip(), gr.skip(), "Pick a region (run **Localize** first if the list is empty).", gr.skip()
            return (*anatomy_outputs(region_id, mode), gr.skip())

        on(ana_region.change, on_anatomy, [ana_region, ana_mode], [ana_heat, ana_bars, ana_kinds, ana_md, status])
        on(ana_mode.change, on_anatomy, [ana_region, ana_mode], [ana_heat, ana_bars, ana_kinds, ana_md, status])
        on(anatomy_tab.select, on_anatomy, [ana_region, ana_mode], [ana_heat, ana_bars, ana_kinds, ana_md, status])

        # ---------------------------------------------------------------- Compose
        @safe
        def on_overlap(region_ids, measure):
            if not region_ids or len(region_ids) < 2:
                return figures.overlap_heatmap({"names": []}), actions.overlap_summary(None), gr.skip()
            matrix = actions.overlap_for(region_ids)
            return figures.overlap_heatmap(matrix, measure), actions.overlap_summary(matrix), gr.skip()

        for ev in (cmp_sel.change, cps_measure.change, compose_tab.select):
            on(ev, on_overlap, [cmp_sel, cps_measure], [cps_heat, cps_pairs, status])

        @guarded(status, beside=cps_status)
        def on_compose(region_ids, resolve, n):
            job = actions.submit_compose(store.runner(), region_ids=region_ids or [], resolve=resolve, n=n)
            return submitted(job), picker_for(("compose",), "latest composition", job), actions.job_status_line(job)

        on(cps_run.click, on_compose, [cmp_sel, cps_resolve, cps_n], [status, cps_job, cps_status])

        # ---------------------------------------------------------------- Laboratory
        @guarded(status, beside=mt_status)
        def on_multitask(tasks, group, log_s, start, steps, purify, n):
            job = actions.submit_multitask(store.runner(), tasks=tasks, group=group, log_sparsity=log_s, start=start,
                                           steps=steps, purify_steps=purify, examples_per_class=d["examples_per_class"], n=n)
            return submitted(job), picker_for(("multitask",), "latest multi-task run", job), actions.job_status_line(job)

        on(mt_run.click, on_multitask, [mt_tasks, mt_group, mt_budget, mt_start, mt_steps, mt_purify, mt_n], [status, mt_job, mt_status])

        @guarded(status, beside=ws_status)
        def on_wise(region_id, alphas, n):
            job = actions.submit_wise(store.runner(), region_id=region_id, alphas=alphas, ood=[], n=n)
            return submitted(job), picker_for(("wise",), "latest WiSE run", job), actions.job_status_line(job)

        on(ws_run.click, on_wise, [ws_region, ws_alphas, ws_n], [status, ws_job, ws_status])

        @guarded(status, beside=rt_status)
        def on_retrain(region_id, epochs, train, n):
            job = actions.submit_retrain(store.runner(), region_id=region_id, epochs=epochs, train_examples=train, n=n)
            return submitted(job), picker_for(("retrain",), "latest re-training", job), actions.job_status_line(job)

        on(rt_run.click, on_retrain, [rt_region, rt_epochs, rt_train, rt_n], [status, rt_job, rt_status])

        @guarded(status, beside=cl_status)
        def on_continual(tasks, log_s, n):
            job = actions.submit_continual(store.runner(), tasks=tasks, log_sparsity=log_s, steps=d["steps"],
                                           examples_per_class=d["examples_per_class"], n=n)
            return submitted(job), picker_for(("continual",), "latest continual run", job), actions.job_status_line(job)

        on(cl_run.click, on_continual, [cl_tasks, cl_budget, cl_n], [status, cl_job, cl_status])

        @guarded(status, beside=rp_status)
        def on_reproduce(quick):
            job = actions.submit_reproduce(store.runner(), quick=quick)
            return submitted(job), picker_for(("reproduce",), "latest report", job), actions.job_status_line(job)

        on(rp_run.click, on_reproduce, [rp_quick], [status, rp_job, rp_status])

        # ---------------------------------------------------------------- Regions
        @safe
        def on_region_select(region_id):
            if not region_id:
                return gr.update(value=None), gr.update(value=None), actions.region_meta_table(None), gr.skip()
            path = store.region_path(region_id)
            record = store.load_region(region_id)
            indices = actions.region_only_file(region_id)
            return gr.update(value=str(path)), gr.update(value=str(indices)), actions.region_meta_table(record), gr.skip()

        on(reg_sel.change, on_region_select, [reg_sel], [reg_dl, reg_dl_idx, reg_meta, status])
        on(regions_tab.select, on_region_select, [reg_sel], [reg_dl, reg_dl_idx, reg_meta, status])

        @guarded(status, beside=reg_export_status)
        def on_export(region_id):
            job = actions.submit_export(store.runner(), region_id=region_id)
            return submitted(job), job.id, actions.job_status_line(job)

        @safe
        def on_region_delete(region_id):
            path = store.delete_region(region_id)
            return gr.update(value=None), f"Deleted region **{path.stem}**."

        on(reg_delete.click, on_region_delete, [reg_sel], [reg_sel, status])

        export_job = gr.State("")
        on(reg_export.click, on_export, [reg_sel], [status, export_job, reg_export_status])

        @guarded(status, beside=reg_up_md)
        def on_region_upload(file):

            if not file:
                return "", actions.region_meta_table(None), gr.skip()
            path = check_upload(file, (".safetensors",))
            record = regions.load(path)  # validates format, metadata and every index
            s = record.summary()
            md = (f"✓ **{path.name}** is a valid graftui {s['kind']}: k = {s['size']:,} of {s['graftable']:,} graftable parameters "
                  f"({s['fraction_of_graftable']:.4%}) in {s['tensors']} tensors. Press the button below to check it against the "
                  "current pair and add it to your regions.")
            return md, actions.region_meta_table(record), f"✓ {path.name} is a valid region file."

        on(reg_up.upload, on_region_upload, [reg_up], [reg_up_md, reg_up_meta, status])

        @guarded(status, beside=reg_up_md)
        def on_region_apply(file, base, finetuned):

            if not file:
                raise ValueError("upload a region file first")
            path = check_upload(file, (".safetensors",))
            record = regions.load(path)
            actions.check_pair(base, finetuned)
            pair = flows.pair_for_regions(base, finetuned, [record], store.guard())
            regions.check_fits(record, pair)
            meta = record.meta
            meta.original_base = meta.original_base or meta.base
            meta.original_finetuned = meta.original_finetuned or meta.finetuned
            meta.base, meta.finetuned, meta.uploaded_as = base, finetuned, path.name
            meta.method = meta.method or "uploaded"
            saved = store.save_region(record, stem=f"uploaded-{safe_name(path.stem, 30)}")
            return (f"✓ Fits the current pair ({short_ref(base)} → {short_ref(finetuned)}); saved as **{saved.stem}** "
                    "and listed in every region picker."), f"✓ Added region {saved.stem}."

        on(reg_apply.click, on_region_apply, [reg_up, base_dd, ft_dd], [reg_up_md, status])

        # ---------------------------------------------------------------- polling
        region_pickers = [cmp_regions, ana_region, cmp_sel, reg_sel, ws_region, rt_region]

        def tick_lists(last_regions, last_ckpts, *picked):
            entries = store.list_regions()
            rsig = tuple(e.id for e in entries)
            csig = tuple(c["path"] for c in store.list_checkpoints()) + (store.default_ready(),)
            out = []
            if rsig != last_regions:
                choices = [(e.label, e.id) for e in entries]
                for picker, value in zip(region_pickers, picked):
                    # a region deleted meanwhile leaves the picker; an empty picker gets the newest region(s)
                    kept = [v for v in value or [] if v in rsig] if picker.multiselect else (value if value in rsig else None)
                    fill = default_selection(entries, picker is cmp_sel)
                    if not kept and fill:
                        out.append(gr.update(choices=choices, value=fill if picker.multiselect else fill[0]))
                    elif kept != value:
                        out.append(gr.update(choices=choices, value=kept))
                    else:
                        out.append(gr.update(choices=choices))
                out.append(region_list_rows())
            else:
                out += [gr.skip() for _ in region_pickers] + [gr.skip()]
            if csig != last_ckpts:
                out += [gr.update(choices=store.checkpoint_choices(include_base=True)), gr.update(choices=store.checkpoint_choices()),
                        gr.update(choices=store.checkpoint_choices(include_base=True))]
            else:
                out += [gr.skip(), gr.skip(), gr.skip()]
            return (*out, rsig, csig)

        poll.add(tick_lists, [region_sig, ckpt_sig, *region_pickers], [*region_pickers, region_table, base_dd, ft_dd, ftn_base, region_sig, ckpt_sig],
                 )

        def tick_jobs(last, picked):
            """The jobs table and the picked job's line: a new job or a new status at once, running figures
            (progress, duration) at most every LIVE_REDRAW_SECONDS."""
            runner = store.runner()
            sig = actions.job_signature(runner)
            job = runner.get(picked) if picked else None
            detail = actions.job_status_line(job) if job else ""
            listing = [(j[0], j[1]) for j in sig]
            now = time.monotonic()
            if last is not None and listing == last[0]:
                fresh = sig == last[1] or now - last[3] < LIVE_REDRAW_SECONDS
                table = gr.skip() if fresh else actions.job_rows(runner)
                picker = gr.skip()  # its choices change only when a job appears or changes status
            else:
                fresh = False
                table, picker = actions.job_rows(runner), gr.update(choices=actions.job_choices(runner))
            line = gr.skip() if last is not None and detail == last[2] else detail
            return table, picker, line, (listing, last[1] if fresh else sig, detail, last[3] if fresh else now)

        poll.add(tick_jobs, [jobs_sig, job_sel], [jobs_df, job_sel, job_md, jobs_sig])

        @safe
        def on_job_cancel(picked):
            if not picked:
                raise ValueError("pick a job to cancel")
            runner = store.runner()
            ok = runner.cancel(picked)  # refuses a job that is not this page's own
            job = runner.get(picked)
            return f"Cancel requested for **{job.title}**." if ok else f"**{job.title}** has already finished ({job.status})."

        on(job_cancel.click, on_job_cancel, [job_sel], [status])

        @safe
        def on_job_pick(picked):
            job = store.runner().get(picked) if picked else None
            path = actions.request_file(job)
            text = json.dumps(job.params, indent=2) if path else "(this job has no request: it prepares the default model)"
            return text if job else "", gr.update(value=str(path) if path else None), gr.skip()

        on(job_sel.change, on_job_pick, [job_sel], [job_req, job_req_dl, status])

        @safe
        def on_job_bundle(picked):
            return actions.report_bundle(store.runner().get(picked) if picked else None), gr.skip()

        on(job_bundle.click, on_job_bundle, [job_sel], [job_bundle_file, status])

        for button, file, picker, kinds in reports:  # each result panel's own "tables and figures" download
            @safe
            def on_report(picked, kinds=kinds):
                runner = store.runner()
                job = actions.shown_job(runner, picked, kinds)
                return gr.update(value=actions.report_bundle(job), visible=True), gr.skip()

            on(button.click, on_report, [picker], [file, status])

        def panel(kinds, picker, status_md, outputs, render, latest_label, fixed_state=None):
            """Poll the picked job of ``kinds`` (or the latest one) and re-render only when it changed."""
            sig_state = gr.State(None)

            def tick(picked, last):
                runner = store.runner()
                job = actions.shown_job(runner, picked, kinds)
                listing = tuple((j.id, j.status) for j in runner.jobs() if j.kind in kinds)
                shown = None if job is None else (job.id, job.status)
                line = None if job is None else (len(job.progress), round(job.fraction, 3), job.message)
                running = job is not None and job.status == "running"
                new_list, new_line, redraw, state = panel_changes(last, listing, shown, line, running, time.monotonic())
                if not (new_list or new_line or redraw):
                    return (gr.skip(), gr.skip(), *[gr.skip() for _ in outputs], state)
                picker_update = gr.update(choices=[(latest_label, "")] + actions.job_choices(runner, kinds)) if new_list else gr.skip()
                status_update = actions.job_status_line(job) if new_line else gr.skip()
                figures_out = render(job) if redraw else [gr.skip() for _ in outputs]
                return (picker_update, status_update, *figures_out, state)

            inputs = [fixed_state if fixed_state is not None else picker, sig_state]
            outs = ([picker] if fixed_state is None else []) + [status_md, *outputs, sig_state]
            polled = tick if fixed_state is None else (lambda picked, last: tick(picked, last)[1:])
            return sig_state, polled, inputs, outs, picker

        # Only the open tab's panels are refreshed. A plot updated while its tab is hidden is drawn only
        # at its next update anyway, so opening a tab forgets what its panels last rendered and the
        # next tick draws them again.
        panels = {
            "localize": [panel(("localize",), loc_job, loc_status, [loc_plot], render_localize, "latest localize job")],
            "finetune": [panel(("finetune", "prepare"), ftn_job, ftn_status, [ftn_plot], render_finetune, "latest fine-tuning job")],
            "compare": [
                panel(("compare",), cmp_job, cmp_status, [cmp_table, cmp_rel, cmp_hist, cmp_note, cmp_side], render_compare, "latest comparison"),
                panel(("sweep",), swp_job, swp_status, [swp_plot, swp_table], render_sweep, "latest sweep"),
            ],
            "compose": [panel(("compose",), cps_job, cps_status, [cps_report, cps_table], render_compose, "latest composition")],
            "lab": [
                panel(("multitask",), mt_job, mt_status, [mt_overlap, mt_gain, mt_table, mt_note], render_multitask,
                      "latest multi-task run"),
                panel(("wise",), ws_job, ws_status, [ws_plot], render_wise, "latest WiSE run"),
                panel(("retrain",), rt_job, rt_status, [rt_table, rt_rel], render_retrain, "latest re-training"),
                panel(("continual",), cl_job, cl_status, [cl_plot, cl_table], render_continual, "latest continual run"),
                panel(("reproduce",), rp_job, rp_status, [rp_files, rp_report], render_reproduce, "latest report"),
            ],
            "regions": [panel(("export",), None, reg_export_status, [reg_export_file], render_export, "", fixed_state=export_job)],
        }
        for name, parts in panels.items():
            for _, polled, inputs, outs, picker in parts:
                poll.add(polled, inputs, outs, tab=name)
                if picker is not None:  # picking a job shows it at once
                    on(picker.change, quiet(lambda picked, fn=polled: (*fn(picked, None), gr.skip())), [picker], [*outs, status])
        tabs = {"models": models_tab, "finetune": finetune_tab, "localize": localize_tab, "compare": compare_tab,
                "anatomy": anatomy_tab, "compose": compose_tab, "lab": lab_tab, "regions": regions_tab}
        timers = {name: gr.Timer(POLL_SECONDS, active=name == "models") for name in tabs}  # the first tab is open
        for name, tab in tabs.items():
            sigs = [part[0] for part in panels.get(name, [])]
            on(tab.select, _open_tab(name, sigs, timers), None, [*sigs, *timers.values()], show_progress="hidden")
        poll.wire(timers, status, sid)


    return demo


def submitted(job) -> str:
    return actions.submitted_line(job)


JOB_FORMS = {  # which request field fills which widget when a panel shows a job (None: the widget's own value)
    "localize": ["method", ("sparsity", lambda v: math.log10(v) if v else None), "steps", "examples_per_class", "lr"],
    "compare": [("regions", lambda v: [Path(p).stem for p in v or []] or None), "n", "baselines"],
    "finetune": ["optimizer", "lr", "epochs", "train_examples"],
}


def job_form(kind: str, job) -> list:
    """Updates that put a shown job's own settings back into its form (a job without a request: none)."""
    out = []
    for spec in JOB_FORMS[kind]:
        key, convert = spec if isinstance(spec, tuple) else (spec, None)
        params = (job.params or {}) if job is not None else {}
        value = params.get(key)
        if convert is not None and value is not None:
            value = convert(value)
        out.append(gr.skip() if "verb" not in params or value is None else gr.update(value=value))
    return out


def picker_for(kinds: tuple[str, ...], latest_label: str, job):
    """A job picker showing ``job`` among the jobs of ``kinds``."""
    choices = [(latest_label, "")] + actions.job_choices(store.runner(), kinds)
    return gr.update(choices=choices, value=job.id)


def panel_changes(last, listing, shown, line, running: bool, now: float):
    """What a panel's tick must update: (job list, status line, figures, new state).

    The state remembers what the list, the status line and the figures last showed, and when the
    figures were drawn. The status line follows every change; a running job's figures are redrawn
    at most every LIVE_REDRAW_SECONDS (a change held back is drawn once that time has passed), and
    at once when another job is shown or the job stops.
    """
    if last is None:
        return True, True, True, (listing, shown, line, line, now)
    new_list = listing != last[0]
    new_line = (shown, line) != (last[1], last[2])
    stale = line != last[3] or shown != last[1]
    redraw = stale and (shown != last[1] or not running or now - last[4] >= LIVE_REDRAW_SECONDS)
    return new_list, new_line, redraw, (listing, shown, line, line if redraw else last[3], now if redraw else last[4])


def job_controls(label: str, prefix: str, latest_label: str):
    """A Run button, a picker of this kind's jobs and their status line: ``#prefix-run``, ``-job``, ``-status``."""
    with gr.Row():
        run = gr.Button(label, variant="primary", elem_id=f"{prefix}-run", scale=0)
        job = job_picker(latest_label, prefix)
    return run, job, gr.Markdown("", elem_id=f"{prefix}-status")


def job_picker(latest_label: str, prefix: str):
    """A picker of one kind's jobs, ``#prefix-job``, first offering the latest one.

    It takes any value: its choices change on every poll, and a poll that lists the jobs just before
    a new one is submitted would otherwise leave the new job's id "not in the choices", and Gradio
    would then refuse every later poll, so the page would never show that job end. The id is only
    ever looked up among the session's own jobs.
    """
    return gr.Dropdown([(latest_label, "")], value="", label="Show job", elem_id=f"{prefix}-job", allow_custom_value=True)


def report_controls(prefix: str, picker, kinds: tuple[str, ...]):
    """A button that downloads the shown job's tables (CSV, JSON) and figures (HTML) as its report bundle."""
    with gr.Row():
        button = gr.Button("Download tables & figures (.zip)", size="sm", elem_id=f"{prefix}-report", scale=0,
                           min_width=260)
        file = gr.File(label="Report bundle: README, request, tables as CSV and JSON, figures as HTML",
                       interactive=False, visible=False, elem_id=f"{prefix}-report-file")
    return button, file, picker, kinds


def _open_tab(tab: str, sigs: list, timers: dict):
    """A tab's select handler: poll with its timer alone, and forget what its panels last drew (a plot
    updated while its tab was hidden is drawn only at its next update, so the next tick draws them again)."""

    def opened():
        return (*[None] * len(sigs), *[gr.Timer(active=name == tab) for name in timers])

    return opened


class Poll:
    """Every live list and panel, refreshed by one event per tick of the open tab's timer.

    Each event costs the browser a request, a reply and a pass over the components it may update, and
    Gradio rebuilds the config of every output it is given, ``gr.skip()`` included (about 1.5 ms each,
    measured); on a small machine that is taken from the job being watched. So: one event per tick, from
    the open tab's own timer, whose outputs are that tab's panels and the lists shown on every tab; a
    tick with nothing new answers with one skip, and a State is written back only when it changed. A
    part whose refresh fails keeps its outputs and reports in the status line; the others go on.
    """

    def __init__(self):
        self.parts: list[tuple] = []

    def add(self, fn, inputs: list, outputs: list, tab: str | None = None) -> None:
        """``fn(*inputs)`` returns one value (or ``gr.skip()``) per output; polled on ``tab`` only, or on every tab."""
        self.parts.append((fn, list(inputs), list(outputs), tab))

    def wire(self, timers: dict, status, sid) -> None:
        """Each tab's timer ticks the parts of that tab and those of every tab."""
        for part in self.parts:
            if part[3] is not None and part[3] not in timers:
                raise ValueError(f"no timer for the tab '{part[3]}'")
        for name, timer in timers.items():
            self._wire([p[:3] for p in self.parts if p[3] in (None, name)], timer, status, sid)

    @staticmethod
    def _wire(parts: list, timer, status, sid) -> None:
        inputs = [sid, status, *(c for _, ins, _ in parts for c in ins)]
        outputs = [c for _, _, outs in parts for c in outs]
        if len(set(map(id, outputs))) != len(outputs):
            raise ValueError("two polled parts update the same component")

        # (input position, output position) of each State a part reads and writes back
        kept = [[(i, j) for j, c in enumerate(outs) if isinstance(c, gr.State) for i, x in enumerate(ins) if x is c]
                for _, ins, outs in parts]

        @in_session
        def tick(banner, *values):
            settled = actions.settled_banner(banner)  # "Submitted…" once its job has ended
            out, at, problem = [], 0, gr.skip() if settled is None else settled
            for (fn, ins, outs), states in zip(parts, kept):
                mine = values[at:at + len(ins)]
                try:
                    got = list(fn(*mine))
                except Exception as err:  # noqa: BLE001 - one failing panel must not stop the others
                    log.warning("polling %s failed", getattr(fn, "__name__", "panel"), exc_info=True)
                    got, problem = [gr.skip() for _ in outs], f"⚠️ {friendly_message(err)}"
                for i, j in states:
                    if _same(got[j], mine[i]):
                        got[j] = gr.skip()
                out += got
                at += len(ins)
            out.append(problem)
            return gr.skip() if all(_skipped(v) for v in out) else tuple(out)

        timer.tick(tick, inputs, [*outputs, status], show_progress="hidden")


def _skipped(value) -> bool:
    return isinstance(value, dict) and value == gr.skip()


def _same(new, old) -> bool:
    """Whether a State's new value is its old one. Gradio re-builds the config of every State an event
    writes, even with an unchanged value (a few ms each, profiled); an unchanged one is not written."""
    try:
        return bool(new == old)
    except Exception:  # noqa: BLE001 - values that do not compare (arrays) are written
        return False


def in_session(fn):
    """``fn`` called as ``call(session_id, *inputs)``: the store's workspace is the session's for the call."""

    def call(session_id, *args):
        with store.session(session_id):
            return fn(*args)

    call.__name__ = getattr(fn, "__name__", "handler")
    return call


def launch_options() -> dict:
    """How the server is launched: the folders it may serve, the upload cap, and Gradio's own refusals
    (a non-number in a slider, a file path no page uploaded) shown as their message, not a bare error, and
    the page's early script (``pagescript``), which needs the page served by this server, not rendered by
    Gradio's Node server (``ssr_mode``)."""
    max_size = f"{int(settings.MAX_UPLOAD_MB)}mb" if settings.hosted() else None
    return {"allowed_paths": store.served_dirs(), "max_file_size": max_size, "show_error": True, "css": CSS,
            "app_kwargs": pagescript.app_kwargs(), "ssr_mode": False}


QUEUE_IDLE_SECONDS = 0.05
ANALYTICS_EVERY_EVENTS = 200


def quiet_queue(demo) -> None:
    """Take Gradio's queue's own costs off a running job's cores.

    Its idle loop wakes every 50 ms instead of every 1 ms: 1,000 wake-ups a second took 0.04 of a core
    on an idle server (0.07 → 0.03 measured) and compete for the interpreter lock with a running job;
    the cost is up to 50 ms before a queued event starts. Its monitoring summary (a pandas table of up
    to 10,000 past events) is rebuilt every 200 events instead of after every one: 6 ms per poll on a
    fresh server, 28 ms once the history is full (measured), for a page no one opens by default.
    """
    queue = getattr(demo, "_queue", None)
    if queue is None:
        return
    if getattr(queue, "sleep_when_free", 0) < QUEUE_IDLE_SECONDS:
        queue.sleep_when_free = QUEUE_IDLE_SECONDS
    if getattr(queue, "ANAYLTICS_CACHE_FREQUENCY", ANALYTICS_EVERY_EVENTS) < ANALYTICS_EVERY_EVENTS:  # Gradio's spelling
        queue.ANAYLTICS_CACHE_FREQUENCY = ANALYTICS_EVERY_EVENTS


def launch(host: str = "127.0.0.1", port: int = 7860, share: bool = False, **kwargs):
    demo = build_app()
    demo.queue(default_concurrency_limit=4)
    quiet_queue(demo)
    return demo.launch(server_name=host, server_port=port, share=share, **{**launch_options(), **kwargs})
