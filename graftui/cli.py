"""The ``graftui`` command: fine-tune, localize, evaluate, inspect, compose and export skill regions.

Every subcommand runs the offline default when given no arguments (base ``minilm``, fine-tuned
``minilm-movies``, task ``movies``, out-of-distribution tasks ``amazon`` and ``tweets``), prints
aligned tables, or one JSON document on stdout with ``--json``. Progress bars go to stderr and
only when stderr is a terminal. Bad input exits with code 2 and one line on stderr; cheap checks
(budgets, files, columns) run before any model is loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Sequence

from . import __version__

PROG = "graftui"
SENTIMENT_TASKS = ("movies", "amazon", "tweets")
DEFAULT_TASK = "movies"
DEFAULT_SPARSITY = 0.001
DEFAULT_SWEEP = "1e-4,1e-3,1e-2"
DEFAULT_SWEEP_METHODS = "learned,top-movement,random"


class CLIError(ValueError):
    """Bad input found by the command itself: exit code 2 and its message on one line."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line instead of usage + message."""

    def error(self, message: str):  # noqa: D102 - argparse hook
        raise CLIError(f"{message} (see '{self.prog} --help')")


# -- small helpers -------------------------------------------------------------------------------
def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    if isinstance(err, KeyError) and len(err.args) == 1:
        text = str(err.args[0])
    return text or type(err).__name__


def _fail(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


def _count(n: int | None) -> str:
    return "-" if n is None else f"{int(n):,}"


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    value = 100 * x
    if value == 0:
        return "0%"
    if value >= 10:
        return f"{value:.1f}%"
    if value >= 1:
        return f"{value:.2f}%"
    return f"{value:.2g}%"


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _looks_numeric(text: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d,]*\.?\d+(e[-+]?\d+)?%?|-", text.strip()))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """An aligned plain-text table; numeric columns are right-aligned unless ``align`` says otherwise."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if align is None:
        align = "".join(
            "r" if cells and all(_looks_numeric(r[i]) for r in cells) else "l" for i in range(len(headers))
        )

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(values, widths, align)]
        return "  ".join(parts).rstrip()

    out = [line(list(headers)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(out)


def pairs_table(items: Sequence[tuple[str, object]]) -> str:
    """``key  value`` lines with the keys aligned."""
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in items)


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    try:
        import torch

        if isinstance(value, torch.Tensor):
            return value.tolist()
    except ImportError:  # pragma: no cover
        pass
    return str(value)


def _slug(text: str) -> str:
    text = str(text).strip().rstrip("/\\")
    path = Path(text).expanduser()
    if path.suffix.lower() in {".csv", ".tsv", ".json", ".jsonl", ".parquet"} or path.exists():
        text = path.stem or path.name
    return re.sub(r"[^\w.-]+", "_", text).strip("._") or "task"


class UI:
    """Where output goes: stdout for results, stderr for progress (only on a terminal, never with --json)."""

    def __init__(self, args: argparse.Namespace):
        self.json = bool(getattr(args, "json", False))
        self.live = not self.json and sys.stderr.isatty()

    def note(self, message: str) -> None:
        if self.live:
            print(message, file=sys.stderr)

    def bar(self, total: int | None, desc: str):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, disable=not self.live, leave=False, dynamic_ncols=True)

    def emit(self, doc: dict, text: str) -> None:
        if self.json:
            print(json.dumps(doc, indent=2, default=_json_default))
        else:
            print(text)


@contextlib.contextmanager
def _quiet(debug: bool):
    """Library warnings, log records and retry chatter stay off stderr (``--debug`` shows them)."""
    if debug:
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _no_library_bars() -> None:
    """Loading and saving bars of transformers / huggingface_hub would interleave with ours."""
    for call in (
        lambda: __import__("transformers").logging.disable_progress_bar(),
        lambda: __import__("huggingface_hub.utils", fromlist=["disable_progress_bars"]).disable_progress_bars(),
    ):
        try:
            call()
        except Exception:  # noqa: BLE001 - cosmetics only
            pass


def _setup_torch() -> None:
    """Use every core this process may run on, and keep library chatter off the terminal."""
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    torch.set_num_threads(max(1, cores))
    _no_library_bars()


# -- cheap validation (before any model is loaded) ----------------------------------------------
def _check_budget(sparsity: float | None, k: int | None) -> None:
    from .localize import Budget, BudgetError

    if k is not None:
        if k < 1:
            raise BudgetError(f"--k must be at least 1, got {k}")
        return
    Budget(sparsity=sparsity).resolve(sys.maxsize)  # the bounds that do not depend on the model


def _parse_floats(text: str, what: str) -> list[float]:
    values = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            values.append(float(part))
        except ValueError:
            raise CLIError(f"{what}: '{part}' is not a number") from None
    if not values:
        raise CLIError(f"{what}: give at least one value")
    return values


def _parse_methods(text: str) -> tuple[str, ...]:
    from .localize import METHODS

    names = tuple(dict.fromkeys(p.strip() for p in str(text).split(",") if p.strip()))
    if not names:
        raise CLIError("--methods: give at least one method")
    for name in names:
        if name not in METHODS:
            raise CLIError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
    return names


def _parse_modules(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    from .anatomy import MODULE_TYPES

    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not names:
        raise CLIError("--modules: give at least one module type")
    for name in names:
        if name not in MODULE_TYPES:
            raise CLIError(f"unknown module type '{name}' in --modules; choose from {', '.join(MODULE_TYPES)}")
    return names


def _check_model_ref(ref: str) -> None:
    """Fail early on a reference that names nothing; the default fine-tuned model is built later."""
    from .models import DEFAULT_FINETUNED_REFS, resolve

    if (ref or "").strip().lower() not in DEFAULT_FINETUNED_REFS:
        resolve(ref)


def _ensure_default(ref: str, ui: UI) -> None:
    """Build the default fine-tuned checkpoint on first use, with a progress bar."""
    from .finetune import default_checkpoint_dir, ensure_default_finetuned
    from .models import DEFAULT_FINETUNED_REFS

    key = (ref or "").strip().lower()
    if key not in DEFAULT_FINETUNED_REFS or (default_checkpoint_dir(key) / "config.json").exists():
        return
    ui.note(f"building the default fine-tuned checkpoint '{key}' (first use; a few minutes on CPU)")
    with ui.bar(None, f"fine-tuning {key}") as bar:

        def on_step(p) -> None:
            bar.total = p.steps
            bar.n = p.step
            bar.set_postfix(loss=f"{p.loss:.3f}", acc=f"{p.accuracy:.3f}", refresh=False)
            bar.refresh()

        ensure_default_finetuned(key, progress=on_step)


def _data_spec(args: argparse.Namespace):
    from .data import DataSpec

    return DataSpec(
        config=args.config, text_column=args.text_column, pair_column=args.pair_column, label_column=args.label_column
    )


def _load_task(ref: str, spec=None):
    """load_task, but column options given for an offline task must name its columns (text, label)."""
    from .data import OFFLINE_TASKS, DataError, DataSpec, load_task

    spec = spec or DataSpec()
    if str(ref).strip().lower() in OFFLINE_TASKS:
        offline = {"text_column": "text", "label_column": "label", "pair_column": None}
        for field, allowed in offline.items():
            column = getattr(spec, field)
            if column is not None and column != allowed:
                raise DataError(
                    f"column '{column}' ({field}) not found in the offline task '{ref}'; its columns are text, label"
                )
    return load_task(ref, spec)


def _check_kshot(task, per_class: int, seed: int) -> None:
    """Mask learning draws ``per_class`` training examples of every class: are there enough?"""
    from .data import DataError, kshot

    try:
        kshot(task.splits["train"], per_class, seed)
    except DataError as err:
        detail = str(err).split(": ", 1)[-1]
        raise DataError(f"--examples-per-class {per_class} is too large for task '{task.name}': {detail}") from None


def _load_region(path: str):
    from . import regions

    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"no region file at '{path}'")
    if p.is_dir():
        raise regions.RegionError(f"'{path}' is a folder, not a region file")
    return regions.load(p)


def _latest_region() -> Path:
    from . import settings

    folder = settings.subdir("regions")
    files = sorted(folder.glob("*.safetensors"), key=lambda f: f.stat().st_mtime)
    if not files:
        raise CLIError(f"no --region given and none in {folder}; run 'graftui localize' first")
    return files[-1]


def _check_out_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise CLIError(f"output '{path}' exists and is a file, not a folder")
    if path.is_dir() and any(path.iterdir()):
        raise CLIError(f"output folder '{path}' exists and is not empty; choose a new folder")


def _check_out_file(path: Path) -> None:
    if path.is_dir():
        raise CLIError(f"output '{path}' is a folder; give a file name such as region.safetensors")


def _labels(paths: Sequence[str]) -> list[str]:
    """Distinct display names for region files: their stems, numbered where they collide."""
    out: list[str] = []
    for p in paths:
        name = Path(p).stem or str(p)
        candidate, i = name, 2
        while candidate in out:
            candidate, i = f"{name} ({i})", i + 1
        out.append(candidate)
    return out


def _merged_shapes(records) -> dict:
    from .regions import RegionError

    shapes: dict = {}
    for record in records:
        for name, shape in record.shapes.items():
            shape = tuple(shape)
            if name in shapes and shapes[name] != shape:
                raise RegionError(
                    f"the regions were made for different models: {name} has shape {list(shapes[name])} in one "
                    f"and {list(shape)} in another"
                )
            shapes[name] = shape
    return shapes


def _region_spec(records):
    """The graftable set the regions were made over, so fits and baselines use the same tensors.

    The spec recorded by ``localize`` is tried first (it matches a cached pair); callers fall back
    to the exact tensor names of the files when it does not reproduce them.
    """
    from .models import GraftableSpec

    exact = GraftableSpec(include_embeddings=True, names=tuple(_merged_shapes(records)))
    recorded = [r.meta.get("graftable_spec") for r in records]
    if not recorded or not all(isinstance(d, dict) for d in recorded) or any(d != recorded[0] for d in recorded):
        return exact, exact
    d = recorded[0]
    try:
        spec = GraftableSpec(
            include_embeddings=bool(d.get("include_embeddings", False)),
            modules=tuple(d["modules"]) if d.get("modules") else None,
            names=tuple(d["names"]) if d.get("names") else None,
        )
    except (TypeError, ValueError):
        return exact, exact
    return spec, exact


def _pair_for_regions(base: str, finetuned: str, records):
    """The model pair whose graftable tensors are exactly those the regions were made over."""
    from .workflows import load_pair

    spec, exact = _region_spec(records)
    pair = load_pair(base, finetuned, spec)
    if spec != exact and set(pair.graftable) != set(_merged_shapes(records)):
        pair = load_pair(base, finetuned, exact)
    return pair


def _learn_config(args: argparse.Namespace):
    from .method import LearnConfig

    default = LearnConfig()
    config = LearnConfig(
        steps=args.steps if args.steps is not None else default.steps,
        lr=args.lr if args.lr is not None else default.lr,
        optimizer=args.optimizer or default.optimizer,
        binarise=args.binarise or default.binarise,
        batch_size=args.batch_size if args.batch_size is not None else default.batch_size,
        seed=args.seed,
    )
    if config.steps < 1:
        raise CLIError(f"--steps must be at least 1, got {config.steps}")
    if not (config.lr > 0 and math.isfinite(config.lr)):
        raise CLIError(f"--lr must be a positive number, got {config.lr}")
    if config.batch_size < 1:
        raise CLIError(f"--batch-size must be at least 1, got {config.batch_size}")
    return config


# -- finetune ------------------------------------------------------------------------------------
def cmd_finetune(args: argparse.Namespace) -> int:
    ui = UI(args)
    default = _finetune_defaults()
    optimizer = args.optimizer or default.optimizer
    lr = args.lr
    if lr is None:
        lr = default.lr if optimizer == default.optimizer else _DEFAULT_LR[optimizer]
    train_examples = default.train_examples if args.train_examples is None else (args.train_examples or None)
    if train_examples is not None and train_examples < 0:
        raise CLIError(f"--train-examples must be 0 (all) or more, got {args.train_examples}")
    config = dataclasses.replace(  # every field not given follows the default recipe
        default,
        optimizer=optimizer,
        lr=lr,
        epochs=args.epochs if args.epochs is not None else default.epochs,
        batch_size=args.batch_size if args.batch_size is not None else default.batch_size,
        l1=args.l1 if args.l1 is not None else default.l1,
        train_examples=train_examples,
        seed=args.seed if args.seed is not None else default.seed,
    )
    config.validate()
    if args.test_examples is not None and args.test_examples < 1:
        raise CLIError(f"--test-examples must be at least 1, got {args.test_examples}")
    _check_model_ref(args.base)
    task = _load_task(args.task, _data_spec(args))

    from .finetune import default_checkpoint_dir

    reused = False
    if args.out:
        out = Path(args.out).expanduser()
        _check_out_dir(out)
    else:  # same recipe, same folder: `graftui finetune` with no arguments builds 'minilm-movies'
        out = default_checkpoint_dir(f"{_slug(args.base)}-{_slug(args.task)}", config)
        reused = (out / "config.json").exists()
        if not reused:
            _check_out_dir(out)
    _setup_torch()
    start = time.time()
    if not reused:
        from .finetune import finetune

        with ui.bar(None, "fine-tuning") as bar:

            def on_step(p) -> None:
                bar.total = p.steps
                bar.n = p.step
                bar.set_postfix(epoch=p.epoch, loss=f"{p.loss:.3f}", acc=f"{p.accuracy:.3f}", refresh=False)
                bar.refresh()

            finetune(args.base, task, config, out, progress=on_step)
    seconds = time.time() - start
    accuracy, n = _test_accuracy(out, task, args.test_examples, ui)
    doc = {
        "out": str(out),
        "reused": reused,
        "base": args.base,
        "task": task.name,
        "test_accuracy": accuracy,
        "test_examples": n,
        "seconds": seconds,
        "config": config.as_dict(),
    }
    lines = [
        ("checkpoint", f"{out}" + ("  (already built with this recipe; reused)" if reused else "")),
        ("base / task", f"{args.base} / {task.name}"),
        ("recipe", f"{config.optimizer}, lr {config.lr:g}, {config.epochs} epoch(s), batch {config.batch_size}"
         + (f", l1 {config.l1:g}" if config.l1 else "")
         + f", {config.train_examples or 'all'} training examples"),
        ("test accuracy", f"{accuracy:.3f}  (n={n:,})"),
        ("time", f"{seconds:.1f} s"),
    ]
    ui.emit(doc, pairs_table(lines))
    return 0


_DEFAULT_LR = {"sgd": 0.003, "adamw": 3e-5}  # when --optimizer differs from the default recipe's


def _finetune_defaults():
    """The recipe of the default fine-tuned checkpoint (a quick one under GRAFTUI_FAST)."""
    from . import finetune

    getter = getattr(finetune, "default_config", None)
    return getter() if getter else finetune.FinetuneConfig()


def _test_accuracy(folder: Path, task, n: int | None, ui: UI) -> tuple[float, int]:
    from . import metrics
    from .data import batches, subsample
    from .models import load_classifier, load_tokenizer
    from .settings import device

    model, _ = load_classifier(str(folder))
    model.to(device())
    tokenizer = load_tokenizer(str(folder))
    data = task.splits["test"]
    if n is not None and n < len(data):
        data = subsample(data, n, 0)
    size = 64
    with ui.bar(-(-len(data) // size), "testing") as bar:

        def stream():
            for batch in batches(tokenizer, data, size, task.max_length):
                yield batch
                bar.update(1)

        probs, labels = metrics.predict_proba(model, stream())
    return metrics.accuracy(probs, labels), len(data)


# -- localize ------------------------------------------------------------------------------------
def cmd_localize(args: argparse.Namespace) -> int:
    from . import regions, settings
    from .anatomy import MODULE_LABELS, anatomy
    from .localize import get_method
    from .models import GraftableSpec
    from .workflows import LocalizeRequest, localize

    ui = UI(args)
    info = get_method(args.method)
    sparsity = args.sparsity if args.k is None else None
    if args.k is None and sparsity is None:
        sparsity = DEFAULT_SPARSITY
    _check_budget(sparsity, args.k)
    if args.examples_per_class < 1:
        raise CLIError(f"--examples-per-class must be at least 1, got {args.examples_per_class}")
    config = _learn_config(args)
    modules = _parse_modules(args.modules)
    out = Path(args.out).expanduser() if args.out else None
    if out is not None:
        _check_out_file(out)
    _check_model_ref(args.base)
    _check_model_ref(args.finetuned)
    spec = _data_spec(args)
    if info.needs_data:
        task = _load_task(args.task, spec)
        _check_kshot(task, args.examples_per_class, config.seed)
    request = LocalizeRequest(
        base=args.base,
        finetuned=args.finetuned,
        task=args.task,
        method=args.method,
        sparsity=sparsity,
        k=args.k,
        examples_per_class=args.examples_per_class,
        learn=config,
        graftable=GraftableSpec(include_embeddings=args.include_embeddings, modules=modules),
        data=spec,
    )
    _setup_torch()
    _ensure_default(args.finetuned, ui)
    start = time.time()
    bar = None
    try:
        def on_progress(event: dict) -> None:
            nonlocal bar
            if event.get("stage") == "loading models":
                ui.note(f"loading {args.base} and {args.finetuned}")
            elif "step" in event:
                if bar is None:
                    bar = ui.bar(event["steps"], "mask learning")
                bar.set_postfix(loss=f"{event['loss']:.3f}", acc=f"{event['accuracy']:.2f}", refresh=False)
                bar.update(1)

        record = localize(request, progress=on_progress)
    finally:
        if bar is not None:
            bar.close()
    seconds = time.time() - start
    if args.region_only:
        record = regions.RegionRecord(record.indices, record.shapes, dict(record.meta))
    record.meta["seconds"] = round(seconds, 3)
    k = record.size
    if out is None:
        out = settings.subdir("regions") / f"{args.method}-{_slug(args.task)}-{k}.safetensors"
    regions.save(record, out)

    graftable = int(record.meta.get("graftable_params") or record.graftable)
    total = int(record.meta.get("total_params") or graftable)
    ana = anatomy(record.indices, record.shapes)
    top = sorted(ana.by_module.items(), key=lambda kv: -kv[1])[:3]
    top_modules = [
        {"module": m, "label": MODULE_LABELS.get(m, m), "count": c, "share": c / k if k else 0.0} for m, c in top if c
    ]
    doc = {
        "path": str(out),
        "kind": "patch" if record.is_patch else "region",
        "method": args.method,
        "task": args.task,
        "k": k,
        "graftable_params": graftable,
        "total_params": total,
        "fraction_of_graftable": k / graftable if graftable else 0.0,
        "fraction_of_all": k / total if total else 0.0,
        "seconds": seconds,
        "top_modules": top_modules,
        "weights": ana.weight_count,
        "biases": ana.bias_count,
        "meta": record.meta,
    }
    detail = info.label
    if info.needs_data:
        detail += f", {config.steps} steps on {record.meta.get('train_examples', 0):,} training examples"
    lines = [
        ("wrote", f"{out}  ({'skill patch' if record.is_patch else 'region'})"),
        ("region", f"k = {k:,}  ({_pct(doc['fraction_of_graftable'])} of {graftable:,} graftable, "
                   f"{_pct(doc['fraction_of_all'])} of {total:,} parameters)"),
        ("method", detail),
        ("time", f"{seconds:.1f} s"),
        ("anatomy", "  ".join(f"{t['label']} {_pct(t['share'])}" for t in top_modules) or "(empty region)"),
        ("", f"weights {ana.weight_count:,}, biases {ana.bias_count:,}"),
    ]
    ui.emit(doc, pairs_table(lines))
    return 0


# -- evaluate ------------------------------------------------------------------------------------
def _merge_patches(records, labels):
    """One patch holding every given patch's values, so each graft is exact on one pair."""
    from . import compose
    from .regions import RegionError, RegionRecord

    sources = {r.meta.get("finetuned_sha256") or r.meta.get("finetuned") for r in records}
    if len(sources) > 1:
        raise RegionError(
            "the patches come from different fine-tuned models; give --finetuned, or evaluate them one at a time"
        )
    shapes = _merged_shapes(records)
    if len(records) == 1:
        return records[0]
    contributions = [compose.Contribution(label, r.indices, r.values) for label, r in zip(labels, records)]
    indices, values, _ = compose.union_values(contributions, {}, "first")
    return RegionRecord(indices, shapes, dict(records[0].meta), values, records[0].head)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from . import regions, settings
    from .localize import Budget
    from .models import DEFAULT_FINETUNED
    from .workflows import BODY_LABEL, FT_LABEL, baseline_regions, compare, load_pair

    ui = UI(args)
    if args.n is not None and args.n < 1:
        raise CLIError(f"--n must be at least 1, got {args.n}")
    if args.sparsity is not None:
        _check_budget(args.sparsity, None)
    paths = list(args.region or [])
    records = [_load_region(p) for p in paths]
    labels = _labels(paths)
    if args.no_ood:
        ood_refs: list[str] = []
    elif args.ood is not None:
        ood_refs = [r for group in args.ood for r in group]
    else:
        key = args.task.strip().lower()
        ood_refs = [t for t in SENTIMENT_TASKS if t != key] if key in SENTIMENT_TASKS else []
    _check_model_ref(args.base)
    from_patch = args.finetuned is None and bool(records) and all(r.is_patch for r in records)
    finetuned = args.finetuned or DEFAULT_FINETUNED
    if from_patch and args.baselines:
        raise CLIError(
            "--baselines needs the fine-tuned checkpoint (--finetuned REF): a skill patch holds only its own region"
        )
    if not from_patch:
        _check_model_ref(finetuned)
    task = _load_task(args.task, _data_spec(args))
    oods = [_load_task(ref) for ref in ood_refs]
    merged = _merge_patches(records, labels) if from_patch else None

    _setup_torch()
    notes = []
    if from_patch:
        ui.note(f"loading {args.base} with the patch")
        pair = regions.pair_from_patch(args.base, merged)
        pair.to(settings.device())
        notes.append(
            f"no --finetuned given: '{FT_LABEL}' is rebuilt from the patch (equal to the fine-tuned model "
            "inside the region only); pass --finetuned for the real one"
        )
    else:
        _ensure_default(finetuned, ui)
        ui.note(f"loading {args.base} and {finetuned}")
        from .models import GraftableSpec

        pair = _pair_for_regions(args.base, finetuned, records) if records else load_pair(
            args.base, finetuned, GraftableSpec()
        )
    for path, record in zip(paths, records):
        try:
            regions.check_fits(record, pair)
        except regions.RegionError as err:
            raise regions.RegionError(f"'{path}': {err}") from None

    models = {label: record.indices for label, record in zip(labels, records)}
    if args.baselines:
        budgets = sorted({r.size for r in records}) or [
            Budget(sparsity=args.sparsity or DEFAULT_SPARSITY).resolve(pair.counts()["graftable"])
        ]
        for k in budgets:
            for label, region in baseline_regions(pair, k, seed=args.seed).items():
                label = f"{label} k={k:,}" if len(budgets) > 1 else label
                models[f"{label} (baseline)" if label in models else label] = region

    total = (len(oods) + 1) * (len(models) + 2)
    with ui.bar(total, "evaluating") as bar:

        def on_progress(event: dict) -> None:
            bar.set_description(event.get("stage", "evaluating")[:60])
            bar.n = round(event.get("fraction", 0.0) * total)
            bar.refresh()

        comparison = compare(pair, task, models, ood=oods, n=args.n, progress=on_progress)
        bar.n = total
        bar.refresh()
    result = comparison.as_dict()
    ft_name = f"{FT_LABEL} (from patch)" if from_patch else FT_LABEL
    for row in result["rows"]:
        if row["model"] == FT_LABEL:
            row["model"] = ft_name
    result["notes"] = notes
    result["base"] = args.base
    result["finetuned"] = None if from_patch else finetuned
    result["regions"] = {label: str(p) for label, p in zip(labels, paths)}

    rows = [
        [
            r["model"], r["task"], r["distribution"], _count(r["n"]), _num(r["accuracy"]), _num(r["f1"]),
            _num(r["ece"]), _num(r["agreement_with_ft"]), _count(r["region_size"]),
        ]
        for r in result["rows"]
    ]
    text = table(["model", "task", "dist", "n", "accuracy", "F1", "ECE", "agree w/ FT", "k"], rows, "lllrrrrrr")
    legend = f"'{BODY_LABEL}' is the graft of the empty region; agreement is with the {ft_name} model."
    text = "\n".join([text, "", legend, *notes])
    ui.emit(result, text)
    return 0


# -- anatomy -------------------------------------------------------------------------------------
def cmd_anatomy(args: argparse.Namespace) -> int:
    from .anatomy import MODULE_LABELS, anatomy

    ui = UI(args)
    path = args.region or str(_latest_region())
    record = _load_region(path)
    a = anatomy(record.indices, record.shapes)
    k, graftable = record.size, record.graftable
    doc = {
        "path": str(path),
        "kind": "patch" if record.is_patch else "region",
        "k": k,
        "graftable_params": graftable,
        "fraction_of_graftable": k / graftable if graftable else 0.0,
        "by": args.by,
        "weights": {"count": a.weight_count, "total": a.weight_total},
        "biases": {"count": a.bias_count, "total": a.bias_total},
        "layers": list(a.layers),
        "modules": list(a.modules),
        "counts": a.counts,
        "totals": a.totals,
        "density": a.density,
        "by_module": a.by_module,
        "by_layer": dict(zip(a.layers, a.by_layer)),
        "cells": a.to_rows(),
        "meta": record.meta,
    }

    def density(count: int, total: int) -> float:
        return count / total if total else 0.0

    if args.by == "layer":
        rows = []
        for i, layer in enumerate(a.layers):
            t = sum(a.totals[i])
            rows.append([layer, _count(a.by_layer[i]), _count(t), _pct(density(a.by_layer[i], t)),
                         _pct(density(a.by_layer[i], k))])
        body = table(["layer", "in region", "graftable", "density", "share of region"], rows, "lrrrr")
    elif args.by == "module":
        rows = []
        for j, m in enumerate(a.modules):
            t = sum(row[j] for row in a.totals)
            c = a.by_module[m]
            rows.append([MODULE_LABELS.get(m, m), _count(c), _count(t), _pct(density(c, t)), _pct(density(c, k))])
        body = table(["module", "in region", "graftable", "density", "share of region"], rows, "lrrrr")
    else:
        headers = ["layer"] + [MODULE_LABELS.get(m, m) for m in a.modules] + ["all", "density"]
        rows = []
        for i, layer in enumerate(a.layers):
            cells = [_count(c) if a.totals[i][j] else "" for j, c in enumerate(a.counts[i])]
            t = sum(a.totals[i])
            rows.append([layer, *cells, _count(a.by_layer[i]), _pct(density(a.by_layer[i], t))])
        col_totals = [sum(row[j] for row in a.totals) for j in range(len(a.modules))]
        rows.append(["all", *[_count(a.by_module[m]) for m in a.modules], _count(k), _pct(density(k, graftable))])
        rows.append(["density", *[_pct(density(a.by_module[m], t)) for m, t in zip(a.modules, col_totals)],
                     _pct(density(k, graftable)), ""])
        body = table(headers, rows, "l" + "r" * (len(headers) - 1))
        body += "\n\ncells hold the number of region parameters; density = in region / graftable"
    header = pairs_table([
        ("region", f"{path}  ({doc['kind']})"),
        ("size", f"k = {k:,}  ({_pct(doc['fraction_of_graftable'])} of {graftable:,} graftable)"),
        ("weights", f"{a.weight_count:,} of {a.weight_total:,}  ({_pct(density(a.weight_count, a.weight_total))})"),
        ("biases", f"{a.bias_count:,} of {a.bias_total:,}  ({_pct(density(a.bias_count, a.bias_total))})"),
    ])
    ui.emit(doc, header + "\n\n" + body)
    return 0


# -- compose -------------------------------------------------------------------------------------
class _LazyBase:
    """Pre-trained tensors by name, loaded only if averaging overlapping patch values needs them."""

    def __init__(self, ref: str, names, ui: UI):
        self.ref, self.names, self.ui = ref, set(names), ui
        self._params: dict | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __getitem__(self, name: str):
        if self._params is None:
            from .models import load_classifier

            _setup_torch()
            self.ui.note(f"loading {self.ref} to average overlapping values")
            model, _ = load_classifier(self.ref)
            self._params = {n: p.detach() for n, p in model.named_parameters()}
        if name not in self._params:
            from .regions import RegionError

            raise RegionError(f"base '{self.ref}' has no parameter {name}; pass the base the patches were made for")
        return self._params[name]


def cmd_compose(args: argparse.Namespace) -> int:
    from . import __version__ as version
    from . import compose, regions

    ui = UI(args)
    paths = list(args.region or [])
    if len(paths) < 2:
        raise CLIError(f"compose needs at least two --region files, got {len(paths)}")
    out = Path(args.out).expanduser() if args.out else None
    if out is not None:
        _check_out_file(out)
    records = [_load_region(p) for p in paths]
    labels = _labels(paths)
    shapes = _merged_shapes(records)
    if out is not None and all(r.is_patch for r in records):
        _check_model_ref(args.base)
    matrix = compose.overlap_matrix({label: r.indices for label, r in zip(labels, records)})
    union_indices = compose.union(*(r.indices for r in records))
    union_size = compose.region_size(union_indices)
    doc = {
        "regions": [
            {"label": label, "path": str(p), "kind": "patch" if r.is_patch else "region", "k": r.size}
            for label, p, r in zip(labels, paths, records)
        ],
        **matrix,
        "union_size": union_size,
        "graftable_params": sum(math.prod(s) for s in shapes.values()),
    }
    written = None
    if out is not None:
        all_patches = all(r.is_patch for r in records)
        meta = {k: v for k, v in records[0].meta.items() if k not in {"seconds", "learn", "budget", "budget_k"}}
        meta.update({
            "method": "union",
            "sources": [str(p) for p in paths],
            "source_methods": [r.meta.get("method") for r in records],
            "k": union_size,
            "graftable_params": doc["graftable_params"],
            "fraction_of_graftable": union_size / max(doc["graftable_params"], 1),
            "library_version": version,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })
        if meta.get("total_params"):
            meta["fraction_of_all"] = union_size / meta["total_params"]
        if len({r.meta.get("finetuned_sha256") for r in records}) > 1:
            meta["finetuned_sha256"] = None
            meta["finetuned"] = "several"
        if all_patches:
            contributions = [compose.Contribution(label, r.indices, r.values) for label, r in zip(labels, records)]
            base = _LazyBase(args.base, shapes, ui)
            indices, values, report = compose.union_values(contributions, base, args.resolve)
            meta["resolve"] = args.resolve
            meta["overlap_params"] = report["overlap_params"]
            record = regions.RegionRecord(indices, shapes, meta, values, records[0].head)
            doc["resolve"] = args.resolve
        else:
            record = regions.RegionRecord(union_indices, shapes, meta)
        regions.save(record, out)
        written = {"path": str(out), "kind": "patch" if record.is_patch else "region", "k": record.size}
        doc["written"] = written

    n = len(labels)
    names = [f"#{i + 1}" for i in range(n)]
    legend = table(
        ["#", "region", "kind", "k"],
        [[names[i], labels[i], doc["regions"][i]["kind"], _count(records[i].size)] for i in range(n)],
        "llll",
    )
    over = table([r"overlap |γi∩γj|/|γj|"] + [f"j={x}" for x in names],
                 [[f"i={names[i]}", *[_pct(matrix["overlap"][i][j]) for j in range(n)]] for i in range(n)])
    iou = table(["IoU"] + names, [[names[i], *[_num(matrix["iou"][i][j]) for j in range(n)]] for i in range(n)])
    parts = [legend, "", over, "", iou, "", f"union: {union_size:,} parameters"]
    if written:
        kind = "skill patch" if written["kind"] == "patch" else "region (not every input is a skill patch)"
        parts.append(f"wrote {written['path']}  ({kind}" + (f", overlaps resolved by {args.resolve})"
                                                            if written["kind"] == "patch" else ")"))
    ui.emit(doc, "\n".join(parts))
    return 0


# -- export --------------------------------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    from . import regions, settings

    ui = UI(args)
    path = args.region or str(_latest_region())
    record = _load_region(path)
    if args.finetuned is None and not record.is_patch:
        raise regions.RegionError(
            f"'{path}' is a region without values: give --finetuned REF to export it, or use a skill patch"
        )
    out = Path(args.out).expanduser() if args.out else settings.subdir("exports") / _slug(Path(path).stem)
    _check_out_dir(out)
    _check_model_ref(args.base)
    if args.finetuned is not None:
        _check_model_ref(args.finetuned)
    _setup_torch()
    if args.finetuned is None:
        ui.note(f"loading {args.base} with the patch")
        pair = regions.pair_from_patch(args.base, record)
    else:
        _ensure_default(args.finetuned, ui)
        ui.note(f"loading {args.base} and {args.finetuned}")
        pair = _pair_for_regions(args.base, args.finetuned, [record])
        regions.check_fits(record, pair)
    regions.export_graft(pair, record, out)
    doc = {
        "out": str(out),
        "region": str(path),
        "base": args.base,
        "finetuned": args.finetuned or f"patch:{record.meta.get('finetuned', '?')}",
        "k": record.size,
        "labels": list(pair.label_names),
    }
    lines = [
        ("wrote", str(out)),
        ("graft", f"{args.base} + {record.size:,} parameters of "
                  f"{args.finetuned or 'the skill patch'} ({Path(path).name})"),
        ("load with", f"AutoModelForSequenceClassification.from_pretrained('{out}')"),
    ]
    ui.emit(doc, pairs_table(lines))
    return 0


# -- sweep ---------------------------------------------------------------------------------------
def cmd_sweep(args: argparse.Namespace) -> int:
    from .localize import get_method
    from .models import GraftableSpec
    from .workflows import LocalizeRequest, sweep

    ui = UI(args)
    sparsities = sorted(set(_parse_floats(args.sparsities, "--sparsities")))
    for s in sparsities:
        _check_budget(s, None)
    methods = _parse_methods(args.methods)
    if args.n is not None and args.n < 1:
        raise CLIError(f"--n must be at least 1, got {args.n}")
    if args.examples_per_class < 1:
        raise CLIError(f"--examples-per-class must be at least 1, got {args.examples_per_class}")
    config = _learn_config(args)
    modules = _parse_modules(args.modules)
    _check_model_ref(args.base)
    _check_model_ref(args.finetuned)
    spec = _data_spec(args)
    task = _load_task(args.task, spec)
    if any(get_method(m).needs_data for m in methods):
        _check_kshot(task, args.examples_per_class, config.seed)
    request = LocalizeRequest(
        base=args.base, finetuned=args.finetuned, task=args.task, sparsity=sparsities[0],
        examples_per_class=args.examples_per_class, learn=config,
        graftable=GraftableSpec(include_embeddings=args.include_embeddings, modules=modules), data=spec,
    )
    _setup_torch()
    _ensure_default(args.finetuned, ui)
    total = len(sparsities) * len(methods)
    start = time.time()
    with ui.bar(total, "sweep") as bar:

        def on_progress(event: dict) -> None:
            bar.set_description(event.get("stage", "sweep")[:60])
            bar.n = round(event.get("fraction", 0.0) * total)
            bar.refresh()

        rows = sweep(request, sparsities, methods, n=args.n, progress=on_progress)
        bar.n = total
        bar.refresh()
    seconds = time.time() - start
    ft_acc = rows[0]["ft_accuracy"] if rows else None
    doc = {"task": args.task, "base": args.base, "finetuned": args.finetuned, "ft_accuracy": ft_acc,
           "methods": list(methods), "sparsities": sparsities, "rows": rows, "seconds": seconds}
    by = {(r["method"], r["sparsity"]): r for r in rows}
    body = []
    for s in sparsities:
        ks = {by[(m, s)]["k"] for m in methods if (m, s) in by}
        body.append([f"{s:g}", "/".join(_count(k) for k in sorted(ks)),
                     *[_num(by[(m, s)]["accuracy"]) if (m, s) in by else "-" for m in methods]])
    text = table(["sparsity", "k", *methods], body)
    text += f"\n\ntest accuracy on {args.task}; fine-tuned: {_num(ft_acc)}  ({seconds:.1f} s)"
    ui.emit(doc, text)
    return 0


# -- listings ------------------------------------------------------------------------------------
def cmd_methods(args: argparse.Namespace) -> int:
    from .localize import METHODS

    ui = UI(args)
    doc = {"methods": [
        {"name": m.name, "label": m.label, "needs_data": m.needs_data, "description": m.description}
        for m in METHODS.values()
    ]}
    rows = [[m.name, "yes" if m.needs_data else "no", m.description] for m in METHODS.values()]
    ui.emit(doc, table(["method", "data", "description"], rows, "lll"))
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from .data import OFFLINE_TASKS

    ui = UI(args)
    doc = {"tasks": [{"name": n, "description": d} for n, d in OFFLINE_TASKS.items()]}
    text = table(["task", "description"], [[n, d] for n, d in OFFLINE_TASKS.items()], "ll")
    text += "\n\n--task also takes a CSV/TSV/JSON(L)/Parquet file, a folder of them, or a Hugging Face dataset id."
    ui.emit(doc, text)
    return 0


# -- parser --------------------------------------------------------------------------------------
def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None


def build_parser() -> argparse.ArgumentParser:
    from .localize import METHODS
    from .method import LearnConfig
    from .models import DEFAULT_BASE, DEFAULT_FINETUNED
    from .workflows import LocalizeRequest

    parser = _Parser(
        prog=PROG,
        description="Find where a fine-tuned model keeps its skill: learn a tiny region of parameters that, "
        "grafted onto the pre-trained model, recovers the fine-tuned accuracy (Panigrahi et al., ICML 2023).",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")

    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of tables")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback on errors")

    def models_args(p, finetuned: bool = True, finetuned_default: str | None = DEFAULT_FINETUNED):
        g = p.add_argument_group("models")
        g.add_argument("--base", default=DEFAULT_BASE, metavar="REF",
                       help=f"pre-trained model: 'minilm', a checkpoint folder or a Hub id (default {DEFAULT_BASE})")
        if finetuned:
            g.add_argument("--finetuned", default=finetuned_default, metavar="REF",
                           help="fine-tuned model: 'minilm-movies', a checkpoint folder or a Hub id"
                           + (f" (default {finetuned_default})" if finetuned_default else ""))

    def data_args(p):
        g = p.add_argument_group("data")
        g.add_argument("--task", default=DEFAULT_TASK, metavar="REF",
                       help="offline task (see 'graftui tasks'), a data file or folder, or a Hub dataset id "
                       f"(default {DEFAULT_TASK})")
        g.add_argument("--text-column", metavar="NAME", help="column holding the text (guessed if omitted)")
        g.add_argument("--pair-column", metavar="NAME", help="column holding the second text of text-pair tasks")
        g.add_argument("--label-column", metavar="NAME", help="column holding the label (guessed if omitted)")
        g.add_argument("--config", metavar="NAME", help="Hugging Face dataset config name")

    learn = LearnConfig()
    per_class = LocalizeRequest().examples_per_class

    def learn_args(p):
        g = p.add_argument_group("mask learning (method 'learned')")
        g.add_argument("--steps", type=_whole, metavar="N", help=f"mask steps (default {learn.steps})")
        g.add_argument("--lr", type=float, metavar="F",
                       help=f"step size (default {learn.lr:g}; logit units unless --optimizer sgd)")
        g.add_argument("--optimizer", choices=("normalized", "adam", "sgd"), help=f"default {learn.optimizer}")
        g.add_argument("--batch-size", type=_whole, metavar="N", help=f"default {learn.batch_size}")
        g.add_argument("--examples-per-class", type=_whole, default=per_class, metavar="N",
                       help=f"k-shot training examples per class (default {per_class})")
        g.add_argument("--binarise", choices=("topk", "round"),
                       help=f"topk (exact budget) or round, capped at k (default {learn.binarise})")
        g.add_argument("--seed", type=_whole, default=0, help="default 0")
        g2 = p.add_argument_group("graftable parameters")
        g2.add_argument("--include-embeddings", action="store_true",
                        help="let regions include embeddings (frozen in the paper's fine-tuning)")
        g2.add_argument("--modules", metavar="LIST",
                        help="only these module types, e.g. query,value (types: query, key, value, attn_out, "
                        "ffn_in, ffn_out, layernorm, other)")

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("finetune", parents=[common], help="make a fine-tuned checkpoint (SGD or AdamW + ℓ1)",
                       description="Fine-tune a base model on a task and write a Hugging Face checkpoint folder.")
    models_args(p, finetuned=False)
    data_args(p)
    ft = _finetune_defaults()
    other = "adamw" if ft.optimizer == "sgd" else "sgd"
    g = p.add_argument_group("training (defaults: the recipe of the default fine-tuned checkpoint)")
    g.add_argument("--optimizer", choices=("sgd", "adamw"), help=f"sgd (paper) or adamw (default {ft.optimizer})")
    g.add_argument("--lr", type=float, metavar="F",
                   help=f"learning rate (default {ft.lr:g} for {ft.optimizer}, {_DEFAULT_LR[other]:g} for {other})")
    g.add_argument("--epochs", type=_whole, metavar="N", help=f"default {ft.epochs}")
    g.add_argument("--batch-size", type=_whole, metavar="N", help=f"default {ft.batch_size}")
    g.add_argument("--l1", type=float, metavar="F", help=f"ℓ1 movement penalty (adamw only; default {ft.l1:g})")
    g.add_argument("--train-examples", type=_whole, metavar="N",
                   help=f"stratified training subsample (default {ft.train_examples or 'all'}; 0 = all)")
    g.add_argument("--seed", type=_whole, help=f"default {ft.seed}")
    g.add_argument("--test-examples", type=_whole, metavar="N",
                   help="test examples for the reported accuracy (default all)")
    p.add_argument("--out", metavar="DIR",
                   help="new checkpoint folder (default $GRAFTUI_HOME/checkpoints/<base>-<task>-<hash>)")
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser("localize", parents=[common], help="learn a skill region and write it as a skill patch",
                       description="Find the k parameters of the fine-tuned model that carry the task skill.")
    models_args(p)
    data_args(p)
    g = p.add_argument_group("region")
    budget = g.add_mutually_exclusive_group()
    budget.add_argument("--sparsity", type=float, metavar="F",
                        help=f"fraction of the graftable parameters, in (0, 1] (default {DEFAULT_SPARSITY:g})")
    budget.add_argument("--k", type=_whole, metavar="N", help="number of parameters in the region")
    g.add_argument("--method", default="learned", choices=list(METHODS), help="localization method (default learned)")
    learn_args(p)
    p.add_argument("--out", metavar="FILE",
                   help="region file (default $GRAFTUI_HOME/regions/<method>-<task>-<k>.safetensors)")
    p.add_argument("--region-only", action="store_true",
                   help="write indices only (needs the fine-tuned model to re-apply), not a skill patch")
    p.set_defaults(func=cmd_localize)

    p = sub.add_parser("evaluate", parents=[common], help="compare fine-tuned, pre-trained and grafted models",
                       description="Accuracy, F1, ECE and agreement with the fine-tuned model, in-distribution and "
                       "out-of-distribution, for the fine-tuned model, the pre-trained body with the fine-tuned "
                       "head, and each region's graft.")
    models_args(p, finetuned_default=None)
    data_args(p)
    p.add_argument("--region", action="append", metavar="FILE",
                   help="region or skill patch to graft (repeatable); a patch needs no --finetuned")
    p.add_argument("--ood", action="append", nargs="+", metavar="TASK",
                   help="out-of-distribution tasks (default for sentiment tasks: the other two of movies, "
                   "amazon, tweets)")
    p.add_argument("--no-ood", action="store_true", help="skip out-of-distribution tasks")
    p.add_argument("--baselines", action="store_true",
                   help="add top-movement and random regions of the same size")
    p.add_argument("--sparsity", type=float, metavar="F",
                   help=f"baseline budget when no --region is given (default {DEFAULT_SPARSITY:g})")
    p.add_argument("--n", type=_whole, metavar="N", help="test examples per task (default all)")
    p.add_argument("--seed", type=_whole, default=0, help="seed of the random baseline (default 0)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("anatomy", parents=[common], help="where a region sits: layers × module types",
                       description="Count a region's parameters per layer and module type, with densities.")
    p.add_argument("--region", metavar="FILE",
                   help="region or skill patch (default: the newest in $GRAFTUI_HOME/regions)")
    p.add_argument("--by", choices=("layer", "module", "cell"), default="cell",
                   help="rows per layer, per module type, or a layer × module grid (default cell)")
    p.set_defaults(func=cmd_anatomy)

    p = sub.add_parser("compose", parents=[common], help="overlap of regions, and their union",
                       description="Overlap |γi∩γj|/|γj| and IoU between regions; with --out, write their union.")
    p.add_argument("--region", action="append", metavar="FILE", help="region or skill patch (give two or more)")
    p.add_argument("--out", metavar="FILE",
                   help="write the union: a skill patch when every input is one, a region file otherwise")
    p.add_argument("--resolve", choices=("mean", "first", "last"), default="mean",
                   help="value where patches overlap: mean of their deltas (default), first or last")
    p.add_argument("--base", default=DEFAULT_BASE, metavar="REF",
                   help=f"pre-trained model, read only to average overlapping values (default {DEFAULT_BASE})")
    p.set_defaults(func=cmd_compose)

    p = sub.add_parser("export", parents=[common], help="write a grafted model as a Hugging Face checkpoint",
                       description="Write θ_pre + γ⊙(θ_ft − θ_pre) as a normal Hugging Face checkpoint folder.")
    models_args(p, finetuned_default=None)
    p.add_argument("--region", metavar="FILE",
                   help="skill patch, or region with --finetuned (default: the newest in $GRAFTUI_HOME/regions)")
    p.add_argument("--out", metavar="DIR", help="new folder (default $GRAFTUI_HOME/exports/<region name>)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("sweep", parents=[common], help="accuracy against region size for several methods",
                       description="Localize at several budgets with several methods and test each graft.")
    models_args(p)
    data_args(p)
    p.add_argument("--sparsities", default=DEFAULT_SWEEP, metavar="LIST",
                   help=f"comma-separated fractions of the graftable parameters (default {DEFAULT_SWEEP})")
    p.add_argument("--methods", default=DEFAULT_SWEEP_METHODS, metavar="LIST",
                   help=f"comma-separated methods from: {', '.join(METHODS)} (default {DEFAULT_SWEEP_METHODS})")
    p.add_argument("--n", type=_whole, metavar="N", help="test examples (default all)")
    learn_args(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("methods", parents=[common], help="list localization methods")
    p.set_defaults(func=cmd_methods)
    p = sub.add_parser("tasks", parents=[common], help="list offline tasks")
    p.set_defaults(func=cmd_tasks)
    return parser


# -- entry point ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    # Idle OpenMP workers sleep rather than spin, which keeps a busy machine usable (before torch loads).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    """Run the command line; returns the exit code (0 ok, 2 bad input, 1 unexpected, 130 interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as stop:  # --help and --version
            return int(stop.code or 0) if not isinstance(stop.code, str) else 2
        debug = bool(getattr(args, "debug", False))
        if args.command is None:
            raise CLIError("choose a command: finetune, localize, evaluate, anatomy, compose, export, sweep, "
                           f"methods or tasks (see '{PROG} --help')")
        with _quiet(debug):
            return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `graftui tasks | head -1`: the reader left, nothing to report
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as err:  # DataError, ModelError, RegionError, BudgetError, CLIError, files
        if debug:
            raise
        _fail(_one_line(err))
        return 2
    except Exception as err:  # noqa: BLE001 - one line for the user, the traceback behind --debug
        if debug:
            raise
        _fail(f"unexpected {type(err).__name__}: {_one_line(err)} (run with --debug for the traceback)")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
