"""Fine-tuning a LoRA adapter (--lora-rank): the base stays as it is, the folder holds the adapter alone."""

from __future__ import annotations

import json

import pytest
import torch

from graftui import cli, training
from graftui.adapters import read_adapter
from graftui.tasks.completion.data import load_completion_task
from graftui.config import FinetuneConfig, default_checkpoint_dir, recipe_for
from graftui.errors import RequestError
from graftui.flows.common import ensure_default
from lm_util import write_base, write_completion_task, write_task

LORA = FinetuneConfig(optimizer="adamw", lr=3e-2, epochs=4, batch_size=8, train_examples=None, lora_rank=4)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("lora-ft")
    base = write_base(root / "base", "llama")
    model = LlamaForCausalLM.from_pretrained(base)
    with torch.no_grad():  # a trained head's scale (a fresh one's logits are nearly flat): the body can then learn
        model.lm_head.weight.mul_(50)
    model.save_pretrained(base)
    before = {n: p.detach().clone() for n, p in LlamaForCausalLM.from_pretrained(base).named_parameters()}
    task = load_completion_task(str(write_completion_task(root / "opposites.csv")))
    losses = []
    out = training.finetune_completions(str(base), task, LORA, root / "adapter", progress=lambda p: losses.append(p.loss),
                                        request={"verb": "finetune", "lora_rank": 4})
    return {"base": base, "out": out, "before": before, "losses": losses}


def test_a_lora_finetune_writes_the_adapter_alone_with_its_record(adapter):
    out = adapter["out"]
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert not any((out / f).exists() for f in ("model.safetensors", "config.json", "pytorch_model.bin", "README.md"))
    assert (out / "tokenizer.json").is_file() and training.is_built(out)
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # written aside, renamed: no leftovers
    record = json.loads((out / "graftui_record.json").read_text())
    assert record["task_kind"] == "completion" and record["base"] == str(adapter["base"])
    assert record["lora"] == {"r": 4, "alpha": 8, "targets": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                                                                "up_proj", "v_proj"]}
    assert record["config"]["lora_rank"] == 4 and record["request"] == {"verb": "finetune", "lora_rank": 4}
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(adapter["base"])  # the base as given
    assert (config["r"], config["lora_alpha"], config["lora_dropout"], config["bias"]) == (4, 8, 0.0, "none")


def test_training_moves_the_adapter_and_leaves_the_base_alone(adapter):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    losses = adapter["losses"]
    assert len(losses) == 4 * 6 and sum(losses[-3:]) < 0.8 * sum(losses[:3])  # 45 training items, batches of 8, four epochs
    base = LlamaForCausalLM.from_pretrained(adapter["base"])
    assert all(torch.equal(p, adapter["before"][n]) for n, p in base.named_parameters())  # the base file is untouched
    read = read_adapter(str(adapter["out"]))
    assert read.base_name == str(adapter["base"]) and read.config["r"] == 4 and read.config["lora_alpha"] == 8
    assert all(f.b.abs().max() > 0 for f in read.factors.values())  # B starts at zero: every B moved
    layers = base.config.num_hidden_layers
    assert len(read.factors) == 7 * layers and not any("lm_head" in n or "embed" in n for n in read.names())
    merged = dict(PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(adapter["base"]), adapter["out"])
                  .merge_and_unload().named_parameters())
    for name in read.names():
        assert torch.allclose(read.delta(name), merged[name] - adapter["before"][name], atol=1e-6), name


def test_a_negative_rank_and_lora_on_a_classification_task_are_refused_in_one_line(tmp_path, capsys):
    base = write_base(tmp_path / "base", "llama")
    labels = write_task(tmp_path / "labels.csv")
    texts = write_completion_task(tmp_path / "opposites.csv")
    with pytest.raises(RequestError, match="--lora-rank must be 0"):
        FinetuneConfig(lora_rank=-1).validate()
    with pytest.raises(RequestError, match="ℓ1 movement penalty goes with a full fine-tune"):
        FinetuneConfig(optimizer="adamw", l1=1e-4, lora_rank=4).validate()
    for args, says in ((["--task", str(texts), "--lora-rank", "-1"], "--lora-rank must be 0 (fine-tune the body) or a "
                        "rank of 1 or more, got -1"),
                       (["--task", str(labels), "--lora-rank", "4"], "--lora-rank trains an adapter for completion "
                        "tasks only: 'labels.csv' is a classification task")):
        out = tmp_path / "out"
        capsys.readouterr()
        assert cli.main(["finetune", "--base", str(base), *args, "--out", str(out)]) != 0
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
        assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_full_finetune_refuses_a_rank_it_would_ignore(tmp_path):
    from graftui.tasks.classification.data import load_task

    with pytest.raises(Exception, match="--lora-rank trains an adapter for completion tasks only"):
        training.finetune(str(tmp_path / "never-read"), load_task(str(write_task(tmp_path / "l.csv"))),
                          FinetuneConfig(lora_rank=4), tmp_path / "out")


def test_the_lora_default_has_its_own_recipe_and_the_others_keep_their_folders(monkeypatch):
    monkeypatch.delenv("GRAFTUI_FAST", raising=False)
    recipe = recipe_for("smollm2-dates-lora")
    assert recipe.lora_rank > 0 and recipe.optimizer == "adamw" and recipe.lora_alpha == 2 * recipe.lora_rank
    assert recipe_for("smollm2-dates").lora_rank == 0
    # a recipe without LoRA hashes as before the field existed: the cached default fine-tunes stay valid
    assert FinetuneConfig().identity() == {k: v for k, v in FinetuneConfig().as_dict().items() if k != "lora_rank"}
    assert default_checkpoint_dir("smollm2-dates-lora") != default_checkpoint_dir("smollm2-dates")
    monkeypatch.setenv("GRAFTUI_FAST", "1")
    assert recipe_for("smollm2-dates-lora").lora_rank == recipe.lora_rank
    assert recipe_for("smollm2-dates-lora").train_examples < recipe.train_examples


@pytest.mark.e2e
def test_the_offline_lora_default_builds_as_an_adapter_of_smollm2(monkeypatch):
    monkeypatch.setenv("GRAFTUI_FAST", "1")
    out = ensure_default("smollm2-dates-lora")
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    assert read_adapter(str(out)).base_name == "smollm2"
    assert ensure_default("smollm2-dates-lora") == out  # built once, then reused
