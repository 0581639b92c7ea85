"""Push to the Hub, a section of the Regions tab: the selected region as a skill patch or a grafted checkpoint,
with its model card, pushed by a job (flows.hub.push).

Locally the push uses this machine's Hub token, as ``graftui push`` does. On a hosted server it uses only the
visitor's own Hugging Face sign-in (Gradio's login button and OAuth token, on a Space), never the server's
token; the token goes from the click to the job's function and nowhere else.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.util import find_spec
from typing import Optional

import gradio as gr
from gradio.utils import get_space

from ... import settings
from ...requests import PushRequest
from .. import forms, jobwords, store
from ..wiring import request_radio

WHAT = {"patch": "skill patch (small; applied to the base model)", "checkpoint": "grafted checkpoint (a full model)"}
KINDS = ("push",)
LOCAL_NOTE = ("Pushes with this machine's Hugging Face token (`hf auth login` or HF_TOKEN), as `graftui push` does. "
              "The repository gets the file, a model card with the graft's metrics and `request.json`.")
SPACE_NOTE = ("Sign in with your Hugging Face account to push: the push uses your sign-in only, never this server's "
              "token, and it is not kept. The repository gets the file, a model card and `request.json`.")
NO_SIGN_IN_NOTE = ("Pushing needs a Hugging Face sign-in, which this server does not offer: download the skill patch "
                   "above and push it from your own machine with `graftui push`.")

_visitor: ContextVar[str | None] = ContextVar("graftui_visitor_token", default=None)


OAUTH_EXTRA = ("authlib", "itsdangerous")  # what ``gradio[oauth]`` installs; without it a login button stops the app


def sign_in_offered() -> bool:
    """Whether this server shows Gradio's login button: a hosted server on a Space (where Gradio's OAuth is
    real; elsewhere it signs everyone in as the machine's own account) with Gradio's OAuth extra installed."""
    return (settings.hosted() and get_space() is not None
            and all(find_spec(name) is not None for name in OAUTH_EXTRA))


def visitor_token() -> str | None:
    """The token of the click being handled: hosted, the visitor's sign-in (None without one); locally None,
    so the push uses the machine's own token."""
    return _visitor.get() if settings.hosted() else None


@contextmanager
def _signed_in(token):
    mark = _visitor.set(getattr(token, "token", None) or None)
    try:
        yield
    finally:
        _visitor.reset(mark)


def with_sign_in(event):
    """``event`` as ``page.on`` calls it, wired to a function that Gradio also hands the visitor's sign-in: Gradio
    fills a parameter annotated ``gr.OAuthToken | None``, which ``page.on``'s wrappers would hide, so the wired
    function declares one after the inputs and the handler reads it with :func:`visitor_token` while it runs."""

    def wire(fn, inputs, outputs, **kwargs):
        def handler(*args):
            *values, token = args
            with _signed_in(token):
                return fn(*values)

        params = [inspect.Parameter(f"input_{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in range(len(inputs))]
        params.append(inspect.Parameter("oauth_token", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                        annotation=Optional[gr.OAuthToken]))
        handler.__signature__ = inspect.Signature(params)
        handler.__annotations__ = {"oauth_token": Optional[gr.OAuthToken]}
        handler.__name__ = getattr(fn, "__name__", "handler")
        return event(handler, inputs, outputs, **kwargs)

    return wire


def render_push(job) -> list:
    """The pushed repository's address once the job is done (its errors show in the status line above)."""
    result = (job.result or {}) if job is not None and job.status == "done" else {}
    url = result.get("repo_url")
    if not url:
        return [""]
    what = "grafted checkpoint" if (result.get("request") or {}).get("what") == "checkpoint" else "skill patch"
    commit = f" ([commit]({result['url']}))" if result.get("url") else ""
    return [f"✓ Pushed the {what} to [{jobwords.md(result['repo'])}]({url}){commit}."]


def build(page, tab, region) -> None:
    """The section, at the end of the Regions tab ``tab``, for the region picked in ``region``."""
    defaults = PushRequest.defaults()
    with tab:
        gr.Markdown("### Push to the Hugging Face Hub")
        offered = sign_in_offered()
        gr.Markdown((SPACE_NOTE if offered else NO_SIGN_IN_NOTE) if settings.hosted() else LOCAL_NOTE,
                    elem_id="push-note")
        if offered:
            gr.LoginButton(elem_id="push-login")
        with gr.Row():
            repo = gr.Textbox(label="Repository (owner/name)", placeholder="you/movies-skill-patch", elem_id="push-repo")
            what = request_radio(PushRequest, "what", WHAT, label="What to push", elem_id="push-what")
            private = gr.Checkbox(defaults["private"], label="Private repository", elem_id="push-private")
            n = gr.Number(defaults["n"], precision=0, label="Test examples scored for the card (0: no metrics)",
                          elem_id="push-n")
        run = gr.Button("Push to the Hub", variant="primary", elem_id="push-run")
        status_md = gr.Markdown("", elem_id="push-status")
        result_md = gr.Markdown("", elem_id="push-result")

    @page.guard(beside=status_md, region=region, repo=repo, what=what, private=private, n=n)
    def on_push(region_id, repo_id, what_value, private_value, n_value):
        job = forms.submit_push(store.runner(), region_id=region_id, repo=repo_id, what=what_value,
                                  private=private_value, n=n_value, token=visitor_token())
        return jobwords.submitted_line(job), job.id, gr.skip()  # the panel writes the line (see ``submitted``)

    push_job = page.state("")  # the push this page started: its panel shows that one
    page.on(with_sign_in(run.click), on_push, [region, repo, what, private, n], [page.status, push_job, status_md])
    page.panel("regions", KINDS, None, status_md, [result_md], render_push, "", fixed_state=push_job)
