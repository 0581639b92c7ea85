"""Helpers for driving the graftui app in headless Chromium (Playwright, sync API).

Used by ``tests/test_browser.py`` and ``scripts/screenshot.py``: start ``app.py`` on a free
port, launch Chromium, and the few page interactions the Gradio widgets need (tabs, dropdowns,
jobs that finish in the background, virtualised tables).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-quic", "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 800}


ARTIFACTS = REPO / "test-artifacts"  # screenshots, pages and server logs of failed browser tests


def unavailable(reason: str):
    """A browser test that cannot run: a failure on CI (where it must run), else a skip."""
    import pytest  # the screenshot script uses this module without pytest

    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def chromium():
    """Headless Chromium for a test module, or why it cannot start (``unavailable``)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is not installed (pip install -r requirements-dev.txt)")
    if chromium_path() is None:
        unavailable(f"Chromium not found at {CHROMIUM}; install it with `apt-get install -y chromium` "
                    "(scripts/setup.sh --dev does this)")
    with sync_playwright() as pw:
        browser = launch_browser(pw)
        try:
            yield browser
        finally:
            browser.close()


def started(home: Path, name: str, **settings) -> "AppServer":
    """``app.py`` served from ``home`` (its log beside it, ``name``.log); a server that does not start leaves its
    log among the artifacts."""
    srv = AppServer(home=home, log_path=home.parent / f"{name}.log", **settings)
    try:
        srv.start(timeout=120)
    except Exception:
        save_artifacts(None, f"{name}-start", ARTIFACTS, srv)
        raise
    return srv


@contextlib.contextmanager
def model_free_home(home: Path):
    """Within the block, graftui writes into ``home`` as a fast server's would (GRAFTUI_HOME, GRAFTUI_FAST), its default
    fine-tuned checkpoint marked built (the page then fine-tunes nothing in the background); yields a tiny pair and
    its largest graftable tensor, where the regions a test writes fit."""
    import pytest

    from conftest import make_tiny_pair
    from graftui.config import default_checkpoint_dir

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(home))
        mp.setenv("GRAFTUI_FAST", "1")
        mp.delenv("GRAFTUI_HOSTED", raising=False)
        ready = default_checkpoint_dir()
        ready.mkdir(parents=True)
        (ready / "config.json").write_text("{}")  # marked built: the page starts no background fine-tune
        pair, _, _ = make_tiny_pair()
        yield pair, max(pair.graftable, key=lambda n: pair.param(n).numel())


# -- Chromium ---------------------------------------------------------------------------------------
def chromium_path() -> str | None:
    """The Debian Chromium binary (``GRAFTUI_CHROMIUM`` overrides), or None when it is missing."""
    for candidate in (os.environ.get("GRAFTUI_CHROMIUM"), CHROMIUM, shutil.which("chromium")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def launch_browser(playwright):
    path = chromium_path()
    if path is None:
        raise RuntimeError(f"Chromium not found at {CHROMIUM}: install it with `apt-get install -y chromium` "
                           "(scripts/setup.sh --dev does this)")
    return playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)


# -- the app server ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class AppServer:
    """``python app.py`` in a subprocess, its output in ``log_path``."""

    home: Path
    log_path: Path
    fast: bool = True
    hosted: bool = False  # GRAFTUI_HOSTED=1: per-session workspaces, server paths refused
    extra_env: dict = field(default_factory=dict)  # settings of this server (a hosted ceiling raised, say)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    started: float = 0.0
    http_ready_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def env(self) -> dict:
        env = dict(os.environ)
        env.pop("GRAFTUI_HOSTED", None)
        env.update({
            "GRAFTUI_HOME": str(self.home),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1",
        })
        if self.fast:
            env["GRAFTUI_FAST"] = "1"
        else:
            env.pop("GRAFTUI_FAST", None)
        if self.hosted:
            env["GRAFTUI_HOSTED"] = "1"
            env["GRADIO_TEMP_DIR"] = str(self.home / "gradio-uploads")
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 120.0) -> "AppServer":
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "app.py", "--port", str(self.port)], cwd=REPO, env=self.env(),
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app.py exited with code {self.proc.returncode} before serving:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url, timeout=5) as resp:
                    if resp.status == 200:
                        self.http_ready_s = time.monotonic() - self.started
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"app.py did not answer HTTP 200 on {self.url} within {timeout:.0f} s:\n{self.log_tail()}")

    def since_start(self) -> float:
        return time.monotonic() - self.started

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the group of the process started here, nothing else
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        return "\n".join(lines[-n:])


# -- page interactions --------------------------------------------------------------------------------
def wait_usable(page, url: str, timeout_s: float = 60.0) -> None:
    """Open the page (brought to the front: a tab behind another may not draw its frames, and a click waits for them)
    and wait until the app's load handler has filled the status line."""
    page.bring_to_front()
    page.goto(url, wait_until="domcontentloaded", timeout=timeout_s * 1000)
    page.wait_for_selector("#status-message", timeout=timeout_s * 1000)
    page.wait_for_function(
        "() => { const e = document.querySelector('#status-message'); return e && !/Loading…/.test(e.innerText) "
        "&& e.innerText.trim().length > 0; }", timeout=timeout_s * 1000)


# The page keeps its form as JSON in the tab's sessionStorage["graftui-form"] (and in localStorage, where a new tab
# starts). Each time it writes it, the JSON is made just before (JSON.stringify, then setItem): noted here, so that a
# test can wait until the browser holds the form it filled in.
WATCH_STORED_FORM = """(key) => { if (window.__storedForms) return; window.__storedForms = [];
  const stringify = JSON.stringify, setItem = Storage.prototype.setItem; let last = null;
  JSON.stringify = function (...args) { last = stringify.apply(this, args); return last; };
  Storage.prototype.setItem = function (k, v) { if (k === key) window.__storedForms.push(last);
    return setItem.call(this, k, v); }; }"""


def watch_stored_form(page) -> None:
    """From now until the page is loaded again, note every form the browser stores (``wait_form_stored``)."""
    page.evaluate(WATCH_STORED_FORM, "graftui-form")


def wait_form_stored(page, values: dict, timeout_s: float = 30.0) -> None:
    """Wait until the form the browser stored last (since ``watch_stored_form``) holds ``values`` (form key → value)."""
    page.wait_for_function(
        """(want) => { const all = window.__storedForms || []; let form = null;
          try { form = JSON.parse(all[all.length - 1] || "null"); } catch (e) { return false; }
          return !!form && Object.entries(want).every(([k, v]) => String(form[k]) === String(v)); }""",
        arg=values, timeout=timeout_s * 1000)


def open_tab(page, name: str) -> None:
    """Click a tab by its elem_id suffix (``localize`` → ``#tab-localize-button``) and wait for its panel."""
    page.click(f"#tab-{name}-button")
    page.wait_for_selector(f"#tab-{name}", state="visible", timeout=15_000)


def text(page, selector: str) -> str:
    el = page.query_selector(selector)
    return el.inner_text() if el else ""


def choose(page, elem_id: str, option_text: str, timeout_s: float = 30.0) -> None:
    """Pick the option whose text contains ``option_text`` in the Gradio dropdown ``#elem_id``."""
    page.click(f"#{elem_id} input")
    option = page.locator("ul[role=listbox] li", has_text=option_text).first
    option.wait_for(state="visible", timeout=timeout_s * 1000)
    option.click()
    page.keyboard.press("Escape")  # a multiselect keeps its list open


def cancel(page, button: str, timeout_s: float = 60.0) -> None:
    """Press a Cancel button and confirm: it asks to be pressed again before it cancels (``confirm_cancel``)."""
    page.click(button, timeout=timeout_s * 1000)
    confirm_cancel(page, button, timeout_s)


def confirm_cancel(page, button: str, timeout_s: float = 60.0) -> None:
    """Press an armed Cancel button until the header says the cancel was requested or the job had already ended. A
    poll answered late may put the button's first look back (a press then arms it again, as a person would see), so
    a press that was answered by asking again is followed by another."""
    said = "() => { const t = document.querySelector('#status-message').innerText; " \
           "return t.includes('Cancel requested') || t.includes('has already finished'); }"
    armed = "(sel) => document.querySelector(sel).innerText.includes('Confirm cancel')"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            page.wait_for_function(armed, arg=button, timeout=10_000)
        except Exception:  # its first look is back: this press arms it again
            page.click(button, timeout=timeout_s * 1000)
            continue
        page.click(button, timeout=timeout_s * 1000)
        try:
            page.wait_for_function(said, timeout=10_000)
            return
        except Exception:
            continue
    raise AssertionError(f"{button} did not cancel within {timeout_s:.0f} s: {text(page, '#status-message')!r}")


def job_id_from_status(page) -> str | None:
    m = re.search(r"\(job (\S+?)\)", text(page, "#status-message"))
    return m.group(1) if m else None


def shows_ended(line: str, job_id: str) -> bool:
    """Whether a status line says that job ``job_id`` has ended (a line about another job never passes)."""
    return f"[{job_id}]" in line and ("· done" in line or "failed" in line or "cancelled" in line)


def submit_job(page, button: str, timeout_s: float = 60.0) -> str:
    """Press ``button`` and return the id of the job it submitted, once the header's "Submitted …" banner names that
    job (the header may still name an earlier one when the button is pressed, or say that one ended)."""
    before = job_id_from_status(page)
    page.click(button)
    # only a submission's own banner names it: a line saying that an earlier job ended may land just after the click
    found = page.wait_for_function(
        "id => { const m = /Submitted [\\s\\S]*?\\(job (\\S+?)\\)/.exec(document.querySelector('#status-message').innerText); "
        "return m && m[1] !== id ? m[1] : null; }", arg=before or "", timeout=timeout_s * 1000)
    return found.json_value()


JOB_IN_LINE = re.compile(r"\[(\d{8}-\d{6}-[0-9a-f]{6})\]")  # "[20261127-052317-c46ad1]" in a tab's status line


def tab_job(page, status: str) -> str | None:
    """The id of the job a tab's status line shows."""
    m = JOB_IN_LINE.search(text(page, status))
    return m.group(1) if m else None


def run_job(page, button: str, status: str, picker: str, timeout_s: float = 300.0) -> tuple[str, float]:
    """Press ``button``, then wait until the job it submitted is shown finished in ``status``.

    The job is recognised by its id: the header says "Submitted … (job ID)" and the tab's status line and its job
    picker ``picker`` show ID once they follow the new job. Either may tell it first: the header can be overwritten
    at once by the news that an earlier job ended. Returns (status text, seconds).
    """
    before, before_here = job_id_from_status(page), tab_job(page, status)
    t0 = time.monotonic()
    page.click(button)
    job_id = None
    while time.monotonic() - t0 < 60:
        job_id = job_id_from_status(page)
        if job_id and job_id != before:
            break
        job_id = tab_job(page, status)
        if job_id and job_id != before_here:
            break
        warn = text(page, "#status-message")
        if "⚠️" in warn:
            raise AssertionError(f"pressing {button} gave a warning instead of a job: {warn.strip()}")
        time.sleep(0.25)
    else:
        raise AssertionError(f"pressing {button} submitted no job within 60 s; status line: {text(page, '#status-message')!r}")
    last = ""
    while time.monotonic() - t0 < timeout_s:
        shown = page.input_value(f"#{picker} input") if page.query_selector(f"#{picker} input") else ""
        last = text(page, status)
        if job_id in shown and shows_ended(last, job_id):
            return last, time.monotonic() - t0
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} ({button}) not finished after {timeout_s:.0f} s; last status {last!r}")


def download_made_file(page, button: str, file_elem: str, folder):
    """Press ``button``, wait for the file it makes to be offered in ``#file_elem``, download it into ``folder``."""
    page.click(button)
    link = page.locator(f"#{file_elem} a").first
    link.wait_for(state="visible", timeout=60_000)
    with page.expect_download(timeout=60_000) as info:
        link.click()
    path = folder / info.value.suggested_filename
    info.value.save_as(path)
    return path


def dropdown_options(page, elem_id: str) -> list[str]:
    """The option texts a Gradio dropdown offers (opened, read, closed again)."""
    page.click(f"#{elem_id} input")
    try:
        page.wait_for_selector("ul[role=listbox]", timeout=5_000)
        return [t.strip() for t in page.locator("ul[role=listbox] li").all_inner_texts()]
    except Exception:  # noqa: BLE001 - an empty dropdown opens no list
        return []
    finally:
        page.keyboard.press("Escape")


# What sticks out of the page sideways: the document's own width past the window, and each element named whose box
# leaves the window (a table wider than the page scrolls inside its own box, which stays in the window)
OUT_OF_WINDOW = """(ids) => { const w = document.documentElement.clientWidth, out = [];
  if (document.documentElement.scrollWidth > w + 1) out.push(['page', document.documentElement.scrollWidth, w]);
  for (const id of ids) { const e = document.getElementById(id); if (!e || !e.offsetParent) continue;
    const r = e.getBoundingClientRect(); if (r.left < -1 || r.right > w + 1) out.push([id, r.left, r.right, w]); }
  return out; }"""
PHONE = {"width": 390, "height": 844}


def fits_phone(page, elem_ids: list[str], timeout_s: float = 10.0) -> None:
    """Resize the page to a phone's width (it stays so: a test sets its own size back) and wait until neither the
    page nor any of ``elem_ids`` shown sticks out of the window sideways (a table wider than the page scrolls inside
    its own box, which stays in the window)."""
    page.set_viewport_size(PHONE)
    try:
        page.wait_for_function(f"ids => ({OUT_OF_WINDOW})(ids).length === 0", arg=elem_ids, timeout=timeout_s * 1000)
    except Exception:
        raise AssertionError(f"out of a 390 px window: {page.evaluate(OUT_OF_WINDOW, elem_ids)}") from None


def reopen_phone_closed(page, tab: str) -> None:
    """Open again, by hand, the parts of ``tab`` that a phone's width closed (``pagescript``: closed once)."""
    closed = page.locator(f"#{tab} .phone-closed button.label-wrap:not(.open)")
    for _ in range(closed.count()):  # one at a time: a part opened leaves the ones still closed
        closed.first.click()
    page.wait_for_function("t => !document.querySelector('#' + t + ' .phone-closed button.label-wrap:not(.open)')",
                           arg=tab, timeout=10_000)


def table_rows(page, elem_id: str) -> list[list[str]]:
    """The rendered body rows of a Gradio Dataframe, as lists of cell texts."""
    return page.eval_on_selector_all(
        f"#{elem_id} [role=row].virtual-row",
        "rows => rows.map(r => Array.from(r.querySelectorAll('[role=gridcell]')).map(c => c.innerText.trim()))")


# How a Gradio Dataframe is laid out: each cell (header or body) cut off by its column (its text wider than the cell);
# each number cell whose text takes two lines or more ("0.8 / 29", "100 / .0%"); the table's width against the
# width it is shown in, and whether the rest can be scrolled to; and where each header's right edge lies in the
# shown width (a column whose header ends past it is behind a sideways scroll).
TABLE_FIT = r"""(id) => {
  const block = document.getElementById(id), vp = block.querySelector('.virtual-table-viewport');
  const NUMBER = /^([-+−]?\d[\d,.]*\s?(%|pts|s|min)?(\s\[[^\]]*\])?|\d{4}-\d\d-\d\dT[\d:]+Z)$/;
  const lines = (el) => { const r = document.createRange(); r.selectNodeContents(el);
    return new Set([...r.getClientRects()].filter(x => x.width > 0).map(x => Math.round(x.top))).size; };
  const cut = [], wrapped = [], headers = [];
  const left = vp.getBoundingClientRect().left;
  for (const cell of block.querySelectorAll('th.header-cell, [role=gridcell]')) {
    const inner = cell.querySelector('span') || cell, text = (inner.innerText || '').trim();
    if (cell.scrollWidth > cell.clientWidth + 1 || inner.scrollWidth > inner.clientWidth + 1) cut.push(text);
    if (cell.matches('[role=gridcell]') && NUMBER.test(text) && lines(inner) > 1) wrapped.push(text);
    if (cell.matches('th')) headers.push([text, Math.round(cell.getBoundingClientRect().right - left)]);
  }
  const overflow = getComputedStyle(vp).overflowX;
  return {cut, wrapped, headers, shown: vp.clientWidth, width: vp.scrollWidth,
          scrolls: overflow === 'auto' || overflow === 'scroll',
          rows: block.querySelectorAll('[role=row].virtual-row').length};
}"""


def table_fit(page, elem_id: str, timeout_s: float = 10.0) -> dict:
    """How the Dataframe ``#elem_id`` is laid out (``TABLE_FIT``) once it holds still: a table measures its columns
    again in the frames after a resize or new rows, so it is read until two readings 200 ms apart agree."""
    last, deadline = None, time.monotonic() + timeout_s
    while True:
        now = page.evaluate(TABLE_FIT, elem_id)
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        page.wait_for_timeout(200)


def plotly_trace_types(page, elem_id: str) -> list[str]:
    """Trace types of the plotly figure drawn in ``#elem_id`` (empty until it is drawn)."""
    return page.eval_on_selector(
        f"#{elem_id}",
        "e => { const p = e.querySelector('.js-plotly-plot'); "
        "return (p && p.data && e.querySelector('.main-svg')) ? p.data.map(d => d.type || 'scatter') : []; }")


def save_artifacts(page, name: str, folder: Path, server: AppServer | None = None) -> list[Path]:
    """A full-page screenshot, the page HTML and the server log tail, for a failed test."""
    folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:100]
    written = []
    if page is not None:
        try:
            shot = folder / f"{safe}.png"
            page.screenshot(path=str(shot), full_page=True)
            written.append(shot)
        except Exception as err:  # noqa: BLE001 - artifacts are best effort
            print(f"screenshot failed: {err}")
        try:
            html = folder / f"{safe}.html"
            html.write_text(page.content(), encoding="utf-8")
            written.append(html)
        except Exception as err:  # noqa: BLE001
            print(f"saving the page HTML failed: {err}")
    if server is not None:
        log = folder / f"{safe}.server.log"
        log.write_text(server.log_tail(400), encoding="utf-8")
        written.append(log)
    return written
