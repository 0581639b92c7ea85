"""A restarted app runs again what it held: a localization that waited is made again from its record (its request)
and ends with its region saved, as the page reads it; a hosted visitor's job whose session expired, a push (its token
is never kept) and a record of no request stay interrupted."""

from __future__ import annotations

import json

import pytest

from graftui import settings
from graftui.config import DEFAULT_FINETUNED
from graftui.flows.common import ensure_default
from graftui.jobs import DONE, INTERRUPTED, QUEUED, Job
from graftui.requests import LocalizeRequest
from graftui.ui import forms, store


def _held(job: Job) -> Job:
    """Leave ``job``'s record in the jobs folder as a server that stopped while holding it would have."""
    folder = settings.shared("jobs") / job.id
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps(job.as_dict()))
    return job


@pytest.mark.e2e
def test_a_restarted_app_runs_the_localization_it_held_from_its_record(monkeypatch):
    ensure_default(DEFAULT_FINETUNED)  # built once for the run, not within the job's wait
    monkeypatch.setattr(store, "_runner", None)  # the server that starts next
    request = LocalizeRequest.make(method="learned", steps=3, sparsity=1e-3, examples_per_class=8, check_n=0)
    held = _held(Job(id="20260101-000000-aaaaaa", kind="localize", title="held", params=request.as_dict(),
                     status=QUEUED, created=1.0))
    assert store.revive(forms.revive) == [held.id]
    done = store.runner().wait(held.id, timeout=300)
    assert done.status == DONE, (done.status, done.message, done.error)
    assert done.message == "done" and store.region_path(done.result["region"]).is_file(), done.result.get("region")
    assert done.result["summary"] and done.params == held.params  # what the page reads of it, as if just submitted


def test_records_that_make_no_job_again_stay_interrupted(monkeypatch):
    monkeypatch.setattr(store, "_runner", None)
    request = LocalizeRequest.make(steps=3)
    expired = "A" * 32  # a hosted session's id whose workspace is gone
    held = [_held(Job(id=f"20260101-00000{i}-bbbbbb", kind=kind, title=kind, params=params, status=QUEUED,
                      created=float(i), owner=owner))
            for i, (kind, params, owner) in enumerate([("localize", request.as_dict(), expired),
                                                       ("push", {"verb": "push", "region": "r", "repo": "a/b"}, None),
                                                       ("prepare", {"base": "minilm"}, None)])]
    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    assert forms.revive(held[0]) is None and forms.revive(held[1]) is None and forms.revive(held[2]) is None
    monkeypatch.delenv("GRAFTUI_HOSTED")
    assert store.revive(lambda job: forms.revive(job) if job.kind != "localize" else None) == []
    assert {store.runner().get(j.id).status for j in held} == {INTERRUPTED}
