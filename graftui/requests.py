"""Every verb's typed request: the one place where graftui's defaults, help texts and checks live.

A request is a flat dataclass; each field carries its default and its help text, and
``validate()`` makes every cheap check (ranges, names, files, folders) before any model or data
set is loaded. The CLI generates its options from these fields, the app fills the same fields
from its widgets, notebooks call ``graftui.localize(sparsity=0.01, ...)``, and every file graftui
writes embeds ``request.as_dict()`` so that ``graftui run FILE`` can make it again.

Requests sit above the library's core (they read the method registry and the data columns) and
below the verbs: ``graftui.flows`` registers each request class with its flow.

Over 700 lines because every verb's fields, defaults, help texts and checks are written here once (a field
shared by several verbs lives in one mixin); splitting it would scatter the defaults this module exists to hold.
"""

from __future__ import annotations

import copy
import math
import os
import re
import shlex
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import ClassVar

from . import settings, tracking
from .config import (
    DEFAULT_BASE, DEFAULT_CHECK_N, DEFAULT_EXAMPLES_PER_CLASS, DEFAULT_FINETUNED, DEFAULT_MULTITASK_TASKS, DEFAULT_RECIPE,
    DEFAULT_SPARSITY, DEFAULT_TASK, DTYPES, FAST, HEADS, LOGIT_DTYPES, LR_FOR, MEMORY_MODES, MODULE_TYPES, BINARISE_RULES,
    CANDIDATE_RANKS, MASK_OPTIMIZERS, SENTIMENT_TASKS, Budget, FinetuneConfig, GraftableSpec, LearnConfig, LoadOptions, default_recipe,
)
from .adapters import own_base
from .tasks.completion.data import CompletionSpec
from .tasks.classification.data import DataSpec
from .errors import GraftuiError, RequestError
from .experiments import MERGES
from .tasks.completion.generation import MAX_IGNORED, MAX_NEW_TOKENS, WHITESPACE, AnswerRule
from .localizers import METHODS
from .regions import GROUPS, LISTING_COLUMNS
from .sets import RESOLVE_MODES
from .kinds import KINDS, task_kinds


MAX_GENERATED = 1024  # --max-new-tokens at most


def arg(default, help: str, **cli):
    """A request field: its default, the help text every front end shows, and CLI hints.

    CLI hints: ``flag`` (option name), ``metavar``, ``choices`` (a tuple, or a function that returns
    one when the choices are a registry's), ``list`` ("repeat": one value per option, "comma":
    comma-separated), ``cli=False`` (not an option).
    """
    meta = {"help": help, **cli}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


WRITE_FIELDS = ("out", "keep")  # fields that name where a verb writes
SCHEDULES = ("direct", "nested")  # how localize reaches its budget
NESTED_FACTOR = 10  # a nested schedule's first region, in budgets


# -- the request base --------------------------------------------------------------------------------
@dataclass
class Request:
    verb: ClassVar[str] = ""
    writes: ClassVar[bool] = False  # whether the verb writes files (then ``out`` says where)
    # whether the verb takes seconds whatever its settings (a prediction; not an export, which writes a whole model):
    # the app runs it beside long jobs
    instant: ClassVar[bool] = False
    # whether the verb trains a model, which draws torch's process-wide random numbers: the app runs it beside no
    # other job, so that a seeded run repeats
    trains: ClassVar[bool] = False

    def destinations(self) -> dict[str, str]:
        """The places this request names to write (field -> path): ``out``, and a sweep's ``keep``."""
        return {name: value for name in WRITE_FIELDS if isinstance(value := getattr(self, name, None), str) and value}

    def validate(self) -> "Request":
        """Cheap checks (no model, no data set loaded); returns self so calls chain."""
        for f in fields(self):
            value = getattr(self, f.name)
            kind = _kind(type(self), f.name)
            if value is None:
                if not _optional(type(self), f.name):
                    raise RequestError(f"{_name(f.name)} is required")
                continue
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise RequestError(f"{_name(f.name)} must be a whole number, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise RequestError(f"{_name(f.name)} must be a number, got {value!r}")
            choices = choices_of(type(self), f.name)
            if choices and value not in choices and not isinstance(value, list):
                raise RequestError(f"unknown {f.name.replace('_', ' ')} '{value}'; choose from {', '.join(choices)}")
        if isinstance(self, TaskFields):  # every verb that reads a task
            self.check_task_fields()
        if isinstance(self, TrackFields):  # every verb that does work
            tracking.check(self.report_to)
        self.check()
        return self

    def check(self) -> None:
        """The verb's own cheap checks."""

    def as_dict(self) -> dict:
        return {"verb": self.verb, **asdict(self)}

    def replace(self, **changes) -> "Request":
        return type(self)(**{**asdict(self), **changes})

    @classmethod
    def help(cls, name: str) -> str:
        return next(f.metadata.get("help", "") for f in fields(cls) if f.name == name)

    @classmethod
    def defaults(cls) -> dict:
        """Field defaults, with the GRAFTUI_FAST ones where that mode is on."""
        out = {}
        for f in fields(cls):
            out[f.name] = f.default if f.default is not MISSING else f.default_factory()
            if settings.fast() and f.name in FAST:
                out[f.name] = copy.copy(FAST[f.name])  # a list default is never shared between requests
        return out

    @classmethod
    def make(cls, **given) -> "Request":
        """A request with every field not given at its default (GRAFTUI_FAST's where that mode is on):
        how the CLI, the app, the Python API and every derived request build one."""
        if issubclass(cls, PairFields) and "base" not in given:  # a fine-tune's own base, where it names one
            base = own_base(given.get("finetuned"))
            if base is not None:
                given = {**given, "base": base}
        return cls(**{**cls.defaults(), **given})


def derive(cls: type[Request], source: Request, **changes) -> Request:
    """A request of another verb made from ``source``: every field of the field groups both requests
    share (learning, loading, graftable set, task, pair …) is carried over, then ``changes`` apply.

    Verbs that run other verbs (a sweep's localizations, continual's, push's evaluation) build them
    here, so a setting that ``source`` accepts is never dropped on the way.
    """
    return cls.make(**{**{name: getattr(source, name) for name in shared_fields(cls, type(source))}, **changes})


def shared_fields(a: type[Request], b: type[Request]) -> list[str]:
    """The fields of the field groups (``*Fields`` classes) that ``a`` and ``b`` both inherit."""
    groups = [g for g in a.__mro__ if g in b.__mro__ and g.__name__.endswith("Fields")]
    return list(dict.fromkeys(f.name for g in groups for f in fields(g)))


def choices_of(cls, name: str) -> tuple | None:
    """The values a field accepts, when it has a fixed set (a registry's are read when asked)."""
    choices = next(f.metadata.get("choices") for f in fields(cls) if f.name == name)
    return tuple(choices()) if callable(choices) else choices


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _optional(cls, name: str) -> bool:
    return type(None) in typing.get_args(_hints(cls)[name])


def _kind(cls, name: str):
    """The plain type of a field: str, int, float, bool or list."""
    hint = _hints(cls)[name]
    if typing.get_origin(hint) is list:
        return list
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = args[0]
    return list if typing.get_origin(base) is list else base


def element_kind(cls, name: str):
    """The type of one element of a list field (str, int or float)."""
    hint = _hints(cls)[name]
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is list:
            return typing.get_args(arg)[0]
    return str


def _name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def parse_list(text, kind=float, plural: str = "values", singular: str = "value", example: str = "1e-4, 1e-3") -> list:
    """'1e-5, 1e-4; 0.001' -> [1e-05, 0.0001, 0.001] (numbers, or names with ``kind`` str), in the order given.

    The one reader of a list typed as text, for the CLI's comma lists and the app's text boxes alike;
    the request checks the values' range.
    """
    parts = [p.strip() for p in str(text if text is not None else "").replace(";", ",").split(",") if p.strip()]
    if not parts:
        raise RequestError(f"give at least one {singular}, e.g. {example}")
    out = []
    for part in parts:
        try:
            out.append(kind(part))
        except ValueError:
            what = "whole number" if kind is int else "number"
            raise RequestError(f"'{part}' is not a {what}; write {plural} like {example}") from None
    return out


# -- field groups (help text written once) -------------------------------------------------------------
H_BASE = ("pre-trained model θ_pre: 'minilm', a checkpoint folder or a Hub id (default: the fine-tune's own base where it "
          "names one, as a default fine-tune or a LoRA adapter's config does, else minilm)")
H_FT = "fine-tuned model θ_ft: 'minilm-movies' (built on first use), a checkpoint folder or a Hub id"
H_TASK = ("offline task (see 'graftui tasks'), a CSV/TSV/JSON(L)/Parquet file or folder, a Hub dataset id, or an "
          "lm-evaluation-harness task: lm-eval:NAME or its task YAML")


@dataclass
class PairFields(Request):
    base: str = arg(DEFAULT_BASE, H_BASE, metavar="REF", group="models")
    finetuned: str = arg(DEFAULT_FINETUNED, H_FT, metavar="REF", group="models")


@dataclass
class TrackFields(Request):
    """Where the run is reported (tracking.py): an experiment tracker, through its own library."""

    report_to: str = arg(tracking.NONE, "experiment tracker that keeps the run: its request, curves per step, every "
                         "model's final metrics with their paired intervals, its card and files (trackio: a local "
                         "database; wandb: offline unless WANDB_MODE says otherwise; mlflow: a file store unless "
                         "MLFLOW_TRACKING_URI says otherwise; tensorboard: event files), under $GRAFTUI_HOME",
                         choices=tracking.REPORT_TO, group="tracking")


H_LOAD = "model loading"


@dataclass
class LoadFields(Request):
    """How the models are read (prompts.py): their head, the prompt of a language model, dtype and placement."""

    head: str = arg("auto", "read the models as: auto (their own kind), classifier, causal-lm or masked-lm",
                    choices=HEADS, group=H_LOAD)
    template: str | None = arg(None, "prompt of a language model, with {text} (and {text_pair}; {mask} for a masked "
                               "LM), e.g. '{text} It was' (default: the checkpoint's own, else '{text} It was' / "
                               "'{text} It was {mask}.')", metavar="TEXT", group=H_LOAD)
    label_words: str | None = arg(None, "one word per label, taken verbatim (leading space included), e.g. "
                                  "'negative= bad,positive= good' (default: the checkpoint's own, else each "
                                  "label's name after a space)", metavar="PAIRS", group=H_LOAD)
    label_scoring: str = arg("first", "score a label word by its first token (the paper's) or by all its tokens "
                             "(causal LMs)", choices=("first", "all"), group=H_LOAD)
    dtype: str = arg("float32", "dtype the models are loaded in ('auto': the checkpoint's own)", choices=DTYPES,
                     group=H_LOAD)
    device_map: str | None = arg(None, "'auto' spreads a model too big for one device over the GPUs and the CPU "
                                 "(needs accelerate)", metavar="MAP", group=H_LOAD)

    def load_options(self, recorded: LoadOptions | None = None) -> LoadOptions:
        """The request's options; what it leaves at the default comes from ``recorded`` (a region's prompt)."""
        recorded, default = recorded or LoadOptions(), LoadOptions()
        prompt = {name: getattr(self, name) if getattr(self, name) != getattr(default, name) else getattr(recorded, name)
                  for name in ("head", "template", "label_words", "label_scoring")}
        return LoadOptions(**prompt, dtype=self.dtype, device_map=self.device_map)

    def check_loading(self, learning: bool = False) -> None:
        if learning and self.dtype == "float16":
            raise RequestError("--dtype float16: mask gradients underflow in float16; use bfloat16 (same range as "
                               "float32) or float32")
        if self.device_map not in (None, "auto", "cpu") and not str(self.device_map).startswith("cuda"):
            raise RequestError(f"--device-map '{self.device_map}': use auto, cpu or cuda[:N]")
        if self.head == "classifier" and (self.template or self.label_words):
            raise RequestError("--template and --label-words are for language models; drop them or use --head causal-lm "
                               "or masked-lm")


@dataclass
class TaskFields(Request):
    task: str = arg(DEFAULT_TASK, H_TASK, metavar="REF", group="data")
    text_column: str | None = arg(None, "column holding the text (guessed if omitted)", metavar="NAME", group="data")
    pair_column: str | None = arg(None, "column holding the second text of text-pair tasks", metavar="NAME", group="data")
    label_column: str | None = arg(None, "column holding the label (guessed if omitted)", metavar="NAME", group="data")
    config: str | None = arg(None, "Hugging Face dataset config name", metavar="NAME", group="data")

    task_kind: str = arg("auto", "classification (a label per text), completion ((prompt, completion) pairs or "
                         "chats, scored on the completion) or auto (an offline skill, or the file's columns, decide)",
                         choices=task_kinds, group="data")
    prompt_column: str | None = arg(None, "completion tasks: column holding the prompt (guessed if omitted)",
                                    metavar="NAME", group="completion tasks")
    completion_column: str | None = arg(None, "completion tasks: column holding the completion (guessed if omitted)",
                                        metavar="NAME", group="completion tasks")
    messages_column: str | None = arg(None, "completion tasks: column of chat conversations ([{role, content}, …]; "
                                      "every assistant turn is scored)", metavar="NAME", group="completion tasks")
    answer_regex: str | None = arg(None, r"completion tasks: compare only the answer this regex finds (its first "
                                   r"group), e.g. '#### (\S+)'; '' compares without one, even where the region was "
                                   "made with one", metavar="REGEX", group="completion tasks")
    ignore_case: bool = arg(AnswerRule.ignore_case, "completion tasks: answers are compared ignoring case",
                            group="completion tasks")
    whole_generation: bool = arg(not AnswerRule.first_line, "completion tasks: compare the whole generation, not "
                                 "only its first line (the default for a one-line reference)", group="completion tasks")
    ignore_punctuation: bool = arg(AnswerRule.ignore_punctuation, "completion tasks: answers are compared without "
                                   "punctuation (quotes, commas, full stops …)", group="completion tasks")
    ignore_regex: list[str] | None = arg(None, f"completion tasks: remove every match of this regex from both answers "
                                         f"before comparing, e.g. '\\b(a|an|the)\\b' (repeatable, at most "
                                         f"{MAX_IGNORED}; '' removes none, even where the region was made with some)",
                                         metavar="REGEX", list="repeat", group="completion tasks")
    answer_whitespace: str | None = arg(None, "completion tasks: collapse (runs of whitespace are one space), remove "
                                        "(none left) or keep whitespace before comparing answers (default: what the "
                                        f"region was made with, else {AnswerRule.whitespace})", choices=WHITESPACE,
                                        group="completion tasks")
    max_new_tokens: int | None = arg(None, f"completion tasks: tokens a model may generate per prompt, greedy (default: "
                                     f"what the region was made with, else {MAX_NEW_TOKENS})", metavar="N",
                                     group="completion tasks")

    def data_spec(self) -> DataSpec:
        return DataSpec(config=self.config, text_column=self.text_column, pair_column=self.pair_column,
                        label_column=self.label_column)

    def completion_spec(self) -> CompletionSpec:
        return CompletionSpec(config=self.config, prompt_column=self.prompt_column,
                              completion_column=self.completion_column, messages_column=self.messages_column)

    def answer_rule(self, recorded: AnswerRule | None = None) -> AnswerRule:
        """The request's answer rule; what it leaves unsaid comes from ``recorded`` (the rule a region was made with):
        a regex, the regexes to ignore and the whitespace where not given ('' and [''] say none), and each of
        ignore case, ignore punctuation and the first-line cut where the request does not turn it on."""
        made = recorded or AnswerRule()
        return AnswerRule(regex=made.regex if self.answer_regex is None else self.answer_regex,
                          ignore_case=self.ignore_case or made.ignore_case,
                          first_line=not self.whole_generation and made.first_line,
                          ignore_punctuation=self.ignore_punctuation or made.ignore_punctuation,
                          regexes_to_ignore=made.regexes_to_ignore if self.ignore_regex is None else
                          tuple(p for p in self.ignore_regex if p),
                          whitespace=self.answer_whitespace or made.whitespace)

    def check_task_fields(self) -> None:
        check_max_new_tokens(self.max_new_tokens)
        if self.ignore_regex is not None and not (isinstance(self.ignore_regex, list)
                                                  and all(isinstance(p, str) for p in self.ignore_regex)):
            raise RequestError(f"--ignore-regex takes a list of regexes (text), got {self.ignore_regex!r:.80}: give "
                               "e.g. ['^the '] (on the command line: --ignore-regex '^the ')")
        try:
            rule = self.answer_rule()
            rule.compiled()
            rule.ignored()
        except GraftuiError as err:
            raise RequestError(str(err)) from None
        asked = KINDS.get(self.task_kind)
        for other in KINDS.values():
            if asked is not None and other is not asked and any(getattr(self, f, None) for f in other.fields):
                flags = [f"--{f.replace('_', '-')}" for f in other.fields]
                raise RequestError(f"{', '.join(flags[:-1])} and {flags[-1]} are for {other.name} tasks; drop them or "
                                   f"use --task-kind {other.name}")


@dataclass
class LearnFields(Request):
    """Mask learning (method 'learned'); defaults from method.LearnConfig."""

    steps: int = arg(LearnConfig.steps, "mask steps", metavar="N", group="mask learning (method 'learned')")
    lr: float = arg(LearnConfig.lr, "step size (logit units for 'normalized' and 'adam'; the raw η for 'sgd')", metavar="F",
                    group="mask learning (method 'learned')")
    optimizer: str = arg(LearnConfig.optimizer, "normalized (RMS-scaled steps), adam, or sgd (the paper's)",
                         choices=MASK_OPTIMIZERS, group="mask learning (method 'learned')")
    batch_size: int = arg(LearnConfig.batch_size, "examples per mask step", metavar="N", group="mask learning (method 'learned')")
    examples_per_class: int | None = arg(
        None, f"k-shot training examples per class (default: {DEFAULT_EXAMPLES_PER_CLASS}, or all there are when a "
        "class has fewer)", metavar="N", group="mask learning (method 'learned')")
    binarise: str = arg(LearnConfig.binarise, "topk (exact budget) or round (the paper's 0.5 rule, capped at k)",
                        choices=BINARISE_RULES, group="mask learning (method 'learned')")
    seed: int = arg(LearnConfig.seed, "seed of the k-shot sample, the batches and the random baseline", metavar="N",
                    group="mask learning (method 'learned')")
    logit_dtype: str = arg(LearnConfig.logit_dtype, "precision of the region logits (one per graftable parameter): float16 "
                           "or bfloat16 halve their memory, for models near the machine's limit",
                           choices=LOGIT_DTYPES, group="mask learning (method 'learned')")
    memory: str = arg(LearnConfig.memory, "what the memory plan keeps between passes: fast keeps it all (σ(ℓ) and δ of "
                      "the full learner, every layer's activations), lean recomputes it all, auto keeps each where it "
                      "fits in a quarter of the free memory; the region is the same", choices=MEMORY_MODES,
                      group="mask learning (method 'learned')")
    checkpoint_every: int | None = arg(LearnConfig.checkpoint_every, "recompute the activations of every N-th layer "
                                       "in the backward pass instead of keeping them (1: every layer; 0: none; default: "
                                       "the memory plan decides): less memory for up to one more forward pass per step; "
                                       "the region is the same", metavar="N", group="mask learning (method 'learned')")
    candidates: str = arg(LearnConfig.candidates, "which learner, whatever the machine: auto (the candidate set C at "
                          "c = 5), 'all' (a logit per graftable parameter, the paper's full relaxation), or a factor "
                          "c ≥ 1 for C alone: γ_base and the c·k − k parameters the first step's gradient ranks next, "
                          "grown as learning finds more (memory for C instead of the model; the same region as 'all' "
                          "when C holds every parameter that moved)", metavar="auto|all|c",
                          group="mask learning (method 'learned')")
    rank: str = arg(LearnConfig.rank, "how the candidate set ranks the parameters outside γ_base: gradient (the first "
                    "step's |∇_θL ⊙ δ|, summed over --rank-examples) or movement (|δ|, the rule before)",
                    choices=CANDIDATE_RANKS, group="mask learning (method 'learned')")
    rank_examples: int = arg(LearnConfig.rank_examples, "training examples the gradient ranking reads (whole batches)",
                             metavar="N", group="mask learning (method 'learned')")
    grow_every: int = arg(LearnConfig.grow_every, "steps between the passes that add to C the parameters whose "
                          "gradient would carry them into the region (0: never)", metavar="N",
                          group="mask learning (method 'learned')")

    def learn_config(self) -> LearnConfig:
        return LearnConfig(steps=self.steps, lr=float(self.lr), optimizer=self.optimizer, batch_size=self.batch_size,
                           binarise=self.binarise, seed=self.seed, logit_dtype=self.logit_dtype, memory=self.memory,
                           checkpoint_every=self.checkpoint_every, candidates=str(self.candidates).strip().lower(),
                           rank=self.rank, rank_examples=self.rank_examples, grow_every=self.grow_every)

    def check_learning(self) -> None:
        check_at_least_one("steps", self.steps)
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise RequestError(f"--lr must be a positive number, got {self.lr}")
        check_at_least_one("batch_size", self.batch_size)
        check_at_least_one("examples_per_class", self.examples_per_class)
        check_at_least_one("rank_examples", self.rank_examples)
        if self.grow_every < 0:
            raise RequestError(f"--grow-every must be 0 (C never grows) or a step count N >= 1, got {self.grow_every}")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise RequestError(f"--checkpoint-every must be 0 (keep all activations) or a layer count N >= 1, "
                               f"got {self.checkpoint_every}")
        try:
            LearnConfig.candidate_factor(self.candidates)
        except ValueError as err:
            raise RequestError(str(err)) from None


MAX_SEEDS = 20


@dataclass
class ReplicateFields(Request):
    """Replicates: the same run once per seed, each seed's result kept beside the mean ± standard deviation."""

    seeds: list[int] | None = arg(None, "run once per seed, e.g. 0,1,2 (overrides --seed): each seed's result is kept "
                                  "and every figure gets its mean ± standard deviation across seeds", metavar="LIST",
                                  list="comma", group="replicates")

    def check_seeds(self) -> None:
        if self.seeds is None:
            return
        if not self.seeds:
            raise RequestError("--seeds: give at least one seed, e.g. 0,1,2")
        for s in self.seeds:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise RequestError(f"--seeds: every seed is a whole number >= 0, got {s!r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise RequestError(f"--seeds: {self.seeds} names a seed twice; a replicate is another seed")
        if len(self.seeds) > MAX_SEEDS:
            raise RequestError(f"--seeds: at most {MAX_SEEDS} seeds, got {len(self.seeds)}")


def _same_place(ref) -> str:
    """A model reference as one place: a folder that exists by its resolved path ('./ft' and 'ft/' are one)."""
    text = str(ref or "").strip()
    path = Path(text).expanduser()
    return str(path.resolve()) if text and path.exists() else text


@dataclass
class FinetuneReplicateFields(Request):
    """Fine-tune replicates: the same run on other fine-tunes of one recipe (one per fine-tune seed), so that the
    variance the paper reports, over fine-tunes, is measured and not only the mask seed's."""

    finetuned_replicates: list[str] | None = arg(
        None, "the same recipe's other fine-tunes, e.g. the folders of 'finetune --seeds' (comma-separated): run on "
        "each as on --finetuned; every figure gets its mean ± standard deviation over the fine-tunes", metavar="LIST",
        list="comma", group="replicates")

    def finetunes(self) -> list[str]:
        """--finetuned, then each replicate fine-tune."""
        return [self.finetuned, *(self.finetuned_replicates or ())]

    def check_finetune_replicates(self) -> None:
        if self.finetuned_replicates is None:
            return
        refs = [_same_place(r) for r in self.finetunes()]
        if not self.finetuned_replicates or not all(refs):
            raise RequestError("--finetuned-replicates: give at least one other fine-tuned model, e.g. ft-seed1,ft-seed2")
        if len(set(refs)) != len(refs):
            raise RequestError(f"--finetuned-replicates: {', '.join(map(str, self.finetunes()))} names a fine-tune twice "
                               "(--finetuned counts); a replicate is another fine-tune")
        if len(refs) > MAX_SEEDS:
            raise RequestError(f"--finetuned-replicates: at most {MAX_SEEDS} fine-tunes, got {len(refs)}")


@dataclass
class GraftableFields(Request):
    include_embeddings: bool = arg(False, "let regions include embeddings (frozen in the paper's fine-tuning)",
                                   group="graftable parameters")
    modules: list[str] | None = arg(None, f"only these module types ({', '.join(MODULE_TYPES)})", metavar="LIST",
                                    list="comma", choices=MODULE_TYPES, group="graftable parameters")

    def graftable_spec(self) -> GraftableSpec:
        return GraftableSpec(include_embeddings=self.include_embeddings,
                             modules=tuple(self.modules) if self.modules else None)

    def check_modules(self) -> None:
        if self.modules is not None:
            if not self.modules:
                raise RequestError("--modules: give at least one module type")
            for m in self.modules:
                if m not in MODULE_TYPES:
                    raise RequestError(f"unknown module type '{m}' in --modules; choose from {', '.join(MODULE_TYPES)}")


@dataclass
class RecipeFields(Request):
    """The fine-tuning recipe of an experiment's own training; what is not given follows the default recipe."""

    ft_lr: float | None = arg(None, f"fine-tuning learning rate (default: the default recipe's, {DEFAULT_RECIPE.lr:g} for "
                              "SGD)", metavar="F", group="training")
    epochs: int | None = arg(None, f"training epochs (default {DEFAULT_RECIPE.epochs})", metavar="N", group="training")
    train_examples: int | None = arg(None, f"stratified training subsample per task (default "
                                     f"{DEFAULT_RECIPE.train_examples}; 0 = all)", metavar="N", group="training")

    def recipe(self, seed: int | None = None) -> FinetuneConfig:
        default = default_recipe()
        return replace(default, lr=default.lr if self.ft_lr is None else self.ft_lr,
                       epochs=default.epochs if self.epochs is None else self.epochs,
                       train_examples=default.train_examples if self.train_examples is None else (self.train_examples or None),
                       seed=default.seed if seed is None else seed)

    def check_recipe(self) -> None:
        if self.train_examples is not None and self.train_examples < 0:
            raise RequestError(f"--train-examples must be 0 (all) or more, got {self.train_examples}")
        self.recipe().validate()


def check_at_least_one(field_name: str, value: int | None) -> None:
    """Counts (steps, examples, test examples …) are whole numbers ≥ 1 when given."""
    if value is not None and value < 1:
        raise RequestError(f"{_name(field_name)} must be at least 1, got {value}")


def check_task_list(tasks: list[str]) -> list[str]:
    """--tasks of the multi-task and continual experiments: two or more different tasks."""
    kept = [t for t in tasks if str(t).strip()]
    if len(kept) < 2 or len(set(kept)) != len(kept):
        raise RequestError(f"--tasks: give two or more different tasks, got {', '.join(tasks) or 'none'}")
    return kept


def check_sparsity(value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= 1):
        raise RequestError(f"sparsity must be in (0, 1], a fraction of the graftable parameters; got {value}")


def check_max_new_tokens(value: int | None) -> None:
    check_at_least_one("max_new_tokens", value)
    if value is not None and value > MAX_GENERATED:
        raise RequestError(f"--max-new-tokens {value} is more than {MAX_GENERATED}; an answer this long is no "
                           "exact-match task")


def check_out_file(out: str | None, overwrite: bool = False, resumable: bool = False) -> None:
    """A file to write: not a folder, not an existing file unless asked (``resumable``: the flow decides whether an
    existing file is its own earlier result), in a folder this process can write."""
    if out is None:
        return
    path = Path(out).expanduser()
    if path.is_dir():
        raise RequestError(f"output '{out}' is a folder; give a file name such as region.safetensors")
    if path.exists() and not overwrite and not resumable:
        raise RequestError(f"output '{out}' exists; choose a new name, or add --overwrite to replace it")
    folder = next((p for p in path.absolute().parents if p.exists()), None)
    if folder is not None and (not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK)):
        raise RequestError(f"cannot write '{out}': no permission to write in '{folder}'")


def report_exists(report) -> str:
    """The one line for a --report file that is there (checked before the run, or written meanwhile by another)."""
    return f"'{report}' exists: give another --report path, or --overwrite to replace it"


def check_report_file(report, overwrite: bool = False, outputs=()) -> None:
    """Where ``--report`` writes: never over a file the same command writes (``outputs``: its --out, its regions), even
    with --overwrite; never a name graftui would read back as a region; an existing file only with --overwrite."""
    if not report:
        return
    path = Path(report).expanduser()
    try:
        own = any(path.resolve() == Path(out).expanduser().resolve() for out in outputs if out)
    except (OSError, RuntimeError):  # a link loop: not one of the outputs, which the write reaches
        own = False
    if own:
        raise RequestError(f"'{report}' is this command's --out, where its result goes: give --report another path")
    if path.suffix.lower() == ".safetensors":
        raise RequestError(f"'{report}' is a region file's name, and a report is JSON (or a .zip bundle): give --report "
                           "a .json or .zip path")
    if path.is_dir():
        raise RequestError(f"'{report}' is a folder: give --report a file name such as report.json")
    if path.exists() and not overwrite:
        raise RequestError(report_exists(report))
    check_out_file(str(report), overwrite=True)  # a folder this process can write


def check_out_dir(out: str | None) -> None:
    if out is None:
        return
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise RequestError(f"output '{out}' exists and is a file, not a folder")
    if path.is_dir() and any(path.iterdir()):
        raise RequestError(f"output folder '{out}' exists and is not empty; choose a new folder")


def check_region_file(path: str) -> None:
    p = Path(str(path)).expanduser()
    if not p.exists():
        raise RequestError(f"no region file at '{path}'")
    if p.is_dir():
        raise RequestError(f"'{path}' is a folder, not a region file")


def check_methods(names) -> None:
    if not names:
        raise RequestError("give at least one localization method")
    for name in names:
        if name not in METHODS:
            raise RequestError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")


# -- the verbs -------------------------------------------------------------------------------------------
@dataclass
class PairRequest(LoadFields, TaskFields, PairFields):
    """Load a pair and say what it is: architecture, labels, parameter counts and, for a language model, what it
    reads for the task's first training example and each label word's tokens."""

    verb: ClassVar[str] = "pair"
    instant: ClassVar[bool] = True

    def check(self) -> None:
        self.check_loading()


@dataclass
class FinetuneRequest(TrackFields, ReplicateFields, LoadFields, TaskFields):
    """Fine-tune a base model on a task and write a Hugging Face checkpoint folder (with --seeds, one per seed)."""

    verb: ClassVar[str] = "finetune"
    trains: ClassVar[bool] = True
    writes: ClassVar[bool] = True
    base: str = arg(DEFAULT_BASE, H_BASE, metavar="REF", group="models")
    optimizer: str = arg(DEFAULT_RECIPE.optimizer, "sgd (the paper's recipe) or adamw", choices=tuple(LR_FOR),
                         group="training")
    lr: float | None = arg(None, "learning rate (default: "
                           + ", ".join(f"{v:g} for {k}" for k, v in LR_FOR.items()) + ")", metavar="F", group="training")
    epochs: int | None = arg(None, f"training epochs (default {DEFAULT_RECIPE.epochs})", metavar="N", group="training")
    batch_size: int | None = arg(None, f"default {DEFAULT_RECIPE.batch_size}", metavar="N", group="training")
    l1: float = arg(0.0, "ℓ1 movement penalty (adamw only)", metavar="F", group="training")
    freeze_head: bool = arg(False, "keep the new classification head at its random initialisation (the seed code's "
                            "fixhead): the body learns to serve a fixed head, as in prompt-based fine-tuning",
                            group="training")
    lora_rank: int = arg(FinetuneConfig.lora_rank, "completion tasks: train a LoRA adapter of this rank on every linear "
                         "layer of the body and write the adapter alone, the base left as it is (0: fine-tune the body; "
                         "LoRA wants about 10x the lr, e.g. --optimizer adamw --lr 1e-3)", metavar="R", group="training")
    train_examples: int | None = arg(None, f"stratified training subsample (default {DEFAULT_RECIPE.train_examples}; "
                                     "0 = all)", metavar="N", group="training")
    seed: int | None = arg(None, f"default {DEFAULT_RECIPE.seed}", metavar="N", group="training")
    test_examples: int | None = arg(None, "test examples for the reported accuracy (default all)", metavar="N")
    out: str | None = arg(None, "new checkpoint folder (default $GRAFTUI_HOME/checkpoints/<base>-<task>-<recipe hash>, "
                          "reused when it exists)", metavar="DIR")

    def recipe(self) -> FinetuneConfig:
        """The recipe: every field not given follows the default recipe (the optimizer's own lr)."""
        default = default_recipe()
        lr = self.lr if self.lr is not None else (default.lr if self.optimizer == default.optimizer else LR_FOR[self.optimizer])
        train = default.train_examples if self.train_examples is None else (self.train_examples or None)
        pick = lambda value, fallback: fallback if value is None else value  # noqa: E731
        return FinetuneConfig(optimizer=self.optimizer, lr=lr, momentum=default.momentum, weight_decay=default.weight_decay,
                              l1=self.l1, epochs=pick(self.epochs, default.epochs),
                              batch_size=pick(self.batch_size, default.batch_size), train_examples=train,
                              freeze_embeddings=default.freeze_embeddings, freeze_head=self.freeze_head,
                              seed=pick(self.seed, default.seed), lora_rank=self.lora_rank)

    def check(self) -> None:
        if self.train_examples is not None and self.train_examples < 0:
            raise RequestError(f"--train-examples must be 0 (all) or more, got {self.train_examples}")
        self.recipe().validate()
        check_at_least_one("test_examples", self.test_examples)
        self.check_seeds()
        for out in (self.seed_outs().values() if self.seeds else (self.out,)):
            check_out_dir(out)
        self.check_loading()

    def seed_outs(self) -> dict[int, str | None]:
        """Each seed's checkpoint folder with --seeds: --out with '-seed<N>' (None: the default folder per recipe,
        which holds the seed)."""
        return {s: f"{str(self.out).rstrip('/')}-seed{s}" if self.out else None for s in self.seeds or ()}


@dataclass
class LocalizeRequest(TrackFields, FinetuneReplicateFields, ReplicateFields, LoadFields, GraftableFields, LearnFields, TaskFields, PairFields):
    """Find the k parameters of the fine-tuned model that carry the task's skill."""

    verb: ClassVar[str] = "localize"
    writes: ClassVar[bool] = True
    method: str = arg("learned", "localization method (see 'graftui methods')", choices=lambda: tuple(METHODS),
                 group="region")
    sparsity: float | None = arg(None, "region size as a fraction of the graftable parameters, in (0, 1] (default: "
                                 "the task kind's, 0.001, or 0.01 for a completion or lm-eval task)", metavar="F",
                                 group="region")
    k: int | None = arg(None, "region size as a number of parameters (overrides --sparsity)", metavar="N", group="region")
    region_only: bool = arg(False, "write indices only (re-applying needs the fine-tuned model), not a skill patch")
    out: str | None = arg(None, "region file (default: a new file in $GRAFTUI_HOME/regions)", metavar="FILE")
    overwrite: bool = arg(False, "replace --out and the --report file if they exist (refused otherwise)")
    check_n: int = arg(DEFAULT_CHECK_N, "held-out test examples on which the region is scored at once, beside the "
                       "fine-tuned model and the empty region (0: no check; evaluate scores them all)", metavar="N")
    keep: float | None = arg(None, "find the size the skill needs: the smallest region whose graft keeps at least this "
                             "share of what fine-tuning gained on the --check-n held-out examples (e.g. 0.9; a completion "
                             "task's share of the loss gap), searched from the budget, each smaller region learned "
                             "inside the larger one; writes that region with the curve of share against k",
                             metavar="SHARE", group="region")
    schedule: str = arg("direct", "direct learns the region over the whole graftable set; nested first learns one of "
                        f"{NESTED_FACTOR}·k and then the region inside it (docs/method.md compares the two)",
                        choices=SCHEDULES, group="region")

    def budget(self, default: float = DEFAULT_SPARSITY) -> Budget:
        """--k, else --sparsity, else ``default``: the task kind's own budget (TaskKind.sparsity)."""
        if self.k is not None:
            return Budget(k=self.k)
        return Budget(sparsity=default if self.sparsity is None else self.sparsity)

    def check(self) -> None:
        check_methods([self.method])
        if self.k is not None:
            if self.k < 1:
                raise RequestError(f"--k must be at least 1, got {self.k}")
        elif self.sparsity is not None:
            check_sparsity(self.sparsity)
        self.check_learning()
        self.check_modules()
        self.check_loading(learning=True)
        self.check_seeds()
        self.check_finetune_replicates()
        if isinstance(self.check_n, bool) or not isinstance(self.check_n, int) or self.check_n < 0:
            raise RequestError(f"{_name('check_n')} must be a whole number >= 0 (0: no check), got {self.check_n!r}")
        if self.keep is not None:
            if not (math.isfinite(self.keep) and 0 < self.keep <= 1):
                raise RequestError(f"--keep must be a share in (0, 1], e.g. 0.9 for 90 % of what fine-tuning gained; "
                                   f"got {self.keep:g}")
            if not self.check_n:
                raise RequestError("--keep scores each region it tries on held-out examples: give --check-n N > 0 "
                                   "(e.g. 200)")
        if self.finetuned_replicates:  # each fine-tune's file may be an interrupted run's: the flow reads it back
            for i in range(len(self.finetunes())):
                self.replace(out=self.finetune_out(i), finetuned_replicates=None).check_outs(resumable=True)
        else:
            self.check_outs()

    def check_outs(self, resumable: bool = False) -> None:
        if self.seeds:
            for path in self.seed_outs().values():
                check_out_file(path, self.overwrite, resumable=True)
        else:
            check_out_file(self.out, self.overwrite, resumable=resumable)

    def finetune_out(self, i: int) -> str | None:
        """The region file of fine-tune ``i`` with --finetuned-replicates: --out with '-ft<i>' before its suffix."""
        if not self.out:
            return None
        out = Path(self.out)
        return str(out.with_name(f"{out.stem}-ft{i}{out.suffix or '.safetensors'}"))

    def seed_outs(self) -> dict[int, str | None]:
        """Each seed's region file with --seeds: --out with '-seed<N>' before its suffix (None: new files)."""
        if not self.out:
            return {s: None for s in self.seeds or ()}
        out = Path(self.out)
        return {s: str(out.with_name(f"{out.stem}-seed{s}{out.suffix or '.safetensors'}")) for s in self.seeds or ()}


def parse_label_map(text: str | None) -> dict[str, str] | None:
    """'0=negative, 1=positive' → {'0': 'negative', '1': 'positive'}; None when not given."""
    if text is None or not str(text).strip():
        return None
    out = {}
    for part in str(text).split(","):
        old, sep, new = part.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise RequestError(f"--ood-labels: '{part.strip()}' is not old=new; write e.g. 0=negative,1=positive")
        if old.strip() in out:
            raise RequestError(f"--ood-labels: label '{old.strip()}' is mapped twice")
        out[old.strip()] = new.strip()
    return out


@dataclass
class OodFields(Request):
    """Out-of-distribution tasks, read in the in-distribution task's label space."""

    ood: list[str] | None = arg(None, "out-of-distribution tasks (default for sentiment tasks: the other two of movies, "
                                "amazon, tweets); integer labels 0…n−1 map by position", metavar="TASK", list="repeat")
    no_ood: bool = arg(False, "skip out-of-distribution tasks")
    ood_labels: str | None = arg(None, "how the OOD tasks' labels map onto the task's, as old=new pairs, e.g. "
                                 "'0=negative,1=positive' or '1=negative,2=negative,4=positive,5=positive' (default: "
                                 "equal names, or integer labels by position)", metavar="MAP")

    def ood_tasks(self, task: str) -> list[str]:
        if self.no_ood:
            return []
        if self.ood is not None:
            return [t for t in dict.fromkeys(self.ood) if t != task]
        key = str(task).strip().lower()
        return [t for t in SENTIMENT_TASKS if t != key] if key in SENTIMENT_TASKS else []

    def label_map(self) -> dict[str, str] | None:
        return parse_label_map(self.ood_labels)


@dataclass
class GraftsFields(LoadFields, TaskFields):
    """Regions grafted onto the pair they were made from (their own base, fine-tuned model and task by default)."""

    regions: list[str] = arg([], "region or skill patch to graft (repeatable)", flag="--region", metavar="FILE",
                             list="repeat")
    base: str | None = arg(None, H_BASE + " (default: the regions' own, else minilm)", metavar="REF", group="models")
    finetuned: str | None = arg(None, H_FT + " (default: the regions' own; rebuilt from the patches when it "
                                "cannot be loaded)", metavar="REF", group="models")
    task: str | None = arg(None, H_TASK + " (default: the regions' own, else movies)", metavar="REF", group="data")

    def check_regions(self) -> None:
        for path in self.regions:
            check_region_file(path)
        self.check_loading()


@dataclass
class EvaluateRequest(TrackFields, ReplicateFields, GraftsFields, OodFields):
    """Accuracy, F1, ECE and agreement with FT, in and out of distribution, for FT, the bare body and grafts."""

    verb: ClassVar[str] = "evaluate"
    baselines: bool = arg(False, "add top-movement and random regions of each region's size")
    sparsity: float | None = arg(None, "baseline budget when no region is given (default: the task kind's, 0.001, "
                                 "or 0.01 for a completion or lm-eval task)", metavar="F")
    n: int | None = arg(None, "test examples per task (default all)", metavar="N")
    seed: int = arg(0, "seed of the random baseline (the n test examples are the same for every seed)",
                    metavar="N")

    def check(self) -> None:
        self.check_regions()
        if self.sparsity is not None:
            check_sparsity(self.sparsity)
        check_at_least_one("n", self.n)
        self.label_map()
        self.check_seeds()


PROBE_PARTS = ("layer", "module", "cell")  # what predict --by probes one at a time: a region's layers, its module
# types, or each (layer, module type) cell of it grafted alone and knocked out alone (a map of Δp)
PROBE_LAYERS = 32  # the layers a probe by layer is planned for before the region is read (SmolLM2-135M has 30)
MAX_PREDICT_TEXTS = 64  # sentences one request classifies: a look at a model, not a scoring run
MAX_PREDICT_CHARS = 5000  # characters of one text a prediction reads (a look at a few sentences, not a document)


@dataclass
class PredictRequest(GraftsFields):
    """Each model on texts typed by hand — class probabilities for a classification region, the greedy generation for
    a completion region's prompt: pre-trained body, fine-tuned, each graft."""

    verb: ClassVar[str] = "predict"
    instant: ClassVar[bool] = True
    texts: list[str] = arg([], "a sentence to classify, or a prompt for a completion region (repeatable)",
                           flag="--text", metavar="TEXT", list="repeat")
    pairs: list[str] = arg([], "its second text, for text-pair tasks (repeatable, one per --text)", flag="--pair",
                           metavar="TEXT", list="repeat")
    knockout: bool = arg(False, "add the fine-tuned model with each region knocked out (θ_ft − γ⊙δ: the region's "
                         "parameters back at θ_pre)")
    by: str | None = arg(None, "add the graft of one layer, or one module type, of the region at a time; cell: map "
                         "each layer × module part grafted alone and knocked out alone, as the change in the "
                         "probability of the fine-tuned model's answer (one --region)", choices=PROBE_PARTS)

    def looks(self) -> int:
        """How many models read each text, at most: the bare body, FT, each graft, each knockout and each part (a
        model's layers counted as PROBE_LAYERS, before its region is read)."""
        regions = len(self.regions)
        parts = {"layer": PROBE_LAYERS, "module": len(MODULE_TYPES),
                 "cell": 2 * PROBE_LAYERS * len(MODULE_TYPES)}.get(self.by or "", 0)  # a cell: grafted, knocked out
        return 2 + regions + (regions if self.knockout else 0) + parts

    def check(self) -> None:
        self.check_regions()
        if self.by and len(self.regions) != 1:
            raise RequestError(f"--by looks into one region, part by part, and {len(self.regions)} are given in "
                               "--region: keep one")  # worded for the page too, where each flag is a widget's label
        texts = [t for t in self.texts if isinstance(t, str) and t.strip()]
        if not texts or len(texts) != len(self.texts):
            raise RequestError("--text: give one or more sentences to classify (or prompts, for a completion region), "
                               "none of them empty")
        if any(len(t) > MAX_PREDICT_CHARS for t in [*self.texts, *self.pairs] if isinstance(t, str)):
            raise RequestError(f"--text: a text is longer than {MAX_PREDICT_CHARS:,} characters, the most one prediction "
                               "reads; give a shorter one (score a whole test set with evaluate)")
        if len(self.texts) > MAX_PREDICT_TEXTS:
            raise RequestError(f"{len(self.texts)} texts are more than {MAX_PREDICT_TEXTS} for one look; score a test "
                               "set with evaluate instead")
        if self.pairs and len(self.pairs) != len(self.texts):
            raise RequestError(f"--pair: give one second text per --text ({len(self.texts)}), got {len(self.pairs)}")


@dataclass
class SweepRequest(TrackFields, FinetuneReplicateFields, ReplicateFields, LoadFields, GraftableFields, LearnFields, OodFields, TaskFields, PairFields):
    """Localize at several budgets with several methods and test each graft (accuracy against region size)."""

    verb: ClassVar[str] = "sweep"
    sparsities: list[float] = arg([1e-4, 1e-3, 1e-2], "fractions of the graftable parameters", metavar="LIST",
                                  list="comma")
    methods: list[str] = arg(["learned", "top-movement", "random"], "localization methods", metavar="LIST",
                             list="comma")
    n: int | None = arg(None, "test examples per task (default all)", metavar="N")
    keep: str | None = arg(None, "folder to save every swept region in, as from localize (default: keep none)",
                           metavar="DIR")

    def check(self) -> None:
        if self.keep is not None and Path(self.keep).expanduser().exists() and not Path(self.keep).expanduser().is_dir():
            raise RequestError(f"--keep '{self.keep}' is a file; give a folder for the swept regions")
        if not self.sparsities:
            raise RequestError("--sparsities: give at least one value")
        for s in self.sparsities:
            check_sparsity(s)
        check_methods(self.methods)
        check_at_least_one("n", self.n)
        self.label_map()
        self.check_learning()
        self.check_modules()
        self.check_loading(learning=True)
        self.check_seeds()
        self.check_finetune_replicates()


@dataclass
class AnatomyRequest(Request):
    """Count a region's parameters per layer and module type, with densities."""

    verb: ClassVar[str] = "anatomy"
    region: str | None = arg(None, "region or skill patch (default: the newest in $GRAFTUI_HOME/regions)",
                             metavar="FILE")
    by: str = arg("cell", "rows per layer, per module type, or a layer × module grid", choices=("layer", "module", "cell"))
    replicates: list[str] = arg([], "another seed's region of the same localize run as --region (repeatable): how stable "
                                "each module type and layer is across the seeds", flag="--replicate", metavar="FILE",
                                list="repeat")
    ablate: bool = arg(False, "also score the graft without each layer's and each module type's part of the region "
                       "(put back to θ_pre) on the region's own task: what each part is worth (loads the region's pair)")
    n: int = arg(200, "test examples for --ablate (the sample evaluate scores with this n)", metavar="N")
    max_new_tokens: int | None = arg(None, "completion regions: tokens a model may generate per prompt, greedy "
                                     "(default: what the region was made with)", metavar="N")

    def check(self) -> None:
        if self.region is not None:
            check_region_file(self.region)
        for path in self.replicates:
            check_region_file(path)
        check_at_least_one("n", self.n)
        check_max_new_tokens(self.max_new_tokens)


@dataclass
class RegionsRequest(Request):
    """Every saved region with its pair, task, method, k, steps and seed, and the accuracy, ECE and share of the
    fine-tuning gain of its latest evaluation (graftui evaluate, the app's Compare), filtered and sorted."""

    verb: ClassVar[str] = "runs"  # graftui.runs(): graftui.regions is the module of region files
    instant: ClassVar[bool] = True
    aliases: ClassVar[tuple[str, ...]] = ("regions",)  # on the command line, graftui regions lists them too
    folder: str | None = arg(None, "folder of region files (default: $GRAFTUI_HOME/regions)", metavar="DIR")
    task: str | None = arg(None, "only regions learned on this task (its name, or its file's name)", metavar="REF")
    method: str | None = arg(None, "only regions of this method (learned, top-movement, random, union …)",
                             metavar="NAME")
    finetuned: str | None = arg(None, "only regions of this fine-tuned model (its reference, or its folder's name)",
                                metavar="REF")
    sort: str | None = arg(None, "column to sort by (default: the newest first)", choices=LISTING_COLUMNS)
    descending: bool = arg(False, "sort the largest, latest or last in the alphabet first")
    group_by: str | None = arg(None, "one row per budget, method or seed of the regions shown: how many runs and how "
                               "many scored, the mean, spread and range of their score, their mean ECE",
                               choices=tuple(GROUPS))
    diff: list[str] | None = arg(None, "two region ids (or files): the settings that tell the two runs apart",
                                 metavar="A,B", list="comma")

    def check(self) -> None:
        if self.folder is not None:
            if settings.hosted():
                raise RequestError("--folder: a hosted server lists only your own regions; drop --folder")
            path = Path(self.folder).expanduser()
            if not path.is_dir():
                raise RequestError(f"--folder '{self.folder}' is not a folder; give the folder your region files are in")
        for name in ("task", "method", "finetuned"):
            value = getattr(self, name)
            if value is not None and not str(value).strip():
                raise RequestError(f"{_name(name)}: give a value to filter by, or drop {_name(name)}")
        if self.diff is not None and (len(self.diff) != 2 or not all(isinstance(d, str) and d.strip()
                                                                     for d in self.diff)):
            raise RequestError(f"--diff takes two region ids, got {len(self.diff)}: give e.g. --diff a-seed0,a-seed1")


@dataclass
class ComposeRequest(TrackFields):
    """Overlap of regions and their union; with --evaluate, the union graft scored on every region's task."""

    verb: ClassVar[str] = "compose"
    writes: ClassVar[bool] = True
    regions: list[str] = arg([], "region or skill patch (give two or more)", flag="--region", metavar="FILE",
                             list="repeat")
    resolve: str = arg("mean", "value where patches overlap: mean of their movements (Localize-and-Stitch), their "
                       "sum (θ_pre + Σ γ_i⊙δ_i as written), first or last",
                       choices=RESOLVE_MODES)
    base: str | None = arg(None, H_BASE + " (default: the regions' own)", metavar="REF")
    evaluate: bool = arg(False, "score each task alone, in the union graft and on the bare body (with its own head); "
                         "regions of completion tasks are stitched (--stitch)")
    stitch: bool = arg(False, "Localize-and-Stitch: score the union θ_pre + Σ γ_i⊙δ_i on every region's task beside "
                       "each fine-tune alone and the merges of --merges (λ and density chosen on validation examples)")
    merges: list[str] = arg(list(MERGES), "the merges stitching is measured against: task-arithmetic (θ_pre + λ Σ δ_i), "
                            "ties (trim, elect sign, disjoint mean), dare (drop and rescale, then add) and consensus "
                            "(Σ δ_i where two or more tasks' TALL masks claim a parameter)", metavar="LIST", list="comma")
    lambdas: list[float] = arg([0.2, 0.4, 0.6, 0.8, 1.0], "the merges' λ grid, e.g. 0.2,0.5,1", metavar="LIST",
                               list="comma")
    densities: list[float] = arg([0.2, 0.5], "the density grid of ties and dare: the share of each δ_i they keep",
                                 metavar="LIST", list="comma")
    talls: list[float] = arg([0.4], "the TALL-mask grid of consensus: task i claims a parameter where |δ_i| ≥ "
                             "λ_t·|Σ_j δ_j − δ_i| (Wang et al. 2024 search 0.2 to 0.6)", metavar="LIST", list="comma")
    validation_n: int = arg(100, "validation examples per task that choose λ", metavar="N")
    n: int | None = arg(None, "test examples per task when evaluating (default all)", metavar="N")
    out: str | None = arg(None, "the union file: a skill patch when every input is one (or --evaluate made them "
                          "patches), a region otherwise (default: not written)", metavar="FILE")
    overwrite: bool = arg(False, "replace --out and the --report file if they exist (refused otherwise)")
    max_new_tokens: int | None = arg(None, "completion regions: tokens a model may generate per prompt, greedy "
                                     "(default: what the region was made with)", metavar="N")

    def merge_settings(self) -> int:
        """How many merges stitching scores on validation examples per task: each λ, times each value of the merge's
        second setting (density, TALL λ) where it has one."""
        if not (self.stitch or self.evaluate):
            return 0
        grids = [MERGES[m].grid if m in MERGES else None for m in self.merges]
        return sum(len(self.lambdas) * (len(getattr(self, g) or ()) if g else 1) for g in grids)

    def check(self) -> None:
        check_max_new_tokens(self.max_new_tokens)
        if len(self.regions) < 2:
            raise RequestError(f"compose needs at least two regions, got {len(self.regions)}")
        for path in self.regions:
            check_region_file(path)
        seen = [Path(p).expanduser().resolve() for p in self.regions]
        twice = next((p for i, p in enumerate(self.regions) if seen[i] in seen[:i]), None)
        if twice is not None and (self.stitch or self.evaluate):  # a union scored with one member twice
            raise RequestError(f"--region '{twice}' is given twice; give each region once")
        check_at_least_one("n", self.n)
        check_at_least_one("validation_n", self.validation_n)
        if not self.lambdas or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                       and 0 < x <= 2 for x in self.lambdas):
            raise RequestError(f"--lambdas: give the merges' λ values in (0, 2], e.g. 0.2,0.5,1; got {self.lambdas}")
        unknown = [m for m in self.merges if m not in MERGES]
        if not self.merges or unknown:
            raise RequestError(f"--merges: give one or more of {', '.join(MERGES)}"
                               + (f"; '{unknown[0]}' is none of them" if unknown else ""))
        if not self.densities or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                         and 0 < x <= 1 for x in self.densities):
            raise RequestError(f"--densities: give the shares of each δ_i that ties and dare keep, in (0, 1], e.g. "
                               f"0.2,0.5; got {self.densities}")
        if not self.talls or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                     and 0 < x <= 10 for x in self.talls):
            raise RequestError(f"--talls: give consensus's TALL-mask thresholds λ_t in (0, 10], e.g. 0.2,0.4; got "
                               f"{self.talls}")
        check_out_file(self.out, self.overwrite)


@dataclass
class ExportRequest(LoadFields):
    """Write θ_pre + γ⊙(θ_ft − θ_pre) as a normal Hugging Face checkpoint folder."""

    verb: ClassVar[str] = "export"
    writes: ClassVar[bool] = True
    region: str | None = arg(None, "skill patch, or region with --finetuned (default: the newest in "
                             "$GRAFTUI_HOME/regions)", metavar="FILE")
    base: str | None = arg(None, H_BASE + " (default: the region's own)", metavar="REF", group="models")
    finetuned: str | None = arg(None, "fine-tuned model; needed for a region without values", metavar="REF",
                                group="models")
    out: str | None = arg(None, "new folder (default $GRAFTUI_HOME/exports/<region name>)", metavar="DIR")

    def check(self) -> None:
        if self.region is not None:
            check_region_file(self.region)
        check_out_dir(self.out)
        self.check_loading()


@dataclass
class PushRequest(LoadFields):
    """Push a skill patch, or the grafted checkpoint, to the Hugging Face Hub with a generated model card.

    The token is the usual one (HF_TOKEN, or `hf auth login`); a hosted server's app pushes only with the visitor's
    own Hugging Face sign-in. The token is no field of the request: graftui never stores it.
    """

    verb: ClassVar[str] = "push"
    writes: ClassVar[bool] = True
    repo: str | None = arg(None, "Hub repository to create or update, as owner/name", metavar="ID")
    region: str | None = arg(None, "skill patch to push (default: the newest in $GRAFTUI_HOME/regions)", metavar="FILE")
    what: str = arg("patch", "patch: the skill patch file (small; needs the base model to apply); checkpoint: the "
                    "grafted model as a normal Hugging Face checkpoint", choices=("patch", "checkpoint"))
    base: str | None = arg(None, H_BASE + " (default: the region's own)", metavar="REF", group="models")
    finetuned: str | None = arg(None, "fine-tuned model; scores FT in the card, and is needed for a region without "
                                "values", metavar="REF", group="models")
    n: int | None = arg(500, "test examples to score the graft on for the card's metrics (0: no metrics)", metavar="N")
    private: bool = arg(False, "create the repository as private")
    out: str | None = arg(None, "write the files that would be pushed (card included) to this new folder and stop: "
                          "no network", metavar="DIR")

    def check(self) -> None:
        if not self.repo or not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", self.repo):
            raise RequestError(f"--repo must be owner/name, e.g. you/movies-skill-patch (got {self.repo!r})")
        if self.region is not None:
            check_region_file(self.region)
        if self.n is not None and self.n < 0:
            raise RequestError("--n must be 0 (no metrics) or more")
        check_out_dir(self.out)
        self.check_loading()


# -- the paper's experiments (flows in flows/laboratory.py) ------------------------------------------------------
@dataclass
class MultitaskRequest(TrackFields, ReplicateFields, RecipeFields, LearnFields):
    """One model fine-tuned on several tasks: each task's region, their overlap, the skill transfer of
    every region to every task (Eq. 5), the union of a group of tasks and its purification (§5.1)."""

    verb: ClassVar[str] = "multitask"
    trains: ClassVar[bool] = True
    writes: ClassVar[bool] = True
    base: str = arg(DEFAULT_BASE, H_BASE, metavar="REF", group="models")
    tasks: list[str] = arg(list(DEFAULT_MULTITASK_TASKS), "tasks of the multi-task model (two or more)", metavar="LIST",
                           list="comma", group="data")
    checkpoint: str | None = arg(None, "a multi-task fine-tune's folder (one sub-folder per task); default: built on "
                                 "first need from --base and --tasks with the default recipe, then reused",
                                 metavar="DIR", group="models")
    sparsity: float = arg(DEFAULT_SPARSITY, "each task's region, as a fraction of the graftable parameters",
                          metavar="F", group="region")
    start: str = arg("empty", "region the mask starts from: empty (the paper's multi-task setting) or top-movement",
                     choices=("empty", "top-movement"), group="region")
    group: list[str] | None = arg(None, "tasks whose regions form the union (default: all)", metavar="LIST",
                                  list="comma", group="region")
    purify_steps: int = arg(10, "mask steps on the group's joint loss, starting from the union (0: no purification)",
                            metavar="N", group="region")
    n: int | None = arg(None, "test examples per task (default all)", metavar="N")
    out: str | None = arg(None, "folder for the regions (default: new files in $GRAFTUI_HOME/regions)", metavar="DIR")

    def check(self) -> None:
        tasks = check_task_list(self.tasks)
        for t in self.group or []:
            if t not in tasks:
                raise RequestError(f"--group: '{t}' is not one of --tasks ({', '.join(tasks)})")
        if self.group is not None and (len(self.group) < 2 or len(set(self.group)) != len(self.group)):
            raise RequestError(f"--group: a union needs two or more different tasks, got {', '.join(self.group)}")
        check_sparsity(self.sparsity)
        if self.purify_steps < 0:
            raise RequestError(f"--purify-steps must be 0 or more, got {self.purify_steps}")
        check_at_least_one("n", self.n)
        self.check_learning()
        self.check_recipe()
        check_out_dir(self.out)
        self.check_seeds()


@dataclass
class RegionStudyFields(OodFields, TaskFields):
    """One region studied on its own pair and task (the defaults are the region's own), in and out of distribution."""

    region: str | None = arg(None, "region or skill patch γ (default: the newest in $GRAFTUI_HOME/regions)",
                             metavar="FILE")
    base: str | None = arg(None, H_BASE + " (default: the region's own)", metavar="REF", group="models")
    finetuned: str | None = arg(None, H_FT + " (default: the region's own)", metavar="REF", group="models")
    task: str | None = arg(None, H_TASK + " (default: the region's own)", metavar="REF", group="data")
    n: int | None = arg(None, "test examples per task (default all)", metavar="N")

    def check_region(self) -> None:
        if self.region is not None:
            check_region_file(self.region)
        check_at_least_one("n", self.n)
        self.label_map()


@dataclass
class WiseRequest(TrackFields, RegionStudyFields):
    """WiSE curves (Fig. 7): θ_pre + α·δ and θ_pre + α·γ⊙δ for α from 0 to 1, in and out of distribution."""

    verb: ClassVar[str] = "wise"
    alphas: list[float] = arg([round(0.1 * i, 1) for i in range(11)], "interpolation weights α in [0, 1]",
                              metavar="LIST", list="comma")
    replicates: list[str] | None = arg(None, "the same region from other mask seeds (e.g. the other files of a "
                                       "'localize --seeds' run): every curve becomes the mean ± std over --region "
                                       "and these", metavar="LIST", list="comma")

    def check(self) -> None:
        self.check_region()
        for path in self.replicates or ():
            check_region_file(path)
        if self.replicates is not None and not self.replicates:
            raise RequestError("--replicates: give at least one region file")
        if not self.alphas:
            raise RequestError("--alphas: give at least one value")
        for a in self.alphas:
            if not (isinstance(a, (int, float)) and 0 <= a <= 1):
                raise RequestError(f"--alphas: every α must be in [0, 1], got {a}")


@dataclass
class RetrainRequest(TrackFields, ReplicateFields, RecipeFields, RegionStudyFields):
    """Re-train only a region's parameters from θ_pre with the fine-tuning recipe (Table 1), against the
    fine-tuned model, the graft and BitFit (biases only), on accuracy and ECE."""

    verb: ClassVar[str] = "retrain"
    trains: ClassVar[bool] = True
    no_bitfit: bool = arg(False, "skip the BitFit baseline (train every bias, nothing else)")
    seed: int = arg(0, "seed of the training subsample and the batch order (the test examples are the same for every "
                    "seed)", metavar="N")

    def check(self) -> None:
        self.check_region()
        self.check_recipe()
        self.check_seeds()


@dataclass
class ContinualRequest(TrackFields, ReplicateFields, RecipeFields, LearnFields):
    """Forget-free continual learning (§5.2): task t_n trains only γ_{t_n} minus the earlier regions, and each
    task is inferred with the union of the regions up to its own; against naive sequential fine-tuning."""

    verb: ClassVar[str] = "continual"
    trains: ClassVar[bool] = True
    writes: ClassVar[bool] = True
    base: str = arg(DEFAULT_BASE, H_BASE, metavar="REF", group="models")
    tasks: list[str] = arg(list(DEFAULT_MULTITASK_TASKS), "the task sequence t_1 … t_n, in order (two or more)",
                           metavar="LIST", list="comma", group="data")
    sparsity: float = arg(DEFAULT_SPARSITY, "each task's region (from its own independent fine-tune), as a fraction of "
                          "the graftable parameters", metavar="F", group="region")
    n: int | None = arg(None, "test examples per task (default all)", metavar="N")
    out: str | None = arg(None, "folder for the regions (default: new files in $GRAFTUI_HOME/regions)", metavar="DIR")

    def check(self) -> None:
        check_task_list(self.tasks)
        check_sparsity(self.sparsity)
        check_at_least_one("n", self.n)
        self.check_learning()
        self.check_recipe()
        check_out_dir(self.out)
        self.check_seeds()


# -- everything at once (flow in flows/reproduction.py) --------------------------------------------------------
MANIFEST = "reproduce.json"  # marks a report folder that `graftui reproduce` wrote, and with which scale


REPRODUCE_SECTIONS = ("paper", "generative")  # the paper's experiments; its Fig. 5 on the offline completion skills


@dataclass
class ReproduceRequest(TrackFields):
    """The paper's experiments on the offline default, one after another, in one report (report.md, report.json,
    figures); every step is saved as it finishes, so a run that stops resumes where it stopped."""

    verb: ClassVar[str] = "reproduce"
    trains: ClassVar[bool] = True
    writes: ClassVar[bool] = True
    quick: bool = arg(False, "short fine-tunes, 300 test examples per task, fewer points per curve and a shorter task "
                      "sequence (about 15 minutes on 2 CPU cores, weaker models); the full run takes up to 2 hours")
    fresh: bool = arg(False, "run every step again instead of reusing the steps an earlier run saved in --out "
                      "(fine-tuned checkpoints are still reused from $GRAFTUI_HOME/checkpoints)")
    out: str | None = arg(None, "report folder: new, or one an earlier run of the same size wrote, to resume it "
                          "(default $GRAFTUI_HOME/reports/reproduce-quick or reproduce-full)", metavar="DIR")
    seeds: int | None = arg(None, "mask-learning seeds of the single-task steps (sweep, localize, evaluate): the report "
                            "gives mean (std) over them and decides each finding by its interval (default 3 for the "
                            "full run, 1 with --quick)", metavar="N")
    section: str = arg("paper", "'paper': the paper's experiments on the default classification pair; 'generative': "
                       "Fig. 5 on the offline completion skills (fine-tunes with SGD, AdamW and AdamW + ℓ1, each "
                       "localized at three budgets by four methods; the full run takes about 4 hours, --quick about 1)",
                       choices=REPRODUCE_SECTIONS)

    def check(self) -> None:
        if self.seeds is not None and not 1 <= self.seeds <= MAX_SEEDS:
            raise RequestError(f"--seeds: give a number of seeds from 1 to {MAX_SEEDS}, got {self.seeds}")
        if self.out is not None and (Path(self.out).expanduser() / MANIFEST).is_file():
            return  # an earlier run's folder: resumed (the flow checks that the run's size matches)
        check_out_dir(self.out)


def command_line(request: Request) -> str:
    """The ``graftui`` command that makes ``request``: its verb and every field that differs from the default."""
    def text(value) -> str:
        return repr(value) if isinstance(value, float) else str(value)

    parts = ["graftui", request.verb]
    defaults = type(request).defaults()
    for f in fields(request):
        value = getattr(request, f.name)
        if value == defaults[f.name] or value is None:
            continue
        flag = f.metadata.get("flag", _name(f.name))
        if isinstance(value, bool):
            parts += [flag] if value else []
        elif isinstance(value, list):
            if f.metadata.get("list") == "comma":
                parts += [flag, ",".join(text(v) for v in value)]
            else:
                for v in value:
                    parts += [flag, text(v)]
        else:
            parts += [flag, text(value)]
    return " ".join(shlex.quote(p) for p in parts)
