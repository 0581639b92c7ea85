"""The runs table of the Regions tab in headless Chromium (``-k runs``): two runs picked have their mask-learning
curves overlaid in one plot and their differing settings side by side; a tag written appears in the table, and a
note holding markup is shown as text.

The server's home is made before it starts, in seconds: three regions of a tiny pair, a finished localize job that
recorded the curves of two of them (one per seed, as a run over seeds records them), and the default fine-tuned
checkpoint marked built, so the page does not fine-tune it in the background: no test here needs a model.
"""

from __future__ import annotations

import pandas as pd
import pytest

import browser_util as bu
from graftui.ui import runs
from test_browser import ARTIFACTS, browser  # noqa: F401 - the module's Chromium fixture

pytestmark = pytest.mark.browser
SCORES = {"a": {"accuracy": 0.7, "ece": 0.125, "share_of_ft": 0.5},
          "b": {"accuracy": 0.8125, "ece": 0.25, "share_of_ft": 0.75}}
HOSTILE_NOTE = "<img src=x onerror=\"window.__pwned=1\"> **not bold**"


def _make_home(home) -> dict:
    """Regions and job records written as the app writes them, into ``home``."""
    import torch

    from graftui import regions
    from graftui.jobs import JobRunner

    with bu.model_free_home(home) as (pair, name):
        ids = {}
        for key, start, seed, steps, created in (("a", 0, 0, 6, "2024-01-01T10:00:00Z"),  # a and b: one run, 2 seeds
                                                 ("b", 40, 1, 6, "2024-01-01T10:00:01Z"),
                                                 ("c", 80, 2, 9, "2024-01-01T10:00:02Z")):
            learn = {"steps": steps, "lr": 0.02, "seed": seed}
            record = regions.make_record(pair, {name: torch.arange(start, start + 20)}, {
                "method": "learned", "task": "movies", "sparsity": 0.01, "budget": "sparsity=0.01", "learn": learn,
                "request": {"verb": "localize", "task": "movies", "method": "learned", "steps": steps, "seed": seed}})
            record.meta.created = created
            ids[key] = f"run-{key}"
            path = regions.save(record, home / "regions" / f"{ids[key]}.safetensors")
            if key in SCORES:  # a and b scored, as Compare notes a graft's scores; c never
                regions.note_scores(home / "regions", [{"digest": regions.read_header(path).digest, "task": "movies",
                                                        "n": 64, "when": created, **SCORES[key]}])
        runner = JobRunner(home / "jobs")

        def body(ctx):
            for seed, n in ((0, 6), (1, 6)):
                for i in range(1, n + 1):
                    ctx.report({"step": i, "steps": n, "loss": 1.0 - 0.05 * i + seed, "accuracy": 0.5 + 0.04 * i,
                                "region_size": 20, "seed": seed})
            return {"region": "core", "seeds": [{"seed": 0, "region": ids["a"]}, {"seed": 1, "region": ids["b"]}]}

        job = runner.submit("localize", "Localize 'movies' over seeds 0, 1", body, {"verb": "localize"})
        assert runner.wait(job.id, 30).status == "done"  # and its record is written
    return ids


@pytest.fixture(scope="module")
def runs_page(browser, tmp_path_factory):  # noqa: F811
    home = tmp_path_factory.mktemp("graftui-runs-home")
    ids = _make_home(home)
    srv = bu.started(home, "runs-server", fast=True)
    context = browser.new_context(viewport=bu.VIEWPORT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    try:
        bu.wait_usable(page, srv.url, timeout_s=90)
        yield page, ids, errors, srv
    finally:
        context.close()
        srv.stop()


def _traces(page) -> list:
    return page.evaluate("() => { const p = document.querySelector('#runs-curves .js-plotly-plot'); "
                         "return p && p.data ? p.data.map(d => [d.name, d.x.length, d.y[0]]) : []; }")


def test_two_runs_picked_overlay_their_curves_and_show_their_differing_settings(runs_page, request):
    page, ids, errors, srv = runs_page
    try:
        bu.open_tab(page, "regions")
        page.wait_for_function("ids => { const t = document.querySelector('#runs-table').innerText; "
                               "return ids.every(i => t.includes(i)); }", arg=list(ids.values()), timeout=30_000)
        rows = {r[0]: r for r in bu.table_rows(page, "runs-table") if r}
        run = runs.RUNS_COLUMNS.index("run over seeds")
        assert rows[ids["a"]][3] == "1.000%" and rows[ids["a"]][run] == f"seeds 0, 1 of {ids['a']}", rows[ids["a"]]
        curve = runs.RUNS_COLUMNS.index("curve")
        assert rows[ids["c"]][curve] == "no curve recorded" and rows[ids["a"]][curve] == "yes", rows
        # the picker starts with the newest runs of one base: all three; the one without a curve is named, not drawn
        page.wait_for_function("() => document.querySelectorAll('#runs-pick .token').length === 3", timeout=30_000)
        page.wait_for_function("c => { const p = document.querySelector('#runs-curves .js-plotly-plot'); "
                               "return p && p.layout && p.layout.title.text.includes('no curve recorded for ' + c); }",
                               arg=ids["c"], timeout=30_000)
        page.locator("#runs-pick .token", has_text=ids["c"]).locator(".token-remove").click()
        page.wait_for_function("() => document.querySelectorAll('#runs-pick .token').length === 2", timeout=10_000)
        page.wait_for_function("() => { const p = document.querySelector('#runs-curves .js-plotly-plot'); "
                               "return p && p.layout && !p.layout.title.text.includes('no curve'); }", timeout=30_000)
        traces = sorted(_traces(page))
        # loss and batch accuracy of each run, its own steps (seed 1's loss starts one higher)
        assert traces == [[ids["a"], 6, 0.54], [ids["a"], 6, 0.95], [ids["b"], 6, 0.54], [ids["b"], 6, 1.95]], traces
        page.wait_for_function("() => document.querySelector('#runs-diff').innerText.includes('learn.seed')",
                               timeout=30_000)
        diff = {r[0]: r[1:] for r in bu.table_rows(page, "runs-diff") if r}
        picked = [t.strip() for t in page.locator("#runs-pick .token").all_inner_texts()]
        a_first = ids["a"] in picked[0]
        assert diff["learn.seed"] == (["0", "1"] if a_first else ["1", "0"]), diff
        assert diff["request.seed"] == diff["learn.seed"] and len(diff) == 2, diff
        assert "differ in 2 setting(s)" in bu.text(page, "#runs-diff-note"), bu.text(page, "#runs-diff-note")
        assert not errors, errors
    except Exception:
        bu.save_artifacts(page, request.node.name, ARTIFACTS, srv)
        raise


def test_a_tag_added_appears_in_the_table_and_markup_stays_text(runs_page, request):
    page, ids, errors, srv = runs_page
    try:
        bu.open_tab(page, "regions")
        bu.choose(page, "regions-select", f"[{ids['b']}]")
        # the region shown (its metadata, tags and note) before the boxes are typed into
        page.wait_for_function("() => document.querySelector('#regions-meta').innerText.includes('seed=1')",
                               timeout=30_000)
        page.fill("#region-tags input", "<b>bold</b>")
        page.click("#region-note-save")
        page.wait_for_function("() => document.querySelector('#region-note-status').innerText.includes("
                               "'holds characters a tag cannot')", timeout=30_000)
        assert "Traceback" not in page.inner_text("body")
        assert page.evaluate("() => document.querySelectorAll('#region-note-status b, #status-message b').length") == 0
        page.fill("#region-tags input", "baseline, long run")
        page.fill("#region-note textarea", HOSTILE_NOTE)
        page.click("#region-note-save")
        page.wait_for_function("() => document.querySelector('#region-note-status').innerText.includes('✓ Saved 2 tag')",
                               timeout=30_000)
        page.wait_for_function("() => document.querySelector('#runs-table').innerText.includes('baseline, long run')",
                               timeout=30_000)
        row = next(r for r in bu.table_rows(page, "runs-table") if r and r[0] == ids["b"])
        tags, note = runs.RUNS_COLUMNS.index("tags"), runs.RUNS_COLUMNS.index("note")
        assert row[tags] == "baseline, long run" and row[note] == HOSTILE_NOTE, row
        assert page.evaluate("() => document.querySelectorAll('#runs-table img, #runs-table b').length") == 0
        assert page.evaluate("() => window.__pwned === undefined")
        # the filter finds a run by its tag
        page.fill("#regions-filter textarea", "baseline")
        page.press("#regions-filter textarea", "Enter")
        page.wait_for_function(  # no row of run a (its id may still be read in b's run over seeds)
            "a => ![...document.querySelectorAll('#runs-table [role=row].virtual-row')].some(r => { "
            "const c = r.querySelector('[role=gridcell]'); return c && c.innerText.trim() === a; })", arg=ids["a"],
            timeout=30_000)
        assert [r[0] for r in bu.table_rows(page, "runs-table") if r] == [ids["b"]]
        assert not errors, errors
    except Exception:
        bu.save_artifacts(page, request.node.name, ARTIFACTS, srv)
        raise



CHOSEN = ["id", "method", "k (params)", "seed", "accuracy", "ECE ↓", "share of FT gain"]
RUNS_PART = ["runs-columns", "runs-table", "runs-csv-scope", "runs-csv-export", "runs-csv", "runs-scatter-x",
             "runs-scatter-y", "runs-scatter-colour", "runs-scatter", "runs-pick", "runs-links", "runs-side",
             "runs-curves", "runs-diff"]  # the elem_ids of the Regions tab's runs part
HEADERS = ("id => [...document.querySelectorAll('#' + id + ' thead th')].map(h => h.innerText.replace(/[⋮\\s]+$/, '')"
           ".trim()).filter(t => t)")
SCATTER = ("() => { const p = document.querySelector('#runs-scatter .js-plotly-plot'); return p && p.data ? "
           "p.data.flatMap(d => (d.customdata || []).map((c, i) => [c[0], d.x[i], d.y[i]])) : null; }")


def _choose_columns(page, chosen: list[str]) -> None:
    """Tick exactly ``chosen`` in the column chooser, one label at a time, as a person would."""
    box = page.locator("#runs-columns")
    for label in runs.column_labels():
        check = box.get_by_label(label, exact=True)
        if check.is_checked() != (label in chosen):
            check.click()


def test_columns_chosen_a_csv_of_the_runs_picked_their_scatter_and_a_link_that_opens_a_run(runs_page, browser,  # noqa: F811
                                                                                         tmp_path, request):
    """At 1280 px, then the same page at a phone's 390 px: the runs part stays in the window, its cells whole."""
    _, ids, _, srv = runs_page
    context = browser.new_context(viewport={"width": 1280, "height": 844}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    try:
        bu.wait_usable(page, srv.url, timeout_s=90)
        bu.open_tab(page, "regions")
        page.wait_for_function("() => document.querySelectorAll('#runs-pick .token').length === 3", timeout=30_000)
        _choose_columns(page, CHOSEN)
        page.wait_for_function(f"([id, want]) => {{ const got = ({HEADERS})(id); "
                               "return got.length === want.length && got.every((h, i) => h === want[i]); }",
                               arg=["runs-table", CHOSEN], timeout=30_000)
        rows = {r[0]: r for r in bu.table_rows(page, "runs-table") if r}
        assert rows[ids["b"]] == [ids["b"], "learned", "20", "1", "81.2%", "0.250", "75.0%"], rows
        assert rows[ids["c"]][4:] == ["", "", ""], rows  # never scored
        # the scatter: accuracy against k, one point per scored run shown (c has no accuracy: counted, not drawn)
        page.wait_for_function(f"() => {{ const d = ({SCATTER})(); return d && d.length === 2; }}", timeout=30_000)
        assert sorted(page.evaluate(SCATTER)) == [[ids["a"], 20, 0.7], [ids["b"], 20, 0.8125]]
        # the runs picked, side by side, then as CSV: a and b, the file's numbers as the score log holds them
        page.locator("#runs-pick .token", has_text=ids["c"]).locator(".token-remove").click()
        page.wait_for_function("() => document.querySelectorAll('#runs-pick .token').length === 2", timeout=10_000)
        page.wait_for_function(f"id => ({HEADERS})(id).length === 3", arg="runs-side", timeout=30_000)
        side = {r[0]: r[1:] for r in bu.table_rows(page, "runs-side") if r}
        assert sorted(side["accuracy"]) == ["70.0%", "81.2%"] and "id" not in side, side
        page.locator("#runs-csv-scope").get_by_label("the runs picked", exact=True).check()
        path = bu.download_made_file(page, "#runs-csv-export", "runs-csv", tmp_path)
        assert path.name.startswith("graftui-runs-") and path.suffix == ".csv", path
        frame = pd.read_csv(path).sort_values("id")
        assert list(frame.columns) == ["id", "method", "k", "seed", "accuracy", "ece", "share_of_ft"], frame
        assert frame["id"].tolist() == [ids["a"], ids["b"]], frame
        for key, (_, row) in zip("ab", frame.iterrows()):
            assert (row["accuracy"], row["ece"], row["share_of_ft"]) == tuple(SCORES[key][m] for m in (
                "accuracy", "ece", "share_of_ft")), row
            assert row["k"] == 20 and row["method"] == "learned"
        # each run picked has its link; opened, it picks that run alone, draws its curve, selects its region
        hrefs = page.eval_on_selector_all("#runs-links a", "links => links.map(a => a.getAttribute('href'))")
        assert sorted(hrefs) == [f"?run={ids['a']}", f"?run={ids['b']}"], hrefs
        bu.fits_phone(page, RUNS_PART)  # a phone: the runs part stays in the window, the table's cells whole
        fit = bu.table_fit(page, "runs-table")
        assert fit["cut"] == [] and fit["rows"] == 3, fit
        assert not errors, errors
        page = context.new_page()  # the link opened in a tab of its own
        page.on("pageerror", lambda err: errors.append(str(err)))
        bu.wait_usable(page, f"{srv.url}?run={ids['b']}", timeout_s=90)
        page.wait_for_selector("#tab-regions", state="visible", timeout=30_000)
        page.wait_for_function("b => { const t = [...document.querySelectorAll('#runs-pick .token')]; "
                               "return t.length === 1 && t[0].innerText.includes(b); }", arg=ids["b"], timeout=30_000)
        page.wait_for_function("b => document.querySelector('#regions-select input').value.includes(b)", arg=ids["b"],
                               timeout=30_000)
        page.wait_for_function("b => { const p = document.querySelector('#runs-curves .js-plotly-plot'); "
                               "return p && p.data && p.data.length === 2 && p.data.every(d => d.name === b); }",
                               arg=ids["b"], timeout=30_000)
        assert f"Opened run {ids['b']}" in bu.text(page, "#status-message")
        # a link naming no run of this page: one line, nothing from it picked, no markup run
        page = context.new_page()
        page.on("pageerror", lambda err: errors.append(str(err)))
        bu.wait_usable(page, f"{srv.url}?run=%3Cimg%20src%3Dx%20onerror%3D%22window.__pwned%3D1%22%3E", timeout_s=90)
        page.wait_for_function("() => document.querySelector('#status-message').innerText.includes('names no run')",
                               timeout=30_000)
        said = [t for t in bu.text(page, "#status-message").splitlines() if "names no run" in t]
        assert len(said) == 1 and said[0].endswith("nothing was picked"), said  # one line
        assert "Traceback" not in page.inner_text("body")
        assert page.evaluate("() => window.__pwned === undefined && !document.querySelector('#status-message img')")
        assert not errors, errors
    except Exception:
        bu.save_artifacts(page, request.node.name, ARTIFACTS, srv)
        raise
    finally:
        context.close()
