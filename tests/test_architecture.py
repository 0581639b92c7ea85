"""The shape of the house: floors that import only downward, no import cycle, one registry of verbs.

Every import of a graftui module by another is counted, at the top of a module and inside a
function alike, from the source itself (``ast``), against the floor table of graftui/ARCHITECTURE.md.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import pytest

from graftui.flows import Result
from graftui.requests import Request, arg

PACKAGE = Path(__file__).resolve().parents[1] / "graftui"


def modules() -> dict[str, Path]:
    """graftui's modules by dotted name relative to the package ('' for the package itself)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict) -> list[tuple[str, bool]]:
    """(imported module, inside a function) for every import of a graftui module in ``path``."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, (ast.If, ast.Try)) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name.removeprefix("graftui").lstrip(".") for a in node.names
                       if a.name == "graftui" or a.name.startswith("graftui.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base = parts[:len(parts) - node.level + 1] + ([node.module] if node.module else [])
                base = ".".join(p for p in base if p)
            elif node.module == "graftui" or (node.module or "").startswith("graftui."):
                base = node.module.removeprefix("graftui").lstrip(".")
            else:
                continue
            targets = [f"{base}.{a.name}".lstrip(".") if f"{base}.{a.name}".lstrip(".") in known else base
                       for a in node.names]
        else:
            continue
        out += [(t, id(node) not in top) for t in targets if t in known and t != name]
    return out


def parents(module: str) -> set[str]:
    """The packages Python runs before ``module`` (``tasks.completion.data`` runs ``tasks`` and ``tasks.completion``;
    the top package ``graftui`` is the lazy API and is left out)."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {t for t, _ in imports(name, path, known)} for name, path in known.items()}


def floors() -> dict[str, int]:
    """graftui/ARCHITECTURE.md's table: module (or pattern with *) -> floor."""
    table = {}
    for line in (PACKAGE / "ARCHITECTURE.md").read_text().splitlines():
        m = re.match(r"^\| (\d+) \| ([^|]+) \|", line)
        if m:
            for name in m.group(2).split(","):
                table[name.strip()] = int(m.group(1))
    return table


def floor_of(module: str, table: dict[str, int]) -> int | None:
    key = module or "graftui"
    if key in table:
        return table[key]
    return next((f for pattern, f in table.items() if "*" in pattern and re.fullmatch(
        re.escape(pattern).replace(r"\*", r"[\w.]+"), key)), None)


def test_importing_a_module_loads_no_floor_above_it_through_its_packages():
    """Python runs a module's packages before the module: a package on a floor above one of its modules would load
    that floor (and, through it, maybe the module's own importers) with every import of the module."""
    table = floors()
    upward = [f"{m} (floor {floor_of(m, table)}) sits in {p} (floor {floor_of(p, table)})"
              for m in modules() if m for p in parents(m) if floor_of(p, table) > floor_of(m, table)]
    assert not upward, "packages above their modules:\n" + "\n".join(upward)


def test_no_import_cycle_counting_imports_inside_functions():
    g = graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(m or "graftui" for m in cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node)


def test_every_module_is_on_a_floor_and_imports_only_downward():
    table, known = floors(), modules()
    missing = [m or "graftui" for m in known if floor_of(m, table) is None]
    assert not missing, f"modules missing from the floor table of graftui/ARCHITECTURE.md: {missing}"
    stale = [name for name in table if "*" not in name and (name if name != "graftui" else "") not in known]
    assert not stale, f"the floor table names modules that do not exist: {stale}"
    upward = [f"{m or 'graftui'} (floor {floor_of(m, table)}) imports {t} (floor {floor_of(t, table)})"
              for m, targets in graph().items() for t in targets if floor_of(t, table) > floor_of(m, table)]
    assert not upward, "\n".join(upward)


def test_the_library_never_imports_the_web_app():
    offenders = [m for m, targets in graph().items() if not (m == "ui" or m.startswith("ui."))
                 for t in targets if t == "ui" or t.startswith("ui.")]
    assert not offenders, f"modules outside graftui/ui import the app: {offenders}"


def test_no_import_inside_a_function_except_the_lazy_api():
    """Imports of graftui modules sit at the top of a module; the package's lazy API loads with import_module."""
    known = modules()
    local = [f"{name or 'graftui'}: {target}" for name, path in known.items()
             for target, inside in imports(name, path, known) if inside]
    assert not local, local


def test_each_verb_is_registered_once_with_everything_its_front_ends_need():
    import graftui
    from graftui import cli, flows
    from graftui.requests import Request

    assert flows.VERBS, "no verb registered"
    parser_verbs = set(cli.build_parser()._subparsers._group_actions[0].choices)
    for name, verb in flows.VERBS.items():
        assert issubclass(verb.request, Request) and verb.request.verb == name
        assert verb.summary and callable(verb.flow) and callable(verb.text)
        assert name in parser_verbs  # the CLI subcommand comes from the registration
        assert getattr(graftui, name).__doc__ == verb.request.__doc__  # and the Python API
    with pytest.raises(ValueError, match="already registered"):
        flows.verb(flows.VERBS["localize"].request, "again")(lambda *a, **k: None)


@dataclass
class EchoRequest(Request):
    """Say a word back."""

    verb: ClassVar[str] = "echo-test"
    word: str = arg("hello", "the word to say back")


@dataclass
class EchoResult(Result):
    said: str = ""


def test_a_verb_registered_beside_its_flow_reaches_the_cli_the_api_and_graftui_run(tmp_path, capsys):
    """One registration is the whole of a new verb: the CLI subcommand, its options and text, `graftui run`."""
    import json

    from graftui import cli, flows

    try:
        @flows.verb(EchoRequest, "say a word back (a test verb)", lambda doc: f"said {doc['said']}")
        def echo(req, progress=None, cancel=None, guard=flows.LOCAL):
            return EchoResult(req.validate(), said=req.word)

        assert cli.main(["echo-test", "--word", "graft"]) == 0
        assert capsys.readouterr().out.strip() == "said graft"
        config = tmp_path / "echo.json"
        config.write_text(json.dumps({"verb": "echo-test", "word": "again"}))
        assert flows.run_file(config).said == "again"
    finally:
        flows.VERBS.pop("echo-test", None)


def test_derived_requests_carry_every_shared_field():
    """A request made from another (sweep → localize, continual → localize, push → evaluate, export) keeps every
    field of the field groups they share: change each from its default and it must arrive."""
    from graftui.requests import (
        ContinualRequest, EvaluateRequest, ExportRequest, LocalizeRequest, PushRequest, SweepRequest, derive,
        shared_fields,
    )

    changed = {"steps": 3, "lr": 0.5, "optimizer": "adam", "batch_size": 4, "examples_per_class": 8, "binarise": "round",
               "seed": 7, "logit_dtype": "float16", "memory": "lean", "checkpoint_every": 2, "candidates": "4", "rank": "movement",
               "rank_examples": 32, "grow_every": 5, "head": "causal-lm",
               "template": "{text} was", "label_words": "a= x,b= y", "label_scoring": "all", "dtype": "bfloat16",
               "device_map": "auto", "include_embeddings": True, "modules": ["ffn_in"], "base": "b", "finetuned": "f",
               "task": "t", "text_column": "x", "pair_column": "y", "label_column": "z", "config": "c", "seeds": [1, 2],
               "finetuned_replicates": ["g"], "task_kind": "completion", "prompt_column": "q", "completion_column": "a",
               "messages_column": "m", "report_to": "wandb", "answer_regex": "#### (\\S+)", "ignore_case": True, "whole_generation": True,
               "max_new_tokens": 9, "ignore_punctuation": True, "ignore_regex": ["^the "], "answer_whitespace": "remove"}
    for target, source in ((LocalizeRequest, SweepRequest), (LocalizeRequest, ContinualRequest),
                           (EvaluateRequest, PushRequest), (ExportRequest, PushRequest)):
        names = shared_fields(target, source)
        assert names, (target.__name__, source.__name__)
        given = {f.name: changed[f.name] for f in fields(source) if f.name in names}
        assert set(given) == set(names), f"no test value for {set(names) - set(given)}"
        made = derive(target, source.make(**given))
        assert {n: getattr(made, n) for n in names} == given, (target.__name__, source.__name__)


# -- task kinds are objects ---------------------------------------------------------------------------------------
TASK_CLASSES = {"Task", "CompletionTask", "HarnessTask", "HarnessSkill"}
KIND_NAMES = {"classification", "completion", "lm-eval"}
KIND_OBJECTS = {"COMPLETION", "CLASSIFICATION", "COMPLETION_KIND", "HARNESS"}  # a kind, or its reading, by its constant
KIND_TASK_LISTS = {"OFFLINE_TASKS", "OFFLINE_SKILLS"}  # the offline tasks of one kind: membership says which kind
KIND_HOMES = ("tasks",)  # the kinds themselves
KIND_MACHINERY = {"models"}  # how a pair is read (a classifier, label words, a causal LM as itself): another axis than
# the task's kind, which a region file records as the pair's reading


def kind_branches(path: Path) -> list[str]:
    """Where a module asks which kind its task is: isinstance on a task class, a result sniffed by its keys
    ("exact_match" in row), a kind's name or reading compared, a ``generative`` flag, a branch on ``.completion``."""
    tree = ast.parse(path.read_text())
    found = []

    def names(node) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}

    for node in ast.walk(tree):
        shown = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path.name
        where = f"{shown}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2 \
                and names(node.args[1]) & TASK_CLASSES:
            found.append(f"{where} isinstance on a task class")
        elif isinstance(node, ast.Compare):
            consts = {c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)}
            membership = any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
            if "exact_match" in consts and membership:
                found.append(f"{where} a result sniffed by its keys")
            elif consts & KIND_NAMES or names(node) & KIND_OBJECTS:
                found.append(f"{where} a kind's name compared")
            elif membership and names(ast.Tuple(elts=node.comparators)) & KIND_TASK_LISTS:
                found.append(f"{where} a kind's offline tasks asked")
        elif isinstance(node, (ast.Name, ast.arg)) and getattr(node, "id", getattr(node, "arg", None)) in (
                "generative", "is_completion"):
            found.append(f"{where} a generative flag")
        elif isinstance(node, (ast.If, ast.IfExp, ast.BoolOp)):
            test = node.test if not isinstance(node, ast.BoolOp) else node
            if any(isinstance(n, ast.Attribute) and n.attr == "completion" for n in ast.walk(test)):
                found.append(f"{where} a branch on .completion")
            elif any(isinstance(n, ast.Constant) and n.value in KIND_NAMES for n in ast.walk(test)):
                found.append(f"{where} a branch on a kind's name")  # info.get("completion"), row["lm-eval"]
    return sorted(set(found))


def test_no_branch_on_the_task_kind_outside_the_kinds():
    """A verb, a card, a text or the app asks the task's kind (``tasks.kind_of``), never which kind it is."""
    found = []
    for name, path in modules().items():
        if name.split(".")[0] in KIND_HOMES or name in KIND_MACHINERY:
            continue
        found += kind_branches(path)
    assert not found, "branches on the task kind outside graftui/tasks/:\n" + "\n".join(found)


def test_the_kind_branch_check_can_fail(tmp_path):
    """The check above finds each form of branch it names."""
    path = tmp_path / "_probe.py"  # outside the package: a test writes nothing there
    source = ('def f(task, rows, pair, kind):\n'
              '    a = isinstance(task, CompletionTask)\n'
              '    b = "exact_match" in rows[0]\n'
              '    c = kind == "completion"\n'
              '    generative = 1\n'
              '    if pair.completion:\n'
              '        pass\n'
              '    d = kind is CLASSIFICATION\n'
              '    e = task in OFFLINE_SKILLS\n'
              '    return 1 if info.get("completion") else 0\n')
    path.write_text(source)
    found = kind_branches(path)
    assert sorted(f.split(" ", 1)[1] for f in found) == sorted(
        ["isinstance on a task class", "a result sniffed by its keys", "a kind's name compared", "a generative flag",
         "a branch on .completion", "a kind's name compared", "a kind's offline tasks asked",
         "a branch on a kind's name"])
