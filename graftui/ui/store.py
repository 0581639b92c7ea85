"""What the app keeps under ``$GRAFTUI_HOME``: the shared job runner, checkpoints, regions, uploads.

Everything the pages list is read back from disk, so a reloaded page or a restarted server
shows the same jobs, checkpoints and regions. No maths here: only files and names.

On a hosted server (``GRAFTUI_HOSTED=1``) every browser session works in its own workspace,
``$GRAFTUI_HOME/sessions/<id>/`` (its regions, uploads, fine-tuned checkpoints, downloads), and
sees only its own jobs. The id is issued here, kept by the browser, and entered around each
request (:func:`session`); a request with an unknown id reads and writes nothing. What the
server itself holds (the offline default checkpoints, regions an administrator put in
``$GRAFTUI_HOME/regions``) is a read-only gallery every session lists. Locally there is one
workspace, ``$GRAFTUI_HOME``, and every job is yours.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import hosted, regions, settings, tracking
from ..config import (DEFAULT_BASE, DEFAULT_EXAMPLES_PER_CLASS, DEFAULT_FINETUNED_REFS, DEFAULT_SPARSITY,
                      INTERACTIVE, default_checkpoint_dir)
from ..errors import RegionError, SessionError
from ..kinds import CLASSIFICATION, region_kind
from ..hosted import check_disk, own_dir

from ..flows.common import clear_cache, region_stem, save_new
from ..jobs import MAIN, QUEUED, QUICK, RUNNING, JobRunner
from ..models import checkpoint_record
from ..training import is_built
from ..paths import DATA_SUFFIXES, atomic_write, short_ref
from ..requests import EvaluateRequest, FinetuneRequest, LocalizeRequest, SweepRequest

# -- defaults ------------------------------------------------------------------------------------


fast = settings.fast


def defaults() -> dict:
    """What the widgets start with: the requests' own defaults (GRAFTUI_FAST ones in that mode), all numbers."""
    loc, ft, ev = LocalizeRequest.defaults(), FinetuneRequest.defaults(), EvaluateRequest.defaults()
    recipe = FinetuneRequest(**ft).recipe()
    return {
        "steps": loc["steps"],
        "examples_per_class": loc["examples_per_class"] or DEFAULT_EXAMPLES_PER_CLASS,  # a number box shows no "unset"
        "test_examples": ev["n"] or INTERACTIVE["n"],
        "log_sparsity": math.log10(loc["sparsity"] or DEFAULT_SPARSITY),  # the default pair's kind: classification
        "mask_lr": loc["lr"],
        "ft_lr": recipe.lr,
        "ft_epochs": recipe.epochs,
        "ft_train_examples": recipe.train_examples or 0,
        "sweep_budgets": ", ".join(f"{s:g}" for s in SweepRequest.defaults()["sparsities"]),
    }


# -- the tracker the app's jobs report to ---------------------------------------------------------
_report_to = [tracking.NONE]  # one setting for the app, which runs on the researcher's machine (hosted: none)


def report_to() -> str:
    """The tracker every job of the app reports to (the jobs panel's setting; a request naming its own keeps it)."""
    return _report_to[0]


def set_report_to(name: str) -> str:
    """Choose the tracker of the app's jobs; one not installed (or any on a hosted server) is refused in one line."""
    name = name or tracking.NONE
    if name not in tracking.REPORT_TO:
        raise SessionError(f"unknown tracker '{name}'; choose from {', '.join(tracking.REPORT_TO)}")
    tracking.check(name)
    _report_to[0] = name
    return name


# -- the one job runner --------------------------------------------------------------------------
_runner = None
_runner_lock = threading.Lock()


def runner() -> "Jobs":
    """The app's single JobRunner (rooted at ``$GRAFTUI_HOME/jobs``, created on first use), as the
    current session sees it."""
    global _runner
    with _runner_lock:
        if _runner is None:
            settings.configure_torch()
            _runner = JobRunner(settings.shared("jobs"), max_seconds=settings.job_seconds(),
                                after_forced_stop=clear_cache, quick_limit=settings.quick_seconds())  # a job stopped anywhere may leave a pair grafted
    return Jobs(_runner, session_id())


def revive(rebuild) -> list[str]:
    """Queue again, each as ``rebuild(job)`` makes it, the jobs this server held when it last stopped (once, when it
    starts: ``JobRunner.revive``)."""
    return runner().runner.revive(rebuild)


class Jobs:
    """The job runner as one session sees it: locally every job; hosted, the session's own jobs and the
    server's (which it may watch, not cancel), with the per-session and global quotas on submission."""

    def __init__(self, runner, owner: str | None):
        self.runner, self.owner = runner, owner

    def _visible(self, job) -> bool:
        return job is not None and (not settings.hosted() or job.owner in (None, self.owner))

    def jobs(self, kind: str | None = None) -> list:
        return [j for j in self.runner.jobs(kind) if self._visible(j)]

    def get(self, job_id: str):
        job = self.runner.get(job_id)
        return job if self._visible(job) else None

    def place(self, job_id: str) -> int | None:
        """A visible waiting job's place in the queue (1: next), among every session's jobs; None once it runs."""
        return self.runner.place(job_id) if self.get(job_id) is not None else None

    def expected(self, job_id: str) -> tuple[float, float | None] | None:
        """When a visible job is expected to start and end, in seconds from now (``JobRunner.expected``)."""
        return self.runner.expected(job_id) if self.get(job_id) is not None else None

    def history(self) -> list:
        """The finished jobs this session sees (hosted: its own and the server's, so that how long a job takes
        tells nothing of another session's work), newest first, to foresee how long a job will take
        (``lanes.plan``)."""
        return [j for j in self.jobs() if j.finished is not None]

    def quick_held(self) -> int:
        """How many jobs this session's client address (hosted) has waiting or running in the quick lane; 0 locally."""
        if not settings.hosted() or self.owner is None:
            return 0
        address = session_client(self.owner)
        return sum(j.lane == QUICK and j.status in (QUEUED, RUNNING) and address is not None and j.client == address
                   for j in self.runner.jobs())

    def wait(self, job_id: str, timeout: float | None = None):
        return self.runner.wait(job_id, timeout) if self.get(job_id) else None

    def check_cancel(self, job_id: str) -> None:
        """Refuse a job this page may not cancel: another session's (not seen here), or the server's own."""
        job = self.get(job_id)
        if job is None:
            raise SessionError(f"no job {job_id} here")
        if settings.hosted() and job.owner != self.owner:
            raise SessionError(f"'{job.title}' is the server's own job; it cannot be cancelled from a page")

    def cancel(self, job_id: str) -> bool:
        """Cancel one of this session's jobs (False when it has finished already)."""
        self.check_cancel(job_id)
        return self.runner.cancel(job_id)

    def submit(self, kind: str, title: str, fn, params: dict | None = None, server: bool = False, lane: str = MAIN,
               estimate: float | None = None, work: float | None = None):
        """Queue ``fn`` in ``lane``; an identical job of this session still waiting or running is returned instead (a
        double click queues one job). Hosted, a job counts against its session's and its client address's quotas, in
        both lanes, which a fresh session does not reset (``server``: the server's own job)."""
        more = {"lane": lane, "estimate": estimate, "work": work}
        if not settings.hosted() or server:
            return self.runner.submit(kind, title, fn, params, owner=None if server else self.owner, dedupe=not server,
                                      **more)
        if self.owner is None:
            settings.workspace()  # raises: no live session
        address = session_client(self.owner)
        twin = self.runner.twin(kind, params, self.owner)
        if twin is None:
            check_disk()

        def admit(active: list) -> None:  # under the runner's lock: requests arriving together are counted together
            mine = sum(j.owner == self.owner for j in active)
            if mine >= settings.SESSION_JOBS:
                raise SessionError(f"you already have {mine} job(s) waiting or running (the limit is "
                                   f"{settings.SESSION_JOBS}); wait for one to finish, or cancel it on the Jobs list")
            from_here = sum(address is not None and j.client == address for j in active)
            if from_here >= settings.CLIENT_JOBS:
                raise SessionError(f"{from_here} job(s) from your address are waiting or running (the limit is "
                                   f"{settings.CLIENT_JOBS}, whatever the tab); wait for one to finish")
            if len(active) >= settings.MAX_JOBS:
                raise SessionError(f"the server is busy ({len(active)} job(s) waiting or running); try again in a few "
                                   "minutes")

        return self.runner.submit(kind, title, fn, params, owner=self.owner, dedupe=True, client=address, admit=admit,
                                  **more)


# -- sessions (hosted mode) ----------------------------------------------------------------------
_SID = re.compile(r"^[A-Za-z0-9_-]{32}$")
SEEN = ".last-seen"


def sessions_dir() -> Path:
    return settings.shared("sessions")


def new_session() -> str:
    """A fresh workspace under an unguessable id (192 random bits)."""
    sid = secrets.token_urlsafe(24)
    (sessions_dir() / sid).mkdir(mode=0o700)
    (sessions_dir() / sid / SEEN).touch()
    return sid


def live_session(sid) -> Path | None:
    """The workspace of ``sid`` when it is one this server issued and has not removed."""
    if not isinstance(sid, str) or not _SID.match(sid):
        return None
    path = sessions_dir() / sid
    return path if path.is_dir() else None


def resume(sid, request=None) -> str:
    """On page load: the browser's session id when it is still live, else a new one (hosted only;
    locally sessions do not exist and ``sid`` is returned as it came). Expired workspaces are removed.
    The address the page came from is kept with the session, so job quotas count per client."""
    if not settings.hosted():
        return sid or ""
    expire_sessions()
    if not live_session(sid):
        sid = new_session()
    _touch(sessions_dir() / sid)
    address = client_address(request)
    if address:
        (sessions_dir() / sid / CLIENT).write_text(address)
    return sid


CLIENT = ".client"


def client_address(request) -> str | None:
    """The address a page's request came from: behind GRAFTUI_TRUSTED_PROXIES proxies (a Space has one) the
    address the outermost of them appended to X-Forwarded-For (earlier ones are the sender's word); else the
    socket's peer, whatever X-Forwarded-For the client sent (the web server does not read it either:
    ``app.launch_options``)."""
    if request is None:
        return None
    peer = getattr(getattr(request, "client", None), "host", None)
    trusted = settings.TRUSTED_PROXIES
    if trusted <= 0:
        return peer
    forwarded = (getattr(request, "headers", None) or {}).get("x-forwarded-for", "")
    hops = [h.strip() for h in str(forwarded).split(",") if h.strip()]
    return hops[-trusted] if len(hops) >= trusted else peer


def session_client(sid) -> str | None:
    """The address a session's page was last loaded from."""
    path = live_session(sid)
    try:
        return (path / CLIENT).read_text().strip() or None if path else None
    except OSError:
        return None


@contextmanager
def session(sid):
    """Work as the session ``sid`` for the duration of one request: hosted, its workspace (or none when the
    id is unknown, so nothing is read or written); locally, ``$GRAFTUI_HOME`` as always."""
    if not settings.hosted():
        yield
        return
    path = live_session(sid)
    if path is not None:
        _touch(path)
    token = settings.enter_workspace(path or settings.NO_SESSION)
    try:
        yield
    finally:
        settings.leave_workspace(token)


def session_id() -> str | None:
    """The hosted session of the current request or job; None locally (and for the server's own work)."""
    if not settings.hosted():
        return None
    try:
        ws = settings.workspace()
    except SessionError:
        return None
    return ws.name if ws.parent == sessions_dir() else None


def browser_secret() -> str:
    """The key the page's session id is encrypted with in the browser: ``GRAFTUI_SESSION_SECRET``, else one
    made once and kept (owner-only) in $GRAFTUI_HOME, so a restarted server still reads its sessions' ids."""
    given = os.environ.get("GRAFTUI_SESSION_SECRET", "").strip()
    if given:
        return given
    path = settings.home() / ".session-secret"
    try:
        return path.read_text().strip()
    except OSError:
        pass
    secret = secrets.token_hex(32)
    atomic_write(path, lambda tmp: Path(tmp).write_text(secret))  # mkstemp's file is owner-only
    return path.read_text().strip()


def _touch(path: Path) -> None:
    seen = path / SEEN
    try:
        if time.time() - seen.stat().st_mtime > 60:
            seen.touch()
    except OSError:
        seen.touch()


def expire_sessions(now: float | None = None) -> list[str]:
    """Remove workspaces idle for longer than GRAFTUI_SESSION_IDLE_HOURS whose jobs have all finished."""
    now = now or time.time()
    busy = {j.owner for j in (_runner.jobs() if _runner else []) if j.status in (QUEUED, RUNNING)}
    removed = []
    for path in sessions_dir().iterdir():
        try:
            idle = now - (path / SEEN).stat().st_mtime
        except OSError:
            idle = now - path.stat().st_mtime
        if path.name not in busy and idle > settings.SESSION_IDLE_HOURS * 3600:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


# -- folders -------------------------------------------------------------------------------------
def regions_dir() -> Path:
    return settings.subdir("regions")


def checkpoints_dir() -> Path:
    return settings.subdir("checkpoints")


def uploads_dir() -> Path:
    return settings.subdir("uploads")


def downloads_dir() -> Path:
    return settings.subdir("downloads")


def gallery_dir() -> Path:
    """Regions the server holds for everyone (read-only on a hosted server): ``$GRAFTUI_HOME/regions``."""
    return settings.shared("regions")


def served_dir() -> Path:
    """Where a hosted server puts each download a page asked for (:func:`serve`)."""
    return settings.shared("served")


def served_dirs() -> list[str]:
    """The only folders under GRAFTUI_HOME whose files the page may download. Hosted: the served folder alone,
    whose sub-folders have unguessable names that carry no session id (:func:`serve`); never a workspace, whose
    path carries its session's key."""
    if settings.hosted():
        return [str(served_dir())]
    return [str(regions_dir()), str(downloads_dir()), str(settings.subdir("reports"))]


SERVED_HOURS = 1.0  # a served copy outlives the page's fetch of it (Gradio copies it into its cache at once)


def serve(path):
    """A file of the workspace as a page downloads it. Hosted: a copy (a hard link where it can) in a fresh folder
    of ``served/`` with an unguessable name that names no session, the file's own name kept; copies older than
    SERVED_HOURS go. Locally (and for anything that is not a file): ``path`` as it is."""
    if not settings.hosted() or not isinstance(path, (str, Path)) or not Path(path).is_file():
        return path
    src, root = Path(path), served_dir()
    now = time.time()
    for old in root.iterdir():
        try:
            if now - old.stat().st_mtime > SERVED_HOURS * 3600:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    folder = root / secrets.token_urlsafe(24)
    folder.mkdir(mode=0o700)
    dest = folder / src.name
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
    return str(dest)


# -- what a page sees of server paths (hosted mode) ---------------------------------------------------
WORKSPACE_REF = "workspace:"  # the page's name for a file of its own workspace, taken back in its requests
SERVER_REF = "server:"  # the page's name for another file of GRAFTUI_HOME (shown only; never taken back)
HIDDEN_ID = "(session)"


def _rewrites() -> list[tuple[re.Pattern, str]]:
    """(pattern, replacement) for the current request: its workspace, GRAFTUI_HOME, then its bare session id."""
    sid, home, out = session_id(), settings.home(), []
    folders = [(sessions_dir() / sid, WORKSPACE_REF)] if sid else []
    for folder, ref in [*folders, (home, SERVER_REF)]:
        for form in dict.fromkeys([str(folder), str(folder.resolve())]):
            out.append((re.compile(re.escape(form) + r"(?![\w.-])/?"), ref))
    if sid:
        out.append((re.compile(re.escape(sid)), HIDDEN_ID))
    return out


def _walk(value, fn):
    """``value`` with ``fn`` applied to every string in it (in lists, tuples, dicts and their keys, tables)."""
    import pandas as pd

    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_walk(v, fn) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_walk(v, fn) for v in value)
    if isinstance(value, dict):
        return {_walk(k, fn) if isinstance(k, str) else k: _walk(v, fn) for k, v in value.items()}
    if isinstance(value, pd.DataFrame):
        out = value.map(lambda c: fn(c) if isinstance(c, str) else c)
        out.columns = [fn(c) if isinstance(c, str) else c for c in value.columns]
        return out
    return value


def public(value):
    """``value`` as a page may see it. Hosted: every path of the request's workspace as ``workspace:…`` (what
    :func:`private` takes back), any other path under GRAFTUI_HOME as ``server:…``, and the session id nowhere,
    in every string of it (messages, dropdown values and choices, job requests, tables). Locally unchanged."""
    if not settings.hosted():
        return value
    rewrites = _rewrites()

    def rewrite(text: str) -> str:
        for pattern, ref in rewrites:
            if pattern.search(text):
                text = pattern.sub(ref, text)
        return text

    return _walk(value, rewrite)


def private(value):
    """What a page sent, with its ``workspace:…`` names (:func:`public`) back as the paths of the request's own
    workspace; a name that would lead out of it is left as it came (and refused as any unknown name is)."""
    if not settings.hosted():
        return value
    sid = session_id()
    if sid is None:
        return value
    folder = (sessions_dir() / sid).resolve()

    def back(text: str) -> str:
        if not text.startswith(WORKSPACE_REF):
            return text
        path = (folder / text[len(WORKSPACE_REF):]).resolve()
        return str(path) if path == folder or path.is_relative_to(folder) else text

    return _walk(value, back)


# -- regions -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegionEntry:
    """A saved region as listed: its id (file stem), path and the metadata from its header."""

    id: str
    path: Path
    kind: str
    meta: regions.RegionMeta
    gallery: bool = False  # the server's, shown to every session, never deleted from a page
    digest: str = ""  # of the parameter set (regions.digest): two files of one region share it

    @property
    def k(self) -> int | None:
        return self.meta.k

    @property
    def task_kind(self):
        """The kind of task it was learned on (``kinds.region_kind``): a completion region's models generate."""
        return region_kind(self.meta)

    @property
    def label(self) -> str:
        """Task, method, k and the settings that tell runs apart, the model, and the content id: every model and task
        by its name, never a path (an uploaded task by its file's name). Two files of one region share it;
        :func:`region_labels` tells them apart in the pickers."""
        parts = [regions.describe(self.meta), short_ref(self.meta.finetuned or "?")]
        return " · ".join(parts + ["gallery"] * self.gallery) + f" #{self.digest}"

    @property
    def stamp(self) -> str:
        """When the file was saved, as its name says (``paths.new_path``: …-YYYYmmdd-HHMMSS[-n]), else its record."""
        got = _STAMP.search(self.id)
        if got:
            d, t, n = got.groups()
            return f"{d[:4]}-{d[4:6]}-{d[6:]} {t[:2]}:{t[2:4]}:{t[4:]}" + (f" ({n})" if n else "")
        return (self.meta.created or "").replace("T", " ")[:19]


_STAMP = re.compile(r"(\d{8})-(\d{6})(?:-(\d+))?$")


def region_labels(entries) -> dict[str, str]:
    """Region id -> its label in every picker, unique across ``entries``: a label two files share (one region saved
    twice, with the same settings) also says when each was saved ("saved 2026-11-29 10:45:00"), where a person looks
    first; each ends with the file's id, which typing part of it finds too. A picker filters its choices by what is
    typed into it, so a label holds the words people look for (task, method, k, seed, model) and no folder."""
    base = {e.id: e.label for e in entries}
    shared = {v for v in base.values() if list(base.values()).count(v) > 1}
    return {e.id: base[e.id] + (f" · saved {e.stamp}" if base[e.id] in shared and e.stamp else "") + f" [{e.id}]"
            for e in entries}


def read_region_header(path: Path, gallery: bool = False) -> RegionEntry | None:
    """Metadata of a region file without loading its tensors; None when it is not one of ours."""
    header = regions.read_header(path)
    return None if header is None else RegionEntry(path.stem, path, header.kind, header.meta, gallery, header.digest)


def region_dirs() -> list[tuple[Path, bool]]:
    """Where regions are listed from, as (folder, is gallery): the workspace's own folder, and on a hosted
    server the gallery after it (a page without a live session sees the gallery only)."""
    own = [(d, False) for d in [own_dir("regions")] if d is not None]
    if settings.hosted() and gallery_dir().resolve() not in {p.resolve() for p, _ in own}:
        own.append((gallery_dir(), True))
    return own


def list_regions() -> list[RegionEntry]:
    """Saved regions, newest first (a gallery region whose id the session also uses is hidden by its own)."""
    entries, seen = [], set()
    for folder, gallery in region_dirs():
        for path in folder.glob("*.safetensors"):
            if path.name.startswith(".") or path.stem in seen:
                continue
            entry = read_region_header(path, gallery)
            if entry is not None:
                entries.append(entry)
                seen.add(path.stem)
    return sorted(entries, key=lambda e: (e.meta.created or "", e.path.stat().st_mtime), reverse=True)


def region_choices(entries: list[RegionEntry] | None = None) -> list[tuple[str, str]]:
    """(label, id) of every saved region (``entries``, else the listing), newest first, each label unique."""
    entries = list_regions() if entries is None else entries
    labels = region_labels(entries)
    return [(labels[e.id], e.id) for e in entries]


_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def region_path(region_id: str) -> Path:
    """The file of a saved region; refuses anything that is not a plain id in the regions folder."""
    region_id = (region_id or "").strip()
    if not region_id:
        raise RegionError("no region selected: pick one from the list (or run Localize first)")
    if not _ID.match(region_id):
        raise RegionError(f"'{region_id}' is not a region id")
    for folder, _ in region_dirs():
        path = folder / f"{region_id}.safetensors"
        if path.is_file():
            return path
    settings.workspace()  # a page without a live session learns that first
    raise RegionError(f"region '{region_id}' is not saved here (any more)")


def delete_region(region_id: str) -> Path:
    """Remove one of the workspace's own regions (never a gallery one), and its scores unless another file holds the
    same region; returns the removed path."""
    path = region_path(region_id)
    if path.parent.resolve() != regions_dir().resolve():
        raise RegionError(f"'{region_id}' belongs to the server's gallery; it cannot be deleted from a page")
    gone = read_region_header(path)
    path.unlink()
    if gone is not None and all(e.digest != gone.digest for e in list_regions()):
        regions.forget_scores(path.parent, [gone.digest])
    if path.stem in regions.read_annotations(path.parent):  # its tags and note go with it
        regions.annotate(path.parent, path.stem, gone.digest if gone is not None else "deleted", [], "")
    return path


def jobs_reading(path: Path) -> list:
    """This session's waiting or running jobs whose request names the region file ``path``: deleting the file would
    fail them (a comparison queued on it), so the page names them before it deletes, and cancels them with it."""
    target = Path(path).resolve()

    def names(value) -> bool:
        if isinstance(value, str):
            return value.endswith(".safetensors") and Path(value).expanduser().resolve() == target
        if isinstance(value, (list, tuple)):
            return any(names(v) for v in value)
        return isinstance(value, dict) and any(names(v) for v in value.values())

    return [j for j in runner().jobs() if j.status in (QUEUED, RUNNING) and names(j.params)]


def region_scores() -> dict[str, dict]:
    """Content id -> the latest scores of that region, from the score logs of the folders regions are listed from
    (on a hosted server the session scores gallery regions in its own log)."""
    out: dict[str, dict] = {}
    for folder, _ in region_dirs():
        for key, entry in regions.latest_scores(folder).items():
            if key not in out or str(entry.get("when") or "") >= str(out[key].get("when") or ""):
                out[key] = entry
    return out


def regions_read(request) -> list[RegionEntry]:
    """The saved regions a request names, in any of its fields (``regions``, ``region``, ``replicates`` …)."""
    names = [v for value in request.as_dict().values() for v in (value if isinstance(value, list) else [value])
             if isinstance(v, str) and v.endswith(".safetensors")]
    if not names:
        return []
    entries = {str(e.path.resolve()): e for e in list_regions()}
    return [entries[key] for key in dict.fromkeys(str(Path(n).resolve()) for n in names) if key in entries]


def region_kinds(region_ids) -> list[str]:
    """For each picked region id, the kind of task it was learned on (an id not saved here: classification; the flow
    that reads it says why)."""
    entries = {e.id: e for e in list_regions()}
    return [entries[rid].task_kind.name if rid in entries else CLASSIFICATION.name for rid in region_ids or []]


def load_region(region_id: str):
    return regions.load(region_path(region_id))


def save_region(record, stem: str | None = None) -> Path:
    """Save a region or skill patch under a new, readable id; returns its path."""
    m = record.meta
    stem = stem or region_stem(m.finetuned or "region", m.task or "task", m.method or "region", record.size)
    return save_new(record, regions_dir(), stem)


# -- checkpoints ---------------------------------------------------------------------------------
def default_checkpoint():
    return default_checkpoint_dir()


def default_ready(key: str | None = None) -> bool:
    """Whether a default fine-tuned model (minilm-movies unless ``key`` says) is already built and cached."""
    return is_built(default_checkpoint() if key is None else default_checkpoint_dir(key.strip().lower()))


def list_checkpoints() -> list[dict]:
    """Fine-tuned checkpoints under GRAFTUI_HOME/checkpoints; the cached defaults are listed by their names
    ('minilm-movies', 'smollm2-movies'), never a second time by their folders."""
    defaults = {default_checkpoint_dir(key).resolve() for key in DEFAULT_FINETUNED_REFS}
    out = []
    own = own_dir("checkpoints")
    if own is None:
        return []
    for path in sorted(own.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
        if path.name.startswith(".") or not is_built(path) or path.resolve() in defaults:
            continue
        record = checkpoint_record(path) or {}
        out.append({"path": str(path), "name": path.name, "record": record})
    return out


def checkpoint_choices(include_base: bool = False) -> list[tuple[str, str]]:
    """Dropdown choices: the offline default (base or fine-tuned), then checkpoints made here."""
    if include_base:
        choices = [(f"{DEFAULT_BASE} (offline base model)", DEFAULT_BASE),
                   ("smollm2 (offline causal LM: read through a prompt, or on completions)", "smollm2")]
    else:
        choices = [(f"{key} (offline default, {'cached' if default_ready(key) else 'built on first use'})", key)
                   for key in DEFAULT_FINETUNED_REFS]
    for c in list_checkpoints():
        rec = c["record"]
        desc = f"{rec.get('task', '?')} · {rec.get('config', {}).get('optimizer', '?')}" if rec else "checkpoint"
        choices.append((f"{c['name']} ({desc})", c["path"]))
    return choices


# -- parameter counts of pairs seen before (for k next to the budget slider) ------------------------
_counts_lock = threading.Lock()


def _counts_file() -> Path:
    return settings.home() / "pair_counts.json"


def remember_counts(base: str, finetuned: str, counts: dict) -> None:
    with _counts_lock:
        try:
            data = json.loads(_counts_file().read_text())
        except (OSError, ValueError):
            data = {}
        data[f"{base}|{finetuned}"] = {k: int(v) for k, v in counts.items()}
        atomic_write(_counts_file(), lambda tmp: Path(tmp).write_text(json.dumps(data, indent=1)))


def known_counts(base: str, finetuned: str) -> dict | None:
    try:
        return json.loads(_counts_file().read_text()).get(f"{base}|{finetuned}")
    except (OSError, ValueError, AttributeError):
        return None


def upload_choices() -> list[tuple[str, str]]:
    own = own_dir("uploads")
    if own is None:
        return []
    files = sorted(own.glob("*/*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [(f"uploaded: {p.name} ({p.parent.name[:6]})", str(p)) for p in files if p.suffix.lower() in DATA_SUFFIXES]


# -- the guard every flow of the app runs under ------------------------------------------------------
class AppGuard(hosted.HostedGuard):
    """The hosted guard (graftui.hosted), which also leaves each pair's parameter counts for the budget text."""

    def checked_pair(self, pair):
        pair = super().checked_pair(pair)
        remember_counts(pair.base_ref, pair.finetuned_ref, pair.counts())
        return pair


def guard() -> AppGuard:
    """What the app's flows may read (graftui.hosted); every pair loaded leaves its counts for the budget slider."""
    return AppGuard()
