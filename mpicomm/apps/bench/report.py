"""The benchmark's text: result tables and target verdicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from .harness import Point, fmt_bw, fmt_size, fmt_time

HEAD = ("op", "size/rank", "A", "t A", "B", "t B", "busbw A", "busbw B", "A/B", "quiet", "check")


WIDTHS = (29, 9, 7, 8, 7, 8, 8, 8, 6, 5, 5)


def row(p: Point) -> tuple[str, ...]:
    """A point as table cells: times, busbw in GB/s, the ratio, quiet samples of all, the check."""
    quiet = f"{sum(p.quiet_a) + sum(p.quiet_b)}/{len(p.quiet_a) + len(p.quiet_b)}"
    t_a, t_b, check = fmt_time(p.t_a), fmt_time(p.t_b), "ok" if p.check else "FAIL"
    bw_a, bw_b = fmt_bw(p.busbw(p.t_a)), fmt_bw(p.busbw(p.t_b))
    return (p.op, fmt_size(p.size), p.a, t_a, p.b, t_b, bw_a, bw_b, f"{p.ratio:.3f}", quiet, check)


def line(cells: Sequence[str], widths: Sequence[int]) -> str:
    """Cells padded to the widths, two spaces apart."""
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def table(points: list[Point]) -> str:
    """The summary table, one row per point, columns as wide as their widest cell."""
    rows = [HEAD, *map(row, points)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    return "\n".join(line(r, widths) for r in rows)


def target(
    points: list[Point], text: str, op: str | None, size: int, limit: float, at_least: bool = False
) -> dict[str, Any]:
    """One target's verdict: the worst ratio among its points, and every point over the limit.

    ``op`` None: every op against raw mpi4py at >= ``size``; else that op at ``size`` (or above it
    with ``at_least``).
    """
    if op is None:
        got = [p for p in points if p.b == "mpi4py" and p.a != p.b and p.size >= size]
    else:
        got = [p for p in points if p.op == op and (p.size >= size if at_least else p.size == size)]
    worst = max(got, key=lambda p: p.ratio, default=None)
    return {
        "target": text,
        "limit": limit,
        "worst": None if worst is None else worst.ratio,
        "worst_at": None if worst is None else f"{worst.op} {fmt_size(worst.size)}",
        "missed": [f"{p.op} {fmt_size(p.size)} ({p.ratio:.3f})" for p in got if p.ratio > limit],
        "reached": None if worst is None else worst.ratio <= limit,
    }


def target_lines(goals: list[dict[str, Any]]) -> str:
    """Target verdicts as text."""
    lines = []
    for g in goals:
        verdict = {None: "not measured", True: "reached", False: "NOT reached"}[g["reached"]]
        worst = "" if g["worst"] is None else f" (worst {g['worst']:.3f} at {g['worst_at']})"
        lines.append(f"{verdict:<13} {g['target']}{worst}")
        lines.extend(f"{'':<13}   missed: {m}" for m in g["missed"])
    return "\n".join(lines)
