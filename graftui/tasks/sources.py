"""Where a task's rows come from, before any kind reads them: a local CSV, TSV, JSON(L) or Parquet file, a folder of
them, or a Hugging Face dataset, as raw tables per split. Every kind's reader (classification/data.py,
completion/data.py) starts here, so each file is checked once, the same way: sizes, cells and shapes before a byte is
trusted.
"""

from __future__ import annotations

import csv
import difflib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import settings
from ..errors import DataError
from ..paths import DATA_SUFFIXES

# the offline classification tasks: a name that is neither a file nor a Hub id (classification/data.py reads them)
OFFLINE_TASKS: dict[str, str] = {
    "movies": "Movie review snippets, negative vs positive (VADER ground truth, ~10k sentences)",
    "amazon": "Amazon review snippets, negative vs positive (VADER; out-of-distribution for movies)",
    "tweets": "Tweets, negative vs positive (VADER; out-of-distribution for movies)",
    "bbc": "BBC News articles, 5 topics: business, entertainment, politics, sport, tech",
}


@dataclass(frozen=True)
class Source:
    """Raw tables of a file or dataset before columns are mapped to text and label."""

    name: str
    description: str
    tables: dict[str, Any]  # split name -> pandas.DataFrame or datasets.Dataset
    class_names: dict[str, tuple[str, ...]]  # column -> ClassLabel names


def _is_frame(table: Any) -> bool:
    return hasattr(table, "iloc")


def columns_of(table: Any) -> list[str]:
    return [str(c) for c in table.columns] if _is_frame(table) else list(table.column_names)


def values_of(table: Any, column: str) -> list:
    return table[column].tolist() if _is_frame(table) else list(table[column])


def head_rows(table: Any, n: int) -> list[dict]:
    if _is_frame(table):
        return table.head(n).to_dict("records")
    return table.select(range(min(n, len(table)))).to_list()


_FILE_SUFFIXES = DATA_SUFFIXES
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_SPLIT_ALIASES = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing"),
}


def _looks_like_path(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~", ".\\")) or ref.lower().endswith(_FILE_SUFFIXES) or "\\" in ref


def builder_names() -> set[str]:
    """The datasets library's packaged loaders (csv, json, text, parquet, imagefolder …): given as a dataset
    id they read files from the working directory, so they are never a dataset here."""
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:  # a datasets release that moved them: the well-known ones still count
        return {"csv", "json", "text", "parquet", "arrow", "pandas", "imagefolder", "audiofolder", "webdataset", "xml"}
    return set(_PACKAGED_DATASETS_MODULES)


def resolve_source(ref: str, allow_local: bool) -> tuple[str, str]:
    """Classify `ref` as ("offline", name), ("local", path) or ("hub", id), refusing what is not allowed."""
    key = ref.strip().lower()
    if not key:
        raise DataError(f"no dataset given; name an offline task ({', '.join(OFFLINE_TASKS)}), a file, or a Hugging Face dataset id")
    if key in OFFLINE_TASKS:
        return "offline", key
    path = Path(ref).expanduser()
    try:
        exists = path.exists()
    except OSError:  # a name longer than the file system takes (Errno 36) names no file, and no dataset id either
        raise DataError(f"no such file or folder: '{ref[:60]}…' ({len(ref):,} characters, longer than any file "
                        "name); name an offline task, a file or a Hugging Face dataset id") from None
    if exists or _looks_like_path(ref):
        if not allow_local:
            raise DataError(f"local paths such as '{ref}' are disabled here; use an offline task ({', '.join(OFFLINE_TASKS)}) or a Hugging Face dataset id")
        if not exists:
            raise DataError(f"no such file or folder: '{ref}'")
        return "local", str(path)
    if key in builder_names():
        raise DataError(f"'{ref}' names a loader of the datasets library, not a dataset; give the file itself "
                        f"(upload it in the app), a Hugging Face dataset id, or an offline task ({', '.join(OFFLINE_TASKS)})")
    close = difflib.get_close_matches(key, OFFLINE_TASKS, n=1, cutoff=0.8)
    if "/" not in ref and close:
        raise DataError(f"unknown task '{ref}'; did you mean '{close[0]}'? Offline tasks are: {', '.join(OFFLINE_TASKS)}")
    if not _HUB_ID.match(ref) or ".." in ref or "--" in ref:
        raise DataError(
            f"'{ref}' is neither an offline task ({', '.join(OFFLINE_TASKS)}), a local file, nor a Hugging Face dataset id"
        )
    return "hub", ref


def check_named(spec, fields: tuple[str, ...], columns: list[str], source: str) -> None:
    """Each column a request names (the ``fields`` of ``spec`` it sets) is one of the source's, or one line listing
    those there are."""
    for field in fields:
        column = getattr(spec, field)
        if column is not None and column not in columns:
            raise DataError(f"column '{column}' ({field}) not found in {source}; available columns: {', '.join(columns)}")


def check_rows(source: "Source") -> None:
    """A source with no rows at all (an empty file, a CSV with only its header) is refused."""
    if not source.tables or not any(len(t) for t in source.tables.values()):
        raise DataError(f"{source.name} is empty: it holds no rows (a header alone is not a dataset)")


def check_reference(ref: str, *, allow_local: bool = True) -> str:
    """Classify a dataset reference without loading it ("offline", "local" or "hub"), or raise DataError."""
    return resolve_source(ref, allow_local)[0]


def _first_sentence(exc: BaseException, limit: int = 300, hide: Path | None = None) -> str:
    """The start of a library's error; ``hide``: a file whose folder is the server's business, named by its name."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if hide is not None:
        for form in {str(hide), str(Path(hide).resolve())}:
            text = text.replace(form, hide.name)
    text = text.split(" Example of usage")[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _class_names_of(datasets_obj: Any) -> dict[str, tuple[str, ...]]:
    import datasets

    out: dict[str, tuple[str, ...]] = {}
    tables = datasets_obj.values() if isinstance(datasets_obj, dict) else [datasets_obj]
    for table in tables:
        for column, feature in table.features.items():
            if isinstance(feature, datasets.ClassLabel):
                out.setdefault(column, tuple(feature.names))
    return out


def _from_datasets(obj: Any, name: str, description: str) -> Source:
    """Wrap a datasets.Dataset or DatasetDict; a lone Dataset is one pool to carve from."""
    tables = dict(obj) if isinstance(obj, dict) else {"train": obj}
    return Source(name, description, tables, _class_names_of(obj))


def _load_hub(ref: str, config: str | None) -> Source:
    import datasets

    try:
        obj = datasets.load_dataset(ref, config)
    except Exception as exc:  # noqa: BLE001 - network, auth and config errors all reach the user the same way
        hint = f"; offline tasks are: {', '.join(OFFLINE_TASKS)}" if "/" not in ref else ""
        raise DataError(f"could not load dataset '{ref}' from the Hugging Face Hub: {_first_sentence(exc)}{hint}") from exc
    name = f"{ref}/{config}" if config else ref
    where = f"Hugging Face Hub dataset {ref}" + (f" (config {config})" if config else "")
    return _from_datasets(obj, name, where)


def _check_size(path: Path) -> None:
    """A text file decodes to its own size: refuse one larger than GRAFTUI_MAX_DATA_MB before reading it."""
    size = path.stat().st_size / 2**20
    if size > settings.MAX_DATA_MB:
        raise DataError(f"'{path.name}' holds {size:,.0f} MB; graftui reads at most {settings.MAX_DATA_MB:,.0f} MB from one "
                        "file (GRAFTUI_MAX_DATA_MB)")


def _cell_too_long(path: Path, where: str) -> DataError:
    return DataError(f"a cell of '{path.name}' ({where}) holds more than {settings.MAX_CELL_CHARS:,} characters; graftui "
                     "reads at most that many per cell (GRAFTUI_MAX_CELL_CHARS)")


def _scan_csv(path: Path, sep: str) -> None:
    """Read the file once as the csv module streams it: a cell over GRAFTUI_MAX_CELL_CHARS, a header naming one
    column twice, or a row with more cells than the header (which pandas would silently read as an index) is
    refused with the line it is on, before any table is built."""
    csv.field_size_limit(settings.MAX_CELL_CHARS)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh, delimiter=sep)
            header = next(reader, None)
            if header is None:
                return
            names = [h.strip() for h in header]
            twice = sorted({n for n in names if names.count(n) > 1 and n})
            if twice:
                raise DataError(f"'{path.name}' has {names.count(twice[0])} columns named '{twice[0]}'; rename all but one")
            for row in reader:
                if len(row) > len(header):
                    raise DataError(f"line {reader.line_num} of '{path.name}' has {len(row)} cells but the header names "
                                    f"{len(header)}: quote texts that hold a '{sep}' (\"like, this\")")
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise _cell_too_long(path, f"line {reader.line_num}") from None
        raise DataError(f"could not read '{path.name}' as {path.suffix[1:].upper()}: {_first_sentence(exc, hide=path)}") from None


def _read_csv(path: Path, strings: bool = False) -> Any:
    """A CSV or TSV file; with ``strings`` every cell is kept as written (" 007" stays " 007", not the number 7)."""
    import pandas as pd

    _check_size(path)
    sep = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        _scan_csv(path, sep)
    except UnicodeDecodeError:
        raise DataError(f"'{path.name}' is not UTF-8 text") from None
    try:
        # only empty cells count as missing, so texts such as "NA" or "null" survive
        return pd.read_csv(path, sep=sep, keep_default_na=False, na_values=[""], **({"dtype": str} if strings else {}))
    except pd.errors.EmptyDataError:
        raise DataError(f"'{path.name}' is empty") from None
    except UnicodeDecodeError:
        raise DataError(f"'{path.name}' is not UTF-8 text") from None
    except (pd.errors.ParserError, ValueError) as exc:
        raise DataError(f"could not read '{path.name}' as {path.suffix[1:].upper()}: {_first_sentence(exc, hide=path)}") from None


def _read_json(path: Path) -> Any:
    """JSON Lines, a JSON array of objects (one per row), or one object of equal-length columns."""
    import pandas as pd

    _check_size(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(f"'{path.name}' is not UTF-8 text") from None
    records: list = []
    data: Any = None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # not one JSON document: read it as JSON Lines below
        except RecursionError:
            raise DataError(f"'{path.name}' nests too deeply to be a table of rows") from None
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        if len({len(v) for v in data.values()}) != 1:
            raise DataError(f"the columns of '{path.name}' have different lengths")
        for column, values in data.items():
            _check_cells(path, values, lambda i, c=column: f"column '{c}', row {i}")
        return pd.DataFrame(data)
    if data is not None:
        records = data if isinstance(data, list) else [data]
    else:
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"line {number} of '{path.name}' is not valid JSON: {exc}") from None
            except RecursionError:
                raise DataError(f"line {number} of '{path.name}' nests too deeply to be a row") from None
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise DataError(f"row {number} of '{path.name}' is not a JSON object with named fields")
        _check_cells(path, record.values(), lambda i, n=number: f"row {n}")
    return pd.DataFrame.from_records(records)


def _check_cells(path: Path, values, where) -> None:
    for i, value in enumerate(values, 1):
        if isinstance(value, str) and len(value) > settings.MAX_CELL_CHARS:
            raise _cell_too_long(path, where(i))


def _read_parquet(path: Path) -> tuple[Any, dict[str, tuple[str, ...]]]:
    """A Parquet table, plus ClassLabel names when it was written by the datasets library."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata  # the footer alone: what the file decodes to, before any page is read
        chunks = [(meta.row_group(g).num_rows, meta.row_group(g).column(c))
                  for g in range(meta.num_row_groups) for c in range(meta.num_columns)]
        decoded = sum(chunk.total_uncompressed_size for _, chunk in chunks) / 2**20
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several unrelated types for bad files
        raise DataError(f"could not read '{path.name}' as Parquet: Could not open Parquet input source '{path.name}': "
                        f"{_first_sentence(exc, hide=path)}") from None
    if decoded > settings.MAX_DATA_MB:
        raise DataError(f"'{path.name}' decodes to {decoded:,.0f} MB; graftui reads at most {settings.MAX_DATA_MB:,.0f} MB "
                        "from one file (GRAFTUI_MAX_DATA_MB)")
    for rows, chunk in chunks:  # n rows decoding to more than n full cells (4 bytes a character) hold one over the limit
        if chunk.total_uncompressed_size > 4 * settings.MAX_CELL_CHARS * max(rows, 1) + 2**16:
            raise _cell_too_long(path, f"column '{chunk.path_in_schema}'")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several unrelated types for bad files
        raise DataError(f"could not read '{path.name}' as Parquet: {_first_sentence(exc, hide=path)}") from None
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            longest = pc.max(pc.utf8_length(column)).as_py()
            if longest is not None and longest > settings.MAX_CELL_CHARS:
                raise _cell_too_long(path, f"column '{name}'")
    names: dict[str, tuple[str, ...]] = {}
    if table.schema.metadata and b"huggingface" in table.schema.metadata:
        import datasets

        try:
            features = datasets.Features.from_arrow_schema(table.schema)
            names = {c: tuple(f.names) for c, f in features.items() if isinstance(f, datasets.ClassLabel)}
        except Exception:  # noqa: BLE001 - the metadata only adds label names; the table is still usable
            names = {}
    return table.to_pandas(), names


def _read_file(path: Path, strings: bool = False) -> tuple[Any, dict[str, tuple[str, ...]]]:
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return _read_csv(path, strings), {}
    if suffix in (".json", ".jsonl"):
        return _read_json(path), {}
    if suffix == ".parquet":
        return _read_parquet(path)
    raise DataError(f"cannot read '{path.name}': supported files are {', '.join(_FILE_SUFFIXES)}")


def _split_of(stem: str) -> str:
    """Split name of a data file, understanding Hub shard names such as train-00000-of-00002."""
    return stem.split("-")[0].lower()


def _load_local(path_str: str, strings: bool = False) -> Source:
    path = Path(path_str)
    name = path.name
    if path.is_file():
        table, names = _read_file(path, strings)
        return Source(name, f"local file {path.resolve()}", {_split_of(path.stem): table}, names)
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        import datasets

        try:
            obj = datasets.load_from_disk(str(path))
        except Exception as exc:  # noqa: BLE001 - a damaged save can fail in many ways
            raise DataError(f"could not load the saved dataset in '{path}': {_first_sentence(exc)}") from None
        return _from_datasets(obj, name, f"local dataset {path.resolve()} (datasets.save_to_disk)")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in _FILE_SUFFIXES)
    if not files:
        raise DataError(f"folder '{path}' holds no {', '.join(_FILE_SUFFIXES)} files and no saved dataset")
    import pandas as pd

    grouped: dict[str, list] = {}
    class_names: dict[str, tuple[str, ...]] = {}
    for file in files:
        table, names = _read_file(file, strings)
        grouped.setdefault(_split_of(file.stem), []).append(table)
        class_names.update(names)
    tables = {split: parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True) for split, parts in grouped.items()}
    return Source(name, f"local folder {path.resolve()}", tables, class_names)


def load_source(kind: str, target: str, config: str | None = None, strings: bool = False) -> Source:
    """The raw tables ``resolve_source`` found: a local file or folder, or a Hub dataset (``config``: its config)."""
    return _load_local(target, strings) if kind == "local" else _load_hub(target, config)


def read_tables(ref: str | os.PathLike, config: str | None = None, *, allow_local: bool = True
                ) -> tuple[str, str, dict[str, list[dict]]]:
    """A local file or folder, or a Hub dataset, as (name, provenance, {split: rows as dicts}), for readers of
    other task kinds (completion/data.py), every CSV cell as written; the checks and refusals are those of ``load_task``."""
    kind, target = resolve_source(os.fspath(ref), allow_local)
    if kind == "offline":
        raise DataError(f"'{ref}' is an offline classification task; give a file or dataset with the columns asked")
    source = load_source(kind, target, config, strings=True)
    check_rows(source)
    rows = {}
    for split, table in source.tables.items():
        columns = columns_of(table)
        values = [values_of(table, c) for c in columns]
        rows[split] = [dict(zip(columns, cells)) for cells in zip(*values)]
    return source.name, source.description, rows


def pick_split(splits: Sequence[str], wanted: str | None, role: str) -> str | None:
    """The source split that serves as ``role`` (train, validation, test): ``wanted``, or the usual names."""
    return pick_table_split(dict.fromkeys(splits), wanted, role, f"{role}_split")


def pick_table_split(tables: dict[str, Any], wanted: str | None, role: str, field: str) -> str | None:
    if wanted is not None:
        if wanted not in tables:
            raise DataError(f"split '{wanted}' ({field}) not found; available splits: {', '.join(tables)}")
        return wanted
    by_lower = {k.lower(): k for k in tables}
    return next((by_lower[a] for a in _SPLIT_ALIASES[role] if a in by_lower), None)
