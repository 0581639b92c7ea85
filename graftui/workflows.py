"""The flows the CLI and the app share: localize, compare, sweep, compose.

Each flow takes typed requests, loads what it needs (models are cached, since loading costs
seconds and the app switches between regions constantly), reports progress through a callback
and returns plain, JSON-able results.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from . import method, metrics, regions, settings
from .data import DataError, DataSpec, Task, batches, kshot, load_task, subsample
from .localize import Budget, get_method, run_method
from .method import LearnConfig
from .models import DEFAULT_BASE, DEFAULT_FINETUNED, GraftableSpec, ModelPair
from .regions import RegionRecord

Progress = Callable[[dict], None]

# -- model cache ---------------------------------------------------------------------------------
_pairs: "OrderedDict[tuple, ModelPair]" = OrderedDict()
_pairs_lock = threading.Lock()
PAIR_CACHE_SIZE = 2


def load_pair(base: str, finetuned: str, spec: GraftableSpec = GraftableSpec(), *, allow_local: bool = True) -> ModelPair:
    """A ModelPair, from a small cache: the working model is always left at pre body + FT head."""
    key = (base, finetuned, spec, allow_local)
    with _pairs_lock:
        if key in _pairs:
            _pairs.move_to_end(key)
            return _pairs[key]
    pair = ModelPair.load(base, finetuned, spec, allow_local=allow_local)
    pair.to(settings.device())
    with _pairs_lock:
        _pairs[key] = pair
        while len(_pairs) > PAIR_CACHE_SIZE:
            _pairs.popitem(last=False)
    return pair


def clear_cache() -> None:
    with _pairs_lock:
        _pairs.clear()


# -- localize ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalizeRequest:
    base: str = DEFAULT_BASE
    finetuned: str = DEFAULT_FINETUNED
    task: str = "movies"
    method: str = "learned"
    sparsity: float | None = 0.001
    k: int | None = None
    examples_per_class: int = 256  # k-shot training examples for mask learning (fewer overfit the mask)
    learn: LearnConfig = field(default_factory=LearnConfig)
    graftable: GraftableSpec = field(default_factory=GraftableSpec)
    data: DataSpec = field(default_factory=DataSpec)

    @property
    def budget(self) -> Budget:
        return Budget(k=self.k) if self.k is not None else Budget(sparsity=self.sparsity)

    def as_dict(self) -> dict:
        return asdict(self)


def training_batches(pair: ModelPair, task: Task, examples_per_class: int, config: LearnConfig):
    """make_batches(epoch) over a deterministic k-shot sample of the training split."""
    train = kshot(task.splits["train"], examples_per_class, config.seed)

    def make(epoch: int):
        return batches(pair.tokenizer, train, config.batch_size, task.max_length, shuffle_seed=config.seed + epoch)

    return make, len(train)


def check_labels(pair: ModelPair, task: Task) -> None:
    if task.num_labels != len(pair.label_names):
        raise DataError(
            f"task '{task.name}' has {task.num_labels} labels but the fine-tuned model has {len(pair.label_names)}"
        )


def localize(
    request: LocalizeRequest,
    *,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    allow_local: bool = True,
) -> RegionRecord:
    """Find the region of ``request.finetuned`` that carries ``request.task``."""
    info = get_method(request.method)
    if request.sparsity is None and request.k is None:
        raise ValueError("give a sparsity or a k")
    if progress:
        progress({"stage": "loading models"})
    pair = load_pair(request.base, request.finetuned, request.graftable, allow_local=allow_local)
    request.budget.resolve(pair.counts()["graftable"])  # fail on a bad budget before loading data
    make_batches, n_train = None, 0
    task = None
    if info.needs_data:
        task = load_task(request.task, request.data, allow_local=allow_local)
        check_labels(pair, task)
        make_batches, n_train = training_batches(pair, task, request.examples_per_class, request.learn)

    def on_step(report: method.StepReport) -> None:
        if progress:
            progress({"stage": "mask learning", **asdict(report)})

    region, k = run_method(
        pair, request.budget, request.method, make_batches=make_batches, config=request.learn,
        progress=on_step, cancel=cancel,
    )
    meta = {
        "method": request.method,
        "task": request.task,
        "budget": request.budget.describe(),
        "budget_k": k,
        "sparsity": request.sparsity if request.k is None else None,
        "train_examples": n_train,
        "learn": request.learn.as_dict() if info.needs_data else None,
        "graftable_spec": asdict(request.graftable),
    }
    return regions.with_patch(pair, regions.make_record(pair, region, meta))


# -- evaluate ------------------------------------------------------------------------------------
FT_LABEL = "fine-tuned"
BODY_LABEL = "pre-trained body + FT head"


@dataclass
class Comparison:
    """Metrics per (model, task); reliability data per model on the in-distribution task."""

    rows: list[dict]
    reliability: dict[str, list[dict]]
    histogram: dict[str, list[dict]]
    task: str
    ood: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


def predict(pair: ModelPair, task: Task, split: str, n: int | None, batch_size: int = 64, seed: int = 0):
    data = task.splits[split]
    if n is not None and n < len(data):
        data = subsample(data, n, seed)
    if len(data) == 0:
        raise DataError(f"task '{task.name}' has no examples in its {split} split")
    return metrics.predict_proba(pair.model, batches(pair.tokenizer, data, batch_size, task.max_length))


def compare(
    pair: ModelPair,
    task: Task,
    models: dict[str, dict[str, torch.Tensor]],
    *,
    ood: list[Task] = (),
    split: str = "test",
    n: int | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> Comparison:
    """Evaluate FT, pre-trained body + FT head and each region's graft on ``task`` and ``ood``.

    ``models`` maps a label to a region (flat indices). Agreement is measured against FT.
    """
    check_labels(pair, task)
    for other in ood:
        if tuple(other.label_names) != tuple(task.label_names):
            raise DataError(
                f"OOD task '{other.name}' has labels {list(other.label_names)}, "
                f"not those of '{task.name}' {list(task.label_names)}"
            )
    rows, reliability, histogram = [], {}, {}
    tasks = [task, *ood]
    total = len(tasks) * (len(models) + 2)
    done = 0
    for t in tasks:
        variants: list[tuple[str, object]] = [(FT_LABEL, pair.finetuned()), (BODY_LABEL, None)]
        variants += [(label, pair.grafted(region)) for label, region in models.items()]
        reference = None
        for label, context in variants:
            if cancel is not None and cancel.is_set():
                raise method.Cancelled("evaluation cancelled")
            if progress:
                progress({"stage": f"evaluating {label} on {t.name}", "fraction": done / total})
            if context is None:
                probs, labels = predict(pair, t, split, n)
            else:
                with context:
                    probs, labels = predict(pair, t, split, n)
            if reference is None:
                reference = probs
            m = metrics.metrics(probs, labels)
            size = method.region_size(models[label]) if label in models else None
            rows.append({
                "model": label,
                "task": t.name,
                "distribution": "in" if t is task else "OOD",
                "n": m.n,
                "accuracy": m.accuracy,
                "f1": m.f1,
                "ece": m.ece,
                "agreement_with_ft": metrics.agreement(probs, reference),
                "region_size": size,
            })
            if t is task:
                reliability[label] = metrics.reliability(probs, labels)
                histogram[label] = metrics.confidence_histogram(probs)
            done += 1
    return Comparison(rows, reliability, histogram, task.name, [o.name for o in ood])


def baseline_regions(pair: ModelPair, k: int, names: tuple[str, ...] = ("top-movement", "random"), seed: int = 0) -> dict:
    """Data-free baselines at the same budget, for side-by-side comparison."""
    out = {}
    for name in names:
        region, _ = run_method(pair, Budget(k=k), name, config=LearnConfig(seed=seed))
        out[get_method(name).label] = region
    return out


# -- sweep ---------------------------------------------------------------------------------------
def sweep(
    request: LocalizeRequest,
    sparsities: list[float],
    methods: tuple[str, ...] = ("learned", "top-movement", "random"),
    *,
    n: int | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    allow_local: bool = True,
) -> list[dict]:
    """Test accuracy against budget for several methods (paper Fig. 2-style)."""
    pair = load_pair(request.base, request.finetuned, request.graftable, allow_local=allow_local)
    task = load_task(request.task, request.data, allow_local=allow_local)
    check_labels(pair, task)
    rows = []
    with pair.finetuned():
        probs, labels = predict(pair, task, "test", n)
    ft_acc = metrics.accuracy(probs, labels)
    total = len(sparsities) * len(methods)
    for i, s in enumerate(sorted(sparsities)):
        for j, name in enumerate(methods):
            if progress:
                progress({"stage": f"{name} at sparsity {s:g}", "fraction": (i * len(methods) + j) / total})
            sub = LocalizeRequest(**{**request.__dict__, "method": name, "sparsity": s, "k": None})
            record = localize(sub, cancel=cancel, allow_local=allow_local)
            with pair.grafted(record.indices):
                probs, labels = predict(pair, task, "test", n)
            m = metrics.metrics(probs, labels)
            rows.append({
                "method": name, "sparsity": s, "k": record.size, "accuracy": m.accuracy, "ece": m.ece,
                "ft_accuracy": ft_acc, "retained": m.accuracy / ft_acc if ft_acc else None,
            })
    return rows
