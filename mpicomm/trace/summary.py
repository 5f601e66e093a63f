"""The summary of a merged trace: per call and per call site, with the imbalance across ranks (as mpiP).

**Imbalance** of one collective call is the time its first rank to arrive waited for the last one:
the spread of the ranks' entry times, on the merged (aligned) clock. The same call on every rank is
found by its group and its sequence number among that group's collectives, which agree on every
member because MPI requires every member to make a communicator's collectives in the same order.
No exchange is added to the run: the entry times are recorded anyway, and the alignment's error is
half the shortest of a few round trips (microseconds on one network). Point-to-point calls are not
matched (their partners are not a group). The rank that arrives last most often, weighted by how
late, is the one holding the job back.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Line", "Summary", "summarise", "table"]


@dataclass
class Line:
    """The figures of one call name (or one call site): over every rank of the run."""

    name: str
    count: int = 0
    sent: int = 0
    recv: int = 0
    seconds: float = 0.0
    share: float = 0.0
    imbalance: float = 0.0
    matched: int = 0
    late: dict[int, float] = field(default_factory=dict)

    @property
    def mean_us(self) -> float:
        """The mean time of one call in microseconds."""
        return self.seconds / self.count * 1e6 if self.count else 0.0

    @property
    def last_rank(self) -> int:
        """The rank whose late arrivals cost the others most (-1: no call was matched)."""
        return max(self.late, key=lambda r: self.late[r]) if self.late else -1


@dataclass
class Summary:
    """A run's figures: per call name and per call site, and each rank's lateness."""

    ranks: int
    run_seconds: float
    calls: list[Line]
    sites: list[Line]
    late: dict[int, float]


def summarise(doc: dict[str, Any]) -> Summary:
    """The figures of a merged trace (:func:`mpicomm.trace.output.load`).

    Example:
        >>> e = lambda r, ts: {"ph": "X", "cat": "mpicomm", "name": "all_reduce", "pid": r, "ts": ts,
        ...     "dur": 250e3 - ts, "args": {"group": "world", "seq": 0, "sent": 8, "site": "a.py:3"}}
        >>> doc = {"traceEvents": [e(0, 0.0), e(1, 200e3)], "mpicomm": {"begin": {0: 0, 1: 0},
        ...     "end": {0: 1e6, 1: 1e6}}}
        >>> s = summarise(doc)
        >>> s.calls[0].count, round(s.calls[0].imbalance, 3), s.calls[0].last_rank
        (2, 0.2, 1)
    """
    meta = doc["mpicomm"]
    begin, end = meta["begin"], meta["end"]
    run = sum(end[r] - begin[r] for r in begin) / 1e6
    by_name: dict[str, Line] = {}
    by_site: dict[tuple[str, str], Line] = {}
    arrivals: dict[tuple[str, int], list[tuple[float, int, str]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") != "mpicomm":
            continue
        args, name, seconds = e["args"], e["name"], e["dur"] / 1e6
        for line in (
            by_name.setdefault(name, Line(name)),
            by_site.setdefault((args["site"], name), Line(name)),
        ):
            line.count += 1
            line.sent += args.get("sent", 0)
            line.recv += args.get("recv", 0)
            line.seconds += seconds
        if args.get("seq", -1) >= 0:
            arrivals[args["group"], args["seq"]].append((e["ts"], e["pid"], name))
    late: dict[int, float] = defaultdict(float)
    for entries in arrivals.values():
        if len(entries) < 2:
            continue
        first, last = min(entries), max(entries)
        spread = (last[0] - first[0]) / 1e6
        line = by_name[last[2]]
        line.imbalance += spread
        line.matched += 1
        line.late[last[1]] = line.late.get(last[1], 0.0) + spread
        late[last[1]] += spread
    for line in [*by_name.values(), *by_site.values()]:
        line.share = line.seconds / run if run > 0 else 0.0
    for (site, _), line in by_site.items():
        line.name = f"{line.name} at {site}"
    order = sorted(by_name.values(), key=lambda x: -x.seconds)
    sites = sorted(by_site.values(), key=lambda x: -x.seconds)
    return Summary(len(begin), run, order, sites, dict(late))


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _short_site(text: str) -> str:
    """``all_reduce at /long/path/prog.py:12 (main)`` as ``all_reduce at prog.py:12 (main)``."""
    call, _, site = text.partition(" at ")
    return f"{call} at {Path(site).name}" if site else call


def table(s: Summary, sites: int = 10) -> str:
    """The summary as text: the calls, the top ``sites`` call sites, the rank holding the job back."""
    head = f"{'call':<28}{'calls':>8}{'bytes sent':>13}{'time s':>11}{'mean us':>11}{'% run':>8}"
    head += f"{'imbalance s':>13}{'last rank':>11}"
    out = [f"mpicomm trace: {s.ranks} rank(s), {s.run_seconds:.3f} s of run summed over ranks", "", head]
    for x in s.calls:
        last = str(x.last_rank) if x.matched else "-"
        out.append(
            f"{x.name[:27]:<28}{x.count:>8}{_bytes(x.sent):>13}{x.seconds:>11.4f}{x.mean_us:>11.1f}"
            f"{100 * x.share:>8.2f}{x.imbalance:>13.4f}{last:>11}"
        )
    out += ["", f"{'call site':<60}{'calls':>8}{'time s':>11}{'mean us':>11}{'% run':>8}"]
    for x in s.sites[:sites]:
        site = _short_site(x.name)[:59]
        out.append(f"{site:<60}{x.count:>8}{x.seconds:>11.4f}{x.mean_us:>11.1f}{100 * x.share:>8.2f}")
    if s.late:
        worst = max(s.late, key=lambda r: s.late[r])
        total = sum(s.late.values())
        out += ["", f"holding the job back: rank {worst} (last to arrive for {s.late[worst]:.4f} s of the "
                f"{total:.4f} s the first ranks waited in collectives)"]  # fmt: skip
    return "\n".join(out)
