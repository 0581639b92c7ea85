"""``--report FILE`` follows the rule of every file graftui writes: it never replaces an existing file without
--overwrite, never goes over the command's own --out, and is written whole or not at all, so two runs writing one
report at once leave one whole report and one refusal. Tiny config-built models: each case runs in seconds."""

from __future__ import annotations

import json
import threading
import zipfile

import pytest

from cli_util import refused, run_cli
from lm_util import write_completion_task, write_lm_pair

import graftui
from graftui import bundle, flows, regions
from graftui.errors import GraftuiError
from graftui.flows import common
from graftui.requests import AnatomyRequest


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny GPT-2 pair, a completion task and a region of it (top movement: no training)."""
    root = tmp_path_factory.mktemp("reports")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(root / "home"))
        base, ft = write_lm_pair(root, "gpt2")
        task = write_completion_task(root / "opposites.csv")
        localize = ["localize", "--base", base, "--finetuned", ft, "--task", task, "--head", "completion",
                    "--method", "top-movement", "--sparsity", "0.05", "--check-n", "0"]
        code, _, err = run_cli(*localize, "--out", root / "r.safetensors")
        assert code == 0, err
        yield {"root": root, "region": root / "r.safetensors", "localize": localize, "pair": (base, ft, task),
               "evaluate": ["evaluate", "--region", root / "r.safetensors", "--n", "8"]}


@pytest.fixture
def no_work(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the verb ran before the report's place was checked")

    monkeypatch.setattr(flows, "run", refuse)


def test_an_existing_file_is_never_replaced_by_a_report_and_the_refusal_comes_before_any_work(setup, tmp_path,
                                                                                              no_work):
    zipped, doc = tmp_path / "precious.zip", tmp_path / "precious.json"
    for path in (zipped, doc):
        path.write_text("precious\n")
    refused([*setup["evaluate"], "--report", zipped],
            f"'{zipped}' exists: give another --report path, or --overwrite to replace it")
    refused([*setup["localize"], "--out", tmp_path / "r2.safetensors", "--report", doc],
            f"'{doc}' exists: give another --report path, or --overwrite to replace it")
    assert zipped.read_text() == doc.read_text() == "precious\n"
    assert not (tmp_path / "r2.safetensors").exists()


def test_a_report_never_takes_a_region_files_name(setup, tmp_path, no_work):
    other = tmp_path / "other_region.safetensors"
    other.write_bytes(setup["region"].read_bytes())
    line = (f"'{other}' is a region file's name, and a report is JSON (or a .zip bundle): give --report a .json or "
            ".zip path")
    refused([*setup["evaluate"], "--report", other], line)
    refused([*setup["evaluate"], "--report", other, "--overwrite"], line)
    assert other.read_bytes() == setup["region"].read_bytes()


def test_a_report_never_goes_over_the_commands_own_out_even_with_overwrite(setup, tmp_path, no_work):
    out = tmp_path / "x.zip"
    line = f"'{out}' is this command's --out, where its result goes: give --report another path"
    refused([*setup["localize"], "--out", out, "--report", out], line)
    refused([*setup["localize"], "--out", out, "--report", out, "--overwrite"], line)
    assert not out.exists()


def test_overwrite_replaces_an_existing_report_for_a_verb_without_an_out_and_for_localize(setup, tmp_path):
    doc, zipped = tmp_path / "old.json", tmp_path / "old.zip"
    for path in (doc, zipped):
        path.write_text("old\n")
    code, _, err = run_cli(*setup["evaluate"], "--report", doc, "--overwrite")
    assert code == 0, err
    assert json.loads(doc.read_text())["request"]["verb"] == "evaluate"
    code, _, err = run_cli(*setup["localize"], "--out", tmp_path / "r2.safetensors", "--report", zipped, "--overwrite")
    assert code == 0, err
    assert regions.load(tmp_path / "r2.safetensors").size > 0
    with zipfile.ZipFile(zipped) as zf:
        assert json.loads(zf.read("old/request.json"))["verb"] == "localize"
    code, _, err = run_cli("run", doc, "--report", doc, "--overwrite")  # 'run' passes --overwrite to the report
    assert code == 0, err
    assert json.loads(doc.read_text())["request"]["verb"] == "evaluate"
    refused(["run", doc, "--overwrite"], "--overwrite: 'evaluate' never replaces what it writes; drop --overwrite")


def test_a_report_is_never_written_over_a_file_its_own_run_wrote(setup, tmp_path):
    """Where --out was not given (a new file under $GRAFTUI_HOME) the write itself refuses, the region kept."""
    base, ft, task = setup["pair"]
    result = graftui.localize(base=str(base), finetuned=str(ft), task=str(task), head="completion",
                              method="top-movement", sparsity=0.05, check_n=0)
    kept = open(result.path, "rb").read()
    for overwrite in (False, True):
        with pytest.raises(GraftuiError, match="is this command's --out, where its result goes"):
            result.write_report(result.path, overwrite=overwrite)
    assert open(result.path, "rb").read() == kept


@pytest.mark.parametrize("suffix", [".json", ".zip"])
def test_two_writes_of_one_report_at_once_leave_one_whole_report_and_one_refusal(setup, tmp_path, monkeypatch,
                                                                                 suffix):
    """Both runs pass the check (the file is not there yet) and write at once: the file system decides, one wins."""
    path = tmp_path / f"same{suffix}"
    both = threading.Barrier(2)
    for module in (common, bundle):
        real = module.atomic_write

        def slow(target, write, exclusive=False, real=real):
            return real(target, lambda tmp: (write(tmp), both.wait(timeout=30)), exclusive=exclusive)

        monkeypatch.setattr(module, "atomic_write", slow)
    results = [common.Result(AnatomyRequest(region=str(setup["region"])), notes=[f"run {i}"]) for i in range(2)]
    outcomes = [None, None]

    def write(i):
        try:
            results[i].write_report(path)
            outcomes[i] = "written"
        except Exception as err:  # noqa: BLE001 - the refusal is what is checked
            outcomes[i] = err

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(map(str, outcomes)).count("written") == 1, outcomes
    (err,) = [o for o in outcomes if o != "written"]
    assert isinstance(err, GraftuiError) and str(err).splitlines() == [
        f"'{path}' exists: give another --report path, or --overwrite to replace it"]
    winner = outcomes.index("written")
    if suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            assert zf.testzip() is None
            result = json.loads(zf.read("same/result.json"))
    else:
        result = json.loads(path.read_text())["result"]
    assert result["notes"] == [f"run {winner}"]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
