"""The live mask-learning plot and the anatomy heatmap say what their numbers are, and stay readable when narrow."""

from __future__ import annotations

import pytest

from graftui import figures


def _run(k: int, sizes: list[int], n: int = 64, start: float = 0.71, end: float = 0.72, ft: float = 0.75,
         bare: float = 0.56) -> list[dict]:
    held = {"ft": ft, "bare": bare, "n": n}
    return ([{"heldout": {"step": 0, "model": "top-movement start", "accuracy": start, **held}}]
            + [{"step": i, "loss": 0.7, "accuracy": 0.6, "region_size": s} for i, s in enumerate(sizes, 1)]
            + [{"heldout": {"step": len(sizes), "model": "this region", "accuracy": end, **held}}])


def _texts(fig) -> list[str]:
    return [a.text or "" for a in fig.layout.annotations]


def test_the_held_out_diamonds_are_named_apart_from_the_dotted_lines():
    fig = figures.localize_progress(_run(100, [90, 95, 99]), k=100)
    texts = _texts(fig)
    assert "top-movement start 71.0%" in texts and "learned region 72.0%" in texts, texts
    assert {"fine-tuned 75.0%", "empty region 56.0%"} <= set(texts)
    assert fig.data[-1].name == "held-out" and list(fig.data[-1].y) == [0.71, 0.72]
    named = [a for a in fig.layout.annotations if a.text in ("top-movement start 71.0%", "learned region 72.0%")]
    # each name sits below the lines and their labels (the lowest at 56 %), at its own height, pointing at its diamond
    heights = [a.ay for a in named]
    assert all(h < 0.56 - figures.LABEL_ROOM for h in heights) and heights[0] != heights[1], heights
    assert [a.x for a in named] == [0, 3] and all(a.showarrow for a in named)
    refs = {a.text: a for a in fig.layout.annotations if a.text in ("fine-tuned 75.0%", "empty region 56.0%")}
    assert refs["fine-tuned 75.0%"].yanchor == "bottom" and refs["empty region 56.0%"].yanchor == "top"  # apart
    assert fig.layout.showlegend and {d.name for d in fig.data} >= {"loss per batch", "γ ≥ 0.5 count", "held-out"}


def test_with_no_room_below_or_above_the_names_sit_beside_the_diamonds():
    assert figures._label_heights([0.2, 0.9]) is None
    fig = figures.localize_progress(_run(100, [90], start=0.3, end=0.35, ft=0.9, bare=0.2), k=100)
    assert list(fig.data[-1].text) == ["top-movement start 30.0%", "learned region 35.0%"]
    assert "text" in fig.data[-1].mode and list(fig.data[-1].textposition) == ["middle right", "middle left"]


def test_a_count_above_k_is_said_to_be_expected_and_a_small_sample_too_small():
    over = _texts(figures.localize_progress(_run(100, [90, 130, 150], n=16), k=100))
    assert any("above k is expected" in t and "top k of ℓ" in t for t in over), over
    assert any("n = 16 (±24 pts)<br>too few to tell" in t for t in over), over
    under = _texts(figures.localize_progress(_run(100, [90, 95], n=200), k=100))
    assert not any("above k is expected" in t for t in under), under
    assert any("n = 200 (±7 pts)" in t and "too few" not in t for t in under), under
    from graftui.formatting import resolution
    assert resolution(16) == pytest.approx(0.245)


def test_a_long_job_title_takes_two_lines():
    title = "Localize 'movies' in minilm-movies · Learned (paper) · sparsity 1.0e-03"
    fig = figures.localize_progress(_run(100, [90]), k=100, title=title)
    assert fig.layout.title.text == "Localize 'movies' in minilm-movies · Learned (paper)<br>sparsity 1.0e-03"


def test_heatmap_numbers_are_short_enough_for_a_narrow_cell():
    assert [figures.compact_count(v) for v in (0, 987, 1000, 1234, 9999, 10_500, 123_456, 1_200_000)] == \
        ["0", "987", "1k", "1.2k", "10k", "10k", "123k", "1.2M"]

    class Anatomy:  # the fields anatomy_heatmap reads
        layers, modules = ["layer 0", "pooler"], ["query", "other"]
        counts, totals = [[1234, 0], [0, 98_765]], [[4096, 0], [4096, 100_000]]
        density = [[1234 / 4096, 0.0], [0.0, 0.98765]]

    fig = figures.anatomy_heatmap(Anatomy(), "counts")
    assert [list(r) for r in fig.data[0].text] == [["1.2k", "–"], ["0", "99k"]]
    assert len(fig.layout.title.text) <= 45 and fig.data[0].colorbar.thickness == 10  # a phone keeps both
    dens = figures.anatomy_heatmap(Anatomy(), "density")
    assert [list(r) for r in dens.data[0].text] == [["30%", "–"], ["0%", "99%"]] and len(dens.layout.title.text) <= 45
