"""Make θ_ft when the user has none: the paper's SGD recipe, or AdamW with an ℓ1 movement penalty.

Paper §3.2: SGD fine-tuning (small batch, weight decay 1e-4, frozen embeddings) gives movement
that a tiny region captures; AdamW spreads movement thin unless ‖θ − θ_pre‖₁ is penalised.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from . import __version__, settings
from .data import batches, subsample
from .errors import Cancelled, ModelError
from .models import DEFAULT_FINETUNED_REFS, GraftableSpec, load_classifier, load_tokenizer
from .requests import FinetuneConfig, default_checkpoint_dir, default_recipe


@dataclass(frozen=True)
class FinetuneProgress:
    step: int
    steps: int
    epoch: int
    loss: float
    accuracy: float  # running accuracy on the training batches of this epoch


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
) -> Path:
    """Fine-tune ``base_ref`` on ``task`` and write an HF checkpoint (safetensors) with a record.

    The record (``graftui_record.json``) holds ``request``, so the checkpoint can be made again.
    """
    config.validate()
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ModelError(f"'{out_dir}' exists and is not empty; choose a new folder")
    device = device or settings.device()
    torch.manual_seed(config.seed)
    model, _ = load_classifier(base_ref, label_names=task.label_names, allow_local=allow_local)
    tokenizer = load_tokenizer(base_ref, allow_local=allow_local)
    model.to(device)
    frozen = GraftableSpec(include_embeddings=False)
    trainable = []
    for name, p in model.named_parameters():
        p.requires_grad_(not (config.freeze_embeddings and not frozen.admits(name)))
        if p.requires_grad:
            trainable.append(p)
    anchors = [p.detach().clone() for p in trainable] if config.l1 else []
    if config.optimizer == "sgd":
        opt = torch.optim.SGD(trainable, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    else:
        opt = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    train = task.splits["train"]
    if config.train_examples:
        train = subsample(train, config.train_examples, config.seed)
    steps_per_epoch = -(-len(train) // config.batch_size)
    total = steps_per_epoch * config.epochs
    n_trainable = sum(p.numel() for p in trainable)
    step = 0
    model.train()
    for epoch in range(config.epochs):
        correct = seen = 0
        for batch in batches(tokenizer, train, config.batch_size, task.max_length, shuffle_seed=config.seed + epoch):
            if cancel is not None and cancel.is_set():
                raise Cancelled("fine-tuning cancelled")
            batch = {k: v.to(device) for k, v in batch.items()}
            out = model(**batch)
            loss = out.loss
            if anchors:
                movement = sum((p - a).abs().sum() for p, a in zip(trainable, anchors))
                loss = loss + config.l1 * movement / n_trainable
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            correct += int((out.logits.argmax(-1) == batch["labels"]).sum())
            seen += int(batch["labels"].numel())
            if progress is not None:
                progress(FinetuneProgress(step, total, epoch + 1, float(out.loss.detach()), correct / max(seen, 1)))
    model.eval().to("cpu")
    record = {
        "graftui_version": __version__,
        "base": base_ref,
        "task": task.name,
        "task_source": task.source,
        "labels": list(task.label_names),
        "train_examples": len(train),
        "config": config.as_dict(),
        "request": request,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary folder
    try:  # write aside and rename: an interrupted run never leaves a half checkpoint
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "graftui_record.json").write_text(json.dumps(record, indent=2))
        if out_dir.exists():
            out_dir.rmdir()
        tmp.replace(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


_default_lock = threading.Lock()


def ensure_default_finetuned(
    key: str = "minilm-movies",
    *,
    progress: Callable[[FinetuneProgress], None] | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Build the default fine-tuned checkpoint on first need; later calls reuse it."""
    from .data import load_task

    if key not in DEFAULT_FINETUNED_REFS:
        raise ModelError(f"'{key}' is not a default fine-tuned model; those are {', '.join(DEFAULT_FINETUNED_REFS)}")
    base_ref, task_ref = DEFAULT_FINETUNED_REFS[key]
    out = default_checkpoint_dir(key)
    with _default_lock:
        if (out / "config.json").exists():
            return out
        return finetune(base_ref, load_task(task_ref), default_recipe(), out, progress=progress, cancel=cancel,
                        request={"verb": "finetune", "base": base_ref, "task": task_ref})
