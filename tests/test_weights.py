"""Checkpoints read lazily from their safetensors files, and pairs that hold one model instead of two."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from graftui import learning, models
from graftui.config import LoadOptions
from graftui.errors import ModelError
from graftui.weights import Checkpoint, Placed, model_names, take
from lm_util import make_tokenizer, write_lm_pair


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(7, 5, generator=gen),
        "b.half": torch.randn(3, 3, generator=gen).half(),
        "c.bf16": torch.randn(11, generator=gen).bfloat16(),
        "d.ids": torch.arange(6, dtype=torch.int64).view(2, 3),
        "e.mask": torch.tensor([True, False, True]),
        "f.empty": torch.zeros(0, 4),
        "g.big": torch.randn(5000, 7, generator=gen),  # spans pages: releasing it gives whole pages back
        "h.after": torch.randn(3, generator=gen),
    }


def test_a_checkpoint_reads_what_safetensors_wrote(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors")
    ckpt = Checkpoint.open(tmp_path)
    assert set(ckpt) == set(tensors)
    for name, value in tensors.items():
        got = ckpt[name]
        assert got.dtype == value.dtype and got.shape == value.shape and torch.equal(got, value)
    index = torch.tensor([0, 34, 12])
    assert torch.equal(ckpt.take("a.weight", index), tensors["a.weight"].view(-1)[index])
    assert torch.equal(take(ckpt, "a.weight", index), take(tensors, "a.weight", index))
    ckpt.release()  # pages given back are read again from the file
    assert torch.equal(ckpt["a.weight"], tensors["a.weight"])
    for name in tensors:  # one tensor's pages at a time, whole pages inside it only: its neighbours are intact
        ckpt.release(name)
        assert all(torch.equal(ckpt[n], tensors[n]) for n in tensors)
    as_float = ckpt.renamed({"x": "b.half"}, torch.float32)
    assert list(as_float) == ["x"] and as_float["x"].dtype == torch.float32
    assert torch.equal(as_float["x"], tensors["b.half"].float())
    assert torch.equal(load_file(tmp_path / "model.safetensors")["c.bf16"], ckpt["c.bf16"])


def test_sharded_checkpoints_are_read_through_their_index(tmp_path):
    tensors = _tensors()
    names = list(tensors)
    save_file({n: tensors[n] for n in names[:3]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({n: tensors[n] for n in names[3:]}, tmp_path / "model-00002-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        n: f"model-0000{1 if i < 3 else 2}-of-00002.safetensors" for i, n in enumerate(names)}}))
    ckpt = Checkpoint.open(tmp_path)
    assert all(torch.equal(ckpt[n], tensors[n]) for n in names)


def _write_raw(path, header: bytes, body: bytes = b"") -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + body)


@pytest.mark.parametrize("make, words", [
    (lambda p: p.write_bytes(b"\x01\x02"), "too short"),
    (lambda p: p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}"), "header of"),
    (lambda p: _write_raw(p, b"not json"), "not JSON"),
    (lambda p: _write_raw(p, b"[1, 2]"), "not a JSON object"),
    (lambda p: _write_raw(p, json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode(),
                          b"\0" * 8), "outside the file"),
    (lambda p: _write_raw(p, json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode(),
                          b"\0" * 8), "wrong size"),
    (lambda p: _write_raw(p, json.dumps({"w": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}).encode(),
                          b"\0"), "malformed"),
])
def test_a_hostile_weights_file_is_refused_in_one_line(tmp_path, make, words):
    make(tmp_path / "model.safetensors")
    with pytest.raises(ModelError, match=words):
        Checkpoint.open(tmp_path)


def test_a_model_is_matched_to_its_file_at_one_prefix_depth(tmp_path):
    save_file({"encoder.w": torch.zeros(2, 2), "w": torch.zeros(3)}, tmp_path / "model.safetensors")
    ckpt = Checkpoint.open(tmp_path)
    # one depth for all: "bert.encoder.w" strips to "encoder.w"; "bert.w" is not matched to the unrelated "w"
    # by stripping further, and a shape that differs is not a match
    assert model_names({"bert.encoder.w": (2, 2), "bert.other.w": (3,)}, ckpt) == ({"bert.encoder.w": "encoder.w"},
                                                                                   set())
    assert model_names({"bert.encoder.w": (2, 2), "bert.x.w": (5,)}, ckpt) == ({"bert.encoder.w": "encoder.w"}, set())
    assert model_names({"bert.encoder.w": (2, 2), "bert.w": (4,)}, ckpt) == ({"bert.encoder.w": "encoder.w"}, {"bert.w"})


def _eager(base_dir, ft_dir, options):
    kind = models.pair_kind(str(ft_dir), options)
    finetuned, tok, _ = models.load_reader(str(ft_dir), kind, None, options)
    base, _, new = models.load_reader(str(base_dir), kind, None, options, tokenizer=tok)
    fixed = finetuned.head_names() if hasattr(finetuned, "head_names") else set()
    return models.ModelPair.from_models(base, finetuned, tok, new, base_ref=str(base_dir), finetuned_ref=str(ft_dir),
                                        fixed=fixed)


def _same_pairs(lazy, eager, ids):
    assert lazy.lazy and not eager.lazy
    assert (lazy.graftable, lazy.head, lazy.excluded) == (eager.graftable, eager.head, eager.excluded)
    assert sorted(lazy.ft) == sorted(eager.ft) and sorted(lazy.pre) == sorted(eager.pre)
    assert all(torch.equal(lazy.pre[n], eager.pre[n]) for n in eager.pre)
    assert all(torch.equal(lazy.ft[n], eager.ft[n]) for n in eager.ft)
    state = lambda pair: pair.model.state_dict()  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(state(lazy).values(), state(eager).values()))
    gen = torch.Generator().manual_seed(3)
    region = {n: torch.randperm(lazy.pre[n].numel(), generator=gen)[:5].sort().values for n in lazy.graftable[::2]}
    with torch.no_grad():
        for context in (lambda p: p.grafted(region), lambda p: p.finetuned(), lambda p: p.interpolated(0.5, region)):
            with context(lazy) as a:
                first = a(input_ids=ids).logits
            with context(eager) as b:
                second = b(input_ids=ids).logits
            assert torch.equal(first, second)  # bit for bit
    assert all(torch.equal(a, b) for a, b in zip(state(lazy).values(), state(eager).values()))  # and back at θ_pre


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_pair_read_from_its_files_is_the_pair_read_as_two_models(tmp_path, arch):
    base_dir, ft_dir = write_lm_pair(tmp_path, arch)
    options = LoadOptions(head="completion")
    lazy = models.ModelPair.load(str(base_dir), str(ft_dir), options=options)
    _same_pairs(lazy, _eager(base_dir, ft_dir, options), torch.tensor([[1, 5, 9, 13, 2]]))


def test_values_handed_out_where_the_model_lives_graft_and_learn_as_the_files_own(tmp_path):
    """A lazy pair on a GPU reads θ_pre and θ_ft through ``Placed``: every reader (grafts, WiSE, the full and the
    candidate learner, ranking by movement) must get the same values from it as from the files."""
    from graftui import learning
    from graftui.config import LearnConfig

    base_dir, ft_dir = write_lm_pair(tmp_path, "llama")
    options = LoadOptions(head="completion")
    plain = models.ModelPair.load(str(base_dir), str(ft_dir), options=options)
    placed = models.ModelPair.load(str(base_dir), str(ft_dir), options=options)
    placed.pre, placed.ft = Placed(placed.pre, "cpu"), Placed(Placed(placed.ft, "meta"), "cpu")
    assert placed.lazy and isinstance(placed.ft.source, Checkpoint)  # wrapping twice keeps the files, not a wrapper
    name = placed.graftable[1]
    assert placed.pre.numel(name) == plain.pre[name].numel() and name in placed.ft and len(placed.ft) == len(plain.ft)
    _same_pairs(placed, _eager(base_dir, ft_dir, options), torch.tensor([[1, 5, 9, 13, 2]]))
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 60, (4, 8), generator=gen)
    batches = lambda epoch: [{"input_ids": ids, "labels": ids}]  # noqa: E731
    for candidates in ("all", "3"):
        config = LearnConfig(steps=3, lr=0.5, candidates=candidates, memory="lean")
        found = [learning.learn_region(p.model, {n: p.param(n) for n in p.graftable}, p.pre, p.ft, 40, batches, config)[0]
                 for p in (plain, placed)]
        assert found[0].keys() == found[1].keys() and all(torch.equal(found[0][n], found[1][n]) for n in found[0])


def test_a_lazy_pair_moved_off_the_cpu_moves_its_working_model_only(tmp_path):
    base_dir, ft_dir = write_lm_pair(tmp_path, "llama")
    pair = models.ModelPair.load(str(base_dir), str(ft_dir), options=LoadOptions(head="completion"))
    name = pair.graftable[0]
    pre = pair.pre[name].clone()
    pair.to("meta")  # a device without storage: whatever were moved there would be lost
    assert pair.device.type == "meta" and pair.lazy and isinstance(pair.pre.source, Checkpoint)
    assert pair.pre[name].device.type == "meta" and pair.ft.take(name, torch.tensor([0, 1])).device.type == "meta"
    assert torch.equal(pair.pre.source[name], pre)  # still read from the file, in host memory


def test_a_classifier_pair_read_from_files_gets_its_head_from_the_fine_tune(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    config = BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2)
    torch.manual_seed(0)
    body = BertModel(config, add_pooling_layer=True)
    base_dir, ft_dir = tmp_path / "base", tmp_path / "ft"
    make_tokenizer(base_dir)
    body.save_pretrained(base_dir)  # a bare encoder, as minilm is: its file has no "bert." prefix and no head
    ft = BertForSequenceClassification(config)
    ft.bert.load_state_dict(body.state_dict())
    with torch.no_grad():
        for p in ft.bert.encoder.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ft.save_pretrained(ft_dir)
    make_tokenizer(ft_dir)
    lazy = models.ModelPair.load(str(base_dir), str(ft_dir))
    assert lazy.lazy and lazy.head == ["classifier.weight", "classifier.bias"]
    assert torch.equal(lazy.param("classifier.weight"), ft.classifier.weight)  # the fine-tune's head, not a new one
    _same_pairs(lazy, _eager(base_dir, ft_dir, LoadOptions()), torch.tensor([[1, 5, 9, 13, 2]]))


def test_a_pair_whose_files_do_not_match_is_read_as_two_models(tmp_path):
    base_dir, ft_dir = write_lm_pair(tmp_path, "llama")
    weights = load_file(ft_dir / "model.safetensors")
    name = next(n for n in weights if n.endswith("q_proj.weight"))
    on_disk = load_file(base_dir / "model.safetensors")
    on_disk[name] = on_disk[name][:, :-1].contiguous()  # a base of another shape there
    save_file(on_disk, base_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError):  # read as two models: the loader's refusal, not a silent lazy pair
        models.ModelPair.load(str(base_dir), str(ft_dir), options=LoadOptions(head="completion"))


def test_a_quantized_checkpoint_is_refused_before_any_weight_is_read(tmp_path):
    base_dir, ft_dir = write_lm_pair(tmp_path, "llama")
    config = json.loads((base_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (base_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"quantized checkpoint \(bitsandbytes\).*dequantize"):
        models.ModelPair.load(str(base_dir), str(ft_dir), options=LoadOptions(head="completion"))


def test_debug_says_where_the_pair_lives(tmp_path, capsys):
    from graftui import cli

    base_dir, ft_dir = write_lm_pair(tmp_path, "llama")
    assert cli.main(["pair", "--base", str(base_dir), "--finetuned", str(ft_dir), "--head", "completion",
                     "--debug"]) == 0
    err = capsys.readouterr().err
    assert "θ_pre memory-mapped from its file, θ_ft memory-mapped from its file" in err
    assert "cpu float32" in err and "resident" in err


def test_a_model_a_device_map_could_not_place_is_refused(tmp_path, monkeypatch):
    base_dir, ft_dir = write_lm_pair(tmp_path, "llama")
    real = models.load_reader

    def offloaded(*args, **kwargs):  # what accelerate leaves when a device map runs out of room: meta tensors
        model, tok, new = real(*args, **kwargs)
        layer = model.lm.model.layers[1].mlp.up_proj
        layer.weight = torch.nn.Parameter(torch.empty(layer.weight.shape, device="meta"))
        return model, tok, new

    monkeypatch.setattr(models, "load_reader", offloaded)
    with pytest.raises(ModelError, match=r"--device-map auto left no room for .* went to disk"):
        models.ModelPair.load(str(base_dir), str(ft_dir), options=LoadOptions(head="completion", device_map="auto"))


def test_a_checkpoint_is_read_from_its_own_file_not_a_variant_beside_it(tmp_path):
    save_file({"w": torch.ones(3)}, tmp_path / "model.safetensors")
    save_file({"w": torch.zeros(3).half()}, tmp_path / "model.fp16.safetensors")
    assert torch.equal(Checkpoint.open(tmp_path)["w"], torch.ones(3))
    (tmp_path / "model.safetensors").unlink()
    save_file({"w": torch.ones(3)}, tmp_path / "other.safetensors")
    with pytest.raises(ModelError, match="is also in"):  # two files, one tensor: no silent choice
        Checkpoint.open(tmp_path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_weight_that_is_not_finite_is_found_in_any_slice_of_a_large_tensor(bad):
    """The finiteness check reads a tensor a slice at a time (no |x| and masks of a whole embedding beside it): a bad
    value in the last slice is found as surely as one in the first."""
    values = {"w": torch.zeros(3 * (1 << 20) + 7)}
    assert models._finite(values, "w")
    for where in (0, (1 << 20) + 3, values["w"].numel() - 1):
        values["w"].zero_()
        values["w"][where] = bad
        assert not models._finite(values, "w"), where
    assert models._finite({"ids": torch.arange(10)}, "ids")  # not floating point: nothing to check
    wide = torch.zeros(64, 3)
    wide[5, 2] = bad
    assert not models._finite({"t": wide.t()}, "t")  # not contiguous: read along its rows, not copied whole
