"""lm-evaluation-harness tasks (``--task lm-eval:NAME``, ``lm-eval:a,b``, or a task YAML's path): scored by the
harness itself.

The fine-tuned model, the pre-trained model and each graft are scored in memory by ``lm_eval.simple_evaluate``
(``lmeval.score``) with the harness's metrics and its stderr; graftui adds paired intervals from the harness's
per-document results (every model is scored on the same documents). Mask learning and fine-tuning read a harness task
as a completion task: its training documents (else its validation documents), each as the harness prompts it and the
answer it expects — never the documents it is evaluated on.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..completion import generation
from ... import metrics
from ..completion.data import Completions, CompletionTask, prompt_room, context_length
from ...config import FT_LABEL, LM_BODY_LABEL
from ...errors import Cancelled, DataError, RequestError
from ...formatting import difference, score_text
from .lmeval import (OFFLINE as OFFLINE_HARNESS, PREFIX, HarnessScore, HarnessTask, check_stop, harness_names,
                     is_harness_ref, is_task_file, load_harness_tasks, score)
from ...paths import short_ref
from ..grafts import TEST_SAMPLE_SEED, region_size, state_of
from ..base import Words, register_kind
from ..completion.kind import Completion


@dataclass(frozen=True)
class HarnessSkill(CompletionTask):
    """One or several harness tasks as one graftui task: their training documents are its training split."""

    harness: tuple[HarnessTask, ...] = ()


def load_harness(ref: str) -> HarnessSkill:
    """The harness tasks ``ref`` names (``lm-eval:NAME``, ``lm-eval:a,b`` or a task YAML), read as one task."""
    tasks = tuple(load_harness_tasks(ref))
    train = Completions(tuple(e for t in tasks for e in t.train.examples))
    empty = Completions(())
    unsplit = [t.name for t in tasks if t.train_split is None]
    notes = (f"lm-eval task(s) {', '.join(unsplit)} have no documents besides those they are evaluated on: no region "
             "can be learned or fine-tuned on them",) if unsplit else ()
    # a task file is recorded by its whole path, so a region made with it is read again from anywhere
    name = str(Path(str(ref).strip()).expanduser().resolve()) if is_task_file(ref) else PREFIX + ",".join(
        t.name for t in tasks)
    return HarnessSkill(name=name, splits={"train": train, "validation": empty,
                                                                              "test": empty},
                        source="lm-evaluation-harness: " + ", ".join(f"{t.name} ({t.output_type}, {t.n_eval:,} "
                                                                     f"{t.eval_split} documents)" for t in tasks),
                        notes=notes, harness=tasks)


def sample_ids(task: HarnessTask, n: int | None) -> list[int] | None:
    """The documents scored: ``n`` of the evaluation split drawn with graftui's test-sample seed (a task's first
    documents are often one class), all with None."""
    if n is None or n >= task.n_eval:
        return None
    return sorted(random.Random(TEST_SAMPLE_SEED).sample(range(task.n_eval), n))


def _primary(found: HarnessScore) -> str:
    """The metric graftui reports and pairs: the task's first one with per-document values."""
    return next((m for m in found.metrics if m in found.per_sample), found.primary)


def _reads(found: HarnessScore, metric: str) -> tuple[bool, bool]:
    """(whether ``metric`` is a share of the documents, whether higher is better): as registered
    (``metrics.METRICS``), else a share where every document scored 0 or 1, and better as the harness says."""
    known = metrics.metric_of(metric)
    values = found.per_sample.get(metric)
    share = known.share if known is not None else bool(values) and all(v in (0.0, 1.0) for v in values)
    return share, found.higher_is_better.get(metric, known.higher_is_better if known is not None else True)


def _paired(a: torch.Tensor, b: torch.Tensor, metric: str, seed: int = TEST_SAMPLE_SEED) -> dict:
    """mean(a) − mean(b) of per-document values with a paired bootstrap interval (and McNemar's p where both are
    0/1), named by the harness's metric."""
    ones = torch.ones_like(a)
    binary = bool(((a == 0) | (a == 1)).all() and ((b == 0) | (b == 1)).all())
    d = metrics.paired_ratio_difference((a, ones), (b, ones), "exact_match" if binary else "loss", seed=seed)
    return {**d, "metric": metric, "share": binary}


class Harness(Completion):
    name = "lm-eval"
    seeds_globally = True
    words = Words(score="harness metric", calibration="-", reference="pre-trained",
                  scored_by="lm-evaluation-harness's own metric", key="score")
    task_type = HarnessSkill
    columns = (("model", "model"), ("task", "task"), ("n", "n"), ("metric", "metric"), ("score", "score"),
               ("harness stderr", "stderr"), ("k", "region_size"))
    markdown_columns = (("score (95 % interval)", "score"), ("harness stderr", "stderr"),
                        ("share of FT gain", "gain_recovered"))
    verbs = ("localize", "evaluate", "predict", "pair")
    order, tried, choosable, fields = 10, None, False, ()  # named by its prefix, whatever the request asks

    def names(self, key: str) -> bool:
        return is_harness_ref(key)

    def claims(self, key: str, asked: str, given: set[str]) -> bool:
        return self.names(key)

    def takes(self, spec) -> bool:
        return False

    def read(self, ref: str, spec, guard) -> HarnessSkill:
        self.checked_ref(ref, guard)
        return guard.checked_task(load_harness(ref))

    def checked_ref(self, ref: str, guard) -> bool:
        # a task YAML is checked by its path, unread: on a shared server no file of the server's is opened for it
        guard.checked_harness([str(ref).strip()] if is_task_file(ref) else harness_names(ref))
        return True

    def made(self, meta) -> bool:
        return super().made(meta) and is_harness_ref(getattr(meta, "task", None) or "")

    def offline(self) -> dict[str, str]:
        return {PREFIX + name: about[0] for name, about in OFFLINE_HARNESS.items()}

    previewed = True  # a harness task is named by its YAML or its name alone: nothing else says what it holds

    def preview(self, task) -> list[dict]:
        return [{"name": t.name, "form": t.output_type, "splits": dict(t.split_sizes), "scored": t.eval_split,
                 "n": t.n_eval, "metric": t.metric,
                 "first": None if t.first is None else {**asdict(t.first), "choices": list(t.first.choices)}}
                for t in task.harness]

    def ood_note(self, task) -> str:
        return (f"--ood names classification tasks in the task's label space; the {self.name} task {task.name} has "
                "none, so they are not scored: give more harness tasks as --task lm-eval:a,b")

    def misread(self, pair, task) -> str:
        return (f"'{task.name}' is an lm-evaluation-harness task, which scores a causal language model (its "
                f"log-likelihoods and generations), and '{short_ref(pair.finetuned_ref)}' is read as a classifier: give "
                "a causal LM pair, e.g. --base smollm2 --finetuned smollm2-dates")

    def task_files(self, task) -> dict[str, str]:
        return {path: digest for t in task.harness for path, digest in t.files}

    def wrong_checkpoint(self, ref: str, own: str, task) -> str:
        read = {"multiple_choice": "multiple choice, the log-likelihood of each choice",
                "generate_until": "generation", "loglikelihood": "the log-likelihood of a continuation",
                "loglikelihood_rolling": "the log-likelihood of whole texts"}
        said = "; ".join(f"{t.name}: {read.get(t.output_type, t.output_type)}" for t in task.harness)
        return (f"'{short_ref(ref)}' is a {own.replace('-', ' ')}, and lm-evaluation-harness scores a causal language "
                f"model on {task.name} ({said}): give causal LMs, e.g. --base smollm2 --finetuned smollm2-dates")

    def check_sample(self, task, req) -> None:
        if not len(task.splits["train"]):
            raise DataError(f"'{task.name}' has no training or validation documents besides those it is evaluated "
                            "on, and a region is never learned on them: give a harness task with a training split")
        super().check_sample(task, req)

    def check_context(self, pair, task, req, notes, n=0, meta=None, guard=None) -> None:
        prompt_room(context_length(pair.model), self.judging(req, meta, guard)[1])
        for harness in task.harness:  # every harness check before any work
            if harness.output_type == "generate_until":
                check_stop(pair.tokenizer, harness.name)

    def judging(self, req, meta=None, guard=None):
        """The harness judges with its own filters and metrics: no answer rule of graftui's applies, and a request
        that gives one is refused, naming its flags."""
        given = [flag for flag, value in (("--answer-regex", getattr(req, "answer_regex", None)),
                                          ("--ignore-punctuation", getattr(req, "ignore_punctuation", False)),
                                          ("--ignore-regex", any(getattr(req, "ignore_regex", None) or ())),  # '': none
                                          ("--answer-whitespace", getattr(req, "answer_whitespace", None))) if value]
        if given:
            raise RequestError(f"{', '.join(given)}: an lm-eval task is judged by the harness's own filters (its "
                               f"YAML's filter_list); drop {'it' if len(given) == 1 else 'them'}")
        return generation.AnswerRule(), getattr(req, "max_new_tokens", None) or generation.MAX_NEW_TOKENS  # what
        # predict's generations are cut by, unless the task's YAML says (``predict``)

    def predict(self, pair, task, req, models, ft_name, judging, notes, progress=None, cancel=None):
        """Each model's generation, as long as the tasks' YAML allows (generation_kwargs' max_gen_toks) unless the
        request asks for a length: the probe shows what the harness would score, and its card says that length."""
        rule, new = judging
        own = [t.max_gen_toks for t in task.harness if t.max_gen_toks]
        if own and getattr(req, "max_new_tokens", None) is None:
            new = max(own)
        return super().predict(pair, task, req, models, ft_name, (rule, new), notes, progress, cancel)

    def compare(self, pair, task, models, *, n, contrasts=(), oods=(), judging=None, progress=None, cancel=None):
        """Every model on every harness task; rows with the harness's metric and stderr, paired differences of the
        per-document values (each graft against FT and the pre-trained model, and each pair of ``contrasts``)."""
        names = [FT_LABEL, LM_BODY_LABEL, *models]
        states = {FT_LABEL: pair.finetuned, LM_BODY_LABEL: contextlib.nullcontext}
        rows, differences = [], []
        for t, harness_task in enumerate(task.harness):
            found: dict[str, HarnessScore] = {}
            for i, name in enumerate(names):
                if cancel is not None and cancel.is_set():
                    raise Cancelled("evaluation cancelled")
                if progress:
                    progress({"stage": f"lm-eval {harness_task.name} on {name}",
                              "fraction": (t * len(names) + i) / (len(names) * len(task.harness))})
                with states[name]() if name in states else state_of(pair, models[name]):
                    found[name] = score(pair.model, pair.tokenizer, harness_task, doc_ids=sample_ids(harness_task, n))
            metric = _primary(found[FT_LABEL])
            share, higher = _reads(found[FT_LABEL], metric)
            for name, f in found.items():
                rows.append({"model": name, "task": harness_task.name, "distribution": "in", "n": f.n,
                             "metric": metric, "score": f.metrics[metric], "accuracy": f.metrics[metric],
                             "stderr": f.stderr.get(metric), "harness": f.metrics, "share": share,
                             "higher_is_better": higher,
                             "shares": {m: _reads(f, m)[0] for m in f.metrics}, "ece": None, "loss": None,
                             "agreement_with_ft": None,
                             "region_size": region_size(models[name]) if name in models else None})
            wanted = [(m, FT_LABEL) for m in models] + [(m, LM_BODY_LABEL) for m in models] + list(contrasts)
            for a, b in wanted:
                if a in found and b in found and a != b:
                    va = torch.tensor(found[a].per_sample[metric], dtype=torch.float64)
                    vb = torch.tensor(found[b].per_sample[metric], dtype=torch.float64)
                    differences.append({"a": a, "b": b, "task": harness_task.name, "distribution": "in",
                                        **_paired(va, vb, metric)})
        return {"task": task.name, "rows": rows, "differences": differences, "generations": [], "reliability": {},
                "histogram": {}, "ood": [], "disagreements": [], "notes": [], "models": names}

    def test_count(self, task, n) -> int:
        """The documents scored, over every harness task: ``n`` of each task's evaluation split, or all it has."""
        return sum(t.n_eval if n is None else min(n, t.n_eval) for t in task.harness)

    def scorer(self, pair, task, split, n, judging=None, notes=None):
        raise RequestError(f"'{task.name}' is scored by lm-evaluation-harness on its own documents; ablations and "
                           "merges choose on graftui's own tasks: give a completion or classification task")

    def legend(self, rows) -> str:
        text = ("score: the harness's own metric of each task (its YAML's first metric under its first filter), ± its "
                "stderr; paired differences below are graftui's, on the same documents")
        others = _other_scores(rows)
        return text + ("" if not others else "; the harness's other scores, not compared: " + "; ".join(others))

    def card(self, part, graftable, ft_name, start_overlap=None) -> list[str]:
        """Per harness task: FT and the pre-trained model with the harness's stderr, then each graft with its paired
        interval against FT and its share of the fine-tuning gain."""
        lines = []
        found = {(d["a"], d["b"], d["task"]): d for d in part["differences"]}
        for name in dict.fromkeys(r["task"] for r in part["rows"]):
            by = {r["model"]: r for r in part["rows"] if r["task"] == name}
            ft, pre = by.get(ft_name) or by.get(FT_LABEL), by.get(LM_BODY_LABEL)
            if not (ft and pre):
                continue

            share = ft.get("share", True)

            def said(r):
                err = f" ± {score_text(r['stderr'], share)}" if r.get("stderr") is not None else ""
                return f"{score_text(r['score'], share)}{err}"

            known = metrics.metric_of(ft["metric"])
            what = f"{known.label}, {known.aggregation}: " if known is not None else ""
            way = "" if ft.get("higher_is_better", True) else "; lower is better"
            lines.append(f"lm-evaluation-harness, {name} ({what}{ft['metric']}, {ft['n']:,} documents{way}): the "
                         f"fine-tuned model {said(ft)}, the pre-trained model {said(pre)} (± the harness's stderr).")
            for r in by.values():
                if r is ft or r is pre:
                    continue
                size = "" if r.get("region_size") is None else f" (k = {r['region_size']:,})"
                text = f"{r['model']}{size}: {said(r)}"
                d = found.get((r["model"], FT_LABEL, name))
                if d:
                    text += ", " + difference(d, " against FT")
                if ft["score"] != pre["score"]:
                    text += f"; {100 * (r['score'] - pre['score']) / (ft['score'] - pre['score']):.0f} % of the " \
                            "fine-tuning gain"
                lines.append(text + ".")
            others = _other_scores(list(by.values()))
            if others:
                lines.append(f"The harness scored {name} by more than {ft['metric']}, the first metric under its "
                             "first filter, which is the one compared above: " + "; ".join(others) + ".")
        return lines


def _other_scores(rows: list[dict]) -> list[str]:
    """Each score the harness gave besides the one compared (another filter of the task's YAML, another metric): its
    name and every model's value, e.g. "exact_match,strip: fine-tuned 14.3%, pre-trained 0.0%"."""
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        names = [m for m in dict.fromkeys(m for r in mine for m in r.get("harness") or {}) if m != mine[0]["metric"]]
        for m in names:
            values = ", ".join(f"{r['model']} {score_text(r['harness'][m], (r.get('shares') or {}).get(m, False))}"
                               for r in mine if m in (r.get("harness") or {}))
            out.append(f"{m}{'' if len(set(r['task'] for r in rows)) == 1 else f' ({task})'}: {values}")
    return out


HARNESS = register_kind(Harness())

__all__ = ["HARNESS", "Harness", "HarnessSkill", "load_harness"]
