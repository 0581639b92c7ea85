"""A hosted server's pages never learn a server path or a session id, and its files go to their own session only.

The app runs in this process with ``GRAFTUI_HOSTED=1`` (the fixture of ``test_hostile``) and is driven over its
HTTP API as a stranger would drive it: ``gradio_client`` for the events, ``urllib`` for Gradio's file route.
A session's workspace path carries its id, and the id resumes the session; so no answer may carry either
(dropdown values, tables, messages, job requests, downloaded files), the file route serves nothing from a
workspace, and the page's own downloads come from copies that name no session. The address a job is counted
against is the socket's peer unless the operator configured a proxy.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

from test_hostile import LOCALIZE, WARN, files, release, server, upload  # noqa: F401 - the module's hosted server and files

pytestmark = pytest.mark.e2e


def get(server, path: str) -> tuple[int, bytes]:
    """GET a path of the server as any client would: (status, body)."""
    try:
        with urllib.request.urlopen(server.url + path, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def file_route(path) -> str:
    return "gradio_api/file=" + urllib.parse.quote(str(path))


def leaks(server, sid: str, answer) -> list[str]:
    """What of the session's key or the server's folders an answer shows: the id, GRAFTUI_HOME, the workspace."""
    text = json.dumps(answer, default=str)
    return [needle for needle in (sid, str(server.home), str(server.home.resolve()), "/sessions/") if needle in text]


def saved_region(server, sid: str, files):
    """A region saved in the session's own folder, as Localize or an upload would leave it."""
    from graftui import regions
    from graftui.ui import store

    with store.session(sid):
        record = regions.load(files["region"])
        record.meta.request = {"verb": "localize", "task": str(server.home / "sessions" / sid / "uploads" / "x.csv")}
        return store.save_region(record)


def test_the_file_route_serves_no_workspace_and_the_owner_downloads_its_own(server, files):
    from safetensors import safe_open

    from graftui import regions

    a, b = server.session(), server.session()
    server.call("/on_data_upload", a, upload(files["good"]))
    region = saved_region(server, a, files)
    own = [region, *(server.home / "sessions" / a / "uploads").glob("*/*.csv")]
    assert len(own) == 2
    for path in own:  # whoever holds the path (the tester found it in a dropdown): never served
        status, body = get(server, file_route(path))
        assert status == 403 and not body, (path, status)
    server.refuses("/on_region_select", (b, region.stem), "not saved here")  # another session: not by its id either

    out = server.call("/on_region_select", a, region.stem)  # the owner's page: skill patch, indices, metadata
    assert not leaks(server, a, out), leaks(server, a, out)
    for served in out[:2]:  # the download buttons' files
        url = served["value"]["url"]
        assert a not in url and "/sessions/" not in url and str(server.home) not in url, url
        status, body = get(server, url[url.index("gradio_api/"):])
        assert status == 200 and body, (url, status)
        copy = server.home / "fetched.safetensors"
        copy.write_bytes(body)
        record = regions.load(copy)
        assert record.size == regions.load(region).size  # the region itself, whole
        with safe_open(str(copy), framework="pt") as fh:
            meta = json.dumps(fh.metadata())
        assert a not in meta and str(server.home) not in meta, meta[:400]
        assert "workspace:uploads/x.csv" in meta  # its request names the upload as the page names it
    print(f"[hosted] the owner's download: {out[0]['value']['url']}")


def test_what_a_page_receives_names_no_server_path_nor_session(server, files):
    """An uploaded data set and region, the polled lists and panels of every tab, and a job's request (shown and
    downloaded) carry no session id and no server path; the page's name for its upload works in its requests."""
    from gradio_client import Client

    from graftui.ui import store

    a = server.session()
    answers = {}
    answers["data upload"] = out = server.call("/on_data_upload", a, upload(files["good"]))
    task = out[0]["value"]
    assert task.startswith("workspace:uploads/") and task.endswith("/good.csv"), task
    assert task in [c[1] for c in out[0]["choices"]]
    checked = server.call("/on_check_mapping", a, task, "(guess)", "(none)", "(guess)")
    assert not any(str(o).startswith(WARN) for o in checked), checked  # taken back as the session's own file
    assert "good" in checked[0]
    answers["region upload"] = server.call("/on_region_upload", a, upload(files["region"]))
    region = saved_region(server, a, files)
    answers["region picked"] = server.call("/on_region_select", a, region.stem)

    api = Client(server.url, verbose=False, download_files=False).view_api(return_format="dict", print_info=False)
    ticks = [name for name in api["named_endpoints"] if name.startswith("/tick")]
    assert len(ticks) >= 8  # one per tab
    for name in ticks:  # every tab's poll: region pickers and lists, checkpoint pickers, job panels
        n = len(api["named_endpoints"][name]["parameters"])
        answers[name] = server.call(name, a, *[None] * (n - 1))

    gate = threading.Event()
    blocker = store.runner().submit("prepare", "server's own job", lambda ctx: gate.wait(60) and {}, server=True)
    try:
        status = server.call("/on_localize", a, "minilm", "minilm-movies", task, "(guess)", "(none)", "(guess)",
                             "learned", -3, 5, 8, 0.02, "auto", "", "")[0]
        assert status.startswith("Submitted"), status
        job = next(j for j in store.runner().runner.jobs() if j.owner == a)
        assert str(server.home) in json.dumps(job.params)  # the job itself reads the server's path
        answers["job picked"] = picked = server.call("/on_job_pick", a, job.id)
        assert '"task": "workspace:uploads/' in picked[0], picked[0][:300]
        url = picked[1]["value"]["url"]
        status, body = get(server, url[url.index("gradio_api/"):])
        assert status == 200 and json.loads(body)["task"] == task
        assert not leaks(server, a, body.decode())
    finally:
        ended = release(gate, blocker)
    assert ended.status == "done"
    for what, answer in answers.items():
        assert not leaks(server, a, answer), (what, leaks(server, a, answer), json.dumps(answer, default=str)[:600])
    print(f"[hosted] {len(answers)} answers checked; the upload is named {task!r}")


def test_a_name_that_leads_out_of_the_workspace_is_refused_in_one_line(server, files):
    a, b = server.session(), server.session()
    task = server.call("/on_data_upload", a, upload(files["good"]))[0]["value"]
    line = server.refuses("/on_check_mapping", (b, task, "(guess)", "(none)", "(guess)"), "local paths such as "
                          f"'{task}' are disabled here")  # A's name for its upload names B's own folder: not there
    assert a not in line and b not in line and str(server.home) not in line, line
    for forged in ("workspace:../" + a + "/uploads/", "workspace:../../sessions", "workspace:/etc/passwd"):
        line = server.refuses("/on_check_mapping", (b, forged, "(guess)", "(none)", "(guess)"), f"'{forged}' is")
        assert b not in line and str(server.home) not in line, line  # left as it came, and refused as unknown


def test_a_loopback_clients_forwarded_for_is_believed_only_behind_a_configured_proxy(server, monkeypatch):
    """Without GRAFTUI_TRUSTED_PROXIES (its default: 0) a client on the loopback address that sends X-Forwarded-For
    is counted as itself, so new headers do not buy it more jobs; with one proxy configured, the header's last
    entry is the client."""
    from gradio_client import Client

    from graftui import settings
    from graftui.ui import store

    assert settings.TRUSTED_PROXIES == 0  # the library's default (the Dockerfile sets 1 for a Space's proxy)
    monkeypatch.setattr(settings, "CLIENT_JOBS", 2)
    gate = threading.Event()
    blocker = store.runner().submit("prepare", "server's own job", lambda ctx: gate.wait(60) and {}, server=True)
    try:
        lines = []
        for i in range(3):
            forger = Client(server.url, verbose=False, download_files=False,
                            headers={"X-Forwarded-For": f"10.9.9.{i}"})
            sid = forger.predict("", api_name="/on_load")[1]
            assert store.session_client(sid) == "127.0.0.1", store.session_client(sid)
            lines.append(forger.predict(sid, *LOCALIZE, -3, 50 + i, 8, 0.02, "auto", "", "",
                                        api_name="/on_localize")[0])
        assert [line.startswith("Submitted") for line in lines] == [True, True, False], lines
        assert "from your address" in lines[2], lines[2]
        monkeypatch.setattr(settings, "TRUSTED_PROXIES", 1)
        proxied = Client(server.url, verbose=False, download_files=False,
                         headers={"X-Forwarded-For": "6.6.6.6, 10.0.0.7"})
        sid = proxied.predict("", api_name="/on_load")[1]
        assert store.session_client(sid) == "10.0.0.7"  # the address the one trusted proxy appended
        line = proxied.predict(sid, *LOCALIZE, -3, 60, 8, 0.02, "auto", "", "", api_name="/on_localize")[0]
        assert line.startswith("Submitted"), line  # another client: its own quota
    finally:
        ended = release(gate, blocker)
    assert ended.status == "done"
