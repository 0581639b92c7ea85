"""The size a skill needs: the smallest region whose graft keeps a given share of what fine-tuning gained.

The paper fixes a budget; a skill learned with AdamW does not fit in the paper's budgets, and what a researcher asks
is how big it is. ``search`` answers over budgets k, each scored by ``share(region)`` on held-out examples: from the
request's budget it grows k (×4, each region learned afresh) until a region keeps the target, then shrinks it, each
smaller region learned inside the smallest one that kept it (its candidates: no ranking pass, no growth), first by
quarters and then by halving the ratio between the largest k that fell short and the smallest that kept it, until
that ratio is at most ``RESOLUTION``. So the search costs a few localizations, not one per budget, and every region it
reports lies inside the one before it. Its curve (share kept against k) is the answer's evidence.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

from .errors import Cancelled
from .method import Region

GROW = 4  # k × this while the region keeps too little
SHRINK = 4  # k ÷ this while no smaller region is known to fall short
RESOLUTION = 1.25  # stop where the smallest k that kept the target is at most this times the largest that fell short
MAX_POINTS = 10  # localizations at most: a request cannot start unbounded work
EXPECTED_POINTS = 6  # localizations a search usually takes (from a budget that keeps: ÷4 twice, then three halvings of
# the ratio): what a progress bar and a job's foreseen length count


@dataclass(frozen=True)
class Point:
    """One budget the search learned and scored."""

    k: int
    sparsity: float
    share: float | None  # the share of fine-tuning's gain the graft keeps (None: fine-tuning gained nothing)
    score: float | None  # the graft's own score on the held-out examples (the kind's: accuracy, exact match, …)
    inside: int | None  # the k of the region it was learned inside (None: the whole graftable set)
    keeps: bool  # share ≥ the target


@dataclass
class Found:
    """The search's answer: the smallest region that kept the target (None where none did), and the curve."""

    target: float
    points: list[Point]
    k: int | None
    region: Region | None
    reached_all: bool  # the search grew k to the whole graftable set

    def record(self) -> dict:
        """What a region file keeps of the search (``RegionMeta.size_search``)."""
        return {"target": self.target, "k": self.k, "resolution": RESOLUTION,
                "curve": [asdict(p) for p in sorted(self.points, key=lambda p: p.k)]}


def search(learn: Callable[[int, Region | None], Region], share: Callable[[Region, int], tuple[float | None, float | None]],
           k0: int, graftable: int, target: float, progress: Callable[[int, int, int | None], None] | None = None,
           cancel=None) -> Found:
    """The smallest k whose region keeps ``target`` of the gain (see the module's notes).

    ``learn(k, within)`` learns a region of k parameters, inside ``within`` where given; ``share(region, k)`` scores it:
    (share kept, its score), a share of None where fine-tuning gained nothing to keep (then the search stops at once).
    ``progress(i, k, inside)`` is told before each localization."""
    points: list[Point] = []
    kept: dict[int, Region] = {}
    shortfall = 0  # the largest k known to keep too little

    def visit(k: int, within: Region | None, inside: int | None) -> bool:
        if cancel is not None and cancel.is_set():
            raise Cancelled("the search over budgets was cancelled")
        if progress is not None:
            progress(len(points), k, inside)
        region = learn(k, within)
        got, score = share(region, k)
        keeps = got is not None and got >= target
        points.append(Point(k, k / graftable, got, score, inside, keeps))
        if keeps:
            kept[k] = region
        return keeps

    k = max(1, min(int(k0), graftable))
    while not visit(k, None, None) and points[-1].share is not None and k < graftable and len(points) < MAX_POINTS:
        shortfall = k
        k = min(graftable, k * GROW)
    if not kept:
        return Found(target, points, None, None, k >= graftable)
    shortfall = max([shortfall] + [p.k for p in points if not p.keeps and p.k < min(kept)])
    while len(points) < MAX_POINTS:
        best = min(kept)
        if shortfall:
            if best <= RESOLUTION * shortfall:
                break
            k = round(math.sqrt(best * shortfall))
        else:
            k = best // SHRINK
        if k < 1 or k >= best or k <= shortfall:
            break
        if not visit(k, kept[best], best):
            shortfall = k
    best = min(kept)
    return Found(target, points, best, kept[best], False)
