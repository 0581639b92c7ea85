"""Value types and defaults: every number graftui starts from, written once.

How a region is learned (:class:`LearnConfig`), how a pair is read (:class:`LoadOptions`), how a
model is fine-tuned (:class:`FinetuneConfig` and the recipes), which parameters a region may hold
(:class:`GraftableSpec`), how large it may be (:class:`Budget`), and the offline defaults the
verbs fall back on. Plain frozen dataclasses and constants: no model, no data set, no torch, so
everything above (the maths, the requests, the front ends) reads its defaults from here.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from . import settings
from .errors import BudgetError, RequestError
from .layout import MODULE_TYPES, param_role  # noqa: F401  (MODULE_TYPES: the module types regions are read by)
from .version import __version__

# -- the offline defaults --------------------------------------------------------------------------
DEFAULT_BASE = "minilm"
DEFAULT_FINETUNED = "minilm-movies"
DEFAULT_TASK = "movies"
DEFAULT_FINETUNED_REFS = {  # built on first use, then cached
    DEFAULT_FINETUNED: (DEFAULT_BASE, DEFAULT_TASK),
    "smollm2-movies": ("smollm2", DEFAULT_TASK),  # prompt-based fine-tuning of a causal LM (the paper's main setting)
    "smollm2-dates": ("smollm2", "dates"),  # generative skills: supervised fine-tuning on (prompt, completion) pairs
    "smollm2-numbers": ("smollm2", "numbers"),
    "smollm2-dates-lora": ("smollm2", "dates"),  # the same skill as a LoRA adapter of the base (an adapter folder)
}
# how long each takes to build, about, on 2 CPU cores (docs/tasks.md): a job that builds one first says so
DEFAULT_BUILD_SECONDS = {DEFAULT_FINETUNED: 120, "smollm2-movies": 150, "smollm2-dates": 270, "smollm2-numbers": 270,
                         "smollm2-dates-lora": 450}
GENERATIVE_DEFAULTS = ("smollm2-dates", "smollm2-numbers")  # the offline generative default and its second skill
SENTIMENT_TASKS = ("movies", "amazon", "tweets")  # one label space: each is out of distribution for the others
DEFAULT_MULTITASK_TASKS = ("movies", "amazon", "bbc")  # a similar pair (two sentiment tasks) and a dissimilar task
DEFAULT_MULTITASK = "minilm-multitask"  # cache key of the default multi-task fine-tune
DEFAULT_SPARSITY = 1e-3  # a classification (or harness) task's budget when a request names none
# A completion task's: the offline skills' AdamW fine-tunes keep their exact match only at 1 % (dates 0.91 against
# 0.01 at 0.1 %; docs/experiments.md, "The paper's Fig. 5 on generative skills"). TaskKind.sparsity holds each.
COMPLETION_SPARSITY = 1e-2
# test examples on which localize scores its region at once, beside FT and the empty region: a quick check (about
# ±4 pts at 200), where Compare scores them all
DEFAULT_CHECK_N = 200
DEFAULT_EXAMPLES_PER_CLASS = 256  # k-shot examples for mask learning; fewer overfit the mask (measured)
# the two reference models of every comparison: θ_ft, and θ_pre with the fine-tuned head (the empty region). A
# language model read through label words has no head of its own: its empty region is the pre-trained model read
# through the same prompt, zero-shot.
FT_LABEL, BODY_LABEL = "fine-tuned", "pre-trained body + FT head"
LM_BODY_LABEL = "pre-trained, same prompt"
BODY_LABELS = (BODY_LABEL, LM_BODY_LABEL)


def body_label(prompted: bool) -> str:
    """The empty region's name for a pair read as a classifier, or through a prompt's label words."""
    return LM_BODY_LABEL if prompted else BODY_LABEL


def is_body(model: str) -> bool:
    return model in BODY_LABELS


MAX_ABS_VALUE = 1e4  # trained weights stay far below this (SmolLM2's largest is 9.3): a patch or an adapter beyond
# it is forged or broken


# -- mask learning -------------------------------------------------------------------------------------
LOGIT_DTYPES = ("float32", "float16", "bfloat16")
MEMORY_MODES = ("auto", "fast", "lean")
MASK_OPTIMIZERS = ("normalized", "adam", "sgd")
BINARISE_RULES = ("topk", "round")


@dataclass(frozen=True)
class LearnConfig:
    """Hyper-parameters of mask learning (method.MaskLearner). Defaults work across models (measured)."""

    steps: int = 40
    lr: float = 0.02  # RMS step in logit units for "normalized"; per-coordinate for "adam"; raw η for "sgd"
    optimizer: str = "normalized"  # "normalized" | "adam" | "sgd" (the paper's)
    norm: str = "rms"  # what "normalized" divides by: "rms" or "max" of ∇_ℓ over the graftable set
    forward: str = "relaxed"  # "relaxed" (Eq. 2) or "hard": the binarised region, straight-through
    within_budget: bool = False  # after each step, shift ℓ so that at most k parameters have γ ≥ ½ (order kept)
    sigmoid_bias: float = 3.0  # S starts at −bias: σ(S) ≈ 0.047
    binarise: str = "topk"  # "topk" | "round"
    logit_dtype: str = "float32"  # precision of ℓ: float16 or bfloat16 halve its memory (one value per graftable parameter)
    memory: str = "auto"  # "fast" keeps σ(ℓ) and δ between passes (two more copies), "lean" recomputes them; same region
    checkpoint_every: int | None = None  # recompute every n-th layer's activations in the backward pass (0: keep them
    # all; None: the memory plan decides); same region
    candidates: str = "auto"  # "auto" (c = 5 on every machine), "all" (the full relaxation), or a factor c ≥ 1: ℓ is kept
    # only over C = γ_base and the ⌈c·k⌉ − k parameters the first step's gradient ranks highest
    rank: str = "gradient"  # how C's other parameters are ranked: "gradient" (−∇_θL ⊙ δ at the relaxation's start) or
    # "movement" (|δ|)
    rank_examples: int = 256  # training examples the gradient ranking reads, in whole batches (docs/method.md: on
    # minilm-movies the region then shares an IoU of 0.957 with the full learner's, against 0.908 with one batch of 16)
    grow_every: int = 10  # steps between the passes that add to C the parameters whose gradient would carry them into
    # the region (0: never)
    batch_size: int = 16
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def candidate_factor(value) -> float | None:
        """The factor c of ``candidates`` (None for "all" and "auto"); a ValueError, in one line, for anything else.

        c < 1 is refused: γ_base (the top-k of |δ|) must lie inside C, or the relaxation could not start there.
        """
        text = str(value).strip()
        if text.lower() in CANDIDATE_CHOICES:
            return None
        try:
            factor = float(text)
        except ValueError:
            factor = None
        if factor is None or not math.isfinite(factor):
            raise ValueError(f"--candidates {text[:40]!r} is not a factor: give 'auto', 'all' or a factor c ≥ 1 "
                             "(C holds c·k parameters: the budget and those the gradient ranks next)")
        if factor < 1:
            raise ValueError(f"--candidates {text} cannot hold the budget: give 'auto', 'all' or a factor c ≥ 1 "
                             "(C holds c·k parameters, and the region's k must fit in it)")
        return factor


CANDIDATE_CHOICES = ("auto", "all")
CANDIDATE_RANKS = ("gradient", "movement")
AUTO_FACTOR = 5.0  # |C| = 5·k for --candidates auto, whatever the machine (docs/method.md measures it)


# -- how checkpoints are read ----------------------------------------------------------------------------
KINDS = ("classifier", "causal-lm", "masked-lm")  # what a checkpoint is read as
LM_KINDS = ("causal-lm", "masked-lm")
COMPLETION = "completion"  # a causal LM read as itself: scored on the tokens of completions, judged by what it generates
HEADS = ("auto", *KINDS, COMPLETION)  # "auto": the checkpoint's own kind (a completion fine-tune's: completion)
DTYPES = ("float32", "bfloat16", "float16", "auto")


def kind_of_architecture(architectures) -> str:
    """What a checkpoint is, from the class names in its config: a sequence classifier, a causal LM or a masked LM.

    A bare encoder (no head at all, e.g. MiniLM) is a classifier whose head is new.
    """
    names = [str(a) for a in (architectures or [])]
    if any(a.endswith("ForSequenceClassification") for a in names):
        return "classifier"
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in names):
        return "causal-lm"
    if any(a.endswith("ForMaskedLM") for a in names):
        return "masked-lm"
    return "classifier"


@dataclass(frozen=True)
class LoadOptions:
    """How a pair is read: as which kind of model, with which prompt, in which dtype and placement.

    ``head`` "auto" reads the checkpoint's own kind: a sequence classifier as one, a causal or masked
    LM through a template and label words (prompts.py). What is not given comes from the
    fine-tuned checkpoint's recorded prompt, then from the defaults.
    """

    head: str = "auto"
    template: str | None = None
    label_words: str | None = None
    label_scoring: str = "first"
    dtype: str = "float32"
    device_map: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def prompted(self) -> bool:
        return bool(self.template or self.label_words or self.label_scoring != "first")

    def reading(self) -> dict:
        """What changes the model a checkpoint is read as (not where it is placed)."""
        return {k: v for k, v in self.as_dict().items() if k != "device_map"}


# -- fine-tuning recipes -----------------------------------------------------------------------------
LR_FOR = {"sgd": 0.003, "adamw": 3e-5}  # default learning rate of each optimizer
MAX_FT_LR = 10.0  # far above any learning rate that trains (SGD at 0.05 already diverged on the default pair)
LORA_ALPHA_PER_RANK = 2  # lora_alpha = 2r: the update's scale α/r stays 2 whatever the rank, so one lr serves every r


@dataclass(frozen=True)
class FinetuneConfig:
    """Hyper-parameters of fine-tuning; the defaults are the paper's SGD recipe (§3.2)."""

    optimizer: str = "sgd"  # "sgd" (paper) | "adamw"
    lr: float = LR_FOR["sgd"]  # SGD at 0.05 diverged on the default pair; AdamW wants ~3e-5
    momentum: float = 0.9
    weight_decay: float = 1e-4
    l1: float = 0.0  # AdamW only: λ of λ·‖θ − θ_pre‖₁, summed over the body's trainable parameters (the paper's code)
    epochs: int = 2
    batch_size: int = 16
    train_examples: int | None = 2000  # a stratified subsample keeps CPU runs short; None = all
    freeze_embeddings: bool = True
    freeze_head: bool = False  # keep a new classification head at its initialisation (the seed code's fixhead)
    seed: int = 0
    # 0: the body is fine-tuned; r > 0: a LoRA adapter of rank r on every linear layer of the body is trained instead
    # (peft; the base stays as it is) and saved alone (completion tasks)
    lora_rank: int = 0

    @property
    def lora_alpha(self) -> int:
        return LORA_ALPHA_PER_RANK * self.lora_rank

    def as_dict(self) -> dict:
        return asdict(self)

    def identity(self) -> dict:
        """What names the recipe in a cache folder's hash: ``as_dict`` without the fields added since that are at
        their defaults, so a recipe's folder outlives them."""
        return {k: v for k, v in self.as_dict().items() if not (k == "lora_rank" and v == 0)}

    def validate(self) -> None:
        if self.optimizer not in LR_FOR:
            raise RequestError(f"unknown optimizer '{self.optimizer}' (use sgd or adamw)")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise RequestError(f"the learning rate must be a positive number, got {self.lr}")
        if self.lr > MAX_FT_LR:
            raise RequestError(f"a fine-tuning learning rate of {self.lr:g} only diverges (SGD wants about "
                               f"{LR_FOR['sgd']:g}, AdamW {LR_FOR['adamw']:g}); give at most {MAX_FT_LR:g}")
        if self.epochs < 1 or self.batch_size < 1:
            raise RequestError("epochs and batch size must be at least 1")
        if self.l1 and self.optimizer != "adamw":
            raise RequestError("the ℓ1 movement penalty goes with AdamW (SGD needs none)")
        if self.l1 < 0:
            raise RequestError(f"the ℓ1 penalty cannot be negative, got {self.l1}")
        if self.train_examples is not None and self.train_examples < 0:
            raise RequestError(f"train examples must be 0 (all) or more, got {self.train_examples}")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise RequestError(f"--lora-rank must be 0 (fine-tune the body) or a rank of 1 or more, got {self.lora_rank}")
        if self.lora_rank and self.l1:
            raise RequestError("the ℓ1 movement penalty goes with a full fine-tune: a LoRA adapter's movement is "
                               "low-rank already; drop --l1 or --lora-rank")


DEFAULT_RECIPE = FinetuneConfig()
QUICK_RECIPE = FinetuneConfig(epochs=1, train_examples=256, lr=0.01)  # GRAFTUI_FAST: seconds, weaker


def default_recipe() -> FinetuneConfig:
    """The recipe of the default fine-tuned checkpoint (a quick one under GRAFTUI_FAST)."""
    return QUICK_RECIPE if settings.fast() else DEFAULT_RECIPE


# The causal-LM default: a short prompt-based fine-tune (each step is ~3.5 s on 2 CPU cores), the
# label words of the paper's SST-2 prompt; the LM head and the embeddings stay fixed.
SMOLLM2_RECIPE = FinetuneConfig(lr=0.003, epochs=1, train_examples=480)  # 0.01 diverged (measured)
DEFAULT_LOADING = {"smollm2-movies": LoadOptions(template="{text} It was", label_words="negative= bad,positive= good")}


# The paper's main setting in `graftui reproduce`: SmolLM2 read through the SST-2 prompt, its region at the paper's
# 0.01 %. The default fine-tune above is short and barely over-confident; the paper's fine-tunes are trained until the
# training loss plateaus and are over-confident (ECE 7–10 %), the regime in which it finds the graft better calibrated.
PROMPT_BASE, PROMPT_SPARSITY = "smollm2", 1e-4
PROMPT_LOADING = DEFAULT_LOADING["smollm2-movies"]
SMOLLM2_PLATEAU_RECIPE = FinetuneConfig(lr=0.001, epochs=4, train_examples=480)  # 9 min; ECE 0.069 (measured)


# The generative defaults: supervised fine-tuning of SmolLM2 on 640 (prompt, completion) pairs of an offline skill,
# 40 AdamW steps (about 6 s each on 2 CPU cores), the embeddings and the LM head fixed. Measured on 200 held-out
# items: ISO dates written out, exact match 0.000 → 1.000; numbers in words, see docs/tasks.md.
SMOLLM2_SKILL_RECIPE = FinetuneConfig(optimizer="adamw", lr=1e-4, epochs=1, train_examples=640)
QUICK_SKILL_RECIPE = FinetuneConfig(optimizer="adamw", lr=1e-4, epochs=1, train_examples=64)  # GRAFTUI_FAST

# The same skill as a LoRA adapter: rank 8 on every linear layer of the body (2.4 M parameters, α = 16), the base left
# as it is, 40 AdamW steps at ten times the full fine-tune's lr. Measured on 100 held-out items, merged: exact match
# 1.000 (training loss 0.0008); see docs/tasks.md.
LORA_DEFAULTS = ("smollm2-dates-lora",)
SMOLLM2_LORA_RECIPE = FinetuneConfig(optimizer="adamw", lr=1e-3, epochs=1, train_examples=640, lora_rank=8)
QUICK_LORA_RECIPE = FinetuneConfig(optimizer="adamw", lr=1e-3, epochs=1, train_examples=64, lora_rank=8)  # GRAFTUI_FAST


def recipe_for(key: str) -> FinetuneConfig:
    """The recipe of one default fine-tuned checkpoint."""
    if key in GENERATIVE_DEFAULTS:
        return QUICK_SKILL_RECIPE if settings.fast() else SMOLLM2_SKILL_RECIPE
    if key in LORA_DEFAULTS:
        return QUICK_LORA_RECIPE if settings.fast() else SMOLLM2_LORA_RECIPE
    if key == "smollm2-movies" and not settings.fast():
        return SMOLLM2_RECIPE
    return default_recipe()


def default_checkpoint_dir(key: str = DEFAULT_FINETUNED, config: FinetuneConfig | None = None) -> Path:
    """Cache folder of a default fine-tuned checkpoint; its name changes with the recipe."""
    config = config or recipe_for(key)
    digest = hashlib.sha256(json.dumps([key, config.identity(), __version__.split(".")[0]]).encode()).hexdigest()[:8]
    return settings.shared("checkpoints") / f"{key}-{digest}"


def is_default_finetuned(ref: str | None) -> bool:
    """Whether ``ref`` names a default fine-tuned checkpoint (built on first use)."""
    return (ref or "").strip().lower() in DEFAULT_FINETUNED_REFS


# -- what the app proposes where the library's default would take minutes ---------------------------
# λ of AdamW + ℓ1, measured on the default pair (movies, test n = 1,000): 3e-5 keeps FT (0.837 vs 0.827
# without ℓ1) and lifts the 0.1 % top-movement graft 0.587 → 0.651; 1e-4 localizes more (0.708) but costs
# FT (0.723); 1e-3 and up leave the model at chance.
ADAMW_L1 = 3e-5
INTERACTIVE = {"n": 500, "l1": ADAMW_L1}  # l1: what the app proposes when AdamW is picked
FAST = {"steps": 10, "examples_per_class": 16, "n": 64, "check_n": 64, "epochs": 1, "train_examples": 64,
        "sparsities": [1e-4, 1e-3]}  # GRAFTUI_FAST: tests and demos


# -- which parameters a region may hold ---------------------------------------------------------------
# Parameters the paper freezes while fine-tuning; excluded from regions unless asked for.
_EMBEDDING = re.compile(r"(^|\.)(embeddings|embed_tokens|embed_positions|wte|wpe)(\.|$)")


@dataclass(frozen=True)
class GraftableSpec:
    """Which shared parameters may be in a region. Default: all but the embeddings."""

    include_embeddings: bool = False
    modules: tuple[str, ...] | None = None  # anatomy module types, e.g. ("ffn_in", "ffn_out")
    names: tuple[str, ...] | None = None  # an explicit list (e.g. the tensors a saved region covers)

    def admits(self, name: str) -> bool:
        if self.names is not None and name not in self.names:
            return False
        if not self.include_embeddings and _EMBEDDING.search(name):
            return False
        if self.modules is not None:
            return param_role(name).module in self.modules
        return True

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data) -> "GraftableSpec | None":
        """The spec a region file recorded; None when the record is not one (region files are untrusted)."""
        if not isinstance(data, dict):
            return None
        try:
            names = data.get("names")
            modules = data.get("modules")
            return cls(include_embeddings=bool(data.get("include_embeddings", False)),
                       modules=tuple(str(m) for m in modules) if modules else None,
                       names=tuple(str(n) for n in names) if names else None)
        except TypeError:
            return None


# -- how large a region may be -------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """A region budget: a fraction of the graftable parameters, or a count k."""

    sparsity: float | None = None
    k: int | None = None

    def resolve(self, graftable: int) -> int:
        if (self.sparsity is None) == (self.k is None):
            raise BudgetError("give exactly one of sparsity or k")
        if self.k is not None:
            if int(self.k) < 1 or int(self.k) > graftable:
                raise BudgetError(f"k must be between 1 and {graftable:,} (the graftable parameters), got {self.k}")
            return int(self.k)
        s = float(self.sparsity)
        if not math.isfinite(s) or s <= 0 or s > 1:
            raise BudgetError(f"sparsity must be in (0, 1], a fraction of the graftable parameters; got {self.sparsity}")
        return max(1, min(graftable, int(round(s * graftable))))

    def describe(self) -> str:
        return f"k={self.k:,}" if self.k is not None else f"sparsity={self.sparsity:g}"
