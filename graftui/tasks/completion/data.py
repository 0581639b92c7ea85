"""Completion tasks: what a model learned from (prompt, completion) pairs, as supervised fine-tuning data is written.

A classification task scores label words; a completion task scores the tokens of each completion given its
prompt (the prompt is masked out of the loss, as in supervised fine-tuning) and is judged by what the model
generates. An example is a conversation of (role, text) turns. A prompt/completion pair is one user turn and one
assistant turn read as plain text, the prompt then the completion and the end-of-text token; a ``messages``
example is rendered with the tokenizer's own chat template, and every assistant turn is scored.

The model's context (its config's ``n_positions`` or ``max_position_embeddings``: ``context_length``) is the limit:
an example longer than it loses the start of its prompt, never a scored token, and a prompt to generate from keeps
room for the tokens to generate (``prompt_room``); a completion longer than the context, or more tokens to generate
than it holds, is refused before any work.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..classification.data import SPLIT_NAMES, carve
from ..sources import check_named, pick_split, read_tables
from ...errors import ColumnsMissing, DataError

PROMPT_GUESSES = ("prompt", "question", "instruction", "input", "query")
COMPLETION_GUESSES = ("completion", "answer", "response", "output", "target", "solution")
MESSAGES_GUESSES = ("messages", "conversation", "conversations", "chat")
ROLES = ("system", "user", "assistant")
IGNORE = -100  # the label the loss skips: prompt tokens and padding
CONTEXT_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length", "seq_length")

Turn = tuple[str, str]  # (role, text)


@dataclass(frozen=True)
class Completions:
    """The examples of one split, each a tuple of (role, text) turns ending in an assistant turn."""

    examples: tuple[tuple[Turn, ...], ...]

    def __len__(self) -> int:
        return len(self.examples)

    def select(self, indices: Sequence[int]) -> "Completions":
        return Completions(tuple(self.examples[i] for i in indices))

    @property
    def references(self) -> tuple[str, ...]:
        """Each example's last assistant turn: what a model's generation is compared with."""
        return tuple(example[-1][1] for example in self.examples)


@dataclass(frozen=True)
class CompletionTask:
    """A completion task with the three splits the rest of graftui relies on."""

    name: str
    splits: dict[str, Completions]
    source: str  # human-readable provenance
    chat: bool = False  # rendered with the tokenizer's chat template (a messages column), else plain text
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        missing = [s for s in SPLIT_NAMES if s not in self.splits]
        if missing:
            raise DataError(f"task '{self.name}' lacks the split(s) {', '.join(missing)}")


@dataclass(frozen=True)
class CompletionSpec:
    """How to read a file or Hub dataset as a completion task; anything left as None is guessed."""

    config: str | None = None
    prompt_column: str | None = None
    completion_column: str | None = None
    messages_column: str | None = None
    train_split: str | None = None
    validation_split: str | None = None
    test_split: str | None = None


# -- the offline skills ----------------------------------------------------------------------------
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
SKILL_SEED = 0


def number_words(n: int) -> str:
    """0–999 in English words as a style guide writes them: 'forty-two', 'three hundred five'."""
    if not 0 <= n <= 999:
        raise ValueError(f"number_words covers 0–999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))


def _dates() -> list[tuple[str, str]]:
    """5,000 distinct dates of 1900–2099 (days 1–28, so every month has them), in a fixed order."""
    rng, seen = random.Random(SKILL_SEED), {}
    while len(seen) < 5000:
        y, m, d = rng.randint(1900, 2099), rng.randint(1, 12), rng.randint(1, 28)
        seen.setdefault((y, m, d), None)
    return [(f"Date: {y:04d}-{m:02d}-{d:02d}\nIn words:", f" {MONTHS[m - 1]} {d}, {y}") for y, m, d in seen]


def _numbers() -> list[tuple[str, str]]:
    order = list(range(1000))
    random.Random(SKILL_SEED).shuffle(order)
    return [(f"Number: {n}\nIn words:", f" {number_words(n)}") for n in order]


OFFLINE_SKILLS = {  # name -> (what it is, its examples, test and validation sizes)
    "dates": ("ISO dates (1900–2099) written out, '2019-07-04' → 'July 4, 2019'; 5,000 distinct dates from a "
              "seeded generator", _dates, 500, 200),
    "numbers": ("whole numbers 0–999 in English words, '347' → 'three hundred forty-seven'; the test numbers are "
                "never trained on", _numbers, 200, 100),
}


def offline_skill(name: str) -> CompletionTask:
    """A generative skill made here, the same examples every time: every item is distinct, so the test split holds
    items the training split never has."""
    description, make, n_test, n_validation = OFFLINE_SKILLS[name]
    examples = [(("user", prompt), ("assistant", answer)) for prompt, answer in make()]
    cut = {"test": examples[:n_test], "validation": examples[n_test:n_test + n_validation],
           "train": examples[n_test + n_validation:]}
    return CompletionTask(name, {s: Completions(tuple(cut[s])) for s in SPLIT_NAMES}, f"offline skill: {description}")


# -- reading ---------------------------------------------------------------------------------------
def _guess(columns: Sequence[str], spec: CompletionSpec) -> CompletionSpec:
    """The columns the spec leaves open, from common names (case-insensitive): a messages column only when no
    prompt or completion column is named."""
    lower = {c.lower(): c for c in reversed(list(columns))}
    named = spec.prompt_column or spec.completion_column
    messages = spec.messages_column or (None if named else next((lower[c] for c in MESSAGES_GUESSES if c in lower),
                                                                  None))
    if messages:
        return CompletionSpec(**{**spec.__dict__, "messages_column": messages})
    prompt = spec.prompt_column or next((lower[c] for c in PROMPT_GUESSES if c in lower), None)
    completion = spec.completion_column or next((lower[c] for c in COMPLETION_GUESSES if c in lower), None)
    return CompletionSpec(**{**spec.__dict__, "prompt_column": prompt, "completion_column": completion})


def completion_columns(columns: Sequence[str]) -> CompletionSpec | None:
    """The columns a file would be read by as a completion task, from their names alone: a messages column, or both a
    prompt and a completion column; None when they do not say so."""
    spec = _guess(columns, CompletionSpec())
    return spec if spec.messages_column or (spec.prompt_column and spec.completion_column) else None


class NoCompletionColumns(ColumnsMissing):
    """The source has no (prompt, completion) or messages columns: it is no completion task as it stands. ``fits``:
    it has one of the two (a completion file missing the other), so it is read as one rather than as a classification
    task."""


def _check_columns(spec: CompletionSpec, columns: list[str], name: str) -> None:
    check_named(spec, ("prompt_column", "completion_column", "messages_column"), columns, name)
    available = ", ".join(columns)
    if spec.messages_column:
        return
    if spec.completion_column is None:
        if spec.prompt_column is not None:
            raise NoCompletionColumns(f"{name} has a prompt column ('{spec.prompt_column}') but no completion column: name it "
                                      "with --completion-column (and the prompt's with --prompt-column if it is not "
                                      f"'{spec.prompt_column}'); available columns: {available}", True)
        raise NoCompletionColumns(f"{name} has no completion column: name it with --completion-column (or give a messages "
                                  f"column in the chat format); available columns: {available}", False)
    if spec.prompt_column is None:
        raise NoCompletionColumns(f"{name} has a completion column ('{spec.completion_column}') but no prompt column: name it "
                                  "with --prompt-column (and the completion's with --completion-column if it is not "
                                  f"'{spec.completion_column}'); available columns: {available}", True)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _turns(value: Any, where: str) -> tuple[Turn, ...]:
    """A messages cell as turns: a list of {"role", "content"} (or its JSON text), ending in an assistant turn."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise DataError(f"{where}: the messages cell is not a list of {{'role', 'content'}} turns") from None
    if hasattr(value, "tolist"):  # a Parquet list column reads as an array
        value = value.tolist()
    if not isinstance(value, list) or not value or not all(isinstance(t, dict) for t in value):
        raise DataError(f"{where}: the messages cell is not a list of {{'role', 'content'}} turns")
    turns = []
    for turn in value:
        role, content = turn.get("role"), turn.get("content")
        if role not in ROLES or not isinstance(content, str):
            raise DataError(f"{where}: a turn needs a role ({', '.join(ROLES)}) and a text content, got {turn!r:.80}")
        turns.append((role, content))
    if turns[-1][0] != "assistant" or not turns[-1][1].strip():
        raise DataError(f"{where}: the conversation must end in an assistant turn with text (the completion)")
    return tuple(turns)


def _examples(rows: list[dict], spec: CompletionSpec, name: str, split: str) -> list[tuple[Turn, ...]]:
    out, empty = [], []
    for i, row in enumerate(rows):
        where = f"{name}, split '{split}', row {i + 1}"
        if spec.messages_column:
            out.append(_turns(row.get(spec.messages_column), where))
            continue
        prompt, completion = row.get(spec.prompt_column), row.get(spec.completion_column)
        if _missing(completion) or not str(completion).strip():
            empty.append(i + 1)
            continue
        out.append((("user", "" if _missing(prompt) else str(prompt)), ("assistant", str(completion))))
    if empty:
        raise DataError(f"{len(empty):,} row(s) of {name} (split '{split}', first row {empty[0]}) have an empty "
                        f"completion in column '{spec.completion_column}': fill them or drop those rows")
    return out


def load_completion_task(ref: str | os.PathLike, spec: CompletionSpec = CompletionSpec(), *,
                         allow_local: bool = True) -> CompletionTask:
    """An offline skill (``OFFLINE_SKILLS``), a local file or folder, or a Hub dataset, as a three-split completion
    task; splits the source lacks are cut from its train split (or from all its rows) as a classification task's are."""
    if str(ref).strip().lower() in OFFLINE_SKILLS:
        return offline_skill(str(ref).strip().lower())
    name, source, tables = read_tables(ref, spec.config, allow_local=allow_local)
    keys = {role: pick_split(list(tables), getattr(spec, f"{role}_split"), role) for role in SPLIT_NAMES}
    first = tables[keys["train"]] if keys["train"] else next(rows for rows in tables.values() if rows)
    columns = list(first[0]) if first else []
    spec = _guess(columns, spec)
    _check_columns(spec, columns, name)
    if keys["train"] is None:  # one pool of examples: every split is cut from it
        pool = Completions(tuple(e for split, rows in tables.items() for e in _examples(rows, spec, name, split)))
        splits = {role: pool.select(idx) for role, idx in carve(len(pool)).items()}
    else:
        given = {role: Completions(tuple(_examples(tables[key], spec, name, key)))
                 for role, key in keys.items() if key is not None}
        missing = [role for role in ("validation", "test") if role not in given]
        cut = carve(len(given["train"]), missing) if missing else {}
        splits = {**{role: given["train"].select(idx) for role, idx in cut.items()}, **given}
        if cut:
            splits["train"] = given["train"].select(cut["train"])
    if not len(splits["train"]):
        raise DataError(f"{name} has no training examples")
    return CompletionTask(name, {s: splits[s] for s in SPLIT_NAMES}, source, chat=bool(spec.messages_column))


# -- tokens ------------------------------------------------------------------------------------------
def _render_chat(tokenizer: Any, turns: tuple[Turn, ...]) -> list[tuple[str, bool]]:
    """The conversation as text pieces, each marked scored (an assistant turn as the template writes it) or not."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("this tokenizer has no chat template, so a messages column cannot be rendered: give prompt "
                        "and completion columns instead, or a model whose tokenizer has one")
    messages = [{"role": role, "content": text} for role, text in turns]
    pieces, done = [], ""
    for i, (role, _) in enumerate(turns):
        if role != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True) if i else ""
        upto = tokenizer.apply_chat_template(messages[:i + 1], tokenize=False)
        if not before.startswith(done) or not upto.startswith(before):
            raise DataError("this tokenizer's chat template does not write a conversation as the sum of its turns, so "
                            "the assistant's turns cannot be told apart: give prompt and completion columns instead")
        pieces += [(before[len(done):], False), (upto[len(before):], True)]
        done = upto
    return pieces


def tokens(tokenizer: Any, example: tuple[Turn, ...], chat: bool) -> tuple[list[int], list[bool]]:
    """An example's token ids and which of them are scored (the completion, or every assistant turn)."""
    if chat:
        pieces = _render_chat(tokenizer, example)
    else:
        (_, prompt), (_, completion) = example
        pieces = [(prompt, False), (completion, True)]
    ids, scored = [], []
    for i, (text, score) in enumerate(pieces):
        special = not chat and i == 0  # a plain prompt starts as the tokenizer starts any text (its BOS, if any)
        part = tokenizer(text, add_special_tokens=special)["input_ids"] if text else []
        ids += part
        scored += [score] * len(part)
    if not chat and tokenizer.eos_token_id is not None:  # the completion ends: generation learns to stop
        ids.append(tokenizer.eos_token_id)
        scored.append(True)
    return ids, scored


def context_length(model) -> int | None:
    """The tokens ``model`` (or its config) attends over: its config's ``n_positions``, ``max_position_embeddings``
    (or another name for it); None when the config names none, and nothing is cut for it."""
    config = getattr(model, "config", model)
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def prompt_room(context: int | None, max_new_tokens: int) -> int | None:
    """The tokens a prompt may keep so that ``max_new_tokens`` generated after it stay in the context (None: no
    limit); refused when the tokens to generate leave no room for a prompt."""
    if context is None:
        return None
    if max_new_tokens >= context:
        raise DataError(f"--max-new-tokens {max_new_tokens:,} leaves no room for a prompt in the model's context of "
                        f"{context:,} tokens: give --max-new-tokens {context - 1:,} or fewer")
    return context - max_new_tokens


def encode(tokenizer: Any, split: Completions, chat: bool, max_length: int | None,
           name: str = "") -> tuple[list[list[int]], list[list[int]], int]:
    """(input ids, labels, how many examples were cut): labels are the ids on scored tokens and IGNORE elsewhere; an
    example longer than ``max_length`` (the model's context; None: no limit) loses the start of its prompt, and one
    whose scored tokens alone are longer is refused."""
    inputs, labels, cut = [], [], 0
    for i, example in enumerate(split.examples):
        ids, scored = tokens(tokenizer, example, chat)
        over = len(ids) - max_length if max_length is not None else 0
        if over > 0:
            first = scored.index(True) if True in scored else len(ids)
            if over > first:
                where = f"example {i + 1}" + (f" of {name}" if name else "")
                raise DataError(f"{where} has {len(ids) - first:,} completion tokens, more than the model's context of "
                                f"{max_length:,} tokens: shorten its completion or drop the example (a completion is "
                                "never cut), or give a model with a longer context")
            ids, scored, cut = ids[over:], scored[over:], cut + 1
        inputs.append(ids)
        labels.append([t if s else IGNORE for t, s in zip(ids, scored)])
    return inputs, labels, cut


def truncation_note(name: str, cut: int, total: int, max_length: int | None, new_tokens: int = 0) -> tuple[str, ...]:
    """The note a cut leaves: how many examples lost the start of their prompt to the model's context
    (``max_length``), or, with ``new_tokens``, how many prompts to generate from were cut to leave room for them."""
    if not cut or max_length is None:
        return ()
    if new_tokens:
        return (f"{name}: {cut:,} of {total:,} prompts were longer than the {max_length - new_tokens:,} tokens the "
                f"model's context of {max_length:,} leaves beside {new_tokens:,} new tokens, and were generated from "
                "their last tokens (lower --max-new-tokens to keep more of them)",)
    return (f"{name}: {cut:,} of {total:,} examples were longer than the model's context of {max_length:,} tokens and "
            "lost the start of their prompt (never a completion token)",)


def token_accuracy(logits, labels) -> tuple[int, int]:
    """(right, scored): how many scored tokens the model predicts from the tokens before them (greedy, teacher
    forced), and how many there are."""
    predicted, target = logits[:, :-1].argmax(-1), labels[:, 1:]
    scored = target != IGNORE
    return int((predicted.eq(target) & scored).sum()), int(scored.sum())


def batches(tokenizer: Any, split: Completions, chat: bool, batch_size: int, max_length: int | None, *,
            shuffle_seed: int | None = None) -> Iterator[dict]:
    """Batches padded on the right to their own longest example, with "labels" (IGNORE on prompt and padding)."""
    import torch

    if batch_size < 1:
        raise DataError(f"batch_size must be at least 1, got {batch_size}")
    inputs, labels, _ = encode(tokenizer, split, chat, max_length)
    order = list(range(len(inputs)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        width = max(len(inputs[i]) for i in chosen)
        ids = [inputs[i] + [pad] * (width - len(inputs[i])) for i in chosen]
        mask = [[1] * len(inputs[i]) + [0] * (width - len(inputs[i])) for i in chosen]
        lab = [labels[i] + [IGNORE] * (width - len(labels[i])) for i in chosen]
        yield {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "labels": torch.tensor(lab)}


__all__ = ["CompletionSpec", "CompletionTask", "Completions", "IGNORE", "NoCompletionColumns", "OFFLINE_SKILLS", "batches",
           "context_length", "encode", "load_completion_task", "number_words", "offline_skill", "prompt_room",
           "token_accuracy", "tokens", "truncation_note"]
