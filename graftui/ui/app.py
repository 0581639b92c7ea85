"""The Gradio Blocks app: the page, its tabs in order, and what spans them.

Tabs: Models, Fine-tune, Localize, Compare, Anatomy, Compose, Laboratory, Regions (one module each in
``tabs/``), with one jobs panel below them. Long work goes through the shared JobRunner
(``store.runner()``); the open tab's gr.Timer polls it, so a reloaded page sees running and finished
jobs. Every handler is wrapped by ``wiring.guarded``, which turns any exception into a one-line message
(a toast and the ``status-message`` box), never a traceback.
"""

from __future__ import annotations

import json
import os
import time

import gradio as gr

from .. import settings
from ..models import warm_imports
from ..paths import clean_stale
from . import forms, jobwords, library, pagescript, store
from .tabs import anatomy, compare, compose, finetune, jobs, laboratory, localize, models, regions
from .style import CSS, TABLES, number_css, phone_css
from .wiring import Page

TAB_NAMES = ("Models", "Fine-tune", "Localize", "Compare", "Anatomy", "Compose", "Laboratory", "Regions")
TABS = {"models": models, "finetune": finetune, "localize": localize, "compare": compare, "anatomy": anatomy,
        "compose": compose, "lab": laboratory, "regions": regions}  # the name each tab's timer and panels go by
POLL_SECONDS = 2.0  # status lines and job lists: often enough to watch
def build_app() -> gr.Blocks:
    warm_imports()  # before any job thread loads a model: two first loads at once could break transformers' imports
    hosted = settings.hosted()
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
        # The page's session id (hosted mode), issued on load and kept by the browser, encrypted.
        sid = gr.BrowserState("", storage_key="graftui-session", secret=store.browser_secret())
        page = Page(status, sid, store.defaults())
        with gr.Tabs(elem_id="tabs", overflow_behavior="wrap"):  # every tab in the bar at any width, none behind "⋯"
            tabs = {name: module.build(page) for name, module in TABS.items()}
        jobs.build(page)
        page.finish()

        @page.safe
        def on_load(current, request: gr.Request = None):  # Gradio passes the page's request (its address)
            session = store.resume(current, request)  # the browser's own id while it lives, else a new workspace
            with store.session(session):
                runner = store.runner()
                job = forms.submit_prepare(runner)
                active = jobwords.active_banner(runner)  # a reloaded page says what still runs, not "Ready"
            msg = active or "Ready. Start on **Models** (the offline default pair is preselected), then **Localize**."
            if job is not None:
                msg = (f"{active} The default fine-tuned model (**minilm-movies**) is being prepared once, in the "
                       "background (about two minutes on a CPU). Everything that needs it waits for it.")
            announced = active.job if active is not None else ""
            if hosted:
                msg += (" Your regions, uploads and jobs are private to this browser and kept "
                        f"{settings.SESSION_IDLE_HOURS:g} h after your last visit.")
            return msg, session, announced

        loaded = demo.load(on_load, [sid], [status, sid, page.announced])
        keep_form(page, loaded)
        for wire in page.loads:  # what the page's address asks for (a run's link), once its session is known
            wire(loaded)
        poll_lists(page)
        timers = {name: gr.Timer(POLL_SECONDS, active=name == "models") for name in tabs}  # the first tab is open
        opened = {}
        for name, tab in tabs.items():
            sigs = page.panels.get(name, [])
            opened[name] = page.on(tab.select, _open_tab(name, sigs, timers), None, [*sigs, *timers.values()],
                                   show_progress="hidden")
        page.poll.wire(timers, status, page.announced, sid, opened)
    return demo


FORM_KEY = "graftui-form"
# Each browser tab keeps its own form (sessionStorage: a reload of the tab keeps it, another tab has its own); the
# form stored last by any tab (localStorage) is where a new tab starts, without what is the tab's own (the jobs its
# panels show).
REMEMBER_JS = """(...values) => {{ const keys = {keys}, own = {own}, form = {{}}, shared = {{}};
  keys.forEach((key, i) => {{ form[key] = values[i]; if (!own.includes(key)) shared[key] = values[i]; }});
  try {{ sessionStorage.setItem("{key}", JSON.stringify(form)); }} catch (e) {{}}
  try {{ localStorage.setItem("{key}", JSON.stringify(shared)); }} catch (e) {{}} }}"""
RECALL_JS = """(sid) => {{ let text = null;
  for (const store of [sessionStorage, localStorage]) {{ try {{ text = text || store.getItem("{key}"); }} catch (e) {{}} }}
  return [sid, text || "{{}}"]; }}"""  # the page's inputs: its session id, then the form as stored
MAX_FORM_CHARS = 200_000  # a stored form is the page's own widgets' values; a larger one is no form of this page


def keep_form(page: Page, loaded) -> None:
    """This browser tab keeps the form's values (pair, task, OOD tasks and mapping, columns, prompt, settings) and
    the job each of its panels shows; a reload puts them back once the session is known, so an uploaded task is among
    the choices again, and a job another tab submitted since does not replace this tab's own."""
    form = gr.Textbox("{}", visible=False, elem_id="form-recalled")
    kept = {**page.kept, **page.tab_kept}
    columns_kept = {"text_column", "pair_column", "label_column"}
    gr.on([c.change for c in kept.values()], None, list(kept.values()), None, show_progress="hidden", queue=False,
          js=REMEMBER_JS.format(keys=json.dumps(list(kept)), own=json.dumps(list(page.tab_kept)), key=FORM_KEY))

    def restore(text):
        try:
            saved = json.loads(text) if isinstance(text, str) and len(text) <= MAX_FORM_CHARS else {}
        except ValueError:
            saved = {}
        saved = saved if isinstance(saved, dict) else {}
        out = []
        for key, comp in kept.items():
            value = saved.get(key)
            if key not in saved or value is None:
                out.append(gr.skip())
            elif key in page.tab_kept:  # a job picker: a job id, looked up among the session's own jobs only
                out.append(gr.update(value=value) if isinstance(value, str) and len(value) <= 64 else gr.skip())
            elif key == "task":
                out.append(gr.update(choices=models.task_choices(), value=value))
            elif key == "ood":
                out.append(gr.update(choices=models.ood_choices(), value=[v for v in value if isinstance(v, str)]
                                     if isinstance(value, list) else []))
            elif key in columns_kept:  # a column of an uploaded file: offered again with its value
                names = dict.fromkeys([*(c[1] for c in comp.choices), str(value)])
                out.append(gr.update(choices=[(n, n) for n in names], value=str(value)))
            else:
                out.append(gr.update(value=value))
        return out

    page.on(loaded.then, restore, [form], list(kept.values()), show_progress="hidden",
            js=RECALL_JS.format(key=FORM_KEY))


def poll_lists(page: Page) -> None:
    """Every tab's region and checkpoint pickers and the list of saved regions, refreshed on every tab when a
    region or checkpoint appears or goes; a new region is picked in every region picker (``library.next_pick``)."""
    pickers = [p for p, _ in page.region_pickers]
    region_sig, ckpt_sig = gr.State(None), gr.State(None)
    touched = [gr.State(None) for _ in pickers]  # when each picker was last picked by hand
    for picker, when in zip(pickers, touched):
        picker.input(lambda: time.time(), None, [when], queue=False, show_progress="hidden")

    def tick_lists(last_regions, last_ckpts, *values):
        picked, hand = values[:len(pickers)], values[len(pickers):]
        entries = store.list_regions()
        rsig = tuple(e.id for e in entries)
        csig = tuple(c["path"] for c in store.list_checkpoints()) + (store.default_ready(),)
        out = []
        if rsig != last_regions:
            choices = store.region_choices(entries)
            new = set(rsig) - set(last_regions) if last_regions is not None else set()  # none when the page opens
            for (picker, several), value, at in zip(page.region_pickers, picked, hand):
                got = library.next_pick(value, picker.multiselect, several, entries, new, at, time.time())
                out.append(gr.update(choices=choices, value=got) if got != value else gr.update(choices=choices))
            out.append(library.region_list_rows())
        else:
            out += [gr.skip() for _ in pickers] + [gr.skip()]
        if csig != last_ckpts:
            out += [gr.update(choices=store.checkpoint_choices(include_base=base)) for _, base in page.checkpoint_pickers]
        else:
            out += [gr.skip() for _ in page.checkpoint_pickers]
        return (*out, rsig, csig)

    page.poll.add(tick_lists, [region_sig, ckpt_sig, *pickers, *touched],
                  [*pickers, page.region_table, *(p for p, _ in page.checkpoint_pickers), region_sig, ckpt_sig])


def _open_tab(tab: str, sigs: list, timers: dict):
    """A tab's select handler: poll with its timer alone, and forget what its panels last drew (a plot
    updated while its tab was hidden is drawn only at its next update, so the tick that follows the handler
    draws them again)."""

    def opened():
        return (*[None] * len(sigs), *[gr.Timer(active=name == tab) for name in timers])

    return opened


def launch_options() -> dict:
    """How the server is launched: the folders it may serve, the upload cap, and Gradio's own refusals
    (a non-number in a slider, a file path no page uploaded) shown as their message, not a bare error, and
    the page's early script (``pagescript``), which needs the page served by this server, not rendered by
    Gradio's Node server (``ssr_mode``).

    It also turns off the web server's own reading of X-Forwarded-For (uvicorn believes it from any client on
    the loopback address unless FORWARDED_ALLOW_IPS says otherwise, and would hand the app a client address a
    local script chose): the app sees the socket's peer, and believes the header only as GRAFTUI_TRUSTED_PROXIES
    says (``store.client_address``)."""
    os.environ["FORWARDED_ALLOW_IPS"] = ""  # read by uvicorn when the server starts: trust no peer's header
    max_size = f"{int(settings.MAX_UPLOAD_MB)}mb" if settings.hosted() else None
    return {"allowed_paths": store.served_dirs(), "max_file_size": max_size, "show_error": True,
            "css": CSS + number_css(TABLES) + phone_css(),
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
    clean_stale(settings.home(), depth=4)  # what runs killed mid-write left behind (their pid is gone)
    demo = build_app()
    store.revive(forms.revive)  # what the server held when it last stopped: queued again
    demo.queue(default_concurrency_limit=4)
    quiet_queue(demo)
    return demo.launch(server_name=host, server_port=port, share=share, **{**launch_options(), **kwargs})
