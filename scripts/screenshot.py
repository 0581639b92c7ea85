"""Take the README screenshot: start the app, run one localization, save ``assets/screenshot.png``.

Usage::

    .venv/bin/python scripts/screenshot.py                    # small-data mode, a temporary GRAFTUI_HOME
    .venv/bin/python scripts/screenshot.py --home ~/.graftui  # reuse a home (its default fine-tune, if built)
    .venv/bin/python scripts/screenshot.py --full --tab localize
    .venv/bin/python scripts/screenshot.py --tab compare --width 1400 --height 1000 --out assets/compare.png

Needs Debian's Chromium (``apt-get install -y chromium``) and the dev requirements (Playwright).
The first run in a fresh home also builds the default fine-tuned model (about a minute in
small-data mode on a 2-core CPU). The PNG is re-compressed, and reduced to a 256-colour palette if it is still large.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args(argv)

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
                bu.open_tab(page, "localize")
                page.click("#localize-run")
                line = wait_done(page, "#localize-status", args.timeout)
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
                if target:
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
