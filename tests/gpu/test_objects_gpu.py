"""Device arrays inside object collectives on a real GPU: device buffers, rebuilt on the receiving GPU.

The same checks as tests/mpi/test_objects_device.py (which runs them on the CPU with the fake cupy),
on real device memory and streams, on the path CUDA-awareness decides (direct with the CUDA Open MPI,
staged with the MPICH wheel), plus torch CUDA tensors when torch has CUDA. Run by ``make test-gpu`` at
2 and 4 ranks; skipped (conftest.py) where cupy or a GPU is missing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi.test_objects_device import check, host_object, on_device

import mpicomm
from mpicomm.gpu import staged
from mpicomm.gpu.cuda_aware import cuda_awareness
from mpicomm.gpu.device import bind_device
from mpicomm.objects.pickling import OUT_OF_BAND_MIN, dumps


@pytest.fixture(autouse=True, scope="module")
def bound() -> None:
    bind_device()


@pytest.fixture
def cp() -> Any:  # cupy is imported only on a GPU machine
    import cupy

    return cupy


@pytest.mark.parametrize("safe", [True, False], ids=["safe", "unsafe"])
def test_every_object_call_carries_cupy_arrays(cp: Any, safe: bool) -> None:
    world = mpicomm.init()
    r, n = world.rank(), world.size()
    objs = [on_device(cp, host_object(0))] if r == 0 else [None]
    mpicomm.broadcast_object_list(objs, src=0, safe=safe)
    if r:
        check(cp, objs[0], host_object(0))
    out: list[Any] = [None] * n
    mpicomm.all_gather_object(out, on_device(cp, host_object(r)), safe=safe)
    for s in range(n):
        check(cp, out[s], host_object(s))
    gathered: list[Any] | None = [None] * n if r == 0 else None
    mpicomm.gather_object(on_device(cp, host_object(r)), gathered, dst=0, safe=safe)
    for s in range(n if gathered is not None else 0):
        check(cp, gathered[s], host_object(s))  # type: ignore[index]
    one: list[Any] = [None]
    mpicomm.scatter_object_list(one, [on_device(cp, host_object(s)) for s in range(n)] if r == 0 else None)
    check(cp, one[0], host_object(r))
    if n > 1 and r == 0:
        mpicomm.send_object_list([on_device(cp, host_object(0))], dst=n - 1)
    if n > 1 and r == n - 1:
        got: list[Any] = [None]
        mpicomm.recv_object_list(got, src=0, safe=safe)
        check(cp, got[0], host_object(0))


def test_an_array_written_on_a_side_stream_is_sent_as_written(cp: Any) -> None:
    world = mpicomm.init()
    with cp.cuda.Stream(non_blocking=True):
        x = cp.ones(1 << 22, cp.float32).cumsum()  # still running when the call starts
        out: list[Any] = [None] * world.size()
        mpicomm.all_gather_object(out, x)
        for got in out:
            assert float(got[-1]) == float(1 << 22)


def test_every_device_array_travels_out_of_band_as_device_memory(cp: Any) -> None:
    big, small = cp.arange(OUT_OF_BAND_MIN, dtype=cp.uint8), cp.arange(3, dtype=cp.int64)
    stream, buffers = dumps([big, small, cp.zeros((0, 4))])
    assert [b.nbytes for b in buffers] == [OUT_OF_BAND_MIN, 24, 0] and len(stream) < 1000
    assert all(isinstance(b, cp.ndarray) for b in buffers)  # device memory, never a host copy
    np.testing.assert_array_equal(buffers[0].get(), big.get())


def test_the_path_taken_moves_device_buffers_and_gives_pinned_buffers_back(cp: Any) -> None:
    world = mpicomm.init()
    r, n = world.rank(), world.size()
    x = cp.arange(3 << 20, dtype=cp.float32) + r  # 12 MiB
    out: list[Any] = [None] * n
    mpicomm.all_gather_object(out, {"x": x, "t": x[::7]})
    for s in range(n):
        assert float(out[s]["x"][5]) == 5.0 + s and float(out[s]["t"][1]) == 7.0 + s
        assert out[s]["x"].device.id == cp.cuda.Device().id
    assert staged.pool().stats().bytes_in_use == 0
    print(f"objects on the {'direct' if cuda_awareness().aware else 'staged'} path")


def test_torch_cuda_tensors_come_back_as_torch_cuda_tensors() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    world = mpicomm.init()
    r, n = world.rank(), world.size()
    dev = torch.device("cuda", torch.cuda.current_device())
    mine = {
        "w": torch.arange(1000, device=dev, dtype=torch.float32) + r,
        "b": torch.ones(4, device=dev).bfloat16(),
    }
    out: list[Any] = [None] * n
    mpicomm.all_gather_object(out, mine, safe=True)
    for s in range(n):
        assert out[s]["w"].is_cuda and out[s]["w"].dtype == torch.float32
        assert float(out[s]["w"][10]) == 10.0 + s
        assert out[s]["b"].is_cuda and out[s]["b"].dtype == torch.bfloat16 and float(out[s]["b"].sum()) == 4.0
