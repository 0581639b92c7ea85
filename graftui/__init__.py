"""graftui: find where a fine-tuned model keeps its skill (skill localization by grafting).

Every verb takes its request's fields as keywords (or a ready request) and returns a result::

    import graftui
    result = graftui.localize(base="minilm", finetuned="minilm-movies", task="movies", sparsity=0.001)
    result.k, result.region, result.save("region.safetensors")
    graftui.evaluate(regions=[result.path], baselines=True).rows

``progress`` (a callable taking a dict) and ``cancel`` (a threading.Event) are optional. The verbs
and their request types come from the verb registry (``graftui.flows.VERBS``), loaded on first use
so that ``import graftui`` stays cheap.
"""

import os
from importlib import import_module
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its threads: idle workers sleep, not spin

from .version import __version__  # noqa: F401  (graftui.__version__)

_HERE = Path(__file__).parent
_SUBMODULES = {p.stem for p in _HERE.glob("*.py")} | {p.name for p in _HERE.iterdir() if (p / "__init__.py").exists()}
_TYPES = ("LearnConfig", "FinetuneConfig", "LoadOptions", "GraftableSpec", "Budget")  # value types (graftui.config)


def _verb(entry):
    def call(request=None, /, *, progress=None, cancel=None, **fields):
        _module("flows.registry").check_fields(entry.request, fields, f"{entry.name}()")  # one line, as a config's
        if request is None:
            request = entry.request.make(**fields)
        elif fields:
            request = request.replace(**fields)
        return entry.flow(request, progress=progress, cancel=cancel)

    call.__name__ = call.__qualname__ = entry.name
    call.__doc__ = entry.request.__doc__
    return call


def _module(name: str):
    return import_module(f"{__name__}.{name}")  # not ``from . import``: that would ask __getattr__ again


def __getattr__(attr: str):  # lazy (PEP 562): torch and the models load on first use, not on import
    if attr == "__all__":  # ``from graftui import *``: the verbs, their requests and the value types
        return [name for name in __dir__() if not name.startswith("_")]
    if attr.startswith("_") or attr in _SUBMODULES:  # a submodule not imported yet: the import system's to load
        raise AttributeError(f"module 'graftui' has no attribute {attr!r}")
    flows = _module("flows")
    requests = {v.request.__name__: v.request for v in flows.VERBS.values()}
    if attr in flows.VERBS:
        value = _verb(flows.VERBS[attr])
    elif attr in requests:
        value = requests[attr]
    elif attr in _TYPES:
        value = getattr(_module("config"), attr)
    elif attr in ("run", "run_file"):
        value = getattr(flows, attr)
    elif attr == "load_region":
        value = _module("regions").load
    elif attr == "GraftuiError":
        value = _module("errors").GraftuiError
    else:
        raise AttributeError(f"module 'graftui' has no attribute {attr!r}")
    globals()[attr] = value
    return value


def __dir__():
    flows = _module("flows")
    return sorted({*globals(), *flows.VERBS, *(v.request.__name__ for v in flows.VERBS.values()), *_TYPES,
                   "run", "run_file", "load_region", "GraftuiError"})
