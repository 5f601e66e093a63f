"""Plain-text views of a plan: the per-rank table and the load chart."""

from __future__ import annotations

from collections.abc import Sequence

from .layout import RankLayout
from .result import Plan

__all__ = ["shard_names", "format_bytes", "format_layout_table", "format_load_chart", "format_plan_table"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int) -> str:
    """``n`` bytes with a binary unit, three significant digits.

    Example:
        >>> format_bytes(1000), format_bytes(1536), format_bytes(32 * 1024**3)
        ('1000 B', '1.50 KiB', '32.0 GiB')
    """
    value, unit = float(n), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{n} B"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} {_UNITS[unit]}"


def shard_names(pairs: list[tuple[str, int]], width: int = 0) -> str:
    """``[("t", 0), ("t", 2), ("u", 1)]`` -> ``"t[0,2],u[1]"``, cut to ``width`` characters (0: no cut)."""
    grouped: dict[str, list[str]] = {}
    for name, i in pairs:
        grouped.setdefault(name, []).append(str(i))
    text = ",".join(f"{name}[{','.join(ix)}]" for name, ix in grouped.items()) or "-"
    return text if not width or len(text) <= width else text[: width - 3] + "..."


def _storage(used: int, cap: int) -> str:
    return f"{format_bytes(used)}/{format_bytes(cap)}"


def _align(rows: Sequence[Sequence[str]], left: set[int]) -> str:
    """Columns two spaces apart, a rule under the header; numbers right-aligned, columns in ``left`` not."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, row in enumerate(rows):
        cells = [
            c.ljust(w) if (i in left or j == 0) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_plan_table(plan: Plan, layout: RankLayout, shards_width: int = 40) -> str:
    """One row per rank: rank, node, GPU, shards (``name[index]``), hbm and ddr used/capacity, perf.

    Example:
        >>> from mpicomm.planner import *
        >>> topo = Topology(world_size=2, compute_device="cpu", ddr_cap=100)
        >>> plan = GreedyPerfPartitioner().partition(
        ...     [ShardingOption("t", "device", [Shard(Storage(0, 10), 1.0)])], topo)
        >>> print(format_plan_table(plan, RankLayout.from_shape(JobShape.from_topology(topo))))
        rank  node   gpu  shards  hbm used/cap  ddr used/cap  perf
        ----  -----  ---  ------  ------------  ------------  ----
           0  node0    -  t[0]         0 B/0 B    10 B/100 B     1
           1  node0    -  -            0 B/0 B     0 B/100 B     0
    """
    by_rank = plan.shards_by_rank()
    rows = [("rank", "node", "gpu", "shards", "hbm used/cap", "ddr used/cap", "perf")]
    for d in plan.devices:
        p = layout.ranks[d.rank]
        rows.append(
            (
                str(d.rank),
                p.node_name,
                "-" if p.gpu is None else str(p.gpu),
                shard_names(by_rank[d.rank], shards_width),
                _storage(d.used.hbm, d.capacity.hbm),
                _storage(d.used.ddr, d.capacity.ddr),
                f"{d.perf.total:g}",
            )
        )
    return _align(rows, left={1, 3})  # node and shards read better left-aligned


def format_load_chart(plan: Plan, width: int = 40) -> str:
    """A bar per rank: perf (``#``) scaled to the busiest rank, and the larger of its hbm and ddr use.

    Example:
        >>> from mpicomm.planner import *
        >>> topo = Topology(world_size=2, compute_device="cpu", ddr_cap=100)
        >>> opts = [ShardingOption(f"t{i}", "device", [Shard(Storage(0, 10), 1.0)]) for i in range(3)]
        >>> print(format_load_chart(GreedyPerfPartitioner().partition(opts, topo), width=10))
        perf per rank (# = 0.2; storage: share of capacity used)
        rank 0 |##########| 2  storage 20%
        rank 1 |#####     | 1  storage 10%
    """
    top = max((d.perf.total for d in plan.devices), default=0.0)
    scale = top / width if top > 0 else 1.0
    label = len(str(len(plan.devices) - 1))
    lines = [f"perf per rank (# = {scale:.3g}; storage: share of capacity used)"]
    for d in plan.devices:
        n = round(d.perf.total / scale) if top > 0 else 0
        shares = [u / c for u, c in ((d.used.hbm, d.capacity.hbm), (d.used.ddr, d.capacity.ddr)) if c]
        share = f"{100 * max(shares):.0f}%" if shares else "-"
        lines.append(
            f"rank {str(d.rank).rjust(label)} |{'#' * n}{' ' * (width - n)}| "
            f"{d.perf.total:g}  storage {share}"
        )
    return "\n".join(lines)


def format_layout_table(layout: RankLayout) -> str:
    """One row per rank: rank, node index and name, local rank, GPU and CPUs.

    Example:
        >>> from mpicomm.planner import JobShape, RankLayout
        >>> shape = JobShape(nodes=2, ntasks_per_node=1, cpus_per_task=2)
        >>> print(format_layout_table(RankLayout.from_shape(shape)))
        rank  node     local  gpu  cpus
        ----  -------  -----  ---  ----
           0  0 node0      0    -  0-1
           1  1 node1      0    -  0-1
    """
    rows = [("rank", "node", "local", "gpu", "cpus")]
    for p in layout.ranks:
        cpus = f"{p.cpus[0]}-{p.cpus[-1]}" if len(p.cpus) > 1 else str(p.cpus[0])
        gpu = "-" if p.gpu is None else str(p.gpu)
        rows.append((str(p.rank), f"{p.node_index} {p.node_name}", str(p.local_rank), gpu, cpus))
    return _align(rows, left={1, 4})
