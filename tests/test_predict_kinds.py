"""predict on every kind of region: a completion region shows each model's greedy generation for each prompt (the
bare pre-trained model, FT, each graft), judged by the region's own answer rule and generation length; a
classification region still shows class probabilities. In the CLI and the API, on tiny config-built models."""

from __future__ import annotations

import json

import pytest

import graftui
from graftui.tasks.completion import generation
from graftui.tasks.completion.data import Completions
from graftui.models import load_lm, load_tokenizer

from cli_util import run_cli
from lm_util import write_base, write_completion_task, write_lm_pair, write_task

PROMPTS = ["movie bad loved is not", "fine good\ngreat is not"]  # the second: one prompt of two lines


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny Llama fine-tuned on a completion task, and a region of it made with --max-new-tokens 3."""
    root = tmp_path_factory.mktemp("predict")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(root / "home"))
        base = write_base(root / "base", "llama")
        task = write_completion_task(root / "opposites.csv")
        ft = graftui.finetune(base=str(base), task=str(task), optimizer="adamw", lr=0.02, epochs=15, train_examples=0,
                              out=str(root / "ft"), max_new_tokens=3)
        region = root / "r.safetensors"
        graftui.localize(base=str(base), finetuned=ft.out, task=str(task), method="top-movement", sparsity=0.5,
                         check_n=0, max_new_tokens=3, out=str(region))
        yield {"root": root, "base": str(base), "ft": ft.out, "task": task, "region": region}


def _generate(ref: str, new: int) -> list[str]:
    data = Completions(tuple((("user", p), ("assistant", "")) for p in PROMPTS))
    return generation.generate(load_lm(ref, "causal-lm"), load_tokenizer(ref), data, False, max_new_tokens=new)


def _answer(text: str) -> str:  # the default rule on one-line references: the first line, spaces collapsed
    return " ".join(text.strip().split("\n", 1)[0].split())


def test_the_api_shows_each_model_s_generation_judged_as_the_region_is(made, tmp_path):
    doc = graftui.predict(regions=[str(made["region"])], texts=PROMPTS).as_dict()
    assert doc["kind"] == "completion" and doc["label_names"] == [] and doc["texts"] == PROMPTS
    body, ft = "pre-trained, same prompt", "fine-tuned"
    assert [(r["text"], r["model"]) for r in doc["rows"]] == [(i, m) for i in range(2) for m in (body, ft, "r")]
    assert all(set(r) == {"text", "model", "generation", "agrees_with_ft", "probe", "part"} for r in doc["rows"])
    said = {(r["text"], r["model"]): r["generation"] for r in doc["rows"]}
    # greedy, with the region's own 3 new tokens (its request's), each model exactly as loaded on its own
    exported = graftui.export(region=str(made["region"]), finetuned=made["ft"], out=str(tmp_path / "graft")).out
    for name, ref in ((body, made["base"]), (ft, made["ft"]), ("r", exported)):
        assert [said[(i, name)] for i in range(2)] == _generate(ref, 3), name
    assert _generate(made["base"], 3) != _generate(made["base"], 12)  # so the length was the region's, not the default
    for r in doc["rows"]:
        want = None if r["model"] == ft else _answer(r["generation"]) == _answer(said[(r["text"], ft)])
        assert r["agrees_with_ft"] == want
    assert doc["card"][0].startswith("On 2 prompt(s), the pre-trained model answers as the fine-tuned model on ")
    assert any("greedy, at most 3 new tokens" in line for line in doc["card"])
    longer = graftui.predict(regions=[str(made["region"])], texts=PROMPTS[:1], max_new_tokens=12).as_dict()
    assert [r["generation"] for r in longer["rows"]][0] == _generate(made["base"], 12)[0]  # the request may ask more


def test_the_cli_prints_each_generation_and_refuses_a_second_text(made):
    code, out, err = run_cli("predict", "--region", made["region"], "--text", PROMPTS[0], "--text", PROMPTS[1])
    assert code == 0, err
    assert "1. movie bad loved is not" in out and "2. fine good⏎great is not" in out
    for block, (bare, ft) in zip(out.split("\n\n")[:2], zip(*[_generate(made[k], 3) for k in ("base", "ft")])):
        assert f"fine-tuned                {ft!r}" in block  # each model's own row, under its prompt
        assert f"pre-trained, same prompt  {bare!r}" in block
    code, out, err = run_cli("predict", "--region", made["region"], "--text", PROMPTS[0], "--json")
    assert code == 0 and json.loads(out)["kind"] == "completion"
    code, out, err = run_cli("predict", "--region", made["region"], "--text", PROMPTS[0], "--pair", "x")
    assert (code, out) == (2, "") and err.strip().splitlines() == [
        "graftui: error: --pair: 'opposites.csv' is a completion task, and each --text is one whole prompt; drop "
        "--pair (a prompt of several lines is one --text)"]


def test_a_classification_region_still_predicts_class_probabilities(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    base, ft = write_lm_pair(tmp_path, "gpt2")
    task = write_task(tmp_path / "words.csv")
    region = tmp_path / "c.safetensors"
    graftui.localize(base=str(base), finetuned=str(ft), task=str(task), method="top-movement", sparsity=0.05,
                     check_n=0, label_words="negative= bad,positive= good", out=str(region))
    doc = graftui.predict(regions=[str(region)], texts=["the movie was good"]).as_dict()
    assert doc["kind"] == "classification" and doc["label_names"] == ["negative", "positive"]
    assert all(set(r) == {"text", "model", "probs", "predicted", "confidence", "agrees_with_ft", "probe", "part"} for r in doc["rows"])
    assert all(sum(r["probs"].values()) == pytest.approx(1.0) for r in doc["rows"])


def test_an_empty_region_is_probed_with_a_note_that_it_changes_nothing(made, tmp_path):
    """k = 0: its graft is the pre-trained model and FT without it is FT. The probe still shows the bare body beside
    FT (worth seeing), so it runs, and its notes say so in one line."""
    from dataclasses import replace

    from graftui import regions

    record = regions.load(made["region"])
    empty = regions.RegionRecord({}, record.shapes, replace(record.meta, k=0))
    path = regions.save(empty, tmp_path / "empty.safetensors")
    doc = graftui.predict(regions=[str(path)], texts=PROMPTS[:1], knockout=True).as_dict()
    said = [n for n in doc["notes"] if "is empty" in n]
    assert said == ["region 'empty' is empty (k = 0): its graft is the pre-trained model and knocking it out leaves "
                    "the fine-tuned model as it is, so neither shows anything of a skill; learn a larger region"]
    code, out, err = run_cli("predict", "--region", path, "--text", PROMPTS[0], "--knockout")
    assert code == 0 and said[0] in " ".join(out.split()), (out, err)


def test_a_region_probed_on_another_pair_is_told_it_belongs_to_another_model(made, tmp_path):
    """The region's own pair is a tiny Llama; probed on a tiny GPT-2 pair, what reading it there fails on (a tensor
    name, a prompt's label words) would mislead: the line names both pairs and the fix."""
    from graftui.errors import RegionError

    base, ft = write_lm_pair(tmp_path, "gpt2")
    want = (f"'r.safetensors' belongs to another model: it was learned on base → ft, and the pair given is gpt2-base → "
            f"gpt2-ft; pass the region's own pair (--base {made['base']} --finetuned {made['ft']}), or localize again "
            "on this one")
    with pytest.raises(RegionError) as told:
        graftui.predict(regions=[str(made["region"])], texts=PROMPTS[:1], knockout=True, base=str(base),
                        finetuned=str(ft))
    assert str(told.value) == want
    code, out, err = run_cli("predict", "--region", made["region"], "--text", PROMPTS[0], "--knockout", "--base", base,
                             "--finetuned", ft)
    assert (code, out, err.strip().splitlines()) == (2, "", [f"graftui: error: {want}"])
    with pytest.raises(RegionError, match="belongs to another model: .* the pair given is base → gpt2-ft;"):
        graftui.predict(regions=[str(made["region"])], texts=PROMPTS[:1], finetuned=str(ft))


def test_pair_reads_a_completion_or_chat_task_as_localize_does(tmp_path):
    """`pair --task` on a (prompt, completion) CSV or a chat JSONL reads it through its kind, as localize does: the
    pair is read as a completion model (no label words to match), not refused for a text column it never needs."""
    base, ft = write_lm_pair(tmp_path, "llama")
    csv = write_completion_task(tmp_path / "opposites.csv")
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {w}"},
                                                     {"role": "assistant", "content": w}]}) + "\n"
                            for w in ("good", "bad", "fine", "dull") * 4))
    for task in (csv, chat):
        code, out, err = run_cli("pair", "--base", base, "--finetuned", ft, "--task", task, "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["preview"] is None and doc["pair"]["kind"] == "completion", doc["pair"]


def test_a_task_yaml_region_is_probed_with_the_yamls_own_generation_length(tmp_path):
    """A region learned on a task YAML whose generation_kwargs say max_gen_toks: 4: the probe (and its knockout)
    generates 4 new tokens, as the harness would, and its card says 4, not graftui's default."""
    folder = tmp_path / "short_task"
    folder.mkdir()
    rows = {s: [{"q": f"{w} is not", "a": OPP} for w, OPP in (("good", "bad"), ("fine", "awful"), ("loved", "hated"))
                * 4] for s in ("train", "test")}
    for split, docs in rows.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    yaml = folder / "task.yaml"
    yaml.write_text(f"task: short_task\ndataset_path: json\ndataset_kwargs:\n  data_files: {{train: \"{folder}/train.jsonl\", "
                    f"test: \"{folder}/test.jsonl\"}}\n  cache_dir: \"{tmp_path / 'cache'}\"\noutput_type: generate_until\n"
                    "training_split: train\ntest_split: test\ndoc_to_text: \"{{q}}\"\ndoc_to_target: a\n"
                    "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 4\nmetric_list:\n  - metric: exact_match\n")
    base, ft = write_lm_pair(tmp_path, "llama")
    region = tmp_path / "r.safetensors"
    graftui.localize(base=str(base), finetuned=str(ft), task=str(yaml), method="top-movement", sparsity=0.5,
                     check_n=0, out=str(region))
    doc = graftui.predict(regions=[str(region)], texts=["good is not"], knockout=True).as_dict()
    assert any("greedy, at most 4 new tokens" in line for line in doc["card"]), doc["card"]
    assert not any("32 new tokens" in line for line in doc["card"])
    said = {r["model"]: r["generation"] for r in doc["rows"]}
    prompt = Completions(((("user", "good is not"), ("assistant", "")),))
    for name, ref in (("fine-tuned", ft), ("pre-trained, same prompt", base)):
        assert said[name] == generation.generate(load_lm(str(ref), "causal-lm"), load_tokenizer(str(ref)), prompt, False,
                                                 max_new_tokens=4)[0], name
    assert "fine-tuned − r" in said  # the knockout generates as long


def test_a_completion_region_s_map_weighs_the_first_token_of_ft_s_generation(made):
    """--by cell on a completion region: p is the probability of the first token of FT's greedy generation after the
    prompt, under the part grafted alone (θ_pre + γ_P⊙δ) and knocked out alone (θ_ft − γ_P⊙δ), computed here by
    hand on the checkpoints; a flip where the part changes the top next token of its baseline (θ_pre, θ_ft)."""
    import torch

    from graftui import regions
    from graftui.experiments import only_part

    record = regions.load(made["region"])
    doc = graftui.predict(regions=[str(made["region"])], texts=PROMPTS, by="cell").as_dict()
    assert doc["kind"] == "completion" and doc["parts"]
    base, ft = load_lm(made["base"], "causal-lm"), load_lm(made["ft"], "causal-lm")
    tokenizer = load_tokenizer(made["base"])
    pre, tuned = {n: p.detach().clone() for n, p in base.named_parameters()}, dict(ft.named_parameters())

    def next_probs(values: dict) -> torch.Tensor:
        with torch.no_grad():
            for n, p in base.named_parameters():
                p.copy_(values.get(n, pre[n]))
            out = []
            for prompt in PROMPTS:
                ids = generation.prompt_ids(tokenizer, (("user", prompt), ("assistant", "")), False, None)
                out.append(torch.softmax(base(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1))
            return torch.stack(out)

    def mixed(start: dict, other: dict, region: dict) -> dict:
        values = {}
        for n, idx in region.items():
            flat = start[n].detach().clone().view(-1)
            flat[idx] = other[n].detach().view(-1)[idx]
            values[n] = flat.view(start[n].shape)
        return values

    ft_probs, pre_probs = next_probs({n: p.detach() for n, p in tuned.items()}), next_probs({})
    first = ft_probs.argmax(-1)
    one_token = _generate(made["ft"], 1)  # greedy generation starts with FT's top next token
    for i, a in enumerate(doc["answers"]):
        assert a["answer"] == repr(tokenizer.decode([int(first[i])]))
        assert one_token[i] == tokenizer.decode([int(first[i])], skip_special_tokens=True)
        assert a["ft_p"] == pytest.approx(float(ft_probs[i, first[i]]), abs=1e-5)
    for p in [p for p in doc["parts"] if p["text"] == 0][:3]:
        inside, _ = only_part(record.indices, record.shapes, layer=p["layer"], module=p["module"])
        graft = next_probs(mixed(pre, tuned, inside))
        knock = next_probs({**{n: v.detach() for n, v in tuned.items()}, **mixed(tuned, pre, inside)})
        for q in [q for q in doc["parts"] if q["part"] == p["part"]]:
            i = q["text"]
            assert q["graft_p"] == pytest.approx(float(graft[i, first[i]]), abs=1e-5)
            assert q["knockout_p"] == pytest.approx(float(knock[i, first[i]]), abs=1e-5)
            assert q["graft_flips"] is bool(graft[i].argmax() != pre_probs[i].argmax())
            assert q["knockout_flips"] is bool(knock[i].argmax() != first[i])
