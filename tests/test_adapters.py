"""LoRA adapters read as fine-tunes: δ per parameter equals what peft merges, read from tiny config-built models."""

from __future__ import annotations

import copy
import json
import os
import re
import warnings

import pytest
import torch

from graftui.adapters import Adapter, is_adapter, read_adapter
from graftui.errors import ModelError

peft = pytest.importorskip("peft")
from peft import IA3Config, LoraConfig, PrefixTuningConfig, get_peft_model  # noqa: E402


def tiny_llama(seed: int = 0, hidden: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).eval()


def make_adapter(base, config, folder, seed: int = 1, merge: bool = True):
    """Wrap a copy of ``base`` with ``config``, give every LoRA tensor random values (peft starts B at zero), save it.

    Returns the merged model: what peft itself makes of the adapter.
    """
    gen = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # peft's notes on embedding copies and on 1-d lora_B biases
        model = get_peft_model(copy.deepcopy(base), config)
        for name, p in model.named_parameters():
            if p.requires_grad:  # LoRA factors and modules_to_save copies
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        model.save_pretrained(str(folder))
        return model.merge_and_unload().eval() if merge else None


def shapes(model) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.shape) for n, t in model.state_dict().items()}


def grafted(base, adapter: Adapter):
    """The base with every changed parameter replaced by θ_pre + δ (or the saved value)."""
    model = copy.deepcopy(base)
    state = model.state_dict()
    with torch.no_grad():
        for name in adapter.factors:
            state[name].add_(adapter.delta(name, state[name].dtype))
        for name in adapter.saved:
            state[name].copy_(adapter.value(name))
    return model


def assert_merges(base, merged, adapter: Adapter, tokens: int = 12):
    """Every changed parameter and the logits equal peft's merge_and_unload()."""
    want, pre = merged.state_dict(), base.state_dict()
    adapter.check_base(shapes(base), "tiny-base")
    assert adapter.factors, "the adapter adapts nothing"
    for name in adapter.factors:
        torch.testing.assert_close(pre[name] + adapter.delta(name), want[name], rtol=1e-6, atol=1e-6)
        assert not torch.allclose(pre[name], want[name])  # the check can fail: the adapter moved it
    for name in adapter.saved:
        torch.testing.assert_close(adapter.value(name), want[name], rtol=0, atol=0)
    ids = torch.randint(0, 64, (2, tokens), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(grafted(base, adapter)(ids).logits, merged(ids).logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(base(ids).logits, merged(ids).logits, atol=1e-3)


def assert_takes(adapter: Adapter, n: int = 200):
    gen = torch.Generator().manual_seed(5)
    for name in adapter.factors:
        full = adapter.delta(name).view(-1)
        idx = torch.randint(0, full.numel(), (n,), generator=gen)
        torch.testing.assert_close(adapter.take(name, idx), full[idx], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def test_lora_delta_is_what_peft_merges(llama, tmp_path):
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], lora_dropout=0.0)
    merged = make_adapter(llama, config, tmp_path / "lora")
    llama.save_pretrained(tmp_path / "base")
    assert is_adapter(tmp_path / "lora") and not is_adapter(tmp_path / "base")
    adapter = read_adapter(str(tmp_path / "lora"))
    assert adapter.names() == sorted(f"model.layers.{i}.{m}.weight" for i in range(2)
                                     for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj"))
    assert adapter.factors["model.layers.0.self_attn.q_proj.weight"].scaling == 2.0
    assert adapter.config["r"] == 4 and adapter.config["lora_alpha"] == 8 and not adapter.saved
    assert json.loads(json.dumps(adapter.config))["target_modules"] == ["q_proj", "up_proj", "v_proj"]  # for records
    data = (tmp_path / "lora" / "adapter_model.safetensors").read_bytes()
    import hashlib
    assert adapter.hash == hashlib.sha256(data).hexdigest()
    assert_merges(llama, merged, adapter)
    assert_takes(adapter)
    with pytest.raises(ModelError, match="saved whole|does not adapt"):
        adapter.delta("model.norm.weight")


def test_rslora_and_patterns(llama, tmp_path):
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], use_rslora=True)
    adapter_dir = tmp_path / "rs"
    merged = make_adapter(llama, config, adapter_dir)
    adapter = read_adapter(str(adapter_dir))
    assert adapter.factors["model.layers.1.mlp.up_proj.weight"].scaling == 8 / 2  # alpha / sqrt(r)
    assert_merges(llama, merged, adapter)

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                        rank_pattern={"v_proj": 2, "layers.1.mlp.up_proj": 6}, alpha_pattern={"q_proj": 3})
    merged = make_adapter(llama, config, tmp_path / "patterns")
    adapter = read_adapter(str(tmp_path / "patterns"))
    f = adapter.factors
    assert f["model.layers.0.self_attn.v_proj.weight"].a.shape[0] == 2
    assert f["model.layers.0.self_attn.v_proj.weight"].scaling == 8 / 2
    assert f["model.layers.1.mlp.up_proj.weight"].scaling == 8 / 6
    assert f["model.layers.0.mlp.up_proj.weight"].scaling == 8 / 4
    assert f["model.layers.0.self_attn.q_proj.weight"].scaling == 3 / 4
    assert_merges(llama, merged, adapter)
    assert_takes(adapter)


def test_embedding_lora_bias_and_modules_to_save(llama, tmp_path):
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["embed_tokens", "q_proj"], modules_to_save=["lm_head"])
    merged = make_adapter(llama, config, tmp_path / "emb")
    adapter = read_adapter(str(tmp_path / "emb"))
    assert adapter.factors["model.embed_tokens.weight"].transposed
    assert set(adapter.saved) == {"lm_head.weight"}  # the base's own embedding copy peft saves is not "trained"
    assert adapter.delta("model.embed_tokens.weight").shape == (64, 32)
    assert_merges(llama, merged, adapter)
    assert_takes(adapter)
    with pytest.raises(ModelError, match="saved whole"):
        adapter.take("lm_head.weight", torch.tensor([0]))

    # the form older peft releases wrote: base_model.model.<module>.modules_to_save.<adapter>.<param>
    from safetensors.torch import load_file, save_file
    path = tmp_path / "emb" / "adapter_model.safetensors"
    tensors = load_file(path)
    tensors["base_model.model.lm_head.modules_to_save.default.weight"] = tensors.pop("base_model.model.lm_head.weight")
    save_file(tensors, path)
    assert_merges(llama, merged, read_adapter(str(tmp_path / "emb")))


def test_sequence_classification_head_saved(tmp_path):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    base = LlamaForSequenceClassification(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, pad_token_id=0, num_labels=3)).eval()
    merged = make_adapter(base, LoraConfig(r=2, lora_alpha=4, target_modules=["k_proj"], task_type="SEQ_CLS"),
                          tmp_path / "cls")
    adapter = read_adapter(str(tmp_path / "cls"))
    assert set(adapter.saved) == {"score.weight"}
    assert_merges(base, merged, adapter)


def test_gpt2_conv1d_fan_in_fan_out_and_lora_bias(tmp_path):
    base = tiny_gpt2()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, lora_bias=True)
    merged = make_adapter(base, config, tmp_path / "gpt2")
    adapter = read_adapter(str(tmp_path / "gpt2"))
    f = adapter.factors["transformer.h.0.attn.c_attn.weight"]
    assert f.transposed and adapter.delta("transformer.h.0.attn.c_attn.weight").shape == (32, 96)  # Conv1D: (in, out)
    assert "transformer.h.1.mlp.c_fc.bias" in adapter.factors  # lora_B's bias, merged into the base's bias
    assert_merges(base, merged, adapter)
    assert_takes(adapter)


def test_gpt2_orientation_follows_the_base(tmp_path):
    """peft transposes for Conv1D whatever the config says; a config saying otherwise is read by the base's shapes."""
    base = tiny_gpt2()
    merged = make_adapter(base, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"]), tmp_path / "g")
    path = tmp_path / "g" / "adapter_config.json"
    raw = json.loads(path.read_text())
    assert raw["fan_in_fan_out"] is True  # peft saves the orientation it used
    path.write_text(json.dumps({**raw, "fan_in_fan_out": False}))
    adapter = read_adapter(str(tmp_path / "g"))
    assert adapter.delta("transformer.h.0.attn.c_attn.weight").shape == (96, 32)
    assert_merges(base, merged, adapter)


def test_base_of_other_shapes_is_refused(llama, tmp_path):
    make_adapter(llama, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]), tmp_path / "a")
    path = tmp_path / "a" / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M"}))
    adapter = read_adapter(str(tmp_path / "a"))
    assert adapter.base_name == "HuggingFaceTB/SmolLM2-135M"
    other = shapes(tiny_llama(hidden=16))
    with pytest.raises(ModelError, match=r"of shape \[32, 32\]; --base wide has \[16, 16\]: give the adapter's own "
                                         r"base, 'HuggingFaceTB/SmolLM2-135M'"):
        adapter.check_base(other, "wide")
    same = shapes(llama)
    adapter.check_base(same, "tiny")
    del same["model.layers.1.self_attn.q_proj.weight"]
    with pytest.raises(ModelError, match="changes model.layers.1.self_attn.q_proj.weight, which --base tiny does not"):
        adapter.check_base(same, "tiny")


def snapshot(root) -> dict[str, float]:
    return {os.path.join(d, f): os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.parametrize("kind, words", [
    ("ia3", "is an IA³ adapter: graftui reads LoRA adapters only"),
    ("prefix", "is a prefix-tuning adapter: graftui reads LoRA adapters only"),
    ("dora", "is a DoRA adapter (use_dora)"),
    ("pissa", "initialised with PiSSA"),
    ("bin", "has only adapter_model.bin: graftui reads safetensors weights only"),
    ("no-config", "is not a LoRA adapter: it has no adapter_config.json"),
    ("bad-json", "adapter_config.json is not valid JSON"),
    ("rank", "disagree with its r = 8"),
    ("conv", "convolution"),
    ("not-a-folder", "no adapter folder"),
])
def test_refusals(llama, tmp_path, kind, words):
    folder = tmp_path / kind
    q = ["q_proj"]
    if kind == "ia3":
        make_adapter(llama, IA3Config(target_modules=q, feedforward_modules=[]), folder, merge=False)
    elif kind == "prefix":
        make_adapter(llama, PrefixTuningConfig(num_virtual_tokens=3, task_type="CAUSAL_LM"), folder, merge=False)
    elif kind == "dora":
        make_adapter(llama, LoraConfig(r=2, target_modules=q, use_dora=True), folder, merge=False)
    elif kind in ("pissa", "bin", "bad-json", "rank"):
        make_adapter(llama, LoraConfig(r=2, target_modules=q), folder, merge=False)
        path = folder / "adapter_config.json"
        if kind == "pissa":
            path.write_text(json.dumps({**json.loads(path.read_text()), "init_lora_weights": "pissa"}))
        elif kind == "bad-json":
            path.write_text("{not json")
        elif kind == "rank":
            path.write_text(json.dumps({**json.loads(path.read_text()), "r": 8}))
        else:
            from safetensors.torch import load_file
            torch.save(load_file(folder / "adapter_model.safetensors"), folder / "adapter_model.bin")
            (folder / "adapter_model.safetensors").unlink()
    elif kind == "no-config":
        llama.save_pretrained(folder)
    elif kind == "conv":
        make_adapter(llama, LoraConfig(r=2, target_modules=q), folder, merge=False)
        from safetensors.torch import load_file, save_file
        tensors = {k: v[..., None, None] for k, v in load_file(folder / "adapter_model.safetensors").items()}
        save_file(tensors, folder / "adapter_model.safetensors")
    before = snapshot(tmp_path)
    with pytest.raises(ModelError, match=re.escape(words)) as err:
        read_adapter(str(folder))
    assert "\n" not in str(err.value)
    assert snapshot(tmp_path) == before  # nothing written


def test_hub_id_offline_and_local_paths_refused(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelError, match="not in the local Hugging Face cache.*offline"):
        read_adapter("someone/some-lora")
    with pytest.raises(ModelError, match="local paths are not allowed"):
        read_adapter(str(tmp_path), allow_local=False)
    with pytest.raises(ModelError, match="neither a local adapter folder nor a Hub id"):
        read_adapter("a b")
