"""The region library of a session: its listing and the Regions table, uploads adopted to a pair, the files a page
downloads."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import flows, hosted, settings
from ..hosted import check_upload, safe_name
from ..formatting import pct
from ..paths import atomic_write, short_ref
from ..regions import RegionRecord, check_fits, listing_row, load as load_region_file, save, settings_of
from . import store
from .forms import check_pair
from .tables import num_cell, pct_cell


def task_name(task) -> str:
    """A region's task as people read it: each task of a union by its name, an uploaded one by its file's name, never
    a folder ("movies+mydata.csv", not the upload's path)."""
    return "+".join(short_ref(t.strip()) for t in str(task or "").split("+")) if task else ""


REGION_LIST_COLUMNS = ["id", "task", "method", "k (params)", "share of graftable", "settings", "content id",
                       "fine-tuned model", "created (UTC)"]


def region_list_rows() -> pd.DataFrame:
    """The session's saved regions, newest first; a region whose content another also has says so."""
    rows, entries = [], store.list_regions()
    digests = [e.digest for e in entries]
    for e in entries:
        m = e.meta
        frac = m.fraction_of_graftable
        rows.append({
            "id": e.id,
            "task": task_name(m.task),
            "method": m.method or "",
            "k (params)": f"{m.k:,}" if m.k is not None else "",
            "share of graftable": f"{frac:.3%}" if isinstance(frac, (int, float)) else "",
            "settings": " · ".join(settings_of(m)),
            "content id": f"#{e.digest}" + (" (same as another)" if digests.count(e.digest) > 1 else ""),
            "fine-tuned model": short_ref(m.finetuned or ""),
            "created (UTC)": m.created or "",
        })
    return pd.DataFrame(rows, columns=REGION_LIST_COLUMNS)


# -- the regions table (Regions tab) ------------------------------------------------------------------
REGIONS_COLUMNS = ["id", "base", "fine-tuned model", "task", "method", "k (params)", "share of graftable", "steps", "seed",
                   "created (UTC)", "n", "accuracy", "ECE ↓", "share of FT gain"]


def regions_listing() -> list[dict]:
    """The session's saved regions as rows of the regions table (regions.listing_row), newest first, each with the
    scores of its latest evaluation."""
    scores = store.region_scores()
    return [listing_row(e.path, e.kind, e.meta, e.digest, scores.get(e.digest)) for e in store.list_regions()]


def regions_shown(rows: list[dict], words: str = "", sort: str | None = None, descending: bool = False) -> list[dict]:
    """The rows that hold every word typed in the filter, sorted by the column picked (none: newest first)."""
    return flows.regionfiles.select_regions(flows.regionfiles.with_words(rows, words), sort=sort or None,
                                            descending=bool(descending))


def regions_table(rows: list[dict]) -> pd.DataFrame:
    """Rows of the regions table as the page shows them: models and tasks by name, shares as percentages."""
    out = []
    for r in rows:
        out.append({
            "id": r["id"], "base": short_ref(r["base"] or ""), "fine-tuned model": short_ref(r["finetuned"] or ""),
            "task": task_name(r["task"]), "method": r["method"] or "",
            "k (params)": f"{r['k']:,}" if r["k"] is not None else "", "share of graftable": pct(r["share_of_graftable"], missing=""),
            "steps": "" if r["steps"] is None else str(r["steps"]), "seed": "" if r["seed"] is None else str(r["seed"]),
            "created (UTC)": (r["created"] or "").replace("T", " ")[:16],
            "n": "" if r.get("n") is None else f"{r['n']:,}", "accuracy": pct_cell(r["accuracy"]),
            "ECE ↓": num_cell(r["ece"]),
            "share of FT gain": pct_cell(r["share_of_ft"]),
        })
    return pd.DataFrame(out, columns=REGIONS_COLUMNS)


def read_region_upload(file) -> tuple[Path, RegionRecord]:
    """An uploaded region file, its format, metadata and every index validated."""
    path = check_upload(file, hosted.REGION_SUFFIXES)
    return path, load_region_file(path)


def adopt_region(file, base: str, finetuned: str) -> Path:
    """An uploaded region checked against the pair and saved among the session's regions, as a region of that
    pair (the pair it was made on is kept beside). A region without values takes the pair's fine-tuned values
    from now on, so it records the pair's build; a skill patch keeps the build its values came from."""
    path, record = read_region_upload(file)
    check_pair(base, finetuned)
    pair = flows.pair_for_regions(base, finetuned, [record], store.guard())
    check_fits(record, pair)
    meta = record.meta
    meta.original_base = meta.original_base or meta.base
    meta.original_finetuned = meta.original_finetuned or meta.finetuned
    meta.base, meta.finetuned, meta.uploaded_as = base, finetuned, path.name
    meta.base_sha256 = pair.hashes.get("base")
    if not record.is_patch:
        meta.finetuned_sha256 = pair.hashes.get("finetuned")
    meta.method = meta.method or "uploaded"
    return store.save_region(record, stem=f"uploaded-{safe_name(path.stem, 30)}")


def region_only_file(region_id: str):
    """A region file without values (indices only) next to the downloads; written once, its metadata as the page
    may see it (``store.public``)."""
    path = store.downloads_dir() / f"{region_id}-region.safetensors"
    if not path.exists():
        record = store.load_region(region_id)
        save(RegionRecord(record.indices, record.shapes, store.public(dict(record.meta))), path)
    return path


def region_file(region_id: str) -> Path:
    """A saved region or skill patch as a page downloads it: locally the file itself; hosted a copy next to the
    downloads whose metadata names no server path and no session (``store.public``), written once."""
    path = store.region_path(region_id)
    if not settings.hosted():
        return path
    copy = store.downloads_dir() / path.name
    if not copy.exists() or copy.stat().st_mtime < path.stat().st_mtime:
        record = store.load_region(region_id)
        record = RegionRecord(record.indices, record.shapes, store.public(dict(record.meta)), record.values, record.head)
        atomic_write(copy, lambda tmp: save(record, tmp))
    return copy


# -- the region pickers of every tab ------------------------------------------------------------------
PICKING_SECONDS = 30.0  # a picker picked by hand this recently is in the middle of picking: a new region leaves it


def default_pick(entries, several: bool) -> list[str]:
    """Region ids a picker starts with: the newest, or for composition up to three newest of its base."""
    if not entries:
        return []
    if not several:
        return [entries[0].id]
    base = entries[0].meta.base
    return [e.id for e in entries if e.meta.base == base][:3]


def next_pick(value, multiselect: bool, several: bool, entries, new_ids, picked_at: float | None = None,
              now: float = 0.0):
    """What a region picker holds once the saved regions are ``entries`` (newest first), ``new_ids`` of them written
    since the last listing.

    The rule: a region a job wrote (localize, seeds, sweep, union, retrain, upload) is picked at once in every picker,
    unless that picker was picked by hand in the last PICKING_SECONDS (``picked_at``): someone is in the middle of
    picking there, and the choice is theirs. A picker of one region takes the newest new one; a picker of several
    regions to put together (``several``: a union, curves to overlay) adds it to those picked of the same base model;
    one of several regions to compare replaces them with it (each compared region costs an evaluation). A region gone
    leaves every picker; an empty picker gets the newest region(s) (``default_pick``)."""
    listed = {e.id for e in entries}
    kept = [v for v in value or [] if v in listed] if multiselect else (value if value in listed else None)
    newest = next((e for e in entries if e.id in set(new_ids or ())), None)
    picking = picked_at is not None and now - picked_at < PICKING_SECONDS
    if newest is not None and not picking:
        if not multiselect:
            return newest.id
        if not several:
            return [newest.id]
        bases = {e.id: e.meta.base for e in entries}
        return [v for v in kept if bases.get(v) == newest.meta.base and v != newest.id] + [newest.id]
    fill = default_pick(entries, several)
    if not kept and fill:
        return fill if multiselect else fill[0]
    return kept
