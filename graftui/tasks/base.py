"""The interface every task kind implements, and the registry that finds a task's kind.

A verb never asks which kind its task is: it asks the task's kind (``kind_of(task)``) to read the pair, make the
batches mask learning steps over, fine-tune, score a set of models into rows of one schema, and word the result.
A new kind is one folder under ``tasks/`` whose ``kind.py`` makes one ``register_kind`` call, loaded by one import line in
``graftui.kinds``; nothing else in graftui changes.

Rows of every kind share one schema: ``model``, ``task``, ``n``, ``score`` (the kind's own measure: accuracy,
exact match, the harness's metric), ``metric`` (its name), ``accuracy`` (= ``score``, the name the paper's tables
use), ``ece``, ``loss`` where it has one, ``agreement_with_ft``, ``region_size``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from ..card import Words, gain_recovered
from ..config import COMPLETION, DEFAULT_SPARSITY, LoadOptions
from ..errors import Cancelled, ModelError, RequestError
from ..models import WrongCheckpoint


@dataclass
class Outcome:
    """One model's per-example result on a fixed sample: its score and what a paired difference pairs."""

    score: float
    n: int
    per_example: Any  # class probabilities (classification) or 0/1 hits (completion)
    labels: Any = None


class Look(NamedTuple):
    """One model a prediction shows: its name, the context that makes the pair's working model it, and what it
    probes: None for the bare body, FT and a region's graft; "knockout" for FT with a region knocked out; "layer" or
    "module" for the graft of one part of a region (``part`` names it)."""

    name: str
    context: Callable
    probe: str | None = None
    part: str | None = None


def each_look(looks, progress, cancel, doing: str):
    """The models of a prediction one at a time, each announced (``doing``: "scoring", "mapping", …) and the cancel
    flag checked before it, so a long probe stops between two models."""
    for m, look in enumerate(looks):
        if cancel is not None and cancel.is_set():
            raise Cancelled("predict cancelled")
        if progress:
            progress({"stage": f"{doing} {look.name}", "fraction": m / len(looks)})
        yield look


class TaskKind:
    """A kind of task. Each method is what one verb needs to know of the kind; flows call them, never branch."""

    name: str = ""
    words: Words
    task_type: type = object
    head: str | None = None  # the pair reading the kind needs (COMPLETION: a causal LM read as itself)
    columns: tuple[tuple[str, str], ...] = ()  # (header, key) of a comparison's rows: the CLI's and the app's tables
    markdown_columns: tuple[tuple[str, str], ...] = ()  # (header, key) of a model card's metrics table
    verbs: tuple[str, ...] = ()  # the verbs that work on this kind (the documentation's table reads them)
    sparsity: float = DEFAULT_SPARSITY  # the budget of a request that names none (neither --sparsity nor --k)
    scores_ood: bool = False  # whether tasks of another distribution in its label space are scored (ood_note)
    # whether scoring it seeds the process's random generators (lm-evaluation-harness does, then puts them back), so a
    # job that trains meanwhile would not repeat: the app never runs its jobs beside another
    seeds_globally: bool = False
    generates: bool = False  # whether a prediction generates tokens (each new token one more pass over the prompt)

    # -- which tasks are of this kind ------------------------------------------------------------------
    order: int = 50  # where the kind is asked whether it claims a reference, lower first
    tried: int | None = None  # where a source no kind claims is tried as this kind, lower first (None: never)
    choosable: bool = True  # a request may name it (--task-kind)
    fields: tuple[str, ...] = ()  # the request's fields that only this kind reads (its columns)

    def names(self, key: str) -> bool:
        """Whether a task reference (lower case) names this kind whatever the request asks (a prefix: lm-eval:)."""
        return False

    def claims(self, key: str, asked: str, given: set[str]) -> bool:
        """Whether a task reference is of this kind before anything is read: ``asked`` the request's --task-kind,
        ``given`` the request's fields it gives a value."""
        return self.names(key) or asked == self.name

    def spec(self, req):
        """The request's columns as this kind reads a source (None: it reads none)."""
        return None

    def takes(self, spec) -> bool:
        """Whether ``spec`` is this kind's columns (a region's recorded columns name the kind to read its task as)."""
        return False

    def read(self, ref: str, spec, guard):
        """The task ``ref`` names, read with the columns ``spec``, within what ``guard`` allows."""
        raise NotImplementedError

    def checked_ref(self, ref: str, guard) -> bool:
        """Check a reference this kind names, before anything is read, as ``guard`` allows (a shared server's list
        of what it runs); False where the reference is a data source, which the guard checks as one."""
        return False

    def made(self, meta) -> bool:
        """Whether a region's record says it was learned on a task of this kind."""
        return False

    def recorded_spec(self, meta):
        """The columns a region's own task was read with, from its record (its request's, else an older file's
        data_spec), as this kind reads them."""
        return None

    def offline(self) -> dict[str, str]:
        """The tasks of this kind that need no download: reference -> one line about it."""
        return {}

    previewed: bool = False  # a task of this kind is checked as soon as it is named, before any job (its preview)

    def preview(self, task) -> list[dict]:
        """What a check of ``task`` shows before any job, read by the loader the jobs use, per part it is scored as:
        {name, form (how it is scored), splits ({split: examples}), scored (the split scored), n (its examples),
        metric (the score compared), first (its first scored example as the model reads it: context, target,
        choices, gold)}; none for a kind without one."""
        return []

    # -- reading ----------------------------------------------------------------------------------
    def reading(self, options: LoadOptions, task) -> LoadOptions:
        """The pair's reading for this kind, refusing a reading the request gave that cannot score it."""
        return options

    def labels(self, task) -> tuple[str, ...] | None:
        """The label words' order a language model read as a classifier follows (None: no labels)."""
        return None

    def fits(self, pair) -> bool:
        """Whether ``pair`` is read as this kind needs."""
        raise NotImplementedError

    def check_pair(self, pair, task) -> None:
        """Refuse a pair read as another kind, naming what to give instead."""
        if not self.fits(pair):
            raise ModelError(self.misread(pair, task))

    def misread(self, pair, task) -> str:
        raise NotImplementedError

    @contextlib.contextmanager
    def loading(self, task):
        """The pair is read for ``task``: a checkpoint of the wrong kind is refused in this kind's words."""
        try:
            yield
        except WrongCheckpoint as err:
            said = self.wrong_checkpoint(err.ref, err.own, task)
            if said is None:
                raise
            raise ModelError(said) from err

    def task_files(self, task) -> dict[str, str]:
        """sha256 of each file ``task`` was read from, by path, where a region records them (a harness task YAML's:
        the harness reads it again each time, edited or not); none by default."""
        return {}

    def wrong_checkpoint(self, ref: str, own: str, task) -> str | None:
        """The line refusing checkpoint ``ref`` (a ``own``) for ``task``; None keeps the reader's own line."""
        return None

    def check_region(self, label: str, meta, task) -> None:
        """Refuse a region learned on a task read the other way (its recorded reading) scored on ``task``: its pair
        is read as that region was made, whatever the request gives."""
        made = COMPLETION if (getattr(meta, "loading", None) or {}).get("head") == COMPLETION else "classification"
        if (made == COMPLETION) != (self.head == COMPLETION):
            learned = f" '{meta.task}'" if getattr(meta, "task", None) else ""
            raise ModelError(f"'{label}' was learned on the {made} task{learned}, and '{task.name}' is a {self.name} "
                             f"task: score it on its own task (drop --task), or give a region learned on a {self.name} "
                             "task")

    def supports(self, verb: str, task) -> None:
        """Refuse a verb this kind cannot do, in one line."""
        self.does(verb, task.name)

    def does(self, verb: str, name: str) -> None:
        """Refuse ``verb`` on the task ``name`` of this kind, in one line, where the kind cannot do it."""
        if verb not in self.verbs:
            raise RequestError(f"'{name}' is a {self.name} task, and {verb} works on "
                               + ", ".join(sorted(k.name for k in KINDS.values() if verb in k.verbs)) + " tasks")

    def ood_note(self, task) -> str | None:
        """Why ``--ood`` tasks are not scored for this kind (None: they are)."""
        return None

    # -- data ---------------------------------------------------------------------------------------
    def check_sample(self, task, req) -> None:
        """A bad training-sample size fails before any model is loaded."""

    def mask_batches(self, pair, task, req, notes: list[str], seed_offset: int = 0) -> tuple[Callable, int]:
        """``make_batches(epoch)`` for mask learning, and how many examples they hold."""
        raise NotImplementedError

    def check_context(self, pair, task, req, notes: list[str], n: int | None = 0, meta=None, guard=None) -> None:
        """Before any mask step or scoring: what the pair's context cannot hold is refused; what it cuts is noted."""

    # -- fine-tuning ---------------------------------------------------------------------------------
    def check_finetune(self, req, task, config, allow: bool, notes: list[str]) -> None:
        """Before any fine-tuning step: what the base cannot be fine-tuned on is refused."""

    def finetune(self, req, task, config, out, options: LoadOptions, progress, cancel, allow: bool) -> None:
        raise NotImplementedError

    def test_score(self, out, task, req, options: LoadOptions, notes: list[str]) -> dict:
        """A fine-tuned checkpoint's test score: {test_accuracy, test_examples, chance_accuracy, test_loss}."""
        raise NotImplementedError

    # -- scoring -------------------------------------------------------------------------------------
    def judging(self, req, meta=None, guard=None):
        """How a model's answers are judged for ``req`` (a region's own rule, ``meta``, where the request is silent);
        None for kinds without answer rules."""
        return None

    @property
    def kept_by(self) -> str:
        """What ``share_kept`` measures, in words (--keep's curve says it)."""
        return self.words.score

    sized_by: str = "accuracy"  # the key of ``sizing_rows`` that ``share_kept`` reads: the size search's score

    def sizing_rows(self, pair, task, models: dict, *, n, judging=None, cancel=None) -> list[dict]:
        """Rows of FT, the reference model and each graft of ``models`` on ``n`` test examples holding ``sized_by``,
        as cheaply as the kind can score it (``localize --keep`` scores every region it tries): by default the
        comparison itself."""
        return self.compare(pair, task, models, n=n, judging=judging, cancel=cancel)["rows"]

    def share_kept(self, row: dict, ft: dict, bare: dict) -> float | None:
        """The share of what fine-tuning gained that a graft keeps on held-out examples, (graft − bare) / (FT − bare)
        of ``sized_by`` (None where fine-tuning gained nothing): what ``localize --keep`` holds a region to."""
        return gain_recovered(row.get(self.sized_by), ft.get(self.sized_by), bare.get(self.sized_by))

    def scored(self, rows: list[dict]) -> list[dict]:
        """Rows with the schema's ``score`` and ``metric``: the kind's own measure under one name."""
        for row in rows:
            row.setdefault("score", row.get("accuracy"))
            row.setdefault("metric", self.words.score)
        return rows

    def compare(self, pair, task, models: dict, *, n, contrasts=(), oods=(), judging=None, progress=None,
                cancel=None) -> dict:
        """FT, the reference model and each graft of ``models`` on ``n`` test examples: {task, rows, differences,
        reliability, histogram, ood, disagreements, generations, rule?, max_new_tokens?, notes}."""
        raise NotImplementedError

    def test_count(self, task, n: int | None) -> int:
        """How many test examples a comparison on ``n`` of them (None: all) scores: fewer where the task has fewer,
        so a line said before the scoring (a check's stage) tells the true number."""
        have = len(task.splits["test"])
        return have if n is None else min(n, have)

    def scorer(self, pair, task, split: str, n: int, judging=None, notes: list[str] | None = None
               ) -> Callable[[], Outcome]:
        """A function scoring the pair's model as it stands on a fixed sample of ``split``: what ablations and the
        validation choice of a merge compare."""
        raise NotImplementedError

    def paired(self, a: Outcome, b: Outcome, seed: int) -> dict:
        """The paired difference a − b of two outcomes on the same sample (its "diff" and "ci")."""
        raise NotImplementedError

    stitches_only: bool = False  # composing its regions means stitching them (no union graft read by each head)
    cheap_check: bool = False  # a held-out check costs seconds (one forward pass), so the region's start is checked too

    def heldout_problem(self, pair, task) -> str | None:
        """Why a quick held-out check of ``task`` cannot be scored on ``pair`` (None: it can)."""
        return None

    def sweep_reference(self, pair, task, req, oods, cancel=None):
        """What every budget of a sweep is scored against (FT and the empty region, cached per pair)."""
        raise NotImplementedError

    def sweep_rows(self, reference, pair, task, req, made: dict, kept: dict, sparsity: float, cancel=None
                   ) -> tuple[list[dict], list[dict]]:
        """The rows and paired differences of one budget of a sweep: ``made`` maps each method to its region."""
        raise NotImplementedError

    def sweep_fields(self, reference) -> dict:
        """The sweep result's reference figures: ft_accuracy, ft_ece, ft_ood, body_accuracy, n_test."""
        raise NotImplementedError

    def check_texts(self, req, task) -> None:
        """Refuse texts given to predict that this kind cannot read (before any model loads)."""

    def predict(self, pair, task, req, models: list[Look], ft_name: str, judging, notes: list[str], progress=None,
                cancel=None) -> tuple[list[dict], list[str], list[str]]:
        """Each of ``models`` on each text of ``req``, a row per (text, model) that carries the look's ``probe``:
        (rows, label names, card sentences)."""
        raise NotImplementedError

    def answer_probs(self, pair, task, req, rows: list[dict], ft_name: str, looks: list[Look], progress=None,
                     cancel=None) -> tuple[list[dict], list[list[tuple[float, str]]]]:
        """What a probe map plots: for each text, the fine-tuned model's answer (``rows``: predict's own) as
        {"answer", "measure"}; for each look, on each text, (the probability it gives that answer, its own answer).
        Looks are read one at a time in the order given (a map's knockouts share one fine-tuned state). A kind without
        such a probability refuses the map."""
        raise RequestError(f"--by cell maps the probability of the fine-tuned model's answer, which a task of kind "
                           f"'{self.name}' does not give here; use --by layer or --by module")

    def legend(self, rows: list[dict]) -> str:
        """The sentence under a comparison's table: what its columns measure."""
        raise NotImplementedError

    def predict_text(self, doc: dict) -> str:
        """Predict's result as plain text: one block per text given."""
        raise NotImplementedError

    def card(self, part: dict, graftable: int | None, ft_name: str, start_overlap=None) -> list[str]:
        """The sentences of a comparison's card."""
        raise NotImplementedError



KINDS: dict[str, TaskKind] = {}


def register_kind(kind: TaskKind) -> TaskKind:
    """Add a kind to the registry (once per kind, by name)."""
    if kind.name in KINDS:
        raise ValueError(f"task kind '{kind.name}' registered twice")
    KINDS[kind.name] = kind
    return kind


def ordered() -> list[TaskKind]:
    """The registered kinds in the order they are asked whether they claim a task reference."""
    return sorted(KINDS.values(), key=lambda k: k.order)


def kind_of(task) -> TaskKind:
    """The kind of a task object: the one registered for its class, else for its nearest base class."""
    for cls in type(task).__mro__:
        for kind in KINDS.values():
            if kind.task_type is cls:
                return kind
    raise TypeError(f"no task kind reads {type(task).__name__}")


def recorded_fields(meta, names: tuple[str, ...]) -> dict[str, str | None]:
    """The request fields ``names`` a region's task was read with, from its record (its request's, else an older
    file's data_spec)."""
    request, old = meta.request or {}, meta.data_spec or {}

    def pick(key):
        value = request.get(key) or old.get(key)
        return value if isinstance(value, str) else None

    return {name: pick(name) for name in names}


def task_kinds() -> tuple[str, ...]:
    """The values of --task-kind: auto, then every registered kind a request may name, by name (not in the order their
    modules happened to be imported)."""
    return ("auto", *sorted(k.name for k in KINDS.values() if k.choosable))


def kind_named(name: str) -> TaskKind:
    """A kind by its registered name (a result's ``task_kind``, a request's --task-kind)."""
    try:
        return KINDS[name]
    except KeyError:
        raise RequestError(f"unknown task kind {name!r}: graftui knows {', '.join(sorted(KINDS))}") from None


def kind_in(doc: dict, key: str = "task_kind") -> TaskKind:
    """The kind a result document names under ``key``. A document that names none is a classification's: results
    and region files written before graftui recorded their task's kind were all classifications."""
    return kind_named(doc.get(key) or "classification")


__all__ = ["KINDS", "Look", "Outcome", "TaskKind", "Words", "each_look", "kind_in", "kind_named", "kind_of", "ordered",
           "recorded_fields", "register_kind", "task_kinds"]
