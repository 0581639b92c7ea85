"""The ``graftui`` command: a thin shell over the verb registry (:data:`graftui.flows.VERBS`).

One subcommand per registered verb: its options are generated from its request's fields
(``graftui.requests``), so defaults, help texts and checks are the library's; it builds the
request, runs the flow with a progress bar on stderr (only on a terminal), and prints the result
as the verb's text, or one JSON document with ``--json``; ``--report FILE`` also writes the result
with the request that made it. ``graftui run FILE`` runs the request a config, report or region
file holds. Bad input exits with code 2 and one line on stderr; cheap checks run before any model
is loaded.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (the flows import it): idle workers sleep

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import warnings  # noqa: E402
from dataclasses import fields  # noqa: E402
from typing import Sequence  # noqa: E402

from . import compute, flows, settings  # noqa: E402
from .kinds import KINDS  # noqa: E402
from .errors import MAX_LINE, RequestError, is_user_error, message  # noqa: E402
from .formatting import table  # noqa: E402
from .paths import clean_stale  # noqa: E402
from .localizers import METHODS  # noqa: E402
from .requests import _kind, check_report_file, choices_of, element_kind, parse_list  # noqa: E402
from .version import __version__  # noqa: E402

PROG = "graftui"


class CLIError(RequestError):
    """Bad command-line syntax: exit code 2 and its message on one line."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line instead of usage + message."""

    def error(self, message: str):  # noqa: D102 - argparse hook
        raise CLIError(f"{message} (see '{self.prog} --help')")


# -- options from request fields ----------------------------------------------------------------------
def _typed(kind, many: bool = False):
    """An argparse type: one value (or a comma list) read by the requests' own list reader."""

    def parse(text: str):
        try:
            values = parse_list(text, kind, example="a,b" if kind is str else "1e-4,1e-3" if kind is float else "1,2")
        except RequestError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        if not many and len(values) > 1:
            raise argparse.ArgumentTypeError(f"'{text}' is not one value")
        return values if many else values[0]

    return parse


def add_request_options(parser: argparse.ArgumentParser, cls) -> None:
    """One option per request field: name, type, choices, help and shown default from the field."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(cls):
        meta = f.metadata
        kind = _kind(cls, f.name)
        where = groups.setdefault(meta["group"], parser.add_argument_group(meta["group"])) if meta.get("group") else parser
        flag = meta.get("flag", "--" + f.name.replace("_", "-"))
        text = meta.get("help", "")
        default = cls.defaults()[f.name]
        if default is not None and default is not False and default != [] and "default" not in text:
            shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default) \
                if isinstance(default, list) else (f"{default:g}" if isinstance(default, float) else default)
            text += f" (default {shown})"
        kw = {"dest": f.name, "default": argparse.SUPPRESS, "help": text}
        if kind is bool:
            where.add_argument(flag, action="store_true", **kw)
            continue
        if kind is list:
            element = element_kind(cls, f.name)
            if meta.get("list") == "comma":
                where.add_argument(flag, type=_typed(element, many=True), metavar=meta.get("metavar", "LIST"), **kw)
            else:
                where.add_argument(flag, action="extend", nargs="+", type=element if element is str else _typed(element),
                                   metavar=meta.get("metavar"), **kw)
            continue
        kw["type"] = _typed(kind) if kind in (int, float) else str
        choices = choices_of(cls, f.name)
        if choices:
            kw["choices"] = list(choices)
        else:
            kw["metavar"] = meta.get("metavar")
        where.add_argument(flag, **kw)


def request_from(args: argparse.Namespace, cls):
    """The request the given options describe; every option not given keeps the request's default."""
    return cls.make(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


# -- output ----------------------------------------------------------------------------------------
class Terminal:
    """Results to stdout, progress to stderr (a bar, only on a terminal, never with --json)."""

    def __init__(self, args: argparse.Namespace):
        self.json = bool(getattr(args, "json", False))
        self.live = not self.json and sys.stderr.isatty()
        self._bar = None

    def progress(self, event: dict) -> None:
        if event.get("announce") and not self.json:  # milestones (a plan, its estimate) are printed, bar or not
            if self._bar is not None:
                self._bar.write(str(event["stage"]), file=sys.stderr)
            else:
                print(str(event["stage"]), file=sys.stderr, flush=True)
        if not self.live:
            return
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=100, file=sys.stderr, leave=False, dynamic_ncols=True, bar_format="{l_bar}{bar}| {desc}")
        bar = self._bar
        if "step" in event and "steps" in event:
            fraction = event["step"] / max(event["steps"], 1)
            bar.set_postfix_str(f"step {event['step']}/{event['steps']}" + (
                f" loss {event['loss']:.3f}" if "loss" in event else ""), refresh=False)
        else:
            fraction = event.get("fraction", bar.n / 100)
        if event.get("stage"):
            bar.set_description_str(str(event["stage"])[:60], refresh=False)
        bar.n = round(100 * float(fraction))
        bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def emit(self, doc: dict, text: str) -> None:
        """The result: JSON, or the verb's table followed by its card (what the numbers say)."""
        if not self.json and doc.get("card"):
            text += "\n\n" + "\n".join(textwrap.fill(line, 110, subsequent_indent="  ") for line in doc["card"])
        print(json.dumps(doc, indent=2) if self.json else text)


@contextlib.contextmanager
def _quiet(debug: bool):
    """Library warnings, log records and loading bars stay off stderr (``--debug`` shows them, and graftui's own
    account of each step: where the pair's tensors live, in what precision, and the memory held)."""
    if debug:
        logger = logging.getLogger("graftui")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("graftui: %(message)s"))
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.DEBUG)
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        return
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _no_library_bars() -> None:
    for call in (lambda: __import__("transformers").logging.disable_progress_bar(),
                 lambda: __import__("huggingface_hub.utils", fromlist=["x"]).disable_progress_bars()):
        try:
            call()
        except Exception:  # noqa: BLE001 - cosmetics only
            pass


def run_request(request, args: argparse.Namespace) -> int:
    """Run a request's flow, print its result, and write the report when asked."""
    settings.configure_torch()
    compute.map_large_blocks(compute.COMMAND_BLOCK)  # a short-lived process: what it frees goes back to the system
    clean_stale(settings.home(), depth=4)  # what runs killed mid-write left behind
    _no_library_bars()
    report = getattr(args, "report", None)
    overwrite = bool(getattr(request, "overwrite", False) or getattr(args, "overwrite", False))
    check_report_file(report, overwrite, request.destinations().values())  # before the work a refusal would waste
    out = Terminal(args)
    try:
        result = flows.run(request, progress=out.progress)
    finally:
        out.close()
    doc = result.as_dict()
    text = flows.VERBS[request.verb].text(doc)
    if doc.get("notes"):
        text += "\n\n" + "\n".join(f"note: {n}" for n in doc["notes"])
    if report:
        result.write_report(report, overwrite)  # a report for every verb (a localize result's save writes its region)
        text += f"\n\nreport (with its request) written to {report}"
    out.emit(doc, text)
    return 0


def cmd_verb(args: argparse.Namespace) -> int:
    request = request_from(args, args.request_cls)
    request.validate()  # cheap checks before any model is loaded; the flow checks again
    return run_request(request, args)


def cmd_run(args: argparse.Namespace) -> int:
    # --overwrite is the report's too: a verb that replaces nothing else takes it with --report
    request = flows.read_request(args.file, args.out, args.overwrite and not args.report)
    if args.overwrite and args.report and "overwrite" in {f.name for f in fields(request)}:
        request = request.replace(overwrite=True)
    request.validate()
    places = request.destinations()
    if type(request).writes or places:  # a file handed over is run only after saying where it writes
        seeds = " and, beside it, one per seed (-seedN; a localization also -core and -union)" \
            if isinstance(getattr(request, "seeds", None), list) and request.seeds else ""
        said = ", ".join(f"{name} {place}" for name, place in places.items()) + seeds if places else \
            f"a new place under {settings.home()} (the result names it)"
        print(f"{PROG}: running '{request.verb}' from {args.file}; it writes {said}"
              + ("; --overwrite: an existing file there is replaced" if getattr(request, "overwrite", False) else ""),
              file=sys.stderr)
    return run_request(request, args)


def cmd_methods(args: argparse.Namespace) -> int:
    doc = {"methods": [{"name": m.name, "label": m.label, "needs_data": m.needs_data, "description": m.description}
                       for m in METHODS.values()]}
    rows = [[m.name, "yes" if m.needs_data else "no", m.description] for m in METHODS.values()]
    Terminal(args).emit(doc, table(["method", "data", "description"], rows, "lll"))
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    tasks = [(n, kind.name, d) for kind in KINDS.values() for n, d in kind.offline().items()]
    doc = {"tasks": [{"name": n, "kind": k, "description": d} for n, k, d in tasks]}
    text = table(["task", "kind", "description"], [list(t) for t in tasks], "lll")
    text += ("\n\n--task also takes a CSV/TSV/JSON(L)/Parquet file, a folder of them, or a Hugging Face dataset id: "
             "text and label columns make a classification task, prompt and completion (or messages) columns a "
             "completion task; lm-eval:NAME (or lm-eval:a,b) any lm-evaluation-harness task, scored by the harness.")
    Terminal(args).emit(doc, text)
    return 0


# -- parser ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Find where a fine-tuned model keeps its skill: learn a tiny region of "
                     "parameters that, grafted onto the pre-trained model, recovers the fine-tuned accuracy "
                     "(Panigrahi et al., ICML 2023).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of tables")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback on errors")
    report = _Parser(add_help=False)
    report.add_argument("--report", metavar="FILE", help="also write the result, with its request, as JSON "
                        "('graftui run FILE' makes it again); FILE.zip writes a report bundle: README, request, "
                        "tables as CSV and JSON, figures as HTML")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, verb in flows.VERBS.items():
        p = sub.add_parser(name, parents=[common, report], help=verb.summary, description=verb.request.__doc__,
                           aliases=list(getattr(verb.request, "aliases", ())))
        add_request_options(p, verb.request)
        if "overwrite" not in {f.name for f in fields(verb.request)}:  # where it is, it replaces --report too
            p.add_argument("--overwrite", action="store_true", help="replace the --report file if it exists (refused "
                           "otherwise)")
        p.set_defaults(func=cmd_verb, request_cls=verb.request)
    p = sub.add_parser("run", parents=[common, report], help="run a request again from a config, report or region file",
                       description="Run the request held by a JSON/YAML config ({'verb': ..., fields}), a report, a "
                       "region file or a checkpoint folder graftui wrote. With the same seed a region is made again "
                       "bit for bit.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--out", metavar="PATH", help="where to write (default: the place the file names beneath this folder "
                   "or $GRAFTUI_HOME, else the verb's default place; never the file read)")
    p.add_argument("--overwrite", action="store_true", help="replace the output and the --report file if they exist "
                   "(an 'overwrite' inside the file is ignored)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("methods", parents=[common], help="list localization methods")
    p.set_defaults(func=cmd_methods)
    p = sub.add_parser("tasks", parents=[common], help="list offline tasks")
    p.set_defaults(func=cmd_tasks)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 bad input, 1 unexpected, 130 interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as stop:  # --help and --version
            return int(stop.code or 0) if not isinstance(stop.code, str) else 2
        debug = bool(getattr(args, "debug", False))
        if args.command is None:
            raise CLIError(f"choose a command: {', '.join(flows.VERBS)}, run, methods or tasks (see '{PROG} --help')")
        with _quiet(debug):
            return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `graftui tasks | head -1`: the reader left, nothing to report
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - one line for the user, the traceback behind --debug
        if debug:
            raise
        if is_user_error(err):
            print(f"{PROG}: error: {message(err)}", file=sys.stderr)
            return 2
        text = " ".join(str(err)[:4 * MAX_LINE].split())[:MAX_LINE]
        print(f"{PROG}: error: unexpected {type(err).__name__}: {text} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
