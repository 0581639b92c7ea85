import json

import pytest
import torch

from graftui.sets import (
    Contribution,
    intersection,
    iou,
    overlap,
    overlap_matrix,
    region_size,
    union,
    union_values,
)


def T(*xs):
    return torch.tensor(xs, dtype=torch.long)


A = {"w": T(0, 1, 2, 3), "b": T(5)}  # size 5
B = {"w": T(2, 3, 4)}  # size 3; A ∩ B = {w: 2, 3}
C = {"x": T(7)}  # disjoint from both


def test_sizes_and_intersection():
    assert region_size(A) == 5 and region_size(B) == 3 and region_size({}) == 0
    inter = intersection(A, B)
    assert list(inter) == ["w"] and inter["w"].tolist() == [2, 3]
    assert intersection(A, C) == {}


def test_overlap_is_asymmetric():
    assert overlap(A, B) == pytest.approx(2 / 3)  # share of B inside A
    assert overlap(B, A) == pytest.approx(2 / 5)
    assert overlap(A, C) == 0.0
    assert overlap(A, {}) == 0.0


def test_iou():
    assert iou(A, B) == pytest.approx(2 / (5 + 3 - 2))
    assert iou(A, A) == 1.0
    assert iou(A, C) == 0.0
    assert iou({}, {}) == 0.0


def test_union_sorted_unique():
    u = union(A, B, C, {"w": T(9, 0)}, {"w": T(4, 3)})
    assert u["w"].tolist() == [0, 1, 2, 3, 4, 9]
    assert u["b"].tolist() == [5] and u["x"].tolist() == [7]
    assert u["w"].dtype == torch.long
    assert region_size(union(A, A)) == 5


def test_overlap_matrix():
    res = overlap_matrix({"a": A, "b": B, "c": C, "e": {}})
    assert res["names"] == ["a", "b", "c", "e"]
    assert res["sizes"] == [5, 3, 1, 0]
    assert [res["overlap"][i][i] for i in range(3)] == [1.0, 1.0, 1.0]
    assert res["overlap"][3][3] == 0.0  # empty region
    assert res["overlap"][0][1] == pytest.approx(2 / 3)  # |a ∩ b| / |b|
    assert res["overlap"][1][0] == pytest.approx(2 / 5)
    assert res["intersection_counts"][0][1] == res["intersection_counts"][1][0] == 2
    assert res["iou"][0][1] == res["iou"][1][0] == pytest.approx(1 / 3)
    assert res["iou"][0][2] == 0.0
    json.dumps(res)


@pytest.fixture
def checkpoints():
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(4, 5, generator=g), "b": torch.randn(3, generator=g)}
    fts = {k: {n: t + 0.37 * torch.randn(t.shape, generator=g) for n, t in base.items()} for k in "ABC"}

    def contrib(name, region):
        vals = {n: fts[name][n].reshape(-1)[idx] for n, idx in region.items()}
        return Contribution(name, region, vals)

    contribs = [
        contrib("A", {"w": T(0, 2, 7, 9)}),
        contrib("B", {"w": T(2, 9, 11), "b": T(1)}),
        contrib("C", {"w": T(9, 19)}),
    ]
    return base, fts, contribs


def _at(t, i):
    return t.reshape(-1)[i]


def test_union_values_disjoint_bit_exact(checkpoints):
    base, fts, contribs = checkpoints
    for resolve in ("mean", "sum", "first", "last"):
        idx, val, report = union_values(contribs, base, resolve=resolve)
        assert idx["w"].tolist() == [0, 2, 7, 9, 11, 19]
        assert idx["b"].tolist() == [1]
        w = dict(zip(idx["w"].tolist(), val["w"]))
        for i, owner in ((0, "A"), (7, "A"), (11, "B"), (19, "C")):
            assert torch.equal(w[i], _at(fts[owner]["w"], i)), (resolve, i)
        assert torch.equal(val["b"], fts["B"]["b"][T(1)])
        assert report["resolve"] == resolve
        assert report["overlap_params"] == 2  # w[2] (A, B) and w[9] (A, B, C)
        assert report["per_pair"] == {"A": {"B": 2, "C": 1}, "B": {"C": 1}, "C": {}}
        assert report["union_params"] == 7
        json.dumps(report)


def test_union_values_overlap_resolution(checkpoints):
    base, fts, contribs = checkpoints
    _, first, _ = union_values(contribs, base, resolve="first")
    _, last, _ = union_values(contribs, base, resolve="last")
    _, mean, _ = union_values(contribs, base, resolve="mean")
    # positions of w[2] and w[9] in the union [0, 2, 7, 9, 11, 19]
    p2, p9 = 1, 3
    assert torch.equal(first["w"][p2], _at(fts["A"]["w"], 2))
    assert torch.equal(first["w"][p9], _at(fts["A"]["w"], 9))
    assert torch.equal(last["w"][p2], _at(fts["B"]["w"], 2))
    assert torch.equal(last["w"][p9], _at(fts["C"]["w"], 9))

    def delta(k, i):
        return float(_at(fts[k]["w"], i)) - float(_at(base["w"], i))

    want2 = float(_at(base["w"], 2)) + (delta("A", 2) + delta("B", 2)) / 2
    want9 = float(_at(base["w"], 9)) + (delta("A", 9) + delta("B", 9) + delta("C", 9)) / 3
    assert float(mean["w"][p2]) == pytest.approx(want2, abs=1e-6)
    assert float(mean["w"][p9]) == pytest.approx(want9, abs=1e-6)
    assert mean["w"].dtype == torch.float32
    assert not torch.equal(mean["w"][p9], first["w"][p9])
    _, total, _ = union_values(contribs, base, resolve="sum")  # θ_pre + Σ γ_i⊙δ_i: every member's whole movement
    assert float(total["w"][p2]) == pytest.approx(float(_at(base["w"], 2)) + delta("A", 2) + delta("B", 2), abs=1e-6)
    assert float(total["w"][p9]) == pytest.approx(float(_at(base["w"], 9)) + delta("A", 9) + delta("B", 9)
                                                  + delta("C", 9), abs=1e-6)
    assert torch.equal(total["w"][0], mean["w"][0])  # one owner: its own value, bit for bit


def test_union_values_validation(checkpoints):
    base, _, contribs = checkpoints
    with pytest.raises(ValueError):
        union_values(contribs, base, resolve="max")
    with pytest.raises(ValueError):
        union_values([contribs[0], contribs[0]], base)  # duplicate names
    bad = Contribution("D", {"w": T(3, 1)}, {"w": torch.zeros(2)})
    with pytest.raises(ValueError):
        union_values([bad], base)
    with pytest.raises(KeyError):
        union_values(contribs, {}, resolve="mean")  # overlap needs base
    idx, _, _ = union_values(contribs, {}, resolve="first")  # base not needed
    assert region_size(idx) == 7


def test_million_index_regions():
    g = torch.Generator().manual_seed(1)
    a = {"p": torch.unique(torch.randint(0, 4_000_000, (1_100_000,), generator=g))}
    b = {"p": torch.unique(torch.randint(0, 4_000_000, (1_100_000,), generator=g))}
    inter = intersection(a, b)["p"]
    assert region_size(union(a, b)) == region_size(a) + region_size(b) - inter.numel()
    assert overlap(a, b) == pytest.approx(inter.numel() / region_size(b))


def test_core_and_stability_of_seed_regions_against_chance():
    from graftui.sets import core, stability

    r = lambda *i: {"w": torch.tensor(i)}  # noqa: E731
    a, b, c = r(0, 1, 2, 3), r(0, 1, 2, 9), r(0, 1, 7, 8)
    assert torch.equal(core([a, b, c])["w"], torch.tensor([0, 1])) and core([r(1), r(2)]) == {}
    st = stability([a, b, c], graftable=100)
    assert st["core"] == 2 and st["union"] == 7 and st["only_one"] == 4  # 3, 9, 7, 8
    assert st["pairwise_overlap"][0][1] == 0.75 and st["pairwise_overlap"][0][2] == 0.5
    assert st["mean_overlap"] == pytest.approx((0.75 + 0.5 + 0.5) * 2 / 6)
    assert st["chance_overlap"] == pytest.approx(0.04) and st["over_chance"] == pytest.approx(st["mean_overlap"] / 0.04)
