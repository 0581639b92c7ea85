"""The merges stitching is measured against: task arithmetic, TIES and DARE, exact on hand-made task vectors."""

from __future__ import annotations

import pytest
import torch

from graftui.experiments import MERGES, best_lambda, consensus_merge, dare_merge, task_arithmetic, ties_merge

pytestmark = pytest.mark.unit


def vectors():
    pre = {"w": torch.zeros(4), "b": torch.tensor([1.0, 1.0])}
    fts = [{"w": torch.tensor([1.0, -2.0, 3.0, 0.5]), "b": torch.tensor([2.0, 1.0])},
           {"w": torch.tensor([-3.0, 1.0, 1.0, 0.5]), "b": torch.tensor([0.0, 1.0])}]
    return pre, fts


def test_ties_trims_elects_a_sign_and_takes_the_disjoint_mean():
    pre, fts = vectors()
    # δ1 keeps 3 and −2; δ2 keeps −3 and the two tied 1s; Σ = [−3, −1, 4, 0] elects [−, −, +, 0];
    # the agreeing entries' means are −3, −2, (3 + 1)/2 and nothing
    assert ties_merge(pre, fts, 1.0, 0.5, ["w"])["w"].tolist() == [-3.0, -2.0, 2.0, 0.0]
    assert ties_merge(pre, fts, 0.5, 0.5, ["w"])["w"].tolist() == [-1.5, -1.0, 1.0, 0.0]
    # all kept: b's δ are [+1, 0] and [−1, 0]; the tie in the vote elects no sign, so b stays θ_pre there
    assert ties_merge(pre, fts, 1.0, 1.0, ["b"])["b"].tolist() == [1.0, 1.0]
    assert ties_merge(pre, fts, 1.0, 1.0, ["w"])["w"].tolist() == [-3.0, -2.0, 2.0, 0.5]


def test_dare_keeps_each_entry_or_drops_it_and_rescales_and_is_task_arithmetic_at_density_one():
    pre, fts = vectors()
    full = dare_merge(pre, fts, 0.7, 1.0, ["w", "b"])
    arithmetic = task_arithmetic(pre, fts, 0.7, ["w", "b"])
    assert all(torch.equal(full[n], arithmetic[n]) for n in ("w", "b"))
    big = {"w": torch.zeros(10_000)}
    ones = [{"w": torch.ones(10_000)}]
    half = dare_merge(big, ones, 1.0, 0.5, ["w"], seed=3)["w"]
    assert set(half.unique().tolist()) == {0.0, 2.0}  # dropped, or kept at 1/density
    assert abs(float(half.mean()) - 1.0) < 0.05  # unbiased
    assert torch.equal(half, dare_merge(big, ones, 1.0, 0.5, ["w"], seed=3)["w"])
    assert not torch.equal(half, dare_merge(big, ones, 1.0, 0.5, ["w"], seed=4)["w"])


def test_consensus_keeps_the_sum_where_two_tasks_tall_masks_claim_a_parameter():
    pre, fts = vectors()
    # w: δ1 = [1, −2, 3, .5], δ2 = [−3, 1, 1, .5], Σ = [−2, −1, 4, 1]. At λ_t = 0.4 task 1 claims where
    # |δ1| ≥ 0.4·|δ2|: [1 ≥ 1.2 no, 2 ≥ 0.4, 3 ≥ 0.4, .5 ≥ .2]; task 2 where |δ2| ≥ 0.4·|δ1|: [yes, yes, 1 ≥ 1.2 no, yes]
    assert consensus_merge(pre, fts, 1.0, 0.4, ["w"])["w"].tolist() == [0.0, -1.0, 0.0, 1.0]
    assert consensus_merge(pre, fts, 0.5, 0.4, ["w"])["w"].tolist() == [0.0, -0.5, 0.0, 0.5]
    # a parameter one task alone moved is "selfish" and dropped; one no task moved stays θ_pre
    assert consensus_merge(pre, fts, 1.0, 0.4, ["b"])["b"].tolist() == [1.0, 1.0]
    # a threshold of 0 lets every task claim every parameter: task arithmetic
    assert torch.equal(consensus_merge(pre, fts, 0.7, 1e-12, ["w"])["w"], task_arithmetic(pre, fts, 0.7, ["w"])["w"])


def test_every_merge_is_registered_with_its_second_setting_and_settings_tie_to_the_smallest():
    pre, fts = vectors()
    assert {name: m.grid for name, m in MERGES.items()} == {"task-arithmetic": None, "ties": "densities",
                                                             "dare": "densities", "consensus": "talls"}
    assert MERGES["ties"].label(1.0, 0.2) == "TIES (λ = 1, density 0.2)"
    assert MERGES["consensus"].label(0.5, 0.4) == "consensus (λ = 0.5, TALL λ 0.4)"
    assert MERGES["task-arithmetic"].label(0.6, None) == "task arithmetic (λ = 0.6)"
    merge = MERGES["task-arithmetic"].make
    assert merge(pre, fts, 0.5, None, ["w"])["w"].tolist() == task_arithmetic(pre, fts, 0.5, ["w"])["w"].tolist()
    assert best_lambda({(0.4, 0.5): 0.7, (0.4, 0.2): 0.7, (1.0, 0.2): 0.6}) == (0.4, 0.2)


@pytest.mark.parametrize("fields, said", [
    ({"merges": ["ties", "slerp"]},
     "--merges: give one or more of task-arithmetic, ties, dare, consensus; 'slerp' is none of them"),
    ({"merges": []}, "--merges: give one or more of task-arithmetic, ties, dare, consensus"),
    ({"talls": [0.0]}, "--talls: give consensus's TALL-mask thresholds λ_t in (0, 10]"), ({"talls": []}, "--talls"),
    ({"densities": [0.0]}, "--densities: give the shares of each δ_i that ties and dare keep, in (0, 1]"),
    ({"densities": [1.5]}, "--densities"), ({"densities": [float("nan")]}, "--densities"),
])
def test_a_bad_merge_or_density_is_one_line_naming_the_fix(tmp_path, fields, said):
    import re

    from graftui.errors import RequestError
    from graftui.requests import ComposeRequest

    regions = []
    for name in ("a", "b"):
        (tmp_path / f"{name}.safetensors").write_bytes(b"")
        regions.append(str(tmp_path / f"{name}.safetensors"))
    with pytest.raises(RequestError, match=re.escape(said)):
        ComposeRequest(regions=regions, stitch=True, **fields).validate()


def test_a_shared_server_bounds_the_validation_work_of_the_merge_grid(tmp_path, monkeypatch):
    from graftui import hosted
    from graftui.errors import RequestError
    from graftui.requests import ComposeRequest

    monkeypatch.setenv("GRAFTUI_HOSTED", "1")
    regions = []
    for name in ("a", "b"):
        (tmp_path / f"{name}.safetensors").write_bytes(b"")
        regions.append(str(tmp_path / f"{name}.safetensors"))
    wide = ComposeRequest(regions=regions, stitch=True, n=50, lambdas=[0.1 * i for i in range(1, 9)],
                          densities=[0.1 * i for i in range(1, 9)])
    assert wide.merge_settings() == 8 + 64 + 64 + 8
    with pytest.raises(RequestError, match="144 merge settings .λ × density or TALL λ over the merges. are over this "
                                           "server's limit of 32 for one job; give fewer --lambdas, --densities, "
                                           "--talls or --merges"):
        hosted.check_request(wide, hosted.HostedGuard())
    assert ComposeRequest(regions=regions, stitch=True).merge_settings() == 30  # the default grid is allowed
    hosted.check_request(ComposeRequest(regions=regions, stitch=True, n=50), hosted.HostedGuard())
    assert ComposeRequest(regions=regions).merge_settings() == 0  # an overlap alone validates nothing


def test_the_text_of_a_stitch_names_each_merges_own_second_setting():
    from graftui.flows import text

    grid = {"task-arithmetic": [{"lambda": 0.5, "validation": 0.8}],
            "ties": [{"lambda": 1.0, "density": 0.2, "validation": 0.66}],
            "consensus": [{"lambda": 1.5, "tall": 0.4, "validation": 0.7}]}
    doc = {"names": ["a", "b"], "kinds": ["learned", "learned"], "sizes": [10, 12], "overlap": [[1, 0.5], [0.4, 1]],
           "iou": [[1, 0.3], [0.3, 1]], "union_size": 17,
           "rows": [{"task": "t", "model": "stitched", "n": 4, "accuracy": 0.5, "region_size": 17}],
           "stitch": {"validation_n": 6, "merges": [{"merge": m, "model": m, "grid": g} for m, g in grid.items()]}}
    out = text.compose(doc)
    assert "task-arithmetic: the best mean validation score over the tasks (6 examples each; λ 0.5: 0.800)" in out
    assert "λ 1 density 0.2: 0.660" in out and "λ 1.5 TALL λ 0.4: 0.700" in out
    old = {**doc, "stitch": {"validation_n": 6, "model": "task arithmetic (λ = 0.5)", "lambda": 0.5,
                             "lambdas": [{"lambda": 0.5, "validation": 0.8}]}}  # a stitch saved before other merges
    assert "task arithmetic (λ = 0.5): the best mean validation score" in text.compose(old)
