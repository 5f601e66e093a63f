"""send, recv, isend and irecv between ranks: rings, any-source receives, tags and group ranks.

Tests run back to back with no barrier in between, so a rank may already send the next test's message
while another still receives this test's. Every any-source receive therefore uses a tag no other test
sends with; receives from a named source are ordered by MPI's non-overtaking rule.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpicomm


def messages(rng: np.random.Generator, w: int, shape: tuple[int, ...] = (3, 2)) -> np.ndarray:
    """One distinct message per rank, the same on every rank."""
    return rng.standard_normal((w, *shape))


@pytest.mark.mpi(min_size=2)
def test_blocking_ring_passes_each_message_to_the_right(world, rng):
    w, r = world.size(), world.rank()
    data = messages(rng, w)
    left, right = (r - 1) % w, (r + 1) % w
    got = np.empty_like(data[r])
    # rank 0 sends first and every other rank receives first, so the ring never deadlocks
    if r == 0:
        assert mpicomm.send(data[r], dst=right) is None
        assert mpicomm.recv(got, src=left) == left
    else:
        assert mpicomm.recv(got, src=left) == left
        mpicomm.send(data[r], dst=right)
    np.testing.assert_array_equal(got, data[left])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "dtype", [np.int32, np.bool_, np.float16, np.complex128, np.dtype(">f8")], ids=lambda d: np.dtype(d).str
)
def test_nonblocking_ring_exchanges_both_ways(world, rng, dtype):
    w, r = world.size(), world.rank()
    data = (rng.integers(0, 2, (w, 2, 4)) * 3 + np.arange(w)[:, None, None]).astype(dtype)
    left, right = (r - 1) % w, (r + 1) % w
    from_left, from_right = np.empty_like(data[r]), np.empty_like(data[r])
    works = [
        mpicomm.irecv(from_left, src=left, tag=1),
        mpicomm.irecv(from_right, src=right, tag=2),
        mpicomm.isend(data[r], dst=right, tag=1),
        mpicomm.isend(data[r], dst=left, tag=2),
    ]
    assert all(isinstance(wk, mpicomm.Work) for wk in works)
    assert [wk.wait() for wk in works] == [True] * 4
    np.testing.assert_array_equal(from_left, data[left])
    np.testing.assert_array_equal(from_right, data[right])
    assert works[0].result()[0] is from_left
    assert works[2].result() == []


@pytest.mark.mpi(min_size=2)
def test_recv_from_any_source_returns_the_senders_world_rank(world, rng):
    w, r = world.size(), world.rank()
    data = messages(rng, w, (4,))
    if r == 0:
        seen = []
        for _ in range(w - 1):
            got = np.empty(4)
            src = mpicomm.recv(got, tag=21)
            np.testing.assert_array_equal(got, data[src])
            seen.append(src)
        assert sorted(seen) == list(range(1, w))
    else:
        mpicomm.send(data[r], dst=0, tag=21)


@pytest.mark.mpi(min_size=2)
def test_irecv_from_any_source_reports_source_rank(world, rng):
    w, r = world.size(), world.rank()
    data = messages(rng, w, (2,))
    if r == 0:
        bufs = [np.empty(2) for _ in range(w - 1)]
        works = [mpicomm.irecv(b, tag=22) for b in bufs]
        sources = [wk.source_rank() for wk in works]
        assert sorted(sources) == list(range(1, w))
        for b, src in zip(bufs, sources, strict=True):
            np.testing.assert_array_equal(b, data[src])
    else:
        mpicomm.isend(data[r], dst=0, tag=22).wait()


@pytest.mark.mpi(min_size=2)
def test_irecv_from_a_given_source_reports_that_rank(world, rng):
    w, r = world.size(), world.rank()
    data = messages(rng, w, (3,))
    if r == 1:
        mpicomm.send(data[1], dst=0, tag=9)
    elif r == 0:
        got = np.empty(3)
        work = mpicomm.irecv(got, src=1, tag=9)
        assert work.source_rank() == 1
        np.testing.assert_array_equal(got, data[1])


@pytest.mark.mpi(min_size=2)
def test_tags_select_messages_regardless_of_send_order(world, rng):
    r = world.rank()
    data = messages(rng, 3, (5,))
    if r == 0:
        works = [mpicomm.isend(data[k], dst=1, tag=10 + k) for k in range(3)]
        for wk in works:
            wk.wait()
    elif r == 1:
        for k in (2, 0, 1):  # receive in an order different from the send order
            got = np.empty(5)
            assert mpicomm.recv(got, src=0, tag=10 + k) == 0
            np.testing.assert_array_equal(got, data[k])


@pytest.mark.mpi(min_size=2)
def test_send_accepts_non_contiguous_and_multi_dim_arrays(world, rng):
    w, r = world.size(), world.rank()
    mats = rng.standard_normal((w, 4, 6))
    if r == 0:
        for dst in range(1, w):
            mpicomm.send(mats[dst][::2, 1::2], dst=dst)
    else:
        got = np.empty((2, 3))
        mpicomm.recv(got, src=0)
        np.testing.assert_array_equal(got, mats[r][::2, 1::2])


@pytest.mark.mpi(min_size=3)
def test_group_dst_and_group_src_address_ranks_of_a_subgroup(world, rng):
    w, r = world.size(), world.rank()
    odds = mpicomm.new_group(range(1, w, 2)) if w >= 4 else mpicomm.new_group([1, 2])
    data = messages(rng, w, (2,))
    if odds.is_member and odds.size() >= 2:
        left = (odds.rank() - 1) % odds.size()
        right = (odds.rank() + 1) % odds.size()
        got = np.empty(2)
        works = [
            mpicomm.irecv(got, group=odds, group_src=left),
            mpicomm.isend(data[r], group=odds, group_dst=right),
        ]
        for wk in works:
            wk.wait()
        # the source is reported as a world rank, the data is the left group member's
        assert works[0].source_rank() == odds.ranks[left]
        np.testing.assert_array_equal(got, data[odds.ranks[left]])
    mpicomm.destroy_process_group(odds)


@pytest.mark.mpi(min_size=3)
def test_recv_in_a_subgroup_returns_world_ranks(world, rng):
    w, r = world.size(), world.rank()
    members = list(range(1, w))  # every rank but 0; group rank g is world rank g + 1
    sub = mpicomm.new_group(members)
    data = messages(rng, w, (2,))
    if r == members[0]:
        seen = set()
        for _ in range(len(members) - 1):
            got = np.empty(2)
            src = mpicomm.recv(got, group=sub)
            np.testing.assert_array_equal(got, data[src])
            seen.add(src)
        assert seen == set(members[1:])
    elif r in members:
        mpicomm.send(data[r], dst=members[0], group=sub)  # dst is a world rank
    mpicomm.destroy_process_group(sub)


@pytest.mark.mpi(min_size=2)
def test_pending_any_source_receives_do_not_take_collective_messages(world, rng):
    w, r = world.size(), world.rank()
    data = rng.integers(0, 9, (w, w, 2)).astype(np.float64)
    # receives from any rank with every small tag, posted before the collectives run
    pending = [(tag, np.full(2, np.nan)) for tag in range(4)]
    works = [mpicomm.irecv(buf, tag=tag) for tag, buf in pending]
    outs = [np.empty(2) for _ in range(w)]
    mpicomm.all_gather(outs, data[r, 0])
    np.testing.assert_array_equal(np.stack(outs), data[:, 0])
    out = np.empty(2)
    mpicomm.reduce_scatter(out, list(data[r]))
    np.testing.assert_array_equal(out, data[:, r].sum(axis=0))
    mpicomm.all_to_all(outs, list(data[r]))
    np.testing.assert_array_equal(np.stack(outs), data[:, r])
    assert not any(wk.is_completed() for wk in works)
    mpicomm.barrier()  # nobody sends the real messages before every rank has checked the above
    right = (r + 1) % w
    sends = [mpicomm.isend(np.array([r, tag], dtype=np.float64), dst=right, tag=tag) for tag in range(4)]
    for wk in sends + works:
        wk.wait()
    for (tag, buf), wk in zip(pending, works, strict=True):
        assert wk.source_rank() == (r - 1) % w
        assert buf.tolist() == [float((r - 1) % w), float(tag)]
    mpicomm.barrier()  # and no rank runs ahead to send the next test's messages into these receives


@pytest.mark.mpi(min_size=1)
def test_send_to_self_is_refused(world):
    with pytest.raises(mpicomm.ArgumentError, match="dst is this rank"):
        mpicomm.send(np.zeros(2), dst=world.rank())
    with pytest.raises(mpicomm.ArgumentError, match="dst is this rank"):
        mpicomm.isend(np.zeros(2), dst=world.rank())


@pytest.mark.mpi(min_size=1)
def test_send_without_destination_is_refused(world):
    with pytest.raises(mpicomm.ArgumentError, match="no dst given"):
        mpicomm.send(np.zeros(2))


@pytest.mark.mpi(min_size=1)
def test_negative_tag_is_refused(world):
    with pytest.raises(mpicomm.ArgumentError, match="tag is -1"):
        mpicomm.irecv(np.zeros(2), tag=-1)
