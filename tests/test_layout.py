import json
import math
import re

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
)

from graftui.layout import MODULE_LABELS, MODULE_TYPES, ParamRole, anatomy, param_role, split_fused


def _shapes(model):
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def bert_shapes():
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, num_labels=3)
    return _shapes(BertForSequenceClassification(cfg))


@pytest.fixture(scope="module")
def gpt2_shapes():
    cfg = GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=50, num_labels=2)
    return _shapes(GPT2ForSequenceClassification(cfg))


@pytest.fixture(scope="module")
def llama_shapes():
    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=50)
    return _shapes(LlamaForSequenceClassification(cfg))


BERT_BLOCK = {
    "attention.self.query": "query",
    "attention.self.key": "key",
    "attention.self.value": "value",
    "attention.output.dense": "attn_out",
    "attention.output.LayerNorm": "layernorm",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "layernorm",
}
DISTILBERT_BLOCK = {
    "attention.q_lin": "query",
    "attention.k_lin": "key",
    "attention.v_lin": "value",
    "attention.out_lin": "attn_out",
    "sa_layer_norm": "layernorm",
    "ffn.lin1": "ffn_in",
    "ffn.lin2": "ffn_out",
    "output_layer_norm": "layernorm",
}
GPT2_BLOCK = {
    "ln_1": "layernorm",
    "attn.c_proj": "attn_out",
    "ln_2": "layernorm",
    "mlp.c_fc": "ffn_in",
    "mlp.c_proj": "ffn_out",
}
LLAMA_BLOCK = {
    "self_attn.q_proj": "query",
    "self_attn.k_proj": "key",
    "self_attn.v_proj": "value",
    "self_attn.o_proj": "attn_out",
    "mlp.gate_proj": "ffn_in",
    "mlp.up_proj": "ffn_in",
    "mlp.down_proj": "ffn_out",
    "input_layernorm": "layernorm",
    "post_attention_layernorm": "layernorm",
}


def _check_blocks(shapes, prefix, table, fused=()):
    """Every block parameter maps to the table's module, its layer index and its kind."""
    pat = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.(.+)\.(weight|bias)$")
    seen = set()
    for name in shapes:
        m = pat.match(name)
        if not m:
            continue
        layer, mod, kind = int(m.group(1)), m.group(2), m.group(3)
        role = param_role(name)
        if mod in fused:
            assert role == ParamRole(layer, "query", kind, ("query", "key", "value")), name
        else:
            assert role == ParamRole(layer, table[mod], kind), name
        seen.add(mod)
    assert seen == set(table) | set(fused)


def test_bert_roles(bert_shapes):
    _check_blocks(bert_shapes, "bert.encoder.layer", BERT_BLOCK)
    assert param_role("bert.embeddings.word_embeddings.weight") == ParamRole(None, "other", "weight")
    assert param_role("bert.embeddings.LayerNorm.bias") == ParamRole(None, "layernorm", "bias")
    assert param_role("bert.pooler.dense.weight") == ParamRole(None, "other", "weight")
    assert param_role("classifier.bias") == ParamRole(None, "other", "bias")
    # RoBERTa uses the same block names; its head has dense/out_proj outside the blocks
    assert param_role("roberta.encoder.layer.0.intermediate.dense.bias") == ParamRole(0, "ffn_in", "bias")
    assert param_role("roberta.encoder.layer.11.output.dense.weight") == ParamRole(11, "ffn_out", "weight")
    assert param_role("classifier.out_proj.weight").module == "other"
    assert param_role("classifier.dense.weight").layer is None


def test_distilbert_roles():
    cfg = DistilBertConfig(vocab_size=50, dim=16, n_layers=2, n_heads=2, hidden_dim=32)
    shapes = _shapes(DistilBertForSequenceClassification(cfg))
    _check_blocks(shapes, "distilbert.transformer.layer", DISTILBERT_BLOCK)
    assert param_role("pre_classifier.weight") == ParamRole(None, "other", "weight")


def test_gpt2_roles(gpt2_shapes):
    _check_blocks(gpt2_shapes, "transformer.h", GPT2_BLOCK, fused=("attn.c_attn",))
    assert param_role("transformer.ln_f.weight") == ParamRole(None, "layernorm", "weight")
    assert param_role("transformer.wte.weight") == ParamRole(None, "other", "weight")
    assert param_role("score.weight") == ParamRole(None, "other", "weight")


def test_llama_roles(llama_shapes):
    _check_blocks(llama_shapes, "model.layers", LLAMA_BLOCK)
    assert all(param_role(n).kind == "weight" for n in llama_shapes)  # no biases, RMSNorm has weight only
    assert param_role("model.norm.weight") == ParamRole(None, "layernorm", "weight")
    assert param_role("model.embed_tokens.weight") == ParamRole(None, "other", "weight")


def test_module_constants():
    assert set(MODULE_LABELS) == set(MODULE_TYPES)


def _numel(shape):
    return math.prod(shape)


def test_bert_anatomy_counts_totals_density(bert_shapes):
    L = "bert.encoder.layer"
    region = {
        f"{L}.0.attention.self.query.weight": torch.tensor([0, 5, 17]),
        f"{L}.0.attention.self.query.bias": torch.tensor([1, 2]),
        f"{L}.1.output.dense.weight": torch.tensor([3, 100, 200, 511]),
        f"{L}.1.output.LayerNorm.weight": torch.tensor([0, 15]),
        f"{L}.1.attention.output.LayerNorm.bias": torch.tensor([4, 5, 6]),
        "bert.embeddings.word_embeddings.weight": torch.arange(7),
        "classifier.bias": torch.tensor([2]),
    }
    a = anatomy(region, bert_shapes)
    assert a.layers == ("layer 0", "layer 1", "embeddings", "pooler", "other")
    assert a.modules == MODULE_TYPES
    r, m = a.layers.index, a.modules.index

    expected_counts = {
        ("layer 0", "query"): 5,
        ("layer 1", "ffn_out"): 4,
        ("layer 1", "layernorm"): 5,
        ("embeddings", "other"): 7,
        ("other", "other"): 1,
    }
    for row in a.layers:
        for mod in a.modules:
            assert a.counts[r(row)][m(mod)] == expected_counts.get((row, mod), 0), (row, mod)

    h, i = 16, 32
    # per block: q/k/v/attn_out are (h,h)+h, ffn_in (i,h)+i, ffn_out (h,i)+h, two LayerNorms 2*(h+h)
    for layer in ("layer 0", "layer 1"):
        for mod in ("query", "key", "value", "attn_out"):
            assert a.totals[r(layer)][m(mod)] == h * h + h
        assert a.totals[r(layer)][m("ffn_in")] == i * h + i
        assert a.totals[r(layer)][m("ffn_out")] == h * i + h
        assert a.totals[r(layer)][m("layernorm")] == 4 * h
        assert a.totals[r(layer)][m("other")] == 0
    assert a.totals[r("embeddings")][m("other")] == (50 + 512 + 2) * h
    assert a.totals[r("embeddings")][m("layernorm")] == 2 * h
    assert a.totals[r("pooler")][m("other")] == h * h + h
    assert a.totals[r("other")][m("other")] == 3 * h + 3  # classifier
    assert sum(map(sum, a.totals)) == sum(_numel(s) for s in bert_shapes.values())

    assert a.density[r("layer 0")][m("query")] == 5 / 272
    assert a.density[r("layer 1")][m("layernorm")] == 5 / 64
    assert a.density[r("layer 0")][m("key")] == 0.0
    assert a.density[r("layer 0")][m("other")] == 0.0  # total 0

    assert a.weight_count == 3 + 4 + 2 + 7 and a.bias_count == 2 + 3 + 1
    assert a.bias_total == sum(_numel(s) for n, s in bert_shapes.items() if n.endswith(".bias"))
    assert a.weight_total + a.bias_total == sum(_numel(s) for s in bert_shapes.values())
    assert a.by_layer == [5, 9, 7, 0, 1]
    assert a.by_module == {"query": 5, "key": 0, "value": 0, "attn_out": 0, "ffn_in": 0,
                           "ffn_out": 4, "layernorm": 5, "other": 8}

    rows = a.to_rows()
    assert all(row["total"] > 0 for row in rows)
    assert sum(row["count"] for row in rows) == 22
    assert {"layer": "layer 0", "module": "query", "count": 5, "total": 272, "density": 5 / 272} in rows
    json.dumps(rows)


def test_anatomy_subset_of_params(bert_shapes):
    # only encoder blocks graftable: no embeddings/other rows, no "other" module
    shapes = {n: s for n, s in bert_shapes.items() if ".encoder.layer." in n}
    a = anatomy({}, shapes)
    assert a.layers == ("layer 0", "layer 1")
    assert "other" not in a.modules
    assert a.by_layer == [0, 0] and a.weight_count == 0


def test_anatomy_rejects_bad_regions(bert_shapes):
    with pytest.raises(KeyError):
        anatomy({"not.a.param": torch.tensor([0])}, bert_shapes)
    with pytest.raises(ValueError):
        anatomy({"classifier.bias": torch.tensor([3])}, bert_shapes)  # shape (3,)


def test_gpt2_split_fused_exact(gpt2_shapes):
    name = "transformer.h.1.attn.c_attn.weight"
    shape = gpt2_shapes[name]
    assert shape == (16, 48)  # Conv1D: (in, 3*out), columns q | k | v
    flat = torch.tensor([0 * 48 + 0, 0 * 48 + 16, 1 * 48 + 15, 2 * 48 + 40, 15 * 48 + 47, 3 * 48 + 31])
    parts = split_fused(name, shape, flat)
    assert set(parts) == {"query", "key", "value"}
    assert parts["query"].tolist() == [0, 63]  # columns 0, 15
    assert parts["key"].tolist() == [16, 175]  # columns 16, 31
    assert parts["value"].tolist() == [136, 767]  # columns 40, 47
    bias = "transformer.h.1.attn.c_attn.bias"
    parts = split_fused(bias, gpt2_shapes[bias], torch.tensor([0, 16, 17, 32, 47]))
    assert {k: v.tolist() for k, v in parts.items()} == {"query": [0], "key": [16, 17], "value": [32, 47]}
    # ordinary parameter: one entry, unchanged
    idx = torch.tensor([1, 2])
    out = split_fused("transformer.h.0.mlp.c_fc.weight", (16, 64), idx)
    assert list(out) == ["ffn_in"] and out["ffn_in"] is idx


def test_gpt2_anatomy(gpt2_shapes):
    region = {
        "transformer.h.1.attn.c_attn.weight": torch.tensor([0, 16, 63, 136, 175, 767]),
        "transformer.h.1.attn.c_attn.bias": torch.tensor([0, 16, 17, 32, 47]),
        "transformer.h.0.mlp.c_proj.bias": torch.tensor([3]),
        "transformer.ln_f.weight": torch.tensor([0, 1]),
        "transformer.wpe.weight": torch.tensor([9]),
    }
    a = anatomy(region, gpt2_shapes)
    assert a.layers == ("layer 0", "layer 1", "embeddings", "other")
    r, m = a.layers.index, a.modules.index
    assert a.counts[r("layer 1")][m("query")] == 2 + 1
    assert a.counts[r("layer 1")][m("key")] == 2 + 2
    assert a.counts[r("layer 1")][m("value")] == 2 + 2
    assert a.counts[r("layer 0")][m("ffn_out")] == 1
    assert a.counts[r("other")][m("layernorm")] == 2
    assert a.counts[r("embeddings")][m("other")] == 1
    for mod in ("query", "key", "value", "attn_out"):
        assert a.totals[r("layer 0")][m(mod)] == 16 * 16 + 16
    assert a.totals[r("layer 0")][m("ffn_in")] == 16 * 64 + 64
    assert a.totals[r("layer 0")][m("layernorm")] == 4 * 16
    assert a.totals[r("embeddings")][m("other")] == (50 + 1024) * 16
    assert a.totals[r("other")][m("layernorm")] == 2 * 16
    assert a.totals[r("other")][m("other")] == 2 * 16  # score, no bias
    assert sum(map(sum, a.totals)) == sum(_numel(s) for s in gpt2_shapes.values())
    assert a.density[r("layer 1")][m("key")] == 4 / 272
    assert a.weight_count == 6 + 2 + 1 and a.bias_count == 5 + 1


def test_llama_anatomy(llama_shapes):
    region = {
        "model.layers.0.self_attn.k_proj.weight": torch.tensor([0, 127]),
        "model.layers.1.mlp.gate_proj.weight": torch.tensor([1, 2, 3]),
        "model.layers.1.mlp.up_proj.weight": torch.tensor([4]),
        "model.layers.1.post_attention_layernorm.weight": torch.tensor([15]),
    }
    a = anatomy(region, llama_shapes)
    r, m = a.layers.index, a.modules.index
    assert a.counts[r("layer 0")][m("key")] == 2
    assert a.totals[r("layer 0")][m("key")] == 8 * 16  # one KV head of size 8
    assert a.totals[r("layer 0")][m("query")] == 16 * 16
    assert a.counts[r("layer 1")][m("ffn_in")] == 4
    assert a.totals[r("layer 1")][m("ffn_in")] == 2 * 32 * 16  # gate + up
    assert a.density[r("layer 1")][m("ffn_in")] == 4 / 1024
    assert a.totals[r("layer 1")][m("ffn_out")] == 16 * 32
    assert a.counts[r("layer 1")][m("layernorm")] == 1
    assert a.totals[r("layer 1")][m("layernorm")] == 2 * 16
    assert a.bias_total == 0 and a.bias_count == 0 and a.weight_count == 7
    assert a.by_layer[:2] == [2, 5]
