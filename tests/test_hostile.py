"""Hostile input through every front end: the CLI in-process, and the app over its HTTP API in hosted mode.

The app is launched in this process with ``GRAFTUI_HOSTED=1`` and driven with ``gradio_client``,
as a stranger would drive a public Space: each call names its session id (issued by the page's
load event), uploads go through Gradio's upload route, and forged values reach Gradio's own
input checks. Every case must answer with one clear line (``graftui: error: …`` in the CLI, a
``⚠️ …`` status line in the app), never a traceback, and lose nothing: refused uploads are
deleted, existing files stay as they were, no job is queued, no other session is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from browser_util import free_port
from cli_util import run_cli
from conftest import make_tiny_pair

pytestmark = pytest.mark.e2e

WARN = "⚠️ "


# -- the two front ends ------------------------------------------------------------------------------
def cli_refuses(args, needle: str, planned: bool = False) -> str:
    """The command refuses in one line; ``planned``: mask learning had begun, so the plan's line came before it."""
    code, out, err = run_cli(*args)
    assert code == 2, (args, code, out, err)
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    if planned:
        plan = lines.pop(0)
        assert plan.startswith("mask learning: ") and "expected peak" in plan, err
    assert len(lines) == 1 and lines[0].startswith("graftui: error: "), err
    assert needle.lower() in lines[0].lower(), (needle, lines[0])
    print(f"[hostile] CLI {' '.join(map(str, args))[:80]} → {lines[0]}")
    return lines[0]


@dataclass
class Server:
    url: str
    client: object
    home: Path
    uploads: Path  # Gradio's upload folder

    def call(self, api: str, *args):
        return self.client.predict(*args, api_name=api)

    def raw_error(self, api: str, data: list) -> str:
        """POST ``data`` as it is (no client-side upload of the files it names); the error the server answers."""
        import urllib.request

        req = urllib.request.Request(f"{self.url}gradio_api/call{api}", data=json.dumps({"data": data}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            event = json.loads(resp.read())["event_id"]
        with urllib.request.urlopen(f"{self.url}gradio_api/call{api}/{event}", timeout=60) as resp:
            stream = resp.read().decode()
        assert "event: error" in stream and "Traceback" not in stream, stream
        line = next(line for line in stream.splitlines() if line.startswith("data:"))[5:].strip()
        print(f"[hostile] app {api} (raw request) → (Gradio) {line[:160]}")
        return line

    def session(self) -> str:
        _, sid = self.call("/on_load", "")
        return sid

    def refuses(self, api: str, args, needle: str) -> str:
        """The call answers with one warning line containing ``needle`` (Gradio's own checks raise
        an error whose message must then name the problem)."""
        from gradio_client.exceptions import AppError

        try:
            out = self.call(api, *args)
        except AppError as err:
            text = str(err)
            assert "Traceback" not in text and needle.lower() in text.lower(), (needle, text)
            print(f"[hostile] app {api} → (Gradio) {text.splitlines()[0][:160]}")
            return text.splitlines()[0]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        warnings = [o for o in outs if isinstance(o, str) and o.startswith(WARN)]
        # one message, in the banner and (for a button's handler) again beside the button
        assert len(set(warnings)) == 1 and len(warnings) <= 2, (api, out)
        line = warnings[0]
        assert "\n" not in line.strip() and "Traceback" not in line, line
        assert needle.lower() in line.lower(), (needle, line)
        print(f"[hostile] app {api} → {line}")
        return line


@contextlib.contextmanager
def hosted(root: Path, home: Path | None = None):
    """The app served in hosted mode from this process (``home``: its GRAFTUI_HOME, by default a fresh one)."""
    from gradio_client import Client

    from graftui import flows
    from graftui.ui import app, forms, store

    home = home or root / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(home))
        mp.setenv("GRAFTUI_HOSTED", "1")
        mp.setenv("GRAFTUI_FAST", "1")
        mp.setenv("GRADIO_TEMP_DIR", str(root / "gradio"))
        mp.setattr(store, "_runner", None)
        mp.setattr(forms, "submit_prepare", lambda runner: None)  # no default fine-tune in the background
        demo = app.build_app()
        demo.queue(default_concurrency_limit=4)
        _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True,
                                **app.launch_options())
        try:
            yield Server(url, Client(url, verbose=False, download_files=False), home, root / "gradio")
        finally:
            demo.close()
            flows.clear_cache()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with hosted(tmp_path_factory.mktemp("hosted")) as s:
        yield s


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Hostile files, made once."""
    from safetensors.torch import save_file

    from graftui import regions

    d = tmp_path_factory.mktemp("hostile")
    f = {}
    (d / "empty.csv").write_bytes(b"")
    (d / "latin1.csv").write_bytes("text,label\ncaf\xe9 tr\xe8s bien,1\n".encode("latin-1") + b"\xff\xfe\x00bad,0\n")
    (d / "broken.jsonl").write_text('{"text": "good", "label": 1}\n{"text": "bad", "lab\n')
    (d / "fake.parquet").write_bytes(b"PAR1 this is not parquet at all")
    (d / "pickle.csv").write_bytes(pickle.dumps({"text": ["a"], "label": [1]}))
    (d / "header.csv").write_text("text,label\n")
    (d / "model.pkl").write_bytes(pickle.dumps([1, 2, 3]))
    (d / "good.csv").write_text("text,label\n" + "".join(f"sentence number {i},{i % 2}\n" for i in range(40)))
    f.update({p.stem: p for p in d.iterdir()})

    pair, _, _ = make_tiny_pair()
    from graftui.localizers import Budget, run_method

    region, _ = run_method(pair, Budget(k=20), "top-movement")
    record = regions.with_patch(pair, regions.make_record(pair, region, {"method": "top-movement", "task": "movies"}))
    f["region"] = regions.save(record, d / "good.safetensors")
    nan = regions.RegionRecord(record.indices, record.shapes, dict(record.meta),
                               {n: torch.full_like(v, float("nan")) for n, v in record.values.items()}, record.head)
    f["nan"] = regions.save(nan, d / "nan.safetensors")

    def edited(name: str, change) -> Path:
        from safetensors import safe_open

        with safe_open(str(f["region"]), framework="pt") as fh:
            meta, tensors = dict(fh.metadata()), {k: fh.get_tensor(k) for k in fh.keys()}
        change(meta)
        save_file(tensors, str(d / name), metadata=meta)
        return d / name

    def inflate(meta):
        shapes = json.loads(meta["shapes"])
        first = next(iter(shapes))
        shapes[first] = [10**6, 10**6]
        meta["shapes"] = json.dumps(shapes)

    f["inflated"] = edited("inflated.safetensors", inflate)
    f["k_lie"] = edited("k-lie.safetensors", lambda m: m.update(meta=json.dumps({**json.loads(m["meta"]), "k": 5})))
    f["no_tag"] = edited("no-tag.safetensors", lambda m: m.pop("graftui_format"))
    f["digest_lie"] = edited("digest-lie.safetensors", lambda m: m.update(region_digest="0badc0de"))
    (d / "random.safetensors").write_bytes(os.urandom(256))
    (d / "pickled.safetensors").write_bytes(pickle.dumps({"idx": [1, 2]}))
    f["random"], f["pickled"] = d / "random.safetensors", d / "pickled.safetensors"
    pickle_model = d / "pickle-model"
    pickle_model.mkdir()
    (pickle_model / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (pickle_model / "pytorch_model.bin").write_bytes(pickle.dumps("never unpickled"))
    f["pickle_model"] = pickle_model
    return f


def upload(path):
    from gradio_client import handle_file

    return handle_file(str(path))


def own_jobs(sid: str) -> list:
    from graftui.ui import store

    return [j for j in store.runner().runner.jobs() if j.owner == sid]


def release(gate: threading.Event, blocker):
    """Cancel what still waits behind a blocking job, then let the blocker end; returns it as it ended."""
    from graftui.ui import store

    for job in store.runner().runner.jobs():
        if job.status == "queued":
            store.runner().runner.cancel(job.id)
    gate.set()
    return store.runner().runner.wait(blocker.id, 30)


def uploads_of(server: Server, sid: str) -> list[str]:
    folder = server.home / "sessions" / sid / "uploads"
    return sorted(p.name for p in folder.glob("*/*")) if folder.exists() else []


# -- data sources ------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["csv", "JSON", "text", "parquet", "imagefolder"])
def test_a_datasets_loader_name_is_never_a_task(server, task):
    needle = "names a loader of the datasets library"
    cli_refuses(["localize", "--task", task], needle)
    sid = server.session()
    line = server.refuses("/on_check_mapping", (sid, task, "(guess)", "(none)", "(guess)"), needle)
    assert len(line) < 400  # one sentence, never the server's files


@pytest.mark.parametrize("task, needle", [
    ("/etc/passwd", "local paths"), ("../../etc", "local paths"), ("~/.ssh", "local paths"),
    ("*.csv", "are disabled here"), ("https://example.com/x.csv", "are disabled here"),
    ("", "no dataset given"),
])
def test_hosted_tasks_never_name_a_server_path(server, task, needle):
    sid = server.session()
    server.refuses("/on_check_mapping", (sid, task, "(guess)", "(none)", "(guess)"), needle)


# -- uploads -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, needle", [
    ("empty", "empty"), ("latin1", "utf-8"), ("broken", "jsonl"), ("fake", "as parquet: could not open parquet input source 'fake.parquet'"),
    ("pickle", "utf-8"),
    ("header", "a header alone is not a dataset"),
])
def test_a_refused_upload_is_deleted_and_never_offered(server, files, name, needle):
    sid = server.session()
    server.refuses("/on_data_upload", (sid, upload(files[name])), needle)
    assert uploads_of(server, sid) == []
    choices = server.call("/on_data_upload", sid, upload(files["good"]))[0]["choices"]
    assert [c for c in choices if files[name].name in str(c)] == []
    assert uploads_of(server, sid) == ["good.csv"]


def test_uploads_of_the_wrong_kind_too_large_or_forged_are_refused(server, files, monkeypatch):
    from graftui import settings

    sid = server.session()
    server.refuses("/on_data_upload", (sid, upload(files["model"])), "invalid file type")
    monkeypatch.setattr(settings, "MAX_UPLOAD_MB", 0.0001)  # Gradio's own cap is checked by the client already
    server.refuses("/on_data_upload", (sid, upload(files["good"])), "uploads are limited to")
    monkeypatch.undo()
    for forged in (Path(__file__).resolve(), Path("/etc/hosts")):  # the app's own source; a server file
        line = server.raw_error("/on_data_upload", [sid, {"path": str(forged), "meta": {"_type": "gradio.FileData"}}])
        assert "not uploaded by a user" in line and "127.0.0.1" not in line, line
    assert uploads_of(server, sid) == []


# -- requests: the app refuses what the CLI refuses, with the same words ---------------------------
LOCALIZE = ("minilm", "minilm-movies", "movies", "(guess)", "(none)", "(guess)", "learned")


@pytest.mark.parametrize("field, value, cli_flag, needle, app_needle", [
    ("steps", 0, "--steps", "--steps must be at least 1", "Mask steps must be at least 1"),
    ("steps", -5, "--steps", "--steps must be at least 1", "Mask steps must be at least 1"),
    ("lr", 0, "--lr", "must be a positive number", "must be a positive number"),
    ("lr", -1, "--lr", "must be a positive number", "must be a positive number"),
    ("epc", 0, "--examples-per-class", "at least 1", "at least 1"),
])
def test_mask_learning_settings_are_checked_alike(server, field, value, cli_flag, needle, app_needle):
    cli_refuses(["localize", "--task", "movies", cli_flag, value], needle)
    sid = server.session()
    values = {"log_s": -3, "steps": 5, "epc": 8, "lr": 0.02, field: value}
    server.refuses("/on_localize", (sid, *LOCALIZE, values["log_s"], values["steps"], values["epc"], values["lr"],
                                    "auto", "", ""), app_needle)  # the app names the widget, the CLI its flag
    assert own_jobs(sid) == []  # refused before any job was queued


def test_values_a_browser_cannot_send_are_named_by_the_widget(server):
    sid = server.session()
    server.refuses("/on_localize", (sid, *LOCALIZE, "abc", 5, 8, 0.02, "auto", "", ""), "slider")
    server.refuses("/on_localize", (sid, *LOCALIZE, 3.0, 5, 8, 0.02, "auto", "", ""), "maximum")
    server.refuses("/on_localize", (sid, "minilm", "minilm-movies", "movies", "(guess)", "(none)", "(guess)", "magic",
                                    -3, 5, 8, 0.02, "auto", "", ""), "magic")
    cli_refuses(["localize", "--method", "magic"], "magic")
    cli_refuses(["localize", "--sparsity", "2"], "sparsity must be in (0, 1]")


def test_laboratory_and_sweep_inputs(server):
    sid = server.session()
    server.refuses("/on_sweep", (sid, *LOCALIZE[:6], "1e-4, lots", 5, 8, 0.02, 64, "auto", "", ""), "not a number")
    server.refuses("/on_wise", (sid, None, "0, 1", 10), "pick at least one region")
    server.refuses("/on_multitask", (sid, ["movies"], [], -3, "empty", 5, 2, 10), "two or more different tasks")
    cli_refuses(["multitask", "--tasks", "movies"], "two or more different tasks")
    server.refuses("/on_compare", (sid, [], [], 10, False), "pick at least one region")
    server.refuses("/on_predict", (sid, [], "a fine film"), "pick at least one region")
    server.refuses("/on_predict", (sid, ["../../etc/passwd"], "a fine film"), "is not a region id")
    cli_refuses(["predict", "--text", "x" * 6000], "longer than 5,000 characters")
    cli_refuses(["predict", "--text", " "], "none of them empty")


@pytest.mark.parametrize("args, needle", [
    (["localize", "--base", "/etc"], "/etc"),
    (["localize", "--finetuned", "../../../"], "../../../"),
    (["localize", "--finetuned", "org--evil/../x"], "org--evil"),
])
def test_model_references_that_name_nothing(args, needle):
    cli_refuses(args, needle)


def test_a_pickle_checkpoint_is_refused_and_never_unpickled(files, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    cli_refuses(["localize", "--finetuned", files["pickle_model"], "--task", "movies"], "safetensors")


def test_hosted_models_never_name_a_server_path(server, files):
    sid = server.session()
    for ref in ("/etc", str(files["pickle_model"]), "../../home"):
        server.refuses("/on_check", (sid, "minilm", ref, -3, "movies", "(guess)", "(none)", "(guess)", "auto", "", ""),
                       "local paths are not allowed")


# -- region files --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, needle", [
    ("nan", "NaN or infinite"), ("inflated", "header"), ("k_lie", "k = 5"), ("no_tag", "not a graftui region"),
    ("random", "not a readable safetensors"), ("pickled", "not a readable safetensors"),
    ("digest_lie", "the file was altered"),
])
def test_a_region_file_refused_anywhere_is_refused_everywhere(server, files, name, needle):
    cli_refuses(["anatomy", "--region", files[name]], needle)
    cli_refuses(["export", "--region", files[name], "--out", files[name].parent / f"export-{name}"], needle)
    sid = server.session()
    server.refuses("/on_region_upload", (sid, upload(files[name])), needle)
    server.refuses("/on_region_apply", (sid, upload(files[name]), "minilm", "minilm-movies"), needle)
    assert not (files[name].parent / f"export-{name}").exists()


def test_region_ids_stay_in_the_sessions_own_folder(server, files):
    from graftui import regions
    from graftui.errors import SessionError
    from graftui.ui import store

    a, b = server.session(), server.session()
    with store.session(a):
        saved = store.save_region(regions.load(files["region"]))
        assert [e.id for e in store.list_regions()] == [saved.stem]
    assert saved.parent == server.home / "sessions" / a / "regions"
    for bad, needle in (("../../etc/passwd", "is not a region id"), (saved.stem, "not saved here")):
        server.refuses("/on_anatomy", (b, bad, "counts"), needle)
        server.refuses("/on_region_delete", (b, bad), needle)  # as the API's description lists its inputs
        server.refuses("/on_region_delete_press", (b, bad, "Confirm: delete " + bad), needle)  # as the page presses
    out = server.call("/on_anatomy", a, saved.stem, "counts")
    assert not any(isinstance(o, str) and o.startswith(WARN) for o in out)  # the owner reads it
    with store.session(b):  # the store never looks outside the session's folder
        assert store.list_regions() == []
        for bad, needle in (("../../etc/passwd", "is not a region id"), ("", "no region selected"),
                            (saved.stem, "not saved here")):
            with pytest.raises(regions.RegionError, match=needle):
                store.region_path(bad)
            with pytest.raises(regions.RegionError, match=needle):
                store.delete_region(bad)
    with store.session("forged-session-id-never-issued-x"):
        assert store.list_regions() == [] and store.upload_choices() == []
        with pytest.raises(SessionError, match="no live session"):
            store.region_path(saved.stem)
    assert saved.exists()


# -- outputs -----------------------------------------------------------------------------------------------
def test_outputs_are_never_overwritten_or_written_half(files, tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    args = ["compose", "--region", files["region"], "--region", files["region"]]
    cli_refuses([*args, "--out", precious], "exists; choose a new name, or add --overwrite")
    assert precious.read_text() == "keep me"
    cli_refuses([*args, "--out", precious / "union.safetensors"], "cannot write")
    cli_refuses([*args, "--out", tmp_path], "is a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]


def test_a_failed_write_names_the_users_file_not_a_temporary_one(tmp_path):
    from graftui.errors import message
    from graftui.regions import atomic_write

    target = tmp_path / "region.safetensors"

    def disk_full(tmp):
        Path(tmp).write_bytes(b"half")
        raise OSError(28, "No space left on device", tmp)

    with pytest.raises(OSError) as caught:
        atomic_write(target, disk_full)
    line = message(caught.value)
    assert f"cannot write '{target}'" in line and "No space left" in line and ".region.safetensors." not in line
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


# -- sessions: jobs, quotas, expiry --------------------------------------------------------------------
def test_a_session_never_sees_or_cancels_another_sessions_jobs_and_quotas_hold(server, monkeypatch):
    """The isolation of jobs through the API: a blocked runner keeps session A's jobs queued while B tries."""
    from graftui import settings
    from graftui.errors import SessionError
    from graftui.ui import store

    gate = threading.Event()
    blocker = store.runner().submit("prepare", "server's own job", lambda ctx: gate.wait(60) and {}, server=True)
    try:
        a, b = server.session(), server.session()
        monkeypatch.setattr(settings, "SESSION_JOBS", 2)
        ids = []
        for steps in (5, 6):  # two different jobs (the same one again is the job already queued)
            status = server.call("/on_localize", a, *LOCALIZE, -3, steps, 8, 0.02, "auto", "", "")[0]
            ids.append(status.split("(job ")[1].split(")")[0])
        again = server.call("/on_localize", a, *LOCALIZE, -3, 5, 8, 0.02, "auto", "", "")[0]
        assert f"(job {ids[0]})" in again  # a double click queues nothing new
        server.refuses("/on_localize", (a, *LOCALIZE, -3, 7, 8, 0.02, "auto", "", ""), "the limit is 2")
        with store.session(b):
            assert {j.id for j in store.runner().jobs()} == {blocker.id}
        with store.session(a):
            assert {j.id for j in store.runner().jobs()} == {blocker.id, *ids}
        server.refuses("/on_job_cancel", (b, ids[0]), f"no job {ids[0]} here")
        server.refuses("/on_job_cancel_press", (b, ids[0], "Confirm cancel"), f"no job {ids[0]} here")
        with store.session(b):  # another session's job does not exist for B
            assert store.runner().get(ids[0]) is None
            with pytest.raises(SessionError, match=f"no job {ids[0]} here"):
                store.runner().cancel(ids[0])
        with store.session(a):
            with pytest.raises(SessionError, match="server's own job"):
                store.runner().cancel(blocker.id)
            assert store.runner().runner.get(ids[0]).status == "queued"
            assert store.runner().cancel(ids[0]) and store.runner().cancel(ids[1])
        monkeypatch.setattr(settings, "MAX_JOBS", 1)
        server.refuses("/on_localize", (b, *LOCALIZE, -3, 5, 8, 0.02, "auto", "", ""), "the server is busy")
    finally:
        gate.set()
    assert store.runner().runner.wait(blocker.id, 30).status == "done"
    assert {store.runner().runner.get(i).status for i in ids} == {"cancelled"}


def test_a_job_is_cancelled_through_the_api_as_its_description_says(server, monkeypatch):
    """/on_job_cancel takes what the API's description lists (the session and the job; Gradio leaves the button's
    label out): the first call asks to confirm, a second on the same job cancels it, and the armed call expires."""
    from graftui.ui import jobwords, store

    info = server.client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert len(info["/on_job_cancel"]["parameters"]) == 2 and "/on_job_cancel_press" not in info
    gate = threading.Event()
    blocker = store.runner().submit("prepare", "server's own job", lambda ctx: gate.wait(60) and {}, server=True)
    try:
        a = server.session()
        status = server.call("/on_localize", a, *LOCALIZE, -3, 9, 8, 0.02, "auto", "", "")[0]
        job = status.split("(job ")[1].split(")")[0]
        # the answer is the status line alone: the client leaves out the button's new look and the States
        assert server.call("/on_job_cancel", a, job).startswith("Press **Confirm cancel**")
        monkeypatch.setattr(jobwords, "CONFIRM_SECONDS", 0.0)  # a call that waited past the window asks again
        time.sleep(0.05)
        assert server.call("/on_job_cancel", a, job).startswith("Press **Confirm cancel**")
        monkeypatch.undo()
        with store.session(a):
            assert store.runner().runner.get(job).status == "queued"
        assert server.call("/on_job_cancel", a, job).startswith("Cancel requested")
        with store.session(a):
            assert store.runner().runner.get(job).status == "cancelled"
    finally:
        gate.set()
    assert store.runner().runner.wait(blocker.id, 30).status == "done"


def test_twenty_sessions_of_one_address_cannot_keep_another_address_from_starting_a_job(server, monkeypatch):
    """A script that opens session after session is counted by its address (behind the one trusted proxy, the
    last X-Forwarded-For entry), so fresh sessions do not reset its quota and others still get a place."""
    from gradio_client import Client

    from graftui import settings
    from graftui.ui import store

    monkeypatch.setattr(settings, "TRUSTED_PROXIES", 1)
    monkeypatch.setattr(settings, "CLIENT_JOBS", 4)
    script = Client(server.url, verbose=False, download_files=False, headers={"X-Forwarded-For": "6.6.6.6, 10.0.0.1"})
    other = Client(server.url, verbose=False, download_files=False, headers={"X-Forwarded-For": "10.0.0.2"})
    gate = threading.Event()
    blocker = store.runner().submit("prepare", "server's own job", lambda ctx: gate.wait(60) and {}, server=True)
    queued, refused = [], []
    try:
        for i in range(20):
            sid = script.predict("", api_name="/on_load")[1]
            status = script.predict(sid, *LOCALIZE, -3, 5 + i, 8, 0.02, "auto", "", "", api_name="/on_localize")[0]
            (queued if status.startswith("Submitted") else refused).append(status)
        assert len(queued) == 4 and all("from your address" in line for line in refused), refused[:1]
        sid = other.predict("", api_name="/on_load")[1]
        status = other.predict(sid, *LOCALIZE, -3, 5, 8, 0.02, "auto", "", "", api_name="/on_localize")[0]
        assert status.startswith("Submitted"), status
    finally:
        ended = release(gate, blocker)
    assert ended.status == "done"


def test_disk_quota_and_idle_expiry(server, files, monkeypatch):
    import time

    from graftui import settings
    from graftui.ui import store

    sid = server.session()
    monkeypatch.setattr(settings, "SESSION_MB", 0.0001)
    server.refuses("/on_data_upload", (sid, upload(files["good"])), "your workspace holds")
    assert uploads_of(server, sid) == []
    monkeypatch.setattr(settings, "SESSION_MB", 1024)
    old = server.session()
    seen = server.home / "sessions" / old / store.SEEN
    os.utime(seen, (time.time() - 48 * 3600,) * 2)
    assert old in store.expire_sessions() and not (server.home / "sessions" / old).exists()
    assert (server.home / "sessions" / sid).exists()
    fresh = server.call("/on_load", old)[1]  # the expired id is replaced, never revived
    assert fresh != old and store.live_session(fresh)


def test_the_served_page_runs_the_page_script_before_gradios_modules(server):
    import urllib.request

    from graftui.ui import pagescript

    html = urllib.request.urlopen(server.url, timeout=30).read().decode()
    assert 0 < html.index(pagescript.SCRIPT) < html.index('<script type="module"')


def test_the_dockerfile_runs_hosted_as_uid_1000_outside_its_source():
    """The container's hosted defaults, read from the Dockerfile itself (no Docker engine needed)."""
    import re

    from graftui import settings

    text = (Path(__file__).resolve().parents[1] / "Dockerfile").read_text()
    env = dict(re.findall(r"\b(GRAFTUI_[A-Z_]+)=(\S+)", text))
    assert env["GRAFTUI_HOSTED"] == "1"
    caps = {"GRAFTUI_MAX_UPLOAD_MB": settings.MAX_UPLOAD_MB, "GRAFTUI_MAX_DATASET_ROWS": settings.MAX_DATASET_ROWS,
            "GRAFTUI_MAX_MODEL_PARAMS": settings.MAX_MODEL_PARAMS, "GRAFTUI_SESSION_JOBS": settings.SESSION_JOBS,
            "GRAFTUI_SESSION_MB": settings.SESSION_MB, "GRAFTUI_SESSION_IDLE_HOURS": settings.SESSION_IDLE_HOURS,
            "GRAFTUI_MAX_JOBS": settings.MAX_JOBS}
    for name, default in caps.items():
        assert float(env[name]) == float(default), name  # the container states the library's defaults
    assert re.search(r"useradd .*--uid 1000 user", text) and re.search(r"^USER user$", text, re.M)
    workdir = re.findall(r"^WORKDIR (\S+)", text, re.M)[-1]
    source = re.search(r"^COPY \. (\S+)", text, re.M).group(1)
    assert not Path(workdir).is_relative_to(source) and not Path(source).is_relative_to(workdir)
    assert not Path(env["GRAFTUI_HOME"]).is_relative_to(source)
    cmd = json.loads(re.search(r"^CMD (\[.*\])", text, re.M).group(1))
    assert cmd[1] == f"{source}/app.py" and "7860" in cmd


# -- bounded reading: no cell, no file expands past its limit -------------------------------------------
def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_tiny_parquet_file_that_decodes_to_300_mb_is_refused_at_once_with_bounded_memory(server, tmp_path):
    """4 rows, one cell of 300 MB, zstd: ~10 KB on disk. It is written by another process (so that this one's memory
    counts only the server's handling), refused from the file's footer (4 rows cannot hold 300 MB without a cell
    over the limit), and never decoded."""
    import subprocess
    import sys
    import time

    bomb = tmp_path / "bomb.parquet"
    script = ("import pyarrow as pa, pyarrow.parquet as pq, sys; "
              "t = pa.table({'text': ['a' * 300_000_000, 'b', 'c', 'd'], 'label': [0, 1, 0, 1]}); "
              "pq.write_table(t, sys.argv[1], compression='zstd')")
    subprocess.run([sys.executable, "-c", script, str(bomb)], check=True, timeout=300)
    assert bomb.stat().st_size < 1_000_000
    sid = server.session()
    before, began = _rss_mb(), time.monotonic()
    line = server.refuses("/on_data_upload", (sid, upload(bomb)), "holds more than 100,000 characters")
    seconds, grown = time.monotonic() - began, _rss_mb() - before
    print(f"[hostile] 300 MB-cell Parquet: refused in {seconds:.2f} s, server memory +{grown:.0f} MB: {line}")
    assert grown < 200, f"the server grew by {grown:.0f} MB reading a refused file"
    assert uploads_of(server, sid) == []
    cli_refuses(["localize", "--task", bomb], "holds more than 100,000 characters")


def test_cells_and_headers_that_would_mislead_a_reader_are_refused_with_their_line(tmp_path, monkeypatch):
    from graftui import settings
    from graftui.tasks.classification.data import load_task, preview

    monkeypatch.setattr(settings, "MAX_CELL_CHARS", 1000)
    rows = "".join(f"sentence {i},{i % 2}\n" for i in range(20))
    cases = {
        "long.csv": ("text,label\n" + rows + "x" * 2000 + ",1\n", "more than 1,000 characters"),
        "twice.csv": ("text,label,label\n" + "".join(f"s {i},{i % 2},1\n" for i in range(20)), "2 columns named 'label'"),
        "ragged.csv": ("text,label\nhello, there,1\n" + rows, "line 2 of 'ragged.csv' has 3 cells but the header names 2"),
        "long.jsonl": ("".join(json.dumps({"text": f"s {i}", "label": i % 2}) + "\n" for i in range(20))
                       + json.dumps({"text": "y" * 2000, "label": 1}) + "\n", "more than 1,000 characters"),
    }
    for name, (content, needle) in cases.items():
        (tmp_path / name).write_text(content)
        cli_refuses(["localize", "--task", tmp_path / name], needle)
        with pytest.raises(Exception, match=needle.replace("(", r"\(").replace(")", r"\)")):
            load_task(tmp_path / name)
    lists = tmp_path / "lists.jsonl"
    lists.write_text("".join(json.dumps({"text": ["a", "b"], "label": i % 2}) + "\n" for i in range(20)))
    cli_refuses(["localize", "--task", lists], "holds a list in row 1, not a text")
    (tmp_path / "wide.csv").write_text("text,label\n" + "z" * 900 + ",1\n" + rows)
    shown = preview(tmp_path / "wide.csv")["rows"][0]["text"]  # a preview never ships a whole cell
    assert len(shown) < 260 and shown.endswith("[900 characters]")


def test_labels_that_mean_missing_or_negative_are_read_as_they_are_meant(tmp_path):
    from graftui.tasks.classification.data import load_task, preview

    texts = [f"sentence number {i}" for i in range(60)]

    def write(name, labels):
        path = tmp_path / name
        path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in zip(texts, labels)) + f",{labels[0]}\n")
        return path

    nan = load_task(write("nan.csv", ["positive", "negative", "NaN"] * 20))
    assert nan.label_names == ("negative", "positive")  # "NaN" is a missing label, not a third class
    assert any("left out 1 without a text and 20 without a label" in note for note in nan.notes), nan.notes
    minus = load_task(write("minus.csv", [0, -1] * 30))
    assert minus.label_names == ("-1", "0") and sum(len(s) for s in minus.splits.values()) == 60
    assert any("negative labels" in note for note in minus.notes)
    glue = load_task(write("glue.csv", [0, 1, -1] * 20))  # GLUE's −1 beside two classes: unlabelled rows
    assert glue.label_names == ("0", "1")
    one = preview(write("one.csv", ["positive"] * 60))
    assert any("single class" in w for w in one["warnings"])  # an upload of one class is not greeted as fine
    cli_refuses(["localize", "--task", tmp_path / "one.csv"], "single class")


def test_forged_patch_values_are_refused_on_load_so_evaluate_and_export_agree(tmp_path):
    from graftui import regions
    from graftui.localizers import Budget, run_method

    pair, _, _ = make_tiny_pair()
    region, _ = run_method(pair, Budget(k=20), "top-movement")
    record = regions.with_patch(pair, regions.make_record(pair, region, {"method": "top-movement", "task": "movies"}))
    name = next(iter(record.values))
    record.values[name][0] = 3e38
    regions.save(record, tmp_path / "huge.safetensors")
    head = regions.with_patch(pair, regions.make_record(pair, region, {}))
    head.head[next(iter(head.head))].view(-1)[0] = 1e30
    regions.save(head, tmp_path / "head.safetensors")
    for file, group in (("huge", "values"), ("head", "head")):
        path = tmp_path / f"{file}.safetensors"
        for verb in (["evaluate", "--region", path], ["export", "--region", path, "--out", tmp_path / f"x-{file}"]):
            cli_refuses(verb, f"holds {group} of magnitude")
    assert not (tmp_path / "x-huge").exists() and not (tmp_path / "x-head").exists()


def test_a_fine_tune_that_diverges_or_holds_nan_is_one_line(tmp_path):
    from transformers import AutoTokenizer

    from conftest import MINILM_DIR, make_tiny_bert

    cli_refuses(["finetune", "--lr", "1e308"], "only diverges")
    base, ft = make_tiny_bert(), make_tiny_bert(seed=1)
    with torch.no_grad():
        next(ft.parameters()).view(-1)[0] = float("nan")
    for model, name in ((base, "base"), (ft, "nan-ft")):
        model.save_pretrained(tmp_path / name)
        AutoTokenizer.from_pretrained(MINILM_DIR).save_pretrained(tmp_path / name)
    task = tmp_path / "task.csv"
    task.write_text("text,label\n" + "".join(f"a sentence {i},{i % 2}\n" for i in range(60)))
    cli_refuses(["evaluate", "--base", tmp_path / "base", "--finetuned", tmp_path / "nan-ft", "--task", task],
                "holds NaN or infinite weights")
    cli_refuses(["localize", "--base", tmp_path / "base", "--finetuned", tmp_path / "base", "--task", task,
                 "--method", "top-movement"], "fine-tuning moved nothing")


def test_a_template_reading_a_second_text_needs_a_task_that_has_one():
    from types import SimpleNamespace

    from graftui.tasks.classification.data import DataError, Split, Task
    from graftui.tasks.classification.scoring import check_labels

    split = Split(("a", "b"), (0, 1))
    task = Task("single", ("neg", "pos"), {"train": split, "validation": split, "test": split}, "test")
    pair = SimpleNamespace(label_names=("neg", "pos"), prompt=SimpleNamespace(template="{text} {text_pair} It was"))
    with pytest.raises(DataError, match=r"drop \{text_pair\} from --template"):
        check_labels(pair, task)


# -- outputs: exclusive, atomic, cleaned after a kill, disk-full in words -----------------------------------
def test_two_runs_with_one_out_leave_one_file_and_one_refusal(tmp_path):
    from graftui import regions
    from graftui.errors import message
    from graftui.localizers import Budget, run_method
    from graftui.paths import Exists

    pair, _, _ = make_tiny_pair()
    records = [regions.make_record(pair, run_method(pair, Budget(k=k), "top-movement")[0], {}) for k in (20, 30)]
    out = tmp_path / "r.safetensors"
    gate, results = threading.Barrier(2), []

    def run(record):
        gate.wait()
        try:
            regions.save(record, out, exclusive=True)
            results.append("saved")
        except Exists as err:
            results.append(message(err))

    threads = [threading.Thread(target=run, args=(r,)) for r in records]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(results)[1] == "saved" and "exists (another run wrote it meanwhile)" in sorted(results)[0]
    assert [p.name for p in tmp_path.iterdir()] == ["r.safetensors"] and regions.load(out).size in (20, 30)


def test_what_a_killed_run_left_is_cleaned_and_a_full_disk_reads_as_one_line(tmp_path):
    from graftui.errors import message
    from graftui.paths import atomic_dir, clean_stale, file_lock

    from graftui.paths import _host, _started

    me, started = os.getpid(), _started(os.getpid())
    dead = tmp_path / "checkpoints" / f".ft.tmp-{_host()}-{2**22 + 7}-5-abc"  # no such process
    reused = tmp_path / f".reg.tmp-{_host()}-{me}-{started + 1}-ghi"  # this pid, but a process started at another time
    alive = tmp_path / f".exp.tmp-{_host()}-{me}-{started}-def"  # this very process: still writing
    elsewhere = tmp_path / f".x.tmp-otherhost-{2**22 + 7}-5-jkl"  # another machine's (a shared home): not judged here
    for folder in (dead, reused, alive, elsewhere):
        folder.mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"x" * 100)
    assert sorted(clean_stale(tmp_path)) == sorted([dead, reused]) and alive.exists() and elsewhere.exists()

    def full_disk_writer():
        with atomic_dir(tmp_path / "export") as tmp:
            (tmp / "part").write_bytes(b"x")
            raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                               "\"No space left on device\" })")  # what safetensors raises

    with pytest.raises(OSError) as caught:
        full_disk_writer()
    assert message(caught.value) == f"cannot write '{tmp_path / 'export'}': No space left on the device; free some " \
                                     "space and run again"
    assert not (tmp_path / "export").exists() and [p.name for p in tmp_path.glob(".export*")] == []
    order, holding = [], threading.Event()

    def hold(name, seconds):
        with file_lock(tmp_path / "ckpt"):
            order.append(f"{name} in")
            holding.set()
            threading.Event().wait(seconds)  # a build that takes a while
            order.append(f"{name} out")

    first = threading.Thread(target=hold, args=("a", 0.3))
    first.start()
    holding.wait(10)  # a holds the lock
    hold("b", 0)
    first.join()
    assert order == ["a in", "a out", "b in", "b out"]  # a second builder of one checkpoint waits for the first


def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised(tmp_path):
    import csv as csvlib
    import zipfile

    from graftui import bundle

    rows = [{"model": "=cmd|' /C calc'!A0", "task": "+1+1", "accuracy": -0.5, "delta": "-5.0 pts", "label": "@SUM(1)",
             "plain": "-0.25"}]
    path = bundle.write({"verb": "evaluate"}, {"rows": rows, "names": ["=HYPERLINK(1)", "b"],
                                                "overlap": [[1, 0], [0, 1]]}, tmp_path / "r.zip")
    with zipfile.ZipFile(path) as zf:
        table = zf.read("r/tables/rows.csv").decode()
        overlap = zf.read("r/tables/overlap.csv").decode()
    row = next(csvlib.DictReader(table.splitlines()))
    assert row["model"] == "'=cmd|' /C calc'!A0" and row["task"] == "'+1+1" and row["label"] == "'@SUM(1)"
    assert row["accuracy"] == "-0.5" and row["plain"] == "-0.25" and row["delta"] == "'-5.0 pts"
    assert "'=HYPERLINK(1)" in overlap and ",=HYPERLINK" not in overlap


# -- the hosted queue: fair, bounded, de-duplicated --------------------------------------------------------
def test_the_queue_serves_clients_in_turn_drops_double_clicks_and_stops_a_job_over_time(tmp_path):
    from graftui.jobs import DONE, FAILED, NOBODY, JobRunner

    gate, running = threading.Event(), threading.Event()
    runner = JobRunner(tmp_path / "jobs", max_seconds=0.2)
    started = []

    def work(name):
        def fn(ctx):
            started.append(name)
            running.set()
            gate.wait(5)
            return {}
        return fn

    runner.submit("x", "blocker", work("blocker"), {"verb": "x", "i": 0}, owner="s0", client="c0")
    running.wait(10)  # the blocker runs: the others wait behind it
    ids = [runner.submit("x", f"{c}{i}", work(f"{c}{i}"), {"verb": "x", "c": c, "i": i}, owner=c, client=c).id
           for c, i in (("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1))]
    twin = runner.submit("x", "a1 again", work("never"), {"verb": "x", "c": "a", "i": 1}, owner="a", client="a",
                         dedupe=True)
    assert twin.id == ids[0]  # a double click returns the job it already queued
    assert [runner.place(i) for i in ids] == [1, 4, 5, 2, 3]  # a, b, c, then a's others: every client in turn
    gate.set()
    for i in ids:
        runner.wait(i, 10)
    assert started[1:] == ["a1", "b1", "c1", "a2", "a3"]

    def slow(ctx):
        for _ in range(100):
            threading.Event().wait(0.05)
            ctx.report({"stage": "working"})
        return {}

    job = runner.wait(runner.submit("x", "slow", slow, {}).id, 10)
    assert job.status == FAILED and "limit for one job" in job.error
    assert runner.get({"not": "an id"}) is None and DONE
    damaged = tmp_path / "jobs" / "20990101-000000-abcdef"
    damaged.mkdir()
    (damaged / "job.json").write_text('{"id": "20990101-000000-abcdef", "status": 5}')
    again = JobRunner(tmp_path / "jobs")
    assert again.get(damaged.name).owner == NOBODY  # listed to no hosted session


def test_hosted_ceilings_and_paths_are_checked_before_a_job_is_queued(monkeypatch, tmp_path):
    from graftui import hosted, settings
    from graftui.errors import DataError, RequestError
    from graftui.tasks.completion.generation import AnswerRule
    from graftui.requests import LocalizeRequest, SweepRequest, WiseRequest

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path))
    guard = hosted.HostedGuard()
    with pytest.raises(RequestError, match="steps 100,000 is over this server's limit"):
        hosted.check_request(LocalizeRequest.make(steps=100_000), guard)
    with pytest.raises(RequestError, match="examples per class 1,000,000,000 is over"):
        hosted.check_request(LocalizeRequest.make(examples_per_class=10**9), guard)
    with pytest.raises(RequestError, match="points on one curve"):
        hosted.check_request(SweepRequest.make(sparsities=[1e-4 * (i + 1) for i in range(20)], n=100), guard)
    with pytest.raises(RequestError, match="points on one curve"):
        hosted.check_request(WiseRequest.make(alphas=[i / 40 for i in range(41)], n=100), guard)
    with pytest.raises(RequestError, match="give a number of test examples"):  # None: every example of the split
        hosted.check_request(SweepRequest.make(n=None), guard)
    with pytest.raises(RequestError, match="9 ood are over this server's limit of 8"):
        hosted.check_request(SweepRequest.make(n=100, ood=[f"t{i}" for i in range(9)]), guard)
    with pytest.raises(DataError, match="local paths"):
        hosted.check_request(LocalizeRequest.make(task="/etc/passwd"), guard)
    with pytest.raises(RequestError, match="max new tokens 1,000 is over this server's limit of 64"):
        hosted.check_request(LocalizeRequest.make(task="dates", max_new_tokens=1000), guard)  # generation is per prompt
    with pytest.raises(RequestError, match="answer regexes are not run on a shared server"):
        hosted.check_request(LocalizeRequest.make(task="dates", answer_regex="(a+)+$"), guard)  # can backtrack for ever
    with pytest.raises(RequestError, match="removes the regex '\\(a\\+\\)\\+\\$' from answers, and answer regexes "
                                           "are not run on a shared server: drop --ignore-regex"):
        hosted.check_request(LocalizeRequest.make(task="dates", ignore_regex=["(a+)+$", "x"]), guard)
    with pytest.raises(RequestError, match="ignore-regex"):  # a region file's own list is held to the same rule
        guard.checked_rule(AnswerRule(regexes_to_ignore=("(a|aa)+$",)), "this region file")
    assert guard.checked_rule(AnswerRule(ignore_punctuation=True), "the request").ignore_punctuation  # no regex: runs
    hosted.check_request(LocalizeRequest.make(), guard)  # the defaults pass, the default model not built yet
    assert settings.job_seconds() == 1800


def test_an_upload_read_only_out_of_distribution_is_scored_on_all_its_rows(tmp_path):
    from graftui.tasks.classification.data import all_as_test, load_task

    path = tmp_path / "ood.csv"
    path.write_text("text,label\n" + "".join(f"review number {i},{i % 2}\n" for i in range(80)))
    task = load_task(path)
    assert task.pooled and len(task.splits["test"]) < 80
    assert len(all_as_test(task).splits["test"]) == 80 and all_as_test(load_task("amazon")) == load_task("amazon")


def test_a_report_bundle_carries_the_region_files_its_request_reads(tmp_path):
    import zipfile

    from graftui import bundle, regions
    from graftui.flows import read_request
    from graftui.localizers import Budget, run_method

    pair, _, _ = make_tiny_pair()
    region = regions.save(regions.make_record(pair, run_method(pair, Budget(k=20), "random")[0], {}),
                          tmp_path / "mine.safetensors")
    request = {"verb": "evaluate", "regions": [str(region)], "n": 10}
    with zipfile.ZipFile(bundle.write(request, {"rows": []}, tmp_path / "b.zip")) as zf:
        zf.extractall(tmp_path / "unpacked")
    folder = tmp_path / "unpacked" / "b"
    assert json.loads((folder / "request.json").read_text())["regions"] == ["inputs/mine.safetensors"]
    region.unlink()  # another machine: only the bundle
    again = read_request(folder / "request.json")
    assert again.regions == [str(folder / "inputs" / "mine.safetensors")] and Path(again.regions[0]).is_file()


def test_seeds_count_against_a_hosted_servers_ceilings(monkeypatch, tmp_path):
    """Each seed is another run: a list of seeds is capped like any list, and multiplies a curve's points."""
    from graftui import hosted
    from graftui.errors import RequestError
    from graftui.requests import EvaluateRequest, LocalizeRequest, SweepRequest

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path))
    guard = hosted.HostedGuard()
    with pytest.raises(RequestError, match="9 seeds are over this server's limit of 8"):
        hosted.check_request(LocalizeRequest.make(seeds=list(range(9))), guard)
    with pytest.raises(RequestError, match="points on one curve .* seeds"):  # 3 budgets × 3 methods × 3 seeds = 27
        hosted.check_request(SweepRequest.make(n=100, sparsities=[1e-4, 1e-3, 1e-2], seeds=[0, 1, 2]), guard)
    hosted.check_request(SweepRequest.make(n=100, sparsities=[1e-4, 1e-3, 1e-2], seeds=[0, 1]), guard)  # 18 pass
    hosted.check_request(EvaluateRequest.make(n=100, seeds=[0, 1, 2]), guard)
    with pytest.raises(RequestError, match="whole number"):
        hosted.check_request(EvaluateRequest.make(n=100, seeds=[0, "1"]), guard)


# -- answer rules that cannot hang, files that are data ---------------------------------------------------
BACKTRACKS = "(a|aa)+$"  # exponential in a run of a's that ends otherwise; Python's re takes minutes on 40 of them


def ticking():
    """A thread that notes the time every 10 ms until stopped: a gap in its ticks is a stall of the interpreter.
    Returns (ticks, stop)."""
    ticks, done = [], threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    ticker = threading.Thread(target=tick)
    ticker.start()

    def stop():
        done.set()
        ticker.join()

    return ticks, stop


def test_a_backtracking_answer_regex_ends_in_one_line_and_never_holds_the_interpreter():
    from graftui.errors import DataError
    from graftui.tasks.completion.generation import REGEX_SECONDS, AnswerRule

    import re

    for pattern, text in ((BACKTRACKS, "aaaa"), (r"#### (\S+)", "so 6 × 7 #### 42\n"), (r"(?i)ANSWER: (\w+)", "answer: Yes")):
        found = re.search(pattern, text)
        assert AnswerRule(regex=pattern).answer(text) == found.group(1)  # read as Python's re reads it
    rule = AnswerRule(regex=BACKTRACKS)
    ticks, stop = ticking()
    began = time.monotonic()
    try:
        with pytest.raises(DataError, match=r"backtracks without end.*nested repeats"):
            rule.answer("a" * 60 + "!")
    finally:
        stop()
    assert time.monotonic() - began < 20 * REGEX_SECONDS  # the budget, not the pattern's exponential time
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) > 5 and max(gaps) < 0.2, max(gaps)  # another thread ran all along
    with pytest.raises(DataError, match="over 500"):
        AnswerRule(regex="a" * 501).answer("a")


@pytest.fixture(scope="module")
def aaa_skill(server):
    """A tiny Llama pair among the hosted server's own checkpoints, a completion task whose answers are runs of a's,
    and two regions of it: one made with a backtracking answer regex (recorded in its file), one without."""
    import graftui
    from lm_util import _write_pairs, write_lm_pair

    root = server.home / "checkpoints"
    base, ft = write_lm_pair(root, "llama")
    task = _write_pairs(root / "aaa.csv", ((f"the a {i % 7}", " " + "a" * (40 + i % 3) + "!") for i in range(40)))
    made = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("GRAFTUI_HOSTED")  # made by a user on their own machine
        for name, rule in (("plain", None), ("backtracking", BACKTRACKS)):
            made[name] = root.parent / f"aaa-{name}.safetensors"
            graftui.localize(base=str(base), finetuned=str(ft), task=str(task), sparsity=0.05, steps=1, check_n=0,
                             max_new_tokens=4, answer_regex=rule, out=str(made[name]))
    return {"base": base, "ft": ft, "task": task, **made}


def test_a_backtracking_regex_on_the_command_line_ends_in_one_line_while_the_interpreter_runs(aaa_skill, monkeypatch):
    monkeypatch.delenv("GRAFTUI_HOSTED")
    ticks, stop = ticking()
    began = time.monotonic()
    try:
        line = cli_refuses(["evaluate", "--region", aaa_skill["plain"], "--n", "4", "--answer-regex", BACKTRACKS],
                           "backtracks without end")
    finally:
        stop()
    assert BACKTRACKS in line and time.monotonic() - began < 60
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert max(gaps) < 1.0, max(gaps)  # no single stall holds the interpreter (model loading included)


def test_a_region_with_a_backtracking_rule_is_refused_by_a_shared_server_which_answers_others_meanwhile(
        server, aaa_skill):
    from graftui import flows, regions
    from graftui.errors import RequestError
    from graftui.hosted import HostedGuard
    from graftui.requests import EvaluateRequest
    from graftui.ui import store

    hostile, other = server.session(), server.session()  # two visitors
    with store.session(hostile):
        saved = store.save_region(regions.load(aaa_skill["backtracking"]))
        plain = store.save_region(regions.load(aaa_skill["plain"]))
    answered, refused = [], []

    def compare():
        refused.append(server.refuses("/on_compare", (hostile, [saved.stem], [], "", 10, False),
                                      "answer regexes are not run on a shared server"))

    attacker = threading.Thread(target=compare)
    attacker.start()
    for _ in range(3):  # another visitor's requests are answered meanwhile, each within 2 s
        began = time.monotonic()
        server.call("/on_load", other)
        answered.append(time.monotonic() - began)
    attacker.join(60)
    assert not attacker.is_alive() and refused and BACKTRACKS in refused[0]
    assert max(answered) < 2.0, answered
    assert not [j for j in own_jobs(hostile)]  # refused before a job was queued
    with store.session(hostile):  # the rule is refused in the job too (a request file or bundle reaching a flow)
        with pytest.raises(RequestError, match="answer regexes are not run on a shared server"):
            flows.evaluate(EvaluateRequest(regions=[str(saved)], n=4), guard=HostedGuard())
    status = server.call("/on_compare", hostile, [plain.stem], [], "", 4, False)[0]
    assert status.startswith("Submitted"), status  # a region without a regex is compared as ever
    job_id = status.split("(job ")[1].split(")")[0]
    assert store.runner().runner.wait(job_id, 120).status == "done"


def _two_regions(folder: Path) -> list[Path]:
    from graftui import regions
    from graftui.localizers import Budget, run_method

    pair, _, _ = make_tiny_pair()
    return [regions.save(regions.make_record(pair, run_method(pair, Budget(k=k), "top-movement")[0], {}),
                         folder / f"r{k}.safetensors") for k in (20, 30)]


def test_a_request_file_writes_only_beneath_its_folder_and_replaces_nothing_by_itself(tmp_path, monkeypatch):
    monkeypatch.delenv("GRAFTUI_HOSTED", raising=False)
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    monkeypatch.chdir(work)
    regions_ = [str(p) for p in _two_regions(work)]
    precious = work / "precious.safetensors"
    precious.write_bytes(b"keep me")

    def config(name: str, **fields) -> Path:
        path = work / name
        path.write_text(json.dumps({"verb": "compose", "regions": regions_, **fields}))
        return path

    outside = config("outside.json", out=str(elsewhere / "pwn.safetensors"))
    cli_refuses(["run", outside], "a request file cannot choose where to write: give --out")
    up = config("up.json", out="../elsewhere/pwn.safetensors")
    cli_refuses(["run", up], "outside the working folder")
    link = work / "link"
    link.symlink_to(elsewhere, target_is_directory=True) if not link.exists() else None
    cli_refuses(["run", config("link.json", out="link/pwn.safetensors")], "outside the working folder")
    assert not elsewhere.exists()

    replace = config("replace.json", out=str(precious), overwrite=True)
    cli_refuses(["run", replace], "add --overwrite")  # the file's own overwrite is ignored
    assert precious.read_bytes() == b"keep me"

    code, out, err = run_cli("run", config("here.json", out="union.safetensors"))
    assert code == 0 and (work / "union.safetensors").is_file()
    assert err.strip().splitlines()[0] == (f"graftui: running 'compose' from {work / 'here.json'}; it writes out "
                                            "union.safetensors")  # said before it ran
    code, out, err = run_cli("run", replace, "--overwrite")  # the command line may replace it
    assert code == 0 and precious.read_bytes() != b"keep me" and "--overwrite" in err
    code, out, err = run_cli("run", outside, "--out", elsewhere / "asked.safetensors")  # and may write anywhere
    assert code == 0 and (elsewhere / "asked.safetensors").is_file()
    with pytest.raises(Exception, match="a request file cannot choose where to write"):
        import graftui

        graftui.run_file(str(outside))  # the API reads files as data too


def test_stitching_a_region_with_itself_and_a_diverging_mask_are_one_line(tmp_path, aaa_skill, monkeypatch):
    monkeypatch.delenv("GRAFTUI_HOSTED")
    r = aaa_skill["plain"]
    cli_refuses(["compose", "--region", r, "--region", r, "--stitch"], "is given twice")
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(Path(r).read_bytes())
    cli_refuses(["compose", "--region", r, "--region", copy, "--stitch"], "regions of one fine-tune")
    out = tmp_path / "diverged.safetensors"
    cli_refuses(["localize", "--base", aaa_skill["base"], "--finetuned", aaa_skill["ft"], "--task", aaa_skill["task"],
                 "--sparsity", "0.05", "--steps", "3", "--check-n", "0", "--lr", "1e308", "--out", out],
                "mask learning diverged at step 1", planned=True)
    assert not out.exists()


def test_an_answer_regex_whose_counts_would_fill_the_memory_is_refused_before_it_is_compiled(monkeypatch):
    """regex expands counted repeats when it compiles: a 30-character pattern took all the memory before any search."""
    from graftui import hosted, settings
    from graftui.errors import DataError, RequestError
    from graftui.tasks.completion.generation import AnswerRule
    from graftui.requests import EvaluateRequest

    monkeypatch.delenv("GRAFTUI_HOSTED", raising=False)
    huge = "(?:(?:a{65535}){65535}){65535}"
    began = time.monotonic()
    with pytest.raises(DataError, match=r"repeats by counts \(\{n\}\) whose product is over 10,000"):
        AnswerRule(regex=huge).compiled()
    assert time.monotonic() - began < 1
    assert AnswerRule(regex=r"(\d{4})-\d{2}-\d{2}").answer("on 2019-07-04.") == "2019"  # ordinary counts are fine
    cli_refuses(["evaluate", "--answer-regex", huge], "whose product is over 10,000")
    rule = AnswerRule(regex=BACKTRACKS)
    assert hosted.HostedGuard().checked_rule(rule, "region 'r'") is rule  # the app run locally judges by it
    monkeypatch.setattr(settings, "hosted", lambda: True)  # a shared server refuses it before compiling anything
    with pytest.raises(RequestError, match="answer regexes are not run on a shared server"):
        hosted.check_request(EvaluateRequest(answer_regex=huge), hosted.HostedGuard())
    with pytest.raises(RequestError, match="region 'r' judges answers by the regex"):
        hosted.HostedGuard().checked_rule(rule, "region 'r'")


def test_a_regions_own_backtracking_regex_is_dropped_with_an_empty_one(aaa_skill, monkeypatch):
    monkeypatch.delenv("GRAFTUI_HOSTED")
    line = cli_refuses(["evaluate", "--region", aaa_skill["backtracking"], "--n", "4"], "backtracks without end")
    assert "a region's own regex is dropped with --answer-regex ''" in line
    code, out, err = run_cli("evaluate", "--region", aaa_skill["backtracking"], "--n", "4", "--answer-regex", "",
                             "--json")
    assert code == 0, err
    assert json.loads(out)["judging"][0]["rule"]["regex"] == ""  # judged by the first line, as asked


def test_a_request_file_never_writes_where_graftui_keeps_its_models_nor_over_itself(tmp_path, monkeypatch, aaa_skill):
    monkeypatch.delenv("GRAFTUI_HOSTED", raising=False)
    home = tmp_path / "home"
    monkeypatch.setenv("GRAFTUI_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    regions_ = [str(p) for p in _two_regions(tmp_path)]

    def config(name: str, **fields) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"verb": "compose", "regions": regions_, **fields}))
        return path

    for kept in ("checkpoints/minilm-movies-f4a547c7", "models/x", "jobs/x", "sessions/x"):
        cli_refuses(["run", config("kept.json", out=str(home / kept / "union.safetensors"))],
                    "among the checkpoints, models, jobs, sessions, served graftui keeps there")
    assert not (home / "checkpoints").exists()
    selfish = config("self.json", out="self.json")
    before = selfish.read_text()
    cli_refuses(["run", selfish, "--overwrite"], "is the file this request was read from")
    own = tmp_path / "own.safetensors"  # a region file holds the request that made it
    own.write_bytes(aaa_skill["plain"].read_bytes())
    cli_refuses(["run", own, "--out", own, "--overwrite"], "is the file this request was read from")
    assert selfish.read_text() == before and own.read_bytes() == aaa_skill["plain"].read_bytes()
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"verb": "sweep", "task": "no-such-task.csv", "keep": "kept"}))
    code, out, err = run_cli("run", sweep)
    assert code == 2 and err.splitlines()[0] == f"graftui: running 'sweep' from {sweep}; it writes keep kept", err
