"""The Gradio web app: ``build_app()`` in :mod:`graftui.ui.app` wires widgets to the library.

Nothing heavy is imported here, so ``import graftui.ui`` stays cheap.
"""

from __future__ import annotations


def build_app():
    from .app import build_app as _build

    return _build()
