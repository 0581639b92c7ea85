"""Pairs whose fine-tune is a LoRA adapter: θ_ft = θ_pre + scaling·B·A, never merged into a second model."""

from __future__ import annotations

import json

import pytest
import torch

import graftui
from graftui import models, regions
from graftui.config import LoadOptions
from graftui.errors import ModelError
from lm_util import write_base, write_completion_task

COMPLETION = LoadOptions(head="completion")
IDS = torch.tensor([[1, 7, 30, 12, 2, 44]])


def _adapter(base_dir, out, *, targets=("q_proj", "v_proj", "up_proj"), seed=0, **extra):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    model = get_peft_model(LlamaForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), lora_dropout=0.0, **extra))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # peft starts B at zero: a trained adapter's is not
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.save_pretrained(out)
    return model


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base_dir = write_base(root / "base", "llama")
    peft_model = _adapter(base_dir, root / "adapter")
    with torch.no_grad():
        merged = peft_model.merge_and_unload().eval()
        merged_logits = merged(input_ids=IDS).logits
    return {"root": root, "base": base_dir, "adapter": root / "adapter", "merged": merged, "logits": merged_logits}


def _whole(pair) -> dict:
    """Every parameter the adapter moves: the adapter's whole region."""
    return {n: (pair.ft[n] != pair.pre[n]).reshape(-1).nonzero().squeeze(1) for n in pair.graftable
            if not torch.equal(pair.ft[n], pair.pre[n])}


def test_grafting_the_adapters_whole_region_is_pefts_merged_model(lora):
    pair = models.ModelPair.load(str(lora["base"]), str(lora["adapter"]), options=COMPLETION)
    assert pair.adapter is not None and pair.lazy  # θ_pre read from the base's file, θ_ft from the factors
    assert pair.hashes["finetuned"] == pair.adapter.hash
    whole = _whole(pair)
    adapted = {n for n in pair.graftable if any(t in n for t in ("q_proj", "v_proj", "up_proj"))}
    assert set(whole) == adapted  # the adapter moves exactly its target modules
    merged = dict(lora["merged"].named_parameters())
    for name in adapted:
        assert torch.allclose(pair.ft[name], merged[name.removeprefix("lm.")], atol=1e-6)
        idx = torch.tensor([0, 5, pair.ft[name].numel() - 1])
        assert torch.equal(models.take(pair.ft, name, idx), pair.ft[name].reshape(-1)[idx])
    with torch.no_grad():
        with pair.grafted(whole) as m:
            grafted = m(input_ids=IDS).logits
        with pair.finetuned() as m:
            finetuned = m(input_ids=IDS).logits
        bare = pair.model(input_ids=IDS).logits
    assert torch.allclose(grafted, lora["logits"], atol=1e-5) and torch.allclose(finetuned, lora["logits"], atol=1e-5)
    assert not torch.allclose(bare, lora["logits"], atol=1e-3)  # the adapter matters, and the pair is back at θ_pre


def test_a_region_learned_inside_an_adapter_localizes_and_exports(lora, tmp_path):
    task = write_completion_task(tmp_path / "task.csv")
    out = tmp_path / "region.safetensors"
    loc = graftui.localize(base=str(lora["base"]), finetuned=str(lora["adapter"]), task=str(task), sparsity=0.01,
                           steps=3, check_n=0, candidates="4", out=str(out))
    record = regions.load(out)
    pair = models.ModelPair.load(str(lora["base"]), str(lora["adapter"]), options=COMPLETION)
    whole = _whole(pair)
    assert 0 < record.size == loc.k
    for name, idx in record.indices.items():  # inside the adapter: only where it moved
        assert name in whole and set(idx.tolist()) <= set(whole[name].tolist())
    assert record.meta.finetuned_sha256 == pair.adapter.hash  # the region names the adapter it came from
    exported = graftui.export(region=str(out), finetuned=str(lora["adapter"]), out=str(tmp_path / "graft"))
    folder = tmp_path / "graft"
    assert (folder / "config.json").exists() and not (folder / "adapter_config.json").exists()  # an ordinary checkpoint
    reloaded = models.load_lm(str(folder), "causal-lm")
    with torch.no_grad(), pair.grafted(record.indices) as m:
        assert torch.equal(reloaded(input_ids=IDS).logits, m(input_ids=IDS).logits)
    assert exported is not None


def test_an_adapter_of_another_base_is_refused_naming_its_base(lora, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = tmp_path / "other"
    write_base(other, "llama")
    config = LlamaConfig.from_pretrained(other)
    config.intermediate_size = 48  # up_proj of another shape
    LlamaForCausalLM(config).save_pretrained(other)
    raw = json.loads((lora["adapter"] / "adapter_config.json").read_text())
    with pytest.raises(ModelError, match=r"up_proj.weight of shape \[64, 32\].*has \[48, 32\].*give the adapter's own "
                                         r"base") as err:
        models.ModelPair.load(str(other), str(lora["adapter"]), options=COMPLETION)
    assert "\n" not in str(err.value) and raw["base_model_name_or_path"] in str(err.value)


def test_an_adapter_folder_is_a_model_reference_and_other_folders_are_not(lora, tmp_path):
    assert models.resolve(str(lora["adapter"])) == str(lora["adapter"].resolve())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json.*nor a LoRA adapter"):
        models.resolve(str(tmp_path / "empty"))
    assert models.checkpoint_kind(str(lora["adapter"])) == "causal-lm"  # its base's kind, from its config


def test_an_ia3_adapter_is_refused_through_the_cli(lora, tmp_path, capsys):
    from peft import IA3Config, get_peft_model
    from transformers import LlamaForCausalLM

    from graftui import cli

    get_peft_model(LlamaForCausalLM.from_pretrained(lora["base"]),
                   IA3Config(target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"])
                   ).save_pretrained(tmp_path / "ia3")
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    assert cli.main(["pair", "--base", str(lora["base"]), "--finetuned", str(tmp_path / "ia3"), "--head",
                     "completion"]) == 2
    err = capsys.readouterr().err.strip()
    assert "IA³" in err and "LoRA" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_adapter_read_as_a_model_is_its_base_with_the_delta_added(lora):
    model = models.load_lm(str(lora["adapter"]), "causal-lm")  # the fine-tuned model itself (a fine-tune's test score)
    with torch.no_grad():
        assert torch.allclose(model(input_ids=IDS).logits, lora["logits"], atol=1e-5)
    on_disk = models.load_lm(str(lora["base"]), "causal-lm")
    with torch.no_grad():
        assert not torch.allclose(on_disk(input_ids=IDS).logits, lora["logits"], atol=1e-3)  # the base file untouched


@pytest.mark.e2e
def test_the_offline_lora_default_localizes_evaluates_and_exports(monkeypatch, tmp_path):
    from graftui.flows.common import ensure_default

    monkeypatch.setenv("GRAFTUI_FAST", "1")  # the quick recipe: an adapter in a minute and a half
    folder = ensure_default("smollm2-dates-lora")
    out = tmp_path / "dates-lora.safetensors"
    loc = graftui.localize(base="smollm2", finetuned=str(folder), task="dates", sparsity=1e-4, steps=2, check_n=0,
                           out=str(out))
    record = regions.load(out)
    assert record.size == loc.k > 0 and record.meta.finetuned_sha256 == models.content_hash(str(folder))
    assert all(name.endswith("_proj.weight") for name in record.indices)  # inside the adapted modules
    result = graftui.evaluate(regions=[str(out)], n=6)
    models_scored = {row["model"] for row in result.rows}
    assert len(models_scored) >= 3 and all(0.0 <= row["score"] <= 1.0 for row in result.rows)
    graftui.export(region=str(out), finetuned=str(folder), out=str(tmp_path / "graft"))
    assert (tmp_path / "graft" / "config.json").is_file() and (tmp_path / "graft" / "model.safetensors").is_file()


@pytest.mark.e2e
def test_adapters_of_one_base_are_fine_tuned_localized_and_stitched(tmp_path, monkeypatch):
    from lm_util import write_echo_task

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    base = write_base(tmp_path / "base", "llama")
    regions_of = []
    for name, task in (("opposites", write_completion_task(tmp_path / "opposites.csv")),
                       ("echo", write_echo_task(tmp_path / "echo.csv"))):
        ft = graftui.finetune(base=str(base), task=str(task), optimizer="adamw", lr=0.02, epochs=3, train_examples=0,
                              lora_rank=4, out=str(tmp_path / f"lora-{name}"), max_new_tokens=4)
        folder = tmp_path / f"lora-{name}"
        assert (folder / "adapter_config.json").is_file() and not (folder / "model.safetensors").exists()
        assert 0.0 <= ft.test_accuracy <= 1.0  # the adapter's own score: its base with δ added
        region = tmp_path / f"{name}.safetensors"
        graftui.localize(base=str(base), finetuned=str(folder), task=str(task), sparsity=0.05, steps=2, check_n=0,
                         out=str(region), max_new_tokens=4)
        regions_of.append(str(region))
    result = graftui.compose(regions=regions_of, stitch=True, lambdas=[0.5, 1.0], validation_n=4, n=6,
                             out=str(tmp_path / "stitched.safetensors"))
    doc = result.as_dict()
    models_scored = {r["model"] for r in doc["rows"]}
    assert "stitched" in models_scored and any(m.startswith("task arithmetic") for m in models_scored)
    assert (tmp_path / "stitched.safetensors").is_file()


def test_a_hub_adapter_cannot_name_a_path_on_the_server_as_its_base(lora, tmp_path, monkeypatch):
    import shutil

    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--adapter" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (cache / "models--someone--adapter" / "refs").mkdir()
    (cache / "models--someone--adapter" / "refs" / "main").write_text("0" * 40)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(lora["adapter"] / name, snapshot / name)
    raw = json.loads((snapshot / "adapter_config.json").read_text())
    raw["base_model_name_or_path"] = str(lora["base"])  # a stranger's file naming a folder of this machine
    (snapshot / "adapter_config.json").write_text(json.dumps(raw))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    for allow_local in (False, True):  # whoever runs it: the base of a Hub adapter is a Hub id or nothing
        with pytest.raises(ModelError, match=r"names its base '.*', which is not a Hub id") as err:
            models.checkpoint_kind("someone/adapter", allow_local=allow_local)
        assert "\n" not in str(err.value)
    raw["base_model_name_or_path"] = "minilm"  # an offline default is a name, not a path: read
    (snapshot / "adapter_config.json").write_text(json.dumps(raw))
    assert models.checkpoint_kind("someone/adapter", allow_local=False) == "classifier"  # minilm's kind


def test_the_offline_lora_default_is_read_where_local_paths_are_not_allowed(lora):
    import shutil

    from graftui.config import default_checkpoint_dir

    folder = default_checkpoint_dir("smollm2-dates-lora")  # as if built: the default's own folder
    shutil.copytree(lora["adapter"], folder)
    adapter = models.adapter_of("smollm2-dates-lora", allow_local=False)  # a hosted server names it, not a path
    assert adapter is not None and adapter.hash == models.read_adapter(str(lora["adapter"])).hash
    with pytest.raises(ModelError, match="local paths are not allowed"):
        models.adapter_of(str(lora["adapter"]), allow_local=False)


def test_a_folder_holding_a_model_and_an_adapter_is_refused(lora, tmp_path):
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(lora["base"], mixed)
    shutil.copy(lora["adapter"] / "adapter_config.json", mixed / "adapter_config.json")
    with pytest.raises(ModelError, match="holds both a model and a LoRA adapter"):
        models.load_lm(str(mixed), "causal-lm")


LEARN_SCRIPT = """
import sys
import torch
from graftui import compute, learning, models
from graftui.tasks.completion.data import IGNORE
from graftui.config import LearnConfig, LoadOptions

base, adapter, out, blocks = sys.argv[1:]
if blocks == "heap":  # glibc left at its dynamic threshold
    compute.map_large_blocks = lambda: None
else:  # every block of a page or more mapped for its own use, as a big model's are
    compute.LARGE_BLOCK = int(blocks)
torch.set_num_threads(1)
pair = models.ModelPair.load(base, adapter, options=LoadOptions(head="completion"))
params = {n: pair.param(n) for n in pair.graftable}
gen = torch.Generator().manual_seed(3)
ids = torch.randint(3, pair.model.lm.config.vocab_size, (6, 10), generator=gen)
labels = ids.clone()
labels[:, :5] = IGNORE
batches = lambda epoch: [{"input_ids": ids[:3], "labels": labels[:3]}, {"input_ids": ids[3:], "labels": labels[3:]}]
config = LearnConfig(steps=3, lr=0.5, candidates="3", memory="lean")  # lean: large blocks mapped, as asked above
found = {}
for held in (False, True):  # theta_ft formed from the factors when read, and held whole
    ft = {n: pair.ft[n].clone() for n in pair.ft} if held else pair.ft
    region, logits = learning.learn_region(pair.model, params, pair.pre, ft, 40, batches, config)
    found[held] = {"region": region, "logits": logits.values, "candidates": logits.candidates}
torch.save(found, out)
"""


@pytest.mark.e2e  # two processes of their own: the allocator is set before a process starts
def test_a_region_learned_inside_an_adapter_is_the_same_bits_however_memory_is_served(lora, tmp_path):
    """Large blocks mapped for their own use (as mask learning serves them) or from glibc's heap, θ_ft formed from the
    factors or held whole: the same candidates, logits and region, bit for bit."""
    import subprocess
    import sys

    script = tmp_path / "learn.py"
    script.write_text(LEARN_SCRIPT)
    found = {}
    for blocks in ("heap", "4096"):
        done = subprocess.run([sys.executable, str(script), str(lora["base"]), str(lora["adapter"]),
                               str(tmp_path / f"{blocks}.pt"), blocks], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        found[blocks] = torch.load(tmp_path / f"{blocks}.pt")
    runs = [found[blocks][held] for blocks in found for held in (False, True)]
    first = runs[0]
    assert first["region"] and any(not torch.equal(l, l.sign() * l.abs().max()) for l in first["logits"].values())
    for run in runs[1:]:
        for part in ("region", "logits", "candidates"):
            assert run[part].keys() == first[part].keys()
            assert all(torch.equal(run[part][n], first[part][n]) for n in first[part]), part
