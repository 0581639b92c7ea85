"""Completion tasks: (prompt, completion) pairs or chats, a causal LM read as itself.

Mask learning and fine-tuning step on the supervised loss of the completion tokens (the prompt masked out); a model
is judged by what it generates (exact match, contains and token F1 after the answer rule, the request's or the
region's own), beside its loss, perplexity and calibration per reference token. The model's context is the limit of
every example and generation: what does not fit is refused before any step, and what it cuts is said in the notes.
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import torch

from ... import card, metrics, settings, training
from . import generation
from .data import (OFFLINE_SKILLS, Completions, CompletionSpec, CompletionTask, batches, context_length,
                   load_completion_task, prompt_room)
from ...config import COMPLETION, COMPLETION_SPARSITY, FT_LABEL, LM_BODY_LABEL, LoadOptions
from ...errors import DataError, ModelError, RequestError
from ...formatting import one_line, table
from ...models import context_of, load_reader, load_tokenizer
from ..grafts import TEST_SAMPLE_SEED
from ..base import Outcome, TaskKind, Words, each_look, recorded_fields, register_kind

DEFAULT_TRAIN_SAMPLE = 256  # examples mask learning steps over (a completion task has no classes to count per)


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


def add(notes: list[str], more) -> None:
    notes += [n for n in more if n not in notes]


def recorded_rule(meta) -> tuple[generation.AnswerRule, int]:
    """The answer rule and generation length a region's own request asked for (the defaults where it is silent).

    A region file is data, never authority: a value of the wrong type reads as the default; a pattern that is text
    is kept as written and meets the limits of every regex (length, counted repeats, time per search) where it is
    compiled, refused there in one line."""
    made = getattr(meta, "request", None)
    asked = made if isinstance(made, dict) else {}
    regex, ignored, whitespace = (asked.get(k) for k in ("answer_regex", "ignore_regex", "answer_whitespace"))
    texts = isinstance(ignored, list) and all(isinstance(p, str) for p in ignored)
    rule = generation.AnswerRule(regex=regex if isinstance(regex, str) else None,
                                 ignore_case=asked.get("ignore_case") is True,
                                 first_line=asked.get("whole_generation") is not True,
                                 ignore_punctuation=asked.get("ignore_punctuation") is True,
                                 regexes_to_ignore=tuple(p for p in ignored if p) if texts else (),
                                 whitespace=whitespace if isinstance(whitespace, str) and whitespace in
                                 generation.WHITESPACE else generation.AnswerRule.whitespace)
    new = asked.get("max_new_tokens")
    return rule, new if isinstance(new, int) and not isinstance(new, bool) and 0 < new <= 1024 else \
        generation.MAX_NEW_TOKENS


def _checked(guard, rule, source: str):
    return rule if guard is None else guard.checked_rule(rule, source)


class Completion(TaskKind):
    name = COMPLETION
    words = Words(score="exact match", calibration="token ECE", reference="pre-trained",
                  scored_by="exact match of its greedy generations", key="exact_match",
                  score_suffix=" exact match")
    task_type = CompletionTask
    head = COMPLETION
    stitches_only = True
    generates = True
    columns = (("model", "model"), ("task", "task"), ("n", "n"), ("exact match", "exact_match"),
               ("contains", "contains"), ("token F1", "token_f1"), ("loss/token", "loss"), ("ppl", "perplexity"),
               ("token ECE", "token_ece"), ("agree w/ FT", "agreement_with_ft"), ("k", "region_size"))
    markdown_columns = (("exact match (95 % interval)", "score"), ("contains", "contains"), ("token F1", "token_f1"),
                        ("loss per token", "loss"), ("token ECE", "token_ece"), ("share of FT gain", "gain_recovered"))
    verbs = ("finetune", "localize", "evaluate", "predict", "sweep", "anatomy", "compose", "export", "push", "pair")
    sparsity = COMPLETION_SPARSITY  # measured: a skill of an AdamW fine-tune fits at 1 %, rarely at 0.1 %
    order, tried = 20, 2  # an offline skill, or completion columns given; a source no kind claims, after classification
    fields = ("prompt_column", "completion_column", "messages_column")

    def claims(self, key: str, asked: str, given: set[str]) -> bool:
        return asked == self.name or (asked == "auto" and bool(set(given) & set(self.fields) or key in OFFLINE_SKILLS))

    kept_by = "the pre → FT loss gap"
    sized_by = "loss"

    def sizing_rows(self, pair, task, models, *, n, judging=None, cancel=None):
        """The teacher-forced loss alone: no generation, a few times cheaper than the comparison."""
        return generation.forced_losses(pair, task, models, n=n, seed=TEST_SAMPLE_SEED, cancel=cancel)

    def share_kept(self, row: dict, ft: dict, bare: dict) -> float | None:
        """The share of the loss gap closed, (L_pre − L_graft) / (L_pre − L_FT) per completion token: exact match of a
        few hundred generations moves in steps too coarse to size a skill by, the loss does not."""
        loss = [r.get("loss") for r in (row, ft, bare)]
        return None if None in loss else card.gain_recovered(-loss[0], -loss[1], -loss[2])

    def spec(self, req) -> CompletionSpec:
        return req.completion_spec()

    def takes(self, spec) -> bool:
        return isinstance(spec, CompletionSpec)

    def read(self, ref: str, spec, guard) -> CompletionTask:
        task = load_completion_task(ref, spec if isinstance(spec, CompletionSpec) else CompletionSpec(),
                                    allow_local=guard.allow_local(tasks=[ref]))
        return guard.checked_task(task)

    def made(self, meta) -> bool:
        return (getattr(meta, "loading", None) or {}).get("head") == COMPLETION

    def recorded_spec(self, meta) -> CompletionSpec:
        return CompletionSpec(**recorded_fields(meta, ("config", *self.fields)))

    def offline(self) -> dict[str, str]:
        return {name: about[0] for name, about in OFFLINE_SKILLS.items()}

    def reading(self, options: LoadOptions, task) -> LoadOptions:
        """The causal LM itself (a prompt or a classifier head the request gave is refused, naming what it gave)."""
        if options.head not in ("auto", "completion", "causal-lm"):
            raise ModelError(f"--head {options.head}: a completion task is scored on a causal LM's own completions; "
                             "drop --head or give --head completion")
        if options.prompted():
            given = [flag for flag, value in (("--template", options.template), ("--label-words", options.label_words),
                                              ("--label-scoring", options.label_scoring != "first")) if value]
            raise ModelError(f"{' and '.join(given)} read a language model as a classifier; a completion task scores "
                             f"the model's own completions: drop {'it' if len(given) == 1 else 'them'}")
        return LoadOptions(head="completion", dtype=options.dtype, device_map=options.device_map)

    def fits(self, pair) -> bool:
        return pair.completion

    def misread(self, pair, task) -> str:
        return (f"'{task.name}' is a {self.name} task, and the pair is read as a classifier: give the causal LMs "
                "fine-tuned on it (e.g. --base smollm2 --finetuned smollm2-dates)")

    def ood_note(self, task) -> str:
        return (f"--ood names classification tasks in the task's label space; the {self.name} task {task.name} has "
                "none, so they are not scored")

    def check_sample(self, task, req) -> None:
        train_sample(task, req, [])

    def mask_batches(self, pair, task, req, notes, seed_offset=0):
        """(prompt, completion) tokens with the prompt masked out of the loss."""
        train = train_sample(task, req, notes)
        config = req.learn_config()
        context = context_length(pair.model)
        add(notes, generation.fit(pair.tokenizer, task, train, context))  # refuses a completion longer than the context

        def make_batches(epoch: int):
            return batches(pair.tokenizer, train, task.chat, config.batch_size, context,
                           shuffle_seed=config.seed + seed_offset + epoch)

        return make_batches, len(train)

    def check_context(self, pair, task, req, notes, n=0, meta=None, guard=None) -> None:
        """The tokens the request generates leave room for a prompt in the pair's context, and the ``n`` test
        examples a check will judge (all with None, none with 0) fit it."""
        _, new = self.judging(req, meta, guard)
        context = context_length(pair.model)
        prompt_room(context, new)
        if n != 0:
            add(notes, generation.fit(pair.tokenizer, task, generation.sample(task, "test", n, TEST_SAMPLE_SEED),
                                      context, new))

    def check_finetune(self, req, task, config, allow, notes) -> None:
        """The training examples the recipe takes and the test examples its score judges fit the base's context
        (read from its config), with room for the tokens to generate."""
        context = context_of(req.base, allow_local=allow)
        tokenizer = load_tokenizer(req.base, allow_local=allow)
        _, new = self.judging(req)
        prompt_room(context, new)
        add(notes, generation.fit(tokenizer, task, training.completion_split(task, config), context))
        add(notes, generation.fit(tokenizer, task, generation.sample(task, "test", req.test_examples, TEST_SAMPLE_SEED),
                                  context, new))

    def finetune(self, req, task, config, out, options, progress, cancel, allow) -> None:
        """Supervised fine-tuning of ``req.base`` on the completions."""
        def step(p):
            if progress:
                progress({"stage": f"fine-tuning on {task.name}", **p.__dict__})

        training.finetune_completions(req.base, task, config, out, progress=step, cancel=cancel, allow_local=allow,
                                      request=req.as_dict())

    def test_score(self, out, task, req, options, notes) -> dict:
        """Exact match on ``req.test_examples`` of the test split, and the loss per token."""
        model, tokenizer, _ = load_reader(str(out), "completion", None, LoadOptions(head="completion",
                                                                                     dtype=options.dtype))
        data = generation.sample(task, "test", req.test_examples, TEST_SAMPLE_SEED)
        rule, new = self.judging(req)
        reading = generation.read(model.eval().to(settings.device()), tokenizer, task, data, rule, new)
        return {"test_accuracy": float(reading.judged.exact.mean()), "test_examples": len(data),
                "test_loss": reading.forced.loss(), "chance_accuracy": None}

    def judging(self, req, meta=None, guard=None):
        """The answer rule and generation length of a request; what it leaves unsaid comes from the request that made
        the region (``meta``), so a region is judged as it was made unless asked otherwise
        (``TaskFields.answer_rule``). The rule passes the guard, whether the request or the region file gave its
        regex."""
        new = getattr(req, "max_new_tokens", None)  # None: not asked
        made, made_new = recorded_rule(meta) if meta is not None else (generation.AnswerRule(),
                                                                       generation.MAX_NEW_TOKENS)
        rule = req.answer_rule(made) if hasattr(req, "answer_rule") else made
        own = meta is None or getattr(req, "answer_regex", None) is not None
        rule = _checked(guard, rule, "the request" if own else "this region file")
        rule.compiled()  # a region file's bad pattern is refused here, before any model generates
        rule.ignored()
        return rule, new or made_new

    def compare(self, pair, task, models, *, n, contrasts=(), oods=(), judging=None, progress=None, cancel=None):
        rule, new = judging or (generation.AnswerRule(), generation.MAX_NEW_TOKENS)
        part = generation.compare_completions(pair, task, models, n=n, seed=TEST_SAMPLE_SEED,
                                              contrasts=list(contrasts), rule=rule, max_new_tokens=new,
                                              progress=progress, cancel=cancel)
        self.scored(part["rows"])
        return {**part, "reliability": {}, "histogram": {}, "ood": [], "disagreements": []}

    def scorer(self, pair, task, split, n, judging=None, notes=None):
        rule, new = judging or (generation.AnswerRule(), generation.MAX_NEW_TOKENS)
        data = generation.sample(task, split, n, TEST_SAMPLE_SEED)
        if notes is not None:  # what the model's context cannot hold is refused before the first model is scored
            add(notes, generation.fit(pair.tokenizer, task, data, context_length(pair.model), new))
        else:
            prompt_room(context_length(pair.model), new)

        def score() -> Outcome:
            hits = generation.exact(pair.model, pair.tokenizer, task, data, rule, new)
            return Outcome(float(hits.mean()), len(hits), hits)

        return score

    def paired(self, a: Outcome, b: Outcome, seed: int) -> dict:
        ones = torch.ones_like(a.per_example)
        return metrics.paired_ratio_difference((a.per_example, ones), (b.per_example, ones), "exact_match", seed=seed)

    def sweep_reference(self, pair, task, req, oods, cancel=None):
        return SimpleNamespace(ft=None, bare=None, body=LM_BODY_LABEL)

    def sweep_rows(self, reference, pair, task, req, made, kept, sparsity, cancel=None):
        """Each method's region scored by generation beside FT and the pre-trained model (exact match as the row's
        accuracy, token ECE as its ECE), every two methods paired."""
        methods = list(made)
        part = self.compare(pair, task, made, n=req.n, contrasts=[(a, b) for x, a in enumerate(methods)
                                                                  for b in methods[x + 1:]],
                            judging=self.judging(req), cancel=cancel)
        by = {r["model"]: r for r in part["rows"]}
        ft = reference.ft = by[FT_LABEL]
        bare = reference.bare = by[reference.body]
        rows = []
        for name in methods:
            r = by[name]
            rows.append({"method": name, "region": kept.get(name), "sparsity": sparsity, "k": r["region_size"],
                         "n": r["n"], "accuracy": r["exact_match"], "exact_match": r["exact_match"],
                         "contains": r["contains"], "token_f1": r["token_f1"], "loss": r["loss"],
                         "accuracy_ci": card.wilson(r["exact_match"], r["n"]), "ece": r["token_ece"],
                         "calibration": None, "ood": {}, "ft_accuracy": ft["exact_match"],
                         "retained": r["exact_match"] / ft["exact_match"] if ft["exact_match"] else None,
                         "gain_recovered": card.gain_recovered(r["exact_match"], ft["exact_match"],
                                                               bare["exact_match"])})
        found = [{**d, "sparsity": sparsity} for d in part["differences"] if d["b"] != reference.body]
        return rows, found

    def sweep_fields(self, reference) -> dict:
        ft, bare = reference.ft, reference.bare
        return {"ft_accuracy": ft["exact_match"], "ft_ece": ft["token_ece"], "ft_ood": {},
                "body_accuracy": bare["exact_match"], "n_test": ft["n"]}

    def check_texts(self, req, task) -> None:
        if req.pairs:
            raise RequestError(f"--pair: '{task.name}' is a {self.name} task, and each --text is one whole prompt; "
                               "drop --pair (a prompt of several lines is one --text)")

    def predict(self, pair, task, req, models, ft_name, judging, notes, progress=None, cancel=None):
        """Each model's greedy generation for each prompt (each --text one whole prompt), judged as the region is;
        a model ``agrees_with_ft`` where its answer is FT's."""
        rule, new = judging
        prompts = Completions(tuple(((("user", t), ("assistant", "")) for t in req.texts)))
        given = dataclasses.replace(task, name="the prompts given")  # what the notes name: the --text, not the task
        add(notes, generation.fit(pair.tokenizer, given, prompts, context_length(pair.model), new))  # refused here
        # when the tokens to generate leave no room for a prompt
        one_line = all("\n" not in r.strip() for r in task.splits["test"].references)  # how evaluate cuts answers
        said: dict[str, list[str]] = {}
        for look in each_look(models, progress, cancel, "generating with"):
            with look.context():
                said[look.name] = generation.generate(pair.model, pair.tokenizer, prompts, task.chat,
                                                      max_new_tokens=new)
        rows = [{"text": i, "model": look.name, "generation": said[look.name][i],
                 "agrees_with_ft": None if look.name == ft_name else
                 generation.same_answer(said[look.name][i], said[ft_name][i], rule, one_line),
                 "probe": look.probe, "part": look.part}
                for i in range(len(req.texts)) for look in models]
        return rows, [], card.predict_card(rows, ft_name, len(req.texts), judged=rule.describe(new))

    def answer_probs(self, pair, task, req, rows, ft_name, looks, progress=None, cancel=None):
        """The probability of the first token of FT's greedy generation after each prompt (FT's top next token), and
        each look's own top next token: one pass per look and no generation, so a map stays cheap; the rest of the
        answer is not weighed (a part that keeps the first token may still change what follows)."""
        prompts = Completions(tuple(((("user", t), ("assistant", "")) for t in req.texts)))

        def read(context) -> torch.Tensor:
            with context():
                return generation.next_token_probs(pair.model, pair.tokenizer, prompts, task.chat)

        first = read(pair.finetuned).argmax(-1).tolist()
        word = lambda t: repr(pair.tokenizer.decode([t]))  # noqa: E731  the token as shown: spaces and newlines seen
        found = []
        for look in each_look(looks, progress, cancel, "mapping"):
            probs = read(look.context)
            found.append([(float(probs[i, t]), word(int(probs[i].argmax()))) for i, t in enumerate(first)])
        return [{"answer": word(t), "measure": "the probability of the first token of the fine-tuned model's greedy "
                 "generation"} for t in first], found

    def legend(self, rows) -> str:
        return ("exact match, contains (the reference's answer within the answer) and token F1 of greedy "
                "generations, all under the answer rule (the request's, else the region's own); loss, perplexity and "
                "token ECE of the reference tokens; agreement: the same answer as the fine-tuned model")

    def predict_text(self, doc) -> str:
        """Each model's generation for each prompt, and whether its answer is FT's."""
        parts = []
        for i, text in enumerate(doc["texts"]):
            rows = [[r["model"], repr(r["generation"]), "" if r["agrees_with_ft"] is None else
                     ("same answer as FT" if r["agrees_with_ft"] else "differs from FT")]
                    for r in doc["rows"] if r["text"] == i]
            parts += [f"{i + 1}. {one_line(text, 100)}", table(["model", "generation", ""], rows, "lll"), ""]
        return "\n".join(parts).rstrip()

    def card(self, part, graftable, ft_name, start_overlap=None) -> list[str]:
        judged = generation.AnswerRule(**part["rule"]).describe(part["max_new_tokens"]) if "rule" in part else ""
        return card.completion_card(part["rows"], part["differences"], graftable, ft_name, judged=judged)


COMPLETION_KIND = register_kind(Completion())

__all__ = ["COMPLETION_KIND", "Completion", "DEFAULT_TRAIN_SAMPLE", "add", "recorded_rule", "train_sample"]
