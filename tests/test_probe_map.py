"""predict --by cell, the probe as a picture: each (layer, module type) part of a region grafted alone onto θ_pre
and knocked out alone from θ_ft, as the change in the probability of the fine-tuned model's answer; exact on a tiny
config-built pair, in the JSON, the text and a two-heatmap figure, and bounded on a hosted server."""

from __future__ import annotations

import json

import pytest
import torch

from graftui import regions
from graftui.config import FT_LABEL

from test_regions import _tiny_pair_folders

TEXTS = ["a good thing", "a bad thing", "nothing at all"]


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A tiny pair, a region over most of what moved (so parts matter), and its probe map on three sentences."""
    from graftui import flows
    from graftui.localizers import Budget, run_method
    from graftui.requests import PredictRequest

    tmp_path = tmp_path_factory.mktemp("map")
    folders = _tiny_pair_folders(tmp_path)
    task = tmp_path / "task.csv"
    task.write_text("text,label\n" + "".join(f"a {('good', 'bad')[i % 2]} thing {i},{1 - i % 2}\n" for i in range(80)))
    pair = flows.load_pair(folders["base"], folders["ft"])
    made = run_method(pair, Budget(k=4000), "top-movement")[0]
    record = regions.make_record(pair, made, {"method": "top-movement", "task": str(task)})
    path = str(regions.save(record, tmp_path / "r.safetensors"))
    result = flows.predict(PredictRequest.make(regions=[path], texts=TEXTS, by="cell"))
    yield {"pair": pair, "record": record, "path": path, "result": result, "tmp": tmp_path}
    flows.clear_cache()


def _probs(pair, context) -> torch.Tensor:
    from graftui import metrics
    from graftui.tasks.classification.data import Split, batches

    with context:
        return metrics.predict_proba(pair.model, batches(pair.tokenizer, Split(tuple(TEXTS), (0,) * len(TEXTS)), 16,
                                                         128))[0]


def test_each_cell_is_its_part_grafted_alone_and_knocked_out_alone_computed_by_hand(probed):
    """graft_p: p(FT's class) under θ_pre + γ_P⊙δ; knockout_p: under θ_ft − γ_P⊙δ; the Δs against the bare body and
    FT; a flip exactly where the part changes the argmax of its baseline (the pre-trained model's for a graft, FT's for
    a knockout); the cells partition γ, each named and counted."""
    import contextlib

    from graftui.experiments import only_part
    from graftui.layout import MODULE_LABELS, anatomy

    pair, record, result = probed["pair"], probed["record"], probed["result"]
    ft = _probs(pair, pair.finetuned())
    pre = _probs(pair, contextlib.nullcontext())
    answer = ft.argmax(1)
    names = result.label_names
    assert [a["answer"] for a in result.answers] == [names[int(i)] for i in answer]
    for a in result.answers:
        assert a["ft_p"] == pytest.approx(float(ft[a["text"], answer[a["text"]]]), abs=1e-6)
        assert a["pre_p"] == pytest.approx(float(pre[a["text"], answer[a["text"]]]), abs=1e-6)
        assert a["pre_answer"] == names[int(pre[a["text"]].argmax())]
    anat = anatomy(record.indices, record.shapes)
    cells = [(r, m) for i, r in enumerate(anat.layers) for j, m in enumerate(anat.modules) if anat.counts[i][j]]
    assert len(cells) >= 4
    assert [(p["layer"], p["module"]) for p in result.parts if p["text"] == 0] == cells
    assert sum(p["k"] for p in result.parts if p["text"] == 0) == record.size
    flips = 0
    for layer, module in cells:
        inside, _ = only_part(record.indices, record.shapes, layer=layer, module=module)
        graft = _probs(pair, pair.grafted(inside))
        knock = _probs(pair, pair.knocked_out(inside))
        for i in range(len(TEXTS)):
            p = next(p for p in result.parts if (p["layer"], p["module"], p["text"]) == (layer, module, i))
            assert p["part"] == f"{layer} · {MODULE_LABELS[module]}"
            assert p["k"] == sum(v.numel() for v in inside.values())
            assert p["graft_p"] == pytest.approx(float(graft[i, answer[i]]), abs=1e-6)
            assert p["knockout_p"] == pytest.approx(float(knock[i, answer[i]]), abs=1e-6)
            assert p["graft_delta"] == pytest.approx(float(graft[i, answer[i]] - pre[i, answer[i]]), abs=1e-6)
            assert p["knockout_delta"] == pytest.approx(float(knock[i, answer[i]] - ft[i, answer[i]]), abs=1e-6)
            assert p["graft_flips"] is bool(graft[i].argmax() != pre[i].argmax())  # the answer the graft changes
            assert p["knockout_flips"] is bool(knock[i].argmax() != answer[i])
            assert p["graft_answer"] == names[int(graft[i].argmax())]
            flips += p["graft_flips"] + p["knockout_flips"]
    assert flips, "the tiny region's parts should move some answer"
    assert all(torch.equal(pair.param(n).data, pair.pre[n]) for n in pair.graftable)  # the pair rests as the body


def test_the_map_keeps_the_probe_table_to_its_models_and_goes_into_json_and_text(probed):
    """The parts are a map, not columns: predict's rows stay the body, FT and the graft; the JSON has the parts and
    the answers; the text has one table per sentence with × where the answer flips."""
    from graftui.config import BODY_LABEL
    from graftui.flows import text

    result = probed["result"]
    assert list(dict.fromkeys(r["model"] for r in result.rows)) == [BODY_LABEL, FT_LABEL, "r"]
    doc = json.loads(json.dumps(result.as_dict()))
    assert {"layer", "module", "part", "k", "graft_p", "graft_delta", "knockout_p", "knockout_delta", "graft_flips",
            "knockout_flips", "text"} <= set(doc["parts"][0])
    assert len(doc["parts"]) == len(TEXTS) * len({p["part"] for p in doc["parts"]})
    out = text.predict(doc)
    assert out.count("Probe map, text ") == len(TEXTS)
    first = doc["parts"][0]
    assert first["part"] in out and "Δ vs FT" in out
    assert ("×" in out) == any(p["graft_flips"] or p["knockout_flips"] for p in doc["parts"])


def test_the_figure_is_two_layer_by_module_heatmaps_of_the_first_sentence(probed):
    from graftui import figures
    from graftui.layout import MODULE_LABELS

    doc = probed["result"].as_dict()
    fig = figures.probe_map(doc)
    maps = [t for t in fig.data if t.type == "heatmap"]
    assert len(maps) == 2
    first = [p for p in doc["parts"] if p["text"] == 0]
    layers = list(dict.fromkeys(p["layer"] for p in first))
    for trace, which in zip(maps, ("graft", "knockout")):
        assert list(trace.y) == layers
        assert set(trace.x) == {MODULE_LABELS[p["module"]] for p in first}
        cols = list(trace.x)
        for p in first:
            i, j = layers.index(p["layer"]), cols.index(MODULE_LABELS[p["module"]])
            assert trace.z[i][j] == pytest.approx(p[f"{which}_delta"])
            assert trace.text[i][j] == ("×" if p[f"{which}_flips"] else "")
            assert trace.customdata[i][j][2] == p["k"]
    assert "sentence 1 of 3" in fig.layout.title.text
    assert [a.text for a in fig.layout.annotations][:2] == ["graft one part onto θ_pre: Δp vs pre-trained",
                                                           "knock one part out of θ_ft: Δp vs fine-tuned"]
    from graftui import bundle
    assert "probe_map" in bundle.VERB_FIGURES["predict"](doc)


def test_a_map_over_a_hosted_server_s_bounds_is_refused_in_one_line(probed, monkeypatch):
    from graftui import flows, settings
    from graftui.errors import RequestError
    from graftui.hosted import HostedGuard, check_request
    from graftui.requests import PredictRequest

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    assert settings.hosted()
    many = PredictRequest.make(regions=[probed["path"]], texts=["x"] * (settings.MAX_MAP_TEXTS + 1), by="cell")
    with pytest.raises(RequestError) as told:
        check_request(many, HostedGuard())
    assert str(told.value) == (f"{settings.MAX_MAP_TEXTS + 1} texts are over this server's limit of "
                               f"{settings.MAX_MAP_TEXTS} for one probe map (--by cell: each layer × module part "
                               "grafted and knocked out, per text); give fewer")
    check_request(many.replace(by="layer"), HostedGuard())  # the bound is the map's
    monkeypatch.setattr(settings, "MAX_MAP_CELLS", 2)
    with pytest.raises(RequestError, match=r"^the region spans \d+ layer × module parts, over this server's limit of 2 "
                                           r"for one probe map \(--by cell\)") as told:
        flows.predict(PredictRequest.make(regions=[probed["path"]], texts=["x"], by="cell"))
    assert "\n" not in str(told.value)


@pytest.mark.e2e
def test_the_default_pair_s_map_runs_in_seconds_from_the_cli(tmp_path):
    """The offline default (minilm fine-tuned on movies) and a region of it: `predict --by cell` maps every part in
    seconds, its JSON has the parts and its text one map per sentence."""
    from cli_util import run_cli

    from graftui import flows, regions

    region = tmp_path / "r.safetensors"
    code, _, err = run_cli("localize", "--method", "top-movement", "--check-n", "0", "--out", region)
    assert code == 0, err
    code, out, err = run_cli("predict", "--region", region, "--text", "a dull, lifeless film", "--by", "cell", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["parts"] and doc["answers"][0]["answer"] in doc["label_names"]
    assert sum(p["k"] for p in doc["parts"]) == regions.load(region).size  # every part of the region, once
    assert doc["seconds"] < 60, doc["seconds"]  # about 2 s on two busy CPU cores
    said = flows.VERBS["predict"].text(doc)  # what the command prints without --json
    assert said.count("Probe map, text ") == 1 and "pooler · Other" in said


def test_a_kind_without_an_answer_probability_refuses_the_map_in_one_line():
    from graftui.errors import RequestError
    from graftui.tasks.base import TaskKind

    class Other(TaskKind):
        name = "other"

    with pytest.raises(RequestError) as told:
        Other().answer_probs(None, None, None, [], FT_LABEL, [])
    assert str(told.value) == ("--by cell maps the probability of the fine-tuned model's answer, which a task of "
                               "kind 'other' does not give here; use --by layer or --by module")
