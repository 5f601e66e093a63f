"""cupy arrays through every collective on a real GPU, checked against the numpy path.

Run by ``make test-gpu`` / ``scripts/gpu-window.sh test`` at 2 and 4 ranks sharing one GPU, on the
staged path (the mpich wheel) and on the direct path (the CUDA-aware Open MPI), the path chosen by
``MPICOMM_CUDA_AWARE``'s automatic decision. Skipped (conftest.py) where cupy or a GPU is missing;
``make test-gpu-fake`` runs them on the fake cupy (CPU emulation).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import mpicomm
from mpicomm import ArgumentTypeError, ReduceOp
from mpicomm.front import device as front
from mpicomm.gpu import staged
from mpicomm.gpu.cuda_aware import cuda_awareness
from mpicomm.gpu.device import bind_device

SEED = 7
DTYPES = ["int8", "int32", "int64", "uint16", "float32", "float64", "complex64", "bool"]
COUNTS = [0, 1, 1023, 3 * (4 << 20) // 8 + 5]  # the last: 12 MiB of float64, four 4 MiB-default chunks


@pytest.fixture(autouse=True, scope="module")
def bound() -> None:
    bind_device()


def cp():  # cupy is imported only on a GPU machine
    import cupy

    return cupy


def world() -> tuple[int, int]:
    return mpicomm.get_rank(), mpicomm.get_world_size()


def inputs(n: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(SEED)
    return rng.integers(0, 3, size=(n, count)).astype(dtype)


def host_result(fn, *arrays):  # the numpy path on copies: the oracle
    copies = [np.array(a) for a in arrays]
    fn(*copies)
    return copies


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", COUNTS[:3])
def test_all_reduce_on_cupy_equals_the_numpy_path(dtype: str, count: int) -> None:
    r, n = world()
    x = inputs(n, count, dtype)
    d = cp().asarray(x[r])
    mpicomm.all_reduce(d, op=ReduceOp.MAX if dtype == "bool" else ReduceOp.SUM)
    (want,) = host_result(
        lambda a: mpicomm.all_reduce(a, op=ReduceOp.MAX if dtype == "bool" else ReduceOp.SUM), x[r]
    )
    np.testing.assert_array_equal(d.get(), want)


@pytest.mark.parametrize("count", COUNTS)
def test_data_movement_on_cupy_is_bitwise_the_numpy_path(count: int) -> None:
    r, n = world()
    c = cp()
    x = inputs(n, count, "float64")
    out = c.zeros(n * count)
    mpicomm.all_gather_into_tensor(out, c.asarray(x[r]))
    np.testing.assert_array_equal(out.get(), x.reshape(-1))
    b = c.asarray(x[r])
    mpicomm.broadcast(b, src=n - 1)
    np.testing.assert_array_equal(b.get(), x[n - 1])
    per = count // n
    a2a = c.zeros(per * n)
    mpicomm.all_to_all_single(a2a, c.asarray(x[r][: per * n]))
    want = np.concatenate([x[s][per * r : per * (r + 1)] for s in range(n)])
    np.testing.assert_array_equal(a2a.get(), want)


def test_reductions_gathers_and_scatters_on_cupy() -> None:
    r, n = world()
    c = cp()
    x = inputs(n, 4 * n, "int64")
    red = c.asarray(x[r])
    mpicomm.reduce(red, dst=0)
    np.testing.assert_array_equal(red.get(), x.sum(axis=0) if r == 0 else x[r])
    rs = c.zeros(4, dtype="int64")
    mpicomm.reduce_scatter_tensor(rs, c.asarray(x[r]))
    np.testing.assert_array_equal(rs.get(), x.sum(axis=0)[4 * r : 4 * r + 4])
    outs = [c.zeros(4 * n, dtype="int64") for _ in range(n)]
    mpicomm.all_gather(outs, c.asarray(x[r]))
    np.testing.assert_array_equal(c.stack(outs).get(), x)
    sc = c.zeros(4 * n, dtype="int64")
    mpicomm.scatter(sc, [c.asarray(x[j]) for j in range(n)] if r == 0 else None, src=0)
    np.testing.assert_array_equal(sc.get(), x[r])
    avg = c.asarray(x[r].astype("float64"))
    mpicomm.all_reduce(avg, op=ReduceOp.AVG)
    np.testing.assert_allclose(avg.get(), x.mean(axis=0))


SPIN = r"""
extern "C" __global__ void spin_then_fill(double* out, double value, long long cycles, int n) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = value;
}
"""


@pytest.mark.parametrize("where", ["default", "side"])
def test_the_call_waits_for_work_queued_on_the_current_stream(where: str) -> None:
    """A kernel still writing the input (about 50 ms of spinning) when the call starts."""
    r, n = world()
    c = cp()
    kernel = c.RawKernel(SPIN, "spin_then_fill")
    stream = c.cuda.Stream(non_blocking=True) if where == "side" else c.cuda.Stream.null
    with stream:
        x = c.zeros(4096)
        kernel((1,), (256,), (x, np.float64(r + 1), np.int64(10**8), np.int32(x.size)))
        mpicomm.all_reduce(x)
        got = x.get()
    np.testing.assert_array_equal(got, np.full(4096, n * (n + 1) / 2))


class _Interfaced:
    """Another library's device array: a version-3 ``__cuda_array_interface__`` naming its stream."""

    def __init__(self, d, stream) -> None:
        self.d, self.stream = d, stream

    @property
    def __cuda_array_interface__(self):
        face = dict(self.d.__cuda_array_interface__)
        face.update(version=3, stream=self.stream.ptr)
        return face


@pytest.mark.parametrize("fn", ["all_reduce", "broadcast"])
def test_an_interface_object_written_on_its_producers_stream_is_read_after_that_work(fn: str) -> None:
    """A kernel on the producer's stream (not the current one) still writes the array for ~50 ms.

    mpicomm makes the current stream wait for the named stream on the device (issue 35: where
    ``cupy.asarray`` synchronised it from the host), so the call reads, and writes, after the kernel.
    """
    r, n = world()
    c = cp()
    kernel = c.RawKernel(SPIN, "spin_then_fill")
    producer = c.cuda.Stream(non_blocking=True)
    x = c.zeros(4096)
    c.cuda.Device().synchronize()
    with producer:
        kernel((1,), (256,), (x, np.float64(r + 1), np.int64(10**8), np.int32(x.size)))
    if fn == "all_reduce":
        mpicomm.all_reduce(_Interfaced(x, producer))
        want = np.full(4096, n * (n + 1) / 2)
    else:
        mpicomm.broadcast(_Interfaced(x, producer), src=n - 1)
        want = np.full(4096, float(n))
    c.cuda.Device().synchronize()
    np.testing.assert_array_equal(x.get(), want)


@pytest.mark.parametrize("fn", ["all_reduce", "broadcast"])
def test_a_torch_tensor_written_on_torchs_side_stream_is_read_after_that_work(fn: str) -> None:
    """Inside ``with torch.cuda.stream(side):`` the input is written after ~50 ms of spinning on ``side``.

    torch's ``__cuda_array_interface__`` names no stream; mpicomm takes torch tensors by DLPack,
    whose handshake makes cupy's current stream wait for torch's.
    """
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    r, n = world()
    dev = torch.device("cuda", torch.cuda.current_device())
    x = inputs(n, 1 << 16, "float64")
    mine = torch.from_numpy(x[r]).to(dev)
    t = torch.zeros(x.shape[1], dtype=torch.float64, device=dev)
    side = torch.cuda.Stream(dev)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(10**8)  # spins on side, then the device-to-device copy fills t
        t.copy_(mine)
        if fn == "all_reduce":
            mpicomm.all_reduce(t)
        else:
            mpicomm.broadcast(t, src=n - 1)
    torch.cuda.synchronize()
    want = x.sum(axis=0) if fn == "all_reduce" else x[n - 1]
    np.testing.assert_array_equal(t.cpu().numpy(), want)


def test_async_handles_on_cupy() -> None:
    r, n = world()
    c = cp()
    x = c.full(1000, float(r))
    work = mpicomm.all_reduce(x, async_op=True)
    del x  # the handle keeps the arrays alive
    assert work is not None and work.wait()
    np.testing.assert_array_equal(work.result()[0].get(), np.full(1000, n * (n - 1) / 2))


def test_point_to_point_ring_on_cupy() -> None:
    r, n = world()
    if n == 1:
        pytest.skip("a ring needs two ranks")
    c = cp()
    got = c.zeros(100)
    req = mpicomm.irecv(got, src=(r - 1) % n)
    if r % 2 == 0:
        mpicomm.send(c.full(100, float(r)), dst=(r + 1) % n)
        req.wait()
    else:
        req.wait()
        mpicomm.send(c.full(100, float(r)), dst=(r + 1) % n)
    np.testing.assert_array_equal(got.get(), np.full(100, float((r - 1) % n)))


def test_the_path_taken_is_the_one_promised() -> None:
    c = cp()
    front.PATHS.clear()
    x = c.ones(10)
    mpicomm.broadcast(x, src=0)
    mpicomm.all_reduce(x, async_op=True).wait()
    aware = cuda_awareness().aware
    assert front.PATHS["broadcast", "direct" if aware else "staged"] == 1
    assert front.PATHS["all_reduce", "staged"] == 1  # non-blocking collectives never go direct
    if os.environ.get("MPICOMM_CUDA_AWARE") == "0":
        assert not aware


def test_a_warm_loop_allocates_no_new_pinned_memory() -> None:
    c = cp()
    x = c.ones(1 << 16)
    mpicomm.all_reduce(x, async_op=True).wait()
    before = staged.pool().stats().allocations
    for _ in range(10):
        mpicomm.all_reduce(x, async_op=True).wait()
    assert staged.pool().stats().allocations == before


def test_mixing_numpy_and_cupy_is_an_error() -> None:
    with pytest.raises(
        ArgumentTypeError, match="output_tensor is a device array and input_tensor a host array"
    ):
        mpicomm.all_gather_into_tensor(cp().zeros(4 * mpicomm.get_world_size()), np.zeros(4))


def test_jagged_all_to_all_on_cupy() -> None:
    r, n = world()
    c = cp()
    lengths = np.full(n, 2, dtype=np.int64)
    values = np.arange(2 * n, dtype=np.float32) + 100 * r
    res = mpicomm.jagged_all_to_all(c.asarray(values), c.asarray(lengths), [1] * n)
    want = np.concatenate([np.arange(2 * r, 2 * r + 2, dtype=np.float32) + 100 * s for s in range(n)])
    np.testing.assert_array_equal(res.values.get(), want)
