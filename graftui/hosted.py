"""What a hosted server lets strangers do: the guard every flow runs under, and the caps on uploads and work.

Locally a flow may read any model, data set and file (``flows.LOCAL``). On a server with
``GRAFTUI_HOSTED=1`` (settings.py) the :class:`HostedGuard` narrows this to Hub ids, offline
defaults and the files this server wrote for the asking session (its uploads and fine-tunes),
within the caps: the size of an upload, the rows of a data set, the parameters of a pair, the disk
of a workspace. Each refusal is one line that names the limit.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from safetensors import safe_open

from . import settings
from .config import default_checkpoint_dir, is_default_finetuned
from .tasks.sources import check_reference
from .errors import DataError, ModelError, RequestError, SessionError
from .tasks.completion.generation import AnswerRule
from .tasks.harness.lmeval import OFFLINE as HARNESS_OFFLINE
from .flows import Guard, clear_cache
from .kinds import named_kind
from .models import pair_kind, resolve
from .paths import DATA_SUFFIXES, atomic_write, file_sha256, short_ref
from .regions import read_header
from .training import is_built

REGION_SUFFIXES = (".safetensors",)  # what a page may upload as a region or skill patch


def own_dir(name: str) -> Path | None:
    """A folder of the current workspace (``settings.subdir``), or None on a page without a live session."""
    try:
        return settings.subdir(name)
    except SessionError:
        return None


def is_managed(ref: str) -> bool:
    """A path this server wrote for this workspace (a checkpoint fine-tuned here, a dataset uploaded here), or
    one of the server's default checkpoints; on a hosted server never another session's file."""
    if not ref:
        return False
    try:
        path = Path(ref).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    roots = [own_dir("checkpoints"), own_dir("uploads"), settings.shared("checkpoints")]
    for root in filter(None, roots):
        root = root.resolve()
        if path != root and path.is_relative_to(root) and path.exists():
            return True
    return False


def check_task_ref(ref: str) -> None:
    """Refuse, on a hosted server, a dataset reference that names a server path it did not write; a reference a task
    kind names itself (lm-eval:NAME) is checked by that kind (the offline harness tasks only)."""
    if settings.hosted() and not is_managed(ref):
        kind = named_kind(ref)
        if kind is None or not kind.checked_ref(str(ref), HostedGuard()):
            check_reference(str(ref), allow_local=False)


def allow_local_for(models=(), tasks=()) -> bool:
    """allow_local for a flow that loads ``models`` and ``tasks`` together.

    Locally: True. Hosted: every reference must be a Hub id, an offline default, or a path this
    server wrote itself; anything else raises the library's own clear error. True is returned
    only when such a managed path is actually needed.
    """
    if not settings.hosted():
        return True
    needs_local = False
    for ref in models:
        if is_managed(ref):
            needs_local = True
        elif not is_default_finetuned(ref):  # the server's own, built by a job of its own when first needed
            resolve(ref, allow_local=False)
    for ref in tasks:
        if is_managed(ref):
            needs_local = True
        else:
            check_task_ref(ref)
    return needs_local


def safetensors_params(folder: Path) -> int | None:
    """Parameter count from the safetensors headers of a checkpoint folder (no tensor is read)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                n = 1
                for d in fh.get_slice(key).get_shape():
                    n *= int(d)
                total += n
    return total


def check_model_size(ref: str) -> None:
    """On a hosted server, refuse a checkpoint over MAX_MODEL_PARAMS before loading it (when known)."""
    if not settings.hosted():
        return
    path = Path(str(ref)).expanduser()
    total = safetensors_params(path) if is_managed(str(path)) and path.is_dir() else None
    if total is not None and total > settings.MAX_MODEL_PARAMS:
        raise ModelError(f"'{short_ref(ref)}' has {total:,} parameters; this server takes at most "
                         f"{settings.MAX_MODEL_PARAMS:,}")


def check_rows(name: str, rows: int) -> None:
    """On a hosted server, refuse a data set of more than MAX_DATASET_ROWS rows."""
    if settings.hosted() and rows > settings.MAX_DATASET_ROWS:
        raise DataError(f"'{name}' has {rows:,} rows; this server takes at most {settings.MAX_DATASET_ROWS:,}")


def check_pair_size(total: int) -> None:
    """On a hosted server, refuse a pair of more than MAX_MODEL_PARAMS parameters."""
    if settings.hosted() and total > settings.MAX_MODEL_PARAMS:
        raise ModelError(f"this pair has {total:,} parameters; this server takes at most {settings.MAX_MODEL_PARAMS:,}")


class HostedGuard(Guard):
    """What the app's flows may read: everything locally; on a hosted server only Hub ids, offline defaults and
    the files this server wrote, within the size caps."""

    def allow_local(self, models=(), tasks=()) -> bool:
        for ref in models:
            check_model_size(ref)
        return allow_local_for(list(models), list(tasks))

    def checked_task(self, task):
        check_rows(task.name, sum(len(s) for s in task.splits.values()))
        return task

    def checked_harness(self, names: list[str]) -> list[str]:
        """On a hosted server only the offline harness tasks run: a registry task downloads a dataset of any size
        and its YAML may run code."""
        other = [n for n in names if n not in HARNESS_OFFLINE]
        if settings.hosted() and other:
            raise RequestError(f"lm-eval task '{other[0]}' is not one of the offline harness tasks, the only ones a "
                               "shared server runs (a registry task downloads a dataset of any size, and a task YAML "
                               f"may run code): use {', '.join('lm-eval:' + n for n in HARNESS_OFFLINE)}, or run "
                               "graftui on your own machine")
        return names

    def checked_rule(self, rule, source: str):
        """On a hosted server no answer regex runs, whoever gives it: a request, a region file or a bundle; neither
        does a regex of answer text to ignore."""
        if settings.hosted() and rule.regex:
            raise RequestError(f"{source} judges answers by the regex '{rule.regex:.60}', and answer regexes are not "
                               "run on a shared server: drop --answer-regex, use a region made without one, or run "
                               "graftui on your own machine")
        if settings.hosted() and rule.regexes_to_ignore:
            raise RequestError(f"{source} removes the regex '{rule.regexes_to_ignore[0]:.60}' from answers, and answer "
                               "regexes are not run on a shared server: drop --ignore-regex (or give --ignore-regex '' "
                               "to drop a region's own), or run graftui on your own machine")
        return rule

    def checked_pair(self, pair):
        try:
            check_pair_size(pair.counts()["total"])
        except ModelError:
            clear_cache()  # the refused pair must not stay in the cache for the next request
            raise
        return pair


# -- files a page sends -------------------------------------------------------------------------------
def folder_mb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total / 2**20


def check_disk(extra_mb: float = 0.0) -> None:
    """Hosted: refuse new work once the session's workspace holds GRAFTUI_SESSION_MB."""
    if not settings.hosted():
        return
    used = folder_mb(settings.workspace()) + extra_mb
    if used > settings.SESSION_MB:
        raise SessionError(f"your workspace holds {used:,.3g} MB, over this server's {settings.SESSION_MB:,.3g} MB; "
                           "delete regions you no longer need (Regions tab), then try again")


def check_upload(path: str | Path, allowed: tuple[str, ...]) -> Path:
    """An uploaded file: the right kind by name and within MAX_UPLOAD_MB, or a clear error."""
    path = Path(path)
    if path.suffix.lower() not in allowed:
        raise ValueError(f"'{path.name}' is not one of the accepted file types ({', '.join(allowed)})")
    size_mb = path.stat().st_size / 2**20
    if size_mb > settings.MAX_UPLOAD_MB:
        raise ValueError(f"'{path.name}' is {size_mb:.1f} MB; uploads are limited to {settings.MAX_UPLOAD_MB:g} MB")
    return path


def safe_name(text: str, limit: int = 60) -> str:
    """A file name made only of letters, digits, '.', '_' and '-'."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.")[:limit]
    return name or "item"


def save_upload(path: str | Path, read=None):
    """Copy an uploaded dataset into the workspace's uploads under a content-derived name.

    ``read(dest)`` checks it there (the column preview); a file it refuses is deleted again, so a
    refused upload is never offered as a task. Returns ``(dest, read(dest))`` (None without ``read``).
    """
    src = check_upload(path, DATA_SUFFIXES)
    check_disk(src.stat().st_size / 2**20)
    digest = file_sha256(src)
    # one folder per content hash keeps the file's own name, which the data loader reads split names from
    dest = settings.subdir("uploads") / digest[:12] / f"{safe_name(src.stem, 60)}{src.suffix.lower()}"
    if dest.exists():
        return dest, read(dest) if read else None
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(dest, lambda tmp: shutil.copyfile(src, tmp))  # never a half-copied file at the content's name
        return dest, read(dest) if read else None
    except BaseException:
        shutil.rmtree(dest.parent, ignore_errors=True)
        raise


# -- what a request may ask of a shared server ------------------------------------------------------------
MODEL_FIELDS = ("base", "finetuned", "checkpoint", "finetuned_replicates")
LIST_FIELDS = ("ood", "regions", "tasks", "methods", "seeds", "finetuned_replicates", "lambdas", "densities",
               "talls", "merges")  # each multiplies a job's work
MAX_MERGE_SETTINGS = 4 * settings.MAX_LIST_ITEMS  # stitching's validation passes per task: λ × setting over the merges
TASK_FIELDS = ("task", "ood", "tasks")
REGION_FIELDS = ("region", "regions", "replicates")


def check_request(request, guard: Guard) -> None:
    """What a server checks before it queues a job: the request's own checks and, hosted, the ceilings on one
    job's work and every model and data reference it names (a server path is refused here, not in the job)."""
    ignored = getattr(request, "ignore_regex", None)
    guard.checked_rule(AnswerRule(regex=getattr(request, "answer_regex", None),  # before validate() compiles them
                                  regexes_to_ignore=tuple(p for p in ignored if isinstance(p, str) and p)
                                  if isinstance(ignored, list) else ()), "the request")
    # compiles it
    request.validate()
    if not settings.hosted():
        return
    for name, cap in settings.HOSTED_CEILINGS.items():
        value = getattr(request, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            raise RequestError(f"{name.replace('_', ' ')} {value:,} is over this server's limit of {cap:,}; ask for "
                               "less (run graftui on your own machine for more)")
    for name in ("n", "test_examples"):  # None means every test example, which a Hub split may hold 50,000 of
        if name in vars(request) and getattr(request, name) is None:
            raise RequestError(f"give a number of test examples (up to {settings.HOSTED_CEILINGS[name]:,}); scoring "
                               "every example of a task is not offered here")
    for name in LIST_FIELDS:
        value = getattr(request, name, None)
        if isinstance(value, list) and len(value) > settings.MAX_LIST_ITEMS:
            raise RequestError(f"{len(value)} {name} are over this server's limit of {settings.MAX_LIST_ITEMS} for one "
                               "job; ask for fewer")
    grid = request.merge_settings() if hasattr(request, "merge_settings") else 0
    if grid > MAX_MERGE_SETTINGS:
        raise RequestError(f"{grid} merge settings (λ × density or TALL λ over the merges) are over this server's "
                           f"limit of {MAX_MERGE_SETTINGS} for one job; give fewer --lambdas, --densities, --talls or "
                           "--merges")
    if getattr(request, "by", None) == "cell" and len(getattr(request, "texts", None) or []) > settings.MAX_MAP_TEXTS:
        raise RequestError(f"{len(request.texts)} texts are over this server's limit of {settings.MAX_MAP_TEXTS} for "
                           "one probe map (--by cell: each layer × module part grafted and knocked out, per text); "
                           "give fewer")
    runs = len(getattr(request, "seeds", None) or [1]) * (1 + len(getattr(request, "finetuned_replicates", None) or []))
    if runs > settings.MAX_LIST_ITEMS:  # each fine-tune runs every seed
        raise RequestError(f"{runs} runs (fine-tunes × seeds) are over this server's limit of {settings.MAX_LIST_ITEMS} "
                           "for one job; ask for fewer seeds or fine-tunes")
    if getattr(request, "train_examples", None) == 0:
        raise RequestError("training on every example (0) is not offered here; give a number of training examples up "
                           f"to {settings.HOSTED_CEILINGS['train_examples']:,}")
    points = len(getattr(request, "sparsities", None) or []) * len(getattr(request, "methods", None) or [1])
    points = max(points, len(getattr(request, "alphas", None) or [])) * len(getattr(request, "seeds", None) or [1])
    points *= 1 + len(getattr(request, "finetuned_replicates", None) or [])
    if points > settings.MAX_CURVE_POINTS:
        raise RequestError(f"{points} points on one curve are over this server's limit of {settings.MAX_CURVE_POINTS}; "
                           "ask for fewer budgets, methods, α values, seeds or fine-tunes")
    refs = lambda names: [r for n in names for v in [getattr(request, n, None)] if v  # noqa: E731
                          for r in (v if isinstance(v, list) else [v])]
    for ref in refs(REGION_FIELDS):  # a region file's own answer rule, refused before its job is queued
        header = read_header(ref) if isinstance(ref, str) else None
        recorded = (header.meta.request or {}).get("answer_regex") if header is not None else None
        if isinstance(recorded, str) and recorded:
            guard.checked_rule(AnswerRule(regex=recorded), f"region '{header.path.stem}'")
    guard.allow_local(models=refs(MODEL_FIELDS), tasks=refs(TASK_FIELDS))
    options = request.load_options() if hasattr(request, "load_options") else None
    if options is not None and (options.prompted() or options.head != "auto"):  # a prompt on a classifier, or a head
        # the checkpoint lacks: refused here, not in its job
        for ref in refs(("finetuned", "finetuned_replicates")):
            if not (is_default_finetuned(ref) and not is_built(default_checkpoint_dir(ref))):  # a default not built
                pair_kind(ref, options, allow_local=guard.allow_local(models=[ref]))  # yet: its recipe says, in its job
