"""torch.distributed's set-up names and habits: init_process_group, destroy, group.WORLD, subgroups,
batch_isend_irecv, monitored_barrier, barrier(timeout=), ProcessGroup.rank()/size()."""

from __future__ import annotations

import contextlib
import datetime
import warnings

import numpy as np
import pytest

import mpicomm
import mpicomm as dist

# ----------------------------------------------------------------------------- groups and set-up


@pytest.mark.mpi(min_size=1)
def test_process_group_rank_and_size_are_methods(world):
    assert world.rank() == dist.get_rank() and world.size() == dist.get_world_size()
    evens = dist.new_group(range(0, world.size(), 2))
    member = world.rank() % 2 == 0
    assert evens.rank() == (world.rank() // 2 if member else -1)
    assert evens.size() == ((world.size() + 1) // 2 if member else -1)
    dist.destroy_process_group(evens)


@pytest.mark.mpi(min_size=1)
def test_init_process_group_twice_is_refused_as_in_torch(world):
    # a default group started by a first collective (or init()) is taken over, once
    with contextlib.suppress(dist.DefaultGroupError):  # an earlier test may have called it already
        dist.init_process_group("mpi")
    assert dist.group.WORLD is world
    with pytest.raises(
        ValueError, match="init_process_group: trying to initialize the default process group twice"
    ):
        dist.init_process_group("mpi")


@pytest.mark.mpi(min_size=1)
def test_destroy_then_calls_raise_until_init_process_group(world):
    w, r = world.size(), world.rank()
    dist.destroy_process_group()
    try:
        assert not dist.is_initialized() and dist.group.WORLD is None
        with pytest.raises(
            AssertionError, match=r"destroy_process_group: .*destroyed already.*cannot be None"
        ) as e:
            dist.destroy_process_group()  # a second one: torch asserts
        assert isinstance(e.value, dist.DefaultGroupError)
        with pytest.raises(
            dist.DefaultGroupError, match="all_reduce: the default process group was destroyed"
        ):
            dist.all_reduce(np.ones(2))
        with pytest.raises(ValueError, match=r"get_rank: .*destroyed by destroy_process_group"):
            dist.get_rank()
        with pytest.raises(mpicomm.ArgumentError, match="backend is 'nosuch'; expected one of"):
            dist.init_process_group("nosuch")
        with pytest.raises(mpicomm.ArgumentError, match=r"store is .*expected None"):
            dist.init_process_group(store=object())
    finally:
        # the MPI launch decides, as for torch's MPI backend: a disagreeing world_size warns
        with pytest.warns(UserWarning, match=rf"world_size is {w + 1}, and the MPI launch gives {w}"):
            dist.init_process_group(
                backend="mpi",
                init_method="env://",
                timeout=datetime.timedelta(seconds=60),
                world_size=w + 1,
                rank=r,
            )
    x = np.full(2, float(r))
    dist.all_reduce(x)
    assert x.tolist() == [w * (w - 1) / 2] * 2
    assert dist.group.WORLD is dist.init() and dist.GroupMember.WORLD is dist.init()


@pytest.mark.mpi(min_size=1)
def test_backend_availability_and_ranks(world):
    assert dist.is_available() and dist.is_mpi_available()
    assert dist.get_backend() == "mpi" and dist.get_backend(world) == "mpi"
    assert dist.get_process_group_ranks(world) == list(range(world.size()))
    odds = dist.new_group(range(1, world.size(), 2))
    assert dist.get_process_group_ranks(odds) == list(range(1, world.size(), 2))
    if odds.is_member:
        assert dist.get_backend(odds) == "mpi"
        assert odds != dist.GroupMember.NON_GROUP_MEMBER
    else:
        assert odds == dist.GroupMember.NON_GROUP_MEMBER
        with pytest.raises(mpicomm.ArgumentError, match="get_backend: this rank is not a member"):
            dist.get_backend(odds)
    dist.destroy_process_group(odds)


@pytest.mark.mpi(min_size=1)
def test_get_node_local_rank_reads_the_launcher(world, monkeypatch):
    for name in ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PMI_LOCAL_RANK", raising=False)
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    assert dist.get_node_local_rank(fallback_rank=5) == 5
    with pytest.raises(RuntimeError, match="get_node_local_rank: none of LOCAL_RANK"):
        dist.get_node_local_rank()
    monkeypatch.setenv("MPI_LOCALRANKID", "3")
    assert dist.get_node_local_rank() == 3
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dist.get_node_local_rank(fallback_rank=5) == 1


@pytest.mark.mpi(min_size=1)
def test_new_group_takes_torch_arguments(world):
    g = dist.new_group(
        list(range(world.size())), timeout=datetime.timedelta(minutes=5), backend="mpi", group_desc="everyone"
    )
    assert g.name == "everyone" and g.size() == world.size()
    x = np.ones(1)
    dist.all_reduce(x, group=g)
    assert x[0] == world.size()
    dist.destroy_process_group(g)
    with pytest.raises(mpicomm.ArgumentError, match="new_group: backend is 'nosuch'"):
        dist.new_group(backend="nosuch")
    with pytest.raises(mpicomm.ArgumentTypeError, match="new_group: timeout is 'soon'"):
        dist.new_group(timeout="soon")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("validate", [False, True])
def test_new_group_with_local_synchronization_is_called_by_members_only(world, validate):
    w, r = world.size(), world.rank()
    if r < 2:  # ranks 2.. never call it (validation mode made no exchange over the world for it)
        mpicomm.set_validation(validate)
        try:
            pair = dist.new_group([0, 1], use_local_synchronization=True)
        finally:
            mpicomm.set_validation(False)
        x = np.array([float(r + 1)])
        dist.all_reduce(x, group=pair)
        assert x[0] == 3.0 and pair.ranks == [0, 1] and pair.rank() == r
        dist.destroy_process_group(pair)
    dist.barrier()
    assert w >= 2


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("group_size", [1, "world"])
def test_new_subgroups_cuts_consecutive_ranks(world, group_size):
    w, r = world.size(), world.rank()
    k = w if group_size == "world" else 1
    mine, every = dist.new_subgroups(k)
    assert len(every) == w // k and [g.ranks for g in every] == [
        list(range(i, i + k)) for i in range(0, w, k)
    ]
    assert mine is every[r // k] and mine.rank() == r % k
    x = np.array([float(r)])
    dist.all_reduce(x, group=mine)
    assert x[0] == sum(range(r // k * k, r // k * k + k))
    for g in every:
        dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=1)
def test_new_subgroups_default_size_is_ranks_per_node(world):
    mine, every = dist.new_subgroups()
    node = dist.new_node_group()
    assert mine.size() == node.size() and len(every) == world.size() // node.size()
    for g in [*every, node]:
        dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=1)
def test_new_subgroups_refuses_sizes_that_do_not_divide(world):
    w = world.size()
    with pytest.raises(
        mpicomm.ArgumentError, match=rf"group_size is {w + 1}; expected a positive divisor of {w}"
    ):
        dist.new_subgroups(w + 1)
    with pytest.raises(mpicomm.ArgumentError, match="group_size is 0"):
        dist.new_subgroups(0)


@pytest.mark.mpi(min_size=1)
def test_new_subgroups_by_enumeration_pairs(world):
    w, r = world.size(), world.rank()
    lists = [list(range(i, min(i + 2, w))) for i in range(0, w, 2)]
    mine, every = dist.new_subgroups_by_enumeration(lists)
    assert mine is not None and mine.ranks == lists[r // 2] and len(every) == len(lists)
    for g in every:
        dist.destroy_process_group(g)
    with pytest.raises(mpicomm.ArgumentError, match="rank 0 is in subgroup 0 and in subgroup 1"):
        dist.new_subgroups_by_enumeration([[0], [0]])
    with pytest.raises(
        mpicomm.ArgumentError, match="ranks_per_subgroup_list is \\[\\]; expected a non-empty"
    ):
        dist.new_subgroups_by_enumeration([])


@pytest.mark.mpi(min_size=2)
def test_new_subgroups_by_enumeration_leaves_unlisted_ranks_out(world):
    mine, every = dist.new_subgroups_by_enumeration([[1]])
    assert (mine is None) == (world.rank() != 1) and every[0].ranks == [1]
    dist.destroy_process_group(every[0])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", ["halves", "round robin", "one list"])
def test_split_group_makes_this_ranks_subgroup_with_one_split(world, rng, shape):
    w, r = world.size(), world.rank()
    if shape == "halves":
        lists = [list(range(w // 2)), list(range(w // 2, w))] if w > 1 else [[0]]
    elif shape == "round robin":
        lists = [list(range(i, w, 3))[::-1] for i in range(min(3, w))]  # unsorted on purpose
    else:
        lists = [list(range(w))]
    mine = dist.split_group(split_ranks=lists, group_desc="part")
    expected = sorted(next(ranks for ranks in lists if r in ranks))
    assert mine.ranks == expected and mine.rank() == expected.index(r) and mine.size() == len(expected)
    assert mine.name == "part" and mine.backend == world.backend
    data = rng.standard_normal((w, 4))  # the same on every rank: the shared seed
    x = data[r].copy()
    dist.all_reduce(x, group=mine)
    np.testing.assert_allclose(x, data[expected].sum(axis=0), rtol=1e-12)
    dist.destroy_process_group(mine)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("validate", [False, True])
def test_split_group_takes_the_same_subgroups_listed_in_another_order_on_some_ranks(world, validate):
    w, r = world.size(), world.rank()
    halves = [list(range(w // 2)), list(range(w // 2, w))]
    lists = halves[::-1] if r % 2 else halves  # the same split, listed the other way round on odd ranks
    mpicomm.set_validation(validate)
    try:
        mine = dist.split_group(split_ranks=lists)
    finally:
        mpicomm.set_validation(False)
    expected = halves[0] if r < w // 2 else halves[1]
    assert mine.ranks == expected and mine.size() == len(expected)
    x = np.array([float(r)])
    dist.all_reduce(x, group=mine)
    assert x[0] == sum(expected)
    dist.destroy_process_group(mine)


@pytest.mark.mpi(min_size=3)
def test_split_group_of_a_subgroup_takes_its_group_ranks_and_leaves_unlisted_ranks_out(world):
    w, r = world.size(), world.rank()
    parent = dist.new_group(range(1, w))  # world rank g is group rank g - 1
    if parent.is_member:
        mine = dist.split_group(parent, [[0, parent.size() - 1]], timeout=datetime.timedelta(seconds=7))
        if r in (1, w - 1):
            assert mine.ranks == [1, w - 1] and mine.timeout == 7.0
            x = np.array([float(r)])
            dist.all_reduce(x, group=mine)
            assert x[0] == 1.0 + (w - 1)
            dist.destroy_process_group(mine)
        else:
            assert mine is None
    else:
        with pytest.raises(mpicomm.ArgumentError, match=r"split_group: parent_pg is .* not a member"):
            dist.split_group(parent, [[0]])
    dist.destroy_process_group(parent)


@pytest.mark.mpi(min_size=1)
def test_split_group_refuses_bad_lists_before_any_mpi_call(world):
    w = world.size()
    cases = [
        (None, mpicomm.ArgumentTypeError, r"split_group: split_ranks is None; expected a non-empty list"),
        ([range(0)], mpicomm.ArgumentError, r"split_ranks\[0\] is range\(0, 0\); expected a non-empty list"),
        ([[True]], mpicomm.ArgumentTypeError, r"split_ranks\[0\] is \[True\]; expected a list of integers"),
        ([], mpicomm.ArgumentError, r"split_ranks is \[\]; expected a non-empty list"),
        ([[0], []], mpicomm.ArgumentError, r"split_ranks\[1\] is \[\]; expected a non-empty list"),
        (
            [[0, w]],
            mpicomm.ArgumentError,
            rf"split_ranks\[0\] has {w}; expected group .* ranks 0 <= rank < {w}",
        ),
        ([[0, 0]], mpicomm.ArgumentError, r"split_ranks\[0\] \[0, 0\] lists a rank twice"),
        ([[0], [0]], mpicomm.ArgumentError, "rank 0 is in subgroup 0 and in subgroup 1"),
        ([["0"]], mpicomm.ArgumentTypeError, r"split_ranks\[0\] is \['0'\]; expected a list of integers"),
        ([[0]], mpicomm.ArgumentTypeError, "group_desc is 3"),
    ]
    for lists, cls, message in cases:
        with pytest.raises(cls, match=message):
            dist.split_group(split_ranks=lists, group_desc=3 if "group_desc" in message else None)
    with pytest.raises(
        mpicomm.ArgumentTypeError,
        match=r"split_group: parent_pg is a str; expected a mpicomm\.ProcessGroup or None",
    ):
        dist.split_group("world", [[0]])


# ----------------------------------------------------------------------------- point to point


@pytest.mark.mpi(min_size=1)
def test_batch_isend_irecv_ring_both_ways(world):
    w, r = world.size(), world.rank()
    rng = np.random.default_rng(14)
    data = rng.standard_normal((w, 6))
    left, right = np.empty(6), np.empty(6)
    if w == 1:
        return
    ops = [
        dist.P2POp(dist.isend, data[r].copy(), (r + 1) % w),
        dist.P2POp(dist.isend, data[r].copy(), (r - 1) % w, tag=1),
        dist.P2POp(dist.irecv, left, (r - 1) % w),
        dist.P2POp(dist.irecv, right, group_peer=(r + 1) % w, tag=1),
    ]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 4
    for work in works:
        work.wait()
    np.testing.assert_array_equal(left, data[(r - 1) % w])
    np.testing.assert_array_equal(right, data[(r + 1) % w])


@pytest.mark.mpi(min_size=2)
def test_batch_isend_irecv_checks_every_op_before_posting(world):
    w, r = world.size(), world.rank()
    good = dist.P2POp(dist.isend, np.ones(2), (r + 1) % w)
    frozen = np.ones(2)
    frozen.flags.writeable = False
    with pytest.raises(
        mpicomm.ArgumentError, match=r"batch_isend_irecv: p2p_op_list\[1\]: tensor .*read-only"
    ):
        dist.batch_isend_irecv([good, dist.P2POp(dist.irecv, frozen, (r - 1) % w)])
    with pytest.raises(mpicomm.ArgumentTypeError, match=r"p2p_op_list\[0\] is 3; expected a mpicomm.P2POp"):
        dist.batch_isend_irecv([3])
    with pytest.raises(mpicomm.ArgumentError, match="p2p_op_list is \\[\\]; expected a non-empty list"):
        dist.batch_isend_irecv([])
    with pytest.raises(
        mpicomm.ArgumentTypeError, match=r"P2POp: op is .*expected mpicomm.isend or mpicomm.irecv"
    ):
        dist.P2POp(print, np.ones(1), 0)
    other = dist.new_group()
    with pytest.raises(mpicomm.ArgumentError, match="different groups"):
        dist.batch_isend_irecv([good, dist.P2POp(dist.isend, np.ones(1), (r + 1) % w, group=other)])
    dist.destroy_process_group(other)
    dist.barrier()  # nothing was posted: a message left behind would be received here by the next test


# ----------------------------------------------------------------------------- barriers


@pytest.mark.mpi(min_size=1)
def test_monitored_and_timed_barriers_pass_when_everyone_comes(world):
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    dist.monitored_barrier(world, 60.0, wait_all_ranks=True)
    dist.barrier(timeout=60)
    with pytest.raises(mpicomm.ArgumentTypeError, match="barrier: timeout is 'x'"):
        dist.barrier(timeout="x")
    with pytest.raises(mpicomm.ArgumentError, match="monitored_barrier: timeout is -1"):
        dist.monitored_barrier(timeout=-1)


@pytest.mark.mpi(min_size=2)
def test_monitored_barrier_names_the_rank_that_did_not_come(world):
    r = world.rank()
    dist.barrier()
    if r != 1:  # rank 1 skips it; every other rank raises, naming world rank 1
        with pytest.raises(
            RuntimeError, match=r"monitored_barrier: world ranks \[1\] of group world did not arrive"
        ):
            dist.monitored_barrier(timeout=4)
    dist.barrier()
    dist.monitored_barrier(timeout=60)  # a late message from the failed round must not confuse this one


@pytest.mark.mpi(min_size=1)
def test_non_member_calls_warn_and_do_nothing(world):
    odds = dist.new_group(range(1, world.size(), 2))
    if not odds.is_member:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist.monitored_barrier(odds)
            dist.batch_isend_irecv([dist.P2POp(dist.isend, np.ones(1), 1, group=odds)])
        assert len(caught) == 2
    dist.destroy_process_group(odds)
