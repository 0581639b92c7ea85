"""The Gradio web app: ``graftui.ui.app.build_app()`` wires widgets to the library's flows (``python app.py`` serves it)."""
