"""How a completion skill is judged: what a causal LM generates for each prompt, and how well it predicts the reference.

Two readings of one model on one split, both over the same examples so that two models can be compared pair by pair:

* **generation**: greedy decoding of every prompt (batched, left-padded, bounded by ``max_new_tokens``; a prompt keeps
  its last tokens so that it and its generation stay in the model's context), then the answer of each (``AnswerRule``:
  the first line, an extraction regex, regexes to ignore, case, punctuation, whitespace) against the reference's,
  three ways: exact match, whether it contains the reference's answer, and token F1;
* **teacher forcing**: the reference completion's tokens scored given everything before them — the loss per token
  (the supervised fine-tuning loss; its exponential is the perplexity) and a token-level calibration error (the
  probability of the argmax token against whether it is the reference token).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import random
import string
import threading
import unicodedata
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Callable

import regex
import torch

from ... import metrics
from .data import IGNORE, Completions, context_length, encode, prompt_room, tokens, truncation_note
from ...config import FT_LABEL, LM_BODY_LABEL
from ...errors import Cancelled, DataError
from ...metrics import COMPLETION_METRICS
from ..grafts import kept_reference, region_size, state_of

MAX_NEW_TOKENS = 32
GENERATION_BATCH = 32
ANSWER_PASSES = 4  # a scored example of a generating kind, its answer written token by token on a cache, then read
# teacher-forced: about four passes (measured: the default localization of smollm2-dates, 40 steps and a check of 200
# prompts by 4 models, took 263 s on 2 CPU cores, foreseen 292 s)
GENERATING_SHARE = (ANSWER_PASSES - 1) / ANSWER_PASSES  # of a model's reading, its generations; the rest teacher-forced


MAX_REGEX_CHARS = 500  # an answer regex longer than this is no answer rule
MAX_REGEX_REPEATS = 10_000  # nor is one whose counted repeats ({n}) multiply past this: compiling expands them
REGEX_SECONDS = 0.25  # one search's budget: a sane answer regex takes microseconds; one that backtracks never ends
MAX_IGNORED = 8  # regexes to ignore in one rule: each runs on every answer and every reference
WHITESPACE = ("collapse", "remove", "keep")  # how an answer's spaces are compared


def _punctuation(c: str) -> bool:
    """The harness's punctuation (Python's ``string.punctuation``) and every Unicode punctuation mark, so that curly
    quotes and dashes go as straight ones do."""
    return c in string.punctuation or unicodedata.category(c).startswith("P")


@dataclass(frozen=True)
class AnswerRule:
    """What of a generation counts as its answer, the same rule for the reference, in this order (the names are
    lm-evaluation-harness's where it has one: its ``regex`` filter and its ``exact_match`` options):

    1. ``first_line``: the first line, when the reference is one line (the harness's ``until: ["\\n"]``);
    2. ``regex``: its first group in the first match, or the whole match; a text without a match has no answer;
    3. ``regexes_to_ignore``: every match of each is removed, in order;
    4. ``ignore_case``: lower case;
    5. ``ignore_punctuation``: every punctuation mark removed (quotes included);
    6. ``whitespace``: ``collapse`` (runs of whitespace are one space, none at the ends), ``remove`` (none left:
       '1 000' is '1000'), or ``keep`` (as written).

    Every regex comes from a user, a region file or a bundle, so it is run by the ``regex`` engine under a time budget
    per search (``REGEX_SECONDS``): a pattern that backtracks for ever (``(a|aa)+$``) ends in one line, not a hang;
    the engine releases the interpreter lock while it searches, so a server keeps answering meanwhile. A rule read
    from JSON may give ``regexes_to_ignore`` as a list: it is kept as a tuple, so the rule stays hashable."""

    regex: str | None = None
    ignore_case: bool = False
    first_line: bool = True
    ignore_punctuation: bool = False
    regexes_to_ignore: tuple[str, ...] = ()
    whitespace: str = "collapse"

    def __post_init__(self):
        ignored = tuple(self.regexes_to_ignore or ())
        if not (self.regex is None or isinstance(self.regex, str)) or not all(isinstance(p, str) for p in ignored):
            raise DataError(f"an answer rule's regexes are text, got {self.regex!r:.60} and {ignored!r:.60}: write "
                            r"them as '#### (\S+)'")
        if self.whitespace not in WHITESPACE:
            raise DataError(f"whitespace '{self.whitespace!s:.40}' is no way of comparing answers: choose from "
                            f"{', '.join(WHITESPACE)}")
        object.__setattr__(self, "regexes_to_ignore", ignored)

    def describe(self, max_new_tokens: int) -> str:
        """The rule in words, for the card: what every number of exact match, contains and token F1 was decided by."""
        answer = f"the first match of '{self.regex}'" if self.regex else \
            "the first line (of one-line references)" if self.first_line else "the whole generation"
        if self.regex and self.first_line:
            answer += " in the first line (of one-line references)"
        steps = [f"greedy, at most {max_new_tokens} new tokens; answer: {answer}"]
        steps += [f"matches of '{p}' removed" for p in self.regexes_to_ignore]
        steps += ["case ignored"] * self.ignore_case + ["punctuation ignored"] * self.ignore_punctuation
        steps.append({"collapse": "whitespace collapsed", "remove": "whitespace removed",
                      "keep": "whitespace kept"}.get(self.whitespace, self.whitespace))
        return "; ".join(steps)

    def compiled(self):
        """The compiled answer regex (None without one); a bad pattern is one line."""
        return _compile(self.regex, "answer regex") if self.regex else None

    def ignored(self) -> tuple:
        """The compiled regexes to ignore; too many, or a bad one, is one line."""
        if len(self.regexes_to_ignore) > MAX_IGNORED:
            raise DataError(f"{len(self.regexes_to_ignore)} regexes to ignore are over {MAX_IGNORED}: give at most "
                            f"{MAX_IGNORED} (--ignore-regex; --ignore-regex '' judges without a region's own)")
        return tuple(_compile(p, "ignore regex") for p in self.regexes_to_ignore if p)

    def answer(self, text: str, reference: str | None = None) -> str | None:
        """The answer in ``text`` (None where the regex finds none); ``reference`` decides the first-line cut."""
        if self.first_line and "\n" not in (reference if reference is not None else text).strip():
            text = text.strip().split("\n", 1)[0]
        pattern = self.compiled()
        if pattern is not None:
            found = _timed(pattern.search, "answer regex", self.regex, text)
            if found is None:
                return None
            text = found.group(1) if found.groups() else found.group(0)
        for ignore in self.ignored():
            text = _timed(functools.partial(ignore.sub, ""), "ignore regex", ignore.pattern, text)
        if self.ignore_case:
            text = text.lower()
        if self.ignore_punctuation:
            text = "".join(c for c in text if not _punctuation(c))
        if self.whitespace == "collapse":
            return " ".join(text.split())
        return "".join(text.split()) if self.whitespace == "remove" else text

    def check(self, references) -> None:
        """Refuse a rule under which every exact match would be decided before any model runs: a regex that finds no
        answer in any reference, or filters that leave every reference's answer empty."""
        self.ignored()
        if not references:
            return
        wanted = [self.answer(r, r) for r in references]
        if self.compiled() is not None and all(w is None for w in wanted):
            raise DataError(f"the answer regex '{self.regex}' matches none of the references (e.g. "
                            f"{references[0].strip()[:60]!r}): fix the regex or drop it")
        if (self.regexes_to_ignore or self.ignore_punctuation) and not any(wanted):
            raise DataError(f"the answer rule leaves every reference's answer empty (e.g. "
                            f"{references[0].strip()[:60]!r}): drop the --ignore-regex or --ignore-punctuation that "
                            "removes it")


def _timed(run: Callable, what: str, pattern: str, text: str):
    """``run(text)``: one search or substitution of a rule's regex, under ``REGEX_SECONDS``; running over is one
    line."""
    try:
        return run(text, timeout=REGEX_SECONDS)
    except TimeoutError:
        flag = "--ignore-regex" if what == "ignore regex" else "--answer-regex"
        raise DataError(f"the {what} '{pattern:.80}' ran over {REGEX_SECONDS:g} s on one answer ({len(text):,} "
                        r"characters), so it backtracks without end: write one without nested repeats such as "
                        rf"'(a|aa)+', e.g. '#### (\S+)' (a region's own regex is dropped with {flag} '')") from None


def token_f1(answer: str | None, reference: str | None) -> float:
    """SQuAD's F1 of two answers read as bags of tokens, a token being what whitespace separates once the rule has
    filtered both: 2·P·R / (P + R) over the tokens they share (counted with repeats); two empty answers agree (1), an
    empty one and another do not (0), and a generation without an answer scores 0."""
    if answer is None or reference is None:
        return 0.0
    got, want = answer.split(), reference.split()
    if not got or not want:
        return float(got == want)
    same = sum((Counter(got) & Counter(want)).values())
    if not same:
        return 0.0
    precision, recall = same / len(got), same / len(want)
    return 2 * precision * recall / (precision + recall)


def contains(answer: str | None, reference: str | None) -> bool:
    """Whether the reference's answer appears in the generation's, as a substring ('4' is in '14': an extraction
    regex or exact match tells them apart); an empty reference answer is contained only in an empty answer."""
    if answer is None or reference is None:
        return False
    return reference in answer if reference else answer == reference


_REPEAT = regex.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")  # {m}, {m,}, {m,n}, {,n}


def _repeats(pattern: str) -> int:
    """The product of the pattern's counted repeats (an upper bound on how far they nest): compiling expands them, so a
    30-character '(?:(?:a{65535}){65535}){65535}' would take all the memory before any search starts."""
    product = 1
    for found in _REPEAT.finditer(pattern):
        product *= max((int(x) for x in found.groups() if x), default=1)
    return product


@functools.lru_cache(maxsize=64)
def _compile(pattern: str, what: str):
    """One regex of a rule (``what``: "answer regex" or "ignore regex", named in the refusal), under the limits."""
    example = r"'#### (\S+)'" if what == "answer regex" else r"'^the '"
    if len(pattern) > MAX_REGEX_CHARS:
        raise DataError(f"the {what} is {len(pattern):,} characters long, over {MAX_REGEX_CHARS}: write a shorter one, "
                        f"e.g. {example}")
    if _repeats(pattern) > MAX_REGEX_REPEATS:
        raise DataError(f"the {what} '{pattern:.80}' repeats by counts ({{n}}) whose product is over "
                        f"{MAX_REGEX_REPEATS:,}: write one with smaller counts, e.g. '\\d{{4}}'")
    try:
        return regex.compile(pattern, flags=regex.VERSION0)  # Python's own syntax, so a pattern reads as with re
    except (regex.error, TypeError, ValueError, OverflowError, RecursionError, MemoryError) as err:
        raise DataError(f"the {what} '{pattern:.80}' is not a regular expression ({err}); write one such as "
                        f"{example}") from None


def prompt_ids(tokenizer: Any, example, chat: bool, max_length: int | None) -> list[int]:
    """The tokens a model sees before it answers: the example as trained on, up to its last scored turn (a prompt
    longer than ``max_length`` keeps its end, as in training; None: the whole prompt)."""
    ids, scored = tokens(tokenizer, example, chat)
    end = len(scored)
    while end and scored[end - 1]:  # the last scored run is the answer
        end -= 1
    return ids[:end] if max_length is None else ids[:end][max(0, end - max_length):]


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")  # how chat templates end an assistant turn


def stop_ids(tokenizer, chat: bool) -> list[int]:
    """Where greedy decoding stops: the end-of-text token and, for a chat, the template's end-of-turn token."""
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    if chat:
        vocab = tokenizer.get_vocab()
        ids += [vocab[t] for t in END_OF_TURN if t in vocab and vocab[t] not in ids]
    return ids


def generate(model, tokenizer, split: Completions, chat: bool, *, max_new_tokens: int = MAX_NEW_TOKENS,
             batch_size: int | None = None, max_length: int | None = None,
             cancel: Callable[[], None] | None = None, done: Callable[[float], None] | None = None) -> list[str]:
    """Greedy generations for every prompt of ``split``, in order (deterministic: no sampling). A prompt and its
    generation stay within ``max_length`` tokens (the model's context by default): a longer prompt keeps its last
    ones. Prompts are grouped by length, so a batch pads little (GENERATION_BATCH prompts a batch by default); after
    each batch ``done`` is told the share of the prompts answered, so a job's progress moves while it generates."""
    batch_size = batch_size or GENERATION_BATCH
    if max_new_tokens < 1:
        raise DataError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    room = prompt_room(max_length or context_length(model), max_new_tokens)
    start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    prompts = [prompt_ids(tokenizer, e, chat, room) or [start_id] for e in split.examples]  # an empty prompt
    # starts as any text does
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    stops = stop_ids(tokenizer, chat)
    out: list[str] = [""] * len(prompts)
    pad = _pad_id(tokenizer)
    device = next(model.parameters()).device
    for start in range(0, len(order), batch_size):
        if cancel is not None:
            cancel()
        chosen = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in chosen)
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in chosen], device=device)
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in chosen], device=device)
        with torch.no_grad():
            new = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 temperature=None, top_p=None, top_k=None, pad_token_id=pad,
                                 eos_token_id=stops or None)[:, width:]
        for i, row in zip(chosen, new.tolist()):
            out[i] = tokenizer.decode(row, skip_special_tokens=True)
        if done is not None:
            done(min(start + batch_size, len(order)) / max(len(order), 1))
    return out


def next_token_probs(model, tokenizer, split: Completions, chat: bool, *, batch_size: int = GENERATION_BATCH
                     ) -> torch.Tensor:
    """Each prompt's distribution over the first token of its answer (n × vocabulary), one pass each: the token a
    greedy generation starts with is its argmax. Prompts are cut to leave that one token room, as ``generate`` does."""
    room = prompt_room(context_length(model), 1)
    start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    prompts = [prompt_ids(tokenizer, e, chat, room) or [start_id] for e in split.examples]
    pad = _pad_id(tokenizer)
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(prompts), batch_size):
        chosen = prompts[start:start + batch_size]
        width = max(len(p) for p in chosen)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chosen], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chosen], device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding must not shift where the prompt starts
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        out.append(torch.softmax(logits.float(), dim=-1).cpu())
    return torch.cat(out)


@dataclass
class TeacherForced:
    """One model's scores of the reference completions: per example its summed loss and scored-token count, and the
    per-example, per-bin calibration sums of ``metrics.calibration_sums``."""

    loss_sum: torch.Tensor
    tokens: torch.Tensor
    calibration: torch.Tensor

    def loss(self) -> float:
        return metrics.ratio(self.loss_sum, self.tokens)

    def token_ece(self) -> float:
        return metrics.ratio(self.calibration, self.tokens)


def teacher_forced(model, tokenizer, split: Completions, chat: bool, *, max_length: int | None = None,
                   batch_size: int = 16, n_bins: int = 10, cancel: Callable[[], None] | None = None) -> TeacherForced:
    """Score every reference completion of ``split`` token by token (next-token loss and calibration); an example
    longer than ``max_length`` (the model's context by default) loses the start of its prompt."""
    inputs, labels, _ = encode(tokenizer, split, chat, max_length or context_length(model))
    n = len(inputs)
    loss_sum = torch.zeros(n, dtype=torch.float64)
    count = torch.zeros(n, dtype=torch.float64)
    conf, right, rows = [], [], []
    pad = _pad_id(tokenizer)
    device = next(model.parameters()).device
    for start in range(0, n, batch_size):
        if cancel is not None:
            cancel()
        chosen = list(range(start, min(n, start + batch_size)))
        width = max(len(inputs[i]) for i in chosen)
        ids = torch.tensor([inputs[i] + [pad] * (width - len(inputs[i])) for i in chosen], device=device)
        mask = torch.tensor([[1] * len(inputs[i]) + [0] * (width - len(inputs[i])) for i in chosen], device=device)
        target = torch.tensor([labels[i] + [IGNORE] * (width - len(labels[i])) for i in chosen])[:, 1:]
        where = (target != IGNORE).nonzero(as_tuple=True)
        with torch.no_grad():  # only the scored positions' logits leave the model's device, then as float32
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            logp = torch.log_softmax(logits[where[0].to(logits.device), where[1].to(logits.device)].float(), dim=-1).cpu()
        wanted = target[where]
        nll = -logp.gather(-1, wanted.unsqueeze(-1)).squeeze(-1)
        top, pred = logp.max(dim=-1)
        example = torch.tensor(chosen, dtype=torch.long)[where[0]]
        loss_sum.index_add_(0, example, nll.double())
        count.index_add_(0, example, torch.ones(len(example), dtype=torch.float64))
        conf.append(top.exp())
        right.append((pred == wanted).double())
        rows.append(example)
    cat = (lambda xs: torch.cat(xs)) if conf else (lambda xs: torch.zeros(0))
    return TeacherForced(loss_sum, count, metrics.calibration_sums(cat(conf), cat(right), cat(rows).long(), n, n_bins))


def fit(tokenizer, task, data: Completions, context: int | None, max_new_tokens: int | None = None) -> tuple[str, ...]:
    """Check, before any model runs, that ``data`` fits the model's ``context``: every completion (scored whole), and
    with ``max_new_tokens`` the tokens to generate beside a prompt; refused in one line where it does not. Returns the
    notes of what will be cut: examples that lose the start of their prompt (loss, training), prompts cut to leave room
    for the generation."""
    room = None if max_new_tokens is None else prompt_room(context, max_new_tokens)
    _, _, cut = encode(tokenizer, data, task.chat, context, task.name)
    notes = truncation_note(task.name, cut, len(data), context)
    if room is not None:
        long = sum(len(prompt_ids(tokenizer, e, task.chat, None)) > room for e in data.examples)
        notes += truncation_note(task.name, long, len(data), context, max_new_tokens)
    return notes


@dataclass
class Judged:
    """Each generation's answer under a rule, the reference's, and the three scores per example: exact match (1.0
    where the answers are equal; a generation without an answer never matches), contains (1.0 where the reference's
    answer is in the generation's) and token F1."""

    answers: list[str | None]
    wanted: list[str | None]
    exact: torch.Tensor
    contains: torch.Tensor
    token_f1: torch.Tensor


def judge(generations: list[str], references, rule: AnswerRule) -> Judged:
    """Every generation read by ``rule`` against its reference, read by the same rule."""
    wanted = [rule.answer(ref, ref) for ref in references]
    answers = [rule.answer(text, ref) for text, ref in zip(generations, references)]
    pairs = list(zip(answers, wanted))

    def column(score) -> torch.Tensor:
        return torch.tensor([float(score(a, w)) for a, w in pairs], dtype=torch.float64)

    return Judged(answers, wanted, column(lambda a, w: a is not None and a == w), column(contains), column(token_f1))


def exact_matches(generations: list[str], references, rule: AnswerRule) -> torch.Tensor:
    """1.0 where the generation's answer equals the reference's (a generation without one never matches)."""
    return judge(generations, references, rule).exact


def agreement(generations: list[str], others: list[str], references, rule: AnswerRule) -> float:
    """The share of examples on which two models give the same answer."""
    same = [rule.answer(a, r) == rule.answer(b, r) for a, b, r in zip(generations, others, references)]
    return sum(same) / len(same) if same else 0.0


def same_answer(text: str, other: str, rule: AnswerRule, one_line: bool) -> bool:
    """Whether two generations give the same answer under ``rule`` where there is no reference (a prompt typed by
    hand): each is cut at its first line as for a one-line reference when ``one_line`` (the task's references are)."""
    reference = "answer" if one_line else "answer\nand more"
    return rule.answer(text, reference) == rule.answer(other, reference)


# -- one pair, several grafts, the same examples ------------------------------------------------------------
SHOWN = 12  # examples of the generations table
Progress = Callable[[dict], None]


def sample(task, split: str, n: int | None, seed: int = 0) -> Completions:
    """The examples of ``split`` a comparison scores: all, or ``n`` drawn with ``seed`` (kept in split order)."""
    data = task.splits[split]
    if n is None or n >= len(data):
        return data
    return data.select(sorted(random.Random(seed).sample(range(len(data)), n)))


@dataclass
class Reading:
    """One model on one sample: its generations, their answers and scores, and the teacher-forced scores."""

    generations: list[str]
    judged: Judged
    forced: TeacherForced


def _check_examples(task, data: Completions) -> None:
    if not len(data):
        raise DataError(f"task '{task.name}' has no examples to score here: give a task with more examples in each split")


def exact(model, tokenizer, task, data: Completions, rule: AnswerRule, max_new_tokens: int,
          cancel: Callable[[], None] | None = None) -> torch.Tensor:
    """Exact match only (1.0 per matching example), for readings that need no token scores."""
    _check_examples(task, data)
    generations = generate(model, tokenizer, data, task.chat, max_new_tokens=max_new_tokens, cancel=cancel)
    return judge(generations, data.references, rule).exact


def read(model, tokenizer, task, data: Completions, rule: AnswerRule, max_new_tokens: int,
         cancel: Callable[[], None] | None = None, done: Callable[[float], None] | None = None) -> Reading:
    """One model's generations, their answers and scores, and its teacher-forced scores of the references; ``done``
    is told how far it is (its generations GENERATING_SHARE of it, batch by batch)."""
    _check_examples(task, data)
    generations = generate(model, tokenizer, data, task.chat, max_new_tokens=max_new_tokens, cancel=cancel,
                           done=(lambda f: done(GENERATING_SHARE * f)) if done is not None else None)
    forced = teacher_forced(model, tokenizer, data, task.chat, cancel=cancel)
    if done is not None:
        done(1.0)
    return Reading(generations, judge(generations, data.references, rule), forced)


def _key(name: str, task, data: Completions, rule: AnswerRule, max_new_tokens: int) -> tuple:
    h = hashlib.sha256(repr((task.chat, rule, max_new_tokens, data.examples)).encode()).hexdigest()
    return ("completion", name, h)


def reference_read(pair, name: str, task, data: Completions, rule: AnswerRule, max_new_tokens: int,
                   cancel: Callable[[], None] | None = None, done: Callable[[float], None] | None = None) -> Reading:
    """``read`` of the fine-tuned or the pre-trained model (``name``), kept with the pair: every later comparison
    of the same examples reuses it."""
    def make() -> Reading:
        with pair.finetuned() if name == FT_LABEL else contextlib.nullcontext():
            return read(pair.model, pair.tokenizer, task, data, rule, max_new_tokens, cancel, done)

    return kept_reference(pair, _key(name, task, data, rule, max_new_tokens), make)


def forced_losses(pair, task, models: dict, *, split: str = "test", n: int | None = None, seed: int = 0,
                  cancel: threading.Event | None = None) -> list[dict]:
    """The loss per reference token of the fine-tuned model, the pre-trained model and each graft of ``models`` on the
    same examples, teacher-forced only (no generation: a few times cheaper than ``compare_completions``): rows of
    {model, task, n, loss}, the two references' kept with the pair."""
    data = sample(task, split, n, seed)
    _check_examples(task, data)

    def stop() -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("evaluation cancelled")

    def forced() -> TeacherForced:
        return teacher_forced(pair.model, pair.tokenizer, data, task.chat, cancel=stop)

    key = hashlib.sha256(repr((task.chat, data.examples)).encode()).hexdigest()
    rows = []
    for name in (FT_LABEL, LM_BODY_LABEL, *models):
        if name in models:
            with state_of(pair, models[name]):
                scored = forced()
        else:
            def made(name=name) -> TeacherForced:
                with pair.finetuned() if name == FT_LABEL else contextlib.nullcontext():
                    return forced()
            scored = kept_reference(pair, ("forced", name, key), made)
        rows.append({"model": name, "task": task.name, "n": len(data), "loss": scored.loss()})
    return rows


def _figures(reading: Reading) -> dict[str, tuple]:
    """Each metric as the (num, den) of ``metrics.ratio``."""
    j, f = reading.judged, reading.forced
    ones = torch.ones_like(j.exact)
    return {"exact_match": (j.exact, ones), "contains": (j.contains, ones), "token_f1": (j.token_f1, ones),
            "loss": (f.loss_sum, f.tokens), "token_ece": (f.calibration, f.tokens)}


def compare_completions(pair, task, models: dict, *, split: str = "test", n: int | None = None, seed: int = 0,
                        contrasts: list[tuple[str, str]] = (), rule: AnswerRule = AnswerRule(),
                        max_new_tokens: int = MAX_NEW_TOKENS, progress: Progress | None = None,
                        cancel: threading.Event | None = None) -> dict:
    """The fine-tuned model, the pre-trained model and each graft of ``models`` (label -> region, or (indices,
    values)) on the same examples of a completion task: one row each (exact match — also its ``accuracy`` —,
    ``contains`` and ``token_f1`` under the same rule, loss per token and perplexity, token-level ECE — also its
    ``ece`` —, agreement of answers with FT), paired differences with intervals (each graft against FT on every
    metric and against the pre-trained model on exact match, and each pair of ``contrasts``), and a generations
    table of the first examples (each model's generation, its answer and its three scores, beside the reference's
    answer); ``notes`` say what the model's context cut (``fit``, checked before any model runs)."""
    data = sample(task, split, n, seed)
    if not len(data):
        raise DataError(f"task '{task.name}' has no examples in its {split} split")
    rule.check(data.references)
    notes = fit(pair.tokenizer, task, data, context_length(pair.model), max_new_tokens)

    def stop() -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("evaluation cancelled")

    body = LM_BODY_LABEL
    names = [FT_LABEL, body, *models]
    readings: dict[str, Reading] = {}
    for i, name in enumerate(names):
        stop()
        stage = f"generating with {name} on {task.name}"
        done = (lambda f, i=i, stage=stage: progress({"stage": stage, "fraction": (i + f) / len(names)})) \
            if progress else None
        if done:
            done(0.0)
        if name in models:
            with state_of(pair, models[name]):
                readings[name] = read(pair.model, pair.tokenizer, task, data, rule, max_new_tokens, stop, done)
        else:
            readings[name] = reference_read(pair, name, task, data, rule, max_new_tokens, stop, done)
    ft = readings[FT_LABEL]
    rows = []
    for name, r in readings.items():
        loss, j = r.forced.loss(), r.judged
        rows.append({
            "model": name, "task": task.name, "distribution": "in", "n": len(data),
            "exact_match": float(j.exact.mean()), "accuracy": float(j.exact.mean()),
            "contains": float(j.contains.mean()), "token_f1": float(j.token_f1.mean()),
            "loss": loss, "perplexity": math.exp(min(loss, 50.0)), "token_ece": r.forced.token_ece(),
            "ece": r.forced.token_ece(), "confidence": None,
            "agreement_with_ft": agreement(r.generations, ft.generations, data.references, rule),
            "region_size": region_size(models[name]) if name in models else None,
        })
    wanted = [(m, FT_LABEL, metric) for m in models for metric in COMPLETION_METRICS]
    wanted += [(m, body, "exact_match") for m in models]
    wanted += [(a, b, metric) for a, b in contrasts for metric in COMPLETION_METRICS]
    differences = []
    for a, b, metric in wanted:
        if a in readings and b in readings and a != b:
            d = metrics.paired_ratio_difference(_figures(readings[a])[metric], _figures(readings[b])[metric], metric,
                                                seed=seed)
            differences.append({"a": a, "b": b, "task": task.name, "distribution": "in", **d,
                                "share": metrics.METRICS[metric].share})
    judged = {name: readings[name].judged for name in names}
    shown = [{"prompt": e[-2][1] if len(e) > 1 else "", "reference": e[-1][1], "reference_answer": ft.judged.wanted[i],
              **{name: readings[name].generations[i] for name in names},
              "exact": {name: bool(j.exact[i]) for name, j in judged.items()},
              "answer": {name: j.answers[i] for name, j in judged.items()},
              "contains": {name: bool(j.contains[i]) for name, j in judged.items()},
              "token_f1": {name: float(j.token_f1[i]) for name, j in judged.items()}}
             for i, e in enumerate(data.examples[:SHOWN])]
    return {"rows": rows, "differences": differences, "generations": shown, "task": task.name, "models": names,
            "rule": asdict(rule), "max_new_tokens": max_new_tokens, "notes": list(notes)}


__all__ = ["ANSWER_PASSES", "AnswerRule", "END_OF_TURN", "GENERATION_BATCH", "Judged", "MAX_IGNORED", "MAX_NEW_TOKENS", "Reading",
           "TeacherForced", "WHITESPACE", "agreement", "compare_completions", "contains", "exact", "exact_matches", "fit",
           "forced_losses",
           "generate", "judge", "prompt_ids", "read", "reference_read", "same_answer", "sample", "stop_ids",
           "teacher_forced", "token_f1"]
