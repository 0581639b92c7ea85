"""Anatomy's drill-down: dropping one part of a region (the maths, then the ablation end to end on a tiny saved
pair), the tensors and neurons holding most of a region, and per-part stability across seeds."""

from __future__ import annotations

import threading

import pytest
import torch

from conftest import make_tiny_pair
from graftui import sets
from graftui.experiments import drop_part, part_mask, row_of
from graftui.requests import AnatomyRequest, EvaluateRequest, LocalizeRequest

LIN = "bert.encoder.layer.0.intermediate.dense.weight"
BIAS = "bert.encoder.layer.0.intermediate.dense.bias"
CONV = "transformer.h.1.mlp.c_fc.weight"
EMB = "bert.embeddings.word_embeddings.weight"
QKV = "transformer.h.0.attn.c_attn.weight"


def _grafted_state(pair, region) -> dict[str, torch.Tensor]:
    with pair.grafted(region):
        return {n: pair.param(n).detach().clone() for n in pair.graftable}


# -- the maths of dropping a part ----------------------------------------------------------------------
def test_drop_part_is_exact_on_a_tiny_model():
    from graftui.localizers import Budget, run_method

    pair, _, _ = make_tiny_pair()
    shapes = pair.shapes
    region, _ = run_method(pair, Budget(k=300), "top-movement")
    rows = sorted({row_of(n, shapes[n]) for n in region})
    assert rows == ["layer 0", "layer 1", "pooler"]
    whole = _grafted_state(pair, region)

    # dropping a part the region does not reach drops nothing: the graft itself
    without1, _ = drop_part(region, shapes, layer="layer 1")
    only_layer0, _ = drop_part(without1, shapes, layer="pooler")
    kept, _ = drop_part(only_layer0, shapes, layer="layer 1")
    assert kept.keys() == only_layer0.keys() and all(torch.equal(kept[n], only_layer0[n]) for n in kept)

    # dropping every layer (or every module type) leaves nothing: the graft is θ_pre in every graftable tensor
    for by, parts in (("layer", rows), ("module", sorted({m for n in region for m in sets_modules(n, shapes)}))):
        left = region
        for part in parts:
            left, _ = drop_part(left, shapes, **{by: part})
        assert left == {}, by
        state = _grafted_state(pair, left)
        assert all(torch.equal(state[n], pair.pre[n]) for n in pair.graftable)

    # dropping layer 0 changes layer 0 only, and puts exactly its region parameters back to θ_pre
    without0, _ = drop_part(region, shapes, layer="layer 0")
    state = _grafted_state(pair, without0)
    for n in pair.graftable:
        expected = pair.pre[n] if row_of(n, shapes[n]) == "layer 0" else whole[n]
        assert torch.equal(state[n], expected), n
    moved = sum(int((whole[n] != state[n]).sum()) for n in pair.graftable)
    assert moved == sum(int(i.numel()) for n, i in region.items() if row_of(n, shapes[n]) == "layer 0") > 0

    # a skill patch's values are kept with their indices
    values = {n: pair.ft[n].reshape(-1)[i] for n, i in region.items()}
    kept, kept_values = drop_part(region, shapes, module="ffn_in", values=values)
    assert kept.keys() == kept_values.keys()
    assert all(torch.equal(kept_values[n], pair.ft[n].reshape(-1)[kept[n]]) for n in kept)
    assert all(sets_modules(n, shapes) != {"ffn_in"} for n in kept)


def sets_modules(name, shapes) -> set[str]:
    from graftui.layout import split_fused

    return {m for m, idx in split_fused(name, shapes[name], torch.arange(4)).items()}


def test_a_fused_tensor_is_split_by_column_as_the_anatomy_splits_it():
    shapes = {QKV: (4, 12)}  # GPT-2 c_attn: q | k | v, four columns each
    region = {QKV: torch.tensor([0, 5, 9, 13])}  # columns 0, 5, 9, 1: query, key, value, query
    assert part_mask(region, shapes, module="key")[QKV].tolist() == [False, True, False, False]
    assert part_mask(region, shapes, module="query", layer="layer 0")[QKV].tolist() == [True, False, False, True]
    assert part_mask(region, shapes, module="query", layer="layer 1")[QKV].tolist() == [False] * 4
    assert drop_part(region, shapes, module="query")[0][QKV].tolist() == [5, 9]


# -- the tensors and neurons holding most of a region ------------------------------------------------------
def test_top_tensors_and_neurons_are_exact_on_a_hand_made_region():
    from graftui.flows.regionfiles import top_neurons, top_tensors

    shapes = {LIN: (4, 3), BIAS: (4,), CONV: (3, 4), EMB: (5, 3)}
    region = {LIN: torch.tensor([0, 1, 2, 4, 10]),  # rows 0, 0, 0, 1, 3 of a Linear weight (out × in)
              BIAS: torch.tensor([0, 1]),
              CONV: torch.tensor([1, 2, 5, 9]),  # columns 1, 2, 1, 1 of a Conv1D weight (in × out)
              EMB: torch.arange(6)}  # an embedding table: no neurons
    k = 17
    tensors = [(t["tensor"], t["layer"], t["module"], t["parameters"], t["share"], t["density"])
               for t in top_tensors(region, shapes)]
    assert tensors == [(EMB, "embeddings", "Other", 6, 6 / k, 6 / 15), (LIN, "layer 0", "FFN in", 5, 5 / k, 5 / 12),
                       (CONV, "layer 1", "FFN in", 4, 4 / k, 4 / 12), (BIAS, "layer 0", "FFN in", 2, 2 / k, 2 / 4)]
    assert [t["tensor"] for t in top_tensors(region, shapes, n=2)] == [EMB, LIN]
    neurons = [(u["tensor"], u["axis"], u["unit"], u["parameters"], u["fan_in"], u["density"], u["share"])
               for u in top_neurons(region, shapes, n=4)]
    assert neurons == [(LIN, "row", 0, 3, 3, 1.0, 3 / k), (CONV, "column", 1, 3, 3, 1.0, 3 / k),
                       (LIN, "row", 1, 1, 3, 1 / 3, 1 / k), (LIN, "row", 3, 1, 3, 1 / 3, 1 / k)]
    assert len(top_neurons(region, shapes)) == 5  # every unit the region reaches, fewer than ten


# -- stability per part across seeds -------------------------------------------------------------------------
def test_stability_per_module_and_layer_is_exact_on_hand_made_regions():
    q, ffn = "bert.encoder.layer.0.attention.self.query.weight", "bert.encoder.layer.1.intermediate.dense.weight"
    shapes = {q: (4, 4), ffn: (4, 4)}
    seeds = [{q: torch.tensor([0, 1, 2, 3]), ffn: torch.tensor([0, 1])},
             {q: torch.tensor([0, 1, 2, 5]), ffn: torch.tensor([0, 7])},
             {q: torch.tensor([0, 1, 3, 9]), ffn: torch.tensor([1, 7])}]
    st = sets.stability_by_part(seeds, shapes)
    # query: every seed holds 4 of 16, all three share {0, 1}; random regions share 16 · (4/16)³ = 0.25 on average
    assert st["by_module"]["query"] == {"label": "Query", "total": 16, "mean": 4.0, "core": 2, "core_share": 0.5,
                                        "chance_share": 0.0625, "over_chance": 8.0}
    assert st["by_module"]["ffn_in"] == {"label": "FFN in", "total": 16, "mean": 2.0, "core": 0, "core_share": 0.0,
                                         "chance_share": 0.015625, "over_chance": 0.0}
    assert st["by_layer"]["layer 0"] == {**st["by_module"]["query"], "label": "layer 0"}
    assert st["by_layer"]["layer 1"] == {**st["by_module"]["ffn_in"], "label": "layer 1"}
    assert st["grid"] == {"layers": ["layer 0", "layer 1"], "modules": ["query", "ffn_in"],
                          "module_labels": ["Query", "FFN in"], "core_share": [[0.5, None], [None, 0.0]]}


# -- the ablation and stability end to end, on a tiny saved pair -----------------------------------------------
@pytest.fixture(scope="module")
def seeds_run(tmp_path_factory):
    """A tiny BERT pair saved as checkpoints, and a replicate localization of it (random regions, seeds 0 and 1)."""
    import shutil

    from transformers import BertConfig, BertForSequenceClassification

    from conftest import MINILM_DIR, make_tiny_finetuned
    from graftui import flows

    root = tmp_path_factory.mktemp("anatomy")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=128, num_labels=2,
                        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    base = BertForSequenceClassification(config).eval()
    dirs = {}
    for name, model in (("base", base), ("ft", make_tiny_finetuned(base, scale=0.05))):
        model.save_pretrained(root / name, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            shutil.copy(MINILM_DIR / f, root / name / f)
        dirs[name] = str(root / name)
    result = flows.localize(LocalizeRequest.make(base=dirs["base"], finetuned=dirs["ft"], task="movies",
                                                       method="random", k=300, seeds=[0, 1],
                                                       out=str(root / "r.safetensors")))
    yield {"root": root, "stability": result.stability, **{f"seed{e['seed']}": e["path"] for e in result.seeds}}
    flows.clear_cache()


def test_ablation_end_to_end_on_a_tiny_pair(seeds_run):
    from graftui import flows, regions
    from graftui.config import BODY_LABEL
    from graftui.errors import Cancelled
    from graftui.flows import text

    record = regions.load(seeds_run["seed0"])
    layer0 = record.indices
    for row in {row_of(n, s) for n, s in record.shapes.items()} - {"layer 0"}:
        layer0, _ = drop_part(layer0, record.shapes, layer=row)
    only = regions.save(regions.derived_record(record.meta, layer0, record.shapes, {"method": "random, layer 0 only"}),
                        seeds_run["root"] / "layer0.safetensors")
    events = []
    doc = flows.anatomy(AnatomyRequest.make(region=str(only), ablate=True, n=48), progress=events.append).as_dict()
    ab, k = doc["ablation"], doc["k"]
    assert ab["n"] == 48 and ab["task"] == "movies" and k == sets.region_size(layer0) > 0
    layers = {r["part"]: r for r in ab["rows"] if r["by"] == "layer"}
    modules = [r for r in ab["rows"] if r["by"] == "module"]
    assert list(layers) == doc["layers"] and [r["part"] for r in modules] == doc["modules"]
    assert sum(r["parameters"] for r in layers.values()) == k == sum(r["parameters"] for r in modules)
    assert len(layers) >= 3
    for empty in set(layers) - {"layer 0"}:  # parts the region does not reach: the graft itself, no drop
        r = layers[empty]
        assert (r["parameters"], r["share"], r["drop"], r["ci"], r["distinguishable"]) == (0, 0.0, 0.0, [0.0, 0.0], False)
        assert r["accuracy"] == ab["accuracy"]
    assert layers["layer 0"]["parameters"] == k and layers["layer 0"]["share"] == 1.0
    # the same test sample evaluate scores: the whole graft is its graft, the graft without layer 0 its bare body
    ev = {r["model"]: r["accuracy"] for r in flows.evaluate(EvaluateRequest.make(regions=[str(only)], n=48,
                                                                                       ood=[])).rows}
    assert ab["accuracy"] == ev["layer0"] and layers["layer 0"]["accuracy"] == ev[BODY_LABEL]
    assert layers["layer 0"]["drop"] == pytest.approx(ev["layer0"] - ev[BODY_LABEL])
    stages = [e["stage"] for e in events if "stage" in e]
    assert "without layer 0" in stages and "without FFN in" in stages and stages[-1] == "done"
    out = text.anatomy(doc)
    assert "what each part of the region is worth" in out and "48 test examples of movies" in out
    assert "neurons holding most of the region" in out

    from dataclasses import replace

    from graftui.errors import ModelError

    gone = regions.save(regions.derived_record(replace(record.meta, finetuned=str(seeds_run["root"] / "gone")), layer0,
                                               record.shapes, {"method": "random"}), seeds_run["root"] / "gone.safetensors")
    with pytest.raises(ModelError, match="cannot be loaded here; use the region's skill patch"):
        flows.anatomy(AnatomyRequest.make(region=str(gone), ablate=True))

    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled, match="ablation cancelled"):
        flows.anatomy(AnatomyRequest.make(region=str(only), ablate=True, n=16), cancel=stop)


def test_stability_across_the_seeds_of_one_run(seeds_run):
    from graftui import flows, regions
    from graftui.errors import RequestError
    from graftui.flows import text

    doc = flows.anatomy(AnatomyRequest.make(region=seeds_run["seed0"], replicates=[seeds_run["seed1"]])).as_dict()
    st = doc["stability"]
    records = [regions.load(seeds_run[s]) for s in ("seed0", "seed1")]
    expected = sets.stability_by_part([r.indices for r in records], records[0].shapes)
    assert st["by_module"] == expected["by_module"] == seeds_run["stability"]["by_module"]
    assert st["by_layer"] == expected["by_layer"] and st["grid"] == expected["grid"]
    assert st["seeds"] == 2 and st["seed_numbers"] == [0, 1] and st["core"] == seeds_run["stability"]["core"]
    assert sum(v["core"] for v in st["by_layer"].values()) == st["core"]
    assert "stability across 2 seeds" in text.anatomy(doc)
    core = str(seeds_run["root"] / "r-core.safetensors")
    with pytest.raises(RequestError, match="not regions of one localize run differing only in their seed"):
        flows.anatomy(AnatomyRequest.make(region=seeds_run["seed0"], replicates=[core]))


def test_the_anatomy_tab_offers_the_seeds_of_the_run_and_shows_their_stability(seeds_run, tmp_path, monkeypatch):
    import shutil

    from graftui import regions
    from graftui.ui import forms, store
    from graftui.ui.tabs import anatomy

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRAFTUI_HOSTED", raising=False)
    monkeypatch.setattr(store, "_runner", None)
    folder = store.own_dir("regions")
    for name in ("seed0", "seed1"):
        shutil.copy(seeds_run[name], folder / f"r-{name}.safetensors")
    shutil.copy(seeds_run["root"] / "r-core.safetensors", folder / "r-core.safetensors")
    assert forms.seeds_of_run("r-seed0") == ["r-seed1"] and forms.seeds_of_run("r-core") == []
    fig, table, line = anatomy.stability_outputs("r-seed0", ["r-seed1"])
    st = seeds_run["stability"]
    assert [t.type for t in fig.data] == ["heatmap"]
    records = [store.region_path(i) for i in ("r-seed0", "r-seed1")]
    by_layer = sets.stability_by_part([regions.load(r).indices for r in records],
                                      regions.load(records[0]).shapes)["by_layer"]
    assert list(table["part"]) == [v["label"] for v in st["by_module"].values()] + list(by_layer)
    assert list(table["core (every seed)"]) == [f"{v['core']:,}" for v in [*st["by_module"].values(),
                                                                          *by_layer.values()]]
    assert f"**{st['core']:,}** parameters found by every seed" in line and "Seeds 0, 1" in line
    assert "No other seed" in anatomy.stability_outputs("r-core", [])[2]


def test_the_ablation_chart_draws_each_drop_with_its_interval():
    from graftui import figures

    rows = [{"by": "layer", "label": "layer 0", "parameters": 3, "share": 0.75, "accuracy": 0.4, "drop": 0.1,
             "ci": [0.02, 0.2], "distinguishable": True},
            {"by": "layer", "label": "pooler", "parameters": 0, "share": 0.0, "accuracy": 0.5, "drop": 0.0,
             "ci": [0.0, 0.0], "distinguishable": False},
            {"by": "module", "label": "Query", "parameters": 1, "share": 0.25, "accuracy": 0.55, "drop": -0.05,
             "ci": [-0.1, 0.05], "distinguishable": False}]
    fig = figures.ablation_bars({"n": 16, "task": "movies", "accuracy": 0.5, "rows": rows})
    layers, modules = fig.data
    assert list(layers.x) == ["layer 0", "pooler"] and list(modules.x) == ["Query"]
    assert list(layers.y) == pytest.approx([10.0, 0.0]) and list(modules.y) == pytest.approx([-5.0])
    assert list(layers.error_y.array) == pytest.approx([10.0, 0.0])  # up to the interval's top, in pts
    assert list(layers.error_y.arrayminus) == pytest.approx([8.0, 0.0])
    assert list(modules.error_y.array) == pytest.approx([10.0]) and list(modules.error_y.arrayminus) == pytest.approx([5.0])
    assert list(layers.marker.color) == [figures.PALETTE[1], "#bbbbbb"]  # red only where the interval excludes 0
    assert "16 examples of movies" in fig.layout.title.text
    assert not figures.ablation_bars(None).data
