"""The pickers of the page in headless Chromium, at 800 and 390 px (``-k pickers``): a region a job writes is picked at
once on Anatomy, Compare and WiSE; typing part of a label into a region picker narrows its choices; the Show job
picker and its panel name the same job after a switch, and a finished run over seeds is told as finished.

The server's home is made before it starts, in seconds, as the app writes it: regions of a tiny pair (one per seed of
a run over seeds, two files of one region), two finished localize jobs (one over seeds) and the default fine-tuned
checkpoint marked built, so the page fine-tunes nothing: no test here needs a model. A region written while the page
is open is written as a localization saves it, into the regions folder the page lists.
"""

from __future__ import annotations

import re

import pytest

import browser_util as bu
from test_browser import ARTIFACTS, browser  # noqa: F401 - the module's Chromium fixture

pytestmark = pytest.mark.browser
WIDTHS = {"800": {"width": 800, "height": 900}, "390": {"width": 390, "height": 844}}
STATE: dict = {}


def _region(pair, name, start: int, seed: int, k: int = 20, created: str = "2024-01-01T10:00:00Z"):
    import torch

    from graftui import regions

    learn = {"steps": 6, "lr": 0.02, "seed": seed}
    record = regions.make_record(pair, {name: torch.arange(start, start + k)}, {
        "method": "learned", "task": "movies", "sparsity": 0.01, "budget": "sparsity=0.01", "learn": learn,
        "train_examples": 16, "request": {"verb": "localize", "task": "movies", "method": "learned", "seed": seed}})
    record.meta.created = created
    return record


def _make_home(home) -> dict:
    """Regions and job records written as the app writes them, into ``home``."""
    from graftui import regions
    from graftui.jobs import JobRunner

    with bu.model_free_home(home) as (pair, name):
        for seed in (0, 1, 2):  # a run over seeds: one region per seed
            regions.save(_region(pair, name, 40 * seed, seed, created=f"2024-01-01T10:00:0{seed}Z"),
                         home / "regions" / f"movies-seed{seed}-20240101-10000{seed}.safetensors")
        for n in (5, 6):  # two files of one region
            regions.save(_region(pair, name, 0, 0, created="2024-01-01T10:00:00Z"),
                         home / "regions" / f"movies-twin-20240101-10000{n}.safetensors")
        runner = JobRunner(home / "jobs")
        jobs = {}
        for key, title, params in (("seeds", "Localize 'movies' · seeds 0, 1, 2", {"verb": "localize", "seeds": [0, 1, 2]}),
                                   ("one", "Localize 'movies' · sparsity 1e-2", {"verb": "localize"})):
            job = runner.submit("localize", title, lambda ctx: {"region": "movies-seed0-20240101-100000"}, params)
            assert runner.wait(job.id, 30).status == "done"  # and its record is written
            jobs[key] = job.id
    return {"pair": pair, "name": name, "jobs": jobs}


@pytest.fixture(scope="module")
def pickers_page(browser, tmp_path_factory):  # noqa: F811
    home = tmp_path_factory.mktemp("graftui-pickers-home")
    made = _make_home(home)
    srv = bu.started(home, "pickers-server", fast=True)
    context = browser.new_context(viewport=WIDTHS["800"])
    page = context.new_page()
    STATE.update(page=page, server=srv)
    try:
        bu.wait_usable(page, srv.url, timeout_s=90)
        yield page, home, made
    finally:
        context.close()
        srv.stop()


@pytest.fixture(autouse=True)
def _artifacts_on_failure(request):
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before and "page" in STATE:
        bu.save_artifacts(STATE.get("page"), request.node.name, ARTIFACTS, STATE.get("server"))


def _shows(page, elem_id: str) -> str:
    """What a picker shows: a single picker's text, or a multiselect's tokens joined."""
    return page.evaluate("""(id) => { const el = document.getElementById(id); if (!el) return '';
        const tokens = [...el.querySelectorAll('.token')].map(t => t.innerText.trim());
        return tokens.length ? tokens.join(' | ') : (el.querySelector('input') || {}).value || ''; }""", elem_id)


@pytest.mark.parametrize("width", list(WIDTHS))
def test_a_region_a_job_writes_is_picked_on_anatomy_compare_and_wise(pickers_page, width):
    from graftui import regions

    page, home, made = pickers_page
    page.set_viewport_size(WIDTHS[width])
    seed = 7 if width == "800" else 8
    bu.open_tab(page, "anatomy")
    page.wait_for_function("() => document.querySelector('#anatomy-region input').value.length > 0", timeout=30_000)
    before = _shows(page, "anatomy-region")
    assert f"seed {seed}" not in before
    regions.save(_region(made["pair"], made["name"], 200 + 20 * seed, seed, k=20 + seed),
                 home / "regions" / f"movies-seed{seed}-20240101-11000{seed}.safetensors")  # as a localization saves it
    want = f"k={20 + seed} · 6 steps · 16 examples · lr 0.02 · seed {seed}"
    page.wait_for_function("([id, w]) => document.querySelector('#' + id + ' input').value.includes(w)",
                           arg=["anatomy-region", want], timeout=30_000)
    for tab, picker in (("compare", "compare-regions"), ("lab", "lab-wise-region"), ("regions", "regions-select")):
        bu.open_tab(page, tab)
        shown = _shows(page, picker)
        assert want in shown and "seed 0" not in shown, (picker, shown)  # picked, in place of the region before


@pytest.mark.parametrize("width", list(WIDTHS))
def test_typing_part_of_a_label_narrows_a_region_picker(pickers_page, width):
    page, _, _ = pickers_page
    page.set_viewport_size(WIDTHS[width])
    bu.open_tab(page, "anatomy")
    box = "#anatomy-region input"
    page.click(box)
    every = page.locator("ul[role=listbox] li")
    every.first.wait_for(state="visible", timeout=10_000)
    total = every.count()
    labels = every.all_inner_texts()
    assert total >= 5 and len(set(labels)) == total, labels  # every label its own
    assert not any("/" in label for label in labels), labels  # no folder
    assert sum("· saved 2024-01-01" in label for label in labels) == 3, labels  # one region in three files: when saved
    page.keyboard.type("seed 1")  # the picker's text is selected on focus: what is typed replaces it
    page.wait_for_function("() => document.querySelectorAll('ul[role=listbox] li').length === 1", timeout=10_000)
    assert "seed 1" in every.first.inner_text()
    page.keyboard.press("Escape")
    page.click("#tab-anatomy-button")  # away from the box, whose typed words are no region


@pytest.mark.parametrize("width", list(WIDTHS))
def test_the_show_job_picker_and_its_panel_name_the_same_job(pickers_page, width):
    page, _, made = pickers_page
    page.set_viewport_size(WIDTHS[width])
    bu.open_tab(page, "localize")
    for key in ("seeds", "one", "seeds"):
        job = made["jobs"][key]
        bu.choose(page, "localize-job", f"[{job}]")
        page.wait_for_function("id => document.querySelector('#localize-status').innerText.includes('[' + id + ']')",
                               arg=job, timeout=30_000)
        page.wait_for_timeout(2500)  # a poll's tick later, the picker and the panel still agree
        picked = page.input_value("#localize-job input")
        line = bu.text(page, "#localize-status")
        assert f"[{job}]" in picked and bu.tab_job(page, "#localize-status") == job, (picked, line)
        assert "· done" in line and "queued" not in line and "starts in" not in line, line
        assert not re.search(r"\[(?!%s)\d{8}-\d{6}-[0-9a-f]{6}\]" % job, line), line  # no other job named


def test_the_saved_regions_table_fits_an_800_px_window(pickers_page):
    """At 800 px the saved regions table shows all it shows without a sideways scroll and cuts off no cell: it leaves
    out five columns the region's metadata also shows (``style.NARROW_HIDDEN``)."""
    page, _, _ = pickers_page
    page.set_viewport_size(WIDTHS["800"])
    bu.open_tab(page, "regions")
    page.wait_for_function("() => document.querySelectorAll('#regions-table [role=row].virtual-row').length >= 5",
                           timeout=30_000)
    page.wait_for_timeout(500)
    fit = bu.table_fit(page, "regions-table")
    shown = [h for h, _ in fit["headers"] if h]
    assert not fit["cut"] and fit["width"] <= fit["shown"] + 1, (fit["cut"], fit["width"], fit["shown"], fit["headers"])
    assert {"id", "fine-tuned model", "task", "k (params)", "seed", "accuracy"} <= set(shown), shown
