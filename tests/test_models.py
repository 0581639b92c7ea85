"""ModelPair: compatibility checks, graftable sets, exact O(k) apply/remove."""

from __future__ import annotations

import copy

import pytest
import torch

from graftui import method
from graftui.models import GraftableSpec, ModelError, ModelPair, check_pair, resolve

from conftest import HEAD, make_tiny_bert, make_tiny_finetuned, make_tiny_pair


def test_working_model_starts_as_pretrained_body_with_finetuned_head(tiny_pair):
    pair, base, ft = tiny_pair
    ft_params = dict(ft.named_parameters())
    for name, p in pair.model.named_parameters():
        expected = ft_params[name] if name in HEAD else dict(base.named_parameters())[name]
        assert torch.equal(p.detach(), expected.detach()), name


def test_graftable_set_excludes_embeddings_and_head(tiny_pair):
    pair, _, _ = tiny_pair
    assert not any("embeddings" in n for n in pair.graftable)
    assert set(pair.head) == HEAD
    assert all("embeddings" in n for n in pair.excluded)
    counts = pair.counts()
    assert counts["graftable"] + counts["head"] + counts["excluded"] == counts["total"]
    assert counts["total"] == sum(p.numel() for p in pair.model.parameters())
    with_emb, _, _ = make_tiny_pair(spec=GraftableSpec(include_embeddings=True))
    assert with_emb.counts()["graftable"] == counts["graftable"] + counts["excluded"]


def test_graftable_set_can_be_restricted_to_module_types():
    pair, _, _ = make_tiny_pair(spec=GraftableSpec(modules=("query", "value")))
    assert pair.graftable and all(n.split(".")[-2] in {"query", "value"} for n in pair.graftable)


def test_grafted_model_is_eq1_bit_exactly(tiny_pair):
    pair, base, ft = tiny_pair
    region = method.top_k({n: torch.rand(pair.pre[n].shape) for n in pair.graftable}, 300)
    masks = method.region_to_mask(region, pair.shapes)
    base_p, ft_p = dict(base.named_parameters()), dict(ft.named_parameters())
    with pair.grafted(region) as model:
        for name, p in model.named_parameters():
            if name in masks:
                expected = (base_p[name].double() + masks[name].double() * (ft_p[name].double() - base_p[name].double())).float()
                assert torch.equal(p.detach(), expected), name
    for name in pair.graftable:  # removed again, exactly
        assert torch.equal(pair.param(name).detach(), base_p[name].detach())


def test_apply_remove_round_trip_is_exact_and_order_free(tiny_pair):
    pair, _, _ = tiny_pair
    before = {n: p.detach().clone() for n, p in pair.model.named_parameters()}
    a = method.top_k({n: torch.rand(pair.pre[n].shape) for n in pair.graftable}, 200)
    b = method.top_k({n: torch.rand(pair.pre[n].shape) for n in pair.graftable}, 500)
    pair.apply(a)
    pair.apply(b)
    pair.remove(a)
    pair.remove(b)
    for n, p in pair.model.named_parameters():
        assert torch.equal(p.detach(), before[n])


def test_finetuned_context_is_the_finetuned_model(tiny_pair):
    pair, _, ft = tiny_pair
    ids = torch.randint(1, 60, (4, 10))
    with torch.no_grad():
        expected = ft(input_ids=ids).logits
        with pair.finetuned() as model:
            got = model(input_ids=ids).logits
    assert torch.equal(got, expected)


def test_full_region_equals_finetuned_when_embeddings_did_not_move():
    base = make_tiny_bert(0)
    ft = make_tiny_finetuned(base)
    with torch.no_grad():  # fine-tuning with frozen embeddings, as the paper does
        for (n, p), (_, q) in zip(ft.named_parameters(), base.named_parameters()):
            if "embeddings" in n:
                p.copy_(q)
    reference = copy.deepcopy(ft)
    pair = ModelPair.from_models(copy.deepcopy(base), ft, None, HEAD)
    everything = {n: torch.arange(pair.pre[n].numel()) for n in pair.graftable}
    with pair.grafted(everything) as model:
        for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            assert torch.equal(p.detach(), q.detach()), n
    assert pair.excluded and all(pair.param(n).data.data_ptr() == pair.pre[n].data_ptr() for n in pair.excluded)


def test_check_pair_names_the_first_differing_tensor():
    from transformers import BertConfig, BertForSequenceClassification

    a = make_tiny_bert()
    b = BertForSequenceClassification(BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2,
                                                 num_attention_heads=2, intermediate_size=48, max_position_embeddings=32))
    with pytest.raises(ModelError, match=r"shapes differ for bert\.encoder\.layer\.0\.intermediate\.dense\.weight"):
        check_pair(a, b, HEAD)
    c = BertForSequenceClassification(BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=3,
                                                 num_attention_heads=2, intermediate_size=32, max_position_embeddings=32))
    with pytest.raises(ModelError, match=r"different parameters \(first: bert\.encoder\.layer\.2"):
        check_pair(a, c, HEAD)


def test_resolve_references(tmp_path):
    assert resolve("minilm").endswith("model")
    assert resolve("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    with pytest.raises(ModelError, match="no checkpoint directory"):
        resolve(str(tmp_path / "missing"))
    with pytest.raises(ModelError, match="no config.json"):
        resolve(str(tmp_path))
    with pytest.raises(ModelError, match="not allowed"):
        resolve(str(tmp_path), allow_local=False)
    with pytest.raises(ModelError, match="no model given"):
        resolve("  ")
