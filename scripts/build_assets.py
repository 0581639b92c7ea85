#!/usr/bin/env python
"""Regenerate assets/vader_sentences.jsonl.gz from the vaderSentiment 3.3.2 sdist.

The sentiment tasks must work offline, so the VADER ground-truth sentences are
vendored in the repository. This script makes that copy reproducible: it fetches
the sdist from PyPI (or takes a local copy), checks its sha256, and writes every
sentence of the three sets (neutral ones included, so the label rule stays in
graftui/tasks/classification/data.py) to a gzip file whose bytes depend only on the input.

    python scripts/build_assets.py                 # download with pip, then build
    python scripts/build_assets.py --sdist X.tar.gz
    python scripts/build_assets.py --check         # verify the committed file
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "vaderSentiment"
VERSION = "3.3.2"
SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
INNER_TAR = f"{PACKAGE}-{VERSION}/additional_resources/hutto_ICWSM_2014.tar.gz"
# output set name -> ground-truth file stem inside the inner tar
SETS = {
    "movies": "movieReviewSnippets",
    "amazon": "amazonReviewSnippets",
    "tweets": "tweets",
}
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "assets" / "vader_sentences.jsonl.gz"


def download_sdist(dest: Path) -> Path:
    """Fetch the sdist through pip so the usual index configuration applies."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--dest", str(dest), f"{PACKAGE.lower()}=={VERSION}"],
        check=True,
    )
    found = sorted(dest.glob(f"{PACKAGE}-{VERSION}.tar.gz")) or sorted(dest.glob("*.tar.gz"))
    if not found:
        raise SystemExit(f"pip did not leave a {PACKAGE} sdist in {dest}")
    return found[0]


def verify(path: Path) -> bytes:
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"sha256 mismatch for {path}: got {digest}, expected {SHA256}")
    return data


def read_rows(sdist: bytes) -> list[dict]:
    """Parse `id<TAB>mean_rating<TAB>text` lines from the tar inside the sdist."""
    with tarfile.open(fileobj=io.BytesIO(sdist)) as outer:
        inner_bytes = outer.extractfile(INNER_TAR).read()
    rows: list[dict] = []
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        for set_name, stem in SETS.items():
            raw = inner.extractfile(f"hutto_ICWSM_2014/{stem}_GroundTruth.txt").read()
            # split on "\n" only: str.splitlines would also break on U+2028 and friends
            for line in raw.decode("utf-8").split("\n"):
                line = line.rstrip("\r")
                if not line.strip():
                    continue
                sid, rating, text = line.split("\t", 2)
                rows.append({"set": set_name, "id": sid, "rating": float(rating), "text": text})
    return rows


def encode(rows: list[dict]) -> bytes:
    """Gzip with mtime=0 and no file name, so equal rows give equal bytes."""
    body = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(body.encode("utf-8"))
    return buf.getvalue()


def summary(rows: list[dict]) -> str:
    parts = []
    for set_name in SETS:
        ratings = [r["rating"] for r in rows if r["set"] == set_name]
        pos = sum(x > 0.5 for x in ratings)
        neg = sum(x < -0.5 for x in ratings)
        parts.append(f"{set_name}: {len(ratings)} sentences ({pos} pos, {neg} neg)")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help=f"local {PACKAGE}-{VERSION}.tar.gz (default: pip download)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        sdist_path = args.sdist or download_sdist(Path(tmp))
        rows = read_rows(verify(sdist_path))
    blob = encode(rows)
    print(summary(rows))

    if args.check:
        same = args.out.is_file() and args.out.read_bytes() == blob
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from a fresh build'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(blob)
    print(f"wrote {args.out} ({len(blob):,} bytes, sha256 {hashlib.sha256(blob).hexdigest()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
