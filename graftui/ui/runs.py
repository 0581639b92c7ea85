"""The Regions tab's runs table: every saved region as a run with its scores, grouped, its mask-learning curve, its
tags and note, and the settings that tell two runs apart.

A region file keeps its settings, its request and its mask-learning curve (``regions.curve_points``); for a region
written before files kept one, the curve is the progress its localize job recorded (one job per run, or one per seed
of a run over seeds), read back from the session's jobs; a data-free region, or an older one whose job is gone, has
none. Out-of-distribution accuracy is read the same
way, from the latest comparison that scored the region on OOD tasks. Tags and notes are kept beside the regions
(``regions.annotate``), in the session's own regions folder. Everything here is pure: the tab wires widgets to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import quote

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import figures, flows, regions
from ..errors import RegionError, RequestError
from ..figures import PALETTE, _layout, empty_figure
from ..flows.replicates import replicate_groups, replicate_stem
from ..formatting import pct
from ..hosted import own_dir
from ..jobs import DONE
from ..regions import GROUPS, budget_of, settings_diff
from ..paths import atomic_write, new_path, short_ref, without_stamp
from ..kinds import KINDS
from . import library, store

NO_CURVE = "no curve recorded"

# -- the runs: listing rows with what the jobs and the annotations add ----------------------------------


def localize_curves(runner) -> dict[str, list[dict]]:
    """Region id -> its mask-learning curve (``step``, ``loss``, ``accuracy``): the one its file keeps
    (``regions.curve_points``), else, for a region written before files kept one, the steps its localize job recorded
    (``job_curves``)."""
    from_files = {e.id: points for e in store.list_regions() if (points := regions.curve_points(e.meta))}
    return {**job_curves(runner), **from_files}


def job_curves(runner) -> dict[str, list[dict]]:
    """Region id -> the mask steps its localize job recorded (``step``, ``loss``, ``accuracy``, ``region_size``), from
    the newest job that made it; a run over seeds gives each seed's region the steps of that seed. Only finished jobs
    of this session (``runner`` is the session's view) are read."""
    out: dict[str, list[dict]] = {}
    for job in runner.jobs("localize"):  # newest first: a newer job's region of the same id wins
        result = job.result if job.status == DONE and isinstance(job.result, dict) else None
        if not result:
            continue
        steps = [p for p in job.progress if isinstance(p, dict) and "step" in p and "loss" in p]
        seeds = [s for s in result.get("seeds") or [] if isinstance(s, dict) and isinstance(s.get("region"), str)]
        made = [(s["region"], [p for p in steps if p.get("seed") == s.get("seed")]) for s in seeds]
        if not seeds and isinstance(result.get("region"), str):
            made = [(result["region"], [p for p in steps if "seed" not in p])]
        for region_id, points in made:
            if points:
                out.setdefault(region_id, points)
    return out


def ood_accuracies(runner) -> dict[str, float]:
    """Region file (resolved path) -> its mean accuracy (or exact match) over the OOD tasks of the newest finished
    comparison that scored it out of distribution."""
    out: dict[str, float] = {}
    for job in runner.jobs("compare"):
        result = job.result if job.status == DONE and isinstance(job.result, dict) else None
        files = (result or {}).get("regions")
        if not isinstance(files, dict):
            continue
        for label, file in files.items():
            if not isinstance(file, str):  # a group of fine-tunes' regions: no one region's score
                continue
            scores = [r.get("accuracy") for r in result.get("rows") or [] if isinstance(r, dict)
                      and r.get("model") == label and r.get("distribution") == "OOD"]
            scores = [float(s) for s in scores if isinstance(s, (int, float)) and not isinstance(s, bool)]
            key = str(Path(file).expanduser().resolve())
            if scores and key not in out:
                out[key] = sum(scores) / len(scores)
    return out


def run_seeds(entries) -> dict[str, str]:
    """Region id -> the run over seeds it belongs to, said as what it is: 'seeds 0, 1, 2 of r' for each seed's region
    of ``localize --seeds`` (r: the name the seeds' files share, without a time stamp), 'core of seeds 0, 1, 2 of r'
    for the core and union it wrote; a run of one seed is in none (its seed column says it)."""
    def ordered(seeds) -> str:
        return ", ".join(str(s) for s in sorted(seeds, key=lambda s: (not isinstance(s, int), str(s).zfill(12))))

    out = {}
    for members in replicate_groups([e.id for e in entries], entries).values():
        seeds = [next(e for e in entries if e.id == m).meta.request.get("seed") for m in members]
        first = min(zip(seeds, members), key=lambda sm: (not isinstance(sm[0], int), str(sm[0]).zfill(12)))[1]
        for m in members:  # named by its first seed's file, whatever order the files were listed in
            out[m] = f"seeds {ordered(seeds)} of {replicate_stem(without_stamp(first))}"
    for e in entries:  # a core or union: the seeds it was made of (its record), the name it shares with them
        learn = e.meta.learn if isinstance(e.meta.learn, dict) else {}
        if e.id not in out and isinstance(learn.get("seeds"), list) and e.meta.method in ("core", "union"):
            stem = without_stamp(e.id).removesuffix(f"-{e.meta.method}")
            out[e.id] = f"{e.meta.method} of seeds {ordered(learn['seeds'])} of {stem}"
    return out


def runs(rows: list[dict] | None = None) -> list[dict]:
    """The session's saved regions as runs: each listing row (``library.regions_listing``) with its budget, the run
    over seeds it belongs to, its score as accuracy or exact match (a completion task's), its OOD accuracy, whether a curve was
    recorded, and its tags and note. Its score (``accuracy``) is named as its task's kind names it (``score_name``:
    accuracy, or exact match for a completion task)."""
    rows = library.regions_listing() if rows is None else rows
    entries = {e.id: e for e in store.list_regions()}
    runner = store.runner()
    curves, ood = localize_curves(runner), ood_accuracies(runner)
    seeds = run_seeds(list(entries.values()))
    notes = read_notes()
    out = []
    for r in rows:
        entry = entries.get(r["id"])
        if entry is None:
            continue
        said = regions.annotation_of(notes, r["id"], r["digest"])
        last = (curves.get(r["id"]) or [{}])[-1]
        out.append({**r, "budget": budget_of(entry.meta), "run": seeds.get(r["id"], ""),
                    "score_name": entry.task_kind.words.score, "ood_accuracy": ood.get(str(Path(r["file"]).resolve())),
                    "curve": r["id"] in curves, "mask_loss": _number(last.get("loss")),
                    "mask_accuracy": _number(last.get("accuracy")), **run_settings(entry.meta), **said})
    return out


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def run_settings(meta) -> dict:
    """What a run's row adds to its listing row (``regions.listing_row``) from its file: its mask-learning rate, its
    training examples and its learner, as the settings columns show them."""
    learn = meta.learn if isinstance(meta.learn, dict) else {}
    how = meta.learner if isinstance(meta.learner, dict) else {}
    learner = [s for s in regions.settings_of(meta) if s.endswith("learner") or " learner " in s]
    return {"lr": _number(learn.get("lr")), "train_examples": meta.train_examples,
            "learner": learner[0] if learner else str(how.get("learner") or "")}


def shown(runs_: list[dict], words: str = "", sort: str | None = None, descending: bool = False) -> list[dict]:
    """The runs that hold every word of the filter (any case) in what the regions table searches, or in their tags
    or note, sorted as ``library.regions_shown`` sorts (none: newest first)."""
    def holds(run: dict, word: str) -> bool:
        return word in " ".join([*run["tags"], run["note"]]).lower() or bool(flows.regionfiles.with_words([run], word))

    wanted = str(words or "").lower().split()
    return library.regions_shown([r for r in runs_ if all(holds(r, w) for w in wanted)], "", sort, descending)


def score_columns() -> list[str]:
    """One column per score name of the registered kinds (accuracy, exact match, the harness's metric): a run's
    score shows under its own kind's name."""
    return list(dict.fromkeys(kind.words.score for kind in KINDS.values()))


# -- the columns a researcher chooses -------------------------------------------------------------------
SETTING, METRIC, ABOUT = "setting", "metric", "about"  # how a run was made, how it scored, what is said of it
NOTE_WIDTH = 80  # characters of a note the table shows; the region's own box holds it whole


@dataclass(frozen=True)
class Column:
    """One column the runs table can show: its header, whether it says how a run was made, how it scored or what is
    said of it (``kind``), the values it writes to a CSV file (CSV header -> a number where it is one, so pandas reads
    numbers), and its cell on the page. ``share``: a metric that is a share of the examples (a percentage on the page,
    a fraction in the CSV)."""

    label: str
    kind: str
    values: Callable[[dict], dict]
    cell: Callable[[dict], str]
    share: bool = False


def _key(label: str) -> str:
    """A CSV header for a column label: its words joined by '_' ('exact match' -> 'exact_match')."""
    return re.sub(r"\W+", "_", label.replace("↓", "")).strip("_").lower()


def _cut(text: str) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= NOTE_WIDTH else text[:NOTE_WIDTH - 1] + "…"


def _pct(v) -> str:
    return pct(v, missing="")


def _plain(v) -> str:
    return "" if v is None else str(v)


def _score(name: str) -> Column:
    key = _key(name)
    return Column(name, METRIC, lambda r: {key: r["accuracy"] if r["score_name"] == name else None},
                  lambda r: _pct(r["accuracy"]) if r["score_name"] == name else "", share=True)


def _field(label: str, key: str, kind: str, cell=_plain, share: bool = False) -> Column:
    return Column(label, kind, lambda r: {key: r.get(key)}, lambda r: cell(r.get(key)), share)


def run_link(region_id: str) -> str:
    """The address that opens a run, relative to the app's page: its Regions tab with the run picked."""
    return "?run=" + quote(str(region_id), safe="")


def all_columns() -> list[Column]:
    """Every column the runs table can show, in the one order it shows them: the settings that made a run, then the
    metrics it has (a score column per kind, calibration, the share of the fine-tuning gain kept, OOD accuracy, the
    mask-learning curve's last loss and batch accuracy), then what is said of it: whether its curve was recorded,
    its tags, note and link."""
    settings = [
        _field("id", "id", SETTING),
        Column("model pair", SETTING, lambda r: {"base": r["base"], "finetuned": r["finetuned"]},
               lambda r: f"{short_ref(r['base'] or '?')} → {short_ref(r['finetuned'] or '?')}"),
        Column("task", SETTING, lambda r: {"task": r["task"]}, lambda r: short_ref(r["task"] or "")),
        _field("method", "method", SETTING),
        _field("budget", "budget", SETTING),
        _field("k (params)", "k", SETTING, lambda v: "" if v is None else f"{v:,}"),
        _field("share of graftable", "share_of_graftable", SETTING, lambda v: pct(v, missing="")),
        _field("steps", "steps", SETTING),
        _field("lr", "lr", SETTING, lambda v: "" if v is None else f"{v:g}"),
        _field("seed", "seed", SETTING),
        _field("training examples", "train_examples", SETTING, lambda v: "" if v is None else f"{v:,}"),
        _field("learner", "learner", SETTING),
        Column("run over seeds", SETTING, lambda r: {"run_over_seeds": r["run"]}, lambda r: r["run"]),
        Column("created (UTC)", SETTING, lambda r: {"created": r["created"]},
               lambda r: (r["created"] or "").replace("T", " ")[:16]),
    ]
    metrics = [
        *(_score(name) for name in score_columns()),
        _field("ECE ↓", "ece", METRIC, lambda v: "" if v is None else f"{v:.3f}"),
        _field("share of FT gain", "share_of_ft", METRIC, _pct, share=True),
        _field("OOD accuracy", "ood_accuracy", METRIC, _pct, share=True),
        _field("test examples", "n", METRIC, lambda v: "" if v is None else f"{v:,}"),
        _field("last mask loss", "mask_loss", METRIC, lambda v: "" if v is None else f"{v:.4f}"),
        _field("last batch accuracy", "mask_accuracy", METRIC, _pct, share=True),
    ]
    notes = [
        Column("curve", ABOUT, lambda r: {"curve": bool(r["curve"])}, lambda r: "yes" if r["curve"] else NO_CURVE),
        Column("tags", ABOUT, lambda r: {"tags": ", ".join(r["tags"])}, lambda r: ", ".join(r["tags"])),
        Column("note", ABOUT, lambda r: {"note": r["note"]}, lambda r: _cut(r["note"])),
        Column("link", ABOUT, lambda r: {"link": run_link(r["id"])}, lambda r: run_link(r["id"])),
    ]
    return [*settings, *metrics, *notes]


def column_labels() -> list[str]:
    return [c.label for c in all_columns()]


def runs_columns() -> list[str]:
    """The columns shown before any is chosen: what tells runs apart and how each scored."""
    return ["id", "task", "method", "budget", "k (params)", "seed", "run over seeds", *score_columns(), "ECE ↓",
            "OOD accuracy", "curve", "tags", "note"]


RUNS_COLUMNS = runs_columns()  # as the page is built


def chosen_columns(chosen=None) -> list[Column]:
    """The columns ``chosen`` (labels; None: the default set) in the table's own order, the run's id always first;
    a label no column has is left out."""
    wanted = set(runs_columns() if chosen is None else [c for c in chosen if isinstance(c, str)]) | {"id"}
    return [c for c in all_columns() if c.label in wanted]


def runs_table(runs_: list[dict], chosen=None) -> pd.DataFrame:
    """The runs as the page shows them: one row each, with the columns chosen (``chosen_columns``), scores as
    percentages, a note cut to NOTE_WIDTH."""
    columns = chosen_columns(chosen)
    return pd.DataFrame([{c.label: c.cell(r) for c in columns} for r in runs_], columns=[c.label for c in columns])


def runs_frame(runs_: list[dict], chosen=None) -> pd.DataFrame:
    """The runs as numbers, one row each with the columns chosen (a CSV header per value: ``model pair`` gives
    ``base`` and ``finetuned``); shares as fractions, a missing value empty, a whole note."""
    columns = chosen_columns(chosen)
    rows = [{k: v for c in columns for k, v in c.values(r).items()} for r in runs_]
    keys = [k for c in columns for k in c.values(_BLANK)]
    return pd.DataFrame(rows, columns=list(dict.fromkeys(keys)))


_BLANK = {"id": "", "base": None, "finetuned": None, "task": None, "accuracy": None, "score_name": "", "run": "",
          "created": None, "curve": False, "tags": [], "note": ""}  # a run with nothing: the keys a column writes


CSV_STEM = "graftui-runs"


def export_csv(runs_: list[dict], chosen=None) -> Path:
    """The runs with the columns chosen written as a CSV file (``runs_frame``) to a fresh file of the session's own
    downloads folder, ``graftui-runs-<UTC stamp>.csv``: a name the server makes, never a path the page names."""
    if not runs_:
        raise RequestError("no run to export: save a region first, or clear the filter that hides every run")
    frame = runs_frame(runs_, chosen).map(_inert)
    path = new_path(store.downloads_dir(), CSV_STEM, ".csv")
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False), exclusive=True)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # a text cell a spreadsheet would run as a formula


def _inert(value):
    """A text cell (a tag, a note, a task name) that a spreadsheet would read as a formula, quoted so it reads as
    text; numbers are left as they are."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def exported(words: str = "", sort: str | None = None, descending: bool = False, scope: str = "shown",
             picked=None) -> list[dict]:
    """The runs a CSV export writes: those the table shows (its filter and sort), or with ``scope`` 'picked' the runs
    picked, in the order picked."""
    all_runs = runs()
    if scope != "picked":
        return shown(all_runs, words, sort, descending)
    by_id = {r["id"]: r for r in all_runs}
    rows = [by_id[i] for i in dict.fromkeys(picked or []) if isinstance(i, str) and i in by_id]
    if not rows:
        raise RequestError("no run picked: pick runs under 'Runs to overlay', or export the runs shown")
    return rows


def side_by_side(runs_: list[dict], picked, chosen=None) -> pd.DataFrame:
    """The runs picked side by side: one row per column chosen (the id heads each run's column), one column per run
    in the order picked; a picked id that is no run is left out."""
    by_id = {r["id"]: r for r in runs_}
    shown = [by_id[i] for i in dict.fromkeys(picked or []) if isinstance(i, str) and i in by_id]
    columns = [c for c in chosen_columns(chosen) if c.label != "id"]
    header = ["column", *(r["id"] for r in shown)]
    return pd.DataFrame([[c.label, *(c.cell(r) for r in shown)] for c in columns], columns=header)


def links_line(picked) -> str:
    """A line of links, one per run picked, that open the page with that run picked (``run_link``)."""
    ids = [i for i in dict.fromkeys(picked or []) if isinstance(i, str) and i]
    if not ids:
        return "Pick runs to get a link to each: it opens this page with the run picked."
    return "Links to the runs picked (open this page with the run picked): " + " · ".join(
        f"[{_md(i)}]({run_link(i)})" for i in ids)


LINK_SHOWN = 40  # characters of a link's run id a refusal quotes


def linked_run(run_id) -> str:
    """The run a ``?run=`` link opens: one of the regions this session lists, else a RegionError of one line that
    quotes the id only as plain characters (a link is anyone's text)."""
    text = run_id.strip() if isinstance(run_id, str) else ""
    if text and text in {e.id for e in store.list_regions()}:
        return text
    shown = re.sub(r"[^A-Za-z0-9._-]", "?", text[:LINK_SHOWN]) + ("…" if len(text) > LINK_SHOWN else "")
    raise RegionError(f"the link names no run of this page ('{shown}'): ?run= takes the id of a region saved here "
                      "(the id column of the Runs table); nothing was picked")


def _md(text: str) -> str:
    """A region id as Markdown text: every character Markdown or HTML reads escaped."""
    return re.sub(r"([\\`*_{}\[\]()<>#+\-.!|~&])", r"\\\1", text)


# -- one metric against a run's size or length -----------------------------------------------------------
SCATTER_X = {"k": "k (params)", "share_of_graftable": "share of graftable", "steps": "steps"}  # key -> axis title
SCATTER_X_CHOICES = [("k (region size)", "k"), ("sparsity (share of graftable)", "share_of_graftable"),
                     ("steps", "steps")]
COLOUR_BY = {"method": "method", "pair": "model pair", "task": "task", "pair_task": "model · task",
             "budget": "budget"}
COLOUR_CHOICES = [(label, key) for key, label in COLOUR_BY.items()]


def scatter_metrics() -> list[tuple[str, str]]:
    """(label, CSV key) of every metric the scatter can put on its y axis: the number columns among the metrics."""
    return [(c.label, next(iter(c.values(_BLANK)))) for c in all_columns() if c.kind == METRIC]


def _colour(run: dict, by: str) -> str:
    pair = f"{short_ref(run['base'] or '?')} → {short_ref(run['finetuned'] or '?')}"
    task = short_ref(run["task"] or "?")
    return {"method": run["method"] or "?", "pair": pair, "task": task, "pair_task": f"{pair} · {task}",
            "budget": run["budget"]}.get(by) or "?"


def runs_scatter(runs_: list[dict], x: str = "k", y: str = "accuracy", by: str = "method") -> go.Figure:
    """The metric ``y`` (a CSV key of ``scatter_metrics``) of each run shown against its k, sparsity (share of the
    graftable parameters) or steps (``x``), coloured by ``by`` (``COLOUR_BY``). A choice the page does not offer gives
    an empty figure that says so, never an exception."""
    metrics = {key: label for label, key in scatter_metrics()}
    if x not in SCATTER_X or y not in metrics or by not in COLOUR_BY:
        return empty_figure(f"Pick an x axis ({', '.join(SCATTER_X)}), a metric and a colouring from the lists.")
    shares = {next(iter(c.values(_BLANK))) for c in all_columns() if c.share}
    points = [{"id": r["id"], "x": r.get(x), "y": next(iter(_column(metrics[y]).values(r).values())),
               "group": _colour(r, by)} for r in runs_]
    return figures.runs_scatter(points, SCATTER_X[x], metrics[y], COLOUR_BY[by], x_share=x == "share_of_graftable",
                                y_share=y in shares, x_log=x != "steps")


def _column(label: str) -> Column:
    return next(c for c in all_columns() if c.label == label)


# -- groups ----------------------------------------------------------------------------------------
GROUP_CHOICES = [("no grouping", "")] + [(label, key) for key, label in GROUPS.items()]
GROUP_COLUMNS = ["group", "runs", "scored", "score mean", "score spread (std)", "score min – max", "ECE ↓ mean",
                 "OOD accuracy mean"]


def groups_table(groups: list[dict], by: str) -> pd.DataFrame:
    rows = [{"group": f"{GROUPS[by]}: {g['group']}", "runs": str(g["runs"]), "scored": str(g["scored"]),
             "score mean": _pct(g["mean"]),
             "score spread (std)": "" if g["std"] is None else f"{100 * g['std']:.1f} pts",
             "score min – max": "" if g["min"] is None else f"{_pct(g['min'])} – {_pct(g['max'])}",
             "ECE ↓ mean": "" if g["ece"] is None else f"{g['ece']:.3f}", "OOD accuracy mean": _pct(g["ood"])}
            for g in groups]
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


# -- curves of several runs in one plot -------------------------------------------------------------
def curves_figure(picked: list[str], curves: dict[str, list[dict]]) -> go.Figure:
    """The mask-learning curves of the runs ``picked``, overlaid: loss (top) and training-batch accuracy (bottom) per
    mask step, one colour and one legend entry per run; the runs without a recorded curve are named in the title."""
    picked = list(dict.fromkeys(picked or []))
    if not picked:
        return empty_figure("Pick runs above to overlay their mask-learning curves.")
    drawn, missing = [r for r in picked if curves.get(r)], [r for r in picked if not curves.get(r)]
    if not drawn:
        return empty_figure(f"{NO_CURVE} for {', '.join(missing)}: only a region learned by a localize job of this "
                            "page keeps one (a data-free method, the command line or an upload keeps none).")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=("Loss of the relaxed graft per batch", "Accuracy on the training batch"))
    for i, run in enumerate(drawn):
        points, colour = curves[run], PALETTE[i % len(PALETTE)]
        x = [p["step"] for p in points]
        fig.add_trace(go.Scatter(x=x, y=[p.get("loss") for p in points], mode="lines", name=run, legendgroup=run,
                                 line={"color": colour},
                                 hovertemplate=f"{run}<br>step %{{x}}<br>loss %{{y:.4f}}<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[p.get("accuracy") for p in points], mode="lines", name=run, legendgroup=run,
                                 showlegend=False, line={"color": colour},
                                 hovertemplate=f"{run}<br>step %{{x}}<br>accuracy %{{y:.1%}}<extra></extra>"),
                      row=2, col=1)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="mask step", row=2, col=1)
    title = f"Mask learning of {len(drawn)} run(s)" + (f" · {NO_CURVE} for {', '.join(missing)}" if missing else "")
    fig = _layout(fig, title, height=520)
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.14, "x": 0})
    return fig


# -- the settings that tell two runs apart -------------------------------------------------------------
DIFF_WIDTH = 120  # characters of a value the table shows


def diff_table(a_id: str, b_id: str, rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    def cut(text: str) -> str:
        return text if len(text) <= DIFF_WIDTH else text[:DIFF_WIDTH - 1] + "…"

    columns = ["setting", f"A: {a_id}", f"B: {b_id}"]
    return pd.DataFrame([dict(zip(columns, (n, cut(x), cut(y)))) for n, x, y in rows], columns=columns)


def compare_settings(picked: list[str]) -> tuple[pd.DataFrame, str]:
    """The settings diff of the first two runs picked, and a line that says what it shows."""
    picked = list(dict.fromkeys(picked or []))
    if len(picked) < 2:
        return pd.DataFrame(columns=["setting", "A", "B"]), "Pick two runs to see the settings that differ between them."
    a, b = picked[:2]
    rows = settings_diff(store.read_region_header(store.region_path(a)).meta,
                         store.read_region_header(store.region_path(b)).meta)
    more = f" (the first two of the {len(picked)} picked)" if len(picked) > 2 else ""
    line = (f"**{a}** and **{b}**{more} differ in {len(rows)} setting(s)." if rows else
            f"**{a}** and **{b}**{more} were made with the same settings.")
    return diff_table(a, b, rows), line


# -- tags and notes of a run --------------------------------------------------------------------------
def notes_folder() -> Path:
    """Where the session's tags and notes are kept: its own regions folder (hosted: never the gallery, never
    another session's)."""
    return store.regions_dir()


def read_notes() -> dict[str, dict]:
    own = own_dir("regions")
    return regions.read_annotations(own) if own is not None else {}


def note_of(region_id: str) -> dict:
    """The tags and note of a saved region of this session (none: empty)."""
    if not region_id:
        return {"tags": [], "note": ""}
    entry = store.read_region_header(store.region_path(region_id))
    return regions.annotation_of(read_notes(), entry.id, entry.digest)


def save_note(region_id: str, tags, note) -> dict:
    """Keep the tags and note of ``region_id``, one of the regions this session lists (an id that is not, or names
    another session's, is refused before anything is written): checked, locked and written whole."""
    path = store.region_path(region_id)  # a plain id of this session's own folders, else a RegionError
    entry = store.read_region_header(path)
    if entry is None:
        raise RequestError(f"'{region_id}' is not a readable region file: tags and notes need a saved region")
    return regions.annotate(notes_folder(), entry.id, entry.digest, tags, note,
                            keep=[e.id for e in store.list_regions()])


def notes_signature() -> tuple:
    """What changes when a tag or note is written: the annotations file's time and size."""
    own = own_dir("regions")
    try:
        stat = regions.annotations_path(own).stat() if own is not None else None
    except OSError:
        return ()
    return () if stat is None else (stat.st_mtime_ns, stat.st_size)


def jobs_signature() -> tuple:
    """What changes when a localize or compare job ends: their ids and statuses."""
    runner = store.runner()
    return tuple((j.id, j.status) for kind in ("localize", "compare") for j in runner.jobs(kind))

