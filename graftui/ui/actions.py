"""What the app's buttons do: submit library flows as jobs, and turn results into labelled tables.

Each ``submit_*`` function takes plain values (what the widgets hold), defines the job body as a
closure over library calls and hands it to the shared :class:`~graftui.jobs.JobRunner`. The
tables are built from job results only, so they can be rebuilt after a reload or a restart.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import asdict

import pandas as pd

from .. import settings
from ..jobs import FINISHED, QUEUED, RUNNING, Job
from . import store

# -- jobs table ----------------------------------------------------------------------------------
JOB_COLUMNS = ["id", "kind", "title", "status", "progress", "duration", "message"]


def _duration(job: Job) -> str:
    d = job.duration
    if d is None:
        return ""
    return f"{d:.1f} s" if d < 120 else f"{d / 60:.1f} min"


def job_rows(runner, limit: int = 40) -> pd.DataFrame:
    """One row per job, newest first: the state comes from the runner, never from the page."""
    rows = []
    for job in runner.jobs()[:limit]:
        rows.append({
            "id": job.id,
            "kind": job.kind,
            "title": job.title,
            "status": job.status,
            "progress": f"{100 * job.fraction:.0f} %" if job.status != QUEUED else "",
            "duration": _duration(job),
            "message": job.error or job.message,
        })
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def job_signature(runner) -> tuple:
    """Changes whenever anything shown in the jobs table changes."""
    return tuple((j.id, j.status, round(j.fraction, 2), j.message, int(j.duration or 0)) for j in runner.jobs()[:40])


def job_choices(runner, kinds: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    out = []
    for job in runner.jobs():
        if kinds is None or job.kind in kinds:
            out.append((f"{job.title} · {job.status} [{job.id}]", job.id))
    return out


def latest_job(runner, kinds: tuple[str, ...]) -> Job | None:
    jobs = [j for j in runner.jobs() if j.kind in kinds]
    return jobs[0] if jobs else None


def job_status_line(job: Job | None) -> str:
    """One Markdown line about a job, with its error text when it failed (never a traceback)."""
    if job is None:
        return "No job yet."
    pct = f" — {100 * job.fraction:.0f} %" if job.status == RUNNING else ""
    text = f"**{job.title}** · {job.status}{pct}"
    if job.status == "failed":
        return text + f"\n\n⚠️ {job.error}"
    if job.message and job.message not in {job.status, "done"}:
        text += f" · {job.message}"
    if job.status in FINISHED and job.duration is not None:
        text += f" · took {_duration(job)}"
    result = job.result or {}
    if result.get("region") and job.kind == "localize":
        text += f" · saved region **{result['region']}**" + (f" (k = {result['k']:,})" if result.get("k") else "")
    if result.get("name") and job.kind == "finetune":
        text += f" · checkpoint **{result['name']}** is now in the model pickers"
    return text


# -- guards shared by the flows ---------------------------------------------------------------------
def load_checked_pair(base: str, finetuned: str, allow_local: bool):
    """A cached ModelPair, refused on a hosted server when it is larger than MAX_MODEL_PARAMS."""
    from ..models import ModelError
    from ..workflows import clear_cache, load_pair

    store.check_model_size(base)
    store.check_model_size(finetuned)
    pair = load_pair(base, finetuned, allow_local=allow_local)
    counts = pair.counts()
    if settings.hosted() and counts["total"] > settings.MAX_MODEL_PARAMS:
        clear_cache()
        raise ModelError(f"this pair has {counts['total']:,} parameters; this server takes at most {settings.MAX_MODEL_PARAMS:,}")
    store.remember_counts(base, finetuned, counts)
    return pair


def data_spec(text: str | None = None, pair: str | None = None, label: str | None = None):
    from ..data import DataSpec

    clean = lambda v: (str(v).strip() or None) if v not in (None, "", "(none)", "(guess)") else None  # noqa: E731
    return DataSpec(text_column=clean(text), pair_column=clean(pair), label_column=clean(label))


def spec_for(task: str, spec):
    """Column mappings apply to files and Hub datasets only; offline tasks ignore them."""
    from ..data import DataSpec, OFFLINE_TASKS

    return DataSpec() if str(task).strip().lower() in OFFLINE_TASKS else spec


def load_task_checked(ref: str, spec=None):
    """A task, with the hosted-mode reference check and the row cap."""
    from ..data import DataError, DataSpec, load_task

    store.check_task_ref(ref)
    task = load_task(ref, spec_for(ref, spec or DataSpec()), allow_local=store.data_allow_local(ref))
    rows = sum(len(s) for s in task.splits.values())
    if settings.hosted() and rows > settings.MAX_DATASET_ROWS:
        raise DataError(f"'{task.name}' has {rows:,} rows; this server takes at most {settings.MAX_DATASET_ROWS:,}")
    return task


def check_pair(base: str, finetuned: str) -> dict:
    """Load (or reuse) the pair and describe it; a clear error when the two do not pair."""
    from ..models import DEFAULT_FINETUNED_REFS, ModelError

    if finetuned.strip().lower() in DEFAULT_FINETUNED_REFS and not store.default_ready():
        raise ModelError(f"'{finetuned}' is still being prepared: follow the 'Prepare default model' job below, then check again")
    allow = store.allow_local_for([base, finetuned])
    return load_checked_pair(base, finetuned, allow).describe()


COUNT_ROWS = [
    ("graftable", "graftable (may be in a region: shared body, embeddings excluded)"),
    ("head", "head-only (fine-tuned classifier, always taken from FT)"),
    ("excluded", "excluded (shared but frozen out, e.g. embeddings)"),
    ("total", "total (all parameters of the fine-tuned model)"),
]


def share(x: float) -> str:
    """A fraction as a percentage with enough digits to stay non-zero (0.0034%, not 0.00%)."""
    if x == 0 or x >= 0.01:
        return f"{x:.2%}"
    return f"{100 * x:.2g}%"


def counts_table(counts: dict | None) -> pd.DataFrame:
    """Parameter counts of a pair; blank cells until the pair has been checked."""
    counts = counts or {}
    total = max(int(counts.get("total") or 0), 1)
    rows = [{"parameters": label,
             "count": f"{int(counts[key]):,}" if key in counts else "not checked yet",
             "share of total": share(int(counts[key]) / total) if key in counts else ""}
            for key, label in COUNT_ROWS]
    return pd.DataFrame(rows, columns=["parameters", "count", "share of total"])


def budget_text(log_sparsity: float, counts: dict | None) -> str:
    """What a budget slider position means: the sparsity, and k when the graftable count is known."""
    s = 10 ** float(log_sparsity)
    if counts and counts.get("graftable"):
        from ..localize import Budget

        g = int(counts["graftable"])
        k = Budget(sparsity=s).resolve(g)
        return (f"**k = {k:,}** parameters = **{s:.4%}** of the {g:,} graftable parameters "
                f"(sparsity 10^{float(log_sparsity):.2f} = {s:.1e})")
    return (f"sparsity **{s:.1e}** = **{s:.4%}** of the graftable parameters; "
            "check the pair on the Models tab to see k")


# -- job submissions ----------------------------------------------------------------------------
_prepare_lock = threading.Lock()


def _finetune_reporter(ctx, stage: str):
    return lambda p: ctx.report({"stage": stage, **asdict(p)})


def submit_prepare(runner) -> Job | None:
    """Build the default fine-tuned model once, as a visible job; None when it is already cached."""
    from ..models import DEFAULT_BASE, DEFAULT_FINETUNED

    if store.default_ready():
        return None
    with _prepare_lock:
        for job in runner.jobs("prepare"):
            if job.status in (QUEUED, RUNNING):
                return job

        def fn(ctx) -> dict:
            from ..finetune import ensure_default_finetuned

            path = ensure_default_finetuned(progress=_finetune_reporter(ctx, "fine-tuning minilm on movies"), cancel=ctx.cancel)
            ctx.report({"stage": "checking the pair", "fraction": 0.99})
            pair = load_checked_pair(DEFAULT_BASE, DEFAULT_FINETUNED, allow_local=True)
            return {"checkpoint": str(path), "counts": pair.counts()}

        return runner.submit("prepare", f"Prepare default model ({DEFAULT_FINETUNED}: {DEFAULT_BASE} fine-tuned on movies)", fn,
                             {"base": DEFAULT_BASE, "finetuned": DEFAULT_FINETUNED})


def submit_localize(runner, *, base: str, finetuned: str, task: str, spec, method: str, log_sparsity: float,
                    steps: int, examples_per_class: int, lr: float) -> Job:
    from ..localize import get_method
    from ..method import LearnConfig
    from ..workflows import LocalizeRequest, localize

    info = get_method(method)
    sparsity = 10 ** float(log_sparsity)
    spec = spec_for(task, spec)
    request = LocalizeRequest(
        base=base, finetuned=finetuned, task=task, method=method, sparsity=sparsity,
        examples_per_class=int(examples_per_class), learn=LearnConfig(steps=int(steps), lr=float(lr)), data=spec,
    )
    counts = store.known_counts(base, finetuned)
    k = None
    if counts:
        from ..localize import Budget

        k = Budget(sparsity=sparsity).resolve(int(counts["graftable"]))

    def fn(ctx) -> dict:
        allow = store.allow_local_for([base, finetuned], [task] if info.needs_data else [])
        if info.needs_data:
            load_task_checked(task, spec)  # hosted checks before the flow loads it again (cached)
        pair = load_checked_pair(base, finetuned, allow)
        if ctx.job.params.get("k") is None:  # now known: the live plot draws the budget line
            from ..localize import Budget

            ctx.job.params["k"] = Budget(sparsity=sparsity).resolve(pair.counts()["graftable"])
        record = localize(request, progress=ctx.report, cancel=ctx.cancel, allow_local=allow)
        record.meta["data_spec"] = asdict(spec)
        record.meta["job"] = ctx.job.id
        path = store.save_region(record)
        return {"region": path.stem, "k": record.size, "summary": record.summary()}

    title = f"Localize '{store.short_ref(task)}' in {store.short_ref(finetuned)} · {info.label} · sparsity {sparsity:.1e}"
    return runner.submit("localize", title, fn, {**request.as_dict(), "k": k})


def submit_finetune(runner, *, base: str, task: str, spec, optimizer: str, lr: float, epochs: int,
                    train_examples: int, l1: float) -> Job:
    from ..finetune import FinetuneConfig, finetune

    cfg = FinetuneConfig(optimizer=optimizer, lr=float(lr), epochs=int(epochs),
                         train_examples=int(train_examples) if train_examples else None,
                         l1=float(l1) if optimizer == "adamw" else 0.0)
    cfg.validate()
    spec = spec_for(task, spec)

    def fn(ctx) -> dict:
        allow = store.allow_local_for([base], [task])
        store.check_model_size(base)
        t = load_task_checked(task, spec)
        name = store.safe_name(f"{store.short_ref(base)}-{store.short_ref(t.name)}-{optimizer}-{time.strftime('%Y%m%d-%H%M%S')}")
        out = store.checkpoints_dir() / name
        finetune(base, t, cfg, out, progress=_finetune_reporter(ctx, f"fine-tuning on {t.name}"), cancel=ctx.cancel,
                 allow_local=allow)
        return {"checkpoint": str(out), "name": name}

    title = f"Fine-tune {store.short_ref(base)} on '{store.short_ref(task)}' · {optimizer} lr {float(lr):g} · {int(epochs)} epoch(s)"
    return runner.submit("finetune", title, fn, {"base": base, "task": task, "config": cfg.as_dict()})


def _regions_for(region_ids: list[str]):
    if not region_ids:
        from ..regions import RegionError

        raise RegionError("pick at least one region (run Localize first if the list is empty)")
    return [(rid, store.load_region(rid)) for rid in region_ids]


def region_short_names(items: list[tuple[str, object]]) -> list[str]:
    """Short unique names for regions in tables and heatmaps: task · method · k."""
    names = []
    for rid, record in items:
        m = record.meta
        base = f"{store.short_ref(m.get('task', '?'))} · {m.get('method', '?')} · k={record.size:,}"
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base} ({n})"
        names.append(name)
    return names


def submit_compare(runner, *, region_ids: list[str], ood: list[str], n: int, baselines: bool, task_fallback: str = "movies") -> Job:
    from ..models import DEFAULT_BASE, DEFAULT_FINETUNED
    from ..regions import RegionError, check_fits
    from ..workflows import baseline_regions, compare

    items = _regions_for(region_ids)
    metas = [r.meta for _, r in items]
    base = metas[0].get("base", DEFAULT_BASE)
    finetuned = metas[0].get("finetuned", DEFAULT_FINETUNED)
    others = {(m.get("base"), m.get("finetuned")) for m in metas}
    if len(others) > 1:
        raise RegionError("the selected regions come from different model pairs; compare regions of one fine-tuned model at a time "
                          "(use Compose for regions of several checkpoints)")
    task_ref = metas[0].get("task") or task_fallback
    spec = data_spec(**{k: (metas[0].get("data_spec") or {}).get(f"{k}_column") for k in ("text", "pair", "label")})
    names = region_short_names(items)
    n = int(n) if n else None

    def fn(ctx) -> dict:
        allow = store.allow_local_for([base, finetuned], [])
        ctx.report({"stage": "loading models"})
        pair = load_checked_pair(base, finetuned, allow)
        models = {}
        for name, (_, record) in zip(names, items):
            check_fits(record, pair)
            models[f"graft: {name}"] = record.indices
        task = load_task_checked(task_ref, spec)
        ood_tasks, skipped = [], []
        for ref in ood or []:
            if ref == task_ref:
                continue
            other = load_task_checked(ref)
            if tuple(other.label_names) != tuple(task.label_names):
                skipped.append(f"{other.name} (labels {', '.join(other.label_names)})")
            else:
                ood_tasks.append(other)
        if baselines:
            k = items[0][1].size
            ctx.report({"stage": f"building baselines at k = {k:,}"})
            for label, region in baseline_regions(pair, k).items():
                models[f"{label} (same k)"] = region
        result = compare(pair, task, models, ood=ood_tasks, n=n, progress=ctx.report, cancel=ctx.cancel).as_dict()
        result["skipped_ood"] = skipped
        result["pair"] = {"base": base, "finetuned": finetuned}
        return result

    title = f"Compare {len(items)} region(s) on '{store.short_ref(task_ref)}'" + (f" + {len(ood)} OOD" if ood else "")
    return runner.submit("compare", title, fn, {"regions": region_ids, "ood": list(ood or []), "n": n, "baselines": baselines})


def parse_budgets(text: str) -> list[float]:
    """'1e-5, 1e-4, 0.001' -> sorted sparsities in (0, 1]."""
    out = []
    for part in str(text).replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"'{part}' is not a number; write budgets like 1e-5, 1e-4, 1e-3") from None
        if not 0 < value <= 1:
            raise ValueError(f"budget {part} is not a fraction in (0, 1]")
        out.append(value)
    if not out:
        raise ValueError("give at least one budget, e.g. 1e-4, 1e-3")
    return sorted(set(out))


def submit_sweep(runner, *, base: str, finetuned: str, task: str, spec, budgets: str, steps: int,
                 examples_per_class: int, lr: float, n: int) -> Job:
    from ..method import LearnConfig
    from ..workflows import LocalizeRequest, sweep

    sparsities = parse_budgets(budgets)
    spec = spec_for(task, spec)
    request = LocalizeRequest(base=base, finetuned=finetuned, task=task, examples_per_class=int(examples_per_class),
                              learn=LearnConfig(steps=int(steps), lr=float(lr)), data=spec)
    n = int(n) if n else None

    def fn(ctx) -> dict:
        allow = store.allow_local_for([base, finetuned], [task])
        load_task_checked(task, spec)
        load_checked_pair(base, finetuned, allow)
        rows = sweep(request, sparsities, n=n, progress=ctx.report, cancel=ctx.cancel, allow_local=allow)
        return {"rows": rows, "task": task}

    title = f"Sparsity sweep on '{store.short_ref(task)}' ({len(sparsities)} budgets × 3 methods)"
    return runner.submit("sweep", title, fn, {**request.as_dict(), "sparsities": sparsities, "n": n})


def as_patch(record):
    """A skill patch from a region: values read from its own fine-tuned checkpoint (loaded, checked)."""
    from ..regions import check_fits, with_patch

    if record.is_patch:
        return record
    base, finetuned = record.meta.get("base"), record.meta.get("finetuned")
    pair = load_checked_pair(base, finetuned, store.allow_local_for([base, finetuned]))
    check_fits(record, pair)
    return with_patch(pair, record)


def overlap_for(region_ids: list[str]) -> dict:
    """compose.overlap_matrix of the selected regions, with short names."""
    from ..compose import overlap_matrix

    items = _regions_for(region_ids)
    return overlap_matrix(dict(zip(region_short_names(items), (r.indices for _, r in items))))


def submit_compose(runner, *, region_ids: list[str], resolve: str, n: int) -> Job:
    from ..flows_extra import compose_evaluate
    from ..regions import RegionError

    items = _regions_for(region_ids)
    if len(items) < 2:
        raise RegionError("pick at least two regions to compose")
    names = region_short_names(items)
    bases = {r.meta.get("base") for _, r in items}
    if len(bases) > 1:
        raise RegionError(f"the regions come from different base models ({', '.join(sorted(map(str, bases)))}); compose needs one base")
    base = bases.pop()
    n = int(n) if n else None

    def fn(ctx) -> dict:
        allow = store.allow_local_for([base], [])
        records, tasks = [], []
        for i, (_, record) in enumerate(items):
            ctx.report({"stage": f"reading region {i + 1} of {len(items)}", "fraction": 0.0})
            records.append(as_patch(record))
            spec_meta = record.meta.get("data_spec") or {}
            spec = data_spec(spec_meta.get("text_column"), spec_meta.get("pair_column"), spec_meta.get("label_column"))
            tasks.append(load_task_checked(record.meta.get("task") or "movies", spec))
        return compose_evaluate(base, records, names, tasks, resolve=resolve, n=n, progress=ctx.report, cancel=ctx.cancel,
                                allow_local=allow)

    title = f"Compose {len(items)} regions (overlaps: {resolve}) and evaluate on {len(items)} task(s)"
    return runner.submit("compose", title, fn, {"regions": region_ids, "resolve": resolve, "n": n})


def submit_export(runner, *, region_id: str) -> Job:
    from ..regions import check_fits, export_graft, pair_from_patch

    record = store.load_region(region_id)
    base, finetuned = record.meta.get("base"), record.meta.get("finetuned")

    def fn(ctx) -> dict:
        ctx.report({"stage": "loading models", "fraction": 0.1})
        if record.is_patch:  # base + patch rebuilds the graft exactly; the fine-tuned model is not needed
            allow = store.allow_local_for([base])
            store.check_model_size(base)
            pair = pair_from_patch(base, record, allow_local=allow)
        else:
            pair = load_checked_pair(base, finetuned, store.allow_local_for([base, finetuned]))
            check_fits(record, pair)
        ctx.report({"stage": "writing the grafted checkpoint", "fraction": 0.4})
        folder = store.downloads_dir() / f"{region_id}-graft-{ctx.job.id}"
        export_graft(pair, record, folder)
        ctx.report({"stage": "zipping", "fraction": 0.8})
        archive = shutil.make_archive(str(folder), "zip", root_dir=folder)
        shutil.rmtree(folder, ignore_errors=True)
        return {"zip": archive, "region": region_id}

    return runner.submit("export", f"Export grafted checkpoint of {region_id}", fn, {"region": region_id})


# -- result tables ------------------------------------------------------------------------------
def _pct(v) -> str:
    return "" if v is None else f"{v:.1%}"


def _num(v, digits: int = 3) -> str:
    return "" if v is None else f"{v:.{digits}f}"


COMPARE_COLUMNS = ["model", "task", "distribution", "test examples", "accuracy ↑", "F1 ↑ (positive class; macro if > 2)",
                   "ECE ↓ (10 bins)", "agreement with FT", "Δ accuracy vs FT", "region size (params)"]


def compare_table(result: dict) -> pd.DataFrame:
    rows = result.get("rows") or []
    ft = {r["task"]: r["accuracy"] for r in rows if r["model"] == "fine-tuned"}
    out = []
    for r in rows:
        out.append({
            "model": r["model"],
            "task": r["task"],
            "distribution": "in-distribution" if r["distribution"] == "in" else "OOD",
            "test examples": r["n"],
            "accuracy ↑": _pct(r["accuracy"]),
            "F1 ↑ (positive class; macro if > 2)": _num(r["f1"]),
            "ECE ↓ (10 bins)": _num(r["ece"]),
            "agreement with FT": _pct(r["agreement_with_ft"]),
            "Δ accuracy vs FT": "" if r["task"] not in ft else f"{100 * (r['accuracy'] - ft[r['task']]):+.1f} pts",
            "region size (params)": "full model" if r["model"] == "fine-tuned" else ("0 (no body change)" if r["region_size"] is None else f"{r['region_size']:,}"),
        })
    return pd.DataFrame(out, columns=COMPARE_COLUMNS)


SWEEP_COLUMNS = ["method", "sparsity (fraction of graftable)", "k (params)", "accuracy ↑", "retained FT accuracy", "ECE ↓ (10 bins)"]


def sweep_table(rows: list[dict]) -> pd.DataFrame:
    out = [{
        "method": r["method"],
        "sparsity (fraction of graftable)": f"{r['sparsity']:.0e}",
        "k (params)": f"{r['k']:,}",
        "accuracy ↑": _pct(r["accuracy"]),
        "retained FT accuracy": _pct(r.get("retained")),
        "ECE ↓ (10 bins)": _num(r.get("ece")),
    } for r in rows]
    return pd.DataFrame(out, columns=SWEEP_COLUMNS)


COMPOSE_COLUMNS = ["task", "head from", "model", "test examples", "accuracy ↑", "Δ accuracy vs region alone", "F1 ↑",
                   "ECE ↓ (10 bins)", "params grafted"]


def compose_table(result: dict) -> pd.DataFrame:
    out = [{
        "task": r["task"],
        "head from": r["head"],
        "model": r["model"],
        "test examples": r["n"],
        "accuracy ↑": _pct(r["accuracy"]),
        "Δ accuracy vs region alone": f"{100 * r['delta_vs_alone']:+.1f} pts",
        "F1 ↑": _num(r["f1"]),
        "ECE ↓ (10 bins)": _num(r["ece"]),
        "params grafted": f"{r['region_size']:,}" if r.get("region_size") is not None else "",
    } for r in result.get("rows") or []]
    return pd.DataFrame(out, columns=COMPOSE_COLUMNS)


def compose_report_text(report: dict | None) -> str:
    """How the union was built: sizes, shared parameters and the rule that settled them."""
    if not report:
        return ""
    rule = {"mean": "base + mean of the contributors' movements", "first": "the first region listed wins",
            "last": "the last region listed wins"}.get(report["resolve"], report["resolve"])
    sizes = ", ".join(f"{name}: {k:,}" for name, k in report["sizes"].items())
    pairs = [f"{a} ∩ {b}: {c:,}" for a, inner in report["per_pair"].items() for b, c in inner.items()]
    return (f"**Union graft: {report['union_params']:,} parameters** (region sizes {sizes}). "
            f"**{report['overlap_params']:,}** parameters are claimed by two or more regions"
            + (f" ({'; '.join(pairs)})" if pairs else "")
            + f"; rule for them: **{report['resolve']}** ({rule}).")


OVERLAP_COLUMNS = ["region i", "region j", "|γi|", "|γj|", "|γi ∩ γj| shared params", "|γi ∩ γj| / |γj|", "|γi ∩ γj| / |γi|", "IoU"]


def overlap_summary(matrix: dict | None) -> pd.DataFrame:
    if not matrix:
        return pd.DataFrame(columns=OVERLAP_COLUMNS)
    names, inter, sizes = matrix["names"], matrix["intersection_counts"], matrix["sizes"]
    rows = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            rows.append({"region i": names[i], "region j": names[j], "|γi|": f"{sizes[i]:,}", "|γj|": f"{sizes[j]:,}",
                         "|γi ∩ γj| shared params": f"{inter[i][j]:,}",
                         "|γi ∩ γj| / |γj|": _pct(matrix["overlap"][i][j]), "|γi ∩ γj| / |γi|": _pct(matrix["overlap"][j][i]),
                         "IoU": _pct(matrix["iou"][i][j])})
    return pd.DataFrame(rows, columns=OVERLAP_COLUMNS)


WEIGHT_BIAS_COLUMNS = ["parameter kind", "in region", "graftable", "density (in region / graftable)", "share of region"]


def weight_bias_table(anat) -> pd.DataFrame:
    rows = []
    for kind, count, total in (("weights", anat.weight_count, anat.weight_total), ("biases", anat.bias_count, anat.bias_total)):
        rows.append({"parameter kind": kind, "in region": f"{count:,}", "graftable": f"{total:,}",
                     "density (in region / graftable)": f"{count / total:.4%}" if total else "",
                     "share of region": f"{count / max(anat.weight_count + anat.bias_count, 1):.1%}"})
    return pd.DataFrame(rows, columns=WEIGHT_BIAS_COLUMNS)


META_KEYS = [
    ("kind", "file kind (patch = with fine-tuned values)"), ("method", "method"), ("task", "task"), ("base", "base model"),
    ("finetuned", "fine-tuned model"), ("k", "k (parameters in region)"), ("graftable_params", "graftable parameters"),
    ("fraction_of_graftable", "fraction of graftable"), ("fraction_of_all", "fraction of all parameters"),
    ("budget", "budget asked for"), ("labels", "labels"), ("architecture", "architecture"),
    ("train_examples", "training examples (mask learning)"), ("learn", "mask-learning settings"),
    ("base_sha256", "base sha256"), ("finetuned_sha256", "fine-tuned sha256"), ("library_version", "graftui version"),
    ("created", "created (UTC)"),
]


def region_meta_table(record) -> pd.DataFrame:
    if record is None:
        return pd.DataFrame(columns=["field", "value"])
    meta = {"kind": "patch" if record.is_patch else "region", **record.meta, "k": record.size}
    rows = []
    for key, label in META_KEYS:
        if key not in meta or meta[key] is None:
            continue
        v = meta[key]
        if isinstance(v, float):
            v = f"{v:.4%}" if key.startswith("fraction") else f"{v:g}"
        elif isinstance(v, int):
            v = f"{v:,}"
        elif isinstance(v, (list, dict)):
            v = ", ".join(map(str, v)) if isinstance(v, list) else ", ".join(f"{a}={b}" for a, b in v.items())
        rows.append({"field": label, "value": str(v)})
    rows.append({"field": "tensors touched", "value": f"{len(record.indices):,} of {len(record.shapes):,} graftable tensors"})
    return pd.DataFrame(rows, columns=["field", "value"])


def region_only_file(region_id: str):
    """A region file without values (indices only) next to the downloads; written once."""
    from ..regions import RegionRecord, save

    path = store.downloads_dir() / f"{region_id}-region.safetensors"
    if not path.exists():
        record = store.load_region(region_id)
        save(RegionRecord(record.indices, record.shapes, dict(record.meta)), path)
    return path
