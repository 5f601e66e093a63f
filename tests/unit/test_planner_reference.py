"""The heap-based partitioner plans exactly what a plain re-sort-every-rank implementation plans.

The reference below follows shared/reference/semantics.md §3 step by step, without any heap or cache:
for every shard it sorts all ranks by (perf total, local rank, rank) and takes the first that fits;
host groups recompute every host's load from scratch. Small integer sizes and perfs make ties common,
so the tie-breaking is exercised on almost every example.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpicomm.planner import (
    GreedyPerfPartitioner,
    Perf,
    PlannerError,
    Shard,
    ShardingOption,
    Storage,
    Topology,
)


def _left_sum(xs: Any) -> float:
    """torchrec's host total: a plain left-to-right float sum."""
    total = 0.0
    for x in xs:
        total += x
    return total


def reference_partition(options: list[ShardingOption], topo: Topology, sort_by: str) -> dict[str, list[int]]:
    """Plain greedy placement; raises PlannerError when something does not fit."""
    W, lws = topo.world_size, topo.local_world_size
    free = [d.storage for d in topo.devices]
    perf = [d.perf for d in topo.devices]
    out: dict[str, list[int]] = {}

    def put(rank: int, shard: Shard, free: list[Storage], perf: list[Perf]) -> None:
        free[rank] = free[rank] - shard.storage
        perf[rank] = perf[rank] + shard.perf

    for o in options:
        if o.partition_by == "uniform":
            for r, s in enumerate(o.shards):
                if not s.storage.fits_in(free[r]):
                    raise PlannerError("uniform")
                put(r, s, free, perf)
            out[o.name] = list(range(W))
    groups: dict[tuple[str, str], list[ShardingOption]] = {}
    for o in options:
        if o.partition_by != "uniform":
            groups.setdefault(("dependency", o.dependency) if o.dependency else ("name", o.name), []).append(
                o
            )

    def key(g: list[ShardingOption]) -> Any:
        if sort_by == "storage":
            st_ = Storage()
            for o in g:
                for s in o.shards:
                    st_ = st_ + s.storage
            return st_
        return sum(sum(s.perf.total for s in o.shards) for o in g)

    for g in sorted(groups.values(), key=key, reverse=True):
        if g[0].partition_by == "device":
            ranks = []
            for s in g[0].shards:
                order = sorted(range(W), key=lambda r: (perf[r].total, r % lws, r))
                fit = [r for r in order if s.storage.fits_in(free[r])]
                if not fit:
                    raise PlannerError("device")
                put(fit[0], s, free, perf)
                ranks.append(fit[0])
            out[g[0].name] = ranks
            continue
        need = Storage()
        for o in g:
            need = need + o.total_storage
        hosts = sorted(
            range(W // lws), key=lambda h: _left_sum(perf[r].total for r in range(h * lws, h * lws + lws))
        )
        for h in hosts:
            members = range(h * lws, h * lws + lws)
            host_free = Storage(sum(free[r].hbm for r in members), sum(free[r].ddr for r in members))
            if not need.fits_in(host_free):
                continue
            f2, p2 = list(free), list(perf)
            got: dict[str, list[int]] = {}
            try:
                for o in g:
                    got[o.name] = []
                    for k, s in enumerate(o.shards):
                        if o.within_host == "uniform":
                            r = h * lws + k
                            if not s.storage.fits_in(f2[r]):
                                raise PlannerError("host uniform")
                        else:
                            fit = [
                                r
                                for r in sorted(members, key=lambda r: (p2[r].total, r))
                                if s.storage.fits_in(f2[r])
                            ]
                            if not fit:
                                raise PlannerError("host device")
                            r = fit[0]
                        put(r, s, f2, p2)
                        got[o.name].append(r)
            except PlannerError:
                continue
            free[:], perf[:] = f2, p2
            out.update(got)
            break
        else:
            raise PlannerError("host group")
    return out


@st.composite
def problems(draw: st.DrawFn) -> tuple[list[ShardingOption], Topology, str]:
    lws = draw(st.integers(1, 3))
    hosts = draw(st.integers(1, 3))
    W = lws * hosts
    cap = draw(st.integers(4, 30))
    topo = Topology(W, local_world_size=lws, compute_device="cpu", hbm_cap=cap, ddr_cap=cap)
    options = []
    for i in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["uniform", "device", "device", "host", "host"]))
        within = draw(st.sampled_from(["device", "uniform"])) if kind == "host" else "device"
        n = W if kind == "uniform" else lws if within == "uniform" else draw(st.integers(1, 4))
        sizes = st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 4))
        shards = [Shard(Storage(h, d), float(p)) for h, d, p in draw(st.lists(sizes, min_size=n, max_size=n))]
        dep = draw(st.sampled_from([None, None, "g0", "g1"])) if kind == "host" else None
        options.append(ShardingOption(f"o{i}", kind, shards, dependency=dep, within_host=within))
    return options, topo, draw(st.sampled_from(["storage", "perf"]))


@settings(max_examples=300, deadline=None)
@given(problems())
def test_heap_partitioner_matches_the_plain_reference(
    problem: tuple[list[ShardingOption], Topology, str],
) -> None:
    options, topo, sort_by = problem
    try:
        want: dict[str, list[int]] | None = reference_partition(options, topo, sort_by)
    except PlannerError:
        want = None
    if want is None:
        with pytest.raises(PlannerError):
            GreedyPerfPartitioner(sort_by).partition(options, topo)
    else:
        got = GreedyPerfPartitioner(sort_by).partition(options, topo)
        assert got.ranks() == want


def test_reference_agrees_on_a_larger_random_problem() -> None:
    from mpicomm.planner.scale import make_problem

    options, topo = make_problem(options=150, shards_per_option=4, world_size=48, seed=3)
    got = GreedyPerfPartitioner().partition(options, topo).ranks()
    assert got == reference_partition(options, topo, "storage")
