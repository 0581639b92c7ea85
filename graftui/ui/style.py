"""How the page looks: the CSS every table and narrow window needs, and which table columns hold numbers."""

from __future__ import annotations

from . import jobwords, library, runs, tables
from .tabs import anatomy, laboratory

TABLES = {  # each table's columns, by its elem_id: those in tables.NUMBER_COLUMNS are never wrapped
    "region-list": library.REGION_LIST_COLUMNS, "jobs-table": jobwords.JOB_COLUMNS, "models-counts": tables.COUNT_COLUMNS,
    "compare-table": tables.COMPARE_COLUMNS, "compare-differences": tables.DIFFERENCE_COLUMNS,
    "compare-disagreements": tables.DISAGREEMENT_COLUMNS, "lab-retrain-table": tables.COMPARE_COLUMNS,
    "sweep-table": tables.SWEEP_COLUMNS + [f"OOD {i} ↑" for i in range(8)],  # and a column per OOD task, up to 8
    "compose-table": tables.COMPOSE_COLUMNS, "compose-overlap-table": tables.OVERLAP_COLUMNS,
    "regions-table": library.REGIONS_COLUMNS,
    "anatomy-kinds": tables.WEIGHT_BIAS_COLUMNS, "anatomy-tensors": anatomy.TENSOR_COLUMNS,
    "anatomy-neurons": anatomy.NEURON_COLUMNS, "anatomy-ablation": anatomy.ABLATION_COLUMNS,
    "anatomy-stability": anatomy.STABILITY_COLUMNS, "lab-wise-table": tables.WISE_COLUMNS,
    "lab-union-table": laboratory.MULTITASK_COLUMNS, "lab-continual-table": laboratory.CONTINUAL_COLUMNS,
    "runs-table": runs.RUNS_COLUMNS, "runs-groups": runs.GROUP_COLUMNS,
    "localize-seeds-table": tables.SEEDS_COLUMNS,
}
CSS = """
/* A table's columns are as wide as its text needs when it is wrapped between words (never inside one), so a table
   fits the page where it can, scrolls sideways where it cannot, and no header or cell is cut off. Gradio puts its
   own scope (.gradio-container-N .contain) before every rule here. */
.table-wrap { overflow-x: auto !important; }
.table-wrap th, .table-wrap th *, .table-wrap [role=gridcell] span {
    white-space: normal !important; word-break: normal !important; overflow-wrap: normal !important;
    text-overflow: clip !important; hyphens: none; }
.table-wrap [role=gridcell] span { overflow-wrap: break-word !important; }  /* only a word wider than its column */
.table-wrap .sizing-body td { white-space: normal !important; }
.table-wrap .header-content { overflow: visible !important; min-width: min-content !important; }
/* A narrow window: the widgets of a row stack, each as wide as the page. */
@media (max-width: 900px) {
    .row > *:not(button), .row > .form > * { flex: 1 1 100% !important; min-width: 100% !important;
                                             margin-left: 0 !important; margin-right: 0 !important; }
}
/* ... but two plots that read together (Compare's reliability diagram and confidence histogram) stay side by side
   down to a phone: stacked, they add a plot's height to an already long tab. */
@media (min-width: 561px) and (max-width: 900px) {
    #compare-calibration > * { flex: 1 1 45% !important; min-width: 45% !important; }
}
"""


PHONE_WIDTH = 560  # px: below this, a table shows only the columns a phone needs
PHONE_HIDDEN = {"jobs-table": ("id", "kind", "duration", "message")}  # in the job's line below when it is picked
NARROW_WIDTH = 900  # px: below this (an 800 px window), the saved regions table leaves out what tells no region apart
# 14 columns do not fit 800 px: these five are left out there; the region's metadata (under One region) has them all
NARROW_HIDDEN = {"regions-table": ("base", "share of graftable", "steps", "created (UTC)", "n")}


def phone_css(hidden: dict[str, tuple[str, ...]] = PHONE_HIDDEN, narrow: dict[str, tuple[str, ...]] = NARROW_HIDDEN) -> str:
    """On a phone the jobs table keeps what a job is, where it stands and how far it got (title, status, progress), in
    the page's width with no sideways scroll; in a narrow window the saved regions table keeps the columns that tell
    regions apart and their scores. Gradio sizes the columns from a hidden row of cells, and a cell names its column by
    position only, so the rules go by each hidden column's place in ``TABLES``."""
    return _hiding(hidden, PHONE_WIDTH) + _hiding(narrow, NARROW_WIDTH)


def _hiding(hidden: dict[str, tuple[str, ...]], width: int) -> str:
    rules = []
    for elem_id, names in hidden.items():
        for i, name in enumerate(TABLES[elem_id]):
            if name in names:
                rules += [f"#{elem_id} th:nth-child({i + 1})", f"#{elem_id} .sizing-body td:nth-child({i + 1})",
                          f"#{elem_id} [role=gridcell][data-col=\"{i}\"]"]
    return f"@media (max-width: {width}px) {{\n" + ",\n".join(rules) + " { display: none !important; }\n}\n" if rules else ""


def number_css(columns_of: dict[str, list[str]]) -> str:
    """Rules that keep the number columns of the tables ``columns_of`` names on one line. A cell names its column by position only
    (``data-col``; the hidden row the widths are measured from, by its place), so the rules go by position."""
    rules = []
    for elem_id, columns in columns_of.items():
        for i, name in enumerate(columns):
            if name in tables.NUMBER_COLUMNS or name.startswith(("OOD ", "p(")):
                rules.append(f"#{elem_id} .sizing-body td:nth-child({i + 1}), #{elem_id} [role=gridcell][data-col=\"{i}\"] span")
    return ",\n".join(rules) + " { white-space: nowrap !important; }\n" if rules else ""
