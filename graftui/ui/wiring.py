"""What every tab's builder shares: the :class:`Page`, the error guard, the session wrapper, job pickers
and result panels, and the one polling event per tab (:class:`Poll`).

Nothing here knows a tab; the tabs (``tabs/``) and the page (``app.py``) import it.
"""

from __future__ import annotations

import functools
import html
import inspect
import logging
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from .. import settings
from ..errors import message
from ..jobs import QUEUED
from ..requests import choices_of
from . import forms, jobwords, store

log = logging.getLogger(__name__)

TABLE_HEIGHT = 4000  # px: result tables show every row; the page scrolls, not the table
# A plot redraw costs the browser a few hundred ms of CPU; on a small machine that is taken from the job.
LIVE_REDRAW_SECONDS = 8.0


# -- error handling and sessions ---------------------------------------------------------------------
# a CLI flag in a message, with the metavar some messages put after it ("give --finetuned REF")
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)(?: (?:REF|FILE|DIR|N)\b)?")


def label_words(widget) -> str:
    """A widget's label as a message names it: without the hint in brackets ("Training examples (0 = all)")."""
    label = widget if isinstance(widget, str) else str(getattr(widget, "label", "") or "")
    return re.sub(r"\s*\([^()]*\)\s*$", "", label).strip()


def in_words(text: str, fields: dict | None = None) -> str:
    """A message's CLI flags (``--steps``) as the page names them: the label of the widget that holds the field
    ("Mask steps"), else the field in words; the library words its messages for the command line."""
    fields = fields or {}

    def name(m) -> str:
        field = m.group(1).replace("-", "_")
        return label_words(fields[field]) if fields.get(field) is not None else field.replace("_", " ")

    out = FLAG.sub(name, text)
    return out[:1].upper() + out[1:] if out != text and FLAG.match(text) else out


def friendly_message(err: BaseException, fields: dict | None = None) -> str:
    """One line a person can act on (graftui.errors.message), naming widgets where it names CLI flags
    (``fields``: request field -> the widget, or words, that holds it); the traceback goes to the server log only."""
    text = str(err.message) if isinstance(err, gr.Error) else message(err)
    return in_words(text, fields)


def guarded(status, toast: bool = True, beside=None, fields: dict | None = None):
    """Decorator: run a handler; on any exception show a warning and put the message in ``status``,
    and in ``beside`` too (the message line next to the control that failed, which also loses
    whatever it said before, so no stale "✓" stays). ``fields`` maps the request fields the handler
    fills to their widgets, which the message names.

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
                # a toast does not pass ``page_view``; a message quotes form values, shown as text, never as HTML
                message = html.escape(store.public(friendly_message(err, fields)), quote=False)
                if toast:
                    gr.Warning(message)
                return {status: f"{WARNING}{message}", **({beside: f"{WARNING}{message}"} if beside is not None else {})}

        return run

    return wrap


WARNING = "⚠️ "  # how the status line starts when it shows an error


def clears_error(fn, status, shows_error, at: int, width: int):
    """``fn``, whose ``width`` outputs hold ``status`` at ``at``, taking and returning one more value: the State
    ``shows_error`` (whether the status line shows an error of this page). A handler that succeeds while it does,
    and leaves the line as it is, clears it: an error made on one tab does not outlast a later action on any tab."""

    def call(*args):
        *inputs, shown = args
        got = fn(*inputs)
        if isinstance(got, dict) and "__type__" not in got:  # {component: value}, as ``guarded`` answers a failure
            if status in got:
                return {**got, shows_error: _is_error(got[status])} if _is_error(got[status]) != bool(shown) else got
            return {**got, status: "", shows_error: False} if shown else got
        values = list(got) if width > 1 and isinstance(got, (tuple, list)) else [got]
        value = values[at]
        if isinstance(value, str):
            now = _is_error(value)
        elif shown and _skipped(value):
            values[at], now = "", False
        else:
            now = bool(shown)
        return (*values, gr.skip() if now == bool(shown) else now)

    call.__name__ = getattr(fn, "__name__", "handler")
    return call


def announces(fn, at: int, width: int, status=None, announced=None):
    """``fn``, whose ``width`` outputs hold the status line (``status``) at ``at``, returning one more value (the State
    ``announced``): the id of the job the line now announces (a ``jobwords.Banner``), "" where it now says anything
    else, or no change where it is left."""

    def call(*args):
        got = fn(*args)
        if isinstance(got, dict) and "__type__" not in got:  # {component: value}, as ``guarded`` answers a failure
            # the line shows the failure, which the end of a job it announced before must not overwrite
            return {**got, announced: ""} if status is not None and status in got else got
        values = list(got) if width > 1 and isinstance(got, (tuple, list)) else [got]
        value = values[at]
        job = value.job if isinstance(value, jobwords.Banner) else "" if isinstance(value, str) else gr.skip()
        return (*values, job)

    call.__name__ = getattr(fn, "__name__", "handler")
    return call


def _is_error(value) -> bool:
    return isinstance(value, str) and value.startswith(WARNING)


def in_session(fn, outputs: list | None = None):
    """``fn`` called as ``call(session_id, *inputs)``: the store's workspace is the session's for the call.

    What crosses the page's boundary is translated here, once for every handler: the inputs' ``workspace:…`` names
    become the workspace's paths (``store.private``), and what ``fn`` answers for ``outputs`` is what the page may
    see (:func:`page_view`): no server path, no session id, downloads from a served copy."""

    def call(session_id, *args):
        with store.session(session_id):
            got = fn(*store.private(list(args)))
            return got if outputs is None else page_view(got, outputs)

    call.__name__ = getattr(fn, "__name__", "handler")
    return call


FILE_WIDGETS = (gr.File, gr.DownloadButton)  # their value is a file the page downloads


def page_view(got, outputs: list):
    """A handler's answer for ``outputs`` as the page may see it (hosted; locally as it is): each file a page
    downloads is served from a copy that names no session (``store.serve``); every other value through
    ``store.public``; a State, which never leaves the server, as it is."""
    if not settings.hosted():
        return got
    if isinstance(got, dict) and "__type__" not in got:  # {component: value}, as ``guarded`` answers a failure
        return {c: _view(c, v) for c, v in got.items()}
    if len(outputs) == 1:
        return _view(outputs[0], got)
    if isinstance(got, (tuple, list)) and len(got) == len(outputs):
        return type(got)(_view(c, v) for c, v in zip(outputs, got))
    return store.public(got)  # gr.skip() for every output


def _view(component, value):
    if isinstance(component, gr.State) and not isinstance(component, gr.BrowserState):
        return value
    if isinstance(component, FILE_WIDGETS):
        if isinstance(value, dict) and "value" in value:  # gr.update(value=…)
            return {**value, "value": _served(value["value"])}
        return _served(value)
    return store.public(value)


def _served(value):
    if isinstance(value, (list, tuple)):
        return [store.serve(v) for v in value]
    return store.serve(value)


# -- widgets read from the requests ------------------------------------------------------------------
def skip_none(value):
    """A widget's new value, or no update where an action has none (None)."""
    return gr.skip() if value is None else value


def request_radio(request, name: str, labels: dict[str, str], **kwargs) -> gr.Radio:
    """A radio over the values a request field accepts, starting at its default; ``labels`` only names them."""
    return gr.Radio([(labels.get(v, v), v) for v in choices_of(request, name)], value=request.defaults()[name], **kwargs)


# -- jobs on a tab ---------------------------------------------------------------------------------
def job_picker(latest_label: str, prefix: str):
    """A picker of one kind's jobs, ``#prefix-job``, first offering the latest one.

    It takes any value: its choices change on every poll, and a poll that lists the jobs just before
    a new one is submitted would otherwise leave the new job's id "not in the choices", and Gradio
    would then refuse every later poll, so the page would never show that job end. The id is only
    ever looked up among the session's own jobs.
    """
    return gr.Dropdown([(latest_label, "")], value="", label="Show job", elem_id=f"{prefix}-job", allow_custom_value=True)


def job_controls(label: str, prefix: str, latest_label: str):
    """A Run button, a picker of this kind's jobs and their status line: ``#prefix-run``, ``-job``, ``-status``."""
    with gr.Row():
        run = gr.Button(label, variant="primary", elem_id=f"{prefix}-run", scale=0)
        job = job_picker(latest_label, prefix)
    return run, job, gr.Markdown("", elem_id=f"{prefix}-status")


def picker_for(kinds: tuple[str, ...], latest_label: str, job):
    """A job picker showing ``job`` among the jobs of ``kinds``."""
    choices = [(latest_label, "")] + jobwords.job_choices(store.runner(), kinds)
    return gr.update(choices=choices, value=job.id)


def seeds_box(elem_id: str, info: str = "the experiment once per mask seed; every figure becomes the mean over "
              "seeds, with its spread and each seed's own numbers") -> gr.Textbox:
    """The Seeds (replicates) box of a form: empty for one run, or seeds such as '0, 1, 2' (``forms.parse_seeds``)."""
    return gr.Textbox("", label="Seeds (replicates)", placeholder="one run; or e.g. 0, 1, 2", info=info,
                      elem_id=elem_id)


def submitted(job, kinds: tuple[str, ...], latest_label: str) -> tuple:
    """What a Run button's handler answers: the banner and the tab's picker showing the new job. The status line
    (the third output, where a refused form says why) is left to the panel, which writes it together with its
    record of what it shows: a line written here could land after a tick that saw the job end, and stay."""
    return jobwords.submitted_line(job), picker_for(kinds, latest_label, job), gr.skip()


ANSWER_SECONDS = 10.0  # the longest a Run button of instant work waits for its job's answer; longer goes to the panel


def answered(job, kinds: tuple[str, ...], latest_label: str, render, seconds: float = ANSWER_SECONDS) -> tuple:
    """What the Run button of instant work (a quick-lane job: a prediction) answers: as ``submitted``, and when the job
    is foreseen to end within ``seconds`` and does, its status line and ``render(job)`` at once, not at the panel's
    next tick (a job not foreseen so is left to the panel: a waiting button holds one of the page's handlers)."""
    runner = store.runner()
    when = runner.expected(job.id)
    soon = when is not None and when[1] is not None and when[1] <= seconds
    done = runner.wait(job.id, seconds) if soon else None
    if done is None or done.status not in jobwords.FINISHED:
        return (*submitted(job, kinds, latest_label), *[gr.skip() for _ in render(None)])
    return (jobwords.submitted_line(job), picker_for(kinds, latest_label, job), jobwords.job_line(runner, done),
            *render(done))


JOB_FORMS = {  # which request field fills which widget when a panel shows a job (None: the widget's own value)
    "localize": ["method", ("sparsity", lambda v: math.log10(v) if v else None), "steps", "examples_per_class", "lr",
                 ("seeds", lambda v: ", ".join(map(str, v))), "keep"],
    "compare": [("regions", lambda v: [Path(p).stem for p in v or []] or None), "n", "baselines"],
    "finetune": ["optimizer", "lr", "epochs", "train_examples", "lora_rank"],
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


def cancel_look(look: str, label: str):
    """A Cancel button as ``jobwords.cancel_step`` says: "off" (nothing to cancel), "armed" (press again to confirm)
    or "ready"."""
    if look == "armed":
        return gr.update(value=f"{jobwords.CONFIRM} cancel", variant="stop", interactive=True)
    return gr.update(value=label, variant="secondary", interactive=look == "ready")


def cancel_button(job, label: str):
    """A Cancel button as the job shown leaves it: on while it waits or runs, off once it has ended (or for none)."""
    return cancel_look("ready" if jobwords.cancellable(job) else "off", label)


def job_panel(sig_state, kinds, picker, status_md, outputs, render, latest_label, fixed_state=None, cancel=None):
    """The polled part of a result panel: the picked job of ``kinds`` (or the latest one), re-rendered only
    when it changed; ``sig_state`` remembers what it last showed, ``cancel`` is the (button, label, its memory) turned
    off while the job shown has finished (a press that armed it for the job shown keeps its look while that job
    waits or runs). Returns the part's function, inputs, outputs.

    The picker's value is the one state of what the panel shows: every tick reads it and the status line as the page
    shows it, and writes the line again from the picked job's own record wherever the two differ. An answer that
    landed late (a tick begun before a pick, or before the job ended, on a busy machine) is so corrected at the next
    tick: a finished job never keeps a "queued · starts in …" line, and the line always names the job picked. A
    warning in the line (a refused form says why there) stays until the job shown changes."""

    def tick(picked, last, screen=None, armed=None):
        runner = store.runner()
        job = jobwords.shown_job(runner, picked, kinds)
        listing = tuple((j.id, j.status) for j in runner.jobs() if j.kind in kinds)
        shown = None if job is None else (job.id, job.status)
        place = runner.place(job.id) if job is not None and job.status == QUEUED else None
        when = jobwords.job_when(runner, job)  # coarse: it changes every few ticks, not at each
        line = None if job is None else (len(job.progress), round(job.fraction, 3), job.message, place, when)
        running = job is not None and job.status == "running"
        another = last is None or shown != last[1]  # another job, or another status: the Cancel button follows
        new_list, new_line, redraw, state = panel_changes(last, listing, shown, line, running, time.monotonic())
        text = jobwords.job_status_line(job, place, when)
        if not new_line and screen is not None and not _is_error(screen) and not same_line(screen, text):
            new_line = True  # the page shows another job's line, or an old one of this job: the record wins
        kept = jobwords.cancellable(job) and jobwords.still_armed(armed, job.id)
        button = [] if cancel is None else [cancel_button(job, cancel[1]) if another and not kept else gr.skip()]
        if not (new_list or new_line or redraw):
            return (gr.skip(), gr.skip(), *[gr.skip() for _ in outputs], *button, state)
        picker_update = gr.update(choices=[(latest_label, "")] + jobwords.job_choices(runner, kinds)) if new_list else gr.skip()
        status_update = text if new_line else gr.skip()
        figures_out = render(job) if redraw else [gr.skip() for _ in outputs]
        return (picker_update, status_update, *figures_out, *button, state)

    watched = fixed_state if fixed_state is not None else picker
    inputs = [watched, sig_state, status_md, *([] if cancel is None else [cancel[2]])]
    outs = ([picker] if fixed_state is None else []) + [status_md, *outputs,
                                                        *([] if cancel is None else [cancel[0]]), sig_state]
    polled = tick if fixed_state is None else (lambda *values: tick(*values)[1:])
    return polled, inputs, outs


def same_line(screen, text: str) -> bool:
    """Whether the status line the page shows (``screen``, as the page sent it back) is ``text``: both as a page sees
    them (``store.public``; Gradio strips a Markdown value's indentation and ends)."""

    return inspect.cleandoc(str(store.public(screen))) == inspect.cleandoc(str(store.public(text)))


# -- polling ---------------------------------------------------------------------------------------
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

    def wire(self, timers: dict, status, announced, sid, opened: dict | None = None) -> None:
        """Each tab's timer ticks the parts of that tab and those of every tab; so does opening the tab
        (``opened``: the event of each tab's select handler), so a tab hidden while its job ran or ended shows
        where the job is at once, not a line written before it was hidden."""
        for part in self.parts:
            if part[3] is not None and part[3] not in timers:
                raise ValueError(f"no timer for the tab '{part[3]}'")
        for name, timer in timers.items():
            self._wire([p[:3] for p in self.parts if p[3] in (None, name)], timer, status, announced, sid,
                       (opened or {}).get(name))

    @staticmethod
    def _wire(parts: list, timer, status, announced, sid, opened=None) -> None:
        inputs = [sid, announced, *(c for _, ins, _ in parts for c in ins)]
        outputs = list({id(c): c for _, _, outs in parts for c in outs}.values())  # a component two parts update
        # (a panel's Cancel button, and the part that disarms it) is one output: the later part's answer wins
        where = {id(c): j for j, c in enumerate(outputs)}

        # (input position, output position) of each State a part reads and writes back
        kept = [[(i, j) for j, c in enumerate(outs) if isinstance(c, gr.State) for i, x in enumerate(ins) if x is c]
                for _, ins, outs in parts]

        def tick(job, *values):
            settled = jobwords.settled_banner(job)  # the line that announced ``job``, once that job has ended
            out, at, problem = [gr.skip() for _ in outputs], 0, gr.skip() if settled is None else settled
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
                for component, value in zip(outs, got):
                    if not _skipped(value):
                        out[where[id(component)]] = value
                at += len(ins)
            out += [problem, gr.skip() if settled is None else ""]  # a settled line announces no job any more
            return gr.skip() if all(_skipped(v) for v in out) else tuple(out)

        tick = in_session(tick, [*outputs, status, announced])
        timer.tick(tick, inputs, [*outputs, status, announced], show_progress="hidden")
        if opened is not None:
            opened.then(tick, inputs, [*outputs, status, announced], show_progress="hidden")


def _skipped(value) -> bool:
    return isinstance(value, dict) and value == gr.skip()


def _same(new, old) -> bool:
    """Whether a State's new value is its old one. Gradio re-builds the config of every State an event
    writes, even with an unchanged value (a few ms each, profiled); an unchanged one is not written."""
    try:
        return bool(new == old)
    except Exception:  # noqa: BLE001 - values that do not compare (arrays) are written
        return False


# -- the page --------------------------------------------------------------------------------------
@dataclass(eq=False)
class Page:
    """What each tab's builder is given.

    The status line and session id; the helpers that wire widgets to flows (``on``, ``safe``, ``panel``,
    ``report`` …); what the page wires across tabs once they are all built (the form it keeps, the region and
    checkpoint pickers, the panels' States); and the widgets one tab makes and later tabs read. Tabs are built
    in order, so a tab reads only those of the tabs before it; ``after_tabs`` wires what reads a later one.
    """

    status: gr.Markdown
    sid: gr.BrowserState
    defaults: dict  # store.defaults(): what the number widgets start with
    poll: Poll = field(default_factory=Poll)
    kept: dict = field(default_factory=dict)  # form key -> widget: the browser keeps its value across reloads
    tab_kept: dict = field(default_factory=dict)  # the same, for this browser tab alone: a new tab starts without them
    cancel_buttons: dict = field(default_factory=dict)  # id(picker) -> (its Cancel button, its label, its memory)
    panels: dict = field(default_factory=dict)  # tab -> its panels' States, forgotten when the tab opens
    region_pickers: list = field(default_factory=list)  # (dropdown, several): refreshed when regions change
    checkpoint_pickers: list = field(default_factory=list)  # (dropdown, base offered): refreshed with checkpoints
    pending: list = field(default_factory=list)  # wiring that waits for every tab
    loads: list = field(default_factory=list)  # wiring that follows the page's load: each called with its event
    states: list = field(default_factory=list)  # placed at the page's root by finish()
    callers: list = field(default_factory=list)  # the hidden triggers of API-only events (``confirm``), placed there too
    # made by Models, read by every tab that runs on the pair and task
    base: gr.Dropdown | None = None
    finetuned: gr.Dropdown | None = None
    task: gr.Dropdown | None = None
    ood: gr.Dropdown | None = None
    ood_labels: gr.Textbox | None = None
    columns: tuple = ()  # text, pair and label column of an uploaded task
    prompt: tuple = ()  # head, template and label words of a language model
    # made by Localize, read by the pair check (the budget's size) and the sweep (its mask settings)
    budget: gr.Slider | None = None
    budget_info: gr.Markdown | None = None
    mask: tuple = ()  # steps, examples per class, learning rate
    region_table: gr.Dataframe | None = None  # the saved regions, refreshed with the region pickers
    shows_error: gr.State | None = None  # whether the status line shows an error (made on the first ``on``)
    announced: gr.State | None = None  # the id of the job the status line announces ("" for none): see ``announces``

    def __post_init__(self):
        self.announced = self.state("")

    def on(self, event, fn, inputs, outputs, **kwargs):
        """Wire ``fn`` to ``event`` as this page's session: the id travels with the inputs and is entered
        around the call, so everything ``fn`` lists, reads, writes or submits is the session's own. A handler
        that writes the status line clears an error it shows once the handler succeeds (``clears_error``)."""
        inputs, outputs = list(inputs or []), list(outputs or [])
        if any(o is self.status for o in outputs):
            if self.shows_error is None:
                self.shows_error = self.state(False)
            at = next(i for i, o in enumerate(outputs) if o is self.status)
            fn = announces(fn, at, len(outputs), self.status, self.announced)
            outputs = [*outputs, self.announced]
            fn = clears_error(fn, self.status, self.shows_error, at, len(outputs))
            inputs, outputs = [*inputs, self.shows_error], [*outputs, self.shows_error]
        return event(in_session(fn, outputs), [self.sid, *inputs], outputs, **kwargs)

    def named(self, **widgets) -> dict:
        """Request field -> the widget that holds it, for messages (``in_words``): the pair, task and prompt of the
        Models tab, and ``widgets`` (which win: the Fine-tune tab has its own base)."""
        common = {"base": self.base, "finetuned": self.finetuned, "task": self.task, "ood": self.ood,
                  "ood_labels": self.ood_labels,
                  **dict(zip(("text_column", "pair_column", "label_column"), self.columns)),
                  **dict(zip(("head", "template", "label_words"), self.prompt))}
        return {k: v for k, v in {**common, **widgets}.items() if v is not None}

    def guard(self, beside=None, toast: bool = True, **widgets):
        """``guarded`` for a handler of this page: its message also beside it, naming ``named(**widgets)``."""
        return guarded(self.status, toast=toast, beside=beside, fields=self.named(**widgets))

    @property
    def safe(self):
        """Guard for a handler whose outputs end with the status line."""
        return self.guard()

    @property
    def quiet(self):
        """Guard for a handler that runs without a click (a value changed, a job picked): a failure shows in the
        status line, without a toast."""
        return self.guard(toast=False)

    def keep(self, **widgets) -> None:
        """The browser keeps these widgets' values; a reload puts them back."""
        self.kept.update(widgets)

    def state(self, value=None) -> gr.State:
        """A State of this page, placed at the page's root by :meth:`finish`, with the page's other States:
        made while a tab is built, it would otherwise sit among the tabs of gr.Tabs."""
        state = gr.State(value, render=False)
        self.states.append(state)
        return state

    def after_tabs(self, wire: Callable[[], Any]) -> None:
        """Wiring that needs a later tab's widgets: run by :meth:`finish`."""
        self.pending.append(wire)

    def finish(self) -> None:
        """Once every tab is built: place the States and run the wiring that waited for the later tabs."""
        for block in (*self.states, *self.callers):
            block.render()
        for wire in self.pending:
            wire()

    def panel(self, tab: str, kinds, picker, status_md, outputs, render, latest_label, fixed_state=None) -> None:
        """A result panel of ``tab``: polled while that tab is open; picking a job shows it at once."""
        sig_state, cancel = self.state(), self.cancel_buttons.get(id(picker))
        polled, inputs, outs = job_panel(sig_state, kinds, picker, status_md, outputs, render, latest_label, fixed_state,
                                         cancel)
        self.poll.add(polled, inputs, outs, tab=tab)
        self.panels.setdefault(tab, []).append(sig_state)
        if fixed_state is None and picker.elem_id:
            self.tab_kept[picker.elem_id] = picker  # the job this browser tab shows, whatever another tab submits
            button_at = None if cancel is None else outs.index(cancel[0])

            def on_pick(picked, fn=polled):  # the Cancel button's look is the pick's handler's (``cancel``): one
                got = list(fn(picked, None, None))  # at a time with the presses, which this drawing would hold up
                if button_at is not None:
                    got[button_at] = gr.skip()
                return (*got, gr.skip())

            self.on(picker.change, self.quiet(on_pick), [picker], [*outs, self.status])

    def shows(self, kind: str, picker, widgets: list) -> None:
        """A picked job puts its own settings into the form above it ("latest" leaves the form alone)."""
        def fill(picked):
            return [*job_form(kind, store.runner().get(picked) if picked else None), gr.skip()]

        self.on(picker.input, self.quiet(fill), [picker], [*widgets, self.status], show_progress="hidden")

    def confirm(self, button, fn, inputs: list, armed, outputs: list, api_name: str) -> None:
        """Wire the presses of a confirm button to ``fn(*inputs, label, memory)``: ``label`` is what the button showed
        when pressed (a press confirms only where it asked to), ``memory`` the ``armed`` State.

        Gradio leaves a Button's value out of its API's description, so a call made as the description says would
        lack it: the page's event is kept out of the description (``{api_name}_press``) and ``api_name`` is
        described with the inputs it lists. A call there reads as a press on a button that showed what the calls
        before it left: the first arms it, a second within CONFIRM_SECONDS on the same pick confirms."""
        self.on(button.click, fn, [*inputs, button, armed], outputs, api_name=f"{api_name}_press",
                api_visibility="undocumented", **self.one_at_a_time(armed))
        caller = gr.Button(visible=False, render=False)  # pressed by no one: the described event's trigger
        self.callers.append(caller)

        def called(*values):
            *given, memory = values
            if jobwords.expired(memory, time.time()):
                memory = None
            return fn(*given, jobwords.CONFIRM if memory is not None else "", memory)

        self.on(caller.click, called, [*inputs, armed], outputs, api_name=api_name, **self.one_at_a_time(armed))

    def cancel(self, button, picker, kinds: tuple[str, ...]) -> None:
        """``button`` cancels the job ``picker`` shows, once confirmed by a second press; it is off while the job
        shown has finished (the panel of ``picker`` turns it on and off as the job's status changes)."""
        armed, label = self.state(None), button.value
        self.cancel_buttons[id(picker)] = (button, label, armed)

        @self.safe
        def run(picked, shown_label, memory):
            message, memory, look = jobwords.cancel_step(store.runner(), jobwords.shown_job(store.runner(), picked, kinds),
                                                        memory, time.time(), jobwords.asks(shown_label))
            return cancel_look(look, label), memory, message

        def unarm(picked, memory):  # another job shown: a press must name it first
            shown = jobwords.shown_job(store.runner(), picked, kinds)
            if jobwords.still_armed(memory, shown and shown.id):
                return gr.skip(), gr.skip()
            return gr.skip() if memory is None else None, cancel_button(shown, label)

        self.confirm(button, run, [picker], armed, [button, armed, self.status],
                     f"on_{(button.elem_id or 'cancel').replace('-', '_')}")
        self.on(picker.change, unarm, [picker, armed], [armed, button], show_progress="hidden",
                **self.one_at_a_time(armed))
        self.disarms(button, armed, lambda picked: cancel_button(jobwords.shown_job(store.runner(), picked, kinds),
                                                                 label), [picker])

    @staticmethod
    def one_at_a_time(armed) -> dict:
        """Event options that answer a confirm button's presses and the picks that disarm it one at a time, in the
        order they came: Gradio reads a State when an event starts, so each reads what the one before it wrote.
        The queue is one for every session, so only handlers of a few milliseconds join it (no drawing); a pick
        answered after a press leaves it armed for what is picked (``jobwords.still_armed``) whatever the order."""
        return {"concurrency_id": f"confirm-{armed._id}", "concurrency_limit": 1}

    def disarms(self, button, armed, look, inputs: list = ()) -> None:
        """A confirm button left armed goes back to its first look (``look(*inputs)``) once CONFIRM_SECONDS have
        passed: a later press asks again, and the button never says "Confirm" when it would not."""
        def tick(memory, *values):
            if not jobwords.expired(memory, time.time()):
                return gr.skip(), gr.skip()
            return look(*values), None

        self.poll.add(tick, [armed, *inputs], [button, armed])

    def report(self, prefix: str, picker, kinds: tuple[str, ...]) -> None:
        """A button that downloads the shown job's tables (CSV, JSON) and figures (HTML) as its report bundle."""
        with gr.Row():
            button = gr.Button("Download tables & figures (.zip)", size="sm", elem_id=f"{prefix}-report", scale=0,
                               min_width=260)
            file = gr.File(label="Report bundle: README, request, tables as CSV and JSON, figures as HTML",
                           interactive=False, visible=False, elem_id=f"{prefix}-report-file")

        @self.safe
        def on_report(picked):
            job = jobwords.shown_job(store.runner(), picked, kinds)
            return gr.update(value=forms.report_bundle(job), visible=True), gr.skip()

        self.on(button.click, on_report, [picker], [file, self.status])

        def forget(picked):  # another job shown: the bundle of the one shown before is not offered under it
            return gr.update(value=None, visible=False)

        self.on(picker.change, forget, [picker], [file], show_progress="hidden")
