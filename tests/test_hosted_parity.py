"""What a hosted server offers, it runs (``-k parity``): every choice a list of the app offers goes from the form to a
queued job through the checks a server makes before queueing, and in headless Chromium every tab's main button,
pressed with its defaults, starts a job or is refused before queueing with a reason that is true. No job runs to its
end here: a queued job is enough, and the server is stopped with its queue."""

from __future__ import annotations

import re

import pytest

import browser_util as bu
from conftest import link_shared_builds
from graftui.config import DEFAULT_BASE, DEFAULT_FINETUNED, DEFAULT_TASK
from graftui.errors import message
from graftui.requests import FinetuneRequest, LocalizeRequest, choices_of
from graftui.ui import forms, jobwords, store
from graftui.ui.tabs import localize, models
from test_browser import ARTIFACTS, browser  # noqa: F401 - the module's Chromium fixture
from test_hosted_tabs import Queue


def _refusal(submit) -> str | None:
    try:
        submit()
    except Exception as err:  # noqa: BLE001 - whatever stops a form is the line a page shows
        return message(err)
    return None


def test_parity_every_choice_of_a_list_queues_on_a_hosted_server(monkeypatch, tmp_path):
    """Each base, fine-tuned model, task (the offline lm-eval harness tasks among them), method and optimizer a list
    offers passes the server's checks: Localize on each fine-tuned model (with the base and task it brings) and each
    task, every method on the default pair, Fine-tune from each base on each task with each optimizer."""
    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    monkeypatch.setattr(store, "checkpoints_dir", lambda: tmp_path / "checkpoints")  # a session's own folder
    runner, d, ft = Queue(), store.defaults(), FinetuneRequest.defaults()
    bases = [value for _, value in store.checkpoint_choices(include_base=True)]
    finetuned = [value for _, value in store.checkpoint_choices()]
    tasks = [value for _, value in models.task_choices()]
    assert {"lm-eval:graftui_movies", "lm-eval:graftui_dates"} <= set(tasks) and len(bases) > 1, (bases, tasks)

    def localize_with(base, ft_model, task, method=LocalizeRequest.defaults()["method"]):
        return lambda: forms.submit_localize(
            runner, base=base, finetuned=ft_model, task=task, columns={**forms.data_columns(task), **forms.prompt_fields()},
            method=method, log_sparsity=d["log_sparsity"], steps=d["steps"], examples_per_class=d["examples_per_class"],
            lr=d["mask_lr"])

    def finetune_with(base, task, optimizer):
        return lambda: forms.submit_finetune(
            runner, base=base, task=task, columns={**forms.data_columns(task), **forms.prompt_fields()},
            optimizer=optimizer, lr=d["ft_lr"], epochs=d["ft_epochs"], train_examples=d["ft_train_examples"],
            l1=ft["l1"], lora_rank=ft["lora_rank"])

    cases = {}
    for ft_model in finetuned:  # the pair a fine-tuned choice brings (Models: on_finetuned), then every task on it
        base, task = forms.pair_of(ft_model) or (DEFAULT_BASE, DEFAULT_TASK)
        cases.update({f"Localize {ft_model} on {t}": localize_with(base, ft_model, t) for t in dict.fromkeys([task, *tasks])})
    cases.update({f"Localize by {m}": localize_with(DEFAULT_BASE, DEFAULT_FINETUNED, DEFAULT_TASK, m)
                  for _, m in localize.method_choices()})
    cases.update({f"Fine-tune {b} on {t} with {o}": finetune_with(b, t, o) for b in bases for t in tasks
                  for o in choices_of(FinetuneRequest, "optimizer")})
    refused = {name: why for name, submit in cases.items() if (why := _refusal(submit)) is not None}
    assert not refused, "\n".join(f"{name}: {why}" for name, why in refused.items())
    assert len(runner.params) == len(cases)


# -- in Chromium ------------------------------------------------------------------------------------------------------
NO_REGION = ("no region selected: pick one from the list (or run Localize first)",
             "pick at least one region (run Localize first if the list is empty)")
# each tab's main button: (tab, its accordion to open first or None, button, its tab's status line, the refusals that
# are true on a fresh session, which has no region yet: a button that needs regions may only say so)
BUTTONS = [
    ("finetune", None, "finetune-run", "finetune-status", ()),
    ("localize", None, "localize-run", "localize-status", ()),
    ("compare", None, "compare-run", "compare-status", NO_REGION),
    ("compare", None, "predict-run", "predict-status", NO_REGION),
    ("compare", "Sparsity sweep", "sweep-run", "sweep-status", ()),
    ("anatomy", None, "anatomy-ablate-run", "anatomy-ablate-status", NO_REGION),
    ("compose", None, "compose-run", "compose-status", ("pick at least 2 regions",)),
    ("lab", None, "lab-multitask-run", "lab-multitask-status", ()),
    ("lab", None, "lab-wise-run", "lab-wise-status", NO_REGION),
    ("lab", None, "lab-retrain-run", "lab-retrain-status", NO_REGION),
    ("lab", None, "lab-continual-run", "lab-continual-status", ()),
    ("lab", None, "lab-reproduce-run", "lab-reproduce-status", ()),
    ("regions", None, "region-export", "region-export-status", NO_REGION),
]


@pytest.fixture(scope="module")
def hosted_server(tmp_path_factory, shared_builds):
    home = link_shared_builds(tmp_path_factory.mktemp("graftui-parity-home"), shared_builds)
    # as the Space runs (no GRAFTUI_FAST): its defaults, and a default model built for minutes while the jobs wait
    # room for every job one page queues here: the caps on jobs are the server's load, not a check of a request
    srv = bu.started(home, "parity-server", fast=False, hosted=True,
                     extra_env={"GRAFTUI_SESSION_JOBS": "50", "GRAFTUI_CLIENT_JOBS": "50", "GRAFTUI_MAX_JOBS": "50"})
    yield srv
    srv.stop()  # with its queue: no job of this test runs to its end


# Every text the header and a tab's status line show, noted as it comes: a refusal may be replaced within a tick (a poll
# that ends another job, a picker refreshed), and the test must read the answer to its own press.
WATCH_LINES = """(ids) => { window.__lines = []; const note = () => ids.forEach(id => {
    const e = document.getElementById(id); if (e) window.__lines.push([id, e.innerText.trim()]); });
  if (window.__watch) window.__watch.disconnect();
  window.__watch = new MutationObserver(note);
  window.__watch.observe(document.body, {subtree: true, childList: true, characterData: true}); }"""
ANSWER = """([status, before]) => { for (const [id, t] of window.__lines) {
    const m = /Submitted [\\s\\S]*?\\(job (\\S+?)\\)/.exec(t);
    if (id === 'status-message' && m && m[1] !== before) return ['job', m[1]];
    if (id === status && t.startsWith('⚠️')) return ['refused', t.slice(2).trim()]; }
  return null; }"""


def _pressed(page, button: str, status: str, timeout_s: float = 60.0) -> tuple[str, str]:
    """Press ``button``: ("job", its id) once the header's banner names a new job, or ("refused", the line its tab's
    status line shows)."""
    before = bu.job_id_from_status(page) or ""
    page.evaluate(WATCH_LINES, ["status-message", status])
    page.click(f"#{button}")
    try:
        return tuple(page.wait_for_function(ANSWER, arg=[status, before],
                                            timeout=timeout_s * 1000).json_value())
    except Exception:
        raise AssertionError(f"pressing #{button} neither queued a job nor said why within {timeout_s:.0f} s; header "
                             f"{bu.text(page, '#status-message')!r}") from None


@pytest.mark.browser
def test_parity_every_tabs_main_button_with_its_defaults_starts_a_job_or_says_a_true_reason(browser, hosted_server):  # noqa: F811
    context = browser.new_context(viewport=bu.VIEWPORT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    outcomes = {}
    try:
        bu.wait_usable(page, hosted_server.url, timeout_s=90)
        bu.open_tab(page, "localize")
        assert not [r for r in bu.table_rows(page, "region-list") if r and r[0]], "a fresh session has no region"
        for tab, accordion, button, status, true_refusals in BUTTONS:
            bu.open_tab(page, tab)
            if accordion:
                page.click(f"text={accordion}")
            outcome, said = _pressed(page, button, status)
            outcomes[button] = (outcome, said)
            if outcome == "refused":
                assert said in true_refusals, f"#{button} with its defaults was refused: {said}"
        print("\n[parity] " + "; ".join(f"{b}: {o} {s}" for b, (o, s) in outcomes.items()))
        assert {b for b, (o, _) in outcomes.items() if o == "job"} >= {"finetune-run", "localize-run", "sweep-run"}
        # every job of the queue, of every verb, says when it should start and end (a running one: what is left)
        page.wait_for_function("() => document.querySelector('#jobs-table').innerText.includes('ends in')",
                               timeout=60_000)
        jobs = [dict(zip(jobwords.JOB_COLUMNS, r)) for r in bu.table_rows(page, "jobs-table") if r]
        waiting = [j for j in jobs if j["status"] in ("queued", "running")]
        print("[parity] jobs: " + "; ".join(f"{j['kind']} {j['status']} {j['progress']}" for j in jobs))
        assert len({j["kind"] for j in waiting}) >= 5, jobs
        untold = [j for j in waiting if not re.search(r"starts in about .+, ends in about |left$", j["progress"])]
        assert not untold, untold
        assert "Traceback" not in page.inner_text("body") and not errors, errors[:5]
    except Exception:
        bu.save_artifacts(page, "parity", ARTIFACTS, hosted_server)
        raise
    finally:
        context.close()
