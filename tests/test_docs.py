"""The manual builds, and the README stays a front page.

docs/ is an MkDocs site (mkdocs.yml at the repository root); a strict build fails on a broken link, an
image that is not there, a missing anchor or a page left out of the navigation. The README keeps the
two commands that set up and run the app and the test suite, and points to the manual.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
TWO_COMMANDS = ("    scripts/run.sh\n", "    scripts/test.sh\n")


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_the_manual_builds_strictly_with_every_page(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(pages()) >= 10
    for page in pages():
        built = site / "index.html" if page.stem == "index" else site / page.stem / "index.html"
        assert built.is_file(), f"{page.name} was not built"
        title = page.read_text().splitlines()[0].removeprefix("# ")
        assert title in built.read_text(), f"{page.name}: its title is not on the built page"
    for image in re.findall(r"\]\(\.\./assets/([^)]+)\)", "".join(p.read_text() for p in pages())):
        assert (site / "assets" / image).is_file(), image


def test_the_readme_is_a_front_page_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    for command in TWO_COMMANDS:
        assert command in text, command
    assert "Run the app on the offline default" in text and "Set up and run the whole test suite" in text
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", text))
    assert linked == {page.name for page in pages()}, "the README links every page of the manual"
    for image in re.findall(r"\]\((assets/[^)]+)\)", text):
        assert (ROOT / image).is_file(), image


def test_the_python_api_example_lives_in_the_manual():
    assert "```python\nimport graftui\n" in (DOCS / "api.md").read_text()
