"""The size a skill needs (``localize --keep``): the search over budgets, exactly on a made-up skill, then end to end
on a tiny pair through the command line."""

from __future__ import annotations

import math

import pytest
import torch

from cli_util import refused, run_cli
from graftui import regions, sizing
from test_learner_plan import localize_args, tiny_folders  # noqa: F401  (a fixture)

GRAFTABLE = 10_000


def made_up(needs: int):
    """A skill held by parameters 0 … needs−1 of one tensor: a region keeps the share of them it holds, and the learner
    takes the lowest indices it may (inside ``within`` where given), as a perfect learner would."""
    calls = []

    def learn(k, within):
        pool = torch.arange(GRAFTABLE) if within is None else within["w"]
        calls.append((k, None if within is None else int(within["w"].numel())))
        return {"w": torch.sort(pool)[0][:k]}

    def share(region, k):
        held = int((region["w"] < needs).sum())
        return held / needs, held / needs

    return learn, share, calls


@pytest.mark.parametrize("k0, needs", [(10, 900), (10, 37), (5000, 900), (1, 1), (10, 10_000)])
def test_the_search_finds_the_smallest_k_that_keeps_the_target_within_its_resolution(k0, needs):
    learn, share, calls = made_up(needs)
    found = sizing.search(learn, share, k0, GRAFTABLE, 0.9)
    least = math.ceil(0.9 * needs)  # the true answer
    assert found.k is not None and least <= found.k
    short = [p.k for p in found.points if not p.keeps]
    assert not short or found.k == least or found.k <= sizing.RESOLUTION * max(short)
    assert found.k == min(p.k for p in found.points if p.keeps)  # the smallest region the curve holds that keeps it
    assert int(found.region["w"].numel()) == found.k and len(found.points) <= sizing.MAX_POINTS
    assert all(p.share >= 0.9 for p in found.points if p.keeps) and all(p.share < 0.9 for p in found.points
                                                                        if not p.keeps)
    for (k, inside), p in zip(calls, found.points):  # each smaller region learned inside a larger one that kept it
        assert (k, inside) == (p.k, p.inside)
        if inside is not None:
            assert inside > k and any(q.k == inside and q.keeps for q in found.points)
    record = found.record()
    assert record["k"] == found.k and [c["k"] for c in record["curve"]] == sorted(p.k for p in found.points)


def test_a_skill_no_region_holds_is_reported_with_what_was_tried_and_the_work_is_bounded():
    learn, _, calls = made_up(10)
    found = sizing.search(learn, lambda region, k: (0.1, 0.5), 10, GRAFTABLE, 0.9)
    assert found.k is None and found.region is None and found.reached_all
    assert [p.k for p in found.points] == [10, 40, 160, 640, 2560, GRAFTABLE]  # ×4 up to the whole set, then stop
    found = sizing.search(learn, lambda region, k: (0.1, 0.5), 1, 10 ** 12, 0.9)
    assert found.k is None and len(found.points) == sizing.MAX_POINTS and not found.reached_all
    found = sizing.search(learn, lambda region, k: (None, 0.5), 10, GRAFTABLE, 0.9)  # fine-tuning gained nothing
    assert found.k is None and len(found.points) == 1  # nothing to keep: no second localization


def test_the_search_stops_when_cancelled():
    import threading

    stop = threading.Event()
    learn, share, _ = made_up(900)

    def learn_then_stop(k, within):
        stop.set()
        return learn(k, within)

    from graftui.errors import Cancelled

    with pytest.raises(Cancelled):
        sizing.search(learn_then_stop, share, 10, GRAFTABLE, 0.9, cancel=stop)


def test_localize_keep_writes_the_smallest_region_whose_recorded_share_keeps_the_target(tiny_folders, tmp_path):
    out = tmp_path / "sized.safetensors"
    code, stdout, err = run_cli(*localize_args(tiny_folders, out, "--keep", "0.9", "--check-n", "40"))
    assert code == 0, err
    meta = regions.load(out).meta
    search = meta.size_search
    curve = search["curve"]
    kept = [p for p in curve if p["keeps"]]
    assert search["target"] == 0.9 and kept and len(curve) >= 2
    assert meta.k == search["k"] == min(p["k"] for p in kept) and regions.load(out).size == meta.k
    written = next(p for p in curve if p["k"] == meta.k)
    assert written["share"] >= 0.9
    assert all(p["share"] is None or p["share"] < 0.9 for p in curve if p["k"] < meta.k)
    assert meta.budget == "keep=0.9" and meta.sparsity == pytest.approx(meta.k / meta.graftable_params)
    assert "size search: the smallest region keeping 90.0% of the gain (accuracy" in stdout
    assert "✓ (written)" in stdout
    inside = [p for p in curve if p["inside"]]
    assert all(p["inside"] in {q["k"] for q in kept} for p in inside)  # learned inside a region that kept it
    if inside:
        assert "inside the larger region" in err


@pytest.mark.parametrize("more, line", [
    (("--keep", "0"), "--keep must be a share in (0, 1], e.g. 0.9 for 90 % of what fine-tuning gained; got 0"),
    (("--keep", "1.5"), "--keep must be a share in (0, 1], e.g. 0.9 for 90 % of what fine-tuning gained; got 1.5"),
    (("--keep", "nan"), "--keep must be a share in (0, 1], e.g. 0.9 for 90 % of what fine-tuning gained; got nan"),
    (("--keep", "0.9", "--check-n", "0"), "--keep scores each region it tries on held-out examples: give --check-n "
                                          "N > 0 (e.g. 200)")])
def test_a_bad_keep_is_one_line_before_any_work(tiny_folders, tmp_path, more, line):
    args = localize_args(tiny_folders, tmp_path / "r.safetensors")
    args = [a for i, a in enumerate(args) if a != "--check-n" and (i == 0 or args[i - 1] != "--check-n")]
    refused([*args, *more], line)
    assert not (tmp_path / "r.safetensors").exists()


def test_a_nested_schedule_learns_the_region_inside_one_ten_times_its_size(tiny_folders, tmp_path):
    out = tmp_path / "nested.safetensors"
    code, _, err = run_cli(*localize_args(tiny_folders, out, "--schedule", "nested", "--k", "30"))
    assert code == 0, err
    meta = regions.load(out).meta
    assert meta.k == 30 and meta.nested_from == 300 and meta.learner["rule"] == "within"
    assert meta.learner["plan"]["count"] == 300 and meta.request["schedule"] == "nested"
    lines = [line for line in err.splitlines() if line.startswith("nested: ")]
    assert lines[0].startswith("nested: k = 300 first: mask learning: candidate learner, C = 1,500 of ")
    assert lines[1].startswith("nested: k = 30 inside it: mask learning: candidate learner, C = 300 of ")
    refused([*localize_args(tiny_folders, tmp_path / "x.safetensors"), "--schedule", "deep"],
            "argument --schedule: invalid choice: 'deep' (choose from 'direct', 'nested') (see 'graftui localize "
            "--help')")
