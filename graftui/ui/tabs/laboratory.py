"""Laboratory: the paper's experiments with regions (multi-task, WiSE, re-training, continual learning) and
all of them in one report."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pandas as pd

from ... import figures
from ...tasks.classification.data import OFFLINE_TASKS
from ...paths import short_ref
from ...requests import ContinualRequest, MultitaskRequest, WiseRequest
from .. import forms, store, tables
from ..wiring import TABLE_HEIGHT, job_controls, request_radio, seeds_box, submitted

INTRO = (
    "The paper's experiments with regions. **Multi-task** (§5.1): one model fine-tuned on several tasks (built "
    "once, a few CPU minutes); each task's region, how much they overlap, how much of each task's skill every "
    "region carries (Eq. 5), and the union of a group of tasks before and after purification. **WiSE** (Fig. 7): "
    "accuracy along θ_pre + α·δ and θ_pre + α·γ⊙δ, in and out of distribution. **Re-training** (Table 1), "
    "**continual learning** (§5.2), and **all of them in one report** at the bottom."
)
STARTS = {"empty": "∅ (paper)", "top-movement": "top movement"}
MULTITASK_COLUMNS = ["region", "size", *("task", "relative gain", "accuracy")]
CONTINUAL_COLUMNS = ["arm", "stage", "parameters trained", "task", "accuracy"]
CONTINUAL_TABLE = "Accuracy on each task after each stage"
MULTITASK, MULTITASK_LATEST = ("multitask",), "latest multi-task run"
WISE, WISE_LATEST = ("wise",), "latest WiSE run"
RETRAIN, RETRAIN_LATEST = ("retrain",), "latest re-training"
CONTINUAL, CONTINUAL_LATEST = ("continual",), "latest continual run"
REPRODUCE, REPRODUCE_LATEST = ("reproduce",), "latest report"


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
    if res.get("seeds"):
        note += f" Every figure is the mean over seeds {', '.join(map(str, res['seeds']))} (Download has each seed's own)."
    if res.get("notes"):
        note += "\n\n" + "\n\n".join(f"Note: {n}" for n in res["notes"])
    matrix = {"names": res["tasks"], "overlap": res["overlap"], "intersection_counts": res["intersection_counts"],
              "sizes": res["sizes"], "iou": res["overlap"]}
    return [figures.overlap_heatmap(matrix), figures.gain_heatmap(res), pd.DataFrame(rows, columns=MULTITASK_COLUMNS), note]


def render_wise(job) -> list:
    if job is None or not job.result:
        return [figures.wise_curves([]), pd.DataFrame(columns=tables.WISE_COLUMNS)]
    return [figures.wise_curves(job.result["rows"]), tables.wise_table(job.result["rows"])]


RETRAIN_NOTE = ("BitFit trains only the biases, with the fine-tuning learning rate, which suits full fine-tuning: at that "
                "rate BitFit may score the same as the bare pre-trained body.")


def render_retrain(job) -> list:
    if job is None or not job.result:
        msg = "Run the re-training to fill this." if job is None else "Results appear when the job is done."
        return [pd.DataFrame(columns=tables.COMPARE_COLUMNS), figures.empty_figure(msg)]
    res = job.result
    return [tables.retrain_table(res), figures.reliability_diagram(res["reliability"], res["task"])]


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
                    rows.append({"arm": arm, "stage": f"{i + 1}: {stage}",
                                 "parameters trained": f"{res['trained'][arm][i]:,.0f}",
                                 "task": task, "accuracy": f"{acc:.3f}"})
    label = CONTINUAL_TABLE + (f" (mean over seeds {', '.join(map(str, res['seeds']))}; Download has each seed's own)"
                               if res.get("seeds") else "")
    return [figures.continual_curves(res), gr.update(value=pd.DataFrame(rows, columns=CONTINUAL_COLUMNS), label=label)]


def render_reproduce(job) -> list:
    """The report's files and its text, once the job is done."""
    if job is None or not job.result:
        return [None, "" if job is None else "The report appears here when the run is done."]
    folder = Path(job.result["out"])
    files = [str(folder / name) for name in ("report.md", "report.json") if (folder / name).exists()]
    text = (folder / "report.md").read_text() if (folder / "report.md").exists() else "The report file is gone."
    return [files or None, text]


def build(page) -> gr.Tab:
    d, tasks, status = page.defaults, list(OFFLINE_TASKS), page.status
    with gr.Tab("Laboratory", elem_id="tab-lab") as tab:
        gr.Markdown(INTRO)
        gr.Markdown("### Multi-task regions and skill transfer")
        with gr.Row():
            mt_tasks = gr.Dropdown(tasks, value=list(MultitaskRequest().tasks), multiselect=True,
                                   label="Tasks of the multi-task model", elem_id="lab-tasks")
            mt_group = gr.Dropdown(tasks, value=[], multiselect=True, label="Union of these tasks (empty: all tasks)",
                                   elem_id="lab-group")
            mt_start = request_radio(MultitaskRequest, "start", STARTS, label="Mask starts from", elem_id="lab-start")
        with gr.Row():
            mt_budget = gr.Slider(-5, -1, value=d["log_sparsity"], step=0.5, label="log10 sparsity per task",
                                  elem_id="lab-budget")
            mt_steps = gr.Number(d["steps"], precision=0, label="Mask steps", elem_id="lab-steps")
            mt_purify = gr.Number(MultitaskRequest().purify_steps, precision=0, label="Purification steps",
                                  elem_id="lab-purify")
            mt_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="lab-n")
            mt_seeds = seeds_box("lab-seeds")
        mt_run, mt_job, mt_status = job_controls("Run multi-task experiment", "lab-multitask", MULTITASK_LATEST)
        page.report("lab-multitask", mt_job, MULTITASK)
        with gr.Row():
            mt_overlap = gr.Plot(figures.empty_figure("Run the experiment to fill this."), elem_id="lab-overlap")
            mt_gain = gr.Plot(figures.gain_heatmap({}), elem_id="lab-gain")
        mt_note = gr.Markdown("", elem_id="lab-multitask-note")
        mt_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=MULTITASK_COLUMNS), interactive=False,
                                label="Union of the group, before and after purification", elem_id="lab-union-table")

        gr.Markdown("### WiSE: interpolating towards the fine-tuned model and the graft")
        with gr.Row():
            ws_region = gr.Dropdown(store.region_choices(), allow_custom_value=True, label="Region γ",
                                    elem_id="lab-wise-region")
            ws_alphas = gr.Textbox(", ".join(f"{a:g}" for a in WiseRequest().alphas), label="α values",
                                   elem_id="lab-wise-alphas")
            ws_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="lab-wise-n")
            ws_seeds = gr.Checkbox(False, label="Mean over its seeds (the other regions of its localize run)",
                                   elem_id="lab-wise-seeds")
        ws_run, ws_job, ws_status = job_controls("Run WiSE", "lab-wise", WISE_LATEST)
        page.report("lab-wise", ws_job, WISE)
        ws_plot = gr.Plot(figures.wise_curves([]), elem_id="lab-wise-plot")
        ws_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=tables.WISE_COLUMNS),
                                interactive=False, label="Accuracy and calibration along α", elem_id="lab-wise-table")

        gr.Markdown("### Re-training the region from θ_pre, against BitFit (Table 1)")
        with gr.Row():
            rt_region = gr.Dropdown(store.region_choices(), allow_custom_value=True, label="Region γ",
                                    elem_id="lab-retrain-region")
            rt_epochs = gr.Number(d["ft_epochs"], precision=0, label="Epochs", elem_id="lab-retrain-epochs")
            rt_train = gr.Number(d["ft_train_examples"], precision=0, label="Training examples (0 = all)",
                                 elem_id="lab-retrain-train")
            rt_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="lab-retrain-n")
        rt_run, rt_job, rt_status = job_controls("Re-train region and BitFit", "lab-retrain", RETRAIN_LATEST)
        page.report("lab-retrain", rt_job, RETRAIN)
        rt_table = gr.Dataframe(max_height=TABLE_HEIGHT,
                                value=pd.DataFrame(columns=tables.COMPARE_COLUMNS), interactive=False, wrap=True,
                                label="Fine-tuned, graft, re-trained graft and BitFit", elem_id="lab-retrain-table")
        gr.Markdown(RETRAIN_NOTE, elem_id="lab-retrain-note")
        rt_rel = gr.Plot(figures.empty_figure("Run the re-training to fill this."), elem_id="lab-retrain-reliability")

        gr.Markdown("### Forget-free continual learning (§5.2)")
        with gr.Row():
            cl_tasks = gr.Dropdown(tasks, value=list(ContinualRequest().tasks), multiselect=True,
                                   label="Task sequence, in order", elem_id="lab-continual-tasks")
            cl_budget = gr.Slider(-5, -1, value=d["log_sparsity"], step=0.5, label="log10 sparsity per task",
                                  elem_id="lab-continual-budget")
            cl_n = gr.Number(d["test_examples"], precision=0, label="Test examples per task", elem_id="lab-continual-n")
            cl_seeds = seeds_box("lab-continual-seeds")
        cl_run, cl_job, cl_status = job_controls("Run continual learning", "lab-continual", CONTINUAL_LATEST)
        page.report("lab-continual", cl_job, CONTINUAL)
        cl_plot = gr.Plot(figures.continual_curves({}), elem_id="lab-continual-plot")
        cl_table = gr.Dataframe(max_height=TABLE_HEIGHT, value=pd.DataFrame(columns=CONTINUAL_COLUMNS), interactive=False,
                                label=CONTINUAL_TABLE, elem_id="lab-continual-table")

        gr.Markdown("### Every experiment in one report (`graftui reproduce`)\n"
                    "Runs all of the above on the offline default, one after another, and writes a report with "
                    "tables, findings in words, figures and the command behind every number. Steps are saved as "
                    "they finish: run it again after a stop or a cancel and it resumes.")
        with gr.Row():
            rp_quick = gr.Checkbox(True, label="Quick (short fine-tunes, 300 test examples; about 15 min on 2 "
                                   "CPU cores; the full run takes up to 2 hours)", elem_id="lab-reproduce-quick")
        rp_run, rp_job, rp_status = job_controls("Run every experiment", "lab-reproduce", REPRODUCE_LATEST)
        rp_files = gr.File(label="report.md and report.json", interactive=False, file_count="multiple",
                           elem_id="lab-reproduce-files")
        rp_report = gr.Markdown("", elem_id="lab-reproduce-report")

    page.region_pickers += [(ws_region, False), (rt_region, False)]
    page.keep(lab_tasks=mt_tasks, lab_group=mt_group, lab_start=mt_start, lab_budget=mt_budget, lab_steps=mt_steps,
              lab_purify=mt_purify, lab_n=mt_n, wise_region=ws_region, wise_alphas=ws_alphas, wise_n=ws_n,
              retrain_region=rt_region, retrain_epochs=rt_epochs, retrain_train=rt_train, retrain_n=rt_n,
              continual_tasks=cl_tasks, continual_budget=cl_budget, continual_n=cl_n, reproduce_quick=rp_quick,
              lab_seeds=mt_seeds, continual_seeds=cl_seeds, wise_seeds=ws_seeds)

    @page.guard(beside=mt_status, tasks=mt_tasks, group=mt_group, sparsity=mt_budget, start=mt_start, steps=mt_steps,
                purify_steps=mt_purify, n=mt_n, seeds=mt_seeds)
    def on_multitask(tasks, group, log_s, start, steps, purify, n, seeds):
        job = forms.submit_multitask(store.runner(), tasks=tasks, group=group, log_sparsity=log_s, start=start,
                                       steps=steps, purify_steps=purify, examples_per_class=d["examples_per_class"], n=n,
                                       seeds=seeds)
        return submitted(job, MULTITASK, MULTITASK_LATEST)

    page.on(mt_run.click, on_multitask, [mt_tasks, mt_group, mt_budget, mt_start, mt_steps, mt_purify, mt_n, mt_seeds],
            [status, mt_job, mt_status])

    @page.guard(beside=ws_status, region=ws_region, alphas=ws_alphas, n=ws_n, replicates=ws_seeds)
    def on_wise(region_id, alphas, n, over_seeds):
        job = forms.submit_wise(store.runner(), region_id=region_id, alphas=alphas, ood=[], n=n,
                                  over_seeds=over_seeds)
        return submitted(job, WISE, WISE_LATEST)

    page.on(ws_run.click, on_wise, [ws_region, ws_alphas, ws_n, ws_seeds], [status, ws_job, ws_status])

    @page.guard(beside=rt_status, region=rt_region, epochs=rt_epochs, train_examples=rt_train, n=rt_n)
    def on_retrain(region_id, epochs, train, n):
        job = forms.submit_retrain(store.runner(), region_id=region_id, epochs=epochs, train_examples=train, n=n)
        return submitted(job, RETRAIN, RETRAIN_LATEST)

    page.on(rt_run.click, on_retrain, [rt_region, rt_epochs, rt_train, rt_n], [status, rt_job, rt_status])

    @page.guard(beside=cl_status, tasks=cl_tasks, sparsity=cl_budget, n=cl_n, seeds=cl_seeds)
    def on_continual(tasks, log_s, n, seeds):
        job = forms.submit_continual(store.runner(), tasks=tasks, log_sparsity=log_s, steps=d["steps"],
                                       examples_per_class=d["examples_per_class"], n=n, seeds=seeds)
        return submitted(job, CONTINUAL, CONTINUAL_LATEST)

    page.on(cl_run.click, on_continual, [cl_tasks, cl_budget, cl_n, cl_seeds], [status, cl_job, cl_status])

    @page.guard(beside=rp_status, quick=rp_quick)
    def on_reproduce(quick):
        job = forms.submit_reproduce(store.runner(), quick=quick)
        return submitted(job, REPRODUCE, REPRODUCE_LATEST)

    page.on(rp_run.click, on_reproduce, [rp_quick], [status, rp_job, rp_status])

    page.panel("lab", MULTITASK, mt_job, mt_status, [mt_overlap, mt_gain, mt_table, mt_note], render_multitask,
               MULTITASK_LATEST)
    page.panel("lab", WISE, ws_job, ws_status, [ws_plot, ws_table], render_wise, WISE_LATEST)
    page.panel("lab", RETRAIN, rt_job, rt_status, [rt_table, rt_rel], render_retrain, RETRAIN_LATEST)
    page.panel("lab", CONTINUAL, cl_job, cl_status, [cl_plot, cl_table], render_continual, CONTINUAL_LATEST)
    page.panel("lab", REPRODUCE, rp_job, rp_status, [rp_files, rp_report], render_reproduce, REPRODUCE_LATEST)
    return tab
