"""A report bundle: one zip with what a result needs to be read, checked and made again.

``README.md`` (the result card, the command that re-makes it, file and model hashes, versions),
``request.json`` (``graftui run request.json`` re-runs it), ``result.json``, every table as CSV and
JSON under ``tables/``, every figure as interactive HTML under ``figures/`` (one shared
``plotly.min.js``, so the bundle opens offline), the region files the request reads under ``inputs/``
and those the run wrote under ``outputs/``.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from . import figures as fig
from .paths import atomic_write, file_sha256
from .regions import RegionMeta, curve_points
from .version import __version__


def _flat(row: dict) -> dict:
    """One CSV row: nested mappings become ``key.sub`` columns, an interval ``key_lo``/``key_hi``."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        elif isinstance(value, (list, tuple)) and len(value) == 2 and key.endswith("_ci"):
            out[f"{key}_lo"], out[f"{key}_hi"] = value
        elif isinstance(value, (list, tuple)):
            out[key] = json.dumps(value)
        else:
            out[key] = value
    return out


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet reads a cell that starts so as a formula


def safe_cell(value):
    """A CSV cell a spreadsheet shows as text: text that would start a formula gets a leading apostrophe (as
    OWASP advises for CSV injection); numbers, and text that is a plain number such as "-0.5", stay as they are."""
    if not isinstance(value, str) or not value.startswith(FORMULA_START):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def _csv(rows: list[dict]) -> str:
    flat = [{safe_cell(key): safe_cell(value) for key, value in _flat(r).items()} for r in rows]  # names are user text too
    columns = list(dict.fromkeys(k for r in flat for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    return buf.getvalue()


def _matrix_rows(names, matrix, what: str) -> list[dict]:
    return [{what: a, **{b: matrix[i][j] for j, b in enumerate(names)}} for i, a in enumerate(names)]


# What only one verb's result holds: its tables and figures, registered with the verb (``flows.registry.verb``)
VERB_TABLES: dict[str, Callable[[dict], dict[str, list[dict]]]] = {}
VERB_FIGURES: dict[str, Callable[[dict], dict]] = {}


def tables(verb: str, result: dict) -> dict[str, list[dict]]:
    """The result's tables by name, as lists of rows: those any result may hold, then the verb's own."""
    out = {}
    if isinstance(result.get("rows"), list) and result["rows"] and isinstance(result["rows"][0], dict):
        out["rows"] = result["rows"]
    names = result.get("names") or result.get("tasks")
    for key in ("overlap", "iou", "intersection_counts", "chance_overlap", "relative_gain"):
        if names and isinstance(result.get(key), list) and len(result[key]) == len(names):
            out[key] = _matrix_rows(names, result[key], "region" if key != "relative_gain" else "region \\ task")
    side = result.get("side_by_side")
    if side:
        out["side_by_side_modules"] = [{"module": m, **{n: side["module_share"][n][j] for n in side["names"]}}
                                       for j, m in enumerate(side["module_labels"])]
        out["side_by_side_overlap"] = _matrix_rows(side["names"], side["overlap"], "region")
    check = result.get("check")
    if isinstance(check, dict) and isinstance(check.get("rows"), list) and check["rows"]:
        out["heldout_check"] = check["rows"]  # a localization's quick check on held-out examples
    if isinstance(result.get("top_modules"), list) and result["top_modules"]:
        out["top_modules"] = result["top_modules"]
    curve = _curve(result)
    if curve:
        out["mask_curve"] = curve
    return {**out, **VERB_TABLES.get(verb, lambda _: {})(result)}


def _curve(result: dict) -> list[dict]:
    """The mask-learning curve a localization's region recorded ({step, loss, accuracy} per step)."""
    meta = result.get("meta")
    return curve_points(RegionMeta.from_dict(meta)) if isinstance(meta, dict) and meta.get("curve") else []


def figures(verb: str, result: dict) -> dict:
    """The result's plotly figures by name (the app draws the same ones): those any result may hold, then the
    verb's own."""
    out, curve = {}, _curve(result)
    if curve:
        out["mask_curve"] = fig.localize_progress(curve, result.get("k"))
    if result.get("reliability"):
        out["reliability"] = fig.reliability_diagram(result["reliability"], result.get("task", ""))
    if result.get("histogram"):
        out["confidence"] = fig.confidence_histogram(result["histogram"], result.get("task", ""))
    if result.get("side_by_side"):
        out["side_by_side"] = fig.side_by_side(result["side_by_side"])
    return {**out, **VERB_FIGURES.get(verb, lambda _: {})(result)}


def _input_files(request: dict) -> list[Path]:
    found = []
    for key in ("region", "regions"):
        value = request.get(key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and Path(item).is_file():
                found.append(Path(item))
    return found


MAX_INPUT_BYTES = 64 << 20  # a region or skill patch larger than this stays out of the bundle (its hash is listed)


def _carried(file, root: Path, folder: str) -> str | None:
    """Copy ``file`` into the bundle's ``folder`` (once) and return its name there; None for a file that is not there
    or is larger than MAX_INPUT_BYTES (it stays out)."""
    path = Path(file)
    if not path.is_file() or path.stat().st_size > MAX_INPUT_BYTES:
        return None
    (root / folder).mkdir(exist_ok=True)
    target = root / folder / path.name
    if not target.exists():
        shutil.copyfile(path, target)
    return f"{folder}/{path.name}"


def with_inputs(request: dict, root: Path) -> dict:
    """The request as the bundle holds it: the region files it reads copied under ``inputs/`` and named there, so
    ``graftui run request.json`` in the unpacked bundle makes the result again on any machine."""
    out = dict(request)
    for key in ("region", "regions"):
        if key not in request:
            continue
        value = request[key]
        items = value if isinstance(value, list) else [value]
        moved = []
        for item in items:
            kept = _carried(item, root, "inputs") if isinstance(item, str) else None
            moved.append(kept or item)
        out[key] = moved if isinstance(value, list) else moved[0]
    return out


def _header_meta(path: Path) -> dict:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = json.loads((fh.metadata() or {}).get("meta", "{}"))
        return meta if isinstance(meta, dict) else {}
    except Exception:  # noqa: BLE001 - not a region file: no hashes to report
        return {}


def readme(request: dict, result: dict, version: str, root: Path | None = None) -> str:
    import torch
    import transformers

    verb = request.get("verb", "?")
    lines = [f"# graftui {verb}", ""]
    if result.get("card"):
        lines += [*(f"- {line}" for line in result["card"]), ""]
    for note in result.get("notes") or []:
        lines.append(f"Note: {note}\n")
    lines += ["## Make it again", "", "```", "graftui run request.json", "```", "",
              "`request.json` holds every setting of the request (defaults included); with the same seed and "
              "inputs the numbers come out the same.", "", "## Inputs", ""]
    for path in _input_files(request):
        lines.append(f"- `{path.name}`: sha256 `{file_sha256(path)}`")
    for key in ("base", "finetuned", "task"):
        if request.get(key):
            lines.append(f"- {key}: `{request[key]}`")
    metas = [result.get("meta") or {}] + [_header_meta(p) for p in _input_files(request)]
    for key in ("base_sha256", "finetuned_sha256"):
        for value in dict.fromkeys(m.get(key) for m in metas if m.get(key)):
            lines.append(f"- {key.replace('_sha256', '')} model (sha256 of its weights): `{value}`")
    files = {"inputs": "- `inputs/`: the region files the request reads (`request.json` names them there)",
             "outputs": "- `outputs/`: the region files the run wrote",
             "tables": "- `tables/*.csv`, `tables/*.json`: every table",
             "figures": "- `figures/*.html`: every figure (interactive; the camera icon saves a PNG)"}
    there = [line for name, line in files.items() if root is None or (root / name).is_dir()]
    lines += ["", "## Files", "", "- `result.json`: the result as `--json` prints it", *there, "", "## Versions", "",
              f"graftui {version}, torch {torch.__version__}, transformers {transformers.__version__}", ""]
    return "\n".join(lines)


def write(request: dict, result: dict, path, version: str = __version__, outputs=(), exclusive: bool = False) -> Path:
    """Write the bundle of one result (``request`` as ``Request.as_dict()`` gives it) to ``path`` (.zip);
    ``outputs``: the region files the run wrote (each at most MAX_INPUT_BYTES is copied); ``exclusive``: never over
    an existing file (paths.atomic_write)."""
    path = Path(path).expanduser()
    verb = request.get("verb", "result")
    with tempfile.TemporaryDirectory(prefix="graftui-bundle-") as tmp:
        root = Path(tmp)
        made_tables = tables(verb, result)
        if made_tables:
            (root / "tables").mkdir()
        for name, rows in made_tables.items():
            (root / "tables" / f"{name}.csv").write_text(_csv(rows))
            (root / "tables" / f"{name}.json").write_text(json.dumps(rows, indent=2))
        made = figures(verb, result)
        if made:
            (root / "figures").mkdir()
            for name, figure in made.items():
                figure.write_html(root / "figures" / f"{name}.html", include_plotlyjs="directory", full_html=True)
        for file in outputs:
            _carried(file, root, "outputs")
        (root / "request.json").write_text(json.dumps(with_inputs(request, root), indent=2))
        (root / "result.json").write_text(json.dumps(result, indent=2))
        (root / "README.md").write_text(readme(request, result, version, root))

        def pack(target):
            with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
                for file in sorted(root.rglob("*")):
                    if file.is_file():
                        zf.write(file, f"{path.stem}/{file.relative_to(root)}")

        return atomic_write(path, pack, exclusive=exclusive)
