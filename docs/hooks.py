"""Serve the repository's assets/ images with the docs.

The pages link to images as ``../assets/NAME.png``, which is where they are in the repository (so the
links also work when the Markdown is read in place). This hook adds those images to the site as
``assets/NAME.png`` and points the links there, so ``mkdocs build --strict`` finds every one and the
built site is self-contained.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ASSETS = Path(__file__).resolve().parents[1] / "assets"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg"}


def on_files(files, config):
    for image in sorted(ASSETS.iterdir()):
        if image.suffix.lower() in IMAGE_SUFFIXES:
            files.append(File(f"assets/{image.name}", src_dir=str(ASSETS.parent),
                              dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    return markdown.replace("](../assets/", "](assets/")
