"""What an adapter or a LoRA rank hands over is checked before any work: config types, the scale and values of δ, the
rank against the layers, the modules it targets, the base it names; and a harness task that generates with a tokenizer
that has no end-of-sequence token stops at graftui's own rule."""

from __future__ import annotations

import json
import re

import pytest
import torch

from cli_util import run_cli
from graftui import cli
from graftui.adapters import own_base, read_adapter
from graftui.config import FinetuneConfig
from graftui.errors import DataError, ModelError
from lm_util import write_base, write_completion_task
from test_adapters import make_adapter, tiny_llama

peft = pytest.importorskip("peft")
from peft import LoraConfig  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def edited(folder, **fields):
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return str(folder)


@pytest.mark.parametrize("fields, words", [
    ({"lora_alpha": "16"}, "lora_alpha in adapter_config.json must be a finite number, got '16' (str)"),
    ({"lora_alpha": 1e30}, "lora_alpha 1e+30 in adapter_config.json scales δ far beyond any trained adapter"),
    ({"lora_alpha": True}, "lora_alpha in adapter_config.json must be a finite number, got True (bool)"),
    ({"r": "4"}, "r in adapter_config.json must be a whole number ≥ 1, got '4' (str)"),
    ({"r": 0}, "r in adapter_config.json must be a whole number ≥ 1, got 0 (int)"),
    ({"rank_pattern": {"q_proj": "x"}}, "rank_pattern['q_proj'] in adapter_config.json must be a whole number ≥ 1"),
    ({"alpha_pattern": {"q_proj": float("inf")}}, "alpha_pattern['q_proj'] in adapter_config.json must be a finite "
                                                  "number, got inf (float)"),
    ({"use_rslora": "yes"}, "use_rslora in adapter_config.json must be true or false, got 'yes' (str)"),
    ({"target_modules": 7}, "target_modules in adapter_config.json must be a module name, a list of them or a regular "
                            "expression, got 7 (int)"),
])
def test_a_forged_config_is_one_line(llama, tmp_path, fields, words):
    make_adapter(llama, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]), tmp_path / "a", merge=False)
    with pytest.raises(ModelError) as err:
        read_adapter(edited(tmp_path / "a", **fields))
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value, words", [(1e30, "changes model.layers.0.self_attn.q_proj.lora_B by 1e+30, far beyond "
                                                 "any trained weight"),
                                          (float("nan"), "holds NaN or infinite values in "
                                                         "model.layers.0.self_attn.q_proj.lora_B"),
                                          (300.0, "changes model.layers.0.self_attn.q_proj.weight by")])
def test_factors_beyond_any_trained_weight_are_refused(llama, tmp_path, value, words):
    from safetensors.torch import load_file, save_file

    make_adapter(llama, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]), tmp_path / "a", merge=False)
    weights = tmp_path / "a" / "adapter_model.safetensors"
    tensors = load_file(weights)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    tensors[key] = torch.full_like(tensors[key], value)
    if value == 300.0:  # each factor plausible, their product (δ up to 2·4·300·|A|·…) beyond the guard
        a = key.replace("lora_B", "lora_A")
        tensors[a] = torch.full_like(tensors[a], 300.0)
    save_file(tensors, weights)
    with pytest.raises(ModelError) as err:
        read_adapter(str(tmp_path / "a"))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_rank_above_the_layers_width_and_targets_the_base_lacks_are_refused(llama, tmp_path):
    from safetensors.torch import load_file, save_file

    make_adapter(llama, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]), tmp_path / "a", merge=False)
    weights = tmp_path / "a" / "adapter_model.safetensors"
    tensors = load_file(weights)
    for key in list(tensors):  # rank 40 on 32-wide layers
        tensors[key] = torch.zeros(40, 32) if "lora_A" in key else torch.zeros(32, 40)
    save_file(tensors, weights)
    with pytest.raises(ModelError, match=re.escape("has rank 40, above its layer's width 32")):
        read_adapter(edited(tmp_path / "a", r=40))
    make_adapter(llama, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]), tmp_path / "b", merge=False)
    adapter = read_adapter(edited(tmp_path / "b", target_modules=["q_proj", "nonexistent_proj"]))
    with pytest.raises(ModelError, match="targets the module 'nonexistent_proj', which --base tiny does not have"):
        adapter.check_base({n: tuple(p.shape) for n, p in llama.named_parameters()}, "tiny")
    adapter = read_adapter(edited(tmp_path / "b", target_modules=r".*\.nothing_here"))
    with pytest.raises(ModelError, match=r"targets modules matching '\.\*\\\\.nothing_here', and --base tiny has none"):
        adapter.check_base({n: tuple(p.shape) for n, p in llama.named_parameters()}, "tiny")


@pytest.fixture(scope="module")
def adapter_pair(tmp_path_factory):
    """A tiny Llama base folder with its tokenizer and a LoRA adapter of it that names it as its base."""
    root = tmp_path_factory.mktemp("adapter-pair")
    base = write_base(root / "base", "llama")
    from transformers import LlamaForCausalLM

    make_adapter(LlamaForCausalLM.from_pretrained(base), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]),
                 root / "adapter", merge=False)
    edited(root / "adapter", base_model_name_or_path=str(base))
    return base, root / "adapter", write_completion_task(root / "opposites.csv")


def test_an_adapter_without_base_uses_its_own_and_one_given_as_base_is_refused(adapter_pair, tmp_path):
    base, adapter, task = adapter_pair
    from graftui.requests import LocalizeRequest

    assert own_base(str(adapter)) == str(base) and own_base("smollm2-dates-lora") == "smollm2"
    assert own_base(str(base)) is None and own_base("someone/else") is None
    assert LocalizeRequest.make(finetuned=str(adapter)).base == str(base)
    assert LocalizeRequest.make(finetuned=str(adapter), base="minilm").base == "minilm"  # given: kept
    out = tmp_path / "r.safetensors"
    code, _, err = run_cli("localize", "--finetuned", adapter, "--task", task, "--method", "top-movement", "--k", "5",
                           "--check-n", "0", "--out", out)
    assert code == 0, err
    from graftui import regions

    assert regions.load(out).meta.base == str(base)
    code, stdout, err = run_cli("localize", "--base", adapter, "--finetuned", adapter, "--task", task, "--method",
                                "top-movement", "--k", "5", "--check-n", "0", "--out", tmp_path / "x.safetensors")
    assert (code, stdout) == (2, "") and err.strip() == (
        f"graftui: error: --base '{adapter}' is a LoRA adapter, not a pre-trained model: give it as --finetuned, with its "
        f"base '{base}' as --base")
    assert not (tmp_path / "x.safetensors").exists()


def test_an_adapter_read_on_another_base_says_so(adapter_pair, tmp_path):
    base, adapter, task = adapter_pair
    import shutil

    other = tmp_path / "same-weights-elsewhere"
    shutil.copytree(base, other)
    code, out, err = run_cli("localize", "--base", other, "--finetuned", adapter, "--task", task, "--method",
                             "top-movement", "--k", "5", "--check-n", "0", "--out", tmp_path / "r.safetensors", "--json")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert any(f"names '{base}' as its base (its adapter_config.json); it is read on --base" in n for n in notes), notes


def test_an_adapter_whose_targets_its_own_base_lacks_is_told_it_does_not_fit(adapter_pair, tmp_path):
    """A forged target module: the base given is the one the adapter names, so "give the adapter's own base" would send
    the user round in a circle; the line names the modules and says the adapter does not fit this base."""
    import shutil

    base, adapter, task = adapter_pair
    forged = tmp_path / "forged"
    shutil.copytree(adapter, forged)
    edited(forged, target_modules=["q_proj", "nonexistent_proj", "nor_this"])
    out = tmp_path / "r.safetensors"
    code, stdout, err = run_cli("localize", "--finetuned", forged, "--task", task, "--method", "top-movement", "--k", "5",
                                "--check-n", "0", "--out", out)
    assert (code, stdout) == (2, "") and err.strip() == (
        f"graftui: error: adapter '{forged}' targets the modules 'nonexistent_proj', 'nor_this', which --base {base} "
        "does not have, so the adapter does not fit this base: its adapter_config.json names this base as its own, so "
        "the adapter was edited or damaged; give an adapter trained on this base")
    assert not out.exists()
    elsewhere = read_adapter(edited(forged, base_model_name_or_path="someone/other-base"))
    with pytest.raises(ModelError) as told:
        elsewhere.check_base({"model.layers.0.self_attn.q_proj.weight": (32, 32)}, str(base))
    assert str(told.value).endswith("which --base " + str(base) + " does not have, so the adapter does not fit this "
                                    "base: give the adapter's own base, 'someone/other-base' per its adapter_config.json")


def test_a_lora_rank_wider_than_the_model_is_refused_before_training(tmp_path, capsys):
    base = write_base(tmp_path / "base", "llama")
    task = write_completion_task(tmp_path / "opposites.csv")
    out = tmp_path / "out"
    assert cli.main(["finetune", "--base", str(base), "--task", str(task), "--lora-rank", "1000000", "--out",
                     str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--lora-rank 1000000 is wider than" in err, err
    assert re.search(r"narrowest adapted layer \(.+, \d+ → \d+\): a rank above \d+ adds nothing", err)
    assert not out.exists()


def test_a_lora_adapter_that_cannot_fit_is_refused_before_training(tmp_path, monkeypatch):
    from transformers import LlamaForCausalLM

    from graftui import compute, training

    model = LlamaForCausalLM.from_pretrained(write_base(tmp_path / "base", "llama"))
    monkeypatch.setattr(compute, "free_memory", lambda device: 1000)
    with pytest.raises(ModelError, match=r"a LoRA adapter of rank 4 on \d+ layers of 'b' takes about .* to train "
                                         r"\(weights, gradients, optimizer state\) and 1 KB are free on cpu: choose a smaller --lora-rank"):
        training.check_lora_rank(model, FinetuneConfig(optimizer="adamw", lora_rank=4), "b")


def test_a_tokenizer_without_an_end_token_stops_at_the_line_end_and_is_as_it_was(tmp_path):
    from transformers import AutoTokenizer

    from graftui.tasks.harness import lmeval

    tokenizer = AutoTokenizer.from_pretrained(write_base(tmp_path / "base", "llama"))
    tokenizer.eos_token = None
    tokenizer.pad_token = None
    assert tokenizer.eos_token_id is None
    stop = lmeval.line_end(tokenizer)
    with lmeval.stopped_at_line_end(tokenizer, True):
        assert tokenizer.eos_token == stop and tokenizer.eos_token_id is not None
    assert tokenizer.eos_token_id is None and tokenizer.pad_token is None
    with lmeval.stopped_at_line_end(tokenizer, False):  # a multiple-choice task needs none
        assert tokenizer.eos_token_id is None
    lmeval.check_stop(tokenizer, "t")

    class NoNewline:  # a tokenizer whose newline is two tokens, and no end token
        eos_token_id = None

        def encode(self, text, add_special_tokens=False):
            return [1, 2]

    with pytest.raises(DataError, match="generates until the end-of-sequence token, and this model's tokenizer has "
                                        "none"):
        lmeval.check_stop(NoNewline(), "t")
