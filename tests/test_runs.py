"""The runs table of the Regions tab (graftui/ui/runs.py): columns read from the regions, their jobs and their score
logs, groups with their mean and spread, curves overlaid from the localize jobs, the settings diff of two runs, and
tags and notes kept beside the regions (checked, capped, written whole, never for a region of another session)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tiny_pair
from graftui import regions
from graftui.config import COMPLETION
from graftui.errors import RegionError, RequestError, SessionError


def _indices(pair, start: int, k: int) -> dict:
    name = max(pair.graftable, key=lambda n: pair.param(n).numel())
    return {name: torch.arange(start, start + k, dtype=torch.int64)}


def _save(pair, stem: str, start: int, k: int, method="learned", sparsity=0.01, seed=0, steps=10, lr=0.02,
          completion=False):
    from graftui.ui import store

    learn = {"steps": steps, "lr": lr, "seed": seed, "optimizer": "normalized"} if method == "learned" else None
    request = {"verb": "localize", "base": "tiny-base", "finetuned": "tiny-ft", "task": "movies", "method": method,
               "sparsity": sparsity, "steps": steps, "lr": lr, "seed": seed, "out": f"/somewhere/{stem}.safetensors"}
    record = regions.make_record(pair, _indices(pair, start, k), {
        "method": method, "task": "movies", "sparsity": sparsity, "budget": f"sparsity={sparsity:g}", "learn": learn,
        "request": request})
    if completion:
        record.meta.loading = {"head": COMPLETION}
    return store.save_region(record, stem)


def _score(path, accuracy, ece=0.1, when="2024-01-01T10:00:00Z"):
    from graftui.ui import store

    header = store.read_region_header(path)
    regions.note_scores(store.regions_dir(), [{"digest": header.digest, "task": "movies", "accuracy": accuracy,
                                               "ece": ece, "share_of_ft": 0.5, "n": 64, "when": when}])


def _job(kind, result, steps=()):
    """A finished job of ``kind`` that reported ``steps`` and returned ``result``, as the runner records one."""
    from graftui.ui import store

    runner = store.runner()

    def body(ctx):
        for event in steps:
            ctx.report(event)
        return result

    job = runner.submit(kind, f"a {kind} job", body, {"verb": kind})
    done = runner.wait(job.id, 30)
    assert done.status == "done", (done.status, done.error)
    return done


def _steps(n, loss0, seed=None):
    return [{"step": i, "steps": n, "loss": loss0 - 0.1 * i, "accuracy": 0.5 + 0.05 * i, "region_size": 20,
             **({} if seed is None else {"seed": seed})} for i in range(1, n + 1)]


@pytest.fixture
def made(home):
    """Four saved runs: two seeds of one learned run at 1 % (scored 0.70 and 0.80), a top-movement run at 0.1 %
    (0.60) and a learned one never scored, with a localize job for the first three, over two seeds for the pair."""
    from graftui.ui import store

    pair, _, _ = make_tiny_pair()
    a = _save(pair, "learned-seed0", 0, 20, seed=0)
    b = _save(pair, "learned-seed1", 40, 20, seed=1)
    c = _save(pair, "topmove", 80, 30, method="top-movement", sparsity=0.001)
    d = _save(pair, "unscored", 120, 20, seed=7, steps=25)
    _score(a, 0.70, 0.10)
    _score(b, 0.80, 0.20)
    _score(c, 0.60, 0.30)
    _job("localize", {"region": "core", "seeds": [{"seed": 0, "region": a.stem}, {"seed": 1, "region": b.stem}]},
         _steps(3, 1.0, seed=0) + _steps(4, 2.0, seed=1))
    _job("compare", {"regions": {"learned": str(a), "group": [str(b)]},
                     "rows": [{"model": "learned", "distribution": "OOD", "task": "amazon", "accuracy": 0.6},
                              {"model": "learned", "distribution": "OOD", "task": "tweets", "accuracy": 0.7},
                              {"model": "learned", "distribution": "in", "task": "movies", "accuracy": 0.9}]})
    return {"a": a.stem, "b": b.stem, "c": c.stem, "d": d.stem, "store": store}


def test_each_run_carries_its_budget_seeds_scores_ood_and_curve(made):
    from graftui.ui import runs

    rows = {r["id"]: r for r in runs.runs()}
    a, b, c, d = (rows[made[k]] for k in "abcd")
    assert (a["budget"], c["budget"]) == ("1.000%", "0.100%")
    assert a["run"] == b["run"] == "seeds 0, 1 of learned" and d["run"] == c["run"] == ""  # a run of one seed: none
    assert (a["accuracy"], b["accuracy"], d["accuracy"]) == (0.70, 0.80, None)
    assert a["ood_accuracy"] == pytest.approx(0.65) and b["ood_accuracy"] is None  # b was only compared in a group
    assert (a["curve"], b["curve"], c["curve"], d["curve"]) == (True, True, False, False)
    table = runs.runs_table([a, d]).to_dict("records")
    assert table[0]["OOD accuracy"] == "65.0%" and table[0]["accuracy"] == "70.0%" and table[0]["ECE ↓"] == "0.100"
    assert table[1]["curve"] == runs.NO_CURVE and table[1]["accuracy"] == "" and table[1]["run over seeds"] == "" \
        and table[0]["run over seeds"] == "seeds 0, 1 of learned" and table[1]["seed"] == "7"
    assert list(runs.runs_table([]).columns) == runs.RUNS_COLUMNS


def test_a_completion_runs_score_is_its_exact_match(home):
    from graftui.ui import runs

    pair, _, _ = make_tiny_pair()
    path = _save(pair, "dates", 0, 10, completion=True)
    _score(path, 0.42)
    (row,) = runs.runs()
    assert (row["score_name"], row["accuracy"]) == ("exact match", 0.42)
    shown = runs.runs_table([row]).to_dict("records")[0]
    assert (shown["exact match"], shown["accuracy"]) == ("42.0%", "")


def test_groups_give_each_budget_method_and_seed_its_mean_and_spread(made):
    from graftui.ui import runs

    rows = runs.runs()
    by_budget = {g["group"]: g for g in regions.group_runs(rows, "budget")}
    learned = by_budget["1.000%"]
    assert (learned["runs"], learned["scored"]) == (3, 2)  # the unscored run counts, its score does not
    assert learned["mean"] == pytest.approx(0.75) and learned["std"] == pytest.approx(0.0707107, abs=1e-6)
    assert (learned["min"], learned["max"]) == (0.70, 0.80) and learned["ece"] == pytest.approx(0.15)
    assert learned["ood"] == pytest.approx(0.65)
    assert (by_budget["0.100%"]["mean"], by_budget["0.100%"]["std"], by_budget["0.100%"]["runs"]) == (0.60, 0.0, 1)
    by_method = {g["group"]: (g["runs"], g["scored"]) for g in regions.group_runs(rows, "method")}
    assert by_method == {"learned": (3, 2), "top-movement": (1, 1)}
    by_seed = {g["group"]: g["runs"] for g in regions.group_runs(rows, "seed")}
    assert by_seed == {"0": 1, "1": 1, "7": 1, "(none)": 1}
    table = runs.groups_table(regions.group_runs(rows, "budget"), "budget").to_dict("records")
    first = next(t for t in table if t["group"] == "budget (sparsity): 1.000%")
    assert (first["score mean"], first["score spread (std)"], first["score min – max"]) == ("75.0%", "7.1 pts",
                                                                                          "70.0% – 80.0%")
    with pytest.raises(RequestError, match="cannot group by 'task'"):
        regions.group_runs(rows, "task")


def test_curves_of_several_runs_are_overlaid_in_one_plot(made):
    from graftui.ui import runs, store

    curves = runs.localize_curves(store.runner())
    assert set(curves) == {made["a"], made["b"]}
    assert [p["step"] for p in curves[made["b"]]] == [1, 2, 3, 4]  # seed 1's own steps
    fig = runs.curves_figure([made["a"], made["b"], made["c"]], curves)
    names = [(t.name, list(t.x)) for t in fig.data]
    assert names == [(made["a"], [1, 2, 3]), (made["a"], [1, 2, 3]), (made["b"], [1, 2, 3, 4]), (made["b"], [1, 2, 3, 4])]
    assert list(fig.data[2].y) == pytest.approx([1.9, 1.8, 1.7, 1.6])
    assert f"no curve recorded for {made['c']}" in fig.layout.title.text
    empty = runs.curves_figure([made["d"]], curves)
    assert not empty.data and "no curve recorded for unscored" in empty.layout.annotations[0].text


def test_the_settings_diff_names_the_fields_that_differ(made):
    from graftui.ui import runs, store

    meta = {k: store.read_region_header(store.region_path(made[k])).meta for k in "abd"}
    diff = {name: (x, y) for name, x, y in regions.settings_diff(meta["a"], meta["d"])}
    assert diff == {"request.seed": ("0", "7"), "request.steps": ("10", "25"), "learn.steps": ("10", "25"),
                    "learn.seed": ("0", "7")}  # request.out differs too, but is where, not how
    assert regions.settings_diff(meta["a"], meta["a"]) == []
    table, line = runs.compare_settings([made["a"], made["c"], made["d"]])
    assert list(table.columns) == ["setting", f"A: {made['a']}", f"B: {made['c']}"]
    rows = {r["setting"]: r for r in table.to_dict("records")}
    assert rows["method"][f"B: {made['c']}"] == "top-movement" and rows["learn.steps"][f"B: {made['c']}"] == "—"
    assert f"differ in {len(rows)} setting(s)" in line and "first two of the 3 picked" in line
    assert "Pick two runs" in runs.compare_settings([made["a"]])[1]


def test_tags_and_notes_round_trip_and_are_found_by_the_filter(made):
    from graftui.ui import runs, store

    kept = runs.save_note(made["c"], "baseline, Baseline ,  long   run,", "first line\r\nsecond\x00 line")
    assert kept == {"tags": ["baseline", "long run"], "note": "first line\nsecond line"}
    assert runs.note_of(made["c"]) == kept
    doc = json.loads((store.regions_dir() / regions.ANNOTATIONS_FILE).read_text())
    assert [e["id"] for e in doc["runs"]] == [made["c"]]
    rows = runs.runs()
    assert [r["id"] for r in runs.shown(rows, "BASELINE")] == [made["c"]]
    assert [r["id"] for r in runs.shown(rows, "second topmove")] == [made["c"]]
    assert runs.runs_table(runs.shown(rows, "baseline")).to_dict("records")[0]["tags"] == "baseline, long run"
    # a file saved later under the same id does not inherit them; clearing both removes the entry
    assert regions.annotation_of(regions.read_annotations(store.regions_dir()), made["c"], "other") == \
        {"tags": [], "note": ""}
    runs.save_note(made["c"], "", "  ")
    assert runs.note_of(made["c"]) == {"tags": [], "note": ""}
    assert json.loads((store.regions_dir() / regions.ANNOTATIONS_FILE).read_text())["runs"] == []
    runs.save_note(made["c"], "gone-soon", "")
    store.delete_region(made["c"])  # a deleted region's tags and note go with it
    assert json.loads((store.regions_dir() / regions.ANNOTATIONS_FILE).read_text())["runs"] == []


def test_hostile_tags_and_notes_are_refused_with_one_line_and_nothing_written(made):
    from graftui.ui import runs, store

    runs.save_note(made["a"], "kept", "kept note")
    file = store.regions_dir() / regions.ANNOTATIONS_FILE
    before = file.read_bytes()
    cases = [
        (made["a"], "ok", "x" * (regions.MAX_NOTE_CHARS + 5), RequestError, "the note has 2,005 characters; a note "
         "holds at most 2,000: shorten it by 5"),
        (made["a"], "fine, <b>bold</b>", "", RequestError, "tag 2 holds characters a tag cannot ('/' '<' '>')"),
        (made["a"], "../../etc/passwd", "", RequestError, "tag 1 holds characters a tag cannot ('/')"),
        (made["a"], ".hidden", "", RequestError, "tag 1 holds characters a tag cannot ('.') or starts with one"),
        (made["a"], "a/b", "", RequestError, "use letters, digits"),
        (made["a"], "t" * 40, "", RequestError, "longer than 32 characters"),
        (made["a"], ",".join(f"t{i}" for i in range(13)), "", RequestError, "a run keeps at most 12"),
        ("no-such-region", "ok", "", RegionError, "region 'no-such-region' is not saved here"),
        ("../scores", "ok", "", RegionError, "'../scores' is not a region id"),
        ("", "ok", "", RegionError, "no region selected"),
    ]
    for region_id, tags, note, error, words in cases:
        with pytest.raises(error) as info:
            runs.save_note(region_id, tags, note)
        text = str(info.value)
        assert words in text and "\n" not in text and "<b>" not in text, text
    assert file.read_bytes() == before  # nothing half-written, nothing changed
    assert [p.name for p in store.regions_dir().iterdir() if ".tmp-" in p.name] == []


def test_a_hosted_session_annotates_only_its_own_regions(home, monkeypatch):
    from graftui.ui import runs, store

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    pair, _, _ = make_tiny_pair()
    mine, theirs = store.new_session(), store.new_session()
    with store.session(theirs):
        their = _save(pair, "their-run", 0, 10).stem
        runs.save_note(their, "secret", "their note")
    with store.session(mine):
        own = _save(pair, "my-run", 0, 10).stem
        with pytest.raises(RegionError, match=f"region '{their}' is not saved here"):
            runs.save_note(their, "mine-now", "")
        runs.save_note(own, "mine", "")
        assert [r["id"] for r in runs.runs()] == [own] and runs.read_notes().keys() == {own}
    with store.session(theirs):
        assert runs.note_of(their) == {"tags": ["secret"], "note": "their note"}
        assert runs.read_notes().keys() == {their}
    with store.session("not-a-session"):
        with pytest.raises(SessionError, match="no live session .*: reload the page"):
            runs.save_note(own, "x", "")
    assert not (store.gallery_dir() / regions.ANNOTATIONS_FILE).exists()


def test_the_tab_renders_runs_groups_and_a_signature_that_follows_notes(made):
    from graftui.ui import runs
    from graftui.ui.tabs import regions as tab

    table, figure, run_table, groups, scatter, sig = tab.render_all("", "", False, None, "method")
    assert list(run_table.columns) == runs.RUNS_COLUMNS and len(run_table) == 4
    assert groups["visible"] is True and set(groups["value"]["group"]) == {"method: learned", "method: top-movement"}
    assert tab.render_all("", "", False, sig, "method") is None  # nothing new: nothing redrawn
    runs.save_note(made["d"], "fresh", "")
    again = tab.render_all("fresh", "", False, sig, "method")
    assert again is not None and list(again[2]["id"]) == [made["d"]] and list(again[0]["id"]) == [made["d"]]
    assert tab.render_all("", "", False, None, "")[3]["visible"] is False
    chosen = tab.render_all("", "", False, None, "", ["seed", "accuracy"], "steps", "ece", "task")
    assert list(chosen[2].columns) == ["id", "seed", "accuracy"] and chosen[-1] != sig
    assert sum(len(t.x) for t in chosen[4].data) == 2 and chosen[4].data[0].name == "task: movies"  # a and b: steps, ECE


def test_a_region_file_keeps_its_curve_which_the_runs_table_reads_without_its_job(home):
    from graftui.ui import runs

    pair, _, _ = make_tiny_pair()
    reports = [{"step": i, "loss": 2.0 - i / 1000, "accuracy": 0.5, "region_size": 3} for i in range(1, 1001)]
    curve = regions.curve_of(reports)
    assert len(curve) <= regions.MAX_CURVE_POINTS and curve[0] == [1, 1.999, 0.5] and curve[-1][0] == 1000
    path = _save(pair, "kept-curve", 0, 10)
    record = regions.load(path)
    record.meta.curve = [[1, 1.5, 0.5], [2, 1.25, 0.75], ["3", 1.0, 0.5], [4, float("nan"), 0.5], [5, True, 0.5], 7]
    regions.save(record, path)
    from graftui.ui import store
    entry = next(e for e in store.list_regions() if e.id == path.stem)
    assert regions.curve_points(entry.meta) == [{"step": 1, "loss": 1.5, "accuracy": 0.5},
                                                {"step": 2, "loss": 1.25, "accuracy": 0.75}]  # the rest is not numbers
    row = next(r for r in runs.runs() if r["id"] == path.stem)
    assert row["curve"] is True  # no job made it: the file's own curve
    fig = runs.curves_figure([path.stem], runs.localize_curves(store.runner()))
    assert [list(t.y) for t in fig.data if t.name and path.stem in t.name][0] == [1.5, 1.25]


def test_the_command_line_groups_the_runs_and_names_the_settings_two_differ_in(made):
    """``graftui runs --group-by`` and ``--diff`` are the library's grouping and settings diff, as the page's."""
    from cli_util import run_cli

    code, out, err = run_cli("runs", "--group-by", "budget", "--json")
    assert code == 0, err
    groups = {g["group"]: g for g in json.loads(out)["groups"]}
    assert groups["1.000%"]["runs"] == 3 and groups["1.000%"]["scored"] == 2
    assert groups["1.000%"]["mean"] == pytest.approx(0.75) and groups["0.100%"]["mean"] == pytest.approx(0.60)
    code, out, err = run_cli("runs", "--diff", f"{made['a']},{made['d']}")
    assert code == 0, err
    assert f"{made['a']} and {made['d']}: 4 setting(s) differ" in out and "request.steps" in out
    for bad, said in ((made["a"], "--diff takes two region ids, got 1"), (f"{made['a']},nope", "no region 'nope'")):
        code, out, err = run_cli("runs", "--diff", bad)
        assert code == 2 and said in err and err.count("\n") == 1, err


def test_the_core_and_union_of_a_seeds_run_say_the_examples_and_seeds_they_come_from(home):
    """A localize run over seeds writes its core and union as regions of their own: their line in the library says how
    many examples the seeds learned on and which seeds they are, not '? examples' and the first seed alone."""
    from graftui.flows.common import LocalizeResult
    from graftui.flows.replicates import localize_seeds
    from graftui.requests import LocalizeRequest

    pair, _, _ = make_tiny_pair()

    def localize(one, progress, cancel, guard):  # each seed's region: 20 parameters, shifted by two per seed
        record = regions.make_record(pair, _indices(pair, 2 * one.seed, 20), {
            "method": "learned", "task": "movies", "train_examples": 32, "request": one.as_dict(),
            "learn": {"steps": 10, "lr": 0.02, "seed": one.seed, "optimizer": "normalized"}})
        regions.save(record, one.out)
        return LocalizeResult(one, [], 0.0, one.out, record)

    from graftui.ui import runs, store

    req = LocalizeRequest(base="tiny-base", finetuned="tiny-ft", task="movies", seeds=[0, 1, 2],
                          out=str(store.regions_dir() / "r.safetensors"))
    stability = localize_seeds(localize, req).stability
    for how in ("core", "union"):
        meta = regions.load(stability[f"{how}_path"]).meta
        said = regions.settings_of(meta)
        assert said[:4] == ["10 steps", "32 examples", "lr 0.02", "seeds 0, 1, 2"], (how, said)
        assert "?" not in regions.describe(meta)

    labels = runs.run_seeds(store.list_regions())  # the runs table's column: what run each region belongs to
    assert labels == {**{f"r-seed{s}": "seeds 0, 1, 2 of r" for s in (0, 1, 2)},
                      "r-core": "core of seeds 0, 1, 2 of r", "r-union": "union of seeds 0, 1, 2 of r"}


def test_the_columns_chosen_are_the_table_s_columns_in_one_order(made):
    """Every setting and metric can be chosen; the table shows those chosen in the one order of ``all_columns``, its
    id first, whatever order they were ticked in; a label no column has is ignored."""
    from graftui.ui import runs

    labels = runs.column_labels()
    assert {"model pair", "task", "method", "k (params)", "share of graftable", "steps", "lr", "seed", "learner",
            "accuracy", "exact match", "ECE ↓", "share of FT gain", "OOD accuracy", "last mask loss", "link"} <= set(labels)
    assert set(runs.score_columns()) <= set(labels)
    rows = {r["id"]: r for r in runs.runs()}
    table = runs.runs_table([rows[made["a"]], rows[made["c"]]], ["OOD accuracy", "lr", "no such column", "method"])
    assert list(table.columns) == ["id", "method", "lr", "OOD accuracy"]
    assert table.to_dict("records") == [
        {"id": made["a"], "method": "learned", "lr": "0.02", "OOD accuracy": "65.0%"},
        {"id": made["c"], "method": "top-movement", "lr": "", "OOD accuracy": ""}]
    assert list(runs.runs_table([], None).columns) == runs.RUNS_COLUMNS  # nothing chosen yet: the default set
    link = runs.runs_table([rows[made["a"]]], ["link"]).to_dict("records")[0]["link"]
    assert link == f"?run={made['a']}"
    side = runs.side_by_side(list(rows.values()), [made["b"], "nope", made["a"]], ["accuracy", "seed"])
    assert list(side.columns) == ["column", made["b"], made["a"]]  # the runs picked side by side, in picked order
    assert side.to_dict("records") == [{"column": "seed", made["b"]: "1", made["a"]: "0"},
                                       {"column": "accuracy", made["b"]: "80.0%", made["a"]: "70.0%"}]


def test_the_csv_holds_the_region_files_numbers_one_row_per_run(made):
    """The CSV of two runs, read back by pandas: their ids and the numbers their files and score logs hold (a share
    as a fraction, not '70.0%'), in a fresh file of the session's downloads folder."""
    import pandas as pd

    from graftui.ui import runs, store

    rows = {r["id"]: r for r in runs.runs()}
    two = [rows[made["a"]], rows[made["c"]]]
    path = runs.export_csv(two, ["model pair", "k (params)", "share of graftable", "lr", "accuracy", "ECE ↓",
                                 "OOD accuracy", "curve", "tags"])
    assert path.parent == store.downloads_dir() and path.name.startswith("graftui-runs-") and path.suffix == ".csv"
    again = runs.export_csv(two, ["accuracy"])
    assert again != path and path.exists()  # a fresh file each time
    frame = pd.read_csv(path)
    assert list(frame.columns) == ["id", "base", "finetuned", "k", "share_of_graftable", "lr", "accuracy", "ece",
                                   "ood_accuracy", "curve", "tags"]
    assert list(frame["id"]) == [made["a"], made["c"]] and len(frame) == 2
    for (_, got), key in zip(frame.iterrows(), "ac"):
        meta = store.read_region_header(store.region_path(made[key])).meta
        assert got["k"] == meta.k == (20 if key == "a" else 30)
        assert got["share_of_graftable"] == pytest.approx(meta.k / meta.graftable_params)
        assert got["base"] == meta.base and got["finetuned"] == meta.finetuned
    assert frame["accuracy"].tolist() == [0.70, 0.60] and frame["ece"].tolist() == pytest.approx([0.10, 0.30])
    assert frame["lr"].iloc[0] == 0.02 and pd.isna(frame["lr"].iloc[1])  # top movement learns nothing
    assert frame["ood_accuracy"].iloc[0] == pytest.approx(0.65) and pd.isna(frame["ood_accuracy"].iloc[1])
    assert frame["accuracy"].dtype.kind == "f" and frame["curve"].tolist() == [True, False]
    with pytest.raises(RequestError, match="no run to export"):
        runs.export_csv([], None)
    hostile = {**rows[made["a"]], "note": "=HYPERLINK(\"http://x\")", "tags": ["+1", "@me"]}  # typed in the app
    cells = pd.read_csv(runs.export_csv([hostile], ["note", "tags", "k (params)"]), dtype=str).iloc[0]
    assert cells["note"] == "'=HYPERLINK(\"http://x\")" and cells["tags"].startswith("'+1"), cells  # read as text
    assert cells["k"] == "20"  # numbers as they are
    assert [r["id"] for r in runs.exported(scope="picked", picked=[made["c"], "nope", made["a"]])] == \
        [made["c"], made["a"]]  # the runs picked, in the order picked
    assert [r["id"] for r in runs.exported("learned", "k", False)] == [r["id"] for r in runs.shown(
        runs.runs(), "learned", "k", False)] and len(runs.exported("learned")) == 3  # the runs shown
    with pytest.raises(RequestError, match="no run picked"):
        runs.exported(scope="picked", picked=["nope"])


def test_the_scatter_draws_one_point_per_run_at_its_metric_and_size(made):
    from graftui.ui import runs

    rows = runs.runs()
    fig = runs.runs_scatter(rows, "k", "accuracy", "method")
    drawn = {(t.name, cd[0]): (x, y) for t in fig.data for x, y, cd in zip(t.x, t.y, t.customdata)}
    assert drawn == {("method: learned", made["a"]): (20, 0.70), ("method: learned", made["b"]): (20, 0.80),
                     ("method: top-movement", made["c"]): (30, 0.60)}  # d was never scored: counted, not drawn
    assert "1 run(s) without both not drawn" in fig.layout.title.text and fig.layout.xaxis.type == "log"
    assert all("%{customdata[0]}" in t.hovertemplate for t in fig.data)  # hover names the run
    steps = runs.runs_scatter(rows, "steps", "ece", "method")
    assert sorted((cd[0], x, y) for t in steps.data for x, y, cd in zip(t.x, t.y, t.customdata)) == \
        sorted([(made["a"], 10, 0.10), (made["b"], 10, 0.20)])  # top movement has no steps
    share = runs.runs_scatter(rows, "share_of_graftable", "accuracy", "task")
    assert len(share.data) == 1 and len(share.data[0].x) == 3 and share.data[0].name == "task: movies"
    for bad in (("k", "note", "method"), ("lr", "accuracy", "method"), ("k", "accuracy", "colour")):
        empty = runs.runs_scatter(rows, *bad)  # a choice the page does not offer: said, never raised
        assert not empty.data and "Pick an x axis" in empty.layout.annotations[0].text
    empty = runs.runs_scatter([rows[i] for i in range(len(rows)) if rows[i]["id"] == made["d"]], "k", "accuracy")
    assert not empty.data and "None of the 1 run(s) shown has both" in empty.layout.annotations[0].text
    assert "No run is shown" in runs.runs_scatter([], "k", "accuracy").layout.annotations[0].text


def test_a_run_s_link_opens_it_and_an_unknown_or_hostile_id_gets_one_line(made):
    from graftui.ui import runs

    assert runs.linked_run(made["b"]) == made["b"] and runs.linked_run(f" {made['b']} ") == made["b"]
    assert runs.run_link(made["b"]) == f"?run={made['b']}"
    line = runs.links_line([made["a"], made["b"]])
    assert f"]({runs.run_link(made['a'])})" in line and line.count("](?run=") == 2
    for bad in ("no-such-run", "../../etc/passwd", "<img src=x onerror=alert(1)>**x**", "x" * 5000, "", None, ["a"]):
        with pytest.raises(RegionError) as info:
            runs.linked_run(bad)
        text = str(info.value)
        assert "the link names no run of this page" in text and "nothing was picked" in text, text
        assert "\n" not in text and "<" not in text and "*" not in text and "/" not in text.split("'")[1], text
        assert len(text) < 250, text


def test_a_hosted_session_s_csv_is_written_in_its_own_folder(home, monkeypatch):
    """The CSV goes to a fresh file the server names in the session's own downloads folder, never elsewhere; a page
    without a live session writes nothing."""
    from graftui import settings
    from graftui.ui import runs, store

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    pair, _, _ = make_tiny_pair()
    mine = store.new_session()
    with store.session(mine):
        _save(pair, "my-run", 0, 10)
        rows = runs.runs()
        path = runs.export_csv(rows, ["k (params)"])
        assert path.parent == store.downloads_dir() and path.is_relative_to(settings.workspace())
        assert path.read_text().splitlines() == ["id,k", f"{rows[0]['id']},10"]
    with store.session("not-a-session"):
        with pytest.raises(SessionError, match="reload the page"):
            runs.export_csv(rows, None)
