"""The app in a real browser: headless Chromium (Debian's) driven by Playwright.

One app server (``python app.py`` with ``GRAFTUI_FAST=1`` in a fresh ``GRAFTUI_HOME``) and one
page serve the whole module, and the tests run in order, each building on the last: localize →
compare → anatomy → a second region and their composition → download → a corrupt upload.
On a failure the page (screenshot + HTML) and the server log go to ``test-artifacts/``.

Without Chromium the tests are skipped, or fail when ``CI`` is set.
"""

from __future__ import annotations

import os
import re
import time

import pytest

import browser_util as bu
from conftest import link_shared_builds

pytestmark = pytest.mark.browser

TABS = ["Models", "Fine-tune", "Localize", "Compare", "Anatomy", "Compose", "Laboratory", "Regions"]
ARTIFACTS = bu.ARTIFACTS
FIRST_JOB_S = 300  # the first job waits for the default fine-tune, built in the background on first page load
JOB_S = 240

# Counts the animation frames the page's scripts ask the browser for: all, those Gradio's status
# tracker asks for itself, and those the page script held back (installed before any script of the page).
COUNT_FRAMES = """(() => { const frame = window.requestAnimationFrame.bind(window); window.__frames = [0, 0, 0];
  window.requestAnimationFrame = (callback) => {
    const stack = new Error().stack || "";
    window.__frames[0] += 1;
    if (stack.includes("statustracker")) window.__frames[1] += 1;
    if (stack.includes("graftuiHeldFrame")) window.__frames[2] += 1;
    return frame(callback);
  }; })();"""

# What the tests hand on to each other (the page and server too, for the failure artifacts).
STATE: dict = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory, shared_builds):
    # the session's default models: built once, by whichever test or server needs one first
    srv = bu.started(link_shared_builds(tmp_path_factory.mktemp("graftui-home"), shared_builds), "app-server", fast=True)
    print(f"\n[browser] app launch → HTTP 200: {srv.http_ready_s:.1f} s (port {srv.port})")
    STATE["server"] = srv
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    with bu.chromium() as b:
        yield b


@pytest.fixture(scope="module")
def page(browser, server):
    context = browser.new_context(viewport=bu.VIEWPORT, accept_downloads=True)
    context.add_init_script(COUNT_FRAMES)  # before every script of the page, the app's own included
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    STATE["page"], STATE["page_errors"] = pg, errors
    try:
        bu.wait_usable(pg, server.url, timeout_s=90)
    except Exception:
        bu.save_artifacts(pg, "page-load", ARTIFACTS, server)
        raise
    STATE["usable_s"] = server.since_start()
    print(f"[browser] app launch → page usable (status line filled): {STATE['usable_s']:.1f} s")
    yield pg
    if errors:
        print("[browser] JavaScript errors on the page:\n  " + "\n  ".join(errors[:10]))
    context.close()


@pytest.fixture(autouse=True)
def _artifacts_on_failure(request):
    """Save a screenshot, the page HTML and the server log when the test just run failed."""
    failed_before = request.session.testsfailed
    t0 = time.monotonic()
    yield
    print(f"[browser] {request.node.name}: {time.monotonic() - t0:.1f} s")
    if request.session.testsfailed > failed_before:
        written = bu.save_artifacts(STATE.get("page"), request.node.name, ARTIFACTS, STATE.get("server"))
        print(f"[browser] failure artifacts: {', '.join(str(p) for p in written)}")


def _need(key: str):
    if key not in STATE:
        pytest.fail(f"an earlier test did not produce {key!r}; run the whole module in order", pytrace=False)
    return STATE[key]


def _region_id(status_line: str) -> str:
    m = re.search(r"saved region (\S+)", status_line)
    assert m, f"the finished localize job names no saved region: {status_line!r}"
    return m.group(1)


# -- a. ------------------------------------------------------------------------------------------
def test_page_loads_with_all_its_tabs(page):
    names = [t.strip() for t in page.locator("#tabs [role=tab]").all_inner_texts()]
    assert names == TABS
    status = bu.text(page, "#status-message")
    assert "⚠️" not in status and "Traceback" not in status, status


def test_an_open_page_does_not_redraw_on_every_frame(page):
    """Gradio's status tracker asks for a frame 60 times a second as long as the page is open (its
    loading tracker is never stopped); the page script holds those requests to four a second."""
    time.sleep(2.0)  # the page's first drawing is over
    first = page.evaluate("window.__frames")
    time.sleep(4.0)
    last = page.evaluate("window.__frames")
    every, tracker, held = ((b - a) / 4.0 for a, b in zip(first, last))
    print(f"[browser] animation frames asked for by an open page: {every:.1f} a second; by the status tracker "
          f"itself {tracker:.1f}, held by the page script {held:.1f}")
    assert tracker < 5, f"the status tracker asks for {tracker:.0f} frames a second itself (60 for each pending event)"
    assert 0 < held < 30, f"the page script let {held:.0f} held frames a second through (about 4 for each pending event)"


# -- b. ------------------------------------------------------------------------------------------
def test_localize_runs_and_its_region_is_listed(page):
    bu.open_tab(page, "localize")
    line, took = bu.run_job(page, "#localize-run", "#localize-status", "localize-job", timeout_s=FIRST_JOB_S)
    print(f"[browser] first localization (waits for the default fine-tune): {took:.1f} s")
    assert "· done" in line, f"localization did not finish: {line}"
    assert "lies outside the top-movement region it started from" in line, f"no result card: {line}"
    # it says at once whether the region works: held-out accuracy beside FT, with the paired interval
    assert re.search(r"(?s)a quick check on 64 held-out test examples of movies.*The graft 'this region' .* scores "
                     r"[\d.]+ % \[[^\]]*n = 64\] on movies: it keeps \d+ % of the fine-tuned accuracy \([+−]", line), line
    region = _region_id(line)
    k = int(re.search(r"k = ([\d,]+)", line).group(1).replace(",", ""))
    STATE["region1"], STATE["k1"] = region, k
    page.wait_for_function("id => document.querySelector('#region-list').innerText.includes(id)", arg=region, timeout=30_000)
    row = next((r for r in bu.table_rows(page, "region-list") if r and r[0] == region), None)
    assert row is not None, f"{region} not among the rows of #region-list"
    assert row[2] == "learned" and row[3] == f"{k:,}", row
    assert bu.plotly_trace_types(page, "localize-plot"), "the live plot of the mask steps is not drawn"
    held = ("() => { const p = document.querySelector('#localize-plot .js-plotly-plot'); "
            "return p && p.data ? p.data.filter(d => d.name === 'held-out').map(d => d.y.length) : []; }")
    try:  # the start and the learned region, as diamonds on the accuracy panel (drawn once the job's end shows)
        page.wait_for_function(f"() => JSON.stringify(({held})()) === '[2]'", timeout=30_000)
    except Exception:
        pytest.fail(f"the held-out checks are not on the live plot: {page.evaluate(held)}")


def test_a_running_job_shows_its_step_and_time_left_and_a_reload_says_it_runs(page, server):
    """The job's line counts its steps and says the time left at the pace measured so far; a reloaded page's header
    names the job that runs (not "Ready"), and the banner goes once it ends."""
    bu.open_tab(page, "localize")
    page.fill("#localize-steps input", "100")  # long enough to watch, cancelled below
    page.press("#localize-steps input", "Tab")
    job = bu.submit_job(page, "#localize-run")
    page.wait_for_function("id => { const t = document.querySelector('#localize-status').innerText; "
                           "return t.includes(id) && /step \\d+\\/100, about \\d+ (s|min) left/.test(t); }", arg=job,
                           timeout=120_000)
    bu.wait_usable(page, server.url, timeout_s=90)  # a new load of the page while the job runs
    header = bu.text(page, "#status-message")
    assert "Ready" not in header and "Running: " in header and f"(job {job})" in header, header
    assert re.search(r"step \d+/100", header), header
    bu.open_tab(page, "localize")
    page.click("#localize-cancel")  # asks to be confirmed, cancels nothing yet
    page.wait_for_function("() => document.querySelector('#status-message').innerText.includes('Confirm cancel')",
                           timeout=30_000)
    assert "cancelled" not in bu.text(page, "#localize-status")
    bu.confirm_cancel(page, "#localize-cancel")
    page.wait_for_function("id => { const t = document.querySelector('#localize-status').innerText; "
                           "return t.includes(id) && t.includes('cancelled'); }", arg=job, timeout=60_000)
    page.wait_for_function("() => document.querySelector('#localize-cancel').disabled", timeout=30_000)  # off now
    page.fill("#localize-steps input", "10")  # the form is kept: the default again for the tests that follow
    page.press("#localize-steps input", "Tab")


def test_compare_shows_finetuned_and_the_graft(page):
    region = _need("region1")
    bu.open_tab(page, "compare")
    page.wait_for_function("id => document.querySelector('#compare-regions').innerText.includes(id)", arg=region, timeout=30_000)
    line, took = bu.run_job(page, "#compare-run", "#compare-status", "compare-job", timeout_s=JOB_S)
    print(f"[browser] comparison: {took:.1f} s")
    assert "· done" in line, f"comparison did not finish: {line}"
    # the result card under the job's line says what the table means
    assert re.search(r"keeps \d+ % of the fine-tuned accuracy (\([^)]*\) )?(and recovers \d+ % of|but scores below the model with an "
                     r"empty region \(-\d+ % of) the fine-tuning gain", line), line
    assert re.search(r"pts \[[^\]]*\] against a random region of the same size", line) and "Calibration:" in line, line
    STATE["compare_job"] = re.search(r"\[(\S+?)\]", line).group(1)
    page.wait_for_function("() => document.querySelectorAll('#compare-table [role=row].virtual-row').length >= 2",
                           timeout=30_000)
    models = [r[0] for r in bu.table_rows(page, "compare-table") if r]
    assert "fine-tuned" in models, models
    assert region in models and "Top movement" in models, models
    column = list(dict.fromkeys(h for h, _ in bu.table_fit(page, "compare-table")["headers"])).index
    own = next(r for r in bu.table_rows(page, "compare-table") if r and r[0] == region and r[2] == "ID")
    for baseline in ("− top movement [95 % CI]", *["− random [95 % CI]"] * ("Random" in models)):  # as columns
        assert re.fullmatch(r"[-+−]\d+\.\d pts \[[-+−]\d+\.\d, [-+−]\d+\.\d\]", own[column(baseline)]), (baseline, own)
    page.wait_for_function("() => document.querySelectorAll('#compare-differences [role=row].virtual-row').length >= 2",
                           timeout=30_000)  # the paired differences, each read against its interval
    page.wait_for_function("() => document.querySelector('#compare-disagreements-note').innerText.includes("
                           "'decides unlike the fine-tuned model')", timeout=30_000)  # 53 % vs 67 %: some differ
    unlike = [r for r in bu.table_rows(page, "compare-disagreements") if r]
    assert unlike and all(r[0] == region and r[3] != r[5] for r in unlike), unlike
    diffs = {r[0]: r for r in bu.table_rows(page, "compare-differences") if r}
    assert set(diffs) == {f"{region} − Top movement"}, list(diffs)  # the paper's comparison first
    assert all(r[6] in ("a is higher", "a is lower") or r[6].startswith("not distinguishable at n = 64")
               for r in diffs.values()), diffs
    # every row is in the table, none behind an inner scroll: 5 models × (movies + 2 OOD tasks) at 1400×1000
    assert len(models) == 15, models
    page.set_viewport_size({"width": 1400, "height": 1000})
    last = page.locator("#compare-table [role=row].virtual-row").last
    last.scroll_into_view_if_needed()
    assert last.is_visible()
    hidden = page.evaluate("""() => { const t = document.querySelector('#compare-table');
        const rows = [...t.querySelectorAll('[role=row].virtual-row')], last = rows[rows.length - 1];
        const box = last.getBoundingClientRect();
        for (let e = last.parentElement; e && e !== t.parentElement; e = e.parentElement) {
            if (e.scrollHeight > e.clientHeight + 2 && getComputedStyle(e).overflowY !== 'visible'
                && e.getBoundingClientRect().bottom < box.bottom - 1) return e.className || e.tagName; }
        return null; }""")
    assert not hidden, f"the last row of the Compare table is clipped by an inner scroll ({hidden})"
    header_lines = page.evaluate("() => Math.max(...[...document.querySelectorAll('#compare-table th')].map("
                                 "h => Math.round(h.getBoundingClientRect().height / parseFloat(getComputedStyle(h).lineHeight || 20))))")
    assert header_lines <= 3, f"headers wrap to {header_lines} lines"
    page.set_viewport_size(bu.VIEWPORT)
    assert bu.plotly_trace_types(page, "compare-reliability"), "the reliability diagram is not drawn"
    try:  # on a phone: the table and its columns against top movement stay in the window (it scrolls in its box)
        bu.fits_phone(page, ["compare-table", "compare-status"])
        assert "− top movement [95 % CI]" in [h for h, _ in bu.table_fit(page, "compare-table")["headers"]]
    finally:
        page.set_viewport_size(bu.VIEWPORT)
        bu.reopen_phone_closed(page, "tab-compare")  # the parts a phone closed, opened again as a person would


def test_sentences_typed_on_compare_are_classified_by_each_model(page):
    region = _need("region1")
    bu.open_tab(page, "compare")
    page.fill("#predict-text textarea", "A wonderful, moving film.\n\nA dull mess from start to finish.")
    line, took = bu.run_job(page, "#predict-run", "#predict-status", "predict-job", timeout_s=JOB_S)
    print(f"[browser] two sentences through three models: {took:.1f} s")
    assert "· done" in line and "decides as the fine-tuned model on" in line, line
    page.wait_for_function("() => document.querySelectorAll('#predict-table [role=row].virtual-row').length >= 2",
                           timeout=30_000)
    rows = [r for r in bu.table_rows(page, "predict-table") if r]  # a sentence a row, the models side by side
    assert [r[0] for r in rows] == ["1. A wonderful, moving film.", "2. A dull mess from start to finish."], rows
    headers = list(dict.fromkeys(h for h, _ in bu.table_fit(page, "predict-table")["headers"]))
    assert headers[:1] == ["sentence"] and headers[1:] == ["fine-tuned", region, "pre-trained body + FT head"], headers
    assert all(re.fullmatch(r"(negative|positive) \d+(\.\d+)?%( ≠ FT)?", c) for r in rows for c in r[1:]), rows
    STATE["predict_job"] = bu.tab_job(page, "#predict-status")


def test_a_probe_map_draws_two_heatmaps_for_a_typed_sentence(page):
    """The Try box's layer × module map: the table as ever, and under it the two heatmaps of Δp (grafted alone,
    knocked out alone), drawn for the sentence typed; back to the whole region after."""
    _need("predict_job")
    bu.open_tab(page, "compare")
    page.fill("#predict-text textarea", "A quietly devastating film.")
    page.locator("#predict-by").get_by_label("layer × module map", exact=True).check()
    try:
        line, took = bu.run_job(page, "#predict-run", "#predict-status", "predict-job", timeout_s=JOB_S)
        print(f"[browser] a layer × module map of one sentence: {took:.1f} s")
        assert "· done" in line, line
        page.wait_for_function("() => { const p = document.querySelector('#predict-map .js-plotly-plot'); "
                               "return p && p.data && p.data.length == 2; }", timeout=30_000)
        assert bu.plotly_trace_types(page, "predict-map") == ["heatmap", "heatmap"]
        title = page.eval_on_selector("#predict-map .js-plotly-plot", "p => p.layout.title.text")
        assert title.startswith("Δp of the fine-tuned answer") and "the sentence" in title, title
        bu.fits_phone(page, ["predict-map", "predict-table"])  # on a phone: both heatmaps drawn in the window
        assert bu.plotly_trace_types(page, "predict-map") == ["heatmap", "heatmap"]
    finally:
        page.set_viewport_size(bu.VIEWPORT)
        bu.reopen_phone_closed(page, "tab-compare")
        page.locator("#predict-by").get_by_label("whole", exact=True).check()


def test_a_prediction_and_a_short_job_pass_a_long_job_submitted_before_them(page):
    """Instant and short work runs in the quick lane beside a long job: a probe of the region (FT with it knocked
    out, and each of its layers alone) answers within seconds, and a comparison as short as its last run ends while a
    localization submitted before it still runs."""
    _need("compare_job")
    region = _need("region1")
    bu.open_tab(page, "localize")
    page.fill("#localize-steps input", "3000")  # minutes by its cost: the main lane's, cancelled below
    page.press("#localize-steps input", "Tab")
    long = bu.submit_job(page, "#localize-run")
    try:
        page.wait_for_function("id => { const t = document.querySelector('#localize-status').innerText; "
                               "return t.includes(id) && /step \\d+\\/3000/.test(t); }", arg=long, timeout=120_000)
        bu.open_tab(page, "compare")
        page.fill("#predict-text textarea", "An utterly charming film.")
        page.check("#predict-knockout input")
        page.locator("#predict-by").get_by_label("one layer at a time", exact=True).check()
        t0 = time.monotonic()
        page.click("#predict-run")
        page.wait_for_function("() => document.querySelector('#predict-table').innerText.includes('utterly charming')",
                               timeout=60_000)
        answered = time.monotonic() - t0
        print(f"[browser] a probe while a localization runs: answered in {answered:.1f} s")
        assert answered < 10.0, f"the probe took {answered:.1f} s beside the long job"
        headers = list(dict.fromkeys(h for h, _ in bu.table_fit(page, "predict-table")["headers"]))
        assert f"fine-tuned − {region}" in headers, headers
        assert any(re.fullmatch(rf"{re.escape(region)} · layer \d+ only", h) for h in headers), headers
        line, took = bu.run_job(page, "#compare-run", "#compare-status", "compare-job", timeout_s=JOB_S)
        print(f"[browser] a comparison while a localization runs: {took:.1f} s")
        assert "· done" in line, line
        bu.open_tab(page, "localize")
        still = bu.text(page, "#localize-status")
        assert f"[{long}]" in still and "· running" in still, f"the long job was not running any more: {still}"
        # a localization never run with these settings: its cost says it is short, so it too passes the long job
        page.fill("#localize-steps input", "12")
        page.press("#localize-steps input", "Tab")
        line, took = bu.run_job(page, "#localize-run", "#localize-status", "localize-job", timeout_s=JOB_S)
        print(f"[browser] a first localization of 12 steps while a long one runs: {took:.1f} s")
        assert "· done" in line, line
        rows = {r[0]: r for r in bu.table_rows(page, "jobs-table") if r}  # it ended while the long one runs: the
        assert long in rows and "running" in rows[long], rows.get(long)  # quick lane's, by its cost alone
        extra = _region_id(line)  # the tests after this one count the regions of the first two localizations only
        bu.open_tab(page, "regions")
        bu.choose(page, "regions-select", extra)
        page.click("#region-delete")
        page.wait_for_function("() => document.querySelector('#region-delete').innerText.includes('Confirm')",
                               timeout=60_000)  # beside the long job, as long as the deletion below may take
        page.click("#region-delete")
        page.wait_for_function("id => !document.querySelector('#region-list').innerText.includes(id)", arg=extra,
                               timeout=60_000)
    finally:
        bu.open_tab(page, "localize")
        bu.choose(page, "localize-job", f"[{long}]")
        page.wait_for_function("id => document.querySelector('#localize-status').innerText.includes(id)", arg=long,
                               timeout=30_000)
        if re.search(r"· (running|queued)", bu.text(page, "#localize-status")):
            bu.cancel(page, "#localize-cancel")
        page.fill("#localize-steps input", "10")  # the form is kept: the default again for the tests that follow
        page.press("#localize-steps input", "Tab")
        bu.open_tab(page, "compare")
        page.uncheck("#predict-knockout input")
        page.locator("#predict-by").get_by_label("whole", exact=True).check()


# -- c. ------------------------------------------------------------------------------------------
def test_anatomy_heatmap_renders(page):
    region = _need("region1")
    bu.open_tab(page, "anatomy")
    page.wait_for_function("id => document.querySelector('#anatomy-summary').innerText.includes(id)", arg=region,
                           timeout=30_000)
    page.wait_for_function(
        "() => { const p = document.querySelector('#anatomy-heatmap .js-plotly-plot'); "
        "return p && p.data && p.data.some(d => d.type === 'heatmap') && document.querySelector('#anatomy-heatmap .main-svg'); }",
        timeout=30_000)
    assert page.locator("#anatomy-heatmap .heatmaplayer").count() >= 1, "no heatmap layer drawn in the SVG"
    assert "heatmap" in bu.plotly_trace_types(page, "anatomy-heatmap")
    assert "bar" in bu.plotly_trace_types(page, "anatomy-bars")


def test_anatomy_ablation_chart_and_top_tables_show(page):
    """The tensors and neurons holding most of the region are listed; the ablation job draws what each layer and
    module type is worth (two bar panels with whiskers) and its table, one row per part."""
    region = _need("region1")
    bu.open_tab(page, "anatomy")
    page.wait_for_function("id => document.querySelector('#anatomy-summary').innerText.includes(id)", arg=region,
                           timeout=30_000)
    for elem_id in ("anatomy-tensors", "anatomy-neurons"):
        page.wait_for_function("id => document.querySelectorAll('#' + id + ' [role=row].virtual-row').length >= 1",
                               arg=elem_id, timeout=30_000)
        assert all(re.fullmatch(r"[\d,]+", r[3]) for r in bu.table_rows(page, elem_id) if r), elem_id
    page.fill("#anatomy-ablate-n input", "16")
    line, took = bu.run_job(page, "#anatomy-ablate-run", "#anatomy-ablate-status", "anatomy-ablate-job",
                            timeout_s=JOB_S)
    print(f"[browser] ablation: {took:.1f} s")
    assert "· done" in line, f"the ablation did not finish: {line}"
    page.wait_for_function("() => { const p = document.querySelector('#anatomy-ablation-plot .js-plotly-plot'); "
                           "return p && p.data && p.data.length === 2 && "
                           "document.querySelector('#anatomy-ablation-plot .main-svg'); }", timeout=30_000)
    assert bu.plotly_trace_types(page, "anatomy-ablation-plot") == ["bar", "bar"]
    assert page.locator("#anatomy-ablation-plot .errorbar").count() >= 2, "no interval whiskers drawn"
    page.wait_for_function("() => document.querySelectorAll('#anatomy-ablation [role=row].virtual-row').length >= 4",
                           timeout=30_000)
    rows = [r for r in bu.table_rows(page, "anatomy-ablation") if r]
    assert any(r[0] == "layer 0" for r in rows) and any(r[0].endswith("(all layers)") for r in rows), rows
    assert all(re.fullmatch(r"[-+]\d+\.\d pts \[[-+]\d+\.\d, [-+]\d+\.\d\]", r[4]) for r in rows), rows


def _lab_job(page, prefix: str, name: str, fields: dict[str, str]) -> str:
    """Run a Laboratory section (``prefix``) on the first region with ``fields`` filled; its finished line."""
    bu.open_tab(page, "lab")
    bu.choose(page, f"{prefix}-region", _need("region1"))
    for selector, value in fields.items():
        page.fill(selector, value)
    line, took = bu.run_job(page, f"#{prefix}-run", f"#{prefix}-status", f"{prefix}-job", timeout_s=JOB_S)
    print(f"[browser] {name}: {took:.1f} s")
    assert "· done" in line, f"{name} did not finish: {line}"
    return line


def test_wise_curves_in_the_laboratory(page):
    _lab_job(page, "lab-wise", "WiSE", {"#lab-wise-alphas textarea, #lab-wise-alphas input": "0, 1",
                                        "#lab-wise-n input": "32"})
    page.wait_for_function("() => { const p = document.querySelector('#lab-wise-plot .js-plotly-plot'); "
                           "return p && p.data && p.data.length >= 6; }", timeout=30_000)
    names = page.evaluate("() => document.querySelector('#lab-wise-plot .js-plotly-plot').data.map(d => d.name)")
    assert any(n.startswith("WiSE-graft · movies") for n in names) and any(n.startswith("WiSE-FT · amazon") for n in names), names
    page.wait_for_function("() => document.querySelectorAll('#lab-wise-table [role=row].virtual-row').length >= 12",
                           timeout=30_000)  # the curves as numbers: 2 values of α × 2 curves × 3 tasks
    rows = [r for r in bu.table_rows(page, "lab-wise-table") if r]
    assert {(r[0], r[1]) for r in rows} == {(a, c) for a in ("0", "1") for c in ("WiSE-FT", "WiSE-graft")}, rows
    assert all(re.fullmatch(r"\d+\.\d%", r[3]) and re.fullmatch(r"\d\.\d{3}", r[4]) for r in rows), rows


def test_retraining_in_the_laboratory_fills_every_column(page):
    _lab_job(page, "lab-retrain", "re-training", {"#lab-retrain-train input": "64", "#lab-retrain-n input": "32"})
    page.wait_for_function("() => document.querySelectorAll('#lab-retrain-table [role=row].virtual-row').length >= 5",
                           timeout=30_000)
    rows = {r[0]: r for r in bu.table_rows(page, "lab-retrain-table") if r and r[1] == "movies"}
    column = list(dict.fromkeys(h for h, _ in bu.table_fit(page, "lab-retrain-table")["headers"])).index
    assert {"graft", "re-trained graft", "BitFit (biases)"} <= set(rows), rows
    for model in ("graft", "re-trained graft", "BitFit (biases)"):
        assert re.fullmatch(r"-?\d+\.\d%", rows[model][column("share of FT gain")]), rows[model]
    assert all(r[column("calibration")] in ("balanced", "over-confident", "under-confident") for r in rows.values()), rows
    assert "fine-tuning learning rate" in bu.text(page, "#lab-retrain-note")


# -- d. ------------------------------------------------------------------------------------------
def test_two_regions_compose(page):
    first = _need("region1")
    bu.open_tab(page, "localize")
    bu.choose(page, "localize-method", "Top movement")
    page.wait_for_function("() => document.querySelector('#localize-method-info').innerText.includes('Top movement')",
                           timeout=15_000)
    line, took = bu.run_job(page, "#localize-run", "#localize-status", "localize-job", timeout_s=JOB_S)
    print(f"[browser] second localization (top-movement): {took:.1f} s")
    assert "· done" in line, f"second localization did not finish: {line}"
    second = _region_id(line)
    assert second != first and "top-movement" in second, second
    STATE["region2"] = second

    bu.open_tab(page, "compose")
    for region in (first, second):
        if region not in bu.text(page, "#compose-regions"):
            bu.choose(page, "compose-regions", region)
    chosen = bu.text(page, "#compose-regions")
    assert first in chosen and second in chosen, chosen
    page.wait_for_function(
        "() => { const p = document.querySelector('#compose-overlap .js-plotly-plot'); "
        "return p && p.data && p.data.some(d => d.type === 'heatmap') && document.querySelector('#compose-overlap .main-svg'); }",
        timeout=30_000)
    line, took = bu.run_job(page, "#compose-run", "#compose-status", "compose-job", timeout_s=JOB_S)
    print(f"[browser] composition: {took:.1f} s")
    assert "· done" in line, f"composition did not finish: {line}"
    assert re.search(r"two random regions of these sizes would share [\d.]+ % \([\d,]+× chance\)", line), line
    page.wait_for_function("() => document.querySelectorAll('#compose-table [role=row].virtual-row').length >= 1",
                           timeout=30_000)
    rows = [r for r in bu.table_rows(page, "compose-table") if r]
    assert rows and all(r[0] == "movies" for r in rows), rows
    models = {r[2] for r in rows}
    assert {"region alone", "union graft"} <= models, rows
    job = bu.job_id_from_status(page)  # the banner names the job and, once it has ended, says so
    page.wait_for_function(f"() => document.querySelector('#status-message').innerText.includes('{job}) ended: done')",
                           timeout=30_000)
    assert "Submitted" not in bu.text(page, "#status-message")


def test_a_result_panel_downloads_its_own_tables_and_figures(page, tmp_path):
    import csv
    import io
    import zipfile

    _need("region2")  # the composition of test d
    bu.open_tab(page, "compose")
    path = bu.download_made_file(page, "#compose-report", "compose-report-file", tmp_path)
    with zipfile.ZipFile(path) as zf:
        root = zf.namelist()[0].split("/")[0]
        names = set(zf.namelist())
        assert {f"{root}/tables/overlap.csv", f"{root}/tables/overlap.json", f"{root}/figures/overlap.html"} <= names, names
        overlap = list(csv.DictReader(io.StringIO(zf.read(f"{root}/tables/overlap.csv").decode())))
    assert len(overlap) == 2 and all(float(row[row["region"]]) == 1.0 for row in overlap), overlap


def test_report_bundle_of_a_job_downloads(page, tmp_path):
    import json
    import zipfile

    job = _need("compare_job")
    bu.choose(page, "jobs-select", f"[{job}]")
    page.wait_for_selector("#jobs-bundle:not([disabled])", timeout=15_000)  # on for a finished job's pick
    path = bu.download_made_file(page, "#jobs-bundle", "jobs-bundle-file", tmp_path)
    assert path.name == f"report-{job}.zip", path.name
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        root = names[0].split("/")[0]
        assert {f"{root}/README.md", f"{root}/request.json", f"{root}/tables/rows.csv",
                f"{root}/figures/reliability.html"} <= set(names), names
        assert json.loads(zf.read(f"{root}/request.json"))["verb"] == "evaluate"
        assert "keeps" in zf.read(f"{root}/README.md").decode()


def test_a_tab_hidden_while_its_job_ended_shows_the_end_when_opened(page):
    """A tab is polled only while open: its job's line, written when the job was submitted, must not outlive the job
    once the tab is opened again (nor the header's banner, which every tab's poll replaces).

    The composition must end while its tab is hidden, however fast it runs: jobs run one at a time, so it is queued
    behind a learned localization of 100,000 steps, which this test cancels (from the jobs panel below the tabs)
    only once the Compose tab is hidden."""
    first, second = _need("region1"), _need("region2")
    bu.open_tab(page, "localize")
    bu.choose(page, "localize-method", "Learned")  # a data-free method would end at once
    page.fill("#localize-steps input", "100000")
    page.press("#localize-steps input", "Tab")
    holder = bu.submit_job(page, "#localize-run")
    try:
        bu.open_tab(page, "compose")
        for region in (first, second):
            if region not in bu.text(page, "#compose-regions"):
                bu.choose(page, "compose-regions", region)
        page.click("#compose-resolve label:has-text('first region wins')")  # another request than test d's: a new job
        job = bu.submit_job(page, "#compose-run")
        page.wait_for_function("id => document.querySelector('#compose-status').innerText.includes('[' + id + ']')",
                               arg=job, timeout=30_000)  # its line while it waits behind the localization
        bu.open_tab(page, "regions")
        waiting = bu.text(page, "#compose-status")
        assert f"[{job}]" in waiting and "· done" not in waiting, waiting
        bu.choose(page, "jobs-select", holder)  # release it: cancel the localization it waits for
        bu.cancel(page, "#jobs-cancel")
        page.wait_for_function(  # the jobs panel, polled on every tab, shows the composition done (id, …, status)
            "id => [...document.querySelectorAll('#jobs-table [role=row].virtual-row')].some(r => { "
            "const c = [...r.querySelectorAll('[role=gridcell]')].map(x => x.innerText.trim()); "
            "return c[0] === id && c[3] === 'done'; })", arg=job, timeout=JOB_S * 1000)
        hidden = bu.text(page, "#compose-status")
        assert f"[{job}]" in hidden and "· done" not in hidden, hidden  # hidden while it ended: not polled
        t0 = time.monotonic()
        bu.open_tab(page, "compose")
        page.wait_for_function("id => { const t = document.querySelector('#compose-status').innerText; "
                               "return t.includes('[' + id + ']') && t.includes('· done'); }", arg=job, timeout=30_000)
        print(f"[browser] the Compose tab showed its ended job {time.monotonic() - t0:.2f} s after it was opened")
    finally:
        bu.choose(page, "jobs-select", holder)  # never leave it running for the tests that follow
        page.wait_for_timeout(500)
        if not page.is_disabled("#jobs-cancel"):  # off once it was cancelled
            bu.cancel(page, "#jobs-cancel")
        bu.open_tab(page, "localize")
        page.fill("#localize-steps input", "10")  # the form is kept: the defaults again for the tests that follow
        page.press("#localize-steps input", "Tab")
        bu.choose(page, "localize-method", "Top movement")


NARROW, WIDE = {"width": 800, "height": 900}, {"width": 1400, "height": 1000}
TABLES_BY_TAB = {"localize": ["region-list", "jobs-table"], "compare": ["compare-table", "compare-differences", "compare-disagreements", "predict-table"], "anatomy": ["anatomy-kinds", "anatomy-tensors", "anatomy-neurons", "anatomy-ablation"],
                 "compose": ["compose-overlap-table", "compose-table"], "regions": ["regions-table"]}


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1400x1000", "800x900"])
def test_no_table_is_cut_off_and_no_number_is_split(page, viewport):
    """Every cell and header shows all of its text; a number is never split across lines; a table wider than the
    page scrolls sideways to its last column; at 1400 px the saved regions show every column, the fine-tuned model
    among them, without scrolling."""
    _need("region2")  # the compositions of test d: every table has rows
    page.set_viewport_size(viewport)
    try:
        for tab, tables in TABLES_BY_TAB.items():
            bu.open_tab(page, tab)
            for elem_id in tables:
                page.wait_for_function("id => document.querySelectorAll('#' + id + ' [role=row].virtual-row').length >= 1",
                                       arg=elem_id, timeout=30_000)
                fit = bu.table_fit(page, elem_id)
                assert not fit["cut"], f"{elem_id} at {viewport['width']} px cuts off {fit['cut'][:8]}"
                assert not fit["wrapped"], f"{elem_id} at {viewport['width']} px splits numbers {fit['wrapped'][:8]}"
                assert fit["width"] <= fit["shown"] + 1 or fit["scrolls"], f"{elem_id}: its last columns cannot be reached"
                if elem_id == "region-list" and viewport is WIDE:
                    assert fit["width"] <= fit["shown"] + 1, f"the saved regions need a sideways scroll: {fit['headers']}"
                    assert "fine-tuned model" in [h for h, _ in fit["headers"]]
    finally:
        page.set_viewport_size(bu.VIEWPORT)


def test_a_narrow_window_stacks_the_rows_and_keeps_the_plots_usable(page):
    _need("region1")
    page.set_viewport_size(NARROW)
    try:
        bu.open_tab(page, "anatomy")
        page.wait_for_function("() => document.querySelector('#anatomy-heatmap .main-svg') && "
                               "document.querySelector('#anatomy-bars .main-svg')", timeout=30_000)
        box = {i: page.locator(f"#{i}").bounding_box() for i in
               ("anatomy-region", "anatomy-mode", "anatomy-heatmap", "anatomy-bars", "anatomy-kinds")}
        assert box["anatomy-mode"]["y"] >= box["anatomy-region"]["y"] + box["anatomy-region"]["height"] - 1, box
        assert box["anatomy-kinds"]["y"] >= box["anatomy-bars"]["y"] + box["anatomy-bars"]["height"] - 1, box
        # every block of a stacked row is as wide as the page; a plot drawn at the narrow width fills it (colouring
        # by density draws the heatmap again; a plot drawn before the window narrowed keeps its width until redrawn)
        page.click("#anatomy-mode label:has-text('density')")
        fits = ("() => { const w = document.querySelector('#tab-anatomy').getBoundingClientRect().width; "
                "const box = s => document.querySelector(s).getBoundingClientRect(); "
                "return [['heatmap drawn', box('#anatomy-heatmap .main-svg')], ['bars block', box('#anatomy-bars')], "
                "['bars drawn', box('#anatomy-bars .main-svg')], ['table block', box('#anatomy-kinds')]].map("
                "([n, b]) => [n, Math.round(b.width), Math.round(b.height), Math.round(w)]); }")
        wide = "([n, w, h, tab]) => n === 'bars drawn' ? h >= 300 : (w >= 0.9 * tab && w <= tab + 1 && (n === 'table block' || h >= 300))"
        try:
            page.wait_for_function(f"() => ({fits})().every({wide})", timeout=30_000)
        except Exception:
            pytest.fail(f"the blocks do not fill the narrow page (what, width, height, tab width): {page.evaluate(fits)}")
        page.click("#anatomy-mode label:has-text('counts')")
        bu.open_tab(page, "models")
        base, ft = (page.locator(f"#{i}").bounding_box() for i in ("models-base", "models-finetuned"))
        assert ft["y"] >= base["y"] + base["height"] - 1, (base, ft)
    finally:
        page.set_viewport_size(bu.VIEWPORT)


def test_the_regions_table_shows_each_regions_latest_scores_and_their_frontier(page):
    """The Regions tab lists both saved regions; the first carries the accuracy its comparison (test b) measured, the
    same number as the Compare table's, and is a point of the frontier plot; at 1400 px every column shows without a
    sideways scroll, at 800 px the filter row stacks and the table scrolls; no cell is cut, no number split."""
    region, second, k = _need("region1"), _need("region2"), _need("k1")
    bu.open_tab(page, "compare")
    row = next(r for r in bu.table_rows(page, "compare-table") if r and r[0] == region and r[2] == "ID")
    accuracy = row[4].split(" [")[0]
    bu.open_tab(page, "regions")
    page.wait_for_function("([a, b, acc]) => { const t = document.querySelector('#regions-table').innerText; "
                           "return t.includes(a) && t.includes(b) && t.includes(acc); }", arg=[region, second, accuracy],
                           timeout=30_000)
    rows = {r[0]: r for r in bu.table_rows(page, "regions-table") if r}
    assert rows[region][4:6] == ["learned", f"{k:,}"] and rows[region][11] == accuracy, rows[region]
    assert rows[region][10] == row[3] and rows[region][8] == "0", (rows[region], row)  # Compare's n, not the check's
    assert re.fullmatch(r"\d+\.\d{3}", rows[region][12]), rows[region]
    # the second region was never compared: its entry is Localize's held-out check on its own n examples
    assert rows[second][4] == "top-movement" and rows[second][10] == "64", rows[second]
    assert re.fullmatch(r"\d+\.\d%", rows[second][11]), rows[second]
    page.wait_for_function("() => { const p = document.querySelector('#regions-frontiers .js-plotly-plot'); "
                           "return p && p.data && p.data.length >= 1 && document.querySelector('#regions-frontiers .main-svg'); }",
                           timeout=30_000)
    points = page.evaluate("() => document.querySelector('#regions-frontiers .js-plotly-plot').data.map(d => d.y)")
    assert sorted(len(y) for y in points) == [1, 1], points  # one line per method, each its one scored region
    try:
        for viewport in (WIDE, NARROW):
            page.set_viewport_size(viewport)
            fit = bu.table_fit(page, "regions-table")
            assert not fit["cut"] and not fit["wrapped"], (viewport, fit["cut"], fit["wrapped"])
            assert fit["width"] <= fit["shown"] + 1 if viewport is WIDE else fit["scrolls"], (viewport, fit["headers"])
            boxes = [page.locator(f"#{i}").bounding_box() for i in ("regions-filter", "regions-sort")]
            stacked = boxes[1]["y"] >= boxes[0]["y"] + boxes[0]["height"] - 1
            assert stacked == (viewport is NARROW), (viewport, boxes)
    finally:
        page.set_viewport_size(bu.VIEWPORT)


# -- e. ------------------------------------------------------------------------------------------
def test_region_file_downloads_and_loads(page, tmp_path):
    from graftui import regions

    first, k = _need("region1"), _need("k1")
    bu.open_tab(page, "regions")
    picked = page.input_value("#regions-select input")
    if first not in picked:
        bu.choose(page, "regions-select", first)
        picked = page.input_value("#regions-select input")
    shown_k = int(re.search(r"k=([\d,]+)", picked).group(1).replace(",", ""))
    assert shown_k == k, picked
    page.wait_for_function("k => document.querySelector('#regions-meta').innerText.includes(k)", arg=f"{k:,}",
                           timeout=30_000)
    with page.expect_download(timeout=60_000) as info:
        page.click("#region-download")
    download = info.value
    assert download.suggested_filename == f"{first}.safetensors"
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    record = regions.load(path)
    assert record.size == shown_k
    assert record.meta.get("method") == "learned" and record.meta.get("task") == "movies"


# -- f. ------------------------------------------------------------------------------------------
def test_corrupt_upload_gives_a_clear_message(page):
    bu.open_tab(page, "regions")
    garbage = os.urandom(4096)
    page.set_input_files("#region-upload input[type=file]",
                         files=[{"name": "bad.safetensors", "mimeType": "application/octet-stream", "buffer": garbage}])
    expected = "not a readable safetensors region file"
    page.wait_for_function(
        "t => ['#region-upload-info', '#status-message'].some(s => document.querySelector(s).innerText.includes(t))",
        arg=expected, timeout=30_000)
    status = bu.text(page, "#status-message")
    assert "bad.safetensors" in status and expected in status, status
    assert "✓" not in bu.text(page, "#region-upload-info")
    body = page.inner_text("body")
    assert "Traceback" not in body
    assert "internal error" not in body
    assert not STATE.get("page_errors"), f"JavaScript errors on the page: {STATE['page_errors'][:5]}"


def test_an_error_in_the_header_goes_with_the_next_success_on_another_tab(page):
    assert "⚠️" in bu.text(page, "#status-message")  # the corrupt upload of test f
    bu.open_tab(page, "anatomy")  # opening it draws the picked region: a success
    page.wait_for_function("() => !document.querySelector('#status-message').innerText.includes('⚠️')", timeout=30_000)


# -- g. ------------------------------------------------------------------------------------------
def test_deleting_a_region_clears_it_from_every_picker_and_polling_goes_on(page):
    first, second = _need("region1"), _need("region2")
    bu.open_tab(page, "regions")
    bu.choose(page, "regions-select", second)
    page.click("#region-delete")  # a first press only asks to press again: nothing is deleted on one click
    page.wait_for_function("() => document.querySelector('#status-message').innerText.includes('again to delete')",
                           timeout=30_000)
    assert "Confirm" in bu.text(page, "#region-delete")
    page.wait_for_function("() => !document.querySelector('#region-delete').innerText.includes('Confirm')",
                           timeout=40_000)  # left armed, it goes back to Delete after CONFIRM_SECONDS
    assert second in bu.text(page, "#region-list")
    page.click("#region-delete")  # so it asks again
    page.wait_for_function("() => document.querySelector('#region-delete').innerText.includes('Confirm')",
                           timeout=30_000)
    page.click("#region-delete")
    page.wait_for_function("id => document.querySelector('#status-message').innerText.includes('Deleted region ' + id)",
                           arg=second, timeout=60_000)  # once seen queued 28 s behind other handlers on a busy machine
    page.wait_for_function("id => !document.querySelector('#region-list').innerText.includes(id)", arg=second,
                           timeout=30_000)
    bu.open_tab(page, "compose")  # it still held both regions: the next poll leaves only the first
    page.wait_for_function("([a, b]) => { const t = document.querySelector('#compose-regions').innerText; "
                           "return t.includes(a) && !t.includes(b); }", arg=[first, second], timeout=30_000)
    assert not bu.text(page, "#compose-status").startswith("Error"), bu.text(page, "#compose-status")
    assert "⚠️" not in bu.text(page, "#status-message")


# -- h. ------------------------------------------------------------------------------------------
def test_an_uploaded_file_is_an_ood_task_with_a_label_mapping(page):
    """A CSV with 0/1 labels, uploaded on the Models tab, is offered as an OOD task; a mapping that
    swaps its labels is previewed beside the field and used by the comparison."""
    from graftui.tasks.classification.data import load_task

    first = _need("region1")
    amazon = load_task("amazon").splits["test"]
    rows = "\n".join(f"{t.replace(',', ' ')},{y}" for t, y in zip(amazon.texts[:60], amazon.labels[:60]))
    bu.open_tab(page, "models")
    page.click("text=Upload a dataset")
    page.set_input_files("#models-data-upload input[type=file]",
                         files=[{"name": "mine.csv", "mimeType": "text/csv", "buffer": f"text,label\n{rows}\n".encode()}])
    page.wait_for_function("() => document.querySelector('#models-data-info').innerText.includes('mine.csv')",
                           timeout=30_000)
    bu.choose(page, "models-task", "movies:")  # the upload became the task; back to movies, the file stays listed
    assert any("mine.csv" in o for o in bu.dropdown_options(page, "models-ood"))
    page.click("#models-ood input")
    page.keyboard.type("mine")  # filter the list down to the upload
    option = page.locator("ul[role=listbox] li", has_text="mine.csv").first
    option.wait_for(state="visible", timeout=30_000)
    option.click()
    page.keyboard.press("Escape")
    page.fill("#models-ood-labels textarea, #models-ood-labels input", "0=positive, 1=negative")
    page.press("#models-ood-labels textarea, #models-ood-labels input", "Enter")
    page.wait_for_function("() => document.querySelector('#models-ood-info').innerText.includes('mapped as asked')",
                           timeout=30_000)
    info = bu.text(page, "#models-ood-info")
    assert "0 → positive, 1 → negative" in info and "⚠️" not in info, info

    bu.open_tab(page, "compare")
    if first not in bu.text(page, "#compare-regions"):
        bu.choose(page, "compare-regions", first)
    page.fill("#compare-n input", "32")
    line, _ = bu.run_job(page, "#compare-run", "#compare-status", "compare-job", timeout_s=JOB_S)
    assert "· done" in line and "mapped as asked" in line, line
    tasks = {r[1] for r in bu.table_rows(page, "compare-table") if r}
    assert any("mine.csv" in t for t in tasks), tasks


def test_a_reload_keeps_the_form_and_the_uploaded_task(page, server):
    """After a reload the page shows the same pair, task, OOD tasks (the uploaded file among them), mapping and settings."""
    bu.watch_stored_form(page)
    bu.open_tab(page, "localize")
    page.fill("#localize-steps input", "7")
    page.press("#localize-steps input", "Tab")
    bu.open_tab(page, "lab")
    page.fill("#lab-purify input", "3")
    page.press("#lab-purify input", "Tab")
    bu.wait_form_stored(page, {"steps": 7, "lab_purify": 3})  # the browser stores the form on change
    bu.wait_usable(page, server.url, timeout_s=90)  # a new load of the page, in the same browser
    page.wait_for_function("() => document.querySelector('#models-ood').innerText.includes('mine.csv')", timeout=30_000)
    assert page.input_value("#models-ood-labels textarea, #models-ood-labels input") == "0=positive, 1=negative"
    assert "movies" in page.input_value("#models-task input")
    page.wait_for_function("() => document.querySelector('#models-ood-info').innerText.includes('mine.csv')",
                           timeout=30_000)  # the preview beside the mapping is made again
    bu.open_tab(page, "localize")
    assert page.input_value("#localize-steps input") == "7"
    bu.open_tab(page, "lab")  # the Laboratory's fields too: those set above and by the WiSE test
    assert page.input_value("#lab-purify input") == "3"
    assert page.input_value("#lab-wise-alphas textarea, #lab-wise-alphas input") == "0, 1"
    assert page.input_value("#lab-wise-n input") == "32"


def test_two_browser_tabs_keep_their_own_pair_and_jobs_across_a_reload(page, server):
    """A second tab starts from the form stored last, then keeps its own: each tab, reloaded, shows the pair picked
    in it, not the one picked last in the other, and the jobs it submitted, not those the other submitted since; a
    new tab starts at the latest job, not at the job another tab shows."""
    _need("predict_job")
    bu.open_tab(page, "compare")
    mine = bu.tab_job(page, "#predict-status")  # this tab's own latest prediction
    assert mine, bu.text(page, "#predict-status")
    bu.open_tab(page, "models")
    first = page.input_value("#models-finetuned input")
    assert first.startswith("minilm-movies"), first
    other = page.context.new_page()
    try:
        bu.wait_usable(other, server.url, timeout_s=90)
        other.wait_for_function("(v) => document.querySelector('#models-finetuned input').value === v", arg=first,
                                timeout=30_000)  # a new tab starts where the last form was
        bu.watch_stored_form(other)
        bu.choose(other, "models-finetuned", "smollm2-movies (offline")
        bu.wait_form_stored(other, {"finetuned": "smollm2-movies", "base": "smollm2"})
        bu.open_tab(other, "compare")  # another pair: the regions of the last one are no longer picked
        other.wait_for_function("() => !document.querySelectorAll('#compare-regions .token').length", timeout=30_000)
        bu.choose(other, "compare-regions", _need("region1"))  # one picked again by hand
        other.fill("#predict-text textarea", "Another tab's sentence.")
        line, _ = bu.run_job(other, "#predict-run", "#predict-status", "predict-job", timeout_s=JOB_S)
        theirs = bu.tab_job(other, "#predict-status")
        assert theirs and theirs != mine, line
        bu.wait_usable(page, server.url, timeout_s=90)
        bu.open_tab(page, "localize")  # the form is back (the steps the reload test set) ...
        page.wait_for_function("() => document.querySelector('#localize-steps input').value === '7'", timeout=30_000)
        bu.open_tab(page, "models")
        assert page.input_value("#models-finetuned input") == first  # ... with this tab's own pair
        bu.open_tab(page, "compare")  # ... and its own prediction, not the other tab's later one
        page.wait_for_function("id => document.querySelector('#predict-status').innerText.includes(id)", arg=mine,
                               timeout=30_000)
        assert theirs not in bu.text(page, "#predict-status")
        bu.wait_usable(other, server.url, timeout_s=90)
        other.wait_for_function("() => document.querySelector('#models-finetuned input').value.startsWith("
                                "'smollm2-movies')", timeout=30_000)
        assert other.input_value("#models-base input").startswith("smollm2")
        third = page.context.new_page()
        try:
            bu.wait_usable(third, server.url, timeout_s=90)
            bu.open_tab(third, "compare")
            assert third.input_value("#predict-job input") in ("", "latest sentences"), "a new tab took a shown job"
        finally:
            third.close()
    finally:
        other.close()


def test_the_models_tab_follows_the_fine_tune_picked_and_the_task_its_kind(page):
    """Picking smollm2-dates brings its base and its task, drops the sentiment OOD tasks and the last pair check, and
    moves the budget to a completion skill's 1 %; picking movies again brings the sentiment OOD tasks back."""
    bu.open_tab(page, "models")
    bu.choose(page, "models-finetuned", "smollm2-dates (offline")
    page.wait_for_function("() => document.querySelector('#models-base input').value.startsWith('smollm2 (offline')",
                           timeout=30_000)
    page.wait_for_function("() => document.querySelector('#models-task input').value.includes('dates')",
                           timeout=30_000)
    page.wait_for_function("() => !document.querySelector('#models-ood').innerText.includes('amazon')", timeout=30_000)
    assert "Press Check pair" in bu.text(page, "#models-pair-info")
    page.wait_for_function("() => document.querySelector('#models-ood-info').innerText.includes('No OOD task')",
                           timeout=30_000)
    bu.open_tab(page, "localize")
    assert page.input_value("#localize-budget input[type=number]") == "-2"
    bu.open_tab(page, "models")
    bu.choose(page, "models-task", "movies:")
    page.wait_for_function("() => document.querySelector('#models-ood').innerText.includes('amazon')", timeout=30_000)
    bu.open_tab(page, "localize")
    page.wait_for_function("() => document.querySelector('#localize-budget input[type=number]').value === '-3'",
                           timeout=30_000)


def test_a_harness_task_named_in_the_task_box_is_checked_before_any_job(page):
    """lm-eval:graftui_dates picked as the task: the harness reads it at once, and its check and first test document
    show beside the task box; a task of another kind clears it."""
    bu.open_tab(page, "models")
    bu.choose(page, "models-task", "lm-eval:graftui_dates")
    page.wait_for_function("() => document.querySelector('#models-task-info').innerText"
                           ".includes('graftui_dates: generate_until task')", timeout=60_000)
    text = bu.text(page, "#models-task-info")
    assert "First test document as the model reads it" in text and "In words:" in text and "Target:" in text, text
    try:
        bu.fits_phone(page, ["models-task-info", "models-task"])  # on a phone: the document read in the window
    finally:
        page.set_viewport_size(bu.VIEWPORT)
    bu.choose(page, "models-task", "movies:")
    page.wait_for_function("() => document.querySelector('#models-task-info').innerText.trim() === ''",
                           timeout=30_000)


def test_a_completion_skill_is_localized_and_compared_by_its_generations(page, tmp_path_factory):
    """A tiny causal LM fine-tuned on an uploaded (prompt, completion) file: Localize checks its region by generation
    and Compare shows exact match, loss and the generations side by side."""
    import graftui
    from lm_util import make_lm, make_tokenizer, write_completion_task

    root = tmp_path_factory.mktemp("completion-pair")
    tok = make_tokenizer(root / "base")
    make_lm("llama", len(tok)).save_pretrained(root / "base")
    task = write_completion_task(root / "opposites.csv")
    ft = graftui.finetune(base=str(root / "base"), task=str(task), optimizer="adamw", lr=0.02, epochs=15,
                          train_examples=0, out=str(root / "ft"), max_new_tokens=4)
    bu.open_tab(page, "models")
    for elem, value in (("models-base", root / "base"), ("models-finetuned", ft.out)):
        page.fill(f"#{elem} input", str(value))
        page.press(f"#{elem} input", "Enter")
    page.click("text=Upload a dataset")
    page.set_input_files("#models-data-upload input[type=file]", files=[
        {"name": "opposites.csv", "mimeType": "text/csv", "buffer": task.read_bytes()}])
    page.wait_for_function("() => document.querySelector('#models-task').innerText.includes('opposites.csv') || "
                           "document.querySelector('#models-task input').value.includes('opposites.csv')", timeout=30_000)
    bu.open_tab(page, "localize")
    page.fill("#localize-steps input", "2")
    page.press("#localize-steps input", "Tab")
    line, _ = bu.run_job(page, "#localize-run", "#localize-status", "localize-job", timeout_s=JOB_S)
    assert "· done" in line and re.search(r"held-out examples of opposites\.csv.*exact match", line, re.S), line
    region = _region_id(line)
    bu.open_tab(page, "compare")
    # compare this region alone: the regions earlier tests picked come off, each waited for until it is gone
    others = "id => [...document.querySelectorAll('#compare-regions .token')].filter(t => !t.innerText.includes(id))"
    while left := page.evaluate(f"id => ({others})(id).length", region):
        page.evaluate(f"id => ({others})(id)[0].querySelector('.token-remove').click()", region)
        page.wait_for_function(f"([id, n]) => ({others})(id).length < n", arg=[region, left], timeout=15_000)
    if region not in bu.text(page, "#compare-regions"):
        bu.choose(page, "compare-regions", region)  # offered once the finished job has refreshed the pickers
    assert page.evaluate("() => document.querySelectorAll('#compare-regions .token').length") == 1
    line, _ = bu.run_job(page, "#compare-run", "#compare-status", "compare-job", timeout_s=JOB_S)
    assert "· done" in line and "against FT" in line, line
    page.wait_for_function("() => document.querySelector('#compare-table').innerText.includes('exact match')",
                           timeout=30_000)
    models = [r[0] for r in bu.table_rows(page, "compare-table") if r]
    assert models[:2] == ["fine-tuned", "pre-trained, same prompt"] and region in models, models
    bu.reopen_phone_closed(page, "tab-compare")  # the parts the phone-width checks before closed, opened by hand
    # the generations table is drawn in its own frame, after the comparison's table: wait for it, not for the other
    page.wait_for_function("() => { const t = document.querySelector('#compare-disagreements'); "
                           "const row = t.querySelector('[role=row].virtual-row'); "
                           "return t.innerText.includes('Generations on the first test examples') && row && "
                           "/[✓✗]/.test(row.innerText); }", timeout=30_000)  # not "disagree"
    shown = [r for r in bu.table_rows(page, "compare-disagreements") if r]
    assert len(shown) == 12 and all(any(c.startswith(("✓", "✗")) for c in r) for r in shown), shown
    assert not page.is_visible("#compare-reliability") and not page.is_visible("#compare-histogram")  # nothing to draw
    # Try it: for a completion region the whole box is one prompt (two lines here), and each model's greedy generation
    # for it is a row of the table
    page.wait_for_function("() => document.querySelector('#predict-run').innerText.includes('Generate') && "
                           "document.querySelector('#predict-text').innerText.includes('Prompt')", timeout=15_000)
    page.fill("#predict-text textarea", "north south\nhot is not")
    line, _ = bu.run_job(page, "#predict-run", "#predict-status", "predict-job", timeout_s=JOB_S)
    assert "· done" in line, line
    page.wait_for_function("() => document.querySelector('#predict-table').innerText.includes('generation')",
                           timeout=30_000)
    rows = [r for r in bu.table_rows(page, "predict-table") if r]
    assert len(rows) == 3 and [r[1] for r in rows][1:] == ["fine-tuned", region], rows  # body, FT, the graft: one prompt
    assert all(" ".join(r[0].split()) == "north south hot is not" for r in rows), rows
    assert rows[1][3] == "" and {rows[0][3], rows[2][3]} <= {"yes", "no"}, rows
