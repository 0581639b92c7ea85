"""How the page fits a wide window, an 800 px one and a phone (390 px), in headless Chromium.

One app server (``GRAFTUI_FAST=1``, a fresh ``GRAFTUI_HOME``) and one page serve the module; the tests run in
order: a localization names its held-out diamonds on the live plot; a comparison's differences table is filtered and
its disagreements paged, and the Compare tab keeps its secondary parts closed; at 390 px every tab's button is in the
tab bar, the jobs table fits without a sideways scroll with status and progress shown, and the anatomy heatmap keeps
its title and readable numbers. The pure helpers behind the filter and the pages are checked first, without a
browser. On a failure the page and the server log go to ``test-artifacts/``.
"""

from __future__ import annotations

import re
import time

import pandas as pd
import pytest

import browser_util as bu
from conftest import link_shared_builds
from test_browser import browser  # noqa: F401 - the module's Chromium fixture

ARTIFACTS = bu.ARTIFACTS
WIDE, NARROW, PHONE = {"width": 1400, "height": 1000}, {"width": 800, "height": 900}, {"width": 390, "height": 844}
TABS = ["models", "finetune", "localize", "compare", "anatomy", "compose", "lab", "regions"]
FIRST_JOB_S = 300  # the first job waits for the default fine-tune, built in the background on first page load
JOB_S = 240
STATE: dict = {}
PHONE_COMPARE_PX = 8_000  # the Compare tab on a phone, its secondary parts closed: 6,519 px measured (9,152 with
# the paired differences open)
TALLEST = """() => [...document.querySelectorAll('[id]')].filter(e => e.offsetParent && !e.closest('#tabs > .tab-wrapper')
  && (e.closest('#tab-compare') || !e.closest('#tabs'))).map(e => [e.id, Math.round(e.getBoundingClientRect().height)])
  .filter(([id, h]) => h >= 400).sort((a, b) => b[1] - a[1]).slice(0, 14)"""
HEIGHT = "() => Math.max(document.documentElement.scrollHeight, document.body.scrollHeight)"


# -- the helpers behind the Compare tab's filter and pages (no browser) -----------------------------------------
def _differences():
    from graftui.ui import tables
    from graftui.ui.tabs import compare

    rows = [[f"{a} − {b}", task, dist, metric, "+1.0 pts [−2.0, +4.0]", "0.5", "not distinguishable at n = 64"]
            for a, b in (("r1", "fine-tuned"), ("r1", "Random"))
            for task, dist in (("movies", "ID"), ("amazon", "OOD")) for metric in ("accuracy", "ECE")]
    return compare.table_value(pd.DataFrame(rows, columns=tables.DIFFERENCE_COLUMNS))


@pytest.mark.unit
def test_the_differences_open_on_their_first_comparison_and_filter_by_words():
    from graftui.ui.tabs import compare

    table = _differences()
    choices = compare.comparison_choices(table)
    assert choices == [compare.ALL_COMPARISONS, "r1 − fine-tuned", "r1 − Random"]
    assert compare.comparison_shown(choices, None) == "r1 − fine-tuned"  # a first result: the main comparison
    assert compare.comparison_shown(choices, compare.ALL_COMPARISONS) == compare.ALL_COMPARISONS  # a choice is kept
    assert compare.comparison_shown([compare.ALL_COMPARISONS], None) is None  # no result yet: the first one picks
    with_paper = [*choices, "r1 − Top movement", "r1 (baseline) − Top movement"]
    assert compare.comparison_shown(with_paper, None) == "r1 − Top movement"  # the paper's comparison opens
    shown, line = compare.filter_differences(table, "r1 − Random", "")
    assert len(shown) == 4 and set(shown["a − b"]) == {"r1 − Random"} and line == "4 of 8 differences shown."
    shown, line = compare.filter_differences(table, compare.ALL_COMPARISONS, "ood  ece")  # every word, any case
    assert list(shown["task"]) == ["amazon", "amazon"] and set(shown["metric"]) == {"ECE"}, shown
    assert line == "2 of 8 differences shown."
    shown, line = compare.filter_differences(table, compare.ALL_COMPARISONS, "")
    assert len(shown) == 8 and line == "All 8 differences shown."
    assert compare.filter_differences(None, None, "x")[1] == ""  # no result yet: no line


@pytest.mark.unit
def test_a_long_table_is_shown_a_page_at_a_time():
    from graftui.ui import tables
    from graftui.ui.tabs import compare

    rows = [["r1", f"sentence {i}", "pos", "pos", "90%", "neg", "80%"] for i in range(23)]
    table = compare.table_value(pd.DataFrame(rows, columns=tables.DISAGREEMENT_COLUMNS), "label", 10)
    shown, page, line, before, after = compare.page_of(table, 0)
    assert list(shown["text"]) == [f"sentence {i}" for i in range(10)] and (page, before, after) == (0, False, True)
    assert line == "Rows 1–10 of 23 (page 1 of 3)."
    shown, page, line, before, after = compare.page_of(table, 7)  # past the end: the last page
    assert list(shown["text"]) == ["sentence 20", "sentence 21", "sentence 22"] and page == 2
    assert (before, after) == (True, False) and line == "Rows 21–23 of 23 (page 3 of 3)."
    assert compare.page_of(table, -3)[1] == 0
    whole = compare.table_value(pd.DataFrame(rows[:12], columns=tables.DISAGREEMENT_COLUMNS))  # generations: all
    shown, _, line, before, after = compare.page_of(whole, 0)
    assert len(shown) == 12 and line == "All 12 rows shown." and not before and not after
    # a table redrawn unchanged is the same value (the page's filter and page stay), a changed one is not
    assert compare.table_value(pd.DataFrame(rows, columns=tables.DISAGREEMENT_COLUMNS), "label", 10) == table
    assert compare.table_value(pd.DataFrame(rows[1:], columns=tables.DISAGREEMENT_COLUMNS), "label", 10) != table


# -- the served app ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory, shared_builds):
    home = link_shared_builds(tmp_path_factory.mktemp("graftui-layout-home"), shared_builds)  # built once a session
    srv = bu.started(home, "app-layout-server", fast=True)
    STATE["server"] = srv
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def page(browser, server):
    context = browser.new_context(viewport=WIDE)
    pg = context.new_page()
    STATE["page"] = pg
    try:
        bu.wait_usable(pg, server.url, timeout_s=90)
    except Exception:
        bu.save_artifacts(pg, "layout-page-load", ARTIFACTS, server)
        raise
    yield pg
    context.close()


@pytest.fixture(autouse=True)
def _artifacts_on_failure(request):
    failed_before = request.session.testsfailed
    t0 = time.monotonic()
    yield
    print(f"[layout] {request.node.name}: {time.monotonic() - t0:.1f} s")
    if request.session.testsfailed > failed_before and "page" in STATE:
        bu.save_artifacts(STATE.get("page"), request.node.name, ARTIFACTS, STATE.get("server"))


def _need(key: str):
    if key not in STATE:
        pytest.fail(f"an earlier test did not produce {key!r}; run the whole module in order", pytrace=False)
    return STATE[key]


PLOT_WORDS = """(id) => { const p = document.querySelector('#' + id + ' .js-plotly-plot');
  if (!p || !p.data || !p.layout) return null;
  return {notes: (p.layout.annotations || []).map(a => a.text || ''),
          titles: (p.layout.annotations || []).filter(a => a.yanchor === 'bottom').map(a => a.text || ''),
          held: p.data.filter(d => d.name === 'held-out').map(d => d.y.length),
          legend: p.layout.showlegend !== false, names: p.data.map(d => d.name)}; }"""


@pytest.mark.browser
def test_the_live_plot_names_its_held_out_diamonds(page):
    bu.open_tab(page, "localize")
    page.fill("#localize-steps input", "4")
    page.press("#localize-steps input", "Tab")
    line, took = bu.run_job(page, "#localize-run", "#localize-status", "localize-job", timeout_s=FIRST_JOB_S)
    print(f"[layout] first localization (waits for the default fine-tune): {took:.1f} s")
    assert "· done" in line, line
    m = re.search(r"saved region (\S+)", line)
    assert m, line
    STATE["region"] = m.group(1)
    try:  # both checks drawn: the start and the learned region
        page.wait_for_function(f"() => {{ const w = ({PLOT_WORDS})('localize-plot'); "
                               "return w && JSON.stringify(w.held) === '[2]'; }", timeout=30_000)
    except Exception:
        pytest.fail(f"the held-out checks are not on the live plot: {page.evaluate(PLOT_WORDS, 'localize-plot')}")
    words = page.evaluate(PLOT_WORDS, "localize-plot")
    texts = " ".join(words["notes"])
    assert re.search(r"top-movement start \d+\.\d%", texts), words["notes"]  # the start diamond is named
    assert re.search(r"learned region \d+\.\d%", texts), words["notes"]
    assert words["legend"] and "γ ≥ 0.5 count" in words["names"], words
    assert any("not the region" in t for t in words["notes"]), words["notes"]  # the count is said not to be the region
    assert re.search(r"held-out ◆, n = 64 \(±\d+ pts\)<br>too few", texts), words["notes"]  # 64 < 100 examples


@pytest.mark.browser
def test_compare_filters_its_differences_pages_its_disagreements_and_keeps_the_rest_closed(page):
    region = _need("region")
    bu.open_tab(page, "compare")
    page.wait_for_function("id => document.querySelector('#compare-regions').innerText.includes(id)", arg=region,
                           timeout=30_000)
    page.fill("#compare-n input", "128")
    page.press("#compare-n input", "Tab")
    line, took = bu.run_job(page, "#compare-run", "#compare-status", "compare-job", timeout_s=JOB_S)
    print(f"[layout] comparison on 128 examples: {took:.1f} s")
    assert "· done" in line, line
    # the differences open on the paper's comparison (the graft against the top-movement region of its size), and say
    # how many of how many are shown
    page.wait_for_function("() => /\\d+ of \\d+ differences shown/.test("
                           "document.querySelector('#compare-differences-count').innerText)", timeout=30_000)
    count = bu.text(page, "#compare-differences-count")
    shown, total = map(int, re.search(r"(\d+) of (\d+) differences", count).groups())
    rows = [r for r in bu.table_rows(page, "compare-differences") if r]
    assert len(rows) == shown < total and {r[0] for r in rows} == {f"{region} − Top movement"}, (count, rows)
    bu.choose(page, "compare-differences-pick", "every comparison")
    page.wait_for_function("n => document.querySelector('#compare-differences-count').innerText.includes("
                           "'All ' + n + ' differences')", arg=total, timeout=30_000)
    # read once the table shows the whole filter's rows: each key typed filters by what is typed so far ("O" keeps OOD
    # ECE rows), and the rows of a filter typed half-way may still be on screen when the count has changed
    page.click("#compare-differences-words input, #compare-differences-words textarea")
    page.keyboard.type("OOD accuracy")
    page.wait_for_function("n => !document.querySelector('#compare-differences-count').innerText.includes("
                           "'All ' + n)", arg=total, timeout=30_000)
    deadline, rows = time.monotonic() + 30, []
    while time.monotonic() < deadline:
        rows = [r for r in bu.table_rows(page, "compare-differences") if r]
        if rows and all(r[2] == "OOD" and r[3] == "accuracy" for r in rows):
            break
        time.sleep(0.25)
    assert rows and all(r[2] == "OOD" and r[3] == "accuracy" for r in rows), rows
    # the disagreements: ten a page, with a control to the next page
    page.wait_for_function("() => /Rows 1–10 of \\d+/.test(document.querySelector('#compare-disagreements-page')"
                           ".innerText)", timeout=30_000)
    first = [r for r in bu.table_rows(page, "compare-disagreements") if r]
    assert len(first) == 10 and not page.is_enabled("#compare-disagreements-prev"), first
    page.click("#compare-disagreements-next")
    page.wait_for_function("() => /Rows 11–/.test(document.querySelector('#compare-disagreements-page').innerText)",
                           timeout=30_000)
    second = [r for r in bu.table_rows(page, "compare-disagreements") if r]
    assert second and len(second) <= 10 and second[0][1] != first[0][1], second
    assert page.is_enabled("#compare-disagreements-prev")
    # one region: no side-by-side figure; the sparsity sweep is closed until opened
    assert not page.is_visible("#compare-side-by-side")
    assert not page.is_visible("#sweep-run")
    heights = {}
    for name, viewport in (("1400", WIDE), ("800", NARROW), ("390", PHONE)):
        page.set_viewport_size(viewport)
        page.wait_for_timeout(1500)
        heights[name] = page.evaluate(HEIGHT)
        print(f"[layout] Compare at {name} px, its tallest parts: {page.evaluate(TALLEST)}")
    closed = page.evaluate("() => [...document.querySelectorAll('#tab-compare .phone-closed button.label-wrap')]"
                           ".map(b => b.classList.contains('open'))")
    page.set_viewport_size(WIDE)
    opened = page.evaluate("() => [...document.querySelectorAll('#tab-compare .phone-closed button.label-wrap')]"
                           ".map(b => b.classList.contains('open'))")
    print(f"[layout] Compare tab page height: {heights['1400']} px at 1400 px, {heights['800']} px at 800 px, "
          f"{heights['390']} px at 390 px")
    assert heights["800"] < 12_000, heights  # 14,800 px with every row and section open (n = 200, one region)
    # on a phone the secondary parts (paired differences, calibration plots, the examples the models disagree on) are
    # closed accordions, closed once: widening the window again leaves them as they are
    assert closed == [False] * 3 and opened == [False] * 3, (closed, opened)
    assert heights["390"] < PHONE_COMPARE_PX, heights  # 11,647 px with them open


@pytest.mark.browser
def test_a_phone_reaches_every_tab_and_sees_where_each_job_stands(page):
    _need("region")
    page.set_viewport_size(PHONE)
    try:
        page.wait_for_timeout(1000)
        boxes = page.evaluate("""(names) => names.map(n => { const b = document.getElementById('tab-' + n + '-button');
            if (!b) return [n, null]; const r = b.getBoundingClientRect();
            return [n, [Math.round(r.left), Math.round(r.right), Math.round(r.width), b.offsetParent !== null]]; })""",
                              TABS)
        assert all(box and box[3] and box[2] > 0 and box[0] >= 0 and box[1] <= PHONE["width"] for _, box in boxes), boxes
        assert not page.is_visible("#tabs .overflow-menu button"), "tabs are still behind the ⋯ menu"
        for name in TABS:  # each opens from its own button
            bu.open_tab(page, name)
        table = page.evaluate("""() => { const vp = document.querySelector('#jobs-table .virtual-table-viewport');
            const box = vp.getBoundingClientRect();
            const shown = [...document.querySelectorAll('#jobs-table th')].filter(h => getComputedStyle(h).display !== 'none'
                && h.getBoundingClientRect().right <= box.right + 1 && h.getBoundingClientRect().width > 0)
                .map(h => h.innerText.replace(/[⋮\\s]+$/, '').trim());
            return {scroll: vp.scrollWidth, client: vp.clientWidth, shown}; }""")
        assert table["scroll"] <= table["client"], f"the jobs table scrolls sideways at 390 px: {table}"
        assert {"status", "progress"} <= set(table["shown"]), table
        rows = [r for r in bu.table_rows(page, "jobs-table") if r]
        assert any("done" in r for r in rows), rows
    finally:
        page.set_viewport_size(WIDE)


@pytest.mark.browser
def test_the_anatomy_heatmap_keeps_its_title_and_numbers_on_a_phone(page):
    region = _need("region")
    bu.open_tab(page, "anatomy")
    page.wait_for_function("id => document.querySelector('#anatomy-summary').innerText.includes(id)", arg=region,
                           timeout=30_000)
    page.set_viewport_size(PHONE)
    try:
        page.click("#anatomy-mode label:has-text('density')")  # drawn again at the phone's width
        page.wait_for_function("() => document.querySelector('#anatomy-heatmap .gtitle') && "
                               "document.querySelector('#anatomy-heatmap .gtitle').textContent.includes('share of the cell')",
                               timeout=30_000)
        page.click("#anatomy-mode label:has-text('counts')")
        page.wait_for_function("() => document.querySelector('#anatomy-heatmap .gtitle').textContent.includes("
                               "'parameters per cell')", timeout=30_000)
        page.wait_for_timeout(500)
        fit = page.evaluate("""() => { const svg = document.querySelector('#anatomy-heatmap .main-svg').getBoundingClientRect();
            const title = document.querySelector('#anatomy-heatmap .gtitle').getBoundingClientRect();
            const sizes = [...document.querySelectorAll('#anatomy-heatmap .heatmaplayer text')]
                .map(t => parseFloat(getComputedStyle(t).fontSize));
            return {svg: [Math.round(svg.left), Math.round(svg.right)], title: [Math.round(title.left), Math.round(title.right)],
                    smallest: Math.min(...sizes), cells: sizes.length}; }""")
        assert fit["title"][1] <= fit["svg"][1] + 1 and fit["title"][0] >= fit["svg"][0] - 1, fit  # not clipped
        assert fit["cells"] > 0 and fit["smallest"] >= 9, fit  # numbers at a readable size
    finally:
        page.set_viewport_size(WIDE)
