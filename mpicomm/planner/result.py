"""What a partitioner returns: the options with their shards' ranks, and each rank's load."""

from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass
class Plan:
    """A placement: every shard of every option has its ``rank`` set.

    Attributes:
        topology: the ranks planned for.
        options: the sharding options, in the order they were given, with ranks filled in.
        devices: one :class:`DeviceLoad` per rank.
    """

    topology: Topology
    options: list[ShardingOption]
    devices: list[DeviceLoad]

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
