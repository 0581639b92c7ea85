"""lm-evaluation-harness (``lm_eval``) as a source of tasks: their training documents, and scores of a model in memory.

A task reference ``lm-eval:NAME[,NAME…]`` names harness tasks. Each is read twice over:

* as **training documents** (:func:`load_harness_task`): the prompt the harness evaluates with (zero-shot context)
  and the answer a few-shot example writes after it, as ``completion.Completions`` — from the task's training split,
  else its validation split when the harness evaluates on a test split; never from the split it evaluates on, so a
  region is never learned on the documents it is scored on;
* as **a score** (:func:`score`): ``lm_eval.simple_evaluate`` of the model as it is in memory (a graft entered in
  place), its metrics with their standard errors and the value of each document, by ``doc_id``, so two models score
  paired differences on the same documents.

Offline, the harness's own registry has no data. ``OFFLINE`` tasks are written here as harness YAMLs over graftui's
offline data, with graftui's own splits, prompt and answer rule, so that a harness score and graftui's score of the
same model agree document by document (``tests/test_lmeval.py`` checks it): ``graftui_movies`` reads SmolLM2 as the
default prompt-based classifier does, ``graftui_dates`` and ``graftui_numbers`` generate as completion tasks do.

``import lm_eval`` is lazy and cheap; its task registry, evaluator and model classes take about 1.4 s more to import, so
they are imported where a task is loaded or scored, not when graftui is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import io
import json
import logging
import math
import random
import re
import string
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lm_eval
import numpy as np
import torch

from ... import settings
from ..completion.data import Completions, offline_skill
from ...config import PROMPT_LOADING
from ..classification.data import SPLIT_NAMES, load_task
from ...errors import DataError
from ..completion.generation import MAX_NEW_TOKENS, AnswerRule
from ...paths import atomic_write
from ...prompts import LMReader, parse_label_words

PREFIX = "lm-eval:"
FORMAT = 1  # of the offline task files; a new one rewrites them
BOOTSTRAP_ITERS = 1000  # resamples for the stderr of metrics that are no mean (a mean's is a formula); lm_eval: 100,000
ANSWER_FILTER = "graftui-answer"  # the filter of the offline generative tasks: graftui's AnswerRule

OFFLINE = {  # name -> (what it is, graftui's task it is made from)
    "graftui_movies": ("VADER movie-review sentences, negative vs positive, read as SmolLM2's default classifier "
                       "reads them: multiple choice between the label words after the prompt", "movies"),
    "graftui_dates": ("ISO dates written out in words ('2019-07-04' → 'July 4, 2019'): greedy generation judged by "
                      "exact match of graftui's answer rule", "dates"),
    "graftui_numbers": ("whole numbers 0–999 in English words: greedy generation judged by exact match of graftui's "
                        "answer rule", "numbers"),
}


# -- names -----------------------------------------------------------------------------------------------------------
TASK_FILE_SUFFIXES = (".yaml",)  # a task the user wrote, named by its file (the harness indexes no other suffix)


def is_task_file(ref: str) -> bool:
    """Whether a task reference is a harness task YAML (read by the harness, from the folder it lies in)."""
    return str(ref).strip().lower().endswith(TASK_FILE_SUFFIXES)


def is_harness_ref(ref: str) -> bool:
    """Whether a task reference names lm-eval tasks (``lm-eval:NAME``, or a task YAML) rather than a graftui task,
    file or dataset."""
    return str(ref).strip().lower().startswith(PREFIX) or is_task_file(ref)


def file_task(ref: str) -> tuple[str, Path]:
    """(the task's name, the folder the harness reads it from) of a task YAML the user wrote; one line when the file
    is missing or names no task. The name is its ``task:`` line: the harness's own YAML loader would run the file's
    ``!function`` tags just to tell it."""
    if str(ref).strip().lower().startswith(PREFIX):  # lm-eval: names the harness's own tasks, never a file
        raise DataError(f"'{ref}' gives a task YAML after '{PREFIX}', which names the harness's registered tasks: drop "
                        f"the prefix and give the file's path alone (--task {str(ref).strip()[len(PREFIX):]})")
    path = Path(str(ref).strip()).expanduser()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise DataError(f"cannot read '{ref}' ({err.strerror or type(err).__name__}): give the path of an "
                        "lm-evaluation-harness task YAML") from None
    found = re.search(r"^task:[ \t]*['\"]?([\w.\-]+)['\"]?[ \t]*(?:#.*)?$", text, re.M)
    if found is None:
        raise DataError(f"'{ref}' names no task: an lm-evaluation-harness task YAML has a line 'task: NAME' (a group "
                        "of tasks is named one task at a time)")
    return found.group(1), path.resolve().parent


def harness_names(ref: str) -> list[str]:
    """The harness task names of ``lm-eval:a,b`` in order, each once (or the one task of a task YAML); one line when
    there is none."""
    text = str(ref).strip()
    if is_task_file(text):
        return [file_task(text)[0]]
    if not is_harness_ref(text):
        raise DataError(f"'{text}' is no lm-eval task reference: write lm-eval:NAME (e.g. lm-eval:graftui_dates)")
    names = list(dict.fromkeys(n.strip() for n in text[len(PREFIX):].split(",") if n.strip()))
    if not names:
        raise DataError(f"'{text}' names no lm-eval task: write lm-eval:NAME (e.g. lm-eval:graftui_dates, or "
                        "lm-eval:hellaswag online)")
    return names


# -- the offline tasks -----------------------------------------------------------------------------------------------
def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def _movies() -> tuple[dict[str, list[dict]], str, dict]:
    """graftui's movies splits, and the prompt and label words SmolLM2's default classifier reads them with."""
    task = load_task("movies")
    template = PROMPT_LOADING.template
    fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    if fields != ["text"] or "{{" in template or "{%" in template:
        raise DataError(f"the default prompt {template!r} is not a one-text template the harness can write")
    words = dict(parse_label_words(PROMPT_LOADING.label_words))
    rows = {s: [{"text": t, "label": y} for t, y in zip(task.splits[s].texts, task.splits[s].labels)]
            for s in SPLIT_NAMES}
    return rows, "multiple_choice", {
        "doc_to_text": template.replace("{text}", "{{text}}"),
        "doc_to_target": "label",
        "doc_to_choice": [words[label] for label in task.label_names],
        "target_delimiter": "",  # the label words carry their own leading space
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }


def _skill(skill: str) -> tuple[dict[str, list[dict]], str, dict]:
    """An offline skill's splits as (prompt, completion, answer) rows: the answer is the completion as graftui's
    default answer rule reads it, and a space and the answer give the completion back (checked)."""
    task, rule = offline_skill(skill), AnswerRule()
    rows = {}
    for s in SPLIT_NAMES:
        rows[s] = []
        for (_, prompt), (_, completion) in task.splits[s].examples:
            answer = rule.answer(completion, completion)
            if " " + answer != completion:
                raise DataError(f"offline skill '{skill}': the completion {completion!r} is not a space and its answer")
            rows[s].append({"prompt": prompt, "completion": completion, "answer": answer})
    return rows, "generate_until", {
        "doc_to_text": "prompt",  # column names: the text as it is, no template
        "doc_to_target": "answer",
        "target_delimiter": " ",
        # graftui generates greedily up to MAX_NEW_TOKENS and stops at the end-of-text token only (the harness adds it
        # to `until`); the answer is cut from the generation by graftui's rule (first line, whitespace collapsed).
        "generation_kwargs": {"until": [], "max_gen_toks": MAX_NEW_TOKENS, "do_sample": False},
        "filter_list": [{"name": ANSWER_FILTER, "filter": [
            {"function": "custom", "filter_fn": _Function(f"{__name__}.answer_filter")},
            {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }


_MAKERS = {"graftui_movies": _movies, "graftui_dates": lambda: _skill("dates"),
           "graftui_numbers": lambda: _skill("numbers")}


class _Function(str):
    """A YAML ``!function`` reference (the harness imports it when it reads the task)."""


def _yaml_value(value: Any, indent: int) -> str:
    """``value`` as YAML: JSON scalars and lists (JSON is YAML), block mappings and lists of mappings, ``!function``."""
    pad = "  " * indent
    if isinstance(value, _Function):
        return f" !function {value}"
    if isinstance(value, dict):
        return "".join(f"\n{pad}{key}:{_yaml_value(v, indent + 1)}" for key, v in value.items())
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = ""
        for item in value:
            first, *rest = _yaml_value(item, indent + 1).splitlines()[1:]
            out += f"\n{pad}- {first.strip()}" + "".join(f"\n{line}" for line in rest)
        return out
    return " " + json.dumps(value, ensure_ascii=False)


def task_yaml(name: str, output_type: str, fields: dict, data_files: dict[str, str], cache_dir: str) -> str:
    """A harness task config over JSONL splits (absolute paths), read by the harness's ``json`` dataset builder."""
    config = {"task": name, "dataset_path": "json",
              "dataset_kwargs": {"data_files": data_files, "cache_dir": cache_dir},
              "output_type": output_type, "training_split": "train", "validation_split": "validation",
              "test_split": "test", **fields, "metadata": {"version": float(FORMAT)}}
    what = OFFLINE[name][0] if name in OFFLINE else name
    return f"# {what}\n# Written by graftui.tasks.harness.lmeval; rewritten when graftui's data changes.{_yaml_value(config, 0)}\n"


_written: set[str] = set()
_write_lock = threading.Lock()


def offline_dir() -> Path:
    """The folder of the offline tasks (``$GRAFTUI_HOME/lm-eval/tasks-v1``: one folder per task, its YAML and its JSONL
    splits), written on first use in each process where graftui's data changed; the harness reads it as an include
    path. Their datasets cache lies beside it, not in the user's Hugging Face cache."""
    root = settings.shared("lm-eval")
    folder = root / f"tasks-v{FORMAT}"
    with _write_lock:
        if str(folder) in _written and all((folder / name / "task.yaml").is_file() for name in OFFLINE):
            return folder
        for name, make in _MAKERS.items():
            rows, output_type, fields = make()
            files = {f"{s}.jsonl": _jsonl(rows[s]) for s in SPLIT_NAMES}
            data_files = {s: str(folder / name / f"{s}.jsonl") for s in SPLIT_NAMES}
            files["task.yaml"] = task_yaml(name, output_type, fields, data_files, str(root / "datasets-cache"))
            _write_files(folder / name, files)
        _written.add(str(folder))
    return folder


def _write_files(folder: Path, files: dict[str, str]) -> None:
    """Each file atomically, unless it already holds the same text (so the datasets cache stays valid); the YAML, which
    names the others, last."""
    for name in sorted(files, key=lambda n: n.endswith(".yaml")):
        path, text = folder / name, files[name]
        try:
            same = path.read_text(encoding="utf-8") == text
        except OSError:
            same = False
        if not same:
            atomic_write(path, lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"))


def answer_filter(responses, docs) -> list[list[str]]:
    """The harness filter of the offline generative tasks: each generation's answer under graftui's default
    ``AnswerRule`` (the first line of a one-line reference, whitespace collapsed), so exact match is graftui's."""
    rule = AnswerRule()
    return [[rule.answer(text, doc["completion"]) or "" for text in texts] for texts, doc in zip(responses, docs)]


MAX_GEN_TOKS = 1024  # the most new tokens a task's max_gen_toks is taken at (more: graftui's own length)


# -- loading a task ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FirstDocument:
    """The first document a task is scored on, as the model reads it: the harness's zero-shot context, then what is
    scored after it: each choice (after the target delimiter; ``gold`` the right one) of a multiple-choice task, else
    the target a generation or a log-likelihood is judged against."""

    context: str
    target: str
    choices: tuple[str, ...] = ()
    gold: int | None = None


@dataclass(frozen=True)
class HarnessTask:
    """One harness task as graftui uses it: its training documents, and what it is scored on.

    ``train`` holds (("user", prompt), ("assistant", answer)) examples — the zero-shot context the harness evaluates
    with, and the answer as a few-shot example writes it after that context (a multiple-choice task's gold choice) —
    from ``train_split``; it is empty (``train_split`` None) when the task has no split besides the one it is
    evaluated on, and then no region can be learned on it. ``n_eval`` documents of ``eval_split`` are scored.
    """

    name: str
    output_type: str  # "multiple_choice", "generate_until", "loglikelihood" or "loglikelihood_rolling"
    train: Completions
    train_split: str | None
    eval_split: str
    n_eval: int
    include_path: tuple[str, ...] = ()  # folders of task YAMLs besides the harness's registry (the offline tasks')
    registry: bool = True  # found in the harness's own registry (5 s to index), not in include_path alone
    files: tuple[tuple[str, str], ...] = ()  # (path, sha256) of a user's task YAML and the files it includes
    max_gen_toks: int | None = None  # the new tokens its generation_kwargs allow a generation (None: unsaid)
    split_sizes: tuple[tuple[str, int], ...] = ()  # (the harness's split, its documents) of each split it has
    first: FirstDocument | None = None  # the first document of ``eval_split``, as the model reads it
    metric: str = ""  # the score compared: its first metric under its first filter, as the harness names it

    @property
    def chat(self) -> bool:
        """Training documents are plain text, as the harness prompts without a chat template."""
        return False


_managers: dict[tuple, Any] = {}
_manager_lock = threading.Lock()


def _include(include_path: str | Path | Sequence[str | Path] | None) -> tuple[str, ...]:
    if include_path is None:
        return ()
    paths = [include_path] if isinstance(include_path, (str, Path)) else list(include_path)
    return tuple(str(Path(p).expanduser().resolve()) for p in paths)


def _written_yamls(include: tuple[str, ...]) -> tuple:
    """(path, content digest) of every task YAML under ``include``: what a manager over those folders indexed (by
    content, not time: a file rewritten within the file system's clock tick is still seen)."""
    found = []
    for folder in include:
        try:
            found += [(str(p), hashlib.sha1(p.read_bytes()).hexdigest()) for p in Path(folder).rglob("*.yaml")]
        except OSError:
            continue
    return tuple(sorted(found))


def _manager(include: tuple[str, ...], defaults: bool):
    """A harness TaskManager over ``include`` (and the harness's own registry when ``defaults``: 5 s to index, so it is
    built once per process and only for names that need it)."""
    from lm_eval.tasks import TaskManager

    key = (include, defaults, _written_yamls(include))  # a YAML added, changed or renamed: indexed again
    with _manager_lock:
        if key not in _managers:
            with _quiet():
                _managers[key] = TaskManager(include_path=list(include) or None, include_defaults=defaults)
        return _managers[key]


OWN_PREFIX = "graftui_"  # the offline tasks' names: the harness has none of its own so named


def _unknown(name: str, known: Sequence[str]) -> DataError:
    near = difflib.get_close_matches(name, [*OFFLINE, *known], n=3, cutoff=0.75)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    return DataError(f"unknown lm-eval task '{name}'{hint}: name an offline one "
                     f"({', '.join(f'lm-eval:{n}' for n in OFFLINE)}), a task of lm-eval {lm_eval.__version__}'s "
                     "registry such as lm-eval:hellaswag (its data comes from the Hugging Face Hub), or one you wrote: "
                     f"--task path/to/its.yaml, or its YAML in {user_dir()}")


def user_dir() -> Path:
    """Where a user's own task YAMLs are found by name (``lm-eval:my_task``): ``$GRAFTUI_HOME/lm-eval``."""
    return settings.shared("lm-eval")


def _own_tasks() -> tuple[str, ...]:
    """``user_dir()`` as an include path where it holds a task YAML besides graftui's own folders (the offline tasks
    and their datasets cache), which this check does not walk: the cache may hold many files."""
    root, own = user_dir(), (f"tasks-v{FORMAT}", "datasets-cache")
    try:
        found = any(p.suffix.lower() in TASK_FILE_SUFFIXES if p.is_file() else next(p.rglob("*.yaml"), None) is not None
                    for p in root.iterdir() if p.name not in own)
    except OSError:
        return ()
    return (str(root.resolve()),) if found else ()


def _resolve(name: str, include_path) -> tuple[Any, tuple[str, ...], bool]:
    """(TaskManager, include paths, whether the harness's registry is needed) that know ``name``; an unknown name is
    one line with the fix. Offline names and those of ``include_path`` or ``user_dir()`` never wait for the
    registry's index."""
    include = ((str(offline_dir()),) if name in OFFLINE else _own_tasks()) + _include(include_path)
    own = _manager(include, False) if include else None
    if own is not None and name in own.all_tasks:
        return own, include, False
    if name.startswith(OWN_PREFIX):
        raise _unknown(name, own.all_subtasks if own is not None else [])
    everything = _manager(include, True)
    if name in everything.all_tasks:
        return everything, include, True
    raise _unknown(name, everything.all_subtasks)


def _load(manager, name: str):
    """The harness's Task object of ``name`` (its dataset loaded); a group or a dataset out of reach is one line."""
    registry_log = logging.getLogger("lm_eval.api.registry")  # logs an unknown metric at ERROR: said below instead
    level = registry_log.level
    try:
        registry_log.setLevel(logging.CRITICAL)
        with _quiet(), _kept_random_state():
            loaded = manager.load([name])
    except Exception as err:  # noqa: BLE001 - the harness and datasets raise many kinds; the user gets one line
        raise DataError(_not_loaded(manager, name, err)) from err
    finally:
        registry_log.setLevel(level)
    tasks = loaded["tasks"]
    if list(tasks) != [name]:
        some = ", ".join(sorted(tasks)[:3]) + (", …" if len(tasks) > 3 else "")
        raise DataError(f"lm-eval '{name}' is a group of {len(tasks)} tasks ({some}): name one task, or several "
                        f"as lm-eval:a,b")
    entry = manager.task_index.get(name)
    where = f" ({entry.yaml_path})" if getattr(entry, "yaml_path", None) else ""
    unknown = _unknown_metric(name, getattr(entry, "cfg", None) or {}, where, getattr(tasks[name], "_metric_fn_list", {}))
    if unknown:  # the harness loads it, and would fail scoring it after the model is loaded
        raise DataError(unknown)
    return tasks[name]


LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "pandas")  # datasets' builders over local data_files


def _data_files(config: dict) -> list[str]:
    """The local paths a task's ``dataset_kwargs.data_files`` names (a string, a list, or a dict of either)."""
    files = (config.get("dataset_kwargs") or {}).get("data_files") if isinstance(config, dict) else None
    values = files.values() if isinstance(files, dict) else [files]
    paths = [p for v in values for p in (v if isinstance(v, list) else [v]) if isinstance(p, str)]
    return [p for p in paths if "://" not in p and not any(c in p for c in "*?[")]


def _unknown_metric(name: str, config: dict, where: str, found=None) -> str | None:
    """A line naming the first metric of ``metric_list`` the harness has no function for (``found``: the loaded task's
    functions by name, where it loaded), and the metrics it knows; None where there is none."""
    from lm_eval.api.registry import metric_registry

    if config.get("process_results"):  # the task scores its documents itself
        return None
    names = [m.get("metric") for m in config.get("metric_list") or [] if isinstance(m, dict)]
    unknown = [m for m in names if isinstance(m, str) and "/" not in m and m not in metric_registry
               and (found is None or found.get(m) is None)]
    if not unknown:
        return None
    near = difflib.get_close_matches(unknown[0], list(metric_registry), n=1, cutoff=0.7)
    return (f"lm-eval task '{name}'{where}: metric '{unknown[0]}' is none the harness knows"
            + (f" (did you mean {near[0]}?)" if near else "") + f"; its metrics are {', '.join(sorted(metric_registry))}"
            " (a metric of the Hugging Face evaluate library is fetched with a connection)")


def _not_loaded(manager, name: str, err: BaseException) -> str:
    """Why the harness could not load task ``name``, in one line naming what to change: a key its TaskConfig does not
    take, a metric it does not know, a data file it cannot find, else the error itself (and, for a dataset of the
    Hub, that it needs a connection once)."""
    from lm_eval.config.task import TaskConfig

    entry = manager.task_index.get(name)
    config = getattr(entry, "cfg", None) or {}
    where = f" ({entry.yaml_path})" if getattr(entry, "yaml_path", None) else ""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    key = re.search(r"unexpected keyword argument '([^']+)'", text) if isinstance(err, TypeError) else None
    if key:
        known = sorted(f.name for f in dataclasses.fields(TaskConfig))
        near = difflib.get_close_matches(key.group(1), known, n=1, cutoff=0.7)
        return (f"lm-eval task '{name}'{where}: the harness takes no key '{key.group(1)}' in a task YAML"
                + (f" (did you mean {near[0]}?)" if near else "") + ": drop or rename it")
    unknown = _unknown_metric(name, config, where)
    if unknown:
        return unknown
    for path in _data_files(config):
        if not Path(path).expanduser().is_file():
            beside = Path(str(getattr(entry, "yaml_path", "") or ".")).parent / path
            hint = f" ({beside.resolve()} is there: give that path)" if not Path(path).is_absolute() and \
                beside.is_file() else ""
            return (f"lm-eval task '{name}'{where}: its data file '{path}' is not found: the harness reads a relative "
                    f"data_files path from the folder it runs in ({Path.cwd()}), not from the YAML's; write it as an "
                    f"absolute path{hint}")
    if config.get("dataset_path") in LOCAL_BUILDERS or Path(str(config.get("dataset_path", ""))).expanduser().exists():
        return f"lm-eval task '{name}'{where} could not be loaded ({type(err).__name__}: {text})"
    offline = ", ".join(f"lm-eval:{n}" for n in OFFLINE)
    return (f"lm-eval task '{name}' could not be loaded ({type(err).__name__}: {text}): its data comes from the Hugging "
            "Face Hub, so run once with a connection (HF_HUB_OFFLINE and HF_DATASETS_OFFLINE unset); offline, use "
            f"{offline}")


def _answer(task, doc) -> str:
    """What a few-shot example writes after the zero-shot context of ``doc``: the gold choice or the target."""
    delimiter = task.config.target_delimiter
    target = task.doc_to_target(doc)
    if isinstance(target, list):  # several right answers: the first
        target = target[0]
    if task.OUTPUT_TYPE == "multiple_choice" and not task.multiple_input:
        choices = task.doc_to_choice(doc)
        target = choices[target] if isinstance(target, int) else target
    elif isinstance(target, int) and task.config.doc_to_choice is not None:
        target = task.doc_to_choice(doc)[target]
    return f"{delimiter}{target}"


def _context(task, doc) -> str:
    """The zero-shot context the harness evaluates ``doc`` with (a multiple-input task's: its gold input's)."""
    context = task.fewshot_context(doc, num_fewshot=0, gen_prefix=task.doc_to_prefix(doc))
    if isinstance(context, list):  # multiple inputs (Winogrande): one context per choice
        context = context[task.doc_to_text(doc)] if isinstance(task.doc_to_text(doc), int) else context[0]
    return context


def _training(task) -> tuple[str | None, list]:
    """The training split and its documents: train, else validation when the harness evaluates on a test split."""
    if task.has_training_docs():
        return "train", list(task.training_docs())
    if task.has_validation_docs() and task.has_test_docs():
        return "validation", list(task.validation_docs())
    return None, []


def _split_sizes(task) -> tuple[tuple[str, int], ...]:
    """(split, its documents) of each split the harness reads of ``task``: training, validation, test."""
    splits = ((task.has_training_docs, task.training_docs, task.config.training_split),
              (task.has_validation_docs, task.validation_docs, task.config.validation_split),
              (task.has_test_docs, task.test_docs, task.config.test_split))
    return tuple((str(split), len(docs())) for has, docs, split in splits if has())


def _first(task, name: str, split: str) -> FirstDocument | None:
    """The first document the harness scores, as the model reads it (None: the split is empty); one line where the
    task's settings cannot write it, before any model loads."""
    docs = task.eval_docs
    if not len(docs):
        return None
    doc = docs[0]
    try:
        context, target = _context(task, doc), _answer(task, doc)
        if task.OUTPUT_TYPE != "multiple_choice" or task.multiple_input:
            return FirstDocument(context, target)
        choices = tuple(f"{task.config.target_delimiter}{c}" for c in task.doc_to_choice(doc))
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise DataError(f"lm-eval task '{name}': its first {split} document cannot be written as a prompt "
                        f"({type(err).__name__}: {err}); check its doc_to_text, doc_to_target and doc_to_choice") from err
    return FirstDocument(context, target, choices, choices.index(target) if target in choices else None)


def _compared(task) -> str:
    """The score graftui compares, named as the harness's results name it: the first metric under the first
    filter."""
    names = list(getattr(task, "_metric_fn_list", None) or {})
    filters = [getattr(f, "name", "none") for f in getattr(task, "_filters", None) or ()] or ["none"]
    return _key(names[0], filters[0]) if names else ""


def load_harness_task(name: str, *, include_path: str | Path | Sequence[str | Path] | None = None) -> HarnessTask:
    """One harness task by name: an offline one (``OFFLINE``), one of ``include_path``'s YAMLs, or one of the
    harness's registry (its dataset from the Hub or its cache). Raises DataError in one line when it cannot."""
    name = str(name).strip()
    if not name:
        raise DataError("no lm-eval task named: write lm-eval:NAME (e.g. lm-eval:graftui_dates)")
    manager, include, registry = _resolve(name, include_path)
    task = _load(manager, name)
    split, docs = _training(task)
    try:
        examples = tuple((("user", _context(task, d)), ("assistant", _answer(task, d))) for d in docs)
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise DataError(f"lm-eval task '{name}': a training document cannot be written as a prompt and an answer "
                        f"({type(err).__name__}: {err}); score it without learning a region on it") from err
    eval_split = task.config.test_split if task.has_test_docs() else task.config.validation_split
    read = getattr(manager.task_index.get(name), "yaml_path", None)
    files = file_digests(Path(read)) if read is not None and not registry and name not in OFFLINE else ()
    asked = getattr(task.config, "generation_kwargs", None) if task.OUTPUT_TYPE == "generate_until" else None
    length = asked.get("max_gen_toks") if isinstance(asked, dict) else None
    return HarnessTask(name, task.OUTPUT_TYPE, Completions(examples), split, str(eval_split), len(task.eval_docs),
                       include, registry, files, length if isinstance(length, int) and not isinstance(length, bool)
                       and 0 < length <= MAX_GEN_TOKS else None, _split_sizes(task),
                       _first(task, name, str(eval_split)), _compared(task))


def file_digests(path: Path, seen: tuple[Path, ...] = ()) -> tuple[tuple[str, str], ...]:
    """(path, sha256 of its bytes) of a task YAML and of each file it includes, in order: what a region learned on it
    records, so a file edited since is noted where the region is scored again. A file that cannot be read is left
    out (the harness has read it already, or skipped it)."""
    from lm_eval.tasks._yaml_loader import _make_loader
    import yaml

    path = path.resolve()
    try:
        data = path.read_bytes()
        config = yaml.load(data, Loader=_make_loader(path.parent, resolve_funcs=False))  # noqa: S506 - no !function run
    except (OSError, yaml.YAMLError):
        return ()
    out = ((str(path), hashlib.sha256(data).hexdigest()),)
    includes = config.get("include") if isinstance(config, dict) else None
    for inc in includes if isinstance(includes, list) else [] if includes is None else [includes]:
        target = (path.parent / str(inc)).resolve()
        if target not in seen and target != path:
            out += file_digests(target, (*seen, path))
    return out


def load_harness_tasks(ref: str) -> list[HarnessTask]:
    """Every task of ``lm-eval:a,b``, or the one of a task YAML (read from the folder it lies in)."""
    if is_task_file(ref):
        name, folder = file_task(ref)
        given = Path(str(ref).strip()).expanduser().resolve()
        entry = _manager((str(folder),), False).task_index.get(name)
        if entry is None:  # the harness skipped the file (it says nothing why): read it as it would, and say
            raise DataError(_unread(ref, given) or f"the harness does not read '{ref}' as a task: an "
                            "lm-evaluation-harness task YAML is a mapping with 'task: NAME' and its settings")
        read = getattr(entry, "yaml_path", None)
        if read is not None and Path(read).resolve() != given:  # the harness takes the first file of a name
            raise DataError(f"'{ref}' names task '{name}', which {read} beside it names too, and the harness reads "
                            "that one: give each task YAML its own name, or its own folder")
        return [load_harness_task(name, include_path=folder)]
    return [load_harness_task(n) for n in harness_names(ref)]


def _unread(ref: str, path: Path, seen: tuple[Path, ...] = ()) -> str | None:
    """Why the harness cannot read the task YAML ``path`` or a file it includes (None: it can), in one line. An
    included file is named, never quoted: an ``include:`` may name any file, and none of its text is shown."""
    from lm_eval.tasks._yaml_loader import _make_loader
    import yaml

    what = f"'{ref}'" if not seen else f"the include '{path}' of '{ref}'"
    try:
        data = path.read_bytes()
    except OSError as err:
        return (f"{what} cannot be read ({err.strerror or type(err).__name__}): an include names a task YAML beside "
                "it, by a path relative to its folder")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        fix = "save it as UTF-8" if not seen else "an include names a task YAML (UTF-8 text) beside it"
        return f"{what} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}): {fix}"
    try:
        config = yaml.load(text, Loader=_make_loader(path.parent, resolve_funcs=False))  # noqa: S506 - no !function run
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) if not seen else None  # an include's own words are not shown
        return f"{what} is not valid YAML ({problem or 'unreadable'}{where})"
    if not isinstance(config, dict):
        return (f"{what} is not a task YAML (no mapping of settings)" +
                ("" if not seen else ": an include names a task YAML beside it, by a path relative to its folder"))
    includes = config.get("include")
    for inc in includes if isinstance(includes, list) else [] if includes is None else [includes]:
        if not isinstance(inc, str) or not inc.strip():
            return f"{what} has an include that is no path: write include: FILE.yaml"
        target = (path.parent / inc).resolve()
        if target in seen or target == path:
            return f"{what} includes '{inc}', which includes it again: break the cycle"
        why = _unread(ref, target, (*seen, path))
        if why:
            return why
    return None


# -- scoring ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HarnessScore:
    """The harness's reading of one model on one task.

    Metric names are the harness's (``acc``, ``exact_match``), followed by ``,FILTER`` when the task filters the
    generations through a named filter (``exact_match,strict-match``). ``per_sample[m][i]`` is the value of
    document ``doc_ids[i]`` (in increasing order), for the metrics whose per-document values are numbers.
    """

    task: str
    n: int
    metrics: dict[str, float]
    stderr: dict[str, float | None]
    per_sample: dict[str, list[float]]
    doc_ids: list[int]
    responses: list[str]  # per document: the generation before any filter, or the choice of highest log-likelihood
    higher_is_better: dict[str, bool] = field(default_factory=dict)
    primary: str = ""  # the task's first metric

    def primary_value(self) -> float:
        return self.metrics[self.primary]


_QUIET_LOGGERS = ("lm_eval", "lm-eval", "datasets")
_quiet_lock = threading.Lock()
_quiet_depth = [0, []]  # open _quiet blocks across threads, and the levels the first one found


def _nothing(*args, **kwargs) -> None:
    return None


@contextlib.contextmanager
def _quiet():
    """The harness's and datasets' loggers at ERROR and datasets' progress bars off while the harness runs (it warns
    about every model passed as an object, every ``limit``, every default it fills in); restored when the last block
    of any thread ends."""
    import datasets

    with _quiet_lock:
        if _quiet_depth[0] == 0:
            loggers = [logging.getLogger(n) for n in _QUIET_LOGGERS]
            _quiet_depth[1] = [(lg, lg.level) for lg in loggers] + [datasets.are_progress_bars_disabled()]
            for lg in loggers:
                lg.setLevel(logging.ERROR)
            datasets.disable_progress_bars()
        _quiet_depth[0] += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth[0] -= 1
            if _quiet_depth[0] == 0:
                *levels, bars_were_off = _quiet_depth[1]
                for lg, level in levels:
                    lg.setLevel(level)
                if not bars_were_off:
                    datasets.enable_progress_bars()


@contextlib.contextmanager
def _kept_random_state():
    """The process's random states as they were before the harness seeded them (it seeds ``random``, numpy and torch
    globally): scoring a graft between two steps of a caller's own work does not reset the caller's generators."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def _key(metric: str, filter_name: str) -> str:
    return metric if filter_name == "none" else f"{metric},{filter_name}"


def _number(value) -> float | None:
    """A metric's value as a float; None for what is no number ("N/A", a BLEU sample's (reference, prediction))."""
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return float(value)
    return None


def score(model, tokenizer, task: HarnessTask, limit: int | None = None, batch_size: int = 8, *,
          doc_ids: Sequence[int] | None = None, bootstrap_iters: int = BOOTSTRAP_ITERS) -> HarnessScore:
    """``lm_eval.simple_evaluate`` of ``model`` as it is in memory — a graft entered in place is scored, nothing is
    copied or reloaded — on the documents ``doc_ids`` of ``task``'s evaluation split, or its first ``limit`` (all:
    neither). The first documents need not be a fair sample (graftui_movies' test split lists its positive sentences
    first): give ``doc_ids`` for one.

    ``model`` is a causal LM (or graftui's reader of one, or any ``lm_eval`` LM, used as it is). Generation is greedy
    wherever the task's settings do not sample, under the harness's fixed seeds, so two calls on the same weights give
    the same numbers; the model's train/eval mode and the process's random states are as they were after.
    """
    from lm_eval import evaluator
    from lm_eval.api.model import LM
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    # simple_evaluate describes the machine in every result it returns (torch's collect_env and git, each run as a
    # subprocess: 0.6 s a score on 2 CPU cores); graftui reads none of it, so none is collected
    evaluator.add_env_info, evaluator.get_git_commit_hash = _nothing, _nothing

    if limit is not None and doc_ids is not None:
        raise DataError("give limit or doc_ids, not both")
    if limit is not None and limit < 1:
        raise DataError(f"limit must be at least 1 document, got {limit}")
    if doc_ids is not None:
        doc_ids = sorted({int(i) for i in doc_ids})
        if not doc_ids or doc_ids[0] < 0 or doc_ids[-1] >= task.n_eval:
            raise DataError(f"doc_ids must name documents 0–{task.n_eval - 1} of {task.name}'s {task.eval_split} "
                            "split")
    if batch_size < 1:
        raise DataError(f"batch_size must be at least 1, got {batch_size}")
    lm_model = model.lm if isinstance(model, LMReader) else model
    manager = _manager(task.include_path, task.registry)
    was_training = getattr(lm_model, "training", None)
    try:
        # the harness prints as it bootstraps a corpus metric's stderr (BLEU): on stdout, where a --json report goes
        with _quiet(), _kept_random_state(), stopped_at_line_end(tokenizer, task.output_type == "generate_until"), \
                contextlib.redirect_stdout(io.StringIO()):
            lm = lm_model if isinstance(lm_model, LM) else \
                HFLM(pretrained=lm_model, tokenizer=tokenizer, batch_size=batch_size)
            out = simple_evaluate(model=lm, tasks=[task.name], task_manager=manager, limit=limit,
                                  samples=None if doc_ids is None else {task.name: doc_ids}, log_samples=True,
                                  bootstrap_iters=bootstrap_iters, random_seed=0, numpy_random_seed=1234,
                                  torch_random_seed=1234, fewshot_random_seed=1234)
    finally:
        if was_training is not None:
            lm_model.train(was_training)
    return _reading(task.name, task.output_type, out)


def line_end(tokenizer) -> str | None:
    """The token a generation stops at where the tokenizer has no end-of-sequence token: the newline, graftui's own
    rule (an answer is its first line); None where the newline is not one token of its own."""
    ids = tokenizer.encode("\n", add_special_tokens=False)
    return tokenizer.convert_ids_to_tokens(ids[0]) if len(ids) == 1 else None


def check_stop(tokenizer, task_name: str) -> None:
    """A generate-until task needs a token to stop at: the tokenizer's end of sequence, or else the newline."""
    if tokenizer.eos_token_id is None and line_end(tokenizer) is None:
        raise DataError(f"lm-eval task '{task_name}' generates until the end-of-sequence token, and this model's "
                        "tokenizer has none (nor a newline token to stop at): give a model whose tokenizer sets "
                        "eos_token, or a multiple-choice task")


@contextlib.contextmanager
def stopped_at_line_end(tokenizer, generates: bool):
    """The harness stops a generation at the tokenizer's end-of-sequence token, and fails where there is none: such
    a tokenizer stops at the newline for the while (graftui's own answer rule), and is as it was after."""
    if not generates or tokenizer is None or tokenizer.eos_token_id is not None:
        yield
        return
    stop = line_end(tokenizer)
    if stop is None:
        raise DataError("this model's tokenizer has no end-of-sequence token and no newline token: an lm-eval "
                        "generate-until task cannot stop its generations")
    pad = tokenizer.pad_token
    tokenizer.eos_token = stop
    try:
        yield
    finally:
        tokenizer.eos_token = None
        tokenizer.pad_token = pad


def _response(output_type: str, sample: dict) -> str:
    """What the model answered on one logged document: its generation, or its choice of highest log-likelihood (the
    index of the input, for a task whose choices are inputs)."""
    if output_type == "generate_until":
        first = sample["resps"][0]
        return first[0] if isinstance(first, list) and first and isinstance(first[0], str) else ""
    if output_type == "multiple_choice" and sample["resps"]:
        scores = [r[0][0] for r in sample["resps"]]
        best = max(range(len(scores)), key=lambda i: scores[i])  # the first of equals, as the harness's argmax
        continuations = [args[1] for args in sample["arguments"]]
        return continuations[best] if len(set(continuations)) > 1 else str(best)  # one per input: its number
    return ""


def _reading(name: str, output_type: str, out: dict) -> HarnessScore:
    """The HarnessScore of ``simple_evaluate``'s output for task ``name``."""
    results = out["results"][name]
    metrics, stderr = {}, {}
    for key, value in results.items():
        if "," not in key or key.split(",", 1)[0].endswith("_stderr") or key == "alias":
            continue
        metric, filter_name = key.split(",", 1)
        number = _number(value)
        if number is None:
            continue
        name_ = _key(metric, filter_name)
        metrics[name_] = number
        err = _number(results.get(f"{metric}_stderr,{filter_name}"))
        stderr[name_] = err if err is not None and math.isfinite(err) else None
    samples = sorted(out.get("samples", {}).get(name, []), key=lambda s: s["doc_id"])
    doc_ids = sorted({s["doc_id"] for s in samples})
    per_sample: dict[str, list[float]] = {}
    for s in samples:
        for metric in s.get("metrics", []):
            value = _number(s.get(metric))
            if value is not None:
                per_sample.setdefault(_key(metric, s["filter"]), []).append(value)
    per_sample = {k: v for k, v in per_sample.items() if len(v) == len(doc_ids)}
    first = {}
    for s in samples:
        first.setdefault(s["doc_id"], s)
    responses = [_response(output_type, first[i]) for i in doc_ids]
    higher = {}
    for metric, better in out.get("higher_is_better", {}).get(name, {}).items():
        for key in metrics:
            if key.split(",", 1)[0] == metric:
                higher[key] = bool(better)
    return HarnessScore(name, len(doc_ids) or int(out.get("n-samples", {}).get(name, {}).get("effective", 0)),
                        metrics, stderr, per_sample, doc_ids, responses, higher, next(iter(metrics), ""))


__all__ = ["BOOTSTRAP_ITERS", "FirstDocument", "HarnessScore", "HarnessTask", "OFFLINE", "PREFIX", "answer_filter", "harness_names",
           "file_digests", "file_task", "is_harness_ref", "is_task_file", "load_harness_task", "load_harness_tasks", "offline_dir",
           "score", "task_yaml", "user_dir"]
