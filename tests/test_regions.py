"""Region files and skill patches: round trips, bit-exact rebuilds, hostile files refused."""

from __future__ import annotations

import contextlib
import shutil
import json

import pytest
import torch
from safetensors.torch import save_file

from graftui import method, regions
from graftui.regions import RegionError

from conftest import MINILM_DIR, make_tiny_pair


def _record(pair, k=120, seed=0):
    gen = torch.Generator().manual_seed(seed)
    idx = method.top_k({n: torch.rand(pair.pre[n].shape, generator=gen) for n in pair.graftable}, k)
    return regions.make_record(pair, idx, {"method": "random", "task": "toy"})


def test_region_file_round_trip(tmp_path, tiny_pair):
    pair, _, _ = tiny_pair
    record = _record(pair)
    path = regions.save(record, tmp_path / "r.safetensors")
    back = regions.load(path)
    assert not back.is_patch and back.size == 120 == record.size
    assert back.shapes == record.shapes
    assert set(back.indices) == set(record.indices)
    assert all(torch.equal(back.indices[n], record.indices[n]) for n in record.indices)
    assert back.meta["method"] == "random" and back.meta["k"] == 120 and back.meta["format"] == "1"
    assert back.meta["fraction_of_graftable"] == pytest.approx(120 / pair.counts()["graftable"])
    regions.check_fits(back, pair)


def test_empty_region_round_trip(tmp_path, tiny_pair):
    pair, _, _ = tiny_pair
    back = regions.load(regions.save(regions.make_record(pair, {}, {}), tmp_path / "e.safetensors"))
    assert back.size == 0 and back.indices == {}


def _save_tiny(tmp_path, model, name):
    from transformers import AutoTokenizer

    folder = tmp_path / name
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(MINILM_DIR).save_pretrained(folder)
    return folder


def test_skill_patch_rebuilds_the_graft_from_the_base_alone(tmp_path, tiny_pair):
    pair, base, ft = tiny_pair
    record = regions.with_patch(pair, _record(pair, k=300))
    path = regions.save(record, tmp_path / "p.safetensors")
    patch = regions.load(path)
    assert patch.is_patch and set(patch.head) == set(pair.head)

    base_dir = _save_tiny(tmp_path, base, "base")
    rebuilt = regions.pair_from_patch(str(base_dir), patch)
    ids = torch.randint(1, 60, (3, 9))
    with torch.no_grad(), pair.grafted(record.indices) as model:
        expected = {n: p.detach().clone() for n, p in model.named_parameters()}
        expected_logits = model(input_ids=ids).logits
    with torch.no_grad(), rebuilt.grafted(patch.indices) as model:
        for n, p in model.named_parameters():
            assert torch.equal(p.detach(), expected[n]), n
        assert torch.equal(model(input_ids=ids).logits, expected_logits)


def test_export_writes_a_loadable_checkpoint_of_the_graft(tmp_path, tiny_pair):
    from transformers import AutoModelForSequenceClassification

    pair, _, _ = tiny_pair
    from transformers import AutoTokenizer

    pair.tokenizer = AutoTokenizer.from_pretrained(MINILM_DIR)
    record = _record(pair)
    out = regions.export_graft(pair, record, tmp_path / "graft")
    assert (out / "model.safetensors").exists() and (out / "graftui_region.json").exists()
    loaded = AutoModelForSequenceClassification.from_pretrained(out)
    with pair.grafted(record.indices) as model:
        for (n, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters()):
            assert torch.equal(p.detach(), q.detach()), n
    with pytest.raises(RegionError, match="not empty"):
        regions.export_graft(pair, record, out)


def test_writes_are_atomic(tmp_path, tiny_pair):
    pair, _, _ = tiny_pair
    target = tmp_path / "keep.safetensors"
    regions.save(_record(pair), target)
    before = target.read_bytes()

    def broken(tmp):
        open(tmp, "wb").write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        regions.atomic_write(target, broken)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.safetensors"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("garbage", "not a readable safetensors"),
        ("no_tag", "not a graftui region"),
        ("version", "format 99"),
        ("bounds", "outside its"),
        ("unsorted", "not sorted"),
        ("dtype", "1-D int64"),
        ("unknown_tensor", "not among its graftable"),
        ("bad_meta", "unreadable metadata"),
        ("patch_missing_values", "without matching values"),
    ],
)
def test_corrupt_files_are_refused_with_a_clear_message(tmp_path, case, message):
    path = tmp_path / "bad.safetensors"
    shapes = json.dumps({"w": [2, 3]})
    meta = {"graftui_format": "1", "kind": "region", "shapes": shapes, "meta": "{}"}
    tensors = {"idx/w": torch.tensor([0, 4])}
    if case == "garbage":
        path.write_bytes(b"\x00\x01not safetensors at all" * 10)
    else:
        if case == "no_tag":
            meta.pop("graftui_format")
        elif case == "version":
            meta["graftui_format"] = "99"
        elif case == "bounds":
            tensors = {"idx/w": torch.tensor([0, 6])}
        elif case == "unsorted":
            tensors = {"idx/w": torch.tensor([4, 0])}
        elif case == "dtype":
            tensors = {"idx/w": torch.tensor([0.0, 4.0])}
        elif case == "unknown_tensor":
            tensors = {"idx/v": torch.tensor([0])}
        elif case == "bad_meta":
            meta["shapes"] = "{not json"
        elif case == "patch_missing_values":
            meta["kind"] = "patch"
        save_file(tensors, str(path), metadata=meta)
    with pytest.raises(RegionError, match=message):
        regions.load(path)


def test_a_region_for_another_model_does_not_fit(tmp_path):
    pair, _, _ = make_tiny_pair()
    record = _record(pair)
    record.shapes = {**record.shapes}
    name = next(iter(record.indices))
    record.shapes[name] = (999,)
    with pytest.raises(RegionError, match=f"made for {name}"):
        regions.check_fits(record, pair)
    record.indices["bert.nonexistent.weight"] = torch.tensor([0])
    record.shapes["bert.nonexistent.weight"] = (1,)
    with pytest.raises(RegionError, match="no graftable tensor named|made for"):
        regions.check_fits(record, pair)


def test_a_patch_with_non_finite_values_is_refused_on_load(tmp_path, tiny_pair):
    pair, _, _ = tiny_pair
    from graftui import method

    region = method.base_region(pair.pre, pair.ft, pair.graftable, 20)
    record = regions.with_patch(pair, regions.make_record(pair, region, {}))
    name = next(iter(record.values))
    for bad in (float("nan"), float("inf")):
        record.values[name][0] = bad
        regions.save(record, tmp_path / "bad.safetensors")
        with pytest.raises(RegionError, match="NaN or infinite values"):
            regions.load(tmp_path / "bad.safetensors")


def test_out_files_are_never_replaced_unless_asked(tmp_path):
    from graftui.errors import RequestError
    from graftui.requests import ComposeRequest, LocalizeRequest

    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    with pytest.raises(RequestError, match="exists; choose a new name, or add --overwrite"):
        LocalizeRequest(out=str(precious)).validate()
    LocalizeRequest(out=str(precious), overwrite=True).validate()
    (tmp_path / "a.safetensors").write_bytes(b"x")
    (tmp_path / "b.safetensors").write_bytes(b"x")
    with pytest.raises(RequestError, match="exists"):
        ComposeRequest(regions=[str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")],
                       out=str(precious)).validate()
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        import os

        if not os.access(locked, os.W_OK):  # root can write anywhere: nothing to refuse then
            with pytest.raises(RequestError, match="no permission"):
                LocalizeRequest(out=str(locked / "r.safetensors")).validate()
    finally:
        locked.chmod(0o700)
    assert precious.read_text() == "keep me"


def _tiny_pair_folders(tmp_path) -> dict[str, str]:
    """A tiny base and its fine-tuned model saved as checkpoint folders, with a real tokenizer: {"base", "ft"}."""
    from conftest import make_tiny_bert, make_tiny_finetuned
    from lm_util import make_tokenizer

    tokenizer = make_tokenizer(tmp_path / "base")
    base = make_tiny_bert(vocab_size=len(tokenizer))
    folders = {}
    for name, model in (("base", base), ("ft", make_tiny_finetuned(base))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        folders[name] = str(tmp_path / name)
    return folders


def test_regions_of_different_tasks_are_each_scored_on_their_own_task(tmp_path):
    """Compare two regions learned on two tasks: each graft's rows name its own task, beside that task's FT."""
    from graftui import flows
    from graftui.localizers import Budget, run_method
    from graftui.requests import EvaluateRequest

    folders = _tiny_pair_folders(tmp_path)
    tasks = {}
    for name, words in (("first", ("good", "bad")), ("second", ("great", "awful"))):
        tasks[name] = tmp_path / f"{name}.csv"
        tasks[name].write_text("text,label\n" + "".join(f"a {words[i % 2]} thing {i},{1 - i % 2}\n" for i in range(80)))
    pair = flows.load_pair(folders["base"], folders["ft"])
    files = []
    for k, name in ((20, "first"), (30, "second")):
        record = regions.make_record(pair, run_method(pair, Budget(k=k), "random")[0],
                                     {"method": "random", "task": str(tasks[name])})
        files.append(str(regions.save(regions.with_patch(pair, record), tmp_path / f"{name}.safetensors")))
    result = flows.evaluate(EvaluateRequest.make(regions=files, n=16))
    by_region = {}
    for row in result.rows:
        by_region.setdefault(row["model"], set()).add(row["task"])
    assert by_region["first"] == {"first.csv"} and by_region["second"] == {"second.csv"}
    assert by_region["fine-tuned"] == {"first.csv", "second.csv"}  # each task has its own references
    assert any("scored on its own" in note for note in result.notes)
    flows.clear_cache()


def test_predict_shows_each_model_on_the_sentences_given_as_scoring_would(tmp_path):
    """Each row of predict is the model's own softmax on that sentence: the bare body, FT and the patch's graft
    (with the patch's values), as the scoring code computes them directly; refusals are one line each."""
    from graftui import flows, metrics
    from graftui.config import BODY_LABEL, FT_LABEL
    from graftui.tasks.classification.data import Split, batches
    from graftui.errors import RequestError
    from graftui.localizers import Budget, run_method
    from graftui.requests import MAX_PREDICT_TEXTS, PredictRequest

    folders = _tiny_pair_folders(tmp_path)
    task = tmp_path / "task.csv"
    task.write_text("text,label\n" + "".join(f"a {('good', 'bad')[i % 2]} thing {i},{1 - i % 2}\n" for i in range(80)))
    pair = flows.load_pair(folders["base"], folders["ft"])
    record = regions.make_record(pair, run_method(pair, Budget(k=200), "random")[0], {"method": "random", "task": str(task)})
    patch = regions.with_patch(pair, record)
    patch.values = {n: v * 3 for n, v in patch.values.items()}  # the patch's own values, not θ_ft's
    path = str(regions.save(patch, tmp_path / "patch.safetensors"))
    texts = ["a good thing", "a bad thing", "nothing at all"]
    result = flows.predict(PredictRequest.make(regions=[path], texts=texts))
    assert len(result.label_names) == 2
    assert [(r["text"], r["model"]) for r in result.rows] == [(i, m) for m in (BODY_LABEL, FT_LABEL, "patch")
                                                               for i in range(3)]
    sentences = Split(tuple(texts), (0, 0, 0))

    def direct(context):
        with context:
            return metrics.predict_proba(pair.model, batches(pair.tokenizer, sentences, 16, 128))[0]

    loaded = regions.load(path)
    expected = {BODY_LABEL: direct(contextlib.nullcontext()), FT_LABEL: direct(pair.finetuned()),
                "patch": direct(pair.grafted(loaded.indices, loaded.values))}
    assert not torch.allclose(expected["patch"], direct(pair.grafted(loaded.indices)))  # the values matter
    for r in result.rows:
        got = torch.tensor([r["probs"][n] for n in result.label_names])
        assert torch.allclose(got, expected[r["model"]][r["text"]], atol=1e-6), r
        assert r["predicted"] == result.label_names[int(got.argmax())] and r["confidence"] == pytest.approx(float(got.max()))
    ft = {r["text"]: r["predicted"] for r in result.rows if r["model"] == FT_LABEL}
    for r in result.rows:
        assert r["agrees_with_ft"] is (None if r["model"] == FT_LABEL else r["predicted"] == ft[r["text"]])
    assert result.card[0].startswith("On 3 sentence(s), the bare body decides as the fine-tuned model on")
    for texts_, pairs, needle in ((["ok", " "], [], "none of them empty"), ([], [], "give one or more sentences"),
                                  (["x"] * (MAX_PREDICT_TEXTS + 1), [], f"more than {MAX_PREDICT_TEXTS}"),
                                  (["x" * 6000], [], "longer than 5,000 characters"),
                                  (["a", "b"], ["c"], "one second text per --text")):
        with pytest.raises(RequestError, match=needle):
            flows.predict(PredictRequest.make(regions=[path], texts=texts_, pairs=pairs))
    with pytest.raises(RequestError, match="reads one text; drop --pair"):
        flows.predict(PredictRequest.make(regions=[path], texts=["a"], pairs=["b"]))
    flows.clear_cache()


def test_a_probe_knocks_the_region_out_and_grafts_it_one_part_at_a_time(tmp_path):
    """predict --knockout: FT with the region's parameters back at θ_pre (θ_ft − γ⊙δ, exactly); --by layer|module: the
    graft of each part of the region that holds any of it, the parts a partition of γ; each row the model's own
    softmax; the card says where FT changes its mind without the region; a probe by part takes one region."""
    from graftui import flows, metrics
    from graftui.config import BODY_LABEL, FT_LABEL
    from graftui.errors import RequestError
    from graftui.experiments import drop_part, only_part
    from graftui.layout import MODULE_LABELS, anatomy
    from graftui.localizers import Budget, run_method
    from graftui.requests import PredictRequest
    from graftui.tasks.classification.data import Split, batches

    folders = _tiny_pair_folders(tmp_path)
    task = tmp_path / "task.csv"
    task.write_text("text,label\n" + "".join(f"a {('good', 'bad')[i % 2]} thing {i},{1 - i % 2}\n" for i in range(80)))
    pair = flows.load_pair(folders["base"], folders["ft"])
    record = regions.make_record(pair, run_method(pair, Budget(k=300), "random")[0], {"method": "random", "task": str(task)})
    path = str(regions.save(record, tmp_path / "r.safetensors"))
    other = regions.make_record(pair, run_method(pair, Budget(k=50), "random")[0], {"method": "random", "task": str(task)})
    every = str(regions.save(other, tmp_path / "other.safetensors"))

    with pair.knocked_out(record.indices):  # θ_ft − γ⊙δ, parameter by parameter
        for name in pair.graftable:
            want = pair.ft[name].clone().view(-1)
            idx = record.indices.get(name)
            if idx is not None:
                want[idx] = pair.pre[name].view(-1)[idx]
            assert torch.equal(pair.param(name).data.view(-1), want), name
        for name in set(pair.ft) - set(pair.graftable):  # what no region holds stays fine-tuned
            assert torch.equal(pair.param(name).data, pair.ft[name]), name
    assert all(torch.equal(pair.param(n).data, pair.pre[n]) for n in pair.graftable)  # the pair rests as the body

    texts = ["a good thing", "a bad thing", "nothing at all"]
    result = flows.predict(PredictRequest.make(regions=[path], texts=texts, knockout=True, by="layer"))
    anat = anatomy(record.indices, record.shapes)
    layers = [row for row, n in zip(anat.layers, anat.by_layer) if n]
    assert len(layers) >= 2
    models = list(dict.fromkeys(r["model"] for r in result.rows))
    assert models == [BODY_LABEL, FT_LABEL, "r", f"{FT_LABEL} − r", *(f"r · {row} only" for row in layers)]
    assert {r["model"]: r["probe"] for r in result.rows}[f"{FT_LABEL} − r"] == "knockout"
    sentences = Split(tuple(texts), (0, 0, 0))

    def direct(context):
        with context:
            return metrics.predict_proba(pair.model, batches(pair.tokenizer, sentences, 16, 128))[0]

    expected = {f"{FT_LABEL} − r": direct(pair.knocked_out(record.indices))}
    sizes = 0
    for row in layers:
        inside, _ = only_part(record.indices, record.shapes, layer=row)
        outside, _ = drop_part(record.indices, record.shapes, layer=row)
        for name in record.indices:  # a part and the rest split γ
            got = torch.cat([inside.get(name, torch.tensor([], dtype=torch.long)),
                             outside.get(name, torch.tensor([], dtype=torch.long))])
            assert torch.equal(got.sort().values, record.indices[name].sort().values), (row, name)
        sizes += sum(v.numel() for v in inside.values())
        expected[f"r · {row} only"] = direct(pair.grafted(inside))
    assert sizes == record.size
    for r in result.rows:
        if r["model"] in expected:
            got = torch.tensor([r["probs"][n] for n in result.label_names])
            assert torch.allclose(got, expected[r["model"]][r["text"]], atol=1e-6), r
    assert any(line.startswith("Knocked out ('fine-tuned − r'") for line in result.card), result.card

    import graftui  # the API takes the same fields

    by_module = graftui.predict(regions=[path], texts=texts[:1], by="module", knockout=True)
    assert [r["model"] for r in by_module.rows if r["probe"] == "knockout"] == [f"{FT_LABEL} − r"]
    parts = [r["part"] for r in by_module.rows if r["probe"] == "module"]
    assert parts == [MODULE_LABELS.get(m, m) for m, n in anat.by_module.items() if n]

    with pytest.raises(RequestError, match="looks into one region"):
        flows.predict(PredictRequest.make(regions=[path, every], texts=["a"], by="layer"))
    patch = str(regions.save(regions.with_patch(pair, record), tmp_path / "p.safetensors"))
    flows.clear_cache()
    shutil.rmtree(folders["ft"])  # FT is rebuilt from the patch: without its region it would be the bare body
    with pytest.raises(RequestError, match="--knockout takes a region out of the fine-tuned model, which cannot be"):
        flows.predict(PredictRequest.make(regions=[patch], texts=["a"], knockout=True))
    with pytest.raises(RequestError, match="unknown by 'neuron'; choose from layer, module"):
        flows.predict(PredictRequest.make(regions=[path], texts=["a"], by="neuron"))
    flows.clear_cache()


def test_a_new_regions_name_tells_the_fine_tune_it_came_from_apart():
    """A LoRA adapter's region and a whole fine-tune's region of one task are named apart; a task the model's name
    already says is not said twice; an uploaded file is named by its file name, not its folder."""
    from graftui.flows.common import region_stem

    assert region_stem("smollm2-dates", "dates", "learned", 9) == "smollm2-dates-learned-k9"
    assert region_stem("smollm2-dates-lora", "dates", "learned", 9) == "smollm2-dates-lora-learned-k9"
    assert region_stem("/ckpt/gpt2-sst2", "movies", "top-movement", 5) == "gpt2-sst2-movies-top-movement-k5"
    assert region_stem("minilm-agnews", "news", "random", 3) == "minilm-agnews-news-random-k3"  # whole parts only
    assert region_stem("smollm2-dates", "/srv/uploads/3f2a/opposites.csv", "learned", 7) == \
        "smollm2-dates-opposites-learned-k7"


def test_a_region_is_described_by_its_task_files_name_never_its_folders():
    """A picker's label names an uploaded task by its file, and a union by each of its tasks, without the server's
    folders (a hosted workspace's path is no one's business, and it pushes the rest of the label out of sight)."""
    from graftui.regions import describe

    upload = "/srv/sessions/abc/uploads/3af35dc8b7da/mydata.csv"
    assert describe({"task": upload, "method": "learned", "k": 10}).startswith("mydata.csv · learned · k=10")
    assert describe({"task": f"movies+{upload}", "method": "union", "k": 12}).startswith("movies+mydata.csv · union")
    assert describe({"task": "movies", "method": "learned", "k": 3}).startswith("movies · learned · k=3")
