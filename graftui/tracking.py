"""Runs reported where researchers keep them (``--report-to``, as transformers' ``report_to``): Trackio, Weights &
Biases, MLflow or TensorBoard, each through its own library, started the way it starts offline.

The verb registry wraps every flow once (:func:`tracked`); nothing here is a tracker of its own. Before any work the
tracker is started (one line where it is not installed or cannot start); while the run goes, its progress events'
step reports are kept; when it ends, its request (the config), its curve per step (mask learning's, a fine-tune's
loss), the final metrics of every model compared (each paired difference and its interval as fields of their own), its
card and its files (the region files it wrote, its report bundle) go to the tracker in one go. A run is named after the
region it made (else its output, else the verb); a run over seeds is a group: one tracker run per seed beside the
run of the whole. Region files written meanwhile record where the tracker keeps the run (:func:`active`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import settings
from .errors import RequestError, first_line

NONE = "none"
PROJECT = "graftui"  # the project (Trackio, W&B) or experiment (MLflow) every run goes to


@dataclass
class Run:
    """One tracker run: what it logs, whichever tracker keeps it."""

    name: str
    config: dict
    steps: list[dict] = field(default_factory=list)  # the metrics of each step, in order (step i + 1)
    summary: dict = field(default_factory=dict)  # the final metrics, by flat name
    text: str = ""  # the card
    files: list[Path] = field(default_factory=list)  # region files, the report bundle
    group: str | None = None


# -- the trackers: each through its own library ------------------------------------------------------------
class Tracker:
    """A tracker: its library (``module``, installed as ``package``), where it keeps runs, and how it writes one."""

    name = ""
    label = ""
    module = ""
    package = ""

    def where(self) -> str:
        """The folder (or URL) the tracker keeps runs in."""
        raise NotImplementedError

    def start(self) -> None:
        """Import the library and reach its store, so that a tracker that cannot start fails before any work."""
        importlib.import_module(self.module)
        if "://" not in self.where():
            Path(self.where()).mkdir(parents=True, exist_ok=True)

    def write(self, run: Run) -> str:
        """Log ``run``; returns the line that says where it is."""
        raise NotImplementedError


def _home(name: str) -> str:
    return str(settings.home() / name)


class Trackio(Tracker):
    name, label, module, package = "trackio", "Trackio", "trackio", "trackio"

    def where(self) -> str:
        os.environ.setdefault("TRACKIO_DIR", _home("trackio"))  # read once, when trackio is first imported
        if "trackio" in sys.modules:
            return str(sys.modules["trackio.utils"].TRACKIO_DIR)
        return os.environ["TRACKIO_DIR"]

    def start(self) -> None:
        self.where()
        super().start()

    def write(self, run: Run) -> str:
        import trackio

        trackio.init(project=PROJECT, name=run.name, group=run.group, config=run.config, embed=False,
                     auto_log_cpu=False, auto_log_gpu=False)
        try:
            for i, metrics in enumerate(run.steps):
                trackio.log(metrics, step=i + 1)
            final = {**run.summary, **({"card": trackio.Markdown(run.text)} if run.text else {})}
            if final:
                trackio.log(final, step=len(run.steps) + 1)
            for path in run.files:
                trackio.log_artifact(str(path), name=_artifact_name(path), type=_artifact_type(path))
        finally:
            trackio.finish()
        return (f"run '{run.name}' in Trackio's project '{PROJECT}' at {self.where()} (see it: trackio show "
                f"--project {PROJECT})")


class Wandb(Tracker):
    name, label, module, package = "wandb", "Weights & Biases", "wandb", "wandb"

    def where(self) -> str:
        return os.environ.get("WANDB_DIR") or _home("wandb")

    def write(self, run: Run) -> str:
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline")  # offline unless the user asks for W&B's servers
        one = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=run.name, group=run.group,
                         config=run.config, dir=self.where(), mode=mode, reinit="create_new",
                         settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
        try:
            for i, metrics in enumerate(run.steps):
                one.log(metrics, step=i + 1)
            one.summary.update(run.summary)
            if run.text:
                one.log({"card": wandb.Html(f"<pre>{_escaped(run.text)}</pre>")}, step=len(run.steps) + 1)
            for path in run.files:  # files in the run's folder are the run's (W&B links any other)
                shutil.copyfile(path, Path(one.dir) / path.name)
            folder = one.settings.sync_dir
        finally:
            one.finish()
        if mode == "offline":
            return f"run '{run.name}' in W&B's offline folder {folder} (upload it: wandb sync {folder})"
        return f"run '{run.name}' in W&B's project '{PROJECT}'"


class Mlflow(Tracker):
    name, label, module, package = "mlflow", "MLflow", "mlflow", "mlflow"

    def where(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or Path(_home("mlruns")).as_uri()

    def start(self) -> None:
        if "MLFLOW_TRACKING_URI" not in os.environ:
            Path(_home("mlruns")).mkdir(parents=True, exist_ok=True)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's file store, kept for offline use
        self._experiment()

    def _experiment(self):
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.where())
        found = client.get_experiment_by_name(os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT))
        return client, found.experiment_id if found else client.create_experiment(
            os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT))

    def write(self, run: Run) -> str:
        from mlflow.entities import Metric, Param, RunTag

        client, experiment = self._experiment()
        one = client.create_run(experiment, run_name=run.name, tags={"group": run.group} if run.group else None)
        rid, now = one.info.run_id, int(time.time() * 1000)
        try:
            params = [Param(k, json.dumps(v) if not isinstance(v, str) else v)
                      for k, v in run.config.items()]
            client.log_batch(rid, params=[Param(p.key, p.value[:6000]) for p in params],
                             tags=[RunTag("mlflow.note.content", run.text)] if run.text else [])
            metrics = [Metric(k, v, now, i + 1) for i, step in enumerate(run.steps) for k, v in step.items()]
            metrics += [Metric(k, v, now, len(run.steps) + 1) for k, v in run.summary.items()]
            for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
                client.log_batch(rid, metrics=metrics[i:i + 1000])
            client.log_dict(rid, run.config, "request.json")
            if run.text:
                client.log_text(rid, run.text, "card.md")
            for path in run.files:
                client.log_artifact(rid, str(path))
            client.set_terminated(rid)
        except BaseException:
            client.set_terminated(rid, "FAILED")
            raise
        return (f"run '{run.name}' (id {rid}) in MLflow's experiment '{PROJECT}' at {self.where()} (see it: mlflow ui "
                f"--backend-store-uri {self.where()})")


class Tensorboard(Tracker):
    name, label, module, package = "tensorboard", "TensorBoard", "tensorboard", "tensorboard"

    def where(self) -> str:
        return _home("tensorboard")

    def start(self) -> None:
        super().start()
        importlib.import_module("torch.utils.tensorboard")

    def write(self, run: Run) -> str:
        from torch.utils.tensorboard import SummaryWriter

        folder = Path(self.where()) / (f"{run.group}/{run.name}" if run.group and run.group != run.name else run.name)
        writer = SummaryWriter(str(folder))
        try:
            for i, metrics in enumerate(run.steps):
                for key, value in metrics.items():  # in double precision: the values as the region file has them
                    writer.add_scalar(key, value, i + 1, new_style=True, double_precision=True)
            for key, value in run.summary.items():
                writer.add_scalar(key, value, len(run.steps) + 1, new_style=True, double_precision=True)
            writer.add_text("request", f"```\n{json.dumps(run.config, indent=2)}\n```")
            if run.text:
                writer.add_text("card", run.text)
        finally:
            writer.close()
        for path in run.files:  # TensorBoard keeps no files of its own: they lie beside its events
            shutil.copyfile(path, folder / path.name)
        return f"run '{run.name}' in TensorBoard's folder {folder} (see it: tensorboard --logdir {self.where()})"


TRACKERS: dict[str, Tracker] = {t.name: t for t in (Trackio(), Wandb(), Mlflow(), Tensorboard())}
REPORT_TO = (NONE, *TRACKERS)  # the values of --report-to


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(TRACKERS[name].module) is not None
    except (ImportError, ValueError):
        return False


def check(name: str) -> None:
    """Refuse, in one line naming the fix, a tracker that is not installed (cheap: nothing is imported)."""
    if name == NONE or name not in TRACKERS:
        return
    if settings.hosted():
        raise RequestError(f"--report-to {name}: a hosted server keeps no tracker runs; run graftui on your own machine "
                           "to report to one")
    if not installed(name):
        tracker = TRACKERS[name]
        raise RequestError(f"--report-to {name}: {tracker.label}'s library is not installed; pip install "
                           f"{tracker.package} (or give --report-to none)")


def start(name: str) -> Tracker:
    """The tracker, started before any work: one line where it cannot start."""
    check(name)
    tracker = TRACKERS[name]
    try:
        with _quiet():
            tracker.start()
    except Exception as err:  # noqa: BLE001 - whatever stops the library is the user's to fix, in one line
        raise RequestError(f"--report-to {name}: {tracker.label} cannot start ({first_line(err)}); fix it, or give "
                           "--report-to none") from None
    return tracker


# -- where runs go, as region files record it -----------------------------------------------------------------
_active: contextvars.ContextVar[dict | None] = contextvars.ContextVar("graftui_tracker", default=None)


def active() -> dict | None:
    """The tracker the current run reports to ({report_to, where, project}; None: none), which a region file made now
    records: its run there is named after the region."""
    now = _active.get()
    return dict(now) if now else None


# -- what a run logs ------------------------------------------------------------------------------------------
KEY = re.compile(r"[^A-Za-z0-9_./: -]+")  # what every tracker accepts in a metric's name (MLflow's rule)
ROW_NAMES = ("task", "distribution", "model", "method", "label", "name")  # what tells a result's rows apart


def key(*parts) -> str:
    return "/".join(KEY.sub("_", str(p)).strip() or "_" for p in parts if p not in (None, ""))


def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def step_metrics(event: dict) -> dict | None:
    """The metrics of one progress event that reports a step (mask learning's, a fine-tune's), else None."""
    if not (number(event.get("step")) and number(event.get("loss"))):
        return None
    prefix = "mask" if "mask learning" in str(event.get("stage", "")) else "train"
    out = {key(prefix, name): event[name] for name in ("loss", "accuracy", "step", "k", "region_size", "epoch")
           if number(event.get(name))}
    return out


def row_metrics(rows, prefix: str = "") -> dict:
    """Every number of every row, named by what tells the row apart (task, distribution, model …)."""
    out: dict = {}
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        if not isinstance(row, dict):
            continue
        name = [row[c] for c in ROW_NAMES if isinstance(row.get(c), str) and row[c]]
        base = key(prefix, *name) if name else key(prefix, f"row{i}")
        if any(k.startswith(base + "/") for k in out):
            base = key(base, f"row{i}")
        for metric, value in row.items():
            if number(value):
                out[key(base, metric)] = value
    return out


def difference_metrics(differences, prefix: str = "") -> dict:
    """Each paired difference as fields of its own: its value, its interval's ends and its p-value."""
    out: dict = {}
    for d in differences if isinstance(differences, list) else []:
        if not isinstance(d, dict) or not number(d.get("diff")):
            continue
        base = key(prefix, "diff", f"{d.get('a', '')} - {d.get('b', '')}", d.get("task"), d.get("distribution"),
                   d.get("metric"))
        ci = d.get("ci") if isinstance(d.get("ci"), list) and len(d["ci"]) == 2 else [None, None]
        for name, value in (("diff", d["diff"]), ("ci_low", ci[0]), ("ci_high", ci[1]), ("p", d.get("p"))):
            if number(value):
                out[key(base, name)] = value
    return out


def final_metrics(doc: dict) -> dict:
    """A result's final metrics: its plain numbers, its rows, its held-out check and their paired differences."""
    out = {key(name): value for name, value in doc.items() if number(value)}
    out.update(row_metrics(doc.get("rows")))
    out.update(difference_metrics(doc.get("differences")))
    check_ = doc.get("check")
    if isinstance(check_, dict):
        out.update(row_metrics(check_.get("rows"), "check"))
        out.update(difference_metrics(check_.get("differences"), "check"))
    return out


def card_text(doc: dict) -> str:
    lines = doc.get("card")
    return "\n\n".join(map(str, lines)) if isinstance(lines, list) else str(lines or "")


def run_name(request, doc: dict, files: list[str]) -> str:
    """The place the request names to write (a region file's name), else the region or folder it wrote (seeds: the
    first seed's), else the first region it read, else the verb and the time."""
    regions = getattr(request, "regions", None) or [getattr(request, "region", None)]
    for place in (getattr(request, "out", None), *files, doc.get("out"), *regions):
        if isinstance(place, str) and place:
            return Path(place).stem or Path(place).name
    return f"{request.verb}-{time.strftime('%Y%m%d-%H%M%S')}"


def runs_of(request, result, events: list[dict], folder: Path) -> list[Run]:
    """The tracker runs of a finished result: the run of the whole, and with seeds one run per seed in its group.
    Its report bundle is written to ``folder``."""
    doc = result.as_dict()
    files = [str(p) for p in result.files_written()]
    name = run_name(request, doc, files)
    bundle = result.write_report(folder / f"{name}.zip")
    per_seed = [e for e in (doc.get("per_seed") or doc.get("seeds") or []) if isinstance(e, dict) and "seed" in e]
    group = name if per_seed else None
    whole = Run(name, request.as_dict(), [m for e in events if "seed" not in e and (m := step_metrics(e))],
                final_metrics(doc), card_text(doc), [Path(p) for p in dict.fromkeys(files) if Path(p).is_file()]
                + [Path(bundle)], group)
    runs = [whole]
    for entry in per_seed:
        seed = entry["seed"]
        own = entry.get("path") or entry.get("out")
        runs.append(Run(Path(own).stem if own else f"{name}-seed{seed}", {**whole.config, "seed": seed},
                        [m for e in events if e.get("seed") == seed and (m := step_metrics(e))],
                        {**final_metrics(entry), **final_metrics(entry.get("check") or {})}, "",
                        [Path(own)] if own and Path(own).is_file() else [], group))
    return runs


_writing = threading.Lock()  # trackers keep one current run per process: the app's two lanes report one at a time


@contextlib.contextmanager
def _quiet():
    """A tracker's own messages go to stderr: stdout holds the result (``--json``)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def report(tracker: Tracker, runs: list[Run]) -> list[str]:
    """Write the runs; a tracker that fails now (the work is done and saved) is a note, not a lost result."""
    said = []
    with _writing, _quiet():
        for run in runs:
            try:
                said.append(f"reported to {tracker.label}: {tracker.write(run)}")
            except Exception as err:  # noqa: BLE001 - the result stands; the note says what the tracker said
                said.append(f"the run '{run.name}' was not reported to {tracker.label}: {first_line(err)}")
    return said[:1] + [s for s in said[1:] if "not reported" in s] + (
        [f"and {len(runs) - 1} more runs, one per seed, in the group '{runs[0].group}'"] if len(runs) > 1 else [])


def tracked(flow: Callable) -> Callable:
    """``flow`` reporting to the tracker its request names (``report_to``; none: ``flow`` as it is)."""

    def run(request, progress=None, cancel=None, **rest):
        name = getattr(request, "report_to", NONE)
        if name == NONE:
            return flow(request, progress=progress, cancel=cancel, **rest)
        request.validate()  # a bad request is refused as without a tracker, before the tracker starts
        tracker = start(name)
        events: list[dict] = []

        def heard(event: dict) -> None:
            if "step" in event and "loss" in event:
                events.append(dict(event))
            if progress:
                progress(event)

        token = _active.set({"report_to": name, "where": tracker.where(), "project": PROJECT})
        try:
            result = flow(request, progress=heard, cancel=cancel, **rest)
        finally:
            _active.reset(token)
        with tempfile.TemporaryDirectory(prefix="graftui-report-") as folder:
            result.notes.extend(report(tracker, runs_of(request, result, events, Path(folder))))
        return result

    run.__name__, run.__doc__, run.__wrapped__ = flow.__name__, flow.__doc__, flow
    return run


def _artifact_name(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", path.name)[:120] or "file"


def _artifact_type(path: Path) -> str:
    return "report" if path.suffix == ".zip" else "region"


def _escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
