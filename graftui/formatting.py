"""How numbers and plain-text tables are written, for every front end alike.

Two styles of percentage, each with its use: ``pct(x)`` for table cells ("12.3%", with as many
digits as keep a small share non-zero: "0.0034%"), and ``pct(x, digits, spaced=True)`` for
sentences ("95 %"). A value that is not there is written as ``missing``.
"""

from __future__ import annotations

import re
from typing import Sequence

from .metrics import in_points


def pct(x: float | None, digits: int | None = None, *, spaced: bool = False, missing: str = "–") -> str:
    """``x`` (a fraction) as a percentage; ``digits`` None: adaptive (12.3%, 1.23%, 0.0034%)."""
    if x is None:
        return missing
    value = 100 * x
    sign = " %" if spaced else "%"
    if digits is not None:
        return f"{value:.{digits}f}{sign}"
    if value == 0:
        return f"0{sign}"
    if abs(value) >= 10:
        return f"{value:.1f}{sign}"
    if abs(value) >= 1:
        return f"{value:.2f}{sign}"
    return f"{value:.2g}{sign}"


def num(x: float | None, digits: int = 3, missing: str = "-") -> str:
    """A number with fixed digits."""
    return missing if x is None else f"{x:.{digits}f}"


def count(n: int | None, missing: str = "-") -> str:
    """A whole number with thousands separators."""
    return missing if n is None else f"{int(n):,}"


ONE_OF = {"seeds": "seed", "fine-tunes": "fine-tune", "runs": "run"}  # what replicates are, and one of them


def memory(n: float) -> str:
    """Bytes as a person reads them: "812 KB", "5.31 GB"."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GB" else f"{n / size:.0f} {unit}"
    return f"{int(n)} bytes"


def one_line(text: str, width: int = 0) -> str:
    """A text on one line (its line breaks written as ⏎), cut to ``width`` characters when given."""
    flat = text.replace("\r\n", "\n").replace("\n", "⏎")
    return flat if not width or len(flat) <= width else flat[:width - 3] + "..."


def score_text(x: float | None, share: bool, digits: int = 1, missing: str = "–") -> str:
    """A score as it is read: a share of the examples as a percentage, any other (a perplexity, a BLEU) as the plain
    number it is."""
    if x is None:
        return missing
    return pct(x, digits) if share else f"{x:.3f}"


def change_text(x: float, share: bool) -> str:
    """A change of a score, signed: in percentage points for a share, else a plain difference."""
    return pts(x) if share else _signed(x, 3)


def pts(x: float) -> str:
    """A difference of two accuracies in percentage points, signed."""
    return f"{100 * x:+.1f} pts"


def _signed(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}".replace("-", "−")


def difference_value(d: dict, between: str = "") -> str:
    """The number of a paired difference and its interval, "+3.2 pts [+0.9, +5.4]" (accuracy) or
    "−0.012 [−0.020, −0.004]" (ECE); "+1.8 ± 0.9 pts" over seeds; ``between`` goes before the interval."""
    scale, digits, unit = (100, 1, " pts") if in_points(d) else (1, 3, "")
    spread = f" ± {scale * d['diff_std']:.{digits}f}" if (d.get("seeds") or 1) > 1 and d.get("diff_std") is not None else ""
    lo, hi = d["ci"]
    return (f"{_signed(scale * d['diff'], digits)}{spread}{unit}{between} "
            f"[{_signed(scale * lo, digits)}, {_signed(scale * hi, digits)}]")


SMALL_N = 100  # test examples below which a single run's check is too small to tell most models apart


def resolution(n: int) -> float:
    """The widest 95 % half-width of a share (accuracy, exact match) measured on ``n`` examples (at 50 %, normal
    approximation): how far apart two models must score before ``n`` examples tell them apart."""
    return 1.96 * 0.5 / max(n, 1) ** 0.5


def undecided(d: dict) -> str:
    """Why a paired difference whose interval holds zero tells nothing: too few replicates, or, on a single run,
    n examples, with how large a difference of shares that many could tell at best where they are few (an interval
    of [+0.0, +0.0] on 16 examples says the two agreed on each, not that they are equal)."""
    m, over, n = d.get("seeds") or 1, d.get("over", "seeds"), d.get("n") or 0
    if m > 1:
        return f"not distinguishable across {m} {over}"
    words = f"not distinguishable at n = {n:,}"
    if n < SMALL_N and in_points(d):
        words += f", too few to tell apart differences under about ±{100 * resolution(n):.0f} pts"
    return words


def difference(d: dict, said: str = "") -> str:
    """A paired difference with its interval: "+3.2 pts [+0.9, +5.4]" for accuracy, "−0.012 [−0.020, −0.004]"
    for ECE, then ``said`` (" over top-movement"), then ": not distinguishable at n = 500" where the
    interval holds zero. Over several seeds or fine-tunes (``diff_std``, ``over``): "+1.8 ± 0.9 pts over 3 seeds
    [t-interval]" and in how many of them the paired interval alone excludes zero."""
    lo, hi = d["ci"]
    m = d.get("seeds") or 1
    over = d.get("over", "seeds")  # or "fine-tunes", or "runs" (fine-tunes × seeds): each a replicate
    text = difference_value(d, f" over {m} {over}" if m > 1 else "") + said
    if m > 1:
        text += f" (each {ONE_OF.get(over, over)}'s paired interval excludes zero in {d.get('distinguishable_in', 0)} of {m})"
    if lo > 0 or hi < 0:
        return text
    return f"{text}: {undecided(d)}"


def minutes(seconds: float) -> str:
    """A duration as people read it: seconds under 90 s, minutes above."""
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _looks_numeric(text: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d,]*\.?\d+(e[-+]?\d+)?%?|-", text.strip()))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """An aligned plain-text table; numeric columns are right-aligned unless ``align`` says otherwise."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if align is None:
        align = "".join("r" if cells and all(_looks_numeric(r[i]) for r in cells) else "l" for i in range(len(headers)))

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if a == "r" else v.ljust(w) for v, w, a in zip(values, widths, align)).rstrip()

    return "\n".join([line(list(headers)), "  ".join("-" * w for w in widths), *(line(r) for r in cells)])


def pairs_table(items: Sequence[tuple[str, object]]) -> str:
    """``key  value`` lines with the keys aligned."""
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in items)


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table (reports and model cards)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
