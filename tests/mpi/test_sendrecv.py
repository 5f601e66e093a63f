"""sendrecv, the halo step: rings, non-periodic lines with PROC_NULL edges, mpi4py's tag names.

Every rank builds all ranks' messages from the shared seed and checks what it received against the
numpy reference (the neighbour's slice), and that a side with no peer left its buffer untouched.
Runs at 1 to 4 ranks: at one rank the ring is a rank that exchanges with itself and the line has
no neighbour at either end.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.core import cmpi
from mpicomm.dense import p2p

SENTINEL = -5.0


def messages(rng: np.random.Generator, w: int, n: int, dtype: Any = np.float64) -> np.ndarray:
    """One message of ``n`` elements per rank, the same on every rank (small integers: exact)."""
    return rng.integers(-100, 100, (w, n)).astype(dtype)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("n", [1, 8, 1000, 8192])  # 8 B to 64 KiB of float64
def test_ring_shifts_every_message_right(world, rng, n):
    w, r = world.size(), world.rank()
    data = messages(rng, w, n)
    left, right = (r - 1) % w, (r + 1) % w
    got = np.full(n, SENTINEL)
    assert mpicomm.sendrecv(data[r], got, dst=right, src=left) == left
    np.testing.assert_array_equal(got, data[left])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("no_peer", [None, MPI.PROC_NULL], ids=["None", "PROC_NULL"])
def test_line_with_proc_null_edges_sends_and_receives_nothing_there(world, rng, no_peer):
    """A non-periodic 1-D halo: u has one ghost cell at each end; the edges have no neighbour there."""
    w, r = world.size(), world.rank()
    cells = 4
    g = messages(rng, w, cells)  # rank r owns g[r]
    u = np.full(cells + 2, SENTINEL)
    u[1:-1] = g[r]
    left = r - 1 if r > 0 else no_peer
    right = r + 1 if r < w - 1 else no_peer
    # east: send the last owned cell right, receive the left ghost from the left
    came = mpicomm.sendrecv(u[-2:-1], u[0:1], dst=right, src=left, tag=7)
    assert came == (-1 if r == 0 else r - 1)
    # west: send the first owned cell left, receive the right ghost from the right
    came = mpicomm.sendrecv(u[1:2], u[-1:], dst=left, src=right, tag=8)
    assert came == (-1 if r == w - 1 else r + 1)
    want = np.full(cells + 2, SENTINEL)
    want[1:-1] = g[r]
    if r > 0:
        want[0] = g[r - 1][-1]
    if r < w - 1:
        want[-1] = g[r + 1][0]
    np.testing.assert_array_equal(u, want)  # the global array's neighbours, SENTINEL at the domain edges


@pytest.mark.mpi(min_size=1)
def test_line_matches_numpy_shift_of_the_global_array(world, rng):
    """Each rank's ghost-extended block equals the same slice of the padded global array."""
    w, r = world.size(), world.rank()
    cells = 5
    glob = messages(rng, 1, w * cells)[0]
    padded = np.concatenate([[0.0], glob, [0.0]])
    u = np.zeros(cells + 2)
    u[1:-1] = glob[r * cells : (r + 1) * cells]
    left = r - 1 if r > 0 else MPI.PROC_NULL
    right = r + 1 if r < w - 1 else MPI.PROC_NULL
    mpicomm.sendrecv(u[cells : cells + 1], u[:1], dst=right, src=left)
    mpicomm.sendrecv(u[1:2], u[cells + 1 :], dst=left, src=right)
    np.testing.assert_array_equal(u, padded[r * cells : r * cells + cells + 2])


@pytest.mark.mpi(min_size=1)
def test_sendtag_and_recvtag_as_mpi4py_names_them(world, rng):
    """Codes that tag by rank: send with tag r, receive with the left neighbour's rank."""
    w, r = world.size(), world.rank()
    data = messages(rng, w, 3)
    left, right = (r - 1) % w, (r + 1) % w
    got = np.full(3, SENTINEL)
    assert mpicomm.sendrecv(data[r], got, dst=right, src=left, sendtag=r, recvtag=left) == left
    np.testing.assert_array_equal(got, data[left])
    got[:] = SENTINEL
    mpicomm.sendrecv(data[r], got, dst=right, src=left, sendtag=40 + r)  # recvtag: MPI.ANY_TAG, as mpi4py
    np.testing.assert_array_equal(got, data[left])
    got[:] = SENTINEL
    mpicomm.sendrecv(data[r], got, right, left, recvtag=MPI.ANY_TAG)  # sendtag: 0
    np.testing.assert_array_equal(got, data[left])


@pytest.mark.mpi(min_size=1)
def test_mixed_dtypes_and_an_int_dtype_on_each_side(world, rng):
    w, r = world.size(), world.rank()
    ints = messages(rng, w, 6, np.int32)
    floats = messages(rng, w, 2, np.float32)
    left, right = (r - 1) % w, (r + 1) % w
    got_i, got_f = np.zeros(6, np.int32), np.zeros(2, np.float32)
    mpicomm.sendrecv(ints[r], got_i, dst=right, src=left, tag=3)
    mpicomm.sendrecv(floats[r], got_f, dst=left, src=right, tag=4)
    np.testing.assert_array_equal(got_i, ints[left])
    np.testing.assert_array_equal(got_f, floats[right])


@pytest.mark.mpi(min_size=2)
def test_group_ranks_and_proc_null_in_a_subgroup(world, rng):
    """The even world ranks form a line; group_dst/group_src and world ranks address it alike."""
    w, r = world.size(), world.rank()
    evens = list(range(0, w, 2))
    g = mpicomm.new_group(evens)
    data = messages(rng, w, 2)
    if r % 2 == 0:
        me = evens.index(r)
        got = np.full(2, SENTINEL)
        right = me + 1 if me + 1 < len(evens) else MPI.PROC_NULL
        left = me - 1 if me > 0 else None
        came = mpicomm.sendrecv(data[r], got, group=g, group_dst=right, group_src=left)
        assert came == (-1 if left is None else evens[me - 1])
        np.testing.assert_array_equal(got, data[evens[me - 1]] if left is not None else np.full(2, SENTINEL))
        got[:] = SENTINEL
        world_right = evens[me + 1] if me + 1 < len(evens) else None
        world_left = evens[me - 1] if me > 0 else MPI.PROC_NULL
        mpicomm.sendrecv(data[r], got, dst=world_left, src=world_right, group=g, tag=2)
        np.testing.assert_array_equal(
            got, data[world_right] if world_right is not None else np.full(2, SENTINEL)
        )
    mpicomm.destroy_process_group(g)


@pytest.mark.mpi(min_size=1)
def test_torch_tensors_on_the_line(world, rng):
    torch = pytest.importorskip("torch")
    w, r = world.size(), world.rank()
    data = messages(rng, w, 4)
    left = r - 1 if r > 0 else None
    right = r + 1 if r < w - 1 else MPI.PROC_NULL
    got = torch.full((4,), SENTINEL, dtype=torch.float64)
    mpicomm.sendrecv(torch.from_numpy(data[r].copy()), got, dst=right, src=left)
    np.testing.assert_array_equal(got.numpy(), data[r - 1] if r > 0 else np.full(4, SENTINEL))


@pytest.mark.mpi(min_size=1)
@pytest.mark.usefixtures("validation_off")  # validation mode: no C call
def test_the_contiguous_call_takes_the_c_path(world, monkeypatch):
    """The numpy call with world peers and tags reaches cmpi.sendrecv (where the C module is bound)."""
    if cmpi.bound() is not None:
        pytest.skip(f"C calls not in use: {cmpi.bound()}")
    w, r = world.size(), world.rank()
    seen: list[tuple[Any, Any, Any]] = []
    real = cmpi.sendrecv_checked

    def spy(*args: Any) -> Any:
        got = real(*args)
        seen.append((args[2], args[3], got))
        return got

    monkeypatch.setattr(cmpi, "sendrecv_checked", spy)
    x, y = np.full(2, float(r)), np.zeros(2)
    mpicomm.sendrecv(x, y, dst=(r + 1) % w, src=(r - 1) % w)
    mpicomm.sendrecv(x, y, dst=None, src=MPI.PROC_NULL, sendtag=r, recvtag=5)
    assert seen == [((r + 1) % w, (r - 1) % w, (r - 1) % w), (None, MPI.PROC_NULL, -1)]
    assert y.tolist() == [float((r - 1) % w)] * 2
    assert p2p._Const.null == MPI.PROC_NULL


@pytest.mark.mpi(min_size=1)
def test_errors_name_the_peer_argument_before_any_mpi_call(world):
    w = world.size()
    x, y = np.zeros(2), np.zeros(2)
    err, type_err = mpicomm.ArgumentError, mpicomm.ArgumentTypeError
    with pytest.raises(
        mpicomm.ArgumentError, match=r"^sendrecv: dst is -7; expected a world rank 0 <= dst <"
    ) as e:
        mpicomm.sendrecv(x, y, dst=-7, src=None)
    assert "root" not in str(e.value) and "PROC_NULL" in str(e.value)
    with pytest.raises(
        mpicomm.ArgumentError, match=rf"^sendrecv: src is {w}; expected .* or None or MPI.PROC_NULL"
    ):
        mpicomm.sendrecv(x, y, dst=None, src=w)
    with pytest.raises(err, match=r"^sendrecv: group_src is 99; expected a group rank"):
        mpicomm.sendrecv(x, y, group_src=99)
    with pytest.raises(type_err, match=r"^sendrecv: dst is 'left'; expected an int rank"):
        mpicomm.sendrecv(x, y, dst="left")  # type: ignore[arg-type]
    with pytest.raises(
        mpicomm.ArgumentError, match=r"^sendrecv: both tag=1 and sendtag=2 given; expected tag="
    ):
        mpicomm.sendrecv(x, y, dst=None, src=None, tag=1, sendtag=2)
    with pytest.raises(err, match=r"^sendrecv: both tag=0 and recvtag=3 given"):
        mpicomm.sendrecv(x, y, tag=0, recvtag=3)
    with pytest.raises(err, match=r"^sendrecv: sendtag is -3; expected 0 <= sendtag"):
        mpicomm.sendrecv(x, y, sendtag=-3)
    with pytest.raises(err, match=r"^sendrecv: both dst=0 and group_dst=0 given"):
        mpicomm.sendrecv(x, y, dst=0, group_dst=0)
    # send and recv: a peer, not a root, and no mention of torch's root (MPI.PROC_NULL is no peer
    # there too: tests/mpi/test_hardening5.py)
    with pytest.raises(
        mpicomm.ArgumentError, match=r"^send: dst is -7; expected a world rank 0 <= dst <"
    ) as e:
        mpicomm.send(x, dst=-7)
    assert "root" not in str(e.value)
    with pytest.raises(RuntimeError, match=r"^recv: src is 1000; expected a world rank"):  # gloo's type too
        mpicomm.recv(y, src=1000)
