"""The merges stitching is measured against: task arithmetic, TIES and DARE, exact on hand-made task vectors."""

from __future__ import annotations

import pytest
import torch

from graftui.experiments import MERGES, best_lambda, dare_merge, task_arithmetic, ties_merge

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


def test_every_merge_is_registered_with_whether_it_has_a_density_and_settings_tie_to_the_smallest():
    pre, fts = vectors()
    assert {name: has for name, (_, has) in MERGES.items()} == {"task-arithmetic": False, "ties": True, "dare": True}
    merge, _ = MERGES["task-arithmetic"]
    assert merge(pre, fts, 0.5, None, ["w"])["w"].tolist() == task_arithmetic(pre, fts, 0.5, ["w"])["w"].tolist()
    assert best_lambda({(0.4, 0.5): 0.7, (0.4, 0.2): 0.7, (1.0, 0.2): 0.6}) == (0.4, 0.2)


@pytest.mark.parametrize("fields, said", [
    ({"merges": ["ties", "slerp"]}, "--merges: give one or more of task-arithmetic, ties, dare; 'slerp' is none of them"),
    ({"merges": []}, "--merges: give one or more of task-arithmetic, ties, dare"),
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
    assert wide.merge_settings() == 8 + 64 + 64
    with pytest.raises(RequestError, match="136 merge settings .λ × density over the merges. are over this server's "
                                           "limit of 32 for one job; give fewer --lambdas, --densities or --merges"):
        hosted.check_request(wide, hosted.HostedGuard())
    assert ComposeRequest(regions=regions, stitch=True).merge_settings() == 25  # the default grid is allowed
    assert ComposeRequest(regions=regions).merge_settings() == 0  # an overlap alone validates nothing
