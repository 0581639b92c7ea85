"""graftui: find where a fine-tuned model keeps its skill (skill localization by grafting).

Every verb takes its request's fields as keywords (or a ready request) and returns a result::

    import graftui
    result = graftui.localize(base="minilm", finetuned="minilm-movies", task="movies", sparsity=0.001)
    result.k, result.region, result.save("region.safetensors")
    graftui.evaluate(regions=[result.path], baselines=True).rows

``progress`` (a callable taking a dict) and ``cancel`` (a threading.Event) are optional.
"""

__version__ = "0.2.0"

_VERBS = ("finetune", "localize", "evaluate", "sweep", "anatomy", "compose", "export", "multitask", "wise", "retrain", "continual",
          "reproduce", "push")
_TYPES = ("FinetuneRequest", "LocalizeRequest", "EvaluateRequest", "SweepRequest", "AnatomyRequest",
          "ComposeRequest", "ExportRequest", "MultitaskRequest", "WiseRequest", "RetrainRequest", "ContinualRequest", "ReproduceRequest", "PushRequest", "LearnConfig", "FinetuneConfig")
__all__ = [*_VERBS, *_TYPES, "run", "run_file", "load_region", "GraftuiError", "__version__"]


def _verb(name: str):
    def call(request=None, /, *, progress=None, cancel=None, **fields):
        from . import flows, requests

        cls = requests.REQUESTS[name]
        if request is None:
            request = cls(**{**cls.defaults(), **fields})
        elif fields:
            request = request.replace(**fields)
        return flows.FLOWS[name](request, progress=progress, cancel=cancel)

    call.__name__ = call.__qualname__ = name
    return call


def __getattr__(attr: str):  # lazy: `import graftui` stays cheap, torch loads on first use
    if attr in _VERBS:
        from . import requests

        fn = _verb(attr)
        fn.__doc__ = requests.REQUESTS[attr].__doc__
        globals()[attr] = fn
        return fn
    if attr in _TYPES:
        from . import requests

        return getattr(requests, attr)
    if attr in ("run", "run_file"):
        from . import flows

        return getattr(flows, attr)
    if attr == "load_region":
        from .regions import load

        return load
    if attr == "GraftuiError":
        from .errors import GraftuiError

        return GraftuiError
    raise AttributeError(f"module 'graftui' has no attribute {attr!r}")
