"""Every buffer mpi4py takes, mpicomm takes, in place (issue 44, item 3).

``bytearray`` and ``mmap`` (the OSU benchmarks' buffers), ``memoryview`` (cast to a format, or of a
strided numpy view), ``array.array`` and ctypes arrays travel as numpy sees their memoryview: the
format's dtype (bytes for ``bytearray`` and ``mmap``, as mpi4py sends them), written in place. Every
rank builds the global input from the shared seed and checks its buffer against numpy.
"""

from __future__ import annotations

import array
import ctypes
import mmap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpicomm


def _bytearray(values: np.ndarray) -> Any:
    return bytearray(values.astype(np.uint8).tobytes())


def _mmap(values: np.ndarray) -> Any:
    m = mmap.mmap(-1, values.size)
    m[:] = values.astype(np.uint8).tobytes()
    return m


def _array(values: np.ndarray) -> Any:
    return array.array("d", values.astype(np.float64).tolist())


def _cast(values: np.ndarray) -> Any:
    return memoryview(bytearray(values.astype(np.float64).tobytes())).cast("d")


def _ctypes(values: np.ndarray) -> Any:
    return (ctypes.c_int32 * values.size)(*values.astype(np.int32).tolist())


MAKERS: dict[str, Callable[[np.ndarray], Any]] = {
    "bytearray": _bytearray,
    "mmap": _mmap,
    "array.array": _array,
    "memoryview.cast": _cast,
    "ctypes": _ctypes,
}


def _numpy(buf: Any) -> np.ndarray:
    """The buffer's values as numpy sees them (a copy, for comparing)."""
    return np.array(memoryview(buf))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", MAKERS)
def test_all_reduce_sums_a_buffer_in_place(world, rng, kind):
    w, r = world.size(), world.rank()
    data = rng.integers(0, 100 // w, (w, 12))  # sums stay under 256: bytes do not wrap
    buf = MAKERS[kind](data[r])
    assert mpicomm.all_reduce(buf) is None
    want = data.sum(axis=0)
    np.testing.assert_array_equal(_numpy(buf), want.astype(_numpy(buf).dtype))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", MAKERS)
def test_broadcast_and_all_gather_into_a_buffer(world, rng, kind):
    w, r = world.size(), world.rank()
    data = rng.integers(0, 100, (w, 8))
    src = w - 1
    buf = MAKERS[kind](data[r])
    mpicomm.broadcast(buf, src=src)
    np.testing.assert_array_equal(_numpy(buf), data[src].astype(_numpy(buf).dtype))
    out = MAKERS[kind](np.zeros(w * 8))
    mpicomm.all_gather_into_tensor(out, MAKERS[kind](data[r]))
    np.testing.assert_array_equal(_numpy(out), data.ravel().astype(_numpy(out).dtype))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", MAKERS)
def test_sendrecv_and_send_recv_move_buffers(world, rng, kind):
    w, r = world.size(), world.rank()
    data = rng.integers(0, 100, (w, 16))
    right, left = (r + 1) % w, (r - 1) % w
    got = MAKERS[kind](np.zeros(16))
    assert mpicomm.sendrecv(MAKERS[kind](data[r]), got, dst=right, src=left) == left
    np.testing.assert_array_equal(_numpy(got), data[left].astype(_numpy(got).dtype))
    partner = r ^ 1
    if partner < w:
        got = MAKERS[kind](np.zeros(16))
        if r < partner:
            mpicomm.send(MAKERS[kind](data[r]), dst=partner)
            assert mpicomm.recv(got, src=partner) == partner
        else:
            assert mpicomm.recv(got, src=partner) == partner
            mpicomm.send(MAKERS[kind](data[r]), dst=partner)
        np.testing.assert_array_equal(_numpy(got), data[partner].astype(_numpy(got).dtype))
    mpicomm.barrier()


@pytest.mark.mpi(min_size=1)
def test_a_memoryview_of_a_strided_view_is_written_through(world, rng):
    w, r = world.size(), world.rank()
    data = rng.integers(-50, 50, (w, 4, 3)).astype(np.float64)
    u = np.zeros((4, 6))
    u[:, ::2] = data[r]
    mpicomm.all_reduce(memoryview(u[:, ::2]))
    np.testing.assert_array_equal(u[:, ::2], data.sum(axis=0))
    np.testing.assert_array_equal(u[:, 1::2], 0.0)


@pytest.mark.mpi(min_size=1)
def test_a_list_of_bytearrays_and_a_read_only_output(world, rng):
    w, r = world.size(), world.rank()
    data = rng.integers(0, 100, (w, 5))
    outs = [bytearray(5) for _ in range(w)]
    mpicomm.all_gather(outs, bytearray(data[r].astype(np.uint8).tobytes()))
    assert [list(o) for o in outs] == data.tolist()
    with pytest.raises(mpicomm.ArgumentError, match=r"^all_reduce: tensor is read-only; expected a"):
        mpicomm.all_reduce(b"\x01\x02")
    mpicomm.barrier()
