"""GreedyPerfPartitioner: torchrec's greedy placement, with a heap so that it scales to thousands of ranks."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ..errors import ArgumentError, ArgumentTypeError
from .result import DeviceLoad, Plan
from .types import PlannerError, PlannerErrorKind, Shard, ShardingOption, Storage, Topology

__all__ = ["SORT_BY", "GreedyPerfPartitioner"]

SORT_BY = ("storage", "perf")
_FN = "GreedyPerfPartitioner.partition"


class _State:
    """Free storage and perf of every rank while planning, plus a heap of ranks by load.

    The heap holds ``(perf total, local rank, rank, version)``; a rank's entry is stale once its version
    has moved on, and stale entries are dropped when popped. Popping therefore visits the current ranks
    in exactly the order torchrec's heap of devices would, so the ties break the same way.
    """

    def __init__(self, topology: Topology) -> None:
        self.world_size = topology.world_size
        self.lws = topology.local_world_size
        self.cap = [d.storage for d in topology.devices]
        self.hbm = [d.storage.hbm for d in topology.devices]
        self.ddr = [d.storage.ddr for d in topology.devices]
        self.perf = [d.perf for d in topology.devices]
        self.total = [p.total for p in self.perf]
        self.version = [0] * self.world_size
        self.host_sum: list[float | None] = [None] * topology.num_hosts
        self.heap: list[tuple[float, int, int, int]] = []

    def build_heap(self) -> None:
        """Make the heap from the current loads (after the uniform options are placed)."""
        self.heap = [(self.total[r], r % self.lws, r, self.version[r]) for r in range(self.world_size)]
        heapq.heapify(self.heap)

    def take(self, rank: int, shard: Shard) -> None:
        """Put ``shard`` on ``rank`` (it must fit)."""
        self.hbm[rank] -= shard.storage.hbm
        self.ddr[rank] -= shard.storage.ddr
        perf = self.perf[rank] + shard.perf
        self.perf[rank] = perf
        self.total[rank] = perf.total
        self.version[rank] += 1
        self.host_sum[rank // self.lws] = None

    def fits(self, rank: int, shard: Shard) -> bool:
        """Whether ``shard`` fits in what ``rank`` has free."""
        return shard.storage.hbm <= self.hbm[rank] and shard.storage.ddr <= self.ddr[rank]

    def push(self, rank: int) -> None:
        """Enter ``rank``'s current load in the heap."""
        heapq.heappush(self.heap, (self.total[rank], rank % self.lws, rank, self.version[rank]))

    def largest_free(self) -> str:
        """The largest free hbm and ddr and where they are, for error messages."""
        bh = max(range(self.world_size), key=self.hbm.__getitem__)
        bd = max(range(self.world_size), key=self.ddr.__getitem__)
        return f"hbm {self.hbm[bh]} on rank {bh} and ddr {self.ddr[bd]} on rank {bd}"

    def hosts_by_perf(self) -> list[int]:
        """Host indexes, least loaded first (ranks' perf summed left to right as in torchrec; ties: lower)."""
        lws = self.lws
        for h, s in enumerate(self.host_sum):
            if s is None:
                total = 0.0
                for t in self.total[h * lws : (h + 1) * lws]:
                    total += t
                self.host_sum[h] = total
        sums = self.host_sum
        return sorted(range(len(sums)), key=lambda h: sums[h] or 0.0)

    def host_free(self, host: int) -> Storage:
        """What the ranks of ``host`` have free, summed."""
        lo, hi = host * self.lws, (host + 1) * self.lws
        return Storage(sum(self.hbm[lo:hi]), sum(self.ddr[lo:hi]))


def _solutions(*items: str) -> str:
    return "\nPossible solutions:\n" + "\n".join(f"  {i}. {t}" for i, t in enumerate(items, 1))


def _capacity_hint(topology: Topology) -> str:
    return (
        f"Give each rank more capacity (hbm_cap is {topology.hbm_cap}, ddr_cap is {topology.ddr_cap}) "
        "or make the shards smaller."
    )


def _check_proposal(options: Sequence[object], topology: Topology) -> list[ShardingOption]:
    """Check the proposal against the topology before anything is placed."""
    seen: set[str] = set()
    groups: dict[tuple[str, str], list[ShardingOption]] = {}
    checked: list[ShardingOption] = []
    for i, opt in enumerate(options):
        if not isinstance(opt, ShardingOption):
            raise ArgumentTypeError(
                f"{_FN}: proposal[{i}] is {type(opt).__name__}; expected a ShardingOption"
            )
        if opt.name in seen:
            raise ArgumentError(f"{_FN}: proposal has two options named {opt.name!r}; expected unique names")
        seen.add(opt.name)
        for shard in opt.shards:
            shard.on_device(topology.compute_device)
        n = len(opt.shards)
        if opt.partition_by == "uniform" and n != topology.world_size:
            raise ArgumentError(
                f"{_FN}: option {opt.name!r} has partition_by='uniform' and {n} shards; expected "
                f"{topology.world_size} (one per rank: the topology's world_size)"
            )
        if opt.partition_by == "host" and opt.within_host == "uniform" and n != topology.local_world_size:
            raise ArgumentError(
                f"{_FN}: option {opt.name!r} has partition_by='host', within_host='uniform' and {n} shards; "
                f"expected {topology.local_world_size} (one per rank of a host: local_world_size)"
            )
        if opt.partition_by != "uniform":
            groups.setdefault(opt.group, []).append(opt)
        checked.append(opt)
    for key, members in groups.items():
        if len(members) > 1 and any(m.partition_by != "host" for m in members):
            names = ", ".join(repr(m.name) for m in members)
            raise ArgumentError(
                f"{_FN}: options {names} share the dependency {key[1]!r}, and not all of them have "
                "partition_by='host'; expected only host options to be grouped (a device option is "
                "placed on its own)"
            )
    return checked


class GreedyPerfPartitioner:
    """Place shards on ranks greedily, balancing perf: torchrec's ``GreedyPerfPartitioner`` for mpicomm.

    1. ``"uniform"`` options first, in proposal order: shard i on rank i.
    2. The other options grouped by ``dependency`` (else by name), the groups sorted by total storage
       (``(hbm, ddr)``; or by perf with ``sort_by="perf"``), largest first, ties in proposal order.
    3. ``"device"`` options shard by shard onto the rank with the least perf that fits; ties go to the
       lowest local rank, then the lowest rank (so equal ranks fill host 0's first rank, host 1's first
       rank, ... before anyone's second rank).
    4. ``"host"`` groups onto the least-loaded host whose ranks have room, all shards within it.

    Each step costs O(log world_size) per shard, where torchrec re-sorted every rank for every shard.
    Host loads are summed left to right in rank order, as torchrec does, so near-ties round alike.

    Args:
        sort_by: ``"storage"`` (default) or ``"perf"``.

    Example:
        >>> topo = Topology(world_size=2, compute_device="cpu", ddr_cap=100)
        >>> opts = [ShardingOption(f"t{i}", "device", [Shard(Storage(0, 10), 1.0)]) for i in range(3)]
        >>> plan = GreedyPerfPartitioner().partition(opts, topo)
        >>> plan.ranks()
        {'t0': [0], 't1': [1], 't2': [0]}
        >>> [d.perf.total for d in plan.devices]
        [2.0, 1.0]
    """

    def __init__(self, sort_by: str = "storage") -> None:
        if sort_by not in SORT_BY:
            raise ArgumentError(
                f"GreedyPerfPartitioner: sort_by is {sort_by!r}; expected 'storage' or 'perf'"
            )
        self.sort_by = sort_by

    def partition(self, proposal: Sequence[ShardingOption], storage_constraint: Topology) -> Plan:
        """Place every shard of ``proposal`` on a rank of ``storage_constraint``.

        The topology is not changed. Each shard's ``rank`` is set only when the whole plan succeeds.

        Args:
            proposal: the sharding options.
            storage_constraint: the ranks and their capacity.

        Returns:
            The :class:`Plan`: the same option objects with ``shard.rank`` filled in, and each rank's
            used storage and perf.

        Raises:
            ArgumentTypeError: an argument of the wrong type.
            ArgumentError: duplicate names, a uniform option whose shard count is not the world size,
                device options that share a dependency.
            PlannerError: some shard fits nowhere (kind ``PARTITION``); the message says which option
                and shard, its size, the largest free space, and what to change.

        Example:
            >>> topo = Topology(world_size=2, compute_device="cpu", ddr_cap=10)
            >>> big = ShardingOption("big", "device", [Shard(Storage(0, 11))])
            >>> GreedyPerfPartitioner().partition([big], topo)
            Traceback (most recent call last):
            ...
            mpicomm.planner.types.PlannerError: GreedyPerfPartitioner.partition: option 'big' ...
        """
        if not isinstance(storage_constraint, Topology):
            got = type(storage_constraint).__name__
            raise ArgumentTypeError(f"{_FN}: storage_constraint is {got}; expected a Topology")
        if isinstance(proposal, (str, bytes)) or not isinstance(proposal, Sequence):
            raise ArgumentTypeError(
                f"{_FN}: proposal is {type(proposal).__name__}; expected a list of ShardingOption"
            )
        topology = storage_constraint
        options = _check_proposal(proposal, topology)
        state = _State(topology)
        placed: dict[str, list[int]] = {o.name: [-1] * len(o.shards) for o in options}
        for opt in options:
            if opt.partition_by == "uniform":
                self._uniform(state, opt, placed[opt.name], topology)
        state.build_heap()
        for members in self._sorted_groups(options):
            if members[0].partition_by == "device":
                self._device(state, members[0], placed[members[0].name], topology)
            else:
                self._host(state, members, placed, topology)
        for opt in options:
            for shard, rank in zip(opt.shards, placed[opt.name], strict=True):
                shard.rank = rank
        loads = [
            DeviceLoad(r, state.cap[r], state.cap[r] - Storage(state.hbm[r], state.ddr[r]), state.perf[r])
            for r in range(topology.world_size)
        ]
        return Plan(topology, list(options), loads)

    def _sorted_groups(self, options: list[ShardingOption]) -> list[list[ShardingOption]]:
        groups: dict[tuple[str, str], list[ShardingOption]] = {}
        for opt in options:
            if opt.partition_by != "uniform":
                groups.setdefault(opt.group, []).append(opt)
        ordered = list(groups.values())
        # list.sort is stable, also with reverse=True: equal groups keep proposal order
        if self.sort_by == "storage":
            ordered.sort(key=lambda g: sum((o.total_storage for o in g), Storage()), reverse=True)
        else:
            ordered.sort(key=lambda g: sum(o.total_perf for o in g), reverse=True)
        return ordered

    @staticmethod
    def _uniform(state: _State, opt: ShardingOption, out: list[int], topology: Topology) -> None:
        for rank, shard in enumerate(opt.shards):
            if not state.fits(rank, shard):
                free = Storage(state.hbm[rank], state.ddr[rank])
                raise PlannerError(
                    f"{_FN}: option {opt.name!r} (partition_by='uniform') shard {rank} of {len(opt.shards)} "
                    f"needs {shard.storage} on rank {rank}, which has {free} free."
                    + _solutions(
                        _capacity_hint(topology),
                        f"Use partition_by='device' for {opt.name!r}, so its shards may go to any rank.",
                        "Place fewer uniform options: every one of them takes room on every rank.",
                    ),
                    PlannerErrorKind.PARTITION,
                )
            state.take(rank, shard)
            out[rank] = rank

    @staticmethod
    def _device(state: _State, opt: ShardingOption, out: list[int], topology: Topology) -> None:
        heap, version = state.heap, state.version
        for j, shard in enumerate(opt.shards):
            hbm, ddr = shard.storage.hbm, shard.storage.ddr
            skipped: list[tuple[float, int, int, int]] = []
            chosen = -1
            while heap:
                entry = heapq.heappop(heap)
                rank = entry[2]
                if entry[3] != version[rank]:
                    continue  # stale: this rank's load changed since the entry was made
                if hbm <= state.hbm[rank] and ddr <= state.ddr[rank]:
                    chosen = rank
                    break
                skipped.append(entry)
            if len(skipped) * 4 > len(heap):
                heap.extend(skipped)
                heapq.heapify(heap)
            else:
                for entry in skipped:
                    heapq.heappush(heap, entry)
            if chosen < 0:
                raise PlannerError(
                    f"{_FN}: option {opt.name!r} (partition_by='device') shard {j} of {len(opt.shards)} "
                    f"needs {shard.storage}, which fits on no rank; the largest free space is "
                    f"{state.largest_free()}."
                    + _solutions(
                        f"Use more ranks (world_size is {topology.world_size}).",
                        _capacity_hint(topology),
                        f"Cut {opt.name!r} into more, smaller shards.",
                        f"Try another partition_by for {opt.name!r} (it is 'device'; 'uniform' puts one "
                        "shard on every rank).",
                    ),
                    PlannerErrorKind.PARTITION,
                )
            state.take(chosen, shard)
            state.push(chosen)
            out[j] = chosen

    @staticmethod
    def _try_host(state: _State, host: int, members: list[ShardingOption]) -> list[list[int]] | None:
        """Place the group's shards within ``host`` on a scratch copy; None if something does not fit."""
        lws, lo = state.lws, host * state.lws
        hbm, ddr = state.hbm[lo : lo + lws], state.ddr[lo : lo + lws]
        perf = state.perf[lo : lo + lws]
        result: list[list[int]] = []
        for opt in members:
            ranks: list[int] = []
            if opt.within_host == "uniform":
                for k, shard in enumerate(opt.shards):
                    if shard.storage.hbm > hbm[k] or shard.storage.ddr > ddr[k]:
                        return None
                    hbm[k] -= shard.storage.hbm
                    ddr[k] -= shard.storage.ddr
                    perf[k] = perf[k] + shard.perf
                    ranks.append(lo + k)
            else:
                heap = [(perf[k].total, k) for k in range(lws)]
                heapq.heapify(heap)
                for shard in opt.shards:
                    skipped = []
                    while heap:
                        entry = heapq.heappop(heap)
                        k = entry[1]
                        if shard.storage.hbm <= hbm[k] and shard.storage.ddr <= ddr[k]:
                            break
                        skipped.append(entry)
                    else:
                        return None
                    hbm[k] -= shard.storage.hbm
                    ddr[k] -= shard.storage.ddr
                    perf[k] = perf[k] + shard.perf
                    heapq.heappush(heap, (perf[k].total, k))
                    for entry in skipped:
                        heapq.heappush(heap, entry)
                    ranks.append(lo + k)
            result.append(ranks)
        return result

    def _host(
        self, state: _State, members: list[ShardingOption], placed: dict[str, list[int]], topology: Topology
    ) -> None:
        need = sum((o.total_storage for o in members), Storage())
        for host in state.hosts_by_perf():
            if not need.fits_in(state.host_free(host)):
                continue
            result = self._try_host(state, host, members)
            if result is None:
                continue
            for opt, ranks in zip(members, result, strict=True):
                for shard, rank in zip(opt.shards, ranks, strict=True):
                    state.take(rank, shard)
                placed[opt.name] = ranks
            for rank in sorted({r for ranks in result for r in ranks}):
                state.push(rank)
            return
        best = max(range(topology.num_hosts), key=state.host_free)
        lws = topology.local_world_size
        names = ", ".join(repr(o.name) for o in members)
        raise PlannerError(
            f"{_FN}: the host group {members[0].group[1]!r} (options {names}) needs {need} within one host "
            f"of {lws} ranks, and no host can hold its shards; the largest free space on one host is "
            f"{state.host_free(best)} on host {best} (ranks {best * lws}-{best * lws + lws - 1})."
            + _solutions(
                f"Use more ranks per host (local_world_size is {lws}) or more hosts.",
                _capacity_hint(topology),
                "Give fewer options the same dependency, so the group is smaller.",
                "Use partition_by='device' for these options, so their shards may go to any host.",
            ),
            PlannerErrorKind.PARTITION,
        )
