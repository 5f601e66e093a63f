"""Issue 44, item 6: the fifth round of bad input.

* a message shorter than its receive buffer leaves the elements it does not reach as they were,
  whatever the buffer's layout, on the C path (the world) and the Python path (a subgroup, and the
  whole module under ``MPICOMM_C=0``): bytewise what a contiguous buffer holds after the same
  message;
* one rule for peers in every point-to-point call: a rank of the group, or MPI's own
  ``MPI.PROC_NULL`` (nothing moves); any other negative rank raises the same error everywhere;
* an impossible size (a zero-stride view of 2**40 elements that must be copied) is an mpicomm
  error naming the call, not numpy's raw MemoryError.

The scratch memory freed when a thread ends, and weak references to the public calls, are tested
in tests/unit/test_cmpi_scratch.py and tests/unit/test_weakref_calls.py; two threads on one group
in tests/mpi/test_thread_level.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from numpy.lib.stride_tricks import as_strided

import mpicomm
from mpicomm.errors import BackendArgumentError, MpicommError

SENTINEL = -7.0
N = 40  # elements each receive buffer holds


def _partner(world: mpicomm.ProcessGroup) -> int | None:
    """Ranks pair up (0-1, 2-3, ...); the last of an odd count has none."""
    p = world.rank() ^ 1
    return p if p < world.size() else None


def _layouts(n: int) -> dict[str, Callable[[], np.ndarray]]:
    """Receive buffers of ``n`` float64 elements, each a fresh view holding SENTINEL."""
    return {
        "contiguous": lambda: np.full(n, SENTINEL),
        "column": lambda: np.full((n, 3), SENTINEL)[:, 1],
        "block": lambda: np.full((n // 4, 8), SENTINEL)[:, ::2],
        "reversed": lambda: np.full(n, SENTINEL)[::-1],
    }


def _receive(call: str, buf: np.ndarray, partner: int, msg: np.ndarray, group: Any, lower: bool) -> None:
    """Send ``msg`` to the partner and receive its message into ``buf`` with ``call``."""
    g = {"group": group} if group is not None else {}
    dst = {"dst": partner} if group is None else {"group_dst": group.ranks.index(partner)}
    src = {"src": partner} if group is None else {"group_src": group.ranks.index(partner)}
    if call == "sendrecv":
        mpicomm.sendrecv(msg, buf, **dst, **src, **g)
    elif call == "irecv":
        work = mpicomm.irecv(buf, **src, **g)
        mpicomm.send(msg, **dst, **g)
        assert work is not None
        work.wait()
    elif lower:
        mpicomm.send(msg, **dst, **g)
        mpicomm.recv(buf, **src, **g)
    else:
        mpicomm.recv(buf, **src, **g)
        mpicomm.send(msg, **dst, **g)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("group", ["world", "subgroup"])  # the C path, the Python path
@pytest.mark.parametrize("call", ["recv", "sendrecv", "irecv"])
@pytest.mark.parametrize("layout", ["contiguous", "column", "block", "reversed"])
@pytest.mark.parametrize("short", [0, 3])  # elements in the short message
def test_a_short_message_leaves_what_it_does_not_reach_as_a_contiguous_buffer_keeps_it(
    world, rng, group, call, layout, short
):
    w, r = world.size(), world.rank()
    g = mpicomm.new_group(list(range(w))) if group == "subgroup" else None
    partner = _partner(world)
    if partner is not None:
        full = rng.integers(1, 100, (w, N)).astype(np.float64)
        small = rng.integers(1, 100, (w, 4)).astype(np.float64)
        lower = r < partner

        # (no message ending inside an element: MPICH 5 aborts on one, whatever the buffer)
        def short_of(rank: int) -> np.ndarray:
            return small[rank, :short]

        make = _layouts(N)[layout]
        # a full message first, so that any scratch memory holds bytes of an earlier message
        first = make()
        _receive(call, first, partner, full[r], g, lower)
        np.testing.assert_array_equal(first.ravel(), full[partner])
        buf, flat = make(), np.full(N, SENTINEL)
        _receive(call, buf, partner, short_of(r), g, lower)
        _receive("recv", flat, partner, short_of(r), g, lower)  # contiguous: MPI writes the bytes that came
        want = np.full(N, SENTINEL)
        want.view(np.uint8)[: short_of(partner).nbytes] = short_of(partner).view(np.uint8)
        assert flat.tobytes() == want.tobytes()
        assert np.ascontiguousarray(buf).tobytes() == want.tobytes(), (buf, want)
    if g is not None:
        mpicomm.destroy_process_group(g)
    mpicomm.barrier()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("group", ["world", "subgroup"])
def test_a_short_message_after_a_full_one_into_a_packed_column_on_a_second_thread_is_not_mixed(world, group):
    """The same through send/recv on the C path's per-thread scratch, 64 KiB messages."""
    w, r = world.size(), world.rank()
    g = mpicomm.new_group(list(range(w))) if group == "subgroup" else None
    partner = _partner(world)
    if partner is not None:
        n = 8192
        u = np.full((n, 2), SENTINEL)
        _receive("recv", u[:, 0], partner, np.full(n, float(r + 1)), g, r < partner)
        assert (u[:, 0] == partner + 1).all()
        u[:, 0] = SENTINEL
        _receive("recv", u[:, 0], partner, np.full(10, float(r + 1)), g, r < partner)
        assert (u[:10, 0] == partner + 1).all() and (u[10:, 0] == SENTINEL).all()
    if g is not None:
        mpicomm.destroy_process_group(g)
    mpicomm.barrier()


def _peer_calls(world: mpicomm.ProcessGroup, peer: int) -> dict[str, Callable[[], Any]]:
    """Every point-to-point call with ``peer`` as its one peer (the other side, for sendrecv, none)."""
    buf = np.full(4, SENTINEL)

    def waited(work: Any) -> int:
        work.wait()
        return int(work.source_rank()) if hasattr(work, "source_rank") else 0

    return {
        "send": lambda: mpicomm.send(np.ones(4), dst=peer),
        "recv": lambda: mpicomm.recv(buf, src=peer),
        "isend": lambda: waited(mpicomm.isend(np.ones(4), dst=peer)),
        "irecv": lambda: waited(mpicomm.irecv(buf, src=peer)),
        "sendrecv dst": lambda: mpicomm.sendrecv(np.ones(4), buf, dst=peer, src=None),
        "sendrecv src": lambda: mpicomm.sendrecv(np.ones(4), buf, dst=None, src=peer),
        "send group_dst": lambda: mpicomm.send(np.ones(4), group=world, group_dst=peer),
        "recv group_src": lambda: mpicomm.recv(buf, group=world, group_src=peer),
    }


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("offset", [1, 2, 1000])
def test_a_negative_peer_other_than_proc_null_raises_the_same_error_in_every_p2p_call(world, offset):
    peer = int(MPI.PROC_NULL) - offset  # -2 (MPICH) or -3 (Open MPI) and below
    if peer >= 0:
        pytest.skip("this MPI's PROC_NULL is not negative")
    for name, call in _peer_calls(world, peer).items():
        with pytest.raises(BackendArgumentError) as info:
            call()
        assert isinstance(info.value, ValueError), name  # as torch raises for a rank out of range
        text = str(info.value)
        assert f"is {peer}; expected a " in text and "MPI.PROC_NULL for no peer" in text, (name, text)
    mpicomm.barrier()


@pytest.mark.mpi(min_size=1)
def test_proc_null_is_no_peer_in_every_p2p_call(world):
    null = int(MPI.PROC_NULL)
    calls = _peer_calls(world, null)
    got = {name: call() for name, call in calls.items()}
    assert got["send"] is None and got["send group_dst"] is None
    assert got["recv"] == -1 and got["recv group_src"] == -1 and got["irecv"] == -1
    assert got["sendrecv dst"] == -1 and got["sendrecv src"] == -1
    buf = np.full(4, SENTINEL)
    assert mpicomm.recv(buf[::-1], src=null) == -1 and (buf == SENTINEL).all()
    mpicomm.barrier()


HUGE = 1 << 40


def _huge() -> np.ndarray:
    return as_strided(np.zeros(1), shape=(HUGE,), strides=(0,))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize(
    "name, call",
    [
        ("all_reduce", lambda: mpicomm.all_reduce(_huge())),
        ("reduce", lambda: mpicomm.reduce(_huge(), dst=0)),
        ("sendrecv", lambda: mpicomm.sendrecv(np.zeros(1), _huge(), dst=None, src=None)),
    ],
)
def test_an_impossible_size_is_an_mpicomm_error_naming_the_call(world, name, call):
    with pytest.raises(MpicommError) as info:
        call()
    assert str(info.value).startswith(f"{name}: "), str(info.value)
    assert "could not be allocated" in str(info.value)
    mpicomm.barrier()
