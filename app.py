"""Start the graftui web app: ``python app.py [--host 127.0.0.1] [--port 7860] [--share]``.

Models are loaded only when a job needs them, so the page is served within seconds.
Files live under ``$GRAFTUI_HOME`` (default ``~/.graftui``); ``GRAFTUI_HOSTED=1`` turns on the
restrictions of a public deployment and ``GRAFTUI_FAST=1`` lowers the defaults for quick tests.
"""

from __future__ import annotations

import argparse
import logging
import os

# Idle OpenMP workers sleep instead of spinning: the server's own threads (and a browser on the
# same machine) need the cores between steps. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="graftui web app: skill localization by grafting")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--share", action="store_true", help="also open a public Gradio share link")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from graftui.ui.app import launch

    launch(host=args.host, port=args.port, share=args.share)


if __name__ == "__main__":
    main()
