"""Push a skill patch or a grafted checkpoint to the Hugging Face Hub, with a model card.

Everything up to the network call is built locally and can be looked at first (``--out DIR``):
the files, the card (``huggingface_hub.ModelCard``: base model, fine-tuned model, task, budget,
metrics, and ``graftui run request.json`` to make the region again) and the commit operations.
The token is the caller's for this one call (the app hands over a visitor's Hugging Face sign-in), else
``huggingface_hub``'s own (``HF_TOKEN`` or a login), as for every Hub tool; a hosted server pushes only
with the caller's, never its own. graftui neither stores nor writes a token: it is no field of the
request, so no request file, report, job record or log holds it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import card, regions, settings
from ..errors import RequestError
from ..kinds import CLASSIFICATION, kind_named
from ..requests import EvaluateRequest, ExportRequest, PushRequest, derive
from ..version import __version__
from . import text
from .common import LOCAL, Guard, Progress, Result, finish, latest_region, load_region
from .regionfiles import export
from .registry import verb
from .single import evaluate

PATCH_FILE = "skill_patch.safetensors"
SIGN_IN = "Sign in with Hugging Face to push"  # a hosted server's answer to a push without the visitor's sign-in
NO_TOKEN = ("no Hugging Face token on this machine: run `hf auth login` (or set HF_TOKEN) with a token that may "
            "write, then push again")


@dataclass
class PushResult(Result):
    repo: str = ""
    url: str | None = None  # of the commit; None when only written to --out
    out: str | None = None
    files: list[str] = field(default_factory=list)
    card_text: str = ""
    repo_url: str | None = None  # the repository's page; None when only written to --out


def hub_token(given: str | None = None) -> str:
    """The token a push uses: ``given``, the caller's own for this call; else, except on a hosted server,
    ``huggingface_hub``'s (HF_TOKEN or ``hf auth login``). A hosted server never pushes with its own token,
    even when HF_TOKEN is set: without the caller's it answers :data:`SIGN_IN`."""
    if given:
        return given
    if settings.hosted():
        raise RequestError(SIGN_IN)
    from huggingface_hub import get_token

    found = get_token()
    if not found:
        raise RequestError(NO_TOKEN)
    return found


def hub_refusal(err: BaseException, repo: str) -> RequestError:
    """The Hub's refusal of a push as one line that names the fix (the token is never part of it)."""
    status = getattr(getattr(err, "response", None), "status_code", None)
    again = "sign in with Hugging Face again" if settings.hosted() else "run `hf auth login` again"
    if status == 401:
        return RequestError(f"the Hub did not accept the token (401, expired or revoked): {again}, then push again")
    if status == 403:
        return RequestError(f"the Hub refused to write to '{repo}' (403): push to a repository under your own name or "
                            "an organisation you may write to, with a token that may write repositories")
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return RequestError(f"the Hub refused the push to '{repo}' ({status or 'no answer'}): {first}; check the "
                        "repository id and your connection, then push again")


def _cell(row: dict, key: str) -> str:
    """A metric of the card's table: the score with its 95 % interval, the share of FT's gain, or a number."""
    if key == "gain_recovered":
        return card.pct(row.get(key))
    value = f"{row[key]:.3f}" if row.get(key) is not None else "-"
    ci = row.get("accuracy_ci") if key == "score" else None
    return value + (f" ({ci[0]:.3f}–{ci[1]:.3f})" if ci and None not in ci else "")


def model_card(req: PushRequest, record, metrics: list[dict], region_file: str, kind=CLASSIFICATION):
    """The repository's README: YAML metadata (ModelCardData) and a body that says what the files are; the metrics
    table in the columns of the task's ``kind``."""
    from huggingface_hub import ModelCard, ModelCardData

    m = record.meta
    base, finetuned, task = req.base or m.base, m.finetuned, m.task
    data = ModelCardData(base_model=base if base and "/" in str(base) and not Path(str(base)).exists() else None,
                         library_name="transformers" if req.what == "checkpoint" else None,
                         tags=["graftui", "skill-localization", "model-grafting"])
    frac = m.fraction_of_graftable
    lines = [f"# {req.repo.split('/')[-1]}", "",
             ("A **skill patch**" if req.what == "patch" else "A **grafted checkpoint**")
             + f" made with graftui {__version__}: the graft θ̄(γ) = θ_pre + γ ⊙ (θ_ft − θ_pre) of a region γ of "
             f"{record.size:,} parameters" + (f" ({100 * frac:.3f} % of the graftable set)" if frac else "")
             + " (Panigrahi et al., *Task-Specific Skill Localization in Fine-tuned Language Models*, ICML 2023).",
             "", "| | |", "|---|---|",
             f"| base model | `{base}` |", f"| fine-tuned model | `{finetuned}` |", f"| task | `{task}` |",
             f"| method | {m.method} |", f"| budget | {m.budget or f'k = {record.size:,}'} |",
             f"| region | {card.pct(frac, 3) if frac else ''} · k = {record.size:,} · content id "
             f"`#{regions.digest(record.indices)}` |", ""]
    if metrics:
        columns = kind.markdown_columns
        lines += ["## Metrics", "", "| model | task | n | " + " | ".join(h for h, _ in columns) + " |",
                  "|---|---|---|" + "---|" * len(columns)]
        lines += [f"| {r['model']} | {r['task']} | {r['n']:,} | " + " | ".join(_cell(r, key) for _, key in columns) + " |"
                  for r in metrics]
        lines.append("")
    lines += ["## Use", ""]
    if req.what == "patch":
        lines += ["```bash", f"graftui export --region {PATCH_FILE}  # θ_pre + the patch, as a normal checkpoint",
                  f"graftui evaluate --region {PATCH_FILE}", "```"]
    else:
        lines += ["A normal Hugging Face checkpoint: load it with `AutoModel…from_pretrained`."]
    lines += ["", "## Make it again", "", "`request.json` holds the request that made the region:", "",
              "```bash", "graftui run request.json", "```", "", f"Region file: `{region_file}`.", ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def operations(folder: Path) -> list:
    """One CommitOperationAdd per file of ``folder``, at its path relative to the folder."""
    from huggingface_hub import CommitOperationAdd

    return [CommitOperationAdd(path_in_repo=str(f.relative_to(folder)), path_or_fileobj=str(f))
            for f in sorted(folder.rglob("*")) if f.is_file()]


@verb(PushRequest, "push a skill patch or grafted checkpoint to the Hugging Face Hub, with a model card", text.push)
def push(req: PushRequest, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL,
         token: str | None = None) -> PushResult:
    """Build the files and the card, then (unless ``out`` is given) create the repo and commit them.

    ``token``: the caller's Hub token for this call only (:func:`hub_token` says which is used without one).
    """
    req.validate()
    start = time.time()
    if req.out is None:
        token = hub_token(token)  # before any work: a push that cannot be sent is refused at once
    path = req.region or str(latest_region())
    record = load_region(path)
    notes: list[str] = []
    metrics: list[dict] = []
    kind = CLASSIFICATION
    if req.n:
        if progress:
            progress({"stage": "scoring the graft for the card", "fraction": 0.1})
        scored = evaluate(derive(EvaluateRequest, req, regions=[path], base=req.base, finetuned=req.finetuned, n=req.n,
                                 ood=[]), progress=None, cancel=cancel, guard=guard)
        metrics, notes, kind = scored.rows, list(scored.notes), kind_named(scored.task_kind)
    with tempfile.TemporaryDirectory(prefix="graftui-push-") as tmp:
        folder = Path(tmp) / "repo"
        if req.what == "checkpoint":
            if progress:
                progress({"stage": "writing the grafted checkpoint", "fraction": 0.5})
            export(derive(ExportRequest, req, region=path, base=req.base, finetuned=req.finetuned, out=str(folder)),
                   cancel=cancel, guard=guard)
        else:
            folder.mkdir()
            shutil.copyfile(path, folder / PATCH_FILE)
        made = record.meta.request
        (folder / "request.json").write_text(json.dumps(made or {"note": "the region records no request"}, indent=2))
        text = str(model_card(req, record, metrics, Path(path).name, kind))
        (folder / "README.md").write_text(text)
        files = [str(f.relative_to(folder)) for f in sorted(folder.rglob("*")) if f.is_file()]
        url = repo_url = None
        if req.out is not None:
            shutil.copytree(folder, Path(req.out).expanduser(), dirs_exist_ok=True)
        else:
            from huggingface_hub import HfApi
            from huggingface_hub.errors import HfHubHTTPError

            if progress:
                progress({"stage": f"pushing {len(files)} files to {req.repo}", "fraction": 0.8})
            api = HfApi(token=token)  # this token only: never HF_TOKEN or a login in its place
            try:
                api.create_repo(req.repo, private=req.private, exist_ok=True)
                info = api.create_commit(req.repo, operations(folder),
                                         commit_message=f"graftui {__version__}: {req.what} of {Path(path).name}")
            except (HfHubHTTPError, OSError) as err:  # OSError: no connection, or HF_HUB_OFFLINE
                raise hub_refusal(err, req.repo) from None
            url = getattr(info, "commit_url", None) or str(info)
            repo_url = f"{str(api.endpoint).rstrip('/')}/{req.repo}"
    finish(progress)
    return PushResult(req, notes, time.time() - start, req.repo, url, req.out, files, text, repo_url)

