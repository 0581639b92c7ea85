"""LoRA adapters read as fine-tunes: θ_ft = θ_pre + δ, with δ kept as its low-rank factors.

An adapter folder (or Hub id) holds ``adapter_config.json`` and ``adapter_model.safetensors``. For an
adapted module peft merges δ = scaling · B·A into the base weight (scaling = lora_alpha / r, or
lora_alpha / √r with rsLoRA); graftui never merges it into a second model: ``delta`` forms one
parameter's δ when it is needed and ``take`` reads δ at a region's indices from the factors alone.
Modules trained in full (``modules_to_save``) are kept whole: their fine-tuned value is ``value``.

Every parameter is named as in the base model itself (``model.layers.0.self_attn.q_proj.weight``),
so an adapter lines up with the base's tensors. Anything that is not a plain LoRA delta (other peft
methods, DoRA and the other variants, convolutions, pickled weights) is refused in one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import settings
from .config import DEFAULT_FINETUNED_REFS, MAX_ABS_VALUE
from .errors import ModelError, first_line
from .paths import file_sha256
from .weights import release, take

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PREFIX = "base_model.model."  # peft's prefix on every key of a LoRA adapter for a model
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
METHOD_NAMES = {"IA3": "an IA³", "PREFIX_TUNING": "a prefix-tuning", "PROMPT_TUNING": "a prompt-tuning",
                "P_TUNING": "a p-tuning", "ADALORA": "an AdaLoRA", "LOHA": "a LoHa", "LOKR": "a LoKr",
                "OFT": "an OFT", "BOFT": "a BOFT", "VERA": "a VeRA", "ADAPTION_PROMPT": "an adaption-prompt"}
# initialisations that rewrite the base's weights: the saved factors are relative to a residual base
RESIDUAL_INITS = {"pissa": "PiSSA", "corda": "CorDA", "olora": "OLoRA", "lora_ga": "LoRA-GA", "loftq": "LoftQ"}


@dataclass
class Factors:
    """One parameter's δ as peft stores it: scaling · B·A, transposed where the weight is stored (in, out).

    ``a`` is None for a LoRA bias (``lora_bias``), whose δ is scaling · b.
    """

    a: torch.Tensor | None
    b: torch.Tensor
    scaling: float
    transposed: bool = False
    embedding: bool = False  # peft's Embedding always merges (B·A)ᵀ

    def shape(self) -> tuple[int, ...]:
        if self.a is None:
            return tuple(self.b.shape)
        out, inp = self.b.shape[0], self.a.shape[1]
        return (inp, out) if self.transposed else (out, inp)


@dataclass
class Adapter:
    """A LoRA adapter as a fine-tune of ``base_name``: low-rank δ per adapted parameter, whole tensors per saved one."""

    ref: str
    folder: str
    base_name: str | None
    hash: str  # sha256 of adapter_model.safetensors
    config: dict  # what a record needs: r, alpha, targets, rsLoRA, patterns, modules_to_save, ...
    factors: dict[str, Factors] = field(default_factory=dict)
    saved: dict[str, torch.Tensor] = field(default_factory=dict)

    def names(self) -> list[str]:
        """Every base parameter this adapter changes: adapted ones, then those saved whole."""
        return sorted(self.factors) + sorted(self.saved)

    def delta(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole δ of an adapted parameter, shaped as the base's weight (peft's ``get_delta_weight``, in float32)."""
        f = self._factors(name)
        if f.a is None:
            return (f.b.float() * f.scaling).to(dtype)
        d = f.b.float() @ f.a.float()
        return ((d.T if f.transposed else d) * f.scaling).to(dtype).contiguous()

    def take(self, name: str, flat_idx: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """δ at flat indices of the weight from the factors alone: O(len(idx)·r), B·A never formed."""
        f = self._factors(name)
        idx = flat_idx.long().reshape(-1)
        if f.a is None:
            return (f.b.reshape(-1)[idx].float() * f.scaling).to(dtype)
        width = f.shape()[1]
        row, col = idx // width, idx % width
        out, inp = (col, row) if f.transposed else (row, col)  # (row of B, column of A)
        return ((f.b[out].float() * f.a[:, inp].T.float()).sum(1) * f.scaling).to(dtype)

    def value(self, name: str) -> torch.Tensor:
        """The fine-tuned tensor of a module saved whole (``modules_to_save``, a trained bias)."""
        if name not in self.saved:
            raise ModelError(f"adapter '{self.ref}' does not save {name} whole"
                             + (": it adapts it by LoRA, read its delta" if name in self.factors else ""))
        return self.saved[name]

    def check_base(self, shapes: dict[str, tuple[int, ...]], base_ref: str) -> None:
        """Refuse a base that lacks a parameter this adapter changes or has it in another shape.

        peft decides per layer whether a weight is stored (in, out) (GPT-2's Conv1D) whatever the
        config's ``fan_in_fan_out`` says, so a weight that fits the base only transposed is read so.
        """
        fix = self._fix(base_ref)
        self._check_targets(shapes, base_ref, fix)
        for name in self.names():
            if name not in shapes:
                raise ModelError(f"adapter '{self.ref}' changes {name}, which --base {base_ref} does not have: {fix}")
            want, got = self._shape(name), tuple(shapes[name])
            f = self.factors.get(name)
            if want != got and f is not None and f.a is not None and not f.embedding and want[::-1] == got:
                f.transposed = not f.transposed
            elif want != got:
                raise ModelError(f"adapter '{self.ref}' was trained on a base with {name} of shape {list(want)}; "
                                 f"--base {base_ref} has {list(got)}: {fix}")

    def _fix(self, base_ref: str) -> str:
        """What to do about a base the adapter does not fit: its own base where it names another; where the base given
        is the one it names, no other base is the answer (the adapter was edited or damaged)."""
        if not self.base_name:
            return f"give the base it was trained on (its {CONFIG_NAME} names none)"
        if _same_ref(self.base_name, base_ref):
            return (f"its {CONFIG_NAME} names this base as its own, so the adapter was edited or damaged; give an "
                    "adapter trained on this base")
        return f"give the adapter's own base, '{self.base_name}' per its {CONFIG_NAME}"

    def _check_targets(self, shapes: dict[str, tuple[int, ...]], base_ref: str, fix: str) -> None:
        """Every module its config targets exists in the base (peft's matching: the name, or its last parts); those
        that do not are named together."""
        targets = self.config.get("target_modules")
        modules = {name.rpartition(".")[0] for name in shapes}
        if isinstance(targets, str):
            if not any(re.fullmatch(targets, m) for m in modules):
                raise ModelError(f"adapter '{self.ref}' targets modules matching {targets[:80]!r}, and --base {base_ref} "
                                 f"has none, so the adapter does not fit this base: {fix}")
            return
        missing = [t for t in targets or () if t not in modules and not any(m.endswith("." + t) for m in modules)]
        if missing:
            named = ", ".join(f"'{t[:80]}'" for t in missing[:5]) + (", …" if len(missing) > 5 else "")
            raise ModelError(f"adapter '{self.ref}' targets the module{'s' if len(missing) > 1 else ''} {named}, which "
                             f"--base {base_ref} does not have, so the adapter does not fit this base: {fix}")

    def _shape(self, name: str) -> tuple[int, ...]:
        return self.factors[name].shape() if name in self.factors else tuple(self.saved[name].shape)

    def _factors(self, name: str) -> Factors:
        if name not in self.factors:
            hint = ": it is saved whole, read its value" if name in self.saved else ""
            raise ModelError(f"adapter '{self.ref}' does not adapt {name}{hint}")
        return self.factors[name]


def _same_ref(a: str, b: str) -> bool:
    """Whether two references name one base as written: the same words, or the same folder."""
    if a.strip().lower() == b.strip().lower():
        return True
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve() and Path(a).expanduser().exists()
    except (OSError, ValueError):
        return False


def is_adapter(folder) -> bool:
    """A folder with an adapter_config.json and no full model weights beside it (those make it a checkpoint)."""
    path = Path(folder)
    return (path / CONFIG_NAME).is_file() and not any((path / w).exists() for w in MODEL_WEIGHTS)


def read_adapter(ref: str, *, allow_local: bool = True) -> Adapter:
    """Read a LoRA adapter (local folder or Hub id) as a fine-tune, refusing anything else in one line."""
    folder = _folder(ref, allow_local)
    raw = _raw_config(ref, folder)
    config = _lora_config(ref, raw)
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        pickled = next((p.name for p in sorted(folder.glob("*.bin"))), None)
        raise ModelError(f"adapter '{ref}' has {'only ' + pickled if pickled else 'no ' + WEIGHTS_NAME}: graftui reads "
                         "safetensors weights only, never pickled .bin files (save it again with safe_serialization=True)")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise ModelError(f"adapter '{ref}': {WEIGHTS_NAME} cannot be read ({first_line(err)})") from err
    factors, saved = _parse(ref, tensors, config)
    summary = {"peft_type": "LORA", "r": config.r, "lora_alpha": config.lora_alpha, "use_rslora": config.use_rslora,
               "target_modules": sorted(config.target_modules) if isinstance(config.target_modules, (set, list))
               else config.target_modules, "rank_pattern": dict(config.rank_pattern or {}),
               "alpha_pattern": dict(config.alpha_pattern or {}), "fan_in_fan_out": config.fan_in_fan_out,
               "modules_to_save": list(config.modules_to_save or []), "bias": config.bias,
               "lora_bias": config.lora_bias, "adapted": len(factors), "saved": len(saved)}
    return Adapter(ref=ref, folder=str(folder), base_name=raw.get("base_model_name_or_path") or None,
                   hash=file_sha256(weights), config=summary, factors=factors, saved=saved)


def _folder(ref: str, allow_local: bool) -> Path:
    """The local folder holding the adapter: the path itself, or its Hub snapshot (only its config and safetensors)."""
    ref = (ref or "").strip()
    if not ref:
        raise ModelError("no adapter given: name a LoRA adapter folder or its Hub id")
    path = Path(ref).expanduser()
    if path.exists() or ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        if not allow_local:
            raise ModelError("local paths are not allowed on this server: give the adapter's Hub id")
        if not path.is_dir():
            raise ModelError(f"no adapter folder at '{ref}'")
        return path.resolve()
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", ref) or ".." in ref:
        raise ModelError(f"'{ref}' is neither a local adapter folder nor a Hub id (owner/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError

    try:
        return Path(snapshot_download(ref, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME]))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        raise ModelError(f"adapter '{ref}' is not in the local Hugging Face cache and the Hub cannot be reached "
                         "(offline): run once with a connection, or give a local adapter folder") from err
    except RepositoryNotFoundError as err:
        raise ModelError(f"no Hub repository '{ref}' (or it is private or gated: sign in with a token that can "
                         "read it)") from err
    except OSError as err:  # HTTP errors and a full disk alike
        raise ModelError(f"could not download adapter '{ref}': {first_line(err)}") from err


def _raw_config(ref: str, folder: Path) -> dict:
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise ModelError(f"'{ref}' is not a LoRA adapter: it has no {CONFIG_NAME} "
                         "(a full checkpoint is read as a model, not as an adapter)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelError(f"adapter '{ref}': {CONFIG_NAME} is not valid JSON ({err})") from err
    if not isinstance(raw, dict) or not isinstance(raw.get("peft_type"), str):
        raise ModelError(f"adapter '{ref}': {CONFIG_NAME} names no peft_type; save the adapter again with peft")
    return raw


def _check_types(ref: str, raw: dict) -> None:
    """The fields graftui computes with have the types peft writes, and a finite scale: a forged config is refused
    here, in one line, not by arithmetic on a string later."""
    def bad(key: str, want: str, value) -> ModelError:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "…"
        return ModelError(f"adapter '{ref}': {key} in {CONFIG_NAME} must be {want}, got {shown} "
                          f"({type(value).__name__}): save the adapter again with peft")

    def rank(key: str, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(key, "a whole number ≥ 1", value)

    def alpha(key: str, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad(key, "a finite number", value)
        if abs(value) > MAX_ABS_VALUE:
            raise ModelError(f"adapter '{ref}': {key} {value:g} in {CONFIG_NAME} scales δ far beyond any trained "
                             f"adapter (at most {MAX_ABS_VALUE:g} here): a forged or broken config")

    rank("r", raw.get("r", 8))
    alpha("lora_alpha", raw.get("lora_alpha", 8))
    for key, check in (("rank_pattern", rank), ("alpha_pattern", alpha)):
        pattern = raw.get(key) or {}
        if not isinstance(pattern, dict):
            raise bad(key, "a mapping of module names to numbers", pattern)
        for name, value in pattern.items():
            check(f"{key}[{name!r}]", value)
    for key in ("use_rslora", "fan_in_fan_out", "use_dora"):
        if key in raw and not isinstance(raw[key], bool):
            raise bad(key, "true or false", raw[key])
    targets = raw.get("target_modules")
    if targets is not None and not isinstance(targets, str) and not (
            isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        raise bad("target_modules", "a module name, a list of them or a regular expression", targets)


def _lora_config(ref: str, raw: dict):
    """peft's LoraConfig of ``raw`` (its defaults and checks), refusing what is not a plain LoRA delta."""
    kind = raw["peft_type"].upper()
    if kind != "LORA":
        what = METHOD_NAMES.get(kind, f"a {raw['peft_type']}")
        raise ModelError(f"adapter '{ref}' is {what} adapter: graftui reads LoRA adapters only (their change to the "
                         "weights is δ = scaling·B·A; other methods change activations or weights otherwise)")
    _check_types(ref, raw)
    from peft import LoraConfig

    try:
        config = LoraConfig.from_peft_type(**LoraConfig.check_kwargs(**{k: v for k, v in raw.items()
                                                                          if k != "runtime_config"}))
    except (TypeError, ValueError) as err:
        raise ModelError(f"adapter '{ref}': {CONFIG_NAME} is not a valid LoRA config ({first_line(err)})") from err
    if config.use_dora:
        raise ModelError(f"adapter '{ref}' is a DoRA adapter (use_dora): graftui reads plain LoRA only, as DoRA also "
                         "rescales each weight's columns by a learnt magnitude; merge it into a full checkpoint instead")
    variants = [f.name for f in dataclasses.fields(config) if f.metadata.get("is_lora_variant") and getattr(config, f.name)]
    init = str(config.init_lora_weights).lower()
    init_variants = {f.name: f for f in dataclasses.fields(config)}["init_lora_weights"].metadata.get("lora_variants")
    if init in (init_variants or ()):
        variants.append(f"init_lora_weights={config.init_lora_weights}")
    if config.use_qalora:
        variants.append("use_qalora")
    if variants:
        raise ModelError(f"adapter '{ref}' uses the LoRA variant {', '.join(variants)}: graftui reads plain LoRA only "
                         "(δ = scaling·B·A); merge it into a full checkpoint instead")
    residual = next((name for key, name in RESIDUAL_INITS.items() if init.startswith(key)), None)
    if residual:
        raise ModelError(f"adapter '{ref}' was initialised with {residual}, which rewrites the base's weights: its "
                         "factors are relative to that residual base; save it with peft's "
                         "path_initial_model_for_weight_conversion to make it a plain LoRA of the original base")
    for key, why in (("target_parameters", "LoRA on bare parameters (such as MoE experts)"),
                     ("layer_replication", "layer replication (it changes the model's layers)"),
                     ("trainable_token_indices", "trainable tokens")):
        if getattr(config, key, None):
            raise ModelError(f"adapter '{ref}' uses {why} ({key}): graftui reads LoRA on linear, Conv1D and "
                             "embedding layers only")
    return config


def _parse(ref: str, tensors: dict[str, torch.Tensor], config) -> tuple[dict[str, Factors], dict[str, torch.Tensor]]:
    """Group the file's tensors by the base parameter they change, checking every factor against its r."""
    from peft.utils.other import get_pattern_key

    halves: dict[str, dict[str, torch.Tensor]] = {}  # module -> {"A", "B", "bias", "embedding"}
    saved: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        if not key.startswith(PREFIX):
            raise ModelError(f"adapter '{ref}' holds '{key}', which is no LoRA tensor of a model: "
                             "graftui reads LoRA adapters only")
        rest = key[len(PREFIX):]
        lora = re.fullmatch(r"(.+)\.lora_(A|B)\.(weight|bias)|(.+)\.lora_embedding_(A|B)", rest)
        if lora and lora.group(1):
            part = "bias" if lora.group(3) == "bias" else lora.group(2)
            if part == "bias" and lora.group(2) == "A":
                raise ModelError(f"adapter '{ref}' holds '{key}', a bias on lora_A, which peft never trains")
            halves.setdefault(lora.group(1), {})[part] = tensor
        elif lora:
            halves.setdefault(lora.group(4), {}).update({lora.group(5): tensor, "embedding": tensor})
        elif ".modules_to_save." in rest:
            module, _, tail = rest.partition(".modules_to_save.")
            saved[f"{module}.{tail.partition('.')[2]}"] = tensor
        elif ".base_layer." in rest:
            if not rest.endswith(".weight"):  # a bias trained in full (bias="all" / "lora_only")
                saved[rest.replace(".base_layer.", ".")] = tensor
            # a base_layer weight is the base's own copy peft saves beside an embedding LoRA: not trained
        elif any(part.startswith(("lora_", "ia3_", "hada_", "lokr_", "oft_", "boft_", "vera_")) for part in rest.split(".")):
            raise ModelError(f"adapter '{ref}' holds '{key}', which plain LoRA does not have: graftui reads "
                             "plain LoRA adapters only")
        else:  # a module trained in full, saved under its own name
            saved[rest] = tensor
    factors: dict[str, Factors] = {}
    for module, h in sorted(halves.items()):
        if "A" not in h or "B" not in h:
            raise ModelError(f"adapter '{ref}' has lora_{'B' if 'A' in h else 'A'} of {module} without its partner: "
                             "the adapter file is incomplete")
        a, b = h["A"], h["B"]
        if a.dim() != 2 or b.dim() != 2:
            raise ModelError(f"adapter '{ref}' adapts {module} with {a.dim()}-d factors (a convolution): graftui reads "
                             "LoRA on linear, Conv1D and embedding layers only")
        r = config.rank_pattern.get(get_pattern_key(config.rank_pattern.keys(), module), config.r)
        alpha = config.alpha_pattern.get(get_pattern_key(config.alpha_pattern.keys(), module), config.lora_alpha)
        if a.shape[0] != r or b.shape[1] != r:
            raise ModelError(f"adapter '{ref}': {module} has lora_A {list(a.shape)} and lora_B {list(b.shape)}, which "
                             f"disagree with its r = {r} in {CONFIG_NAME}: the adapter file and its config do not match")
        if r > min(a.shape[1], b.shape[0]) and "embedding" not in h:
            raise ModelError(f"adapter '{ref}': {module} has rank {r}, above its layer's width "
                             f"{min(a.shape[1], b.shape[0])} (lora_A {list(a.shape)}, lora_B {list(b.shape)}): no LoRA "
                             "trainer makes such an adapter")
        scaling = alpha / math.sqrt(r) if config.use_rslora else alpha / r
        _check_size(ref, module, a, b, scaling)
        # peft's Embedding merges (B·A)ᵀ; its Linear transposes only when fan_in_fan_out (Conv1D)
        embedding = "embedding" in h
        factors[f"{module}.weight"] = Factors(a, b, scaling, embedding or bool(config.fan_in_fan_out), embedding)
        if "bias" in h:
            if tuple(h["bias"].shape) != (b.shape[0],):
                raise ModelError(f"adapter '{ref}': the lora_B bias of {module} has shape {list(h['bias'].shape)}, "
                                 f"not [{b.shape[0]}]: the adapter file is damaged")
            factors[f"{module}.bias"] = Factors(None, h["bias"], scaling)
    for name, tensor in saved.items():
        _check_values(ref, name, tensor)
    both = sorted(set(factors) & set(saved))
    if both:
        raise ModelError(f"adapter '{ref}' both trains {both[0]} in full and adapts it by LoRA: graftui reads one or the other")
    if not factors and not saved:
        raise ModelError(f"adapter '{ref}' holds no LoRA weights: {WEIGHTS_NAME} is empty")
    return factors, saved


def _check_values(ref: str, name: str, tensor: torch.Tensor, scaling: float = 1.0) -> None:
    """Finite values within the magnitude any trained weight keeps (``MAX_ABS_VALUE``)."""
    if not tensor.is_floating_point() or not tensor.numel():
        return
    if not bool(torch.isfinite(tensor).all()):
        raise ModelError(f"adapter '{ref}' holds NaN or infinite values in {name}: it cannot be grafted")
    largest = float(tensor.abs().max()) * abs(scaling)
    if largest > MAX_ABS_VALUE:
        raise ModelError(f"adapter '{ref}' changes {name} by {largest:.3g}, far beyond any trained weight (at most "
                         f"{MAX_ABS_VALUE:g} here): a forged or broken adapter")


def _check_size(ref: str, module: str, a: torch.Tensor, b: torch.Tensor, scaling: float) -> None:
    """The factors are finite, and δ = scaling·B·A stays within ``MAX_ABS_VALUE``: bounded first without forming δ
    (Σ_r max|B_:r|·max|A_r:|), formed only where that bound is not enough."""
    for part, tensor in (("lora_A", a), ("lora_B", b)):
        _check_values(ref, f"{module}.{part}", tensor)
    bound = float((b.float().abs().amax(0) * a.float().abs().amax(1)).sum()) * abs(scaling)
    if bound > MAX_ABS_VALUE:
        _check_values(ref, f"{module}.weight", b.float() @ a.float(), scaling)


class AdaptedWeights(Mapping):
    """θ_ft of a pair whose fine-tune is an adapter, a tensor at a time: θ_pre + δ where the adapter adapts,
    its saved tensor where it saves a module whole, θ_pre elsewhere. No second model is ever made.

    ``names`` maps the model's parameter names to the adapter's; ``keys`` are the names the mapping
    lists (the pair's graftable tensors and those the adapter changes). θ_pre + δ is added in θ_pre's
    dtype, as peft's merge adds it.
    """

    def __init__(self, pre: Mapping, adapter: Adapter, names: dict[str, str], keys: list[str]):
        self.pre, self.adapter, self.names, self.keys_ = pre, adapter, dict(names), list(keys)
        self.listed = set(self.keys_)

    def __iter__(self):
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)

    def __contains__(self, name) -> bool:
        return name in self.listed

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self:
            raise KeyError(name)
        base = self.pre[name]
        own = self.names.get(name)
        if own is None:
            return base
        if own in self.adapter.saved:
            return self.adapter.saved[own].to(base.device, base.dtype)
        return base + self.adapter.delta(own, base.dtype).to(base.device)

    def numel(self, name: str) -> int:
        """The tensor's size, without forming it."""
        return self.pre.numel(name) if hasattr(self.pre, "numel") else self.pre[name].numel()

    def release(self, name: str | None = None) -> None:
        """Give back the pages of θ_pre's file read so far (``weights.Checkpoint.release``)."""
        release(self.pre, name)

    def take(self, name: str, index: torch.Tensor) -> torch.Tensor:
        """θ_ft at flat ``index``. A tensor the adapter leaves alone is read there only; an adapted one forms its δ
        (one tensor, for a moment), so the values are bit for bit those of the whole tensor: a sum over the rank taken
        index by index rounds differently from the matrix product."""
        if self.names.get(name) is None:
            return take(self.pre, name, index)
        flat = self[name].reshape(-1)
        return flat[index.to(flat.device)]


def adapter_base(folder: str | Path) -> str | None:
    """The base an adapter folder names in its config (peft's ``base_model_name_or_path``), if any."""
    try:
        raw = json.loads((Path(folder) / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    name = raw.get("base_model_name_or_path") if isinstance(raw, dict) else None
    return name if isinstance(name, str) and name.strip() else None


def own_base(finetuned) -> str | None:
    """The base a fine-tune names as its own: a default fine-tune's, or what a local adapter folder's
    adapter_config.json names (not on a hosted server, whose folders are not a visitor's to read); None otherwise."""
    ref = str(finetuned or "").strip()
    if ref.lower() in DEFAULT_FINETUNED_REFS:
        return DEFAULT_FINETUNED_REFS[ref.lower()][0]
    if settings.hosted() or not ref or len(ref) > 4096:
        return None
    path = Path(ref).expanduser()
    try:
        return adapter_base(path) if path.is_dir() and is_adapter(path) else None
    except OSError:
        return None
