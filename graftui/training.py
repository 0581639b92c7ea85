"""Make θ_ft when the user has none: the paper's SGD recipe, or AdamW with an ℓ1 movement penalty.

Paper §3.2: SGD fine-tuning (small batch, weight decay 1e-4, frozen embeddings) gives movement
that a tiny region captures; AdamW spreads movement thin unless ‖θ − θ_pre‖₁ is penalised.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from .tasks.completion import data as completion
from . import compute, settings
from .config import (
    DEFAULT_FINETUNED_REFS, FinetuneConfig, GraftableSpec, LoadOptions, default_checkpoint_dir,
)
from .tasks.classification.data import Split, Task, batches, subsample
from .errors import Cancelled, ModelError
from .formatting import memory
from .models import CompletionLM, load_classifier, load_lm, load_reader, load_tokenizer, pair_kind
from .paths import atomic_dir, file_lock, slug
from .version import __version__


def optimizer(params: list, config: FinetuneConfig) -> torch.optim.Optimizer:
    """The recipe's optimiser: SGD with momentum and weight decay (the paper's), or AdamW."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def training_split(task: Task, recipe: FinetuneConfig) -> Split:
    """The examples a recipe trains on: its stratified subsample of the task's training split (or all)."""
    train = task.splits["train"]
    return subsample(train, recipe.train_examples, recipe.seed) if recipe.train_examples else train


def recipe_batches(tokenizer, task: Task, recipe: FinetuneConfig):
    """A recipe's training stream over :func:`training_split`, reshuffled per epoch:
    ``(make_batches(epoch), steps of the whole recipe, examples per epoch)``."""
    train = training_split(task, recipe)

    def make_batches(epoch: int):
        return batches(tokenizer, train, recipe.batch_size, task.max_length, shuffle_seed=recipe.seed + epoch)

    return make_batches, -(-len(train) // recipe.batch_size) * recipe.epochs, len(train)


@dataclass(frozen=True)
class FinetuneProgress:
    step: int
    steps: int
    epoch: int
    loss: float
    accuracy: float  # running accuracy on the training batches of this epoch
    task: str | None = None  # the task of this step's batch (multi-task fine-tuning)


def finetune(
    base_ref: str,
    task,
    config: FinetuneConfig,
    out_dir: str | Path,
    *,
    progress: Callable[[FinetuneProgress], None] | None = None,
    cancel: threading.Event | None = None,
    device: str | None = None,
    allow_local: bool = True,
    request: dict | None = None,
    options: LoadOptions = LoadOptions(),
) -> Path:
    """Fine-tune ``base_ref`` on ``task`` and write an HF checkpoint (safetensors) with a record.

    A language model is fine-tuned through its prompt (``options``; prompts.py), with its own head
    and the embeddings fixed as in the paper; the prompt is saved beside the weights. The record
    (``graftui_record.json``) holds ``request``, so the checkpoint can be made again.
    """
    config.validate()
    check_full(config, task.name)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ModelError(f"'{out_dir}' exists and is not empty; choose a new folder")
    device = device or settings.device()
    torch.manual_seed(config.seed)
    model, tokenizer, fixed, new_head = load_trainable(base_ref, task.label_names, options, allow_local=allow_local,
                                                       freeze_head=config.freeze_head)
    model.to(device)
    frozen = GraftableSpec(include_embeddings=False)
    trainable, anchors = [], []  # anchors: (θ, θ_pre) of the body, for the ℓ1 penalty (l1_pull)
    for name, p in model.named_parameters():
        p.requires_grad_(name not in fixed and not (config.freeze_embeddings and not frozen.admits(name)))
        if p.requires_grad:
            trainable.append(p)
            if config.l1 and name not in new_head:  # a new head has no θ_pre worth staying near
                anchors.append((p, p.detach().clone()))
    opt = optimizer(trainable, config)
    make_batches, total, n_train = recipe_batches(tokenizer, task, config)
    train_epochs(model, opt, anchors, make_batches, total, config, device, _label_accuracy, progress, cancel)
    model.eval().to("cpu")
    _save(out_dir, [(None, model)], tokenizer, {
        "task": task.name,
        "task_source": task.source,
        "labels": list(task.label_names),
        "train_examples": n_train,
        "prompt": tokenizer.prompt.as_dict() if getattr(tokenizer, "prompt", None) else None,
    }, base_ref, config, request)
    return out_dir


def completion_split(task: "completion.CompletionTask", config: FinetuneConfig) -> "completion.Completions":
    """The examples a recipe fine-tunes on: ``train_examples`` of the task's training split drawn with its seed (in
    split order), or all."""
    train = task.splits["train"]
    if config.train_examples and config.train_examples < len(train):
        train = train.select(sorted(random.Random(config.seed).sample(range(len(train)), config.train_examples)))
    return train


def recorded_train_examples(out_dir: str | Path):
    """The training examples a checkpoint graftui fine-tuned was trained on, as its record says (per task for a
    multi-task fine-tune); None without a record."""
    try:
        record = json.loads((Path(out_dir) / "graftui_record.json").read_text())
    except (OSError, ValueError):
        return None
    value = record.get("train_examples") if isinstance(record, dict) else None
    return value if isinstance(value, (int, dict)) and not isinstance(value, bool) else None


def finetune_completions(
    base_ref: str,
    task: "completion.CompletionTask",
    config: FinetuneConfig,
    out_dir: str | Path,
    *,
    progress: Callable[[FinetuneProgress], None] | None = None,
    cancel: threading.Event | None = None,
    device: str | None = None,
    allow_local: bool = True,
    request: dict | None = None,
) -> Path:
    """Supervised fine-tuning of a causal LM on a completion task (the loss on completion tokens only), with its
    embeddings and its LM head fixed as for prompt-based fine-tuning, so that what moves is the body a region can
    hold; writes an HF checkpoint with a record. ``accuracy`` in the progress is next-token accuracy on the
    completion tokens of this epoch's batches.

    With ``config.lora_rank`` r > 0 a LoRA adapter of rank r (α = 2r) on every linear layer of the body is trained
    instead (peft), the base's own weights untouched, and the folder holds the adapter alone (``adapter_config.json``,
    naming ``base_ref`` as its base, and ``adapter_model.safetensors``): θ_ft = θ_pre + scaling·B·A, read as a
    fine-tune by graftui.adapters."""
    config.validate()
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ModelError(f"'{out_dir}' exists and is not empty; choose a new folder")
    device = device or settings.device()
    torch.manual_seed(config.seed)
    model = load_lm(base_ref, "causal-lm", allow_local=allow_local)
    tokenizer = load_tokenizer(base_ref, allow_local=allow_local)
    model, lora = with_lora(model, config, base_ref) if config.lora_rank else (model, None)
    lm = model.get_base_model() if lora else model  # a LoRA model's causal LM, its linear layers adapted in place
    model.to(device)
    trainable, anchors = [], []
    if lora:  # the adapter alone (peft froze the rest)
        trainable = [p for p in model.parameters() if p.requires_grad]
    else:
        head = {id(p) for p in model.get_output_embeddings().parameters()}
        frozen = GraftableSpec(include_embeddings=False)
        for name, p in model.named_parameters():
            p.requires_grad_(id(p) not in head and not (config.freeze_embeddings and not frozen.admits(name)))
            if p.requires_grad:
                trainable.append(p)
                if config.l1:
                    anchors.append((p, p.detach().clone()))
    opt = optimizer(trainable, config)
    train = completion_split(task, config)
    context = completion.context_length(lm)
    _, _, cut = completion.encode(tokenizer, train, task.chat, context, task.name)  # refuses a completion too long
    total = -(-len(train) // config.batch_size) * config.epochs

    def make_batches(epoch: int):
        return completion.batches(tokenizer, train, task.chat, config.batch_size, context,
                                  shuffle_seed=config.seed + epoch)

    train_epochs(CompletionLM(lm), opt, anchors, make_batches, total, config, device,
                 lambda out, labels: (out.right, out.scored), progress, cancel)
    model.eval().to("cpu")
    _save(out_dir, [(None, model)], tokenizer, {
        "task": task.name,
        "task_source": task.source,
        "task_kind": "completion",
        "chat": task.chat,
        "train_examples": len(train),
        "notes": list(completion.truncation_note(task.name, cut, len(train), context)),
        **({"lora": lora} if lora else {}),
    }, base_ref, config, request)
    return out_dir


def with_lora(model, config: FinetuneConfig, base_ref: str):
    """``model`` wrapped by peft with a LoRA adapter of rank ``config.lora_rank`` (α = ``config.lora_alpha``, no
    dropout, no bias) on every linear layer but the LM head ("all-linear"), only the adapter trainable; and what the
    record says of it, {r, alpha, targets}. The adapter's config names ``base_ref`` as its base, so that graftui finds
    the base again (an offline default's name, not this machine's cache folder)."""
    from peft import LoraConfig, get_peft_model

    check_lora_rank(model, config, base_ref)
    wrapped = get_peft_model(model, LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                               target_modules="all-linear", bias="none", task_type="CAUSAL_LM"))
    lora = wrapped.peft_config["default"]
    lora.base_model_name_or_path = base_ref
    targets = sorted({name.rsplit(".", 1)[-1] for name in lora.target_modules})  # peft lists every module it adapted
    if not targets:
        raise ModelError(f"'{base_ref}' has no linear layer outside its LM head for a LoRA adapter to train")
    return wrapped, {"r": config.lora_rank, "alpha": config.lora_alpha, "targets": targets}


def check_lora_rank(model: torch.nn.Module, config: FinetuneConfig, base_ref: str) -> None:
    """A rank no wider than the narrowest layer it adapts (every linear layer but the LM head), and an adapter whose
    training fits in the memory free: refused in one line before peft allocates it."""
    head = {id(m) for m in (model.get_output_embeddings(),) if m is not None}
    linear = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and id(m) not in head]
    if not linear:
        return  # with_lora names the problem
    name, narrowest = min(linear, key=lambda item: min(item[1].in_features, item[1].out_features))
    width = min(narrowest.in_features, narrowest.out_features)
    r = config.lora_rank
    if r > width:
        raise ModelError(f"--lora-rank {r} is wider than '{base_ref}''s narrowest adapted layer ({name}, "
                         f"{narrowest.in_features} → {narrowest.out_features}): a rank above {width} adds nothing a "
                         f"full update lacks; choose --lora-rank {min(16, width)} or at most {width}")
    held = 4 + 4 + (8 if config.optimizer in ("adam", "adamw") else 4)  # weight, gradient, optimizer state (float32)
    need = sum(r * (m.in_features + m.out_features) for _, m in linear) * held
    device = next(model.parameters()).device
    free = compute.free_memory(device)
    if free and 2 * need > free:
        raise ModelError(f"a LoRA adapter of rank {r} on {len(linear)} layers of '{base_ref}' takes about "
                         f"{memory(need)} to train (weights, gradients, optimizer state) and {memory(free)} are free on "
                         f"{device}: choose a smaller --lora-rank")


def check_full(config: FinetuneConfig, task_name: str) -> None:
    """A fine-tune that trains the whole body (classification, multi-task) refuses a LoRA rank in one line."""
    if config.lora_rank:
        raise ModelError(f"--lora-rank trains an adapter for completion tasks only: '{task_name}' is fine-tuned in "
                         "full; drop --lora-rank")


def _label_accuracy(out, labels) -> tuple[int, int]:
    """(right, counted) of a classifier's batch: its argmax against the labels."""
    return int((out.logits.argmax(-1) == labels).sum()), int(labels.numel())


def optimizer_step(model, opt, batch: dict, device, config: FinetuneConfig, step: int, what: str = "fine-tuning",
                   cancel: threading.Event | None = None, anchors=()):
    """One step of every fine-tuning loop (a recipe's epochs, a multi-task mix, re-training inside a region): a
    cancel honoured before it, the batch's loss checked for divergence (``step``: its number from 1), the ℓ1 pull
    toward θ_pre where ``anchors`` are given. Returns the model's output."""
    if cancel is not None and cancel.is_set():
        raise Cancelled(f"{what} cancelled")
    out = model(**{k: v.to(device) for k, v in batch.items()})
    check_loss(out.loss, step, config)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    if anchors:
        l1_pull(anchors, config.l1)
    opt.step()
    return out


def train_epochs(model, opt, anchors, make_batches: Callable[[int], object], total: int, config: FinetuneConfig,
                 device, count: Callable[[object, torch.Tensor], tuple[int, int]],
                 progress: Callable[[FinetuneProgress], None] | None = None,
                 cancel: threading.Event | None = None) -> None:
    """The recipe's epochs over ``make_batches(epoch)``: a step on each batch's loss (with the ℓ1 pull), a stop on a
    diverged loss or a cancel; ``count(out, labels)`` gives (right, counted) for the epoch's running accuracy."""
    step = 0
    model.train()
    for epoch in range(config.epochs):
        correct = seen = 0
        for batch in make_batches(epoch):
            step += 1
            out = optimizer_step(model, opt, batch, device, config, step, cancel=cancel, anchors=anchors)
            right, counted = count(out, batch["labels"].to(device))
            correct, seen = correct + right, seen + counted
            if progress is not None:
                progress(FinetuneProgress(step, total, epoch + 1, float(out.loss.detach()), correct / max(seen, 1)))


def check_loss(loss: torch.Tensor, step: int, config: FinetuneConfig) -> None:
    """A NaN or infinite loss means training diverged: stop with the step and the remedy, not a crash later."""
    if not bool(torch.isfinite(loss.detach())):
        raise ModelError(f"fine-tuning diverged at step {step} (loss {float(loss):g}) with learning rate {config.lr:g}: "
                         "lower --lr (or check the base model's weights)")


@torch.no_grad()
def l1_pull(anchors: list[tuple[torch.Tensor, torch.Tensor]], l1: float) -> None:
    """Add the gradient of the movement penalty λ·Σ|θ − θ_pre|, λ·sign(θ − θ_pre), to each (θ, θ_pre) pair's gradient.

    The sum, not the mean: a mean over ~10⁷ parameters divides λ away (λ = 30 left the movement as
    spread as without it, measured), while λ ≈ 1e-4 on the sum matches the task gradient's scale.
    """
    for p, anchor in anchors:
        pull = torch.sign(p - anchor).mul_(l1)
        p.grad = pull if p.grad is None else p.grad.add_(pull)


def load_trainable(base_ref: str, labels, options: LoadOptions, *, allow_local: bool = True, freeze_head: bool = False):
    """(model, tokenizer, names kept fixed, head names): a classifier with a new head, or a language model with its prompt.

    A language model's own head is always fixed (the paper's prompt-based fine-tuning); a new
    classification head is fixed only when asked (``freeze_head``).
    """
    kind = pair_kind(base_ref, options, allow_local=allow_local)
    model, tokenizer, new = load_reader(base_ref, kind, labels, replace(options, device_map=None), allow_local=allow_local)
    if getattr(tokenizer, "prompt", None) is not None:
        head = model.head_names()
        return model, tokenizer, head, head
    return model, tokenizer, new if freeze_head else set(), new


def _save(out_dir: Path, models: list[tuple[str | None, torch.nn.Module]], tokenizer, record: dict, base_ref: str,
          config: FinetuneConfig, request: dict | None) -> None:
    """Write each model (in ``out_dir``, or its named sub-folder) with the tokenizer and its record: what every
    fine-tune records (version, base, recipe, request, time) around ``record``, what this kind of fine-tune adds.

    A peft model writes its adapter alone (never the base's weights, nor its embeddings), without peft's placeholder
    model card.

    Everything is written aside and renamed: an interrupted run never leaves a half checkpoint.
    """
    record = {"graftui_version": __version__, "base": base_ref, **record, "config": config.as_dict(),
              "request": request, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with atomic_dir(out_dir) as tmp:
        for sub, model in models:
            folder = tmp / sub if sub else tmp
            adapter = hasattr(model, "peft_config")  # its embeddings are the base's: no Hub look-up of the base
            model.save_pretrained(folder, safe_serialization=True, **({"save_embedding_layers": False} if adapter else {}))
            if adapter:
                (folder / "README.md").unlink(missing_ok=True)
            tokenizer.save_pretrained(folder)
            (folder / "graftui_record.json").write_text(json.dumps({**record, "task": sub or record.get("task")}, indent=2))
        if sub is not None:
            (tmp / "graftui_record.json").write_text(json.dumps(record, indent=2))


def finetune_multitask(
    base_ref: str,
    tasks: list,
    config: FinetuneConfig,
    out_dir: str | Path,
    *,
    progress: Callable[[FinetuneProgress], None] | None = None,
    cancel: threading.Event | None = None,
    device: str | None = None,
    allow_local: bool = True,
    request: dict | None = None,
) -> Path:
    """One shared body, one head per task; each step trains on a batch of a randomly chosen task.

    The paper's multi-task model (§5.1, App. C.1). Writes ``out_dir/<task>/`` for every task: the
    shared body with that task's head, an ordinary fine-tuned classifier, so that every verb
    (localize, evaluate, compose …) reads the multi-task model through one task's head.
    ``train_examples`` is per task; tasks are drawn in proportion to their number of batches.
    """
    config.validate()
    check_full(config, ", ".join(t.name for t in tasks))
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ModelError(f"'{out_dir}' exists and is not empty; choose a new folder")
    names = [slug(t.name) for t in tasks]
    if len(set(names)) != len(names) or len(tasks) < 2:
        raise ModelError("multi-task fine-tuning needs two or more different tasks")
    device = device or settings.device()
    torch.manual_seed(config.seed)
    models = [load_classifier(base_ref, label_names=t.label_names, allow_local=allow_local)[0] for t in tasks]
    prefix = getattr(models[0], "base_model_prefix", "")
    if not prefix or not hasattr(models[0], prefix):
        raise ModelError(f"{type(models[0]).__name__} has no separate body to share between task heads")
    for m in models[1:]:  # one body, several heads
        setattr(m, prefix, getattr(models[0], prefix))
    tokenizer = load_tokenizer(base_ref, allow_local=allow_local)
    frozen = GraftableSpec(include_embeddings=False)
    trainable, seen_ids = [], set()
    for m in models:
        m.to(device).train()
        for name, p in m.named_parameters():
            p.requires_grad_(not (config.freeze_embeddings and not frozen.admits(name)))
            if p.requires_grad and id(p) not in seen_ids:
                seen_ids.add(id(p))
                trainable.append(p)
    opt = optimizer(trainable, config)
    streams_of = [recipe_batches(tokenizer, t, config) for t in tasks]
    per_epoch = [steps // config.epochs for _, steps, _ in streams_of]
    total = sum(per_epoch) * config.epochs

    def stream(i: int):
        epoch = 0
        while True:
            yield from streams_of[i][0](epoch)
            epoch += 1

    streams = [stream(i) for i in range(len(tasks))]
    pick = random.Random(config.seed)
    correct, seen = [0] * len(tasks), [0] * len(tasks)
    for step in range(1, total + 1):
        i = pick.choices(range(len(tasks)), weights=per_epoch)[0]
        batch = next(streams[i])
        out = optimizer_step(models[i], opt, batch, device, config, step, "multi-task fine-tuning", cancel)
        correct[i] += int((out.logits.argmax(-1).cpu() == batch["labels"]).sum())
        seen[i] += int(batch["labels"].numel())
        if progress is not None:
            epoch = 1 + (step - 1) * config.epochs // total
            progress(FinetuneProgress(step, total, epoch, float(out.loss.detach()), correct[i] / max(seen[i], 1), tasks[i].name))
    for m in models:
        m.eval().to("cpu")
    _save(out_dir, list(zip(names, models)), tokenizer, {
        "tasks": [t.name for t in tasks],
        "task_sources": [t.source for t in tasks],
        "labels": {t.name: list(t.label_names) for t in tasks},
        "train_examples": {t.name: n for t, (_, _, n) in zip(tasks, streams_of)},
    }, base_ref, config, request)
    return out_dir


def is_built(folder: str | Path) -> bool:
    """Whether a fine-tune's folder is complete: a checkpoint (``config.json``) or a LoRA adapter
    (``adapter_config.json``); both are written aside and renamed, so either file means the whole folder is there."""
    return (Path(folder) / "config.json").is_file() or (Path(folder) / "adapter_config.json").is_file()


def ensure_default_finetuned(key: str, build: Callable[[Path], None]) -> Path:
    """Build the default fine-tuned checkpoint on first need, by ``build(out)`` (its task's kind fine-tunes it: this
    floor knows no kind); later calls reuse it."""
    if key not in DEFAULT_FINETUNED_REFS:
        raise ModelError(f"'{key}' is not a default fine-tuned model; those are {', '.join(DEFAULT_FINETUNED_REFS)}")
    out = default_checkpoint_dir(key)
    with file_lock(out):  # another process building it meanwhile: wait, then reuse
        if not is_built(out):
            build(out)
    return out