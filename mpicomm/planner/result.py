"""What a partitioner returns: the options with their shards' ranks, and each rank's load."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import overload

from .types import Perf, ShardingOption, Storage, Topology

__all__ = ["DeviceLoad", "Plan"]


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


@dataclasses.dataclass(eq=False)
class Plan(Sequence[ShardingOption]):
    """A placement: every shard of every option has its ``rank`` set.

    It is also the list of :class:`ShardingOption` that torchrec's ``partition()`` returns: it
    iterates, has a ``len`` and indexes over :attr:`options`, and compares equal to that list.

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
