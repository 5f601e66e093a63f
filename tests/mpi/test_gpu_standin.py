"""The staged GPU path's plumbing on the CPU: every call on stand-in device arrays, over real MPI.

The stand-in (``tests/standin.py``) looks like cupy to mpicomm and runs copies lazily, so these tests
check the roles of every argument, the staging, the pipeline's order of waits and the errors, at any
number of ranks. They are not the GPU verification: ``tests/gpu`` runs the same on cupy and a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from standin import DeviceArray, LazyBackend

import mpicomm
from mpicomm import ArgumentError, ArgumentTypeError
from mpicomm.core import chunks
from mpicomm.front import device as front
from mpicomm.gpu import backend as gpu_backend
from mpicomm.gpu import staged

SEED = 1234


@pytest.fixture
def chunk4k(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``MPICOMM_STAGING_CHUNK=4K`` (512 float64 a chunk) for one test, read again now and after."""
    monkeypatch.setenv("MPICOMM_STAGING_CHUNK", "4K")
    chunks.reload()
    yield
    monkeypatch.delenv("MPICOMM_STAGING_CHUNK")
    chunks.reload()


@pytest.fixture
def be(monkeypatch: pytest.MonkeyPatch) -> Iterator[LazyBackend]:
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "0")
    from mpicomm.gpu import cuda_aware

    cuda_aware.reset_cuda_awareness()
    fake = LazyBackend()
    old = gpu_backend.set_backend(fake)
    staged.reset_pool()
    front.PATHS.clear()
    yield fake
    gpu_backend.set_backend(old)
    staged.reset_pool()
    cuda_aware.reset_cuda_awareness()


def world() -> tuple[int, int]:
    return mpicomm.get_rank(), mpicomm.get_world_size()


def inputs(n: int, count: int, dtype: str = "float64") -> np.ndarray:
    """Every rank's input, built from the seed on every rank: row r is rank r's."""
    rng = np.random.default_rng(SEED)
    return rng.integers(-50, 50, size=(n, count)).astype(dtype)


def dev(x: np.ndarray) -> DeviceArray:
    return DeviceArray(np.array(x))


@pytest.mark.parametrize("count", [0, 1, 7, 1000])
def test_all_reduce_of_device_arrays_matches_numpy(be: LazyBackend, count: int) -> None:
    r, n = world()
    x = inputs(n, count)
    d = dev(np.zeros(count))
    be.write_later(d, x[r])  # a kernel still queued on the current stream when the call starts
    mpicomm.all_reduce(d)
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))
    assert front.PATHS["all_reduce", "staged"] == 1


def test_every_data_movement_call_on_device_arrays_matches_the_reference(be: LazyBackend) -> None:
    r, n = world()
    x = inputs(n, 3 * n)
    out = dev(np.zeros(n * 3 * n))
    mpicomm.all_gather_into_tensor(out, dev(x[r]))
    np.testing.assert_array_equal(out.get(), x.reshape(-1))
    outs = [dev(np.zeros(3 * n)) for _ in range(n)]
    mpicomm.all_gather(outs, dev(x[r]))
    for j in range(n):
        np.testing.assert_array_equal(outs[j].get(), x[j])
    b = dev(x[r])
    mpicomm.broadcast(b, src=0)
    np.testing.assert_array_equal(b.get(), x[0])
    a2a = dev(np.zeros(3 * n))
    mpicomm.all_to_all_single(a2a, dev(x[r]))
    np.testing.assert_array_equal(a2a.get(), x[:, 3 * r : 3 * r + 3].reshape(-1))
    rs = dev(np.zeros(3))
    mpicomm.reduce_scatter_tensor(rs, dev(x[r]))
    np.testing.assert_array_equal(rs.get(), x.sum(axis=0)[3 * r : 3 * r + 3])


def test_rooted_calls_leave_other_ranks_arrays_alone(be: LazyBackend) -> None:
    r, n = world()
    x = inputs(n, 4)
    keep = np.full(4, -7.0)
    red = dev(x[r])
    mpicomm.reduce(red, dst=0)
    np.testing.assert_array_equal(red.get(), x.sum(axis=0) if r == 0 else x[r])
    gl = [dev(keep) for _ in range(n)] if r == 0 else None
    mpicomm.gather(dev(x[r]), gl, dst=0)
    if gl is not None:
        np.testing.assert_array_equal(np.stack([g.get() for g in gl]), x)
    sc = dev(keep)
    mpicomm.scatter(sc, [dev(x[j]) for j in range(n)] if r == 0 else None, src=0)
    np.testing.assert_array_equal(sc.get(), x[r])


def test_async_work_uploads_when_it_completes(be: LazyBackend) -> None:
    r, n = world()
    x = inputs(n, 5)
    d = dev(x[r])
    work = mpicomm.all_reduce(d, async_op=True)
    assert work is not None
    assert work.wait() is True
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))
    assert work.result()[0] is d
    out = dev(np.zeros(5 * n))
    w2 = mpicomm.all_gather_into_tensor(out, dev(x[r]), async_op=True)
    assert w2 is not None
    while not w2.is_completed():
        pass
    np.testing.assert_array_equal(out.get(), x.reshape(-1))


def test_point_to_point_ring_on_device_arrays(be: LazyBackend) -> None:
    r, n = world()
    if n == 1:
        pytest.skip("a ring needs two ranks")
    x = inputs(n, 6)
    got = dev(np.zeros(6))
    recv = mpicomm.irecv(got, src=(r - 1) % n)
    mpicomm.send(dev(x[r]), dst=(r + 1) % n)
    assert recv.wait()
    np.testing.assert_array_equal(got.get(), x[(r - 1) % n])


@pytest.mark.parametrize("count", [2048, 3 * 512 + 17])
def test_large_all_reduce_and_broadcast_are_pipelined_in_chunks(
    be: LazyBackend, chunk4k: None, count: int
) -> None:
    r, n = world()
    x = inputs(n, count)
    d = dev(np.zeros(count))
    be.write_later(d, x[r])
    mpicomm.all_reduce(d)
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))
    b = dev(np.zeros(count))
    be.write_later(b, x[r])
    mpicomm.broadcast(b, src=n - 1)
    np.testing.assert_array_equal(b.get(), x[n - 1])
    assert front.PATHS["all_reduce", "pipelined"] == 1 and front.PATHS["broadcast", "pipelined"] == 1


def test_a_warm_loop_allocates_no_new_pinned_memory(be: LazyBackend) -> None:
    d = dev(np.ones(100))
    mpicomm.all_reduce(d)
    before = be.pinned_allocations
    for _ in range(5):
        mpicomm.all_reduce(d)
    assert be.pinned_allocations == before
    assert staged.pool().stats().bytes_in_use == 0


def test_numpy_and_device_arrays_in_one_call_is_an_error_naming_both(be: LazyBackend) -> None:
    with pytest.raises(
        ArgumentTypeError, match=r"all_gather_into_tensor: output_tensor is a device array and"
    ):
        mpicomm.all_gather_into_tensor(dev(np.zeros(4)), np.zeros(4))
    with pytest.raises(ArgumentTypeError, match=r"input_tensor_list\[0\]"):
        mpicomm.all_to_all([dev(np.zeros(1))], [np.zeros(1)])


def test_an_array_on_another_device_is_refused(be: LazyBackend) -> None:
    with pytest.raises(ArgumentError, match="all_reduce: tensor is on CUDA device 1"):
        mpicomm.all_reduce(DeviceArray(np.zeros(2), device=1))


def test_host_errors_reach_device_callers_and_buffers_go_back(be: LazyBackend) -> None:
    _, n = world()
    with pytest.raises(ArgumentError, match="all_gather_into_tensor: output_tensor has"):
        mpicomm.all_gather_into_tensor(dev(np.zeros(n + 1)), dev(np.zeros(1)))
    assert staged.pool().stats().bytes_in_use == 0


def test_jagged_all_to_all_returns_device_arrays(be: LazyBackend) -> None:
    r, n = world()
    lengths = np.full(n, 2, dtype=np.int64)
    values = np.arange(2 * n, dtype=np.float32) + 100 * r
    res = mpicomm.jagged_all_to_all(dev(values), dev(lengths), [1] * n)
    assert isinstance(res.values, DeviceArray) and isinstance(res.lengths, DeviceArray)
    want = np.concatenate([np.arange(2 * r, 2 * r + 2, dtype=np.float32) + 100 * s for s in range(n)])
    np.testing.assert_array_equal(res.values.get(), want)
    assert res.splits == [1] * n


def test_a_foreign_device_array_is_viewed_without_a_copy_and_written_in_place(be: LazyBackend) -> None:
    """A torch CUDA tensor's stand-in: only ``__cuda_array_interface__``, over host memory here."""
    from standin import ForeignDeviceArray

    r, n = world()
    x = inputs(n, 5)
    memory = x[r].copy()
    mpicomm.all_reduce(ForeignDeviceArray(memory))
    np.testing.assert_array_equal(memory, x.sum(axis=0))  # the caller's own memory was written
    assert front.PATHS["all_reduce", "staged"] == 1
    out = np.zeros(5 * n)
    mpicomm.all_gather_into_tensor(ForeignDeviceArray(out), ForeignDeviceArray(x[r].copy()))
    np.testing.assert_array_equal(out, x.reshape(-1))
    with pytest.raises(ArgumentTypeError, match="device array and"):
        mpicomm.all_gather_into_tensor(np.zeros(5 * n), ForeignDeviceArray(x[r].copy()))
