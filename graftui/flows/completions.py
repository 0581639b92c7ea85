"""The single-task verbs on completion tasks: what fine-tune, localize and evaluate do when the skill is a completion.

A completion pair is a causal LM read as itself (``models.CompletionLM``): mask learning takes its steps on the
supervised fine-tuning loss of the completion tokens, and a model is judged by what it generates
(``generation.compare_completions``). The verbs in ``single`` call these when their task is a completion task.

The model's context is the limit of every example and generation; what does not fit it (a completion longer than the
context, more tokens to generate than it holds) is refused by ``check_context`` and ``check_finetune`` before any
mask step, fine-tuning step or generation, and what it cuts is said in the notes.
"""

from __future__ import annotations

import random
from pathlib import Path

from .. import generation, settings, training
from ..scoring import TEST_SAMPLE_SEED
from ..completion import CompletionTask, batches, context_length, prompt_room
from ..config import COMPLETION, LoadOptions
from ..errors import DataError, ModelError
from ..models import context_of, load_reader, load_tokenizer
from .common import LOCAL, Guard, Progress

DEFAULT_TRAIN_SAMPLE = 256  # examples mask learning steps over (a completion task has no classes to count per)


def check_kind(options: LoadOptions) -> LoadOptions:
    """The reading of a pair for a completion task: the causal LM itself (a prompt or a classifier head the request
    gave is refused, naming what it gave)."""
    if options.head not in ("auto", "completion", "causal-lm"):
        raise ModelError(f"--head {options.head}: a completion task is scored on a causal LM's own completions; drop "
                         "--head or give --head completion")
    if options.prompted():
        given = [flag for flag, value in (("--template", options.template), ("--label-words", options.label_words),
                                          ("--label-scoring", options.label_scoring != "first")) if value]
        raise ModelError(f"{' and '.join(given)} read a language model as a classifier; a completion task scores the "
                         f"model's own completions: drop {'it' if len(given) == 1 else 'them'}")
    return LoadOptions(head="completion", dtype=options.dtype, device_map=options.device_map)


def check_classification(options: LoadOptions, task) -> None:
    """Refuse --head completion on a classification task: it reads a causal LM on its own completions, and the task
    has labels to score."""
    if options.head == COMPLETION:
        raise ModelError(f"--head completion reads a causal LM on its own completions, and '{task.name}' is a "
                         "classification task: drop --head completion, or give a completion task as --task")


def check_region_kind(label: str, meta, task) -> None:
    """Refuse a region learned on one kind of task (its recorded reading) scored on a task of the other kind: its
    pair is read as that kind, whatever the request gives."""
    made = COMPLETION if (getattr(meta, "loading", None) or {}).get("head") == COMPLETION else "classification"
    asked = COMPLETION if isinstance(task, CompletionTask) else "classification"
    if made != asked:
        learned = f" '{meta.task}'" if getattr(meta, "task", None) else ""
        raise ModelError(f"'{label}' was learned on the {made} task{learned}, and '{task.name}' is a {asked} task: "
                         f"score it on its own task (drop --task), or give a region learned on a {asked} task")


def train_sample(task: CompletionTask, req, notes: list[str]):
    """The examples mask learning uses: ``--examples-per-class`` of the training split in all (a completion task
    has no classes), by default up to DEFAULT_TRAIN_SAMPLE, drawn with the request's seed."""
    train = task.splits["train"]
    want = req.examples_per_class if req.examples_per_class is not None else DEFAULT_TRAIN_SAMPLE
    if req.examples_per_class is not None and want > len(train):
        raise DataError(f"--examples-per-class {want} is more than the {len(train):,} training examples of "
                        f"'{task.name}' (a completion task counts its examples in all)")
    if want < len(train):
        train = train.select(sorted(random.Random(req.seed).sample(range(len(train)), want)))
    elif req.examples_per_class is None:
        notes.append(f"task '{task.name}' has {len(train):,} training examples: mask learning uses them all "
                     f"(default {DEFAULT_TRAIN_SAMPLE})")
    return train


def mask_batches(pair, task: CompletionTask, req, notes: list[str], seed_offset: int = 0):
    """Mask learning's data on a completion task: ``make_batches(epoch)`` of (prompt, completion) tokens with the
    prompt masked out of the loss, and how many examples they hold."""
    train = train_sample(task, req, notes)
    config = req.learn_config()
    context = context_length(pair.model)
    add(notes, generation.fit(pair.tokenizer, task, train, context))  # refuses a completion longer than the context

    def make_batches(epoch: int):
        return batches(pair.tokenizer, train, task.chat, config.batch_size, context,
                       shuffle_seed=config.seed + seed_offset + epoch)

    return make_batches, len(train)


def add(notes: list[str], more) -> None:
    notes += [n for n in more if n not in notes]


def check_context(pair, task: CompletionTask, req, notes: list[str], n: int | None = 0, meta=None,
                  guard: Guard = LOCAL) -> None:
    """Before any mask step or generation: the tokens the request generates leave room for a prompt in the pair's
    context, and the ``n`` test examples a check will judge (all with None, none with 0) fit it; what the context
    cuts goes to ``notes``."""
    _, new = judging(req, meta, guard)
    context = context_length(pair.model)
    prompt_room(context, new)
    if n != 0:
        add(notes, generation.fit(pair.tokenizer, task, generation.sample(task, "test", n, TEST_SAMPLE_SEED), context,
                                  new))


def check_finetune(req, task: CompletionTask, config, allow: bool, notes: list[str]) -> None:
    """Before any fine-tuning step: the training examples the recipe takes and the test examples its score judges fit
    the base's context (read from its config), with room for the tokens to generate; what it cuts goes to ``notes``."""
    context = context_of(req.base, allow_local=allow)
    tokenizer = load_tokenizer(req.base, allow_local=allow)
    _, new = judging(req)
    prompt_room(context, new)
    add(notes, generation.fit(tokenizer, task, training.completion_split(task, config), context))
    add(notes, generation.fit(tokenizer, task, generation.sample(task, "test", req.test_examples, TEST_SAMPLE_SEED),
                              context, new))


def finetune(req, task: CompletionTask, config, out: Path, progress: Progress | None, cancel, allow: bool) -> None:
    """Supervised fine-tuning of ``req.base`` on the completions (``training.finetune_completions``)."""
    check_kind(req.load_options())

    def step(p):
        if progress:
            progress({"stage": f"fine-tuning on {task.name}", **p.__dict__})

    training.finetune_completions(req.base, task, config, out, progress=step, cancel=cancel, allow_local=allow,
                                  request=req.as_dict())


def test_score(out: Path, task: CompletionTask, req) -> tuple[float, int, float]:
    """The fine-tuned checkpoint's exact match on the test split (``req.test_examples`` of it), with n and its loss
    per token."""
    options = req.load_options()
    model, tokenizer, _ = load_reader(str(out), "completion", None, LoadOptions(head="completion", dtype=options.dtype))
    data = generation.sample(task, "test", req.test_examples, TEST_SAMPLE_SEED)
    rule, new = judging(req)
    reading = generation.read(model.eval().to(settings.device()), tokenizer, task, data, rule, new)
    return float(reading.hits.mean()), len(data), reading.forced.loss()


def quick_check(pair, task: CompletionTask, models: dict, req, progress=None, cancel=None) -> dict:
    """A region's held-out score right after localize: ``req.check_n`` test examples, beside FT and the pre-trained
    model, with paired differences."""
    rule, new = judging(req)
    part = generation.compare_completions(pair, task, models, n=req.check_n, seed=TEST_SAMPLE_SEED, rule=rule,
                                          max_new_tokens=new, progress=progress, cancel=cancel)
    return {"task": task.name, "n": part["rows"][0]["n"], "rows": part["rows"], "differences": part["differences"],
            "generations": part["generations"]}


def judging(req, meta=None, guard: Guard = LOCAL) -> tuple[generation.AnswerRule, int]:
    """The answer rule and generation length of a request; what it leaves at the default comes from the request that
    made the region (``meta``), so a region is judged as it was made unless asked otherwise. The rule judged by passes
    the guard, whether the request or the region file gave its regex."""
    new = getattr(req, "max_new_tokens", None)  # None: not asked
    asked = req.answer_rule() if hasattr(req, "answer_rule") else generation.AnswerRule()
    if meta is None:
        return guard.checked_rule(asked, "the request"), new or generation.MAX_NEW_TOKENS
    made, made_new = recorded_rule(meta)
    rule = generation.AnswerRule(regex=asked.regex if asked.regex is not None else made.regex,
                                 ignore_case=asked.ignore_case or made.ignore_case,
                                 first_line=asked.first_line and made.first_line)
    return guard.checked_rule(rule, "the request" if asked.regex is not None else "this region file"), \
        new or made_new


def evaluate(req, pair, task: CompletionTask, models: dict, contrasts: list, progress=None, cancel=None,
             meta=None, guard: Guard = LOCAL) -> dict:
    """FT, the pre-trained model and every graft on the completion task: rows, paired differences, generations;
    judged by the request's answer rule, the region's own (``meta``) where the request is silent."""
    rule, new = judging(req, meta, guard)
    return generation.compare_completions(pair, task, models, n=req.n, seed=TEST_SAMPLE_SEED, contrasts=contrasts,
                                          rule=rule, max_new_tokens=new, progress=progress, cancel=cancel)


def recorded_rule(meta) -> tuple[generation.AnswerRule, int]:
    """The answer rule and generation length a region's own request asked for (the defaults where it is silent)."""
    asked = {k: v for k, v in (getattr(meta, "request", None) or {}).items()
             if k in ("answer_regex", "ignore_case", "whole_generation", "max_new_tokens")}
    rule = generation.AnswerRule(regex=asked.get("answer_regex") if isinstance(asked.get("answer_regex"), str) else None,
                                 ignore_case=asked.get("ignore_case") is True,
                                 first_line=asked.get("whole_generation") is not True)
    new = asked.get("max_new_tokens")
    return rule, new if isinstance(new, int) and not isinstance(new, bool) and 0 < new <= 1024 else \
        generation.MAX_NEW_TOKENS


__all__ = ["DEFAULT_TRAIN_SAMPLE", "check_classification", "check_context", "check_finetune", "check_kind",
           "check_region_kind", "judging", "recorded_rule", "evaluate",
           "finetune", "mask_batches", "quick_check", "test_score", "train_sample"]
