"""What every verb shares: the guard, the pair cache, tasks and pairs, region files, and ``Result``.

A flow is ``flow(request, progress=None, cancel=None, guard=LOCAL) -> Result``: it validates its
request, loads what it needs (models through a small cache, since the app switches between regions
constantly), reports progress as dicts (``stage``, ``fraction``, and ``step``/``steps`` for plots),
honours ``cancel`` between steps, and returns a typed result with ``as_dict()``. Every file a flow
writes embeds its request and the library version, so ``graftui run FILE`` can make it again.

A :class:`Guard` says what a flow may read: locally everything, on a hosted server only Hub ids,
offline defaults and the files the server wrote itself (``graftui.hosted``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from .. import bundle, card, regions, sets, settings, training
from ..config import (
    DEFAULT_FINETUNED_REFS, DEFAULT_LOADING, FT_LABEL, GraftableSpec, LoadOptions, default_checkpoint_dir,
    is_default_finetuned, recipe_for,
)
from ..tasks.classification.data import DataSpec, Task, all_as_test
from ..errors import GraftuiError, ModelError, RegionError, RequestError
from ..layout import MODULE_LABELS, anatomy as count_anatomy
from ..models import ModelPair, pair_kind, resolve
from ..paths import Exists, atomic_write, new_path, short_ref, slug
from ..regions import RegionRecord
from ..requests import FinetuneRequest, Request, check_report_file, report_exists
from ..tasks.classification.scoring import align_labels
from ..kinds import kind_in, named_kind, read_classification as get_task
from ..version import __version__

Progress = Callable[[dict], None]


# -- what a flow may read ------------------------------------------------------------------------
class Guard:
    """Locally, a flow may read any model, data set and file; a hosted server narrows this."""

    def allow_local(self, models=(), tasks=()) -> bool:
        """Whether local paths may be loaded for ``models`` and ``tasks`` (raise to refuse one)."""
        return True

    def checked_task(self, task: Task) -> Task:
        return task

    def checked_harness(self, names: list[str]) -> list[str]:
        """The lm-evaluation-harness tasks a request names, before any is read (its data may come from the Hub)."""
        return names

    def checked_pair(self, pair: ModelPair) -> ModelPair:
        return pair

    def checked_rule(self, rule, source: str):
        """The answer rule a completion task is judged by (``source``: where it came from, for the refusal)."""
        return rule


LOCAL = Guard()


# -- shared steps --------------------------------------------------------------------------------
_pairs: "OrderedDict[tuple, ModelPair]" = OrderedDict()
_pairs_lock = threading.Lock()
PAIR_CACHE_SIZE = 2  # pairs kept for the flows of the main scope; another scope keeps one of its own
_scope: contextvars.ContextVar[str] = contextvars.ContextVar("graftui_pair_scope", default="")


@contextlib.contextmanager
def own_pairs(scope: str):
    """Flows run inside load pairs of their own, cached apart from everyone else's: a pair's working model is
    grafted in place, so flows that run at the same time (the job runner's two lanes) must not share one."""
    token = _scope.set(scope)
    try:
        yield
    finally:
        _scope.reset(token)


def load_pair(base: str, finetuned: str, spec: GraftableSpec = GraftableSpec(), *, options: LoadOptions = LoadOptions(),
              labels=None, allow_local: bool = True) -> ModelPair:
    """A ModelPair, from a small cache (one per ``own_pairs`` scope): the working model is always left at pre body
    + FT head."""
    labels = tuple(labels) if labels else None
    if labels and pair_kind(finetuned, options, allow_local=allow_local) == "classifier":
        labels = None  # a classifier has its own labels: one cache entry whatever the task
    scope = _scope.get()
    key = (scope, base, finetuned, spec, options, labels, allow_local)
    with _pairs_lock:
        if key in _pairs:
            _pairs.move_to_end(key)
            return _pairs[key]
    pair = ModelPair.load(base, finetuned, spec, options=options, labels=labels, allow_local=allow_local)
    if not options.device_map:  # a device map has placed the model already
        pair.to(settings.device())
    # a region records the prompt as it was resolved ('auto' → causal-lm, its template): the verbs that read the
    # region again then find this same pair, and the scores kept with it
    resolved = replace(options, **pair.loading_record())
    with _pairs_lock:
        _pairs[key] = pair
        _pairs[(scope, base, finetuned, spec, resolved, labels, allow_local)] = pair
        mine = lambda: [k for k in _pairs if k[0] == scope]  # noqa: E731
        while len({id(_pairs[k]) for k in mine()}) > (PAIR_CACHE_SIZE if not scope else 1):
            del _pairs[mine()[0]]
    return pair


def clear_cache() -> None:
    with _pairs_lock:
        _pairs.clear()


def check_model_ref(ref: str) -> None:
    """Fail early on a reference that names nothing; the default fine-tuned model is built later."""
    if not is_default_finetuned(ref):
        resolve(ref)


def ensure_default(key: str, progress: Progress | None = None, cancel=None) -> Path:
    """A default fine-tuned checkpoint, built on first use as ``graftui finetune`` would: its task's kind fine-tunes
    the base by the default's recipe, read as the default is read (a visible stage)."""
    def step(p):
        if progress:
            progress({"stage": f"building the default fine-tuned model '{key}' (first use)",
                      "fraction": p["step"] / max(p["steps"], 1)})

    def build(out: Path) -> None:
        base, ref = DEFAULT_FINETUNED_REFS[key]
        recipe, options = recipe_for(key), DEFAULT_LOADING.get(key, LoadOptions())
        asked = {k: v for k, v in options.as_dict().items() if v != getattr(LoadOptions(), k)}
        kind = named_kind(ref)  # an offline task, claimed by its kind by name
        request = FinetuneRequest.make(base=base, task=ref, lora_rank=recipe.lora_rank, **asked)
        kind.finetune(request, kind.read(ref, None, LOCAL), recipe, out, options, step, cancel, True)

    return training.ensure_default_finetuned(key, build)


def ensure_models(refs, progress: Progress | None = None, cancel=None) -> None:
    """Build a default fine-tuned checkpoint named in ``refs`` on first use (a visible stage)."""
    for ref in refs:
        key = (ref or "").strip().lower()
        if key in DEFAULT_FINETUNED_REFS and not training.is_built(default_checkpoint_dir(key)):
            ensure_default(key, progress, cancel)


def get_pair(base: str, finetuned: str, spec: GraftableSpec, guard: Guard, progress=None, cancel=None,
             options: LoadOptions = LoadOptions(), labels=None) -> ModelPair:
    """The pair, read as ``options`` say; ``labels`` (the task's) order a language model's label words."""
    allow = guard.allow_local(models=[base, finetuned])
    ensure_models([finetuned], progress, cancel)
    if progress:
        progress({"stage": f"loading {short_ref(base)} and {short_ref(finetuned)}"})
    return guard.checked_pair(load_pair(base, finetuned, spec, options=options, labels=labels, allow_local=allow))


def needs_task_labels(finetuned: str, options: LoadOptions, guard: Guard) -> bool:
    """Whether reading the pair needs the task's labels: a language model matches its label words to them,
    a classifier has its own. A default fine-tuned model is read as its base is (it may not be built yet)."""
    ref = DEFAULT_FINETUNED_REFS.get((finetuned or "").strip().lower(), (finetuned,))[0]
    return pair_kind(ref, options, allow_local=guard.allow_local(models=[ref])) != "classifier"


def prompt_notes(pair: ModelPair) -> list[str]:
    """A note saying which prompt a language model was read with, when graftui chose its label words, and one when a
    LoRA adapter names another base than the one it is read on."""
    notes = []
    if pair.prompt is not None and pair.prompt.chosen:
        notes.append(f"no label words given: {pair.prompt.describe()} (give --label-words to choose others)")
    named = pair.adapter.base_name if pair.adapter is not None else None
    if named and not same_model(named, pair.base_ref):
        notes.append(f"the adapter '{short_ref(pair.finetuned_ref)}' names '{named[:200]}' as its base (its "
                     f"adapter_config.json); it is read on --base '{short_ref(pair.base_ref)}' as asked")
    return notes


def another_model(name: str, record: RegionRecord, base: str, finetuned: str | None) -> str | None:
    """The line that says region file ``name`` belongs to another pair than ``base`` → ``finetuned`` (the pair it
    recorded is not the one given), or None where it is that pair or recorded none. Said when the region does not
    fit the pair: what reading it on the wrong model fails on (its label words, its tensors) would mislead."""
    made_base, made_ft = record.meta.base, record.meta.finetuned
    if not made_base or not made_ft or (same_model(made_base, base) and (finetuned is None or
                                                                         same_model(made_ft, finetuned))):
        return None
    given = f"{short_ref(base)} → {short_ref(finetuned)}" if finetuned else f"{short_ref(base)} (with its patch)"
    return (f"'{name}' belongs to another model: it was learned on {short_ref(made_base)} → {short_ref(made_ft)}, and "
            f"the pair given is {given}; pass the region's own pair (--base {made_base} --finetuned {made_ft}), or "
            "localize again on this one")


def same_model(a: str, b: str) -> bool:
    """Whether two references name one model: the same words, or the same folder or Hub id once resolved."""
    if a.strip().lower() == b.strip().lower():
        return True
    try:
        return resolve(a) == resolve(b)
    except ModelError:
        return False
    return []


def load_region(path: str) -> RegionRecord:
    try:
        return regions.load(Path(path).expanduser())
    except RegionError as err:
        text = str(err)
        raise RegionError(text if str(Path(path).name) in text else f"'{path}': {text}") from None


def latest_region() -> Path:
    folder = settings.subdir("regions")
    files = sorted(folder.glob("*.safetensors"), key=lambda f: f.stat().st_mtime)
    if not files:
        raise RequestError(f"no region given and none in {folder}; run 'graftui localize' first")
    return files[-1]


def labels_for(paths, records=None) -> list[str]:
    """Distinct display names for region files: their stems, numbered where they collide; with the
    records, runs of one method and k also carry the settings in which they differ."""
    out: list[str] = []
    for i, p in enumerate(paths):
        name = Path(p).stem or str(p)
        if records:
            me = records[i].meta
            twins = [r.meta for r in records if r is not records[i] and r.meta.method == me.method
                     and r.size == records[i].size]
            mine = regions.settings_of(me)
            differ = [x for x in mine if any(x not in regions.settings_of(t) for t in twins)]
            if differ:
                name += f" ({', '.join(differ)})"
        candidate, n = name, 2
        while candidate in out:
            candidate, n = f"{name} ({n})", n + 1
        out.append(candidate)
    return out


def side_by_side(labels, records) -> dict:
    """Several runs next to each other: their settings, overlap matrix and where each lies (per module type
    and per layer, as shares of the region), so their anatomy can be read as a difference."""
    matrix = sets.overlap_matrix({label: r.indices for label, r in zip(labels, records)})
    anatomies = [count_anatomy(r.indices, r.shapes) for r in records]
    modules = list(dict.fromkeys(m for a in anatomies for m in a.modules))
    layers = list(dict.fromkeys(layer for a in anatomies for layer in a.layers))
    return {**matrix,
            "settings": {label: regions.describe(r.meta) for label, r in zip(labels, records)},
            "modules": modules, "module_labels": [MODULE_LABELS.get(m, m) for m in modules], "layers": layers,
            "module_share": {label: [a.by_module.get(m, 0) / max(r.size, 1) for m in modules]
                             for label, a, r in zip(labels, anatomies, records)},
            "layer_share": {label: [dict(zip(a.layers, a.by_layer)).get(layer, 0) / max(r.size, 1) for layer in layers]
                            for label, a, r in zip(labels, anatomies, records)}}


def same_regions(labels, records) -> list[str]:
    """A note for each pair of inputs that hold one region (copies of one file, or one result twice)."""
    seen: dict[str, str] = {}
    notes = []
    for label, record in zip(labels, records):
        d = regions.digest(record.indices)
        if d in seen:
            notes.append(f"'{label}' is the same region as '{seen[d]}' (content id #{d}): their rows are equal by "
                         "construction")
        else:
            seen[d] = label
    return notes


def merged_shapes(records) -> dict:
    shapes: dict = {}
    for record in records:
        for name, shape in record.shapes.items():
            shape = tuple(shape)
            if name in shapes and shapes[name] != shape:
                raise RegionError(f"the regions were made for different models: {name} has shape {list(shapes[name])} "
                                  f"in one and {list(shape)} in another")
            shapes[name] = shape
    return shapes


def region_spec(records) -> list[GraftableSpec]:
    """Graftable sets to try for these regions: the one recorded by localize (it matches a cached
    pair), then the exact tensor names of the files."""
    exact = GraftableSpec(include_embeddings=True, names=tuple(merged_shapes(records)))
    recorded = [regions.recorded_spec(r.meta) for r in records]
    if recorded and recorded[0] is not None and all(spec == recorded[0] for spec in recorded):
        return [recorded[0], exact]
    return [exact]


def pair_for_regions(base, finetuned, records, guard: Guard, progress=None, cancel=None,
                     options: LoadOptions | None = None) -> ModelPair:
    """The pair whose graftable tensors are exactly those the regions were made over, read with their prompt."""
    specs = region_spec(records)
    options = options or regions.recorded_options(records[0].meta)
    labels = regions.recorded_labels(records[0].meta)
    pair = get_pair(base, finetuned, specs[0], guard, progress, cancel, options, labels)
    if len(specs) > 1 and set(pair.graftable) != set(merged_shapes(records)):
        pair = get_pair(base, finetuned, specs[1], guard, progress, cancel, options, labels)
    return pair


def check_build(record: RegionRecord, pair: ModelPair, name: str, notes: list[str], patch_values: bool = True) -> None:
    """A region recorded against another build of the fine-tuned model (its weights' sha256 differ): a skill patch
    whose own values the flow grafts (``patch_values``) gets a note saying so; otherwise the flow would graft
    numbers the region was never learned with, so it is refused."""
    then, now = record.meta.finetuned_sha256, pair.hashes.get("finetuned")
    if not then or not now or then == now:
        return
    what = (f"'{name}' was made from another build of '{short_ref(pair.finetuned_ref)}' (weights sha256 {then[:12]}… "
            f"then, {now[:12]}… now)")
    if record.is_patch and patch_values:
        notes.append(f"{what}: its graft uses the patch's own values; the fine-tuned rows are today's model")
    elif record.is_patch:
        raise RegionError(f"{what}, and this experiment grafts today's fine-tuned values: give --finetuned the "
                          "checkpoint it was made from")
    else:
        raise RegionError(f"{what} and holds no values of its own: localize again, or use the skill patch it was saved as")


def graft_of(record: RegionRecord):
    """What a record grafts: a skill patch its own values, a region without values the fine-tuned model's."""
    return (record.indices, record.values) if record.is_patch else record.indices


def region_stem(finetuned: str, task: str, method: str, k: int) -> str:
    """A new region's file name (before its time stamp): the fine-tuned model it was learned in, its task where the
    model's name does not say it already, its method and size. Two fine-tunes of one task (a LoRA adapter, a whole
    fine-tune) make regions named apart; an uploaded file is named by its file name, never its folder."""
    model, data = slug(short_ref(finetuned)), slug(short_ref(task))
    said = data.lower() in model.lower().replace("_", "-").split("-")  # a whole part of the name ('news' is not 'agnews')
    return f"{model if said else f'{model}-{data}'}-{method}-k{k}"


def save_new(record: RegionRecord, folder: Path, stem: str, write: bool = True) -> Path:
    """Save a region under a new name in ``folder`` (``stem-<stamp>``); a name another run takes meanwhile is skipped.
    ``write`` False: only the name (a data-parallel process that does not write)."""
    while True:
        path = new_path(folder, stem, ".safetensors")
        if not write:
            return path
        try:
            return regions.save(record, path, exclusive=True)
        except Exists:
            continue


STEP_PASSES = 3  # a mask step, or a training step, reads each example of its batch forward and backward: about three
# forward passes


def phase_progress(progress: Progress | None, start: float, end: float, stage: str | None = None
                   ) -> Progress | None:
    """The progress of one phase of a run (mask learning, then scoring): its fraction, or step / steps, mapped into
    [start, end] of the whole, its stages named by ``stage`` where given, so a job never sits at 100 % while it
    still scores."""
    if progress is None:
        return None

    def inner(event: dict) -> None:
        part, out = _share(event), dict(event)
        if part is not None:
            out["fraction"] = start + (end - start) * min(max(float(part), 0.0), 1.0)
        if stage:
            out["stage"] = f"{stage}: {event['stage']}" if event.get("stage") else stage
        progress(out)
    return inner


def _share(event: dict) -> float | None:
    """How far an event says its part is: its fraction, or step / steps (None: it says nothing)."""
    if event.get("fraction") is not None:
        return event["fraction"]
    return event.get("step", 0) / max(event["steps"], 1) if event.get("steps") else None


def part_progress(progress: Progress | None, i: int, n: int, seed: int | None, name: str | None = None
                  ) -> Progress | None:
    """The progress of seed ``i`` of ``n`` (or of the part ``name``, such as one fine-tune) as a part of the whole
    run, its stages named by it."""
    phase = phase_progress(progress, i / n, (i + 1) / n, f"{name or f'seed {seed}'} ({i + 1}/{n})")
    if phase is None:
        return None
    own = {"seed": seed} if name is None else {}

    def inner(event: dict) -> None:
        phase({**event, "fraction": _share(event) or 0.0, **own})
    return inner


def remember_scores(rows: list[dict], files: list, labels: list[str], records: list, notes: list[str],
                    with_ft: bool = True) -> None:
    """Each region's in-distribution scores of ``rows`` as its latest in the regions table (regions.note_scores); a
    log that cannot be written is a note, not a failed evaluation."""
    try:
        for folder, entries in regions.evaluation_entries(rows, files, labels, records, with_ft).items():
            regions.note_scores(folder, entries)
    except (OSError, GraftuiError) as err:
        notes.append(f"the scores were not added to the regions table: {err}")


def finish(progress: Progress | None) -> None:
    if progress:
        progress({"stage": "done", "fraction": 1.0})


# -- results ---------------------------------------------------------------------------------------
@dataclass
class Result:
    request: Request
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in self._private()}
        out["request"] = self.request.as_dict()
        return json.loads(json.dumps(out, default=plain))

    def _private(self) -> set[str]:
        return set()

    def save(self, path) -> Path:
        """The report (``write_report``); a localize result saves its region instead."""
        return self.write_report(path)

    def files_written(self) -> list[str]:
        """The region files the run wrote (a report bundle carries them)."""
        return []

    def write_report(self, path, overwrite: bool = False) -> Path:
        """A JSON report with the request that made it (``graftui run`` makes it again); a ``.zip``
        path gets the report bundle (bundle.py: README, tables as CSV/JSON, figures as HTML).

        Written whole or not at all, never over a file this run wrote, and over an existing file only with
        ``overwrite``: of two runs writing one report at once, one is refused (the file system decides, not a check).
        """
        check_report_file(path, overwrite, [*self.files_written(), *self.request.destinations().values()])
        try:
            if str(path).lower().endswith(".zip"):
                return bundle.write(self.request.as_dict(), self.as_dict(), path, outputs=self.files_written(),
                                    exclusive=not overwrite)
            doc = {"graftui_version": __version__, "request": self.request.as_dict(), "result": self.as_dict()}
            return atomic_write(Path(path).expanduser(), lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=2)),
                                exclusive=not overwrite)
        except Exists:
            raise RequestError(report_exists(path)) from None


@dataclass
class LocalizeResult(Result):
    """What ``localize`` returns: its region, or with --seeds or --finetuned-replicates the first run's with the others
    beside it (here, not in ``single``, because ``replicates`` builds it too)."""

    path: str = ""  # with --seeds: the first seed's region
    record: RegionRecord | None = None
    seeds: list[dict] = field(default_factory=list)  # with --seeds: {seed, path, k, reused, seconds, …} per seed
    stability: dict | None = None  # with --seeds: how alike the seeds' regions are (sets.stability), per module too
    finetunes: list[dict] = field(default_factory=list)  # with --finetuned-replicates: {finetuned, path, …} per one
    finetune_stability: dict | None = None  # … and how alike their regions are (each one's first seed)
    check: dict | None = None  # the quick held-out score: {task, n, rows, differences} (quick_check)

    @property
    def k(self) -> int:
        return self.record.size

    @property
    def region(self):
        """The region γ as flat indices per graftable tensor."""
        return self.record.indices

    def files_written(self) -> list[str]:
        return [p for p in (self.path, *(r.get("path") for r in (*self.seeds, *self.finetunes))) if p]

    def save(self, path) -> Path:
        """Write the region (or skill patch) to ``path``."""
        return regions.save(self.record, Path(path).expanduser())

    def _private(self) -> set[str]:
        return {"record"}

    def as_dict(self) -> dict:
        out = super().as_dict()
        r = self.record
        a = count_anatomy(r.indices, r.shapes)
        top = sorted(a.by_module.items(), key=lambda kv: -kv[1])[:3]
        out.update({
            "kind": r.kind,
            "method": self.request.method,
            "task": self.request.task,
            "k": r.size,
            "graftable_params": r.graftable,
            "total_params": r.meta.total_params or r.graftable,
            "fraction_of_graftable": r.size / max(r.graftable, 1),
            "fraction_of_all": r.size / max(r.meta.total_params or r.graftable, 1),
            "top_modules": [{"module": m, "label": MODULE_LABELS.get(m, m), "count": c, "share": c / max(r.size, 1)}
                            for m, c in top if c],
            "weights": a.weight_count,
            "biases": a.bias_count,
            "meta": json.loads(json.dumps(r.meta.as_dict(), default=plain)),
        })
        how = r.meta.learner if isinstance(r.meta.learner, dict) else {}
        out["plan"] = how.get("line")  # the memory plan's line, which --json prints no progress for
        check = out.get("check")
        checked = kind_in(check).card(check, out["graftable_params"], FT_LABEL) if check else []
        out["card"] = card.localize_card(out, checked)
        return out


def plain(value):
    """A value JSON can hold: paths as text, tuples and sets as lists, tensors as lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)

def ood_tasks(req, task_ref: str, task: Task, guard: Guard, notes: list[str]) -> list[Task]:
    """The request's out-of-distribution tasks, in ``task``'s label space (a note for each mapping by position)."""
    out = []
    mapping = req.label_map()
    for ref in req.ood_tasks(task_ref):
        # a pooled file read only out of distribution is never trained on: all of it is scored
        other, note = align_labels(task, all_as_test(get_task(ref, DataSpec(), guard, notes)), mapping)
        out.append(other)
        if note:
            notes.append(note)
    return out


def loadable(ref: str | None) -> bool:
    """Whether a model reference can be loaded here (a default fine-tuned one is built when needed)."""
    if not ref or is_default_finetuned(ref):
        return bool(ref)
    try:
        resolve(ref)
        return True
    except ModelError:
        return False


