"""What a partitioner returns: the options with their shards' ranks, and each rank's load."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import overload

from .types import Perf, ShardingOption, Storage, Topology

__all__ = ["DeviceLoad", "Plan"]

# options, and ranks per option, that print(plan) lists
_SHOWN = 8


def _size(n: int) -> str:
    """``n`` bytes with a binary unit and three significant digits (``3.00 MiB``)."""
    value, units = float(n), ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    unit = 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    if unit == 0:
        return f"{n} B"
    return f"{value:#.3g}".rstrip(".") + f" {units[unit]}"


@dataclasses.dataclass(frozen=True)
class DeviceLoad:
    """One rank after planning.

    Attributes:
        rank: the rank.
        capacity: what it could hold.
        used: what its shards occupy.
        perf: the sum of its shards' perf.
    """

    rank: int
    capacity: Storage
    used: Storage
    perf: Perf

    @property
    def free(self) -> Storage:
        """``capacity - used``."""
        return self.capacity - self.used


@dataclasses.dataclass(eq=False, repr=False)
class Plan(Sequence[ShardingOption]):
    """A placement: every shard of every option has its ``rank`` set.

    It is also the list of :class:`ShardingOption` that torchrec's ``partition()`` returns: it
    iterates, has a ``len`` and indexes over ``options``, and compares equal to that list.
    ``print(plan)`` gives a short summary (shards, ranks, load balance, memory, each option's ranks);
    :func:`~mpicomm.planner.format_plan_table` the full per-rank table.

    Example:
        >>> from mpicomm.planner import GreedyPerfPartitioner, Shard, ShardingOption, Topology
        >>> plan = GreedyPerfPartitioner().partition(
        ...     [ShardingOption("t0", "device", [Shard(storage=1, perf=1)])], Topology(world_size=2))
        >>> len(plan), plan[0].name, [o.ranks for o in plan]
        (1, 't0', [[0]])

    Attributes:
        topology: the ranks planned for.
        options: the sharding options, in the order they were given, with ranks filled in.
        devices: one :class:`DeviceLoad` per rank.
    """

    topology: Topology
    options: list[ShardingOption]
    devices: list[DeviceLoad]

    @overload
    def __getitem__(self, index: int) -> ShardingOption: ...

    @overload
    def __getitem__(self, index: slice) -> list[ShardingOption]: ...

    def __getitem__(self, index: int | slice) -> ShardingOption | list[ShardingOption]:
        return self.options[index]

    def __len__(self) -> int:
        return len(self.options)

    def __iter__(self) -> Iterator[ShardingOption]:
        return iter(self.options)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Plan):
            return (self.topology, self.options, self.devices) == (
                other.topology,
                other.options,
                other.devices,
            )
        if isinstance(other, list):
            return self.options == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Plan(world_size={self.topology.world_size}, options={len(self.options)}, "
            f"shards={self.num_shards})"
        )

    def __str__(self) -> str:
        """A summary of a few lines, whatever the size of the plan.

        Example:
            >>> from mpicomm.planner import GreedyPerfPartitioner, Shard, ShardingOption, Storage, Topology
            >>> topo = Topology(world_size=2, compute_device="cpu", ddr_cap=1 << 30)
            >>> opts = [ShardingOption("t", "device", [Shard(Storage(0, 1 << 20), 2.0)] * 1),
            ...         ShardingOption("u", "uniform", [Shard(Storage(0, 1 << 20), 1.0) for _ in range(2)])]
            >>> print(GreedyPerfPartitioner().partition(opts, topo))
            Plan: 3 shards of 2 options on 2 ranks (cpu)
              perf per rank: min 1, max 3 (max/mean 1.5)
              memory used: hbm 0 B, ddr 3.00 MiB of 2.00 GiB (0%)
              t: rank 0
              u: ranks 0, 1
        """
        perf = [d.perf.total for d in self.devices] or [0.0]
        mean = sum(perf) / len(perf)
        ratio = f"{max(perf) / mean:.3g}" if mean else "-"
        used = sum((d.used for d in self.devices), Storage(0, 0))
        cap = sum((d.capacity for d in self.devices), Storage(0, 0))
        share = f" ({100 * used.ddr // cap.ddr}%)" if cap.ddr else ""
        lines = [
            f"Plan: {self.num_shards} shards of {len(self.options)} options on {self.topology.world_size} "
            f"ranks ({self.topology.compute_device})",
            f"  perf per rank: min {min(perf):g}, max {max(perf):g} (max/mean {ratio})",
            f"  memory used: hbm {_size(used.hbm)}, ddr {_size(used.ddr)} of {_size(cap.ddr)}{share}",
        ]
        for o in self.options[:_SHOWN]:
            ranks = [r for r in o.ranks if r is not None]
            shown = ", ".join(map(str, ranks[:_SHOWN])) + (
                f", ... ({len(ranks)} shards)" if len(ranks) > _SHOWN else ""
            )
            lines.append(f"  {o.name}: rank{'s' if len(ranks) != 1 else ''} {shown}")
        if len(self.options) > _SHOWN:
            lines.append(f"  ... and {len(self.options) - _SHOWN} more options")
        return "\n".join(lines)

    @property
    def num_shards(self) -> int:
        """How many shards the plan places."""
        return sum(len(o.shards) for o in self.options)

    def ranks(self) -> dict[str, list[int | None]]:
        """``{option name: [rank of shard 0, rank of shard 1, ...]}``."""
        return {o.name: o.ranks for o in self.options}

    def shards_on(self, rank: int) -> list[tuple[str, int]]:
        """The ``(option name, shard index)`` pairs placed on ``rank``, in option order."""
        return [(o.name, i) for o in self.options for i, s in enumerate(o.shards) if s.rank == rank]

    def shards_by_rank(self) -> list[list[tuple[str, int]]]:
        """:meth:`shards_on` for every rank at once (one pass over the shards)."""
        out: list[list[tuple[str, int]]] = [[] for _ in range(self.topology.world_size)]
        for o in self.options:
            for i, s in enumerate(o.shards):
                if s.rank is not None:
                    out[s.rank].append((o.name, i))
        return out
