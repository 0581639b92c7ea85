"""Take the screenshot of the README and the manual: start the app, run one localization, save ``assets/screenshot.png``.

Usage::

    .venv/bin/python scripts/screenshot.py                    # small-data mode, a temporary GRAFTUI_HOME
    .venv/bin/python scripts/screenshot.py --home ~/.graftui  # reuse a home (its default fine-tune, if built)
    .venv/bin/python scripts/screenshot.py --full --tab localize
    .venv/bin/python scripts/screenshot.py --full --tab localize --top --height 1500 --home HOME   # the home picture
    .venv/bin/python scripts/screenshot.py --tab compare --width 1400 --height 1000 --out assets/compare.png
    .venv/bin/python scripts/screenshot.py --set --home ~/.graftui   # the set of tab screenshots, full defaults

``--set`` runs, in one app session on the offline default pair with the full defaults: a localization, a
comparison of its region on 200 test examples (with the baselines, and a small uploaded CSV as one more
out-of-distribution task), WiSE and a short re-training in the Laboratory, the ablation on the Anatomy tab, and
then saves ``assets/shot-<section>-1400.png`` (1400×1000) and ``assets/shot-<section>-800.png`` (800×900) for
compare, wise, retrain, anatomy and regions, each cropped to its section of the tab. It prints how every table
of those sections fits at each width (cells cut off, numbers split over two lines, a sideways scroll).

Needs Debian's Chromium (``apt-get install -y chromium``) and the dev requirements (Playwright).
The first run in a fresh home also builds the default fine-tuned model (about a minute in
small-data mode on a 2-core CPU). The PNG is re-compressed, and reduced to a 256-colour palette if it is still large.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import browser_util as bu  # noqa: E402


def optimise_png(raw: bytes, out: Path, limit: int = 200_000) -> int:
    """Write ``raw`` (a PNG) re-compressed, as a 256-colour palette PNG when the full-colour one
    is over ``limit`` bytes; returns the size in bytes."""
    from PIL import Image

    img = Image.open(io.BytesIO(raw)).convert("RGB")
    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out, format="PNG", optimize=True)
    if out.stat().st_size > limit:
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, format="PNG", optimize=True)
    return out.stat().st_size


def wait_done(page, status: str, timeout_s: float) -> str:
    t0 = time.monotonic()
    line = ""
    while time.monotonic() - t0 < timeout_s:
        line = bu.text(page, status)
        if "· done" in line or "failed" in line:
            return line
        time.sleep(1)
    raise SystemExit(f"no finished job in {status} after {timeout_s:.0f} s: {line!r}")


SET_N = 200  # test examples of every job of --set
SET_WIDTHS = ((1400, 1000), (800, 900))
SET_MAX_HEIGHT = 3000  # px of a crop: a long table is cut there (the PNG stays under about 200 KB)
# each shot: (file stem, tab, first element, last element, tables to measure); the crop runs from the top of the
# first element's row to the bottom of the last element (at most SET_MAX_HEIGHT), the width of the tab's panel
SET_SHOTS = (
    ("compare", "compare", "#compare-regions", "#compare-table", ("compare-table", "compare-differences")),
    ("wise", "lab", "#lab-wise-region", "#lab-wise-table", ("lab-wise-table",)),
    ("retrain", "lab", "#lab-retrain-region", "#lab-retrain-reliability", ("lab-retrain-table",)),
    ("anatomy", "anatomy", "#anatomy-tensors", "#anatomy-ablation", ("anatomy-tensors", "anatomy-neurons",
                                                                     "anatomy-ablation")),
    ("regions", "regions", "#regions-filter", "#regions-frontiers-note", ("regions-table",)),
)
UPLOAD_NAME = "reviews-sample.csv"

CROP = r"""([first, last, panel]) => {
  const top = document.querySelector(first), bottom = document.querySelector(last), box = document.querySelector(panel);
  const row = top.closest('.row') || top, r = box.getBoundingClientRect();
  const y0 = Math.min(row.getBoundingClientRect().top, top.getBoundingClientRect().top) + window.scrollY - 10;
  const y1 = bottom.getBoundingClientRect().bottom + window.scrollY + 10;
  return {x: Math.max(0, r.left + window.scrollX - 6), y: Math.max(0, y0), width: r.width + 12, height: y1 - Math.max(0, y0)};
}"""


WIDE_PLOTS = r"""(panel) => [...document.querySelectorAll(panel + ' .js-plotly-plot')]
  .filter(p => p.offsetParent && p.querySelector('.main-svg'))
  .filter(p => p.querySelector('.main-svg').getBoundingClientRect().width > p.parentElement.getBoundingClientRect().width + 2)
  .map(p => (p.closest('[id]') || p).id + ' ' + Math.round(p.querySelector('.main-svg').getBoundingClientRect().width)
            + '>' + Math.round(p.parentElement.getBoundingClientRect().width))"""


def run_in_set(page, prefix: str, fields: dict[str, str], timeout_s: float, button: str | None = None) -> str:
    """Fill ``fields``, press ``#prefix-run`` (or ``button``) and wait for that job to be shown finished."""
    for selector, value in fields.items():
        page.fill(selector, value)
        page.press(selector, "Tab")
    line, took = bu.run_job(page, button or f"#{prefix}-run", f"#{prefix}-status", f"{prefix}-job", timeout_s=timeout_s)
    line = re.sub(r"\*\*", "", line.strip())
    print(f"{prefix}: {took:.0f} s · {line}")
    if "· done" not in line:
        raise SystemExit(f"{prefix} did not finish: {line}")
    return line


def pick_region(page, elem_id: str, region_id: str) -> None:
    """Show ``region_id`` in the single-region picker ``#elem_id`` (the pickers may already show it)."""
    if region_id not in page.input_value(f"#{elem_id} input"):
        bu.choose(page, elem_id, region_id)
    page.wait_for_function("([e, id]) => document.querySelector('#' + e + ' input').value.includes(id)",
                           arg=[elem_id, region_id], timeout=30_000)


def wait_rows(page, elem_id: str, n: int = 1, timeout_s: float = 60) -> None:
    page.wait_for_function("([e, n]) => document.querySelectorAll('#' + e + ' [role=row].virtual-row').length >= n",
                           arg=[elem_id, n], timeout=timeout_s * 1000)


def wait_plot(page, elem_id: str, timeout_s: float = 60) -> None:
    page.wait_for_function("e => { const p = document.querySelector('#' + e + ' .js-plotly-plot'); "
                           "return p && p.data && p.data.length >= 1 && document.querySelector('#' + e + ' .main-svg'); }",
                           arg=elem_id, timeout=timeout_s * 1000)


def upload_ood(page) -> None:
    """Upload a small CSV (60 held-out Amazon snippets) on the Models tab and add it to the OOD tasks; the task
    stays movies."""
    from graftui.tasks.classification.data import load_task

    test = load_task("amazon").splits["test"]
    words = {0: "negative", 1: "positive"}
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["text", "label"])
    writer.writerows((t, words[int(y)]) for t, y in zip(test.texts[100:160], test.labels[100:160]))
    bu.open_tab(page, "models")
    page.click("text=Upload a dataset")
    page.set_input_files("#models-data-upload input[type=file]",
                         files=[{"name": UPLOAD_NAME, "mimeType": "text/csv", "buffer": buf.getvalue().encode()}])
    page.wait_for_function("n => document.querySelector('#models-data-info').innerText.includes(n)", arg=UPLOAD_NAME,
                           timeout=60_000)
    bu.choose(page, "models-task", "movies:")  # the upload became the task; back to movies, the file stays listed
    page.click("#models-ood input")
    page.keyboard.type("reviews-sample")
    option = page.locator("ul[role=listbox] li", has_text=UPLOAD_NAME).first
    option.wait_for(state="visible", timeout=30_000)
    option.click()
    page.keyboard.press("Escape")
    page.wait_for_function("n => document.querySelector('#models-ood-info').innerText.includes(n)", arg=UPLOAD_NAME,
                           timeout=30_000)
    print("models: OOD tasks", bu.text(page, "#models-ood").replace("\n", " "), "·",
          bu.text(page, "#models-ood-info").strip().replace("\n", " "))


def run_set(page, timeout_s: float) -> None:
    """Every job behind the set of screenshots, in one session: upload, localize, compare, WiSE, re-train, ablation."""
    upload_ood(page)
    bu.open_tab(page, "regions")
    time.sleep(2)  # the table is filled when the tab opens
    before = {r[0] for r in bu.table_rows(page, "regions-table") if r}
    bu.open_tab(page, "localize")
    run_in_set(page, "localize", {}, timeout_s)
    bu.open_tab(page, "regions")  # the new region's id: the one row the table did not list before
    page.wait_for_function("n => document.querySelectorAll('#regions-table [role=row].virtual-row').length > n",
                           arg=len(before), timeout=60_000)
    region = next(r[0] for r in bu.table_rows(page, "regions-table") if r and r[0] not in before)
    bu.open_tab(page, "compare")
    page.wait_for_function("() => document.querySelector('#compare-regions').innerText.includes('k=')", timeout=30_000)
    if region not in bu.text(page, "#compare-regions"):
        bu.choose(page, "compare-regions", region)
    print(f"region: {region}")
    run_in_set(page, "compare", {"#compare-n input": str(SET_N)}, timeout_s)
    wait_rows(page, "compare-table", 4)
    bu.open_tab(page, "lab")
    pick_region(page, "lab-wise-region", region)
    run_in_set(page, "lab-wise", {"#lab-wise-n input": str(SET_N)}, timeout_s)
    wait_plot(page, "lab-wise-plot")
    pick_region(page, "lab-retrain-region", region)
    run_in_set(page, "lab-retrain", {"#lab-retrain-epochs input": "1", "#lab-retrain-train input": "500",
                                     "#lab-retrain-n input": str(SET_N)}, timeout_s)
    wait_rows(page, "lab-retrain-table", 4)
    bu.open_tab(page, "anatomy")
    pick_region(page, "anatomy-region", region)
    page.wait_for_function("id => document.querySelector('#anatomy-summary').innerText.includes(id)", arg=region,
                           timeout=60_000)
    wait_rows(page, "anatomy-tensors")
    wait_rows(page, "anatomy-neurons")
    run_in_set(page, "anatomy-ablate", {"#anatomy-ablate-n input": str(SET_N)}, timeout_s)
    wait_plot(page, "anatomy-ablation-plot")
    wait_rows(page, "anatomy-ablation", 2)
    bu.open_tab(page, "regions")
    wait_rows(page, "regions-table")
    wait_plot(page, "regions-frontiers")


def shoot_set(page, out_dir: Path) -> list[tuple[Path, int]]:
    """The set's crops at each width, and how their tables fit; returns (file, bytes) of each PNG written."""
    from PIL import Image

    written = []
    for width, height in SET_WIDTHS:
        page.set_viewport_size({"width": width, "height": height})
        for stem, tab, first, last, tables in SET_SHOTS:
            bu.open_tab(page, tab)
            page.mouse.move(0, 0)  # no hover labels
            page.evaluate("s => document.querySelector(s).scrollIntoView({block: 'start'})", first)
            time.sleep(2)  # plotly and the tables re-measure after a resize or a new tab
            wide = page.evaluate(WIDE_PLOTS, f"#tab-{tab}")
            if wide:  # a plot drawn while its tab was hidden keeps the width it had then
                print(f"  {width}px {tab}: plots wider than their box after the resize: {wide}; refitting")
                page.evaluate("() => window.dispatchEvent(new Event('resize'))")
                time.sleep(1.5)
            for elem_id in tables:
                fit = bu.table_fit(page, elem_id)
                hidden = [h for h, right in fit["headers"] if right > fit["shown"] + 1]
                print(f"  {width}px {elem_id}: {fit['rows']} rows, width {fit['width']} in {fit['shown']}"
                      f"{' (scrolls)' if fit['scrolls'] and fit['width'] > fit['shown'] else ''}; cut {fit['cut'] or '-'};"
                      f" split numbers {fit['wrapped'] or '-'}; headers past the edge {hidden or '-'}")
            box = page.evaluate(CROP, [first, last, f"#tab-{tab}"])
            full = Image.open(io.BytesIO(page.screenshot(full_page=True)))
            crop = full.crop((int(box["x"]), int(box["y"]), int(min(full.width, box["x"] + box["width"])),
                              int(min(full.height, box["y"] + min(box["height"], SET_MAX_HEIGHT)))))
            buf = io.BytesIO()
            crop.save(buf, format="PNG")
            path = out_dir / f"shot-{stem}-{width}.png"
            size = optimise_png(buf.getvalue(), path)
            print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
                  f"({crop.width}×{crop.height}, {size / 1024:.0f} KB)")
            written.append((path, size))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="GRAFTUI_HOME to use (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=REPO / "assets" / "screenshot.png")
    parser.add_argument("--full", action="store_true", help="the full defaults instead of small-data mode (GRAFTUI_FAST)")
    parser.add_argument("--tab", choices=["anatomy", "localize", "compare"], default="anatomy",
                        help="anatomy: the page from the top with the region's heatmap (default); localize: the live "
                             "mask-learning plot; compare: the region evaluated, its result card and the Compare table")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=840)
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the localization (default 900)")
    parser.add_argument("--top", action="store_true",
                        help="the page from its top (title, tabs, the form and the result below it), as the home "
                             "picture shows it, instead of scrolled to the tab's result")
    parser.add_argument("--set", action="store_true",
                        help="run localize, compare, WiSE, re-training and the ablation with the full defaults, then save "
                             "assets/shot-<section>-{1400,800}.png for compare, wise, retrain, anatomy and regions "
                             "(--tab, --width, --height and --out are not used)")
    args = parser.parse_args(argv)
    if args.set:
        args.full = True

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="graftui-shot-") as tmp:
        home = args.home.expanduser() if args.home else Path(tmp) / "home"
        server = bu.AppServer(home=home, log_path=Path(tmp) / "app.log", fast=not args.full)
        try:
            server.start(timeout=180)
            print(f"app answering on {server.url} after {server.http_ready_s:.1f} s")
            with sync_playwright() as pw:
                browser = bu.launch_browser(pw)
                page = browser.new_page(viewport={"width": args.width, "height": args.height})
                bu.wait_usable(page, server.url, timeout_s=90)
                print(f"page usable after {server.since_start():.1f} s")
                if args.set:
                    t0 = time.monotonic()
                    run_set(page, args.timeout)
                    print(f"jobs done after {time.monotonic() - t0:.0f} s")
                    shoot_set(page, REPO / "assets")
                    print(f"status line: {bu.text(page, '#status-message').strip()}")
                    browser.close()
                    return
                bu.open_tab(page, "localize")
                # this job's own end, by its id: the panel may still show an earlier localization of the home, finished
                line, _ = bu.run_job(page, "#localize-run", "#localize-status", "localize-job", timeout_s=args.timeout)
                print(re.sub(r"\*\*", "", line.strip()))
                if "failed" in line:
                    raise SystemExit("the localization failed; see the status above")
                if args.tab == "compare":
                    bu.open_tab(page, "compare")
                    page.wait_for_function("() => document.querySelector('#compare-regions').innerText.includes('k=')",
                                           timeout=30_000)
                    page.click("#compare-run")
                    time.sleep(2)  # the status line follows the new job
                    line = wait_done(page, "#compare-status", args.timeout)
                    print(re.sub(r"\*\*", "", line.strip()))
                    page.wait_for_selector("#compare-table [role=row].virtual-row", timeout=30_000)
                    target = "#compare-status"
                elif args.tab == "anatomy":
                    bu.open_tab(page, "anatomy")
                    page.wait_for_selector("#anatomy-heatmap .heatmaplayer", timeout=30_000)
                    target = None  # the page from its top: title, tabs and the heatmap
                else:
                    page.wait_for_selector("#localize-plot .main-svg", timeout=30_000)
                    target = "#localize-status"
                page.mouse.move(0, 0)  # no hover labels
                if target and not args.top:
                    page.evaluate("t => document.querySelector(t).scrollIntoView({block: 'start'})", target)
                    page.evaluate("() => window.scrollBy(0, -12)")
                time.sleep(1.5)  # let plotly finish its transitions
                raw = page.screenshot(full_page=False)
                browser.close()
        except BaseException:
            print("server log (tail):\n" + server.log_tail(), file=sys.stderr)
            raise
        finally:
            server.stop()
    size = optimise_png(raw, args.out)
    print(f"wrote {args.out} ({args.width}×{args.height}, {size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
