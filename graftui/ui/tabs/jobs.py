"""The jobs panel below the tabs: every job of this session, its request and its report bundle."""

from __future__ import annotations

import time

import gradio as gr

from ... import settings, tracking
from ...errors import SessionError
from .. import forms, jobwords, store
from ..wiring import LIVE_REDRAW_SECONDS, cancel_button, cancel_look

LABEL = "Cancel selected job"
NEXT = "Run selected job next"


def next_button(job):
    """The Run next button: on while the picked job waits, and (hosted) is this session's own."""
    own = job is not None and (not settings.hosted() or job.owner == store.runner().owner)
    return gr.update(interactive=own and jobwords.movable(job))


def move_up(picked) -> str:
    """Move this page's picked waiting job to the front of its lane (hosted: of its client's own jobs, in its turn);
    a job that is not this session's, not waiting or not there is refused in one line."""
    runner = store.runner()
    job = runner.get(picked) if isinstance(picked, str) and picked else None
    if job is None:
        raise SessionError("pick a waiting job of yours in the Job list first")
    mine = settings.hosted()  # hosted: only a session's own jobs move; the server's are watched, not moved
    moved = runner.runner.move_up(job.id, owner=runner.owner, check_owner=mine)
    return f"Moved up **{jobwords.md(moved.title)}** [{moved.id}]: {jobwords.wait_words(runner, moved)}."


def build(page) -> None:
    with gr.Accordion("Jobs", open=True, elem_id="jobs-panel"):
        gr.Markdown("Jobs run in the background in two lanes, each one job at a time: a quick lane for work of "
                    "seconds (a prediction, a check), beside the main lane for the rest, so a short job never waits "
                    "behind a long one; a lane takes its waiting jobs from each user in turn, shortest expected first, "
                    "a job's wait counting in its favour (**Run selected job next** moves a waiting job to the front). "
                    "They keep running when you close or reload the page, and stay listed after a restart.")
        report_to = gr.Dropdown(list(tracking.REPORT_TO), value=store.report_to(), label="Report runs to",
                                info="an experiment tracker that keeps every job's request, curves, metrics, card "
                                "and files (trackio: a local dashboard, `trackio show --project graftui`)",
                                elem_id="jobs-report-to", visible=not settings.hosted())
        jobs_df = gr.Dataframe(jobwords.job_rows(store.runner()), interactive=False, wrap=True, elem_id="jobs-table")
        with gr.Row():
            job_sel = gr.Dropdown(jobwords.job_choices(store.runner()), label="Job", elem_id="jobs-select",
                                  allow_custom_value=True)  # see wiring.job_picker
            job_cancel = gr.Button(LABEL, variant="secondary", interactive=False, elem_id="jobs-cancel",
                                   scale=0)
            job_next = gr.Button(NEXT, variant="secondary", interactive=False, elem_id="jobs-run-next", scale=0)
        job_md = gr.Markdown("", elem_id="jobs-detail")
        with gr.Accordion("Request of the selected job (re-run it with `graftui run FILE`)", open=False):
            job_req = gr.Code("", language="json", interactive=False, elem_id="jobs-request")
            job_req_dl = gr.DownloadButton("Download request (JSON)", value=None, elem_id="jobs-request-download")
        with gr.Row():
            job_bundle = gr.Button("Make report bundle of the selected job", elem_id="jobs-bundle", scale=0,
                                   interactive=False)  # on once a finished job with a result is picked
            job_bundle_file = gr.File(label="Report bundle (.zip: README, request, tables as CSV and JSON, figures)",
                                      interactive=False, elem_id="jobs-bundle-file")
    jobs_sig, armed = gr.State(None), page.state(None)

    def tick_jobs(last, picked, memory):
        """The jobs table and the picked job's line: a new job or a new status at once, running figures
        (progress, duration) at most every LIVE_REDRAW_SECONDS."""
        runner = store.runner()
        sig = jobwords.job_signature(runner)
        job = runner.get(picked) if picked else None
        detail = jobwords.job_line(runner, job) if job else ""
        listing = [(j[0], j[1]) for j in sig]
        now = time.monotonic()
        if last is not None and listing == last[0]:
            fresh = sig == last[1] or now - last[3] < LIVE_REDRAW_SECONDS
            table = gr.skip() if fresh else jobwords.job_rows(runner)
            picker = gr.skip()  # its choices change only when a job appears or changes status
        else:
            fresh = False
            table, picker = jobwords.job_rows(runner), gr.update(choices=jobwords.job_choices(runner))
        line = gr.skip() if last is not None and detail == last[2] else detail
        same = last is not None and listing == last[0]  # no job appeared and none changed status
        kept = jobwords.cancellable(job) and jobwords.still_armed(memory, picked)  # armed for it: it keeps asking
        button = gr.skip() if same or kept else cancel_button(job, LABEL)
        bundle = gr.skip() if same else gr.update(interactive=forms.reportable(job))
        return (table, picker, line, button, gr.skip() if same else next_button(job), bundle,
                (listing, last[1] if fresh else sig, detail, last[3] if fresh else now))

    @page.quiet
    def on_report_to(name):
        store.set_report_to(name)
        return f"Jobs report to {name} from now on." if name != tracking.NONE else "Jobs report to no tracker."

    page.on(report_to.change, on_report_to, [report_to], [page.status])

    page.poll.add(tick_jobs, [jobs_sig, job_sel, armed], [jobs_df, job_sel, job_md, job_cancel, job_next, job_bundle,
                                                          jobs_sig])

    @page.safe
    def on_job_next(picked):
        return move_up(picked)

    page.on(job_next.click, on_job_next, [job_sel], [page.status])

    @page.safe
    def on_job_cancel(picked, shown_label, memory):
        runner = store.runner()
        job = runner.get(picked) if picked else None
        if picked and job is None:
            runner.check_cancel(picked)  # refused: not this page's job
        message, memory, look = jobwords.cancel_step(runner, job, memory, time.time(), jobwords.asks(shown_label))
        return cancel_look(look, LABEL), memory, message

    page.confirm(job_cancel, on_job_cancel, [job_sel], armed, [job_cancel, armed, page.status], "on_job_cancel")
    page.disarms(job_cancel, armed, lambda picked: cancel_button(store.runner().get(picked) if picked else None, LABEL),
                 [job_sel])

    @page.safe
    def on_job_pick(picked, memory):
        job = store.runner().get(picked) if picked else None
        path = forms.request_file(job)
        kept = jobwords.still_armed(memory, picked)  # a press on this job was answered first: it stays armed
        return (jobwords.request_words(job), gr.update(value=str(path) if path else None),
                gr.skip() if kept or memory is None else None, gr.skip() if kept else cancel_button(job, LABEL),
                next_button(job), gr.update(interactive=forms.reportable(job)), gr.skip())

    page.on(job_sel.change, on_job_pick, [job_sel, armed], [job_req, job_req_dl, armed, job_cancel, job_next,
                                                            job_bundle, page.status], **page.one_at_a_time(armed))

    @page.safe
    def on_job_bundle(picked):
        return forms.report_bundle(store.runner().get(picked) if picked else None), gr.skip()

    page.on(job_bundle.click, on_job_bundle, [job_sel], [job_bundle_file, page.status])
