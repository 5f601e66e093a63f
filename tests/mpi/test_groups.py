"""Process groups: sub-groups, non-members, rank translation, node groups and destroyed groups."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm import ReduceOp


@pytest.fixture
def evens(world: mpicomm.ProcessGroup) -> Iterator[mpicomm.ProcessGroup]:
    """The group of the even world ranks (group rank k is world rank 2k), destroyed afterwards."""
    group = mpicomm.new_group(range(0, world.size(), 2))
    yield group
    mpicomm.destroy_process_group(group)


# ----------------------------------------------------------------------------- membership and ranks


@pytest.mark.mpi(min_size=1)
def test_new_group_of_even_ranks_has_sorted_members_and_ranks(world, evens):
    r = world.rank()
    assert evens.ranks == list(range(0, world.size(), 2))
    assert evens.is_member == (r % 2 == 0)
    if r % 2 == 0:
        assert mpicomm.get_rank(evens) == r // 2
        assert mpicomm.get_world_size(evens) == (world.size() + 1) // 2
    else:
        assert mpicomm.get_rank(evens) == -1
        assert mpicomm.get_world_size(evens) == -1
    assert mpicomm.get_rank() == r and mpicomm.get_world_size() == world.size()


@pytest.mark.mpi(min_size=1)
def test_get_group_rank_and_get_global_rank_translate_both_ways(world, evens):
    # rank translation works on every rank, members or not
    for k, g in enumerate(range(0, world.size(), 2)):
        assert mpicomm.get_group_rank(evens, g) == k
        assert mpicomm.get_global_rank(evens, k) == g
    for g in range(world.size()):
        assert mpicomm.get_group_rank(world, g) == g
        assert mpicomm.get_global_rank(world, g) == g


@pytest.mark.mpi(min_size=2)
def test_get_group_rank_of_a_non_member_is_refused(world, evens):
    with pytest.raises(mpicomm.ArgumentError, match="1, which is not part of group"):
        mpicomm.get_group_rank(evens, 1)
    with pytest.raises(mpicomm.ArgumentError, match="expected 0 <= group_rank <"):
        mpicomm.get_global_rank(evens, len(evens.ranks))


@pytest.mark.mpi(min_size=2)
def test_group_ranks_follow_sorted_world_ranks(world):
    w, r = world.size(), world.rank()
    g = mpicomm.new_group([w - 1, 0])
    assert g.ranks == [0, w - 1]
    if r in (0, w - 1):
        assert g.rank() == (0 if r == 0 else 1) and g.size() == 2
        x = np.array([float(r)])
        mpicomm.all_gather_into_tensor(out := np.empty(2), x, group=g)
        assert out.tolist() == [0.0, w - 1.0]
    mpicomm.destroy_process_group(g)


@pytest.mark.mpi(min_size=1)
def test_new_group_of_none_and_of_all_ranks_span_the_world(world, rng):
    data = rng.standard_normal((world.size(), 3))
    for g in (mpicomm.new_group(), mpicomm.new_group(list(range(world.size()))[::-1])):
        assert g.ranks == list(range(world.size())) and g.rank() == world.rank()
        x = data[world.rank()].copy()
        mpicomm.all_reduce(x, op=ReduceOp.MAX, group=g)
        np.testing.assert_array_equal(x, data.max(axis=0))
        mpicomm.destroy_process_group(g)


@pytest.mark.mpi(min_size=1)
def test_new_group_with_no_ranks_has_no_members(world):
    g = mpicomm.new_group([])
    assert not g.is_member and g.ranks == []
    with pytest.warns(UserWarning, match="not a member"):
        assert mpicomm.all_reduce(np.zeros(1), group=g) is None
    mpicomm.destroy_process_group(g)


# --------------------------------------------------------------------------- collectives in a group


@pytest.mark.mpi(min_size=1)
def test_collectives_inside_a_subgroup_reduce_over_members_only(world, rng, evens):
    w, r = world.size(), world.rank()
    members = evens.ranks
    data = rng.integers(-5, 6, (w, 4)).astype(np.int64)
    if not evens.is_member:
        return
    x = data[r].copy()
    mpicomm.all_reduce(x, group=evens)
    np.testing.assert_array_equal(x, data[members].sum(axis=0))
    y = data[r].copy()
    mpicomm.all_reduce(y, op=ReduceOp.AVG, group=evens)
    np.testing.assert_array_equal(y, np.trunc(data[members].sum(axis=0) / len(members)))
    outs = [np.empty(4, np.int64) for _ in members]
    mpicomm.all_gather(outs, data[r], group=evens)
    np.testing.assert_array_equal(np.stack(outs), data[members])
    mpicomm.barrier(group=evens)


@pytest.mark.mpi(min_size=1)
def test_src_and_dst_are_world_ranks_inside_a_subgroup(world, rng, evens):
    w, r = world.size(), world.rank()
    members = evens.ranks
    last = members[-1]  # a world rank; its group rank is len(members) - 1
    data = rng.standard_normal((w, 3))
    if not evens.is_member:
        return
    x = data[r].copy()
    mpicomm.broadcast(x, src=last, group=evens)
    np.testing.assert_array_equal(x, data[last])
    y = data[r].copy()
    mpicomm.reduce(y, dst=last, op=ReduceOp.MAX, group=evens)
    np.testing.assert_array_equal(y, data[members].max(axis=0) if r == last else data[r])
    outs = [np.empty(3) for _ in members] if r == last else None
    mpicomm.gather(data[r], outs, dst=last, group=evens)
    if r == last:
        np.testing.assert_array_equal(np.stack(outs), data[members])
    piece = np.empty(3)
    mpicomm.scatter(piece, [data[m] for m in members] if r == last else None, src=last, group=evens)
    np.testing.assert_array_equal(piece, data[r])


@pytest.mark.mpi(min_size=1)
def test_group_src_and_group_dst_are_group_ranks(world, rng, evens):
    w, r = world.size(), world.rank()
    members = evens.ranks
    k = len(members) - 1
    data = rng.standard_normal((w, 2))
    if not evens.is_member:
        return
    x = data[r].copy()
    mpicomm.broadcast(x, group_src=k, group=evens)
    np.testing.assert_array_equal(x, data[members[k]])
    y = data[r].copy()
    mpicomm.reduce(y, group_dst=k, group=evens)
    np.testing.assert_allclose(y, data[members].sum(axis=0) if r == members[k] else data[r])


@pytest.mark.mpi(min_size=3)
def test_src_outside_the_group_is_refused(world, evens):
    if not evens.is_member:
        return
    # evens is [0, 2, ...]: not the first ranks of the world, so src goes through translation
    with pytest.raises(mpicomm.ArgumentError, match="world rank 1, which is not part of group"):
        mpicomm.broadcast(np.zeros(2), src=1, group=evens)
    with pytest.raises(mpicomm.ArgumentError, match="group_dst is"):
        mpicomm.reduce(np.zeros(2), group_dst=evens.size(), group=evens)


@pytest.mark.mpi(min_size=1)
def test_scatter_reduce_scatter_and_all_to_all_inside_a_subgroup(world, rng, evens):
    w, r = world.size(), world.rank()
    members = evens.ranks
    n = len(members)
    data = rng.integers(0, 9, (w, n, 2)).astype(np.float64)  # data[i][k]: rank i's piece for member k
    if not evens.is_member:
        return
    k = evens.rank()
    out = np.empty(2)
    mpicomm.reduce_scatter(out, list(data[r]), group=evens)
    np.testing.assert_array_equal(out, data[members, k].sum(axis=0))
    mpicomm.reduce_scatter_tensor(out, data[r].reshape(-1), group=evens)
    np.testing.assert_array_equal(out, data[members, k].sum(axis=0))
    swapped = np.empty((n, 2))
    mpicomm.all_to_all_single(swapped, data[r], group=evens)
    np.testing.assert_array_equal(swapped, data[members, k])


@pytest.mark.mpi(min_size=1)
def test_overlapping_groups_keep_their_results_apart(world, rng):
    w, r = world.size(), world.rank()
    low = mpicomm.new_group(range(0, (w + 1) // 2))
    high = mpicomm.new_group(range(w // 2, w))  # shares the middle rank when w is odd
    data = rng.standard_normal((w, 3))
    x, y = data[r].copy(), data[r].copy()
    works = []
    if low.is_member:
        works.append(mpicomm.all_reduce(x, group=low, async_op=True))
    if high.is_member:
        works.append(mpicomm.all_reduce(y, group=high, async_op=True))
    for work in works:
        work.wait()
    if low.is_member:
        np.testing.assert_allclose(x, data[low.ranks].sum(axis=0))
    if high.is_member:
        np.testing.assert_allclose(y, data[high.ranks].sum(axis=0))
    mpicomm.destroy_process_group(high)
    mpicomm.destroy_process_group(low)


@pytest.mark.mpi(min_size=2)
def test_messages_on_different_groups_and_the_users_communicator_never_match(world):
    from mpi4py import MPI

    r = world.rank()
    twin = mpicomm.new_group()  # the same ranks as the world, its own communicator
    if r == 0:
        MPI.COMM_WORLD.Send([np.array([1.0]), MPI.DOUBLE], 1, 5)
        mpicomm.send(np.array([2.0]), dst=1, tag=5, group=twin)
        mpicomm.send(np.array([3.0]), dst=1, tag=5)
    elif r == 1:
        got = np.empty(1)
        mpicomm.recv(got, src=0, tag=5)
        assert got[0] == 3.0
        mpicomm.recv(got, src=0, tag=5, group=twin)
        assert got[0] == 2.0
        MPI.COMM_WORLD.Recv([got, MPI.DOUBLE], 0, 5)
        assert got[0] == 1.0
    mpicomm.destroy_process_group(twin)


# ---------------------------------------------------------------------------------------- non-members

NON_MEMBER_CALLS: dict[str, Callable[[Any, bool], Any]] = {
    "all_reduce": lambda g, a: mpicomm.all_reduce(np.zeros(2), group=g, async_op=a),
    "reduce": lambda g, a: mpicomm.reduce(np.zeros(2), group=g, async_op=a),
    "broadcast": lambda g, a: mpicomm.broadcast(np.zeros(2), group=g, async_op=a),
    "all_gather": lambda g, a: mpicomm.all_gather([np.zeros(2)], np.zeros(2), group=g, async_op=a),
    "all_gather_into_tensor": lambda g, a: mpicomm.all_gather_into_tensor(
        np.zeros(2), np.zeros(2), group=g, async_op=a
    ),
    "gather": lambda g, a: mpicomm.gather(np.zeros(2), [np.zeros(2)], group=g, async_op=a),
    "scatter": lambda g, a: mpicomm.scatter(np.zeros(2), [np.zeros(2)], group=g, async_op=a),
    "reduce_scatter": lambda g, a: mpicomm.reduce_scatter(np.zeros(2), [np.zeros(2)], group=g, async_op=a),
    "reduce_scatter_tensor": lambda g, a: mpicomm.reduce_scatter_tensor(
        np.zeros(2), np.zeros(2), group=g, async_op=a
    ),
    "all_to_all": lambda g, a: mpicomm.all_to_all([np.zeros(2)], [np.zeros(2)], group=g, async_op=a),
    "all_to_all_single": lambda g, a: mpicomm.all_to_all_single(
        np.zeros(2), np.zeros(2), group=g, async_op=a
    ),
    "barrier": lambda g, a: mpicomm.barrier(group=g, async_op=a),
}
P2P_CALLS: dict[str, Callable[[Any], Any]] = {
    "send": lambda g: mpicomm.send(np.zeros(2), dst=0, group=g),
    "isend": lambda g: mpicomm.isend(np.zeros(2), dst=0, group=g),
    "irecv": lambda g: mpicomm.irecv(np.zeros(2), src=0, group=g),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("name", list(NON_MEMBER_CALLS))
def test_collective_on_a_group_without_this_rank_warns_and_returns_none(world, name, async_op):
    solo = mpicomm.new_group([0])  # every rank but 0 is outside
    call = NON_MEMBER_CALLS[name]
    if world.rank() == 0:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a member gets no warning
            result = call(solo, async_op)
        assert (result is None) != async_op
        if async_op:
            assert result.wait()
    else:
        with pytest.warns(UserWarning, match=f"{name}: this rank is not a member of group"):
            assert call(solo, async_op) is None
    mpicomm.destroy_process_group(solo)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", list(P2P_CALLS))
def test_point_to_point_on_a_group_without_this_rank_warns_and_returns_none(world, name):
    solo = mpicomm.new_group([0])
    if world.rank() != 0:
        with pytest.warns(UserWarning, match=f"{name}: this rank is not a member"):
            assert P2P_CALLS[name](solo) is None
    mpicomm.destroy_process_group(solo)


@pytest.mark.mpi(min_size=2)
def test_recv_on_a_group_without_this_rank_warns_and_returns_minus_one(world):
    solo = mpicomm.new_group([0])
    if world.rank() != 0:
        with pytest.warns(UserWarning, match="recv: this rank is not a member"):
            assert mpicomm.recv(np.zeros(2), src=0, group=solo) == -1
    mpicomm.destroy_process_group(solo)


@pytest.mark.mpi(min_size=2)
def test_non_member_arrays_are_left_untouched(world, evens):
    if evens.is_member:
        mpicomm.all_reduce(np.ones(3), group=evens)
        return
    x = np.arange(3.0)
    with pytest.warns(UserWarning):
        mpicomm.all_reduce(x, group=evens)
    with pytest.warns(UserWarning):
        mpicomm.broadcast(x, group=evens)
    assert x.tolist() == [0.0, 1.0, 2.0]


# ----------------------------------------------------------------------------------------- node groups


@pytest.mark.mpi(min_size=1)
def test_new_node_group_holds_every_rank_on_one_machine(world, rng):
    node = mpicomm.new_node_group()
    assert node.is_member
    assert node.ranks == list(range(world.size()))  # every rank of this test runs on one host
    assert node.rank() == world.rank() and node.size() == world.size()
    data = rng.standard_normal((world.size(), 2))
    x = data[world.rank()].copy()
    mpicomm.all_reduce(x, op=ReduceOp.MIN, group=node)
    np.testing.assert_array_equal(x, data.min(axis=0))
    mpicomm.destroy_process_group(node)


@pytest.mark.mpi(min_size=1)
def test_new_node_group_of_a_subgroup_keeps_its_world_ranks(world, evens):
    if not evens.is_member:
        with pytest.raises(mpicomm.GroupError, match="not a member"):
            mpicomm.new_node_group(evens)
        return
    node = mpicomm.new_node_group(evens)
    assert node.ranks == evens.ranks and node.rank() == evens.rank()
    x = np.ones(1)
    mpicomm.all_reduce(x, group=node)
    assert x[0] == len(evens.ranks)
    mpicomm.destroy_process_group(node)


# ------------------------------------------------------------------------------------ destroyed groups


@pytest.mark.mpi(min_size=1)
def test_using_a_destroyed_group_raises_group_error(world):
    g = mpicomm.new_group(range(0, world.size(), 2))
    mpicomm.destroy_process_group(g)
    with pytest.raises(mpicomm.GroupError, match="was destroyed"):
        mpicomm.all_reduce(np.ones(2), group=g)
    with pytest.raises(mpicomm.GroupError, match="was destroyed"):
        mpicomm.broadcast(np.ones(2), group=g)
    with pytest.raises(mpicomm.GroupError, match="was destroyed"):
        mpicomm.get_rank(g)
    with pytest.raises(mpicomm.GroupError, match="was destroyed"):
        mpicomm.barrier(group=g, async_op=True)
    # the world and new groups keep working
    x = np.ones(1)
    mpicomm.all_reduce(x)
    assert x[0] == world.size()
    h = mpicomm.new_group()
    mpicomm.all_reduce(x, group=h)
    assert x[0] == world.size() ** 2
    mpicomm.destroy_process_group(h)


@pytest.mark.mpi(min_size=1)
def test_group_error_is_a_runtime_error(world):
    g = mpicomm.new_group()
    mpicomm.destroy_process_group(g)
    with pytest.raises(RuntimeError):
        mpicomm.all_gather_into_tensor(np.empty(world.size()), np.ones(1), group=g)


# ------------------------------------------------------------------------------------- argument forms


@pytest.mark.mpi(min_size=1)
def test_new_group_accepts_a_generator_of_ranks(world):
    # new_group's signature takes any Iterable[int]; a generator can be read only once
    g = mpicomm.new_group(r for r in range(world.size()))
    assert g.ranks == list(range(world.size()))
    assert g.rank() == world.rank()
    mpicomm.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_src_outside_a_group_of_the_first_ranks_is_named_as_a_world_rank(world):
    # a group of world ranks [0, k) must treat src as a world rank too, and say so when it is no member
    first = mpicomm.new_group([0])
    try:
        if first.is_member:
            with pytest.raises(mpicomm.ArgumentError, match="world rank 1, which is not part of group"):
                mpicomm.broadcast(np.zeros(2), src=1, group=first)
    finally:
        mpicomm.destroy_process_group(first)


@pytest.mark.mpi(min_size=1)
def test_numpy_integer_src_is_accepted_on_every_group(world, evens):
    src = np.int64(0)
    if evens.is_member:
        x = np.full(2, float(world.rank()))
        mpicomm.broadcast(x, src=src, group=evens)
        assert x.tolist() == [0.0, 0.0]
    y = np.full(2, float(world.rank()))
    mpicomm.broadcast(y, src=src)
    assert y.tolist() == [0.0, 0.0]


@pytest.mark.mpi(min_size=1)
def test_get_global_rank_accepts_numpy_integers_like_get_group_rank(world, evens):
    # get_group_rank(group, np.int64(0)) works; its inverse must too (or say it wants an int)
    assert mpicomm.get_group_rank(evens, np.int64(0)) == 0
    assert mpicomm.get_global_rank(evens, np.int64(0)) == 0
