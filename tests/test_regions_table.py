"""The regions table: the score log beside the regions (latest wins, shared by one content, gone with its files),
what `graftui evaluate` writes into it, the `graftui runs` verb over it, and the Regions tab's table and plot."""

from __future__ import annotations

import contextlib
import io
import json
import threading

import pytest

from conftest import make_tiny_pair
from graftui import regions


def _record(pair, k: int, method: str = "top-movement", task: str = "movies"):
    from graftui.localizers import Budget, run_method

    region, _ = run_method(pair, Budget(k=k), method)
    return regions.with_patch(pair, regions.make_record(pair, region, {"method": method, "task": task}))


def _entry(record, accuracy: float, when: str, **more) -> dict:
    return {"digest": regions.digest(record.indices), "task": "movies", "accuracy": accuracy, "ece": 0.1,
            "share_of_ft": 0.5, "n": 64, "when": when, **more}


def test_the_score_log_keeps_each_regions_latest_entry_and_forgets_deleted_regions(home):
    from graftui.ui import library, store
    from graftui.ui.tabs import regions as tab

    pair, _, _ = make_tiny_pair()
    a, b = _record(pair, 20), _record(pair, 30, method="random")
    a1, a2, other = store.save_region(a, "a-one"), store.save_region(a, "a-two"), store.save_region(b, "b")
    folder = store.regions_dir()
    da, db = regions.digest(a.indices), regions.digest(b.indices)
    assert da != db
    first = _entry(a, 0.61, "2024-01-01T10:00:00Z")
    latest = _entry(a, 0.72, "2024-01-01T11:00:00Z", ft_accuracy=0.8)
    assert regions.note_scores(folder, [first]) == folder / regions.SCORES_FILE
    regions.note_scores(folder, [latest])
    regions.note_scores(folder, [_entry(a, 0.10, "2024-01-01T09:00:00Z")])  # scored before the one kept: ignored
    assert regions.latest_scores(folder) == {da: {**latest, "ft_accuracy": 0.8}}  # one row for both files of a
    rows = {r["id"]: r for r in library.regions_listing()}
    assert set(rows) == {a1.stem, a2.stem, other.stem}
    for stem in (a1.stem, a2.stem):
        assert (rows[stem]["accuracy"], rows[stem]["ece"], rows[stem]["share_of_ft"], rows[stem]["n"],
                rows[stem]["scored"], rows[stem]["digest"]) == (0.72, 0.1, 0.5, 64, "2024-01-01T11:00:00Z", da)
    assert rows[other.stem]["accuracy"] is None and rows[other.stem]["k"] == 30
    table, figure, _ = tab.render_table("", "", False)
    assert list(table.columns) == library.REGIONS_COLUMNS
    shown = {r["id"]: r for r in table.to_dict("records")}
    assert shown[a1.stem]["accuracy"] == "72.0%" and shown[a1.stem]["share of FT gain"] == "50.0%"
    assert shown[a1.stem]["ECE ↓"] == "0.100" and shown[a1.stem]["created (UTC)"] == a.meta.created.replace("T", " ")[:16]
    assert shown[other.stem]["accuracy"] == "" and shown[other.stem]["k (params)"] == "30"
    # the plot: one line (top-movement on movies) through the two files of a, and FT's accuracy as the reference
    (line,) = figure.data
    assert list(line.y) == [0.72, 0.72] and line.name.endswith("· movies · top-movement")
    assert [s.y0 for s in figure.layout.shapes] == [0.8]
    # the filter's words and the sort picked
    assert list(tab.render_table("RANDOM 30", "", False)[0]["id"]) == [other.stem]
    assert list(tab.render_table("", "k", True)[0]["id"])[0] == other.stem
    assert list(tab.render_table("", "accuracy", False)[0]["id"])[-1] == other.stem  # unscored: last either way
    # a deleted region leaves the table; its scores go once no file holds that region
    store.delete_region(a1.stem)
    assert da in regions.latest_scores(folder) and [r["id"] for r in library.regions_listing() if r["digest"] == da] == [a2.stem]
    store.delete_region(a2.stem)
    assert regions.latest_scores(folder) == {} and [r["id"] for r in library.regions_listing()] == [other.stem]
    assert list(tab.render_table("", "", False)[0]["id"]) == [other.stem]


def test_the_score_log_survives_a_damaged_file_and_two_writers(home, tmp_path):
    folder = tmp_path / "regions"
    folder.mkdir()
    (folder / regions.SCORES_FILE).write_text("{not json")
    assert regions.latest_scores(folder) == {}
    with pytest.raises(ValueError, match="content id"):
        regions.note_scores(folder, [{"task": "movies"}])

    def write(w: int) -> None:
        for i in range(15):
            regions.note_scores(folder, [{"digest": f"{w}-{i}", "task": "t", "accuracy": i / 15, "ece": None,
                                          "share_of_ft": None, "n": 8, "when": f"2024-01-01T00:00:{i:02d}Z"}])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log = regions.latest_scores(folder)
    assert set(log) == {f"{w}-{i}" for w in range(2) for i in range(15)}
    assert log["1-14"]["accuracy"] == 14 / 15 and log["0-3"]["n"] == 8
    assert [p.name for p in folder.iterdir() if ".tmp-" in p.name] == []  # nothing half-written left behind
    json.loads((folder / regions.SCORES_FILE).read_text())


def test_a_hosted_session_keeps_its_scores_in_its_own_workspace(home, monkeypatch):
    from graftui.ui import store

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    gallery_file = store.gallery_dir() / "shared.safetensors"
    sid = store.new_session()
    with store.session(sid):
        assert regions.score_folder(gallery_file) == store.sessions_dir() / sid / "regions"
    monkeypatch.delenv("GRAFTUI_HOSTED")
    assert regions.score_folder(gallery_file) == store.gallery_dir().resolve()


# -- evaluate writes the log; `graftui runs` reads it ---------------------------------------------
def _cli(*args) -> tuple[int, str, str]:
    from graftui import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _one_line(code: int, out: str, err: str, *needles: str) -> None:
    assert (code, out) == (2, ""), (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graftui: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_evaluate_records_its_scores_and_the_runs_verb_lists_filters_and_sorts_them(home, tmp_path):
    from graftui import flows
    from graftui.localizers import Budget, run_method
    from graftui.errors import RequestError
    from graftui.requests import EvaluateRequest, RegionsRequest
    from lm_util import make_tokenizer

    from conftest import make_tiny_bert, make_tiny_finetuned

    tokenizer = make_tokenizer(tmp_path / "base")
    base = make_tiny_bert(vocab_size=len(tokenizer))
    for name, model in (("base", base), ("ft", make_tiny_finetuned(base))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    task = tmp_path / "reviews.csv"
    task.write_text("text,label\n" + "".join(f"a {('good', 'bad')[i % 2]} film {i},{1 - i % 2}\n" for i in range(60)))
    pair = flows.load_pair(str(tmp_path / "base"), str(tmp_path / "ft"))
    folder = tmp_path / "mine"
    files = {}
    for k, method in ((40, "random"), (400, "top-movement")):
        record = regions.make_record(pair, run_method(pair, Budget(k=k), method)[0],
                                     {"method": method, "task": str(task)})
        files[method] = regions.save(regions.with_patch(pair, record), folder / f"{method}.safetensors")
    try:
        result = flows.evaluate(EvaluateRequest.make(regions=[str(p) for p in files.values()], n=16))
    finally:
        flows.clear_cache()
    log = regions.latest_scores(folder)
    ft = next(r["accuracy"] for r in result.rows if r["model"] == "fine-tuned")
    for method, path in files.items():
        row = next(r for r in result.rows if r["model"] == method and r["distribution"] == "in")
        entry = log[regions.digest(regions.load(path).indices)]
        assert {k: entry[k] for k in ("task", "accuracy", "ece", "share_of_ft", "n", "region", "ft_accuracy")} == {
            "task": "reviews.csv", "accuracy": row["accuracy"], "ece": row["ece"], "share_of_ft": row["gain_recovered"],
            "n": row["n"], "region": path.name, "ft_accuracy": ft}
        assert row["n"] == 12  # every test example of the small file (16 asked)

    code, out, err = _cli("runs", "--folder", folder, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["total"] == 2 and doc["folder"] == str(folder)
    by_id = {r["id"]: r for r in doc["regions"]}
    assert set(by_id) == {"random", "top-movement"}
    for method, r in by_id.items():
        assert (r["method"], r["task"], r["finetuned"], r["base"]) == (method, str(task), str(tmp_path / "ft"),
                                                                       str(tmp_path / "base"))
        assert r["accuracy"] == log[r["digest"]]["accuracy"] and r["scored_task"] == "reviews.csv" and r["n"] == 12
        assert r["k"] == (40 if method == "random" else 400) and r["steps"] is None and r["seed"] is None
        assert r["share_of_graftable"] == pytest.approx(r["k"] / pair.counts()["graftable"])
    def ids(**given) -> list[str]:
        return [r["id"] for r in flows.run(RegionsRequest.make(folder=str(folder), **given)).regions]

    assert ids(sort="k") == ["random", "top-movement"] and ids(sort="k", descending=True) == ["top-movement", "random"]
    assert ids(method="random") == ["random"]
    assert ids(task="reviews", finetuned="ft", sort="id") == ["random", "top-movement"]
    accuracies = [by_id[i]["accuracy"] for i in ids(task=str(task), sort="accuracy", descending=True)]
    assert len(accuracies) == 2 and accuracies == sorted(accuracies, reverse=True)
    with pytest.raises(RequestError, match=r"^--task 'movies': no saved region in .* has it; choose from reviews.csv$"):
        ids(task="movies")
    code, out, err = _cli("runs", "--folder", folder)
    assert code == 0 and out.splitlines()[0].split()[:4] == ["id", "base", "fine-tuned", "task"], out
    assert any(line.startswith("random ") and "reviews" in line and "40" in line for line in out.splitlines()), out
    assert "2 of 2 region(s)" in out and "2 scored" in out
    _one_line(*_cli("runs", "--folder", folder, "--method", "learned"), "--method 'learned'", "choose from random, top-movement")
    _one_line(*_cli("runs", "--folder", folder, "--sort", "speed"), "--sort", "invalid choice: 'speed'")
    _one_line(*_cli("runs", "--folder", tmp_path / "nowhere"), "is not a folder")
