"""--report-to: each tracker's own library holds what the region's JSON says, read back through that library."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from cli_util import refused, run_cli
from test_learner_plan import localize_args, tiny_folders  # noqa: F401 - the fixture, used by name


def localized(folders, out: Path, to: str, *more) -> dict:
    """A tiny localization reported to ``to``: its result as --json prints it (the region's own JSON inside)."""
    code, text, err = run_cli(*localize_args(folders, out, "--steps", "6", "--check-n", "24", "--report-to", to,
                                             "--json", *more))
    assert code == 0, err
    doc = json.loads(text)  # the tracker's own messages stay off stdout
    assert doc["meta"]["tracker"]["report_to"] == to
    assert any(n.startswith("reported to ") and f"'{out.stem}'" in n for n in doc["notes"]), doc["notes"]
    return doc


def expected(doc: dict) -> tuple[dict, dict]:
    """What the tracker must hold: the curve per step ({step: (loss, accuracy)}, as the region file rounds them), and
    the held-out check's rows and paired differences, by their flat names."""
    from graftui.tracking import key

    curve = {step: (loss, accuracy) for step, loss, accuracy in doc["meta"]["curve"]}
    final = {}
    for row in doc["check"]["rows"]:
        for metric in ("accuracy", "f1", "ece"):
            final[key("check", row["task"], row["distribution"], row["model"], metric)] = row[metric]
    for d in doc["check"]["differences"]:
        base = key("check", "diff", f"{d['a']} - {d['b']}", d["task"], d["distribution"], d["metric"])
        final[f"{base}/diff"], (final[f"{base}/ci_low"], final[f"{base}/ci_high"]) = d["diff"], d["ci"]
    assert len(curve) == 6 and final
    return curve, final


def same_curve(curve: dict, logged: dict) -> None:
    """Each step's loss and accuracy, to the digit the region file keeps (the tracker holds them unrounded)."""
    assert {s: (round(logged[s]["mask/loss"], 6), round(logged[s]["mask/accuracy"], 4)) for s in curve} == curve


def test_trackio_holds_the_regions_curve_metrics_card_and_files(tiny_folders, tmp_path):
    doc = localized(tiny_folders, tmp_path / "tk.safetensors", "trackio")
    from trackio.sqlite_storage import SQLiteStorage

    assert doc["meta"]["tracker"]["where"] == str(__import__("trackio").utils.TRACKIO_DIR)
    logs = SQLiteStorage.get_logs("graftui", "tk")
    by_step = {entry["step"]: entry for entry in logs}
    curve, final = expected(doc)
    same_curve(curve, by_step)
    last = by_step[max(by_step)]
    assert {name: last[name] for name in final} == final  # exactly the JSON's values
    config = SQLiteStorage.get_run_config("graftui", "tk")
    assert config["report_to"] == "trackio" and config["steps"] == 6 and config["verb"] == "localize"
    assert "card" in last


def test_a_seeds_run_is_a_group_of_one_run_per_seed(tiny_folders, tmp_path):
    doc = localized(tiny_folders, tmp_path / "sd.safetensors", "trackio", "--seeds", "0,1")
    from trackio.sqlite_storage import SQLiteStorage

    names = {Path(s["path"]).stem for s in doc["seeds"]}
    assert names == {"sd-seed0", "sd-seed1"}
    for name in names:
        logs = SQLiteStorage.get_logs("graftui", name)
        assert [e["step"] for e in logs if "mask/loss" in e] == list(range(1, 7))
    records = {r["name"]: r for r in SQLiteStorage.get_run_records("graftui")}
    assert names | {"sd"} <= set(records)
    assert any("group 'sd'" in n for n in doc["notes"])


def test_tensorboard_event_files_hold_the_same_values(tiny_folders, tmp_path, own_home):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    doc = localized(tiny_folders, tmp_path / "tb.safetensors", "tensorboard")
    folder = own_home / "tensorboard" / "tb"
    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    value = lambda tag: {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)}  # noqa: E731
    curve, final = expected(doc)
    loss, accuracy = value("mask/loss"), value("mask/accuracy")
    same_curve(curve, {s: {"mask/loss": loss[s], "mask/accuracy": accuracy[s]} for s in loss})
    assert {name: value(name)[7] for name in final} == final
    assert (folder / "tb.safetensors").is_file() and (folder / "tb.zip").is_file()


@pytest.mark.e2e  # importing MLflow asks the platform in a subprocess
def test_mlflow_file_store_holds_the_same_values(tiny_folders, tmp_path, own_home, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow)")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    doc = localized(tiny_folders, tmp_path / "ml.safetensors", "mlflow")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=doc["meta"]["tracker"]["where"])
    experiment = client.get_experiment_by_name("graftui")
    (run,) = client.search_runs([experiment.experiment_id], "tags.mlflow.runName = 'ml'")
    history = lambda name: {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}  # noqa: E731
    curve, final = expected(doc)
    loss, accuracy = history("mask/loss"), history("mask/accuracy")
    same_curve(curve, {s: {"mask/loss": loss[s], "mask/accuracy": accuracy[s]} for s in loss})
    assert {name: run.data.metrics[name] for name in final} == final
    assert run.data.params["report_to"] == "mlflow"
    files = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"ml.safetensors", "ml.zip", "card.md", "request.json"} <= files


def wandb_records(path: Path):
    """The records of a W&B run file (its LevelDB-style log of protobuf records), read with W&B's own protobufs
    (its checksums unchecked: W&B's own writer made the file)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    offset, pending = 7, b""  # the file's header: 'W&B' magic, key and version
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a record header is padding
            offset += block - offset % block
            continue
        checksum, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
        if length == 0 and kind == 0:
            break
        chunk = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        pending += chunk
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


@pytest.mark.e2e  # W&B's library runs its own service process
def test_wandb_offline_run_files_hold_the_same_values(tiny_folders, tmp_path, own_home, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    doc = localized(tiny_folders, tmp_path / "wb.safetensors", "wandb")
    (folder,) = (own_home / "wandb" / "wandb").glob("offline-run-*")
    history, summary, names = {}, {}, []
    for record in wandb_records(next(folder.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history[items["_step"]] = items
        elif kind == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "run":
            names.append(record.run.display_name)
    assert names[0] == "wb"
    curve, final = expected(doc)
    same_curve(curve, history)
    assert {name: summary[name] for name in final} == final
    assert (folder / "files" / "wb.safetensors").is_file() and (folder / "files" / "wb.zip").is_file()


def test_a_tracker_not_installed_is_refused_in_one_line_before_any_work(tiny_folders, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)  # as if it were not installed
    out = tmp_path / "none.safetensors"
    refused(localize_args(tiny_folders, out, "--report-to", "trackio"),
            "--report-to trackio: Trackio's library is not installed; pip install trackio (or give --report-to none)")
    assert not out.exists()


def test_a_tracker_that_cannot_start_is_refused_in_one_line(tiny_folders, tmp_path, home):
    pytest.importorskip("tensorboard")
    home.mkdir(parents=True, exist_ok=True)
    (home / "tensorboard").write_text("a file where its folder goes")
    out = tmp_path / "x.safetensors"
    code, text, err = run_cli(*localize_args(tiny_folders, out, "--report-to", "tensorboard"))
    assert (code, text, len(err.strip().splitlines())) == (2, "", 1), err
    assert err.startswith("graftui: error: --report-to tensorboard: TensorBoard cannot start (") and \
        err.strip().endswith("; fix it, or give --report-to none") and not out.exists()


def test_the_apps_setting_reports_an_app_job(tiny_folders, home):
    from graftui.ui import forms, store

    from trackio.sqlite_storage import SQLiteStorage

    base, ft, task = tiny_folders
    store.set_report_to("trackio")
    try:
        runner = store.runner()
        job = forms.submit_localize(runner, base=str(base), finetuned=str(ft), task=str(task), columns={},
                                    method="learned", log_sparsity=-2, steps=6, examples_per_class=8, lr=0.05)
        done = runner.wait(job.id, timeout=300)
    finally:
        store.set_report_to("none")
    assert done.status == "done", done.error
    name = done.result["region"]
    assert done.result["request"]["report_to"] == "trackio"
    curve = {step: (loss, acc) for step, loss, acc in done.result["meta"]["curve"]}
    same_curve(curve, {e["step"]: e for e in SQLiteStorage.get_logs("graftui", name)})
