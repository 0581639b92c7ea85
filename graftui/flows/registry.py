"""One registry of verbs: each verb is registered once, with its request, its flow, its summary and its text.

::

    @verb(LocalizeRequest, "learn a skill region and write it as a skill patch", text.localize)
    def localize(req, progress=None, cancel=None, guard=LOCAL) -> LocalizeResult: ...

The CLI makes one subcommand per registered verb (options from the request's fields, help from
the summary, output from the text renderer), ``import graftui`` one function, the app and
``graftui run FILE`` look requests and flows up here, each flow reporting to the tracker its
request names (``tracking.tracked``). Adding a verb is one registration beside its flow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

from .. import bundle, settings, tracking
from ..errors import RequestError, first_line
from ..formatting import pairs_table
from ..requests import Request
from .common import LOCAL, Guard, Progress, Result, load_region


@dataclass(frozen=True)
class Verb:
    name: str
    request: type[Request]
    flow: Callable[..., Result]  # flow(request, progress=None, cancel=None, guard=LOCAL) -> Result
    summary: str  # one line: the CLI's list of commands, the API's overview
    text: Callable[[dict], str]  # the result (Result.as_dict()) as plain text


VERBS: dict[str, Verb] = {}


def plain_text(doc: dict) -> str:
    """The result of a verb without a renderer of its own: its plain values, one per line."""
    return pairs_table([(k, v) for k, v in doc.items() if isinstance(v, (str, int, float, bool)) and k != "seconds"])


def verb(request: type[Request], summary: str, text: Callable[[dict], str] = plain_text, *,
         tables: Callable[[dict], dict] | None = None, figures: Callable[[dict], dict] | None = None):
    """Decorator: register a flow as the verb of ``request`` (its name is ``request.verb``); ``tables`` and
    ``figures``: what only this verb's result holds, by name, for its report bundle."""

    def register(flow):
        name = request.verb
        if not name:
            raise ValueError(f"{request.__name__} names no verb")
        if name in VERBS:
            raise ValueError(f"a verb named '{name}' is already registered")
        VERBS[name] = Verb(name, request, tracking.tracked(flow), summary, text)  # --report-to, for every verb
        for registry, made in ((bundle.VERB_TABLES, tables), (bundle.VERB_FIGURES, figures)):
            if made is not None:
                registry[name] = made
        return flow

    return register


def from_dict(data: dict) -> Request:
    """A request from its dict (a config file, or the record inside a file graftui wrote)."""
    if not isinstance(data, dict):
        raise RequestError("a request is a mapping with a 'verb' and the verb's fields")
    data = dict(data)
    name = data.pop("verb", None)
    if name not in VERBS:
        raise RequestError(f"unknown verb {name!r}; choose from {', '.join(VERBS)}")
    cls = VERBS[name].request
    check_fields(cls, data, f"'{name}'")
    return cls(**data)


def check_fields(cls, given, who: str) -> None:
    """Refuse, in one line naming them all, a field the request type ``cls`` does not have (``who``: how to name it)."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise RequestError(f"{who} has no field {unknown[0]!r}; its fields are {', '.join(sorted(known))}")


def run(req: Request, progress: Progress | None = None, cancel=None, guard: Guard = LOCAL) -> Result:
    """Run any request with the flow of its verb."""
    return VERBS[req.verb].flow(req, progress=progress, cancel=cancel, guard=guard)


def read_request(path, out: str | None = None, overwrite: bool = False) -> Request:
    """The request in a config (JSON or YAML), a report, a region file or a checkpoint folder.

    A file is data, never authority: a request read back from a file graftui wrote gets a new output place
    (``out``, or the default), never the file it was read from; a config may name where to write only beneath the
    working folder or ``$GRAFTUI_HOME``; and only the caller's ``overwrite`` (the command line's), never the file's,
    replaces an existing file.
    """
    p = Path(str(path)).expanduser()
    if not p.exists():
        raise RequestError(f"no file at '{path}'")
    written = True
    if p.is_dir():
        record = p / "graftui_record.json"
        if not record.exists():
            raise RequestError(f"'{path}' is a folder without a graftui_record.json; give a config, report or region file")
        data = json.loads(record.read_text()).get("request")
    elif p.suffix.lower() == ".safetensors":
        data = load_region(str(p)).meta.request
    else:
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise RequestError(f"cannot read '{path}': {err}") from None
        try:
            if p.suffix.lower() in {".yaml", ".yml"}:
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except Exception as err:  # noqa: BLE001 - any parse error is the file's
            raise RequestError(f"'{path}' is not valid {'YAML' if p.suffix.lower() in {'.yaml', '.yml'} else 'JSON'}: "
                               f"{first_line(err)}") from None
        written = isinstance(data, dict) and "request" in data
        if written:
            data = data["request"]
    if not isinstance(data, dict):
        raise RequestError(f"'{path}' holds no graftui request: a config is a mapping with a 'verb' and its fields "
                           "(files graftui wrote hold theirs)")
    request = from_dict(data)
    request = _beside(request, p.parent if p.is_file() else p)
    if type(request).writes and (out is not None or written):
        request = request.replace(out=out)
    if "overwrite" in {f.name for f in fields(request)}:
        request = request.replace(overwrite=bool(overwrite))
    elif overwrite:
        raise RequestError(f"--overwrite: '{request.verb}' never replaces what it writes; drop --overwrite")
    for name, place in request.destinations().items():
        if _same_file(place, p):
            raise RequestError(f"'{path}' is the file this request was read from, and a run never writes over it: give "
                               "another --out")
        if not (name == "out" and out is not None) and not _may_write(place):
            flag = "--out PATH" if name == "out" else f"'graftui {request.verb} --{name} DIR'"
            raise RequestError(f"'{path}' asks to write '{place}' ({name}), outside the working folder and "
                               f"$GRAFTUI_HOME, or among the {', '.join(KEPT)} graftui keeps there; a request file "
                               f"cannot choose where to write: give {flag} on the command line")
    return request


KEPT = ("checkpoints", "models", "jobs", "sessions", "served")  # $GRAFTUI_HOME's folders graftui itself fills and reads


def _may_write(place: str) -> bool:
    """Whether a place a file names to write lies beneath the working folder or $GRAFTUI_HOME (links resolved), and not
    in a folder graftui keeps there (a default checkpoint written by a file would be read as the default)."""
    try:
        target = Path(place).expanduser().resolve()
        home = settings.home().resolve()
        roots = [Path.cwd().resolve(), home]
    except (OSError, RuntimeError, ValueError):
        return False
    if any(target.is_relative_to(home / kept) for kept in KEPT):
        return False
    return any(target != root and target.is_relative_to(root) for root in roots)


def _same_file(place: str, read: Path) -> bool:
    try:
        return Path(place).expanduser().resolve() == read.resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def _beside(request: Request, folder: Path) -> Request:
    """Region files a config names by a relative path that is not here but is beside the config (a report bundle's
    ``inputs/``) are read from there."""
    changes = {}
    for key in ("region", "regions"):
        value = getattr(request, key, None)
        items = value if isinstance(value, list) else [value]
        if not any(isinstance(i, str) for i in items):
            continue
        fixed = [str(folder / i) if isinstance(i, str) and not Path(i).is_absolute() and not Path(i).exists()
                 and (folder / i).is_file() else i for i in items]
        if fixed != items:
            changes[key] = fixed if isinstance(value, list) else fixed[0]
    return request.replace(**changes) if changes else request


def run_file(path, out: str | None = None, progress: Progress | None = None, cancel=None,
             guard: Guard = LOCAL, overwrite: bool = False) -> Result:
    """``graftui run FILE``: run the request a file holds, again (``out`` and ``overwrite`` are the caller's)."""
    return run(read_request(path, out, overwrite), progress, cancel, guard)
