"""Completion tasks through the verbs, on tiny config-built causal LMs: supervised fine-tuning, a region learned on
the completion loss, evaluation by generation beside the baselines, an exported graft that generates what the graft
did, and each bad input refused in one line by the CLI."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import graftui
from graftui import cli, regions
from graftui.tasks.completion import data as completion, generation
from graftui.tasks.completion.data import Completions
from graftui.config import COMPLETION_SPARSITY, DEFAULT_SPARSITY, Budget, LoadOptions, kind_of_architecture
from graftui.experiments import MERGES
from graftui.models import load_lm, load_tokenizer, pair_kind

from lm_util import make_lm, make_tokenizer, write_base, write_completion_task, write_lm_pair


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def trained(request, tmp_path_factory):
    """A base, a completion task, and the base fine-tuned on it by graftui (once per architecture)."""
    root = tmp_path_factory.mktemp(f"sft-{request.param}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(root / "home"))
        base_dir = write_base(root / "base", request.param)
        task = write_completion_task(root / "opposites.csv")
        epochs = {"llama": 15, "gpt2": 30}[request.param]  # the tiny GPT-2, its positions fixed too, learns slower
        ft = graftui.finetune(base=str(base_dir), task=str(task), optimizer="adamw", lr=0.02, epochs=epochs,
                              train_examples=0, out=str(root / "ft"), max_new_tokens=4)
        yield {"root": root, "base": str(base_dir), "task": str(task), "ft": ft, "arch": request.param}


def one_architecture(trained) -> None:
    """What does not depend on the architecture runs on the Llama pair alone (the suite's time is shared)."""
    if trained["arch"] != "llama":
        pytest.skip("architecture-independent: run on the Llama pair")


def test_supervised_fine_tuning_learns_the_completions_and_records_its_kind(trained):
    ft = trained["ft"]
    assert ft.task_kind == "completion" and ft.test_examples == 12
    record = json.loads((trained["root"] / "ft" / "graftui_record.json").read_text())
    assert record["task_kind"] == "completion" and record["request"]["task_kind"] == "auto"
    assert pair_kind(ft.out, LoadOptions()) == "completion"  # a completion fine-tune is read as one, unasked
    task = completion.load_completion_task(trained["task"])
    before = generation.read(load_lm(trained["base"], "causal-lm"), load_tokenizer(trained["base"]), task,
                             task.splits["test"], generation.AnswerRule(), 4)
    assert ft.test_accuracy > float(before.judged.exact.mean()) == 0.0  # the skill is the fine-tune's, not the base's
    assert ft.test_accuracy >= (0.5 if trained["arch"] == "llama" else 0.25) and ft.test_loss < before.forced.loss()
    base_params, ft_params = (dict(load_lm(r, "causal-lm").named_parameters()) for r in (trained["base"], ft.out))
    for name, p in ft_params.items():  # the embeddings and the LM head stayed where they were
        if "embed" in name or "wte" in name or "wpe" in name or "lm_head" in name:
            assert torch.equal(p, base_params[name]), name


@pytest.fixture(scope="module")
def localized(trained):
    out = trained["root"] / "r.safetensors"
    loc = graftui.localize(base=trained["base"], finetuned=trained["ft"].out, task=trained["task"], sparsity=0.05,
                           steps=4, check_n=8, out=str(out), max_new_tokens=4)
    ev = graftui.evaluate(regions=[str(out)], baselines=True, max_new_tokens=4)
    return loc, ev, out


def test_localize_learns_on_the_completion_loss_and_checks_its_region_by_generation(trained, localized):
    loc, _, out = localized
    record = regions.load(out)
    assert record.meta.loading == {"head": "completion"} and record.meta.method == "learned"
    assert record.meta.train_examples == 42  # every training example (fewer than the default sample)
    rows = {r["model"]: r for r in loc.check["rows"]}
    assert set(rows) == {"fine-tuned", "pre-trained, same prompt", "this region"}
    assert all(r["n"] == 8 and 0 <= r["exact_match"] <= 1 and r["loss"] > 0 for r in rows.values())
    assert rows["this region"]["accuracy"] == rows["this region"]["exact_match"]
    assert len(loc.check["generations"]) == 8


def test_the_size_a_completion_skill_needs_is_read_on_the_loss_gap_without_generating(trained, localized, tmp_path):
    """--keep on a completion task: each region's share of the pre → FT loss gap, scored teacher-forced (the same loss
    the comparison reports, to the digit), and the region written keeps the target."""
    one_architecture(trained)
    _, _, region = localized
    from graftui.flows.common import load_pair

    pair, task = load_pair(trained["base"], trained["ft"].out), completion.load_completion_task(trained["task"])
    record = regions.load(region)
    forced = {r["model"]: r["loss"] for r in generation.forced_losses(pair, task, {"r": record.indices}, n=8)}
    compared = {r["model"]: r["loss"] for r in generation.compare_completions(
        pair, task, {"r": record.indices}, n=8, max_new_tokens=4)["rows"]}
    assert forced == compared
    out = tmp_path / "sized.safetensors"
    graftui.localize(base=trained["base"], finetuned=trained["ft"].out, task=trained["task"], sparsity=0.01, steps=4,
                     check_n=8, keep=0.5, out=str(out), max_new_tokens=4)
    meta = regions.load(out).meta
    search = meta.size_search
    assert search["measure"] == "the pre → FT loss gap" and search["scored_by"] == "loss" and search["n"] == 8
    written = next(p for p in search["curve"] if p["k"] == meta.k)
    assert written["keeps"] and written["share"] >= 0.5 and written["score"] > 0  # its loss per token
    assert all(not p["keeps"] for p in search["curve"] if p["k"] < meta.k)


def test_a_completion_region_takes_its_kinds_budget_where_the_request_names_none(trained, tmp_path):
    one_architecture(trained)
    out = tmp_path / "default-budget.safetensors"
    graftui.localize(base=trained["base"], finetuned=trained["ft"].out, task=trained["task"], method="top-movement",
                     check_n=0, out=str(out), max_new_tokens=4)
    record = regions.load(out)
    assert record.meta.sparsity == COMPLETION_SPARSITY == 10 * DEFAULT_SPARSITY and record.meta.budget == "sparsity=0.01"
    assert record.size == Budget(sparsity=COMPLETION_SPARSITY).resolve(record.meta.graftable_params)
    assert record.meta.request["sparsity"] is None  # the request as asked: re-made, it takes the kind's budget again
    ev = graftui.evaluate(base=trained["base"], finetuned=trained["ft"].out, task=trained["task"], baselines=True, n=4,
                          max_new_tokens=4)
    assert {r["region_size"] for r in ev.rows if r["model"] in ("Top movement", "Random")} == {record.size}


def test_evaluate_scores_every_model_by_generation_with_paired_intervals(trained, localized):
    _, ev, out = localized
    doc = ev.as_dict()
    rows = {r["model"]: r for r in doc["rows"]}
    assert set(rows) == {"fine-tuned", "pre-trained, same prompt", "r", "Top movement", "Random"}
    # the same test split and answer rule as the fine-tune's own test score
    assert rows["fine-tuned"]["exact_match"] == trained["ft"].test_accuracy
    assert rows["fine-tuned"]["loss"] == pytest.approx(trained["ft"].test_loss)
    assert rows["fine-tuned"]["agreement_with_ft"] == 1.0
    assert all(r["perplexity"] == pytest.approx(torch.tensor(r["loss"]).exp().item()) for r in rows.values())
    found = {(d["a"], d["b"], d["metric"]): d for d in doc["differences"]}
    for name in ("r", "Top movement", "Random"):
        d = found[(name, "fine-tuned", "exact_match")]
        assert d["diff"] == pytest.approx(rows[name]["exact_match"] - rows["fine-tuned"]["exact_match"])
        assert set(d) >= {"a", "b", "task", "metric", "diff", "ci", "p"} and d["n"] == 12
        assert (name, "fine-tuned", "loss") in found and (name, "fine-tuned", "token_ece") in found
    assert ("r", "Top movement", "exact_match") in found and ("r", "Random", "loss") in found
    shown = doc["generations"]
    assert len(shown) == 12 and all({"prompt", "reference", "fine-tuned", "r", "exact"} <= set(g) for g in shown)
    assert [g["exact"]["fine-tuned"] for g in shown].count(True) == round(12 * rows["fine-tuned"]["exact_match"])
    assert any("exact match" in line and "against FT" in line for line in doc["card"])


def test_an_exported_graft_generates_what_the_graft_generated_token_for_token(trained, localized, tmp_path):
    _, ev, out = localized
    exported = graftui.export(region=str(out), finetuned=trained["ft"].out, out=str(tmp_path / "graft"))
    model, tok = load_lm(exported.out, "causal-lm"), load_tokenizer(exported.out)
    assert kind_of_architecture([exported.architecture]) == "causal-lm" and exported.labels == []
    task = completion.load_completion_task(trained["task"])
    again = generation.generate(model, tok, task.splits["test"], False, max_new_tokens=4)
    assert again == [g["r"] for g in ev.as_dict()["generations"]]


def test_the_cli_prints_the_scores_the_differences_and_the_generations(trained, localized, capsys):
    one_architecture(trained)
    _, _, out = localized
    assert cli.main(["evaluate", "--region", str(out), "--max-new-tokens", "4", "--n", "6"]) == 0
    text = capsys.readouterr().out
    assert "exact match" in text and "loss/token" in text and "prompt (end)" in text and "exact_match" in text
    assert cli.main(["evaluate", "--region", str(out), "--max-new-tokens", "4", "--n", "6", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"a", "b", "task", "metric", "diff", "ci"} <= set(doc["differences"][0])
    assert len(doc["generations"]) == 6


@pytest.mark.parametrize("args, message", [
    (["--task-kind", "completion", "--task", "{labels}"], "has no completion column: name it with --completion-column"),
    (["--task", "{empty}"], "have an empty completion in column 'completion': fill them or drop those rows"),
    (["--task-kind", "classification", "--completion-column", "answer"], "are for completion tasks"),
    (["--answer-regex", "(", "--task", "{task}"], "is not a regular expression"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--task", "{chat}"], "this tokenizer has no chat template, so a messages column cannot be rendered"),
    (["--task", "{long}"], "completion tokens, more than the model's context of 64 tokens: shorten its completion"),
])
def test_bad_completion_input_is_one_line_and_writes_nothing(trained, tmp_path, capsys, args, message):
    one_architecture(trained)
    labels = tmp_path / "labels.csv"
    labels.write_text("text,label\ngood,1\nbad,0\n" * 10)
    empty = tmp_path / "empty.csv"
    empty.write_text("prompt,completion\nsay,\n" + "say, hi\n" * 10)
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": "good"},
                                                        {"role": "assistant", "content": "bad"}]}) for _ in range(12)))
    long = tmp_path / "long.csv"
    long.write_text("prompt,completion\n" + "".join(f"say {i},{' good' * 300}\n" for i in range(12)))
    args = [a.format(labels=labels, empty=empty, task=trained["task"], chat=chat, long=long) for a in args]
    out = tmp_path / "never.safetensors"
    code = cli.main(["localize", "--base", trained["base"], "--finetuned", trained["ft"].out, "--task", trained["task"],
                     "--steps", "1", "--out", str(out), *args])
    err = capsys.readouterr().err.strip()
    assert code != 0 and message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_regex_that_matches_no_reference_and_a_masked_lm_are_refused_in_one_line(trained, localized, tmp_path,
                                                                                    capsys):
    one_architecture(trained)
    _, _, out = localized
    assert cli.main(["evaluate", "--region", str(out), "--answer-regex", r"#### (\d+)"]) != 0
    err = capsys.readouterr().err.strip()
    assert "matches none of the references" in err and len(err.splitlines()) == 1
    mlm_base, mlm_ft = write_lm_pair(tmp_path, "bert-mlm")
    assert cli.main(["localize", "--base", str(mlm_base), "--finetuned", str(mlm_ft), "--task", trained["task"],
                     "--steps", "1", "--out", str(tmp_path / "x.safetensors")]) != 0
    err = capsys.readouterr().err.strip()
    assert "is a masked lm: a completion task is scored on a causal LM's own completions" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "x.safetensors").exists()
    shutil.rmtree(tmp_path / "bert-mlm-base")


# -- stitching skills of two fine-tunes -----------------------------------------------------------------------------
def test_task_arithmetic_and_the_choice_of_lambda_are_exact():
    from graftui.experiments import best_lambda, task_arithmetic

    pre = {"w": torch.tensor([1.0, 2.0, 3.0])}
    fts = [{"w": torch.tensor([2.0, 2.0, 3.0])}, {"w": torch.tensor([1.0, 4.0, 2.0])}]
    assert task_arithmetic(pre, fts, 0.5, ["w"])["w"].tolist() == [1.5, 3.0, 2.5]
    assert task_arithmetic(pre, fts, 1.0, ["w"])["w"].tolist() == [2.0, 4.0, 2.0]
    assert best_lambda({0.2: 0.5, 0.4: 0.7, 0.8: 0.7, 1.0: 0.6}) == 0.4  # ties go to the merge that moves least


def test_holding_whole_tensors_restores_the_pre_trained_model(tiny_pair):
    pair, base, ft = tiny_pair
    name = pair.graftable[0]
    with pair.holding({name: pair.ft[name] * 2}) as model:
        assert torch.equal(dict(model.named_parameters())[name], pair.ft[name] * 2)
    assert torch.equal(pair.param(name), pair.pre[name])
    with pytest.raises(Exception, match="not a graftable tensor"):
        with pair.holding({"classifier.weight": torch.zeros(2, 16)}):
            pass


@pytest.fixture(scope="module")
def two_skills(tmp_path_factory):
    """One tiny Llama base, fine-tuned on two skills, a region of each."""
    from lm_util import write_echo_task

    root = tmp_path_factory.mktemp("stitch")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAFTUI_HOME", str(root / "home"))
        base = write_base(root / "base", "llama")
        made = {}
        for name, task in (("opposites", write_completion_task(root / "opposites.csv")),
                           ("echo", write_echo_task(root / "echo.csv"))):
            ft = graftui.finetune(base=str(base), task=str(task), optimizer="adamw", lr=0.02, epochs=6,
                                  train_examples=0, out=str(root / f"ft-{name}"), max_new_tokens=4)  # what is scored
            # here is how the union is built and judged, not how well the tiny model learned
            region = root / f"{name}.safetensors"
            graftui.localize(base=str(base), finetuned=ft.out, task=str(task), sparsity=0.1, steps=2, check_n=0,
                             out=str(region), max_new_tokens=4)
            made[name] = (task, ft, region)
        yield root, base, made


def test_stitching_scores_the_union_against_each_fine_tune_and_task_arithmetic(two_skills):
    root, base, made = two_skills
    union = root / "union.safetensors"
    result = graftui.compose(regions=[str(made["opposites"][2]), str(made["echo"][2])], stitch=True,
                             lambdas=[0.5, 1.0], densities=[0.5], validation_n=6, n=8, out=str(union))
    doc = result.as_dict()
    chosen = doc["stitch"]
    assert [e["lambda"] for e in chosen["lambdas"]] == [0.5, 1.0] and chosen["validation_n"] == 6
    best = max(e["validation"] for e in chosen["lambdas"])
    assert chosen["lambda"] == min(e["lambda"] for e in chosen["lambdas"] if e["validation"] == best)
    merged = {}
    for m in chosen["merges"]:  # each merge's setting is the best of its own grid on validation, the smallest of ties
        top = max(e["validation"] for e in m["grid"])
        assert m["lambda"] == min(e["lambda"] for e in m["grid"] if e["validation"] == top)
        key = MERGES[m["merge"]].key  # density, TALL λ or none: each grid holds its own one value here
        assert [(e["lambda"], e.get(key)) for e in m["grid"]] == [(0.5, m.get(key)), (1.0, m.get(key))]
        merged[m["merge"]] = m["model"]
    arithmetic = f"task arithmetic (λ = {chosen['lambda']:g})"
    assert merged["task-arithmetic"] == arithmetic and merged["ties"].startswith("TIES (λ = ") \
        and merged["dare"].endswith(", density 0.5)") and merged["consensus"].endswith(", TALL λ 0.4)")
    for task in ("opposites.csv", "echo.csv"):
        rows = {r["model"]: r for r in doc["rows"] if r["task"] == task}
        other = "echo" if task == "opposites.csv" else "opposites"
        assert {"stitched", "fine-tuned", *merged.values(), f"fine-tuned for {other}",
                "pre-trained, same prompt"} <= set(rows)
        assert rows["stitched"]["region_size"] == written_size(union) and rows[arithmetic]["region_size"] is None
        assert all(r["n"] == 8 for r in rows.values())
        pairs = {(d["a"], d["b"], d["metric"]) for d in doc["differences"] if d["task"] == task}
        assert ("stitched", "fine-tuned", "exact_match") in pairs
        assert all(("stitched", label, "exact_match") in pairs for label in merged.values())
    assert any("stitched model's exact match" in line for line in doc["card"])
    # the stitched patch, exported, generates what the stitched graft generated
    exported = graftui.export(region=str(union), base=str(base), out=str(root / "stitched"))
    model, tok = load_lm(exported.out, "causal-lm"), load_tokenizer(exported.out)
    for name in ("opposites", "echo"):
        task = completion.load_completion_task(str(made[name][0]))
        shown = [g for g in doc["generations"] if g["task"] == task.name]
        data = generation.sample(task, "test", 8, 0)
        again = generation.generate(model, tok, data, False, max_new_tokens=4)
        assert again[:len(shown)] == [g["stitched"] for g in shown] and shown


def written_size(path) -> int:
    return regions.load(path).size


def test_the_app_shows_a_completion_comparison_and_its_generations(trained, localized):
    one_architecture(trained)
    from types import SimpleNamespace

    from graftui.ui import forms, tables
    from graftui.ui.tabs import compare, models

    _, ev, _ = localized
    table, diffs, rel, hist, note, _, _, shown = compare.render_compare(SimpleNamespace(result=ev.as_dict()))
    assert not rel["visible"] and not hist["visible"]  # no confidence per example: no empty diagrams either
    assert shown["label"] == tables.GENERATIONS_LABEL
    shown = shown["value"]
    models_in_order = list(shown.columns)[4:]  # the fine-tuned model first, the pre-trained model last
    assert models_in_order[0] == "fine-tuned" and models_in_order[-1] == "pre-trained, same prompt"
    assert shown.map(lambda cell: len(str(cell))).to_numpy().max() < 4 * tables.GENERATION_WIDTH
    assert list(table.columns) == tables.COMPLETION_COLUMNS and len(table) == 5
    assert table.loc[table["model"] == "fine-tuned", "Δ vs FT"].item() == "+0.0 pts"
    assert set(diffs["metric"]) == {"exact_match", "contains", "token_f1", "loss", "token_ece"}
    assert "Completion task" in note and "contains" in note and "token F1" in note
    assert list(shown.columns)[:4] == ["task", "prompt", "reference", "reference answer"] and len(shown) == 12
    assert shown["fine-tuned"].str.match(r"^(✓|≈|✗( \(F1 [\d.]+\))?) ").all()
    exact = [g["exact"]["fine-tuned"] for g in ev.as_dict()["generations"]]
    assert shown["fine-tuned"].str.startswith("✓").tolist() == exact  # the mark is the example's exact match
    offered = dict((v, k) for k, v in models.task_choices())
    assert "dates" in offered and forms.data_columns("numbers", "x") == {}
    assert offered["lm-eval:graftui_dates"].startswith("lm-eval:graftui_dates (lm-eval): ")  # every kind's own tasks


def test_sweep_and_ablation_score_completion_regions_by_generation(trained, localized):
    one_architecture(trained)
    sweep = graftui.sweep(base=trained["base"], finetuned=trained["ft"].out, task=trained["task"],
                          sparsities=[0.02, 0.1], methods=["learned", "top-movement", "random"], steps=2, n=6,
                          max_new_tokens=4).as_dict()
    assert [(r["method"], r["sparsity"]) for r in sweep["rows"]] == [
        (m, s) for s in (0.02, 0.1) for m in ("learned", "top-movement", "random")]
    assert all(r["accuracy"] == r["exact_match"] and r["n"] == 6 and r["loss"] > 0 for r in sweep["rows"])
    assert {(d["a"], d["b"], d["sparsity"]) for d in sweep["differences"] if d["metric"] == "exact_match"} >= {
        ("learned", "top-movement", 0.02), ("learned", "random", 0.1), ("random", "fine-tuned", 0.1)}
    _, _, out = localized
    anatomy = graftui.anatomy(region=str(out), ablate=True, n=6).as_dict()["ablation"]
    assert anatomy["metric"] == "exact_match" and anatomy["n"] == 6
    assert all(r["drop"] == pytest.approx(anatomy["accuracy"] - r["accuracy"]) for r in anatomy["rows"])


def test_a_region_is_judged_by_its_own_answer_rule_where_a_later_request_is_silent(trained, localized, tmp_path):
    """Localize recorded --max-new-tokens 4: evaluate and push (whose requests do not say) generate 4 tokens, not 32."""
    one_architecture(trained)
    _, _, out = localized
    ev = graftui.evaluate(regions=[str(out)], n=4).as_dict()
    task = completion.load_completion_task(trained["task"])
    data = generation.sample(task, "test", 4, 0)
    base, tok = load_lm(trained["base"], "causal-lm"), load_tokenizer(trained["base"])
    shown = [g["pre-trained, same prompt"] for g in ev["generations"]]
    assert shown == generation.generate(base, tok, data, False, max_new_tokens=4)  # the region's own length
    assert shown != generation.generate(base, tok, data, False, max_new_tokens=32)  # not the default's
    pushed = graftui.push(repo="me/opposites-skill", region=str(out), n=4, out=str(tmp_path / "repo"))
    card = (tmp_path / "repo" / "README.md").read_text()
    assert ("| exact match (95 % interval) | contains | token F1 | loss per token | token ECE |" in card
            and "| fine-tuned |" in card)
    assert "model.safetensors" not in pushed.files  # a patch, not a checkpoint


def test_stitching_classification_regions_of_two_prompt_fine_tunes(tmp_path, monkeypatch):
    """Stitching is not only for completions: two prompt-read GPT-2 fine-tunes of one base, each with a region of the
    same label-word task, scored by accuracy beside each fine-tune and task arithmetic."""
    from lm_util import write_task

    monkeypatch.setenv("GRAFTUI_HOME", str(tmp_path / "home"))
    base, ft1 = write_lm_pair(tmp_path, "gpt2")
    ft2 = tmp_path / "gpt2-ft2"
    shutil.copytree(ft1, ft2)
    model = load_lm(str(ft2), "causal-lm")
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("transformer.h."):
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(ft2)
    task = write_task(tmp_path / "words.csv", n=60)
    made = []
    for i, ft in enumerate((ft1, ft2)):
        out = tmp_path / f"r{i}.safetensors"
        graftui.localize(base=str(base), finetuned=str(ft), task=str(task), method="top-movement", sparsity=0.05,
                         check_n=0, label_words="negative= bad,positive= good", out=str(out))
        made.append(str(out))
    doc = graftui.compose(regions=made, stitch=True, lambdas=[0.5, 1.0], merges=["task-arithmetic"], validation_n=8,
                          n=12).as_dict()
    arithmetic = f"task arithmetic (λ = {doc['stitch']['lambda']:g})"
    for head, other in (("r0", "r1"), ("r1", "r0")):
        rows = {r["model"]: r for r in doc["rows"] if r["head"] == head}
        assert {"stitched", "fine-tuned", arithmetic, f"fine-tuned for {other}", f"{head} alone"} <= set(rows)
        assert all("f1" in r and r["n"] == 12 for r in rows.values())  # scored as a classifier
    assert {(d["a"], d["b"], d["metric"]) for d in doc["differences"]} >= {("stitched", "fine-tuned", "accuracy"),
                                                                            ("stitched", arithmetic, "accuracy")}


def test_a_completion_patch_evaluates_without_its_fine_tune(trained, localized, tmp_path):
    """A downloaded skill patch, its fine-tuned model gone: FT is rebuilt from the patch and named so, everywhere."""
    one_architecture(trained)
    _, _, out = localized
    moved = tmp_path / "patch.safetensors"
    shutil.copyfile(out, moved)
    record = regions.load(moved)
    record.meta.finetuned = str(tmp_path / "gone")
    regions.save(record, moved, exclusive=False)
    doc = graftui.evaluate(regions=[str(moved)], n=6).as_dict()
    ft = "fine-tuned (from patch)"
    assert [r["model"] for r in doc["rows"]][:2] == [ft, "pre-trained, same prompt"]
    assert all(ft in g and ft in g["exact"] and "fine-tuned" not in g for g in doc["generations"])
    assert any("against FT" in line for line in doc["card"]) and any("rebuilt from the patch" in n for n in doc["notes"])


def test_a_pair_and_a_task_of_other_kinds_are_refused_in_one_line(trained, tmp_path, capsys):
    one_architecture(trained)
    from lm_util import write_task

    words = write_task(tmp_path / "words.csv")
    assert cli.main(["localize", "--base", trained["base"], "--finetuned", trained["ft"].out, "--task", str(words),
                     "--method", "top-movement", "--out", str(tmp_path / "x.safetensors")]) != 0
    err = capsys.readouterr().err.strip()
    assert "was fine-tuned on completions, and 'words.csv' is a classification task" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "x.safetensors").exists()


def test_a_chat_is_prompted_with_its_template_and_stops_at_the_end_of_its_turn(tmp_path):
    """The tokenizer's chat template renders the prompt up to the assistant's turn; greedy decoding stops at the
    template's end-of-turn token as at the end of text."""
    tok = make_tokenizer(tmp_path / "tok")
    tok.add_tokens(["<|im_end|>"])  # an ordinary token here, so the text shows how often it was generated
    tok.chat_template = ("{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
                         "{% if add_generation_prompt %}<s>assistant{% endif %}")
    model = make_lm("llama", len(tok)).eval()
    example = (("user", "good"), ("assistant", " bad"))
    ids = generation.prompt_ids(tok, example, True, 64)
    assert tok.decode(ids) == "<s>user good<|im_end|><s>assistant"
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert set(generation.stop_ids(tok, True)) == {tok.eos_token_id, end} and generation.stop_ids(tok, False) == [
        tok.eos_token_id]
    head = torch.nn.Linear(model.lm_head.in_features, len(tok), bias=True)
    with torch.no_grad():  # a model whose every next token is the end of turn
        head.weight.zero_()
        head.bias.zero_()
        head.bias[end] = 10.0
    model.lm_head = head
    assert generation.generate(model, tok, Completions((example,)), True, max_new_tokens=8) == ["<|im_end|>"]
    assert generation.generate(model, tok, Completions((example,)), False, max_new_tokens=8) == ["<|im_end|>" * 8]


def test_task_arithmetic_is_chosen_on_validation_examples_only(two_skills, monkeypatch):
    root, base, made = two_skills
    read = []
    real = generation.sample
    monkeypatch.setattr(generation, "sample", lambda task, split, n, seed=0: read.append(split) or real(task, split, n,
                                                                                                          seed))
    graftui.compose(regions=[str(made["opposites"][2]), str(made["echo"][2])], stitch=True, lambdas=[0.5, 1.0],
                    merges=["task-arithmetic", "ties"], densities=[0.5], validation_n=4, n=4)
    first_test = read.index("test")
    assert read[:first_test] == ["validation"] * 8 and set(read[first_test:]) == {"test"}  # 2 merges × 2 λ × 2 tasks


def _gsm8k_like(folder):
    """A dataset repository laid out as GSM8K's is on the Hub: configs ``main`` and ``socratic``, each with train and
    test parquet files named in the card's YAML, columns ``question`` and ``answer`` (working, then ``#### n``)."""
    import pandas as pd

    card = ["---", "configs:"]
    for config in ("main", "socratic"):
        card.append(f"- config_name: {config}\n  data_files:")
        for split, numbers in (("train", range(2, 34)), ("test", range(34, 42))):
            (folder / config).mkdir(parents=True, exist_ok=True)
            rows = [{"question": f"good {a} great {a}?", "answer": f"{a} plus {a} is {2 * a}.\n#### {2 * a}"}
                    for a in numbers]
            pd.DataFrame(rows).to_parquet(folder / config / f"{split}-00000-of-00001.parquet")
            card.append(f"  - split: {split}\n    path: {config}/{split}-*")
    (folder / "README.md").write_text("\n".join(card + ["---", "A GSM8K-shaped dataset.", ""]))
    return folder


def test_a_hub_sft_dataset_is_read_through_its_config_and_judged_by_its_answer_regex(trained, tmp_path, monkeypatch):
    """The Hub path of ``datasets.load_dataset`` (an id and a config) on a repository laid out as GSM8K's: columns
    mapped, the test split the dataset's own, the validation split cut from its train split, the answer after
    ``####`` what exact match compares."""
    one_architecture(trained)
    import datasets

    repo, real = _gsm8k_like(tmp_path / "gsm8k"), datasets.load_dataset
    asked = []

    def from_the_hub(ref, config=None, *args, **kwargs):
        asked.append((ref, config))
        assert ref == "openai/gsm8k"
        return real(str(repo), config, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", from_the_hub)
    columns = dict(config="main", prompt_column="question", completion_column="answer")
    task = completion.load_completion_task("openai/gsm8k", completion.CompletionSpec(**columns))
    assert asked == [("openai/gsm8k", "main")] and task.name == "openai/gsm8k/main"
    assert len(task.splits["test"]) == 8 and len(task.splits["train"]) + len(task.splits["validation"]) == 32
    assert {c for _, (_, c) in task.splits["test"].examples} == {f"{a} plus {a} is {2 * a}.\n#### {2 * a}"
                                                                 for a in range(34, 42)}
    rule = generation.AnswerRule(regex=r"#### (\S+)")
    assert rule.answer("8 plus 8 is 16.\n#### 16", None) == "16" and rule.answer("no answer here", None) is None
    ft = graftui.finetune(base=trained["base"], task="openai/gsm8k", optimizer="adamw", lr=0.02, epochs=2,
                          train_examples=0, out=str(tmp_path / "ft"), answer_regex=r"#### (\S+)", max_new_tokens=12,
                          **columns)
    assert ft.task_kind == "completion" and ft.test_examples == 8
    out = tmp_path / "r.safetensors"
    graftui.localize(base=trained["base"], finetuned=ft.out, task="openai/gsm8k", sparsity=0.05, steps=2, check_n=0,
                     out=str(out), answer_regex=r"#### (\S+)", max_new_tokens=12, **columns)
    ev = graftui.evaluate(regions=[str(out)]).as_dict()
    assert ev["judging"] == [{"task": task.name, "rule": {"regex": r"#### (\S+)", "ignore_case": False, "first_line": True,
                                                          "ignore_punctuation": False, "regexes_to_ignore": [],
                                                          "whitespace": "collapse"},
                               "max_new_tokens": 12}]  # the region's own rule and length
    assert any("answer: the first match of '#### (\\S+)'" in line for line in ev["card"])
    judged = generation.AnswerRule(**ev["judging"][0]["rule"])
    shown = ev["generations"]
    assert len(shown) == 8 and {g["reference"] for g in shown} <= {c for _, (_, c) in task.splits["test"].examples}
    assert [g["exact"]["fine-tuned"] for g in shown] == [
        judged.answer(g["fine-tuned"], g["reference"]) == judged.answer(g["reference"], g["reference"]) for g in shown]
    other_working = (["16 is 8 and 8.\n#### 16"], ["8 plus 8 is 16.\n#### 16"])
    assert generation.exact_matches(*other_working, judged).tolist() == [1.0]  # the answer, not the working
    assert generation.exact_matches(*other_working, generation.AnswerRule()).tolist() == [0.0]
