"""The app's tabs and its jobs panel, one module each: ``build(page)`` makes the widgets and wires them."""
