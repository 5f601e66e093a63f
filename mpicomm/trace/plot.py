"""The PNG of a merged trace: time in each call on each rank, and the imbalance (the ``[plot]`` extra)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .summary import summarise

__all__ = ["plot"]

#: The most calls drawn (the ones that took the most time).
TOP = 12


def plot(doc: dict[str, Any], path: str) -> None:
    """Write a bar chart of the seconds each rank spent in each call, one bar per rank, to ``path``.

    The calls are ordered by their total time; a hatched bar beside each call's group is the time
    the first ranks waited for the last one (the summary's imbalance).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summarise(doc)
    names = [x.name for x in s.calls[:TOP]]
    seconds: dict[tuple[str, int], float] = defaultdict(float)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "mpicomm":
            seconds[e["name"], e["pid"]] += e["dur"] / 1e6
    ranks = sorted(doc["mpicomm"]["begin"])
    width = 0.8 / (len(ranks) + 1)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.6), dpi=90)
    for k, r in enumerate(ranks):
        ys = [i + k * width for i in range(len(names))]
        ax.barh(ys, [seconds[n, r] for n in names], height=width, label=f"rank {r}")
    ys = [i + len(ranks) * width for i in range(len(names))]
    ax.barh(ys, [x.imbalance for x in s.calls[:TOP]], height=width, color="none", edgecolor="black",
            hatch="//", label="imbalance")  # fmt: skip
    ax.set_yticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds in the call")
    ax.set_title(f"mpicomm trace: {s.ranks} ranks, {s.run_seconds / max(s.ranks, 1):.2f} s per rank")
    ax.legend(fontsize="small", loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
