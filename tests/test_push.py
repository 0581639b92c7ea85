"""Pushing to the Hub from the library and the app, up to the network call (the Hub API is faked).

Locally the machine's token is used; on a hosted server only the visitor's own sign-in (Gradio's OAuth
token), never the server's HF_TOKEN; without a sign-in nothing is sent; the token is written nowhere.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import make_tiny_pair

VISITOR, SERVER, MACHINE = "hf_visitor_sign_in_0123", "hf_servers_own_token_4567", "hf_machines_login_89ab"


def tiny_patch(path: Path) -> Path:
    """A skill patch of the tiny pair, saved at ``path`` (no model is loaded to push it with n = 0)."""
    from graftui import regions
    from graftui.localizers import Budget, run_method

    pair, _, _ = make_tiny_pair()
    region, _ = run_method(pair, Budget(k=20), "top-movement")
    record = regions.with_patch(pair, regions.make_record(pair, region, {"method": "top-movement", "task": "movies"}))
    path.parent.mkdir(parents=True, exist_ok=True)
    regions.save(record, path)
    return path


@pytest.fixture
def hub_calls(monkeypatch):
    """The Hub API the push uses, faked: each call with the token its HfApi was given."""
    import huggingface_hub

    calls = []

    def create_repo(self, repo_id, **kw):
        calls.append(("create_repo", self.token, repo_id, kw))

    def create_commit(self, repo_id, operations, **kw):
        calls.append(("create_commit", self.token, repo_id, sorted(op.path_in_repo for op in operations)))
        return huggingface_hub.CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/abc", commit_message="m",
                                          commit_description="", oid="abc")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", create_commit)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    return calls


def test_the_push_token_is_the_callers_or_locally_the_machines_never_a_hosted_servers(tmp_path, monkeypatch,
                                                                                         hub_calls):
    import huggingface_hub

    from graftui.errors import RequestError
    from graftui.flows import hub
    from graftui.requests import PushRequest

    patch = tiny_patch(tmp_path / "patch.safetensors")
    req = PushRequest.make(repo="someone/movies-skill", region=str(patch), n=0, private=True)
    monkeypatch.delenv("GRAFTUI_HOSTED", raising=False)
    monkeypatch.setenv("HF_TOKEN", MACHINE)
    result = hub.push(req)  # locally: the machine's token, as the CLI
    assert [c[:3] for c in hub_calls] == [("create_repo", MACHINE, "someone/movies-skill"),
                                          ("create_commit", MACHINE, "someone/movies-skill")]
    assert hub_calls[0][3] == {"private": True, "exist_ok": True}
    assert hub_calls[1][3] == ["README.md", "request.json", "skill_patch.safetensors"]
    assert result.repo_url == "https://huggingface.co/someone/movies-skill"
    assert result.url == "https://huggingface.co/someone/movies-skill/commit/abc"
    hub_calls.clear()
    hub.push(req, token=VISITOR)  # a token given for the call wins
    assert {c[1] for c in hub_calls} == {VISITOR}

    hub_calls.clear()
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(RequestError) as err:  # no token on this machine: one line naming the fix, nothing sent
        hub.push(req)
    assert str(err.value) == hub.NO_TOKEN and "hf auth login" in hub.NO_TOKEN and hub_calls == []

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")  # hosted: the server's HF_TOKEN is set, and never used
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: SERVER)
    monkeypatch.setenv("HF_TOKEN", SERVER)
    with pytest.raises(RequestError) as err:
        hub.push(req)
    assert str(err.value) == "Sign in with Hugging Face to push" and hub_calls == []
    result = hub.push(req, token=VISITOR)
    assert [c[:2] for c in hub_calls] == [("create_repo", VISITOR), ("create_commit", VISITOR)]
    assert VISITOR not in repr(req) and VISITOR not in str(result.as_dict())


def test_a_refused_push_is_one_line_that_names_the_fix(tmp_path, monkeypatch):
    import httpx2
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    from graftui.errors import RequestError, message
    from graftui.flows import hub
    from graftui.requests import PushRequest

    def refuse(status):
        def create_repo(self, repo_id, **kw):
            response = httpx2.Response(status, request=httpx2.Request("POST", "https://huggingface.co/api/repos/create"))
            raise HfHubHTTPError(f"{status} Client Error\nmore detail", response=response)
        return create_repo

    patch = tiny_patch(tmp_path / "patch.safetensors")
    req = PushRequest.make(repo="someone/movies-skill", region=str(patch), n=0)
    monkeypatch.delenv("GRAFTUI_HOSTED", raising=False)
    for status, words in ((401, "the Hub did not accept the token (401, expired or revoked): run `hf auth login` again"),
                          (403, "the Hub refused to write to 'someone/movies-skill' (403): push to a repository under "
                                "your own name"),
                          (500, "the Hub refused the push to 'someone/movies-skill' (500): 500 Client Error; check")):
        monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refuse(status))
        with pytest.raises(RequestError) as err:
            hub.push(req, token=VISITOR)
        line = message(err.value)
        assert line.startswith(words) and "\n" not in line and VISITOR not in line, line


# -- the app: the Regions tab's Push to the Hub section ------------------------------------------------
@pytest.fixture(scope="module")
def space_app(tmp_path_factory):
    """The app as a hosted Space builds it (sign-in offered), once for the module's tests."""
    import gradio.routes

    from graftui.ui import app, store
    from graftui.ui.tabs import push

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gradio.routes, "attach_oauth", lambda app: None)  # Gradio's own OAuth routes need a real Space
        mp.setenv("GRAFTUI_HOME", str(tmp_path_factory.mktemp("build-home")))
        mp.setenv("GRAFTUI_HOSTED", "1")
        mp.setenv("SYSTEM", "spaces")
        mp.setenv("SPACE_ID", "someone/graftui")
        mp.setattr(push, "find_spec", lambda name: SimpleNamespace(name=name))  # Gradio's OAuth extra, as on a Space
        mp.setattr(store, "default_ready", lambda key=None: True)
        assert push.sign_in_offered()
        demo = app.build_app()
    return demo


def _by_id(demo) -> dict:
    return {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}


def _push_handler(demo):
    return next(fn for fn in demo.fns.values() if fn.name == "on_push")


def _click(demo, sid, region_id, repo, signed_in: str | None):
    """A press of Push as Gradio makes it: the page's inputs, and the sign-in Gradio reads from the visitor's
    own session cookie and hands to the handler by its ``gr.OAuthToken`` parameter."""
    from gradio import helpers

    fn = _push_handler(demo)
    info = {"access_token": signed_in, "scope": "openid profile write-repos manage-repos",
            "expires_at": time.time() + 3600, "userinfo": {}} if signed_in else None
    request = SimpleNamespace(session={"oauth_info": info} if info else {})
    inputs, *_ = helpers.special_args(fn.fn, [sid, region_id, repo, "patch", False, 0, False], request)
    got = fn.fn(*inputs)
    return got if isinstance(got, dict) else dict(zip(fn.outputs, got))  # a failure answers {component: value}


@pytest.fixture
def home(tmp_path, monkeypatch):
    from graftui.ui import store

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(store, "_runner", None)
    return tmp_path / "home"


def _files_holding(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_a_hosted_push_uses_the_visitors_sign_in_only_and_writes_it_nowhere(space_app, home, monkeypatch, hub_calls):
    import gradio as gr

    from graftui import regions
    from graftui.ui import store
    from graftui.ui.tabs import push

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    monkeypatch.setenv("HF_TOKEN", SERVER)  # the server's own token is set: it must never be used
    by_id = _by_id(space_app)
    assert isinstance(by_id["push-login"], gr.LoginButton) and by_id["push-note"].value == push.SPACE_NOTE
    status, beside = by_id["status-message"], by_id["push-status"]
    sid = store.resume(None)
    record = regions.load(tiny_patch(home / "made" / "p.safetensors"))
    with store.session(sid):
        region_id = store.save_region(record).stem

    out = _click(space_app, sid, region_id, "someone/movies-skill", signed_in=None)  # not signed in: nothing sent
    assert out[status] == out[beside] == "⚠️ Sign in with Hugging Face to push"
    assert store.runner().runner.jobs() == [] and hub_calls == []
    out = _click(space_app, sid, region_id, "not a repo", signed_in=VISITOR)
    assert out[status].startswith("⚠️ Repository must be owner/name") and store.runner().runner.jobs() == []

    out = _click(space_app, sid, region_id, "someone/movies-skill", signed_in=VISITOR)
    assert out[status].startswith("Submitted **Push") and "⚠️" not in out[beside]
    job = store.runner().runner.wait(out[_push_handler(space_app).outputs[1]], timeout=60)
    assert job.status == "done", job.error
    assert [c[:3] for c in hub_calls] == [("create_repo", VISITOR, "someone/movies-skill"),
                                          ("create_commit", VISITOR, "someone/movies-skill")]
    assert job.owner == sid and job.params["verb"] == "push" and "token" not in job.params
    assert push.render_push(job) == ["✓ Pushed the skill patch to [someone/movies-skill]"
                                     "(https://huggingface.co/someone/movies-skill) "
                                     "([commit](https://huggingface.co/someone/movies-skill/commit/abc))."]
    assert VISITOR not in repr(job) and VISITOR not in str(job.as_dict())
    assert _files_holding(home, VISITOR) == [] and _files_holding(home, SERVER) == []  # jobs, workspace, logs


def test_the_local_app_pushes_with_the_machines_token(space_app, home, monkeypatch, hub_calls):
    from graftui import regions
    from graftui.ui import store
    from graftui.ui.tabs import push

    monkeypatch.delenv("GRAFTUI_HOSTED", raising=False)
    monkeypatch.setenv("HF_TOKEN", MACHINE)
    assert not push.sign_in_offered()  # no login button on a local page
    region_id = store.save_region(regions.load(tiny_patch(home / "made" / "p.safetensors"))).stem
    out = _click(space_app, "", region_id, "someone/local-skill", signed_in=VISITOR)  # a stray cookie is not used
    job = store.runner().runner.wait(out[_push_handler(space_app).outputs[1]], timeout=60)
    assert job.status == "done", job.error
    assert [c[:2] for c in hub_calls] == [("create_repo", MACHINE), ("create_commit", MACHINE)]
    assert _files_holding(home, MACHINE) == []
