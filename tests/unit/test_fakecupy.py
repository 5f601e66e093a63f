"""The fake cupy (tests/fakecupy) behaves as the GPU tests need: lazy streams, refusals, checked copies.

These tests check the fake itself, so that a test built on it fails for mpicomm's bugs and not the fake's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import fakecupy
import numpy as np
import pytest


@pytest.fixture
def cp() -> Iterator[Any]:
    yield from fakecupy.fixture()


def test_the_real_cupy_backend_class_runs_on_the_fake(cp: Any) -> None:
    from mpicomm.gpu.backend import CupyBackend

    be = CupyBackend()
    x = cp.arange(12, dtype=cp.float64)
    d2h, h2d = be.copy_streams()
    host = np.zeros(12)
    be.to_host(host, x, d2h)
    np.testing.assert_array_equal(host, 0)  # queued, not run: nobody waited
    d2h.synchronize()
    np.testing.assert_array_equal(host, np.arange(12))
    grid = cp.zeros((4, 3))
    be.to_device(grid[:, 1], np.arange(4.0), h2d)  # a strided destination
    h2d.synchronize()
    want = np.zeros((4, 3))
    want[:, 1] = np.arange(4)
    np.testing.assert_array_equal(grid.get(), want)
    assert be.check_device(x, "f", "x") is None
    assert be.pinned(100).nbytes == 100
    assert be.asarray(np.ones(2)).get().tolist() == [1.0, 1.0]


def test_a_kernel_is_lazy_and_a_copy_on_another_stream_without_a_wait_reads_stale_data(cp: Any) -> None:
    x = cp.zeros(4)
    x[...] = 3.0  # a kernel queued on the current stream
    side = cp.cuda.Stream(non_blocking=True)
    stale = np.empty(4)
    cp.cuda.runtime.memcpyAsync(stale.ctypes.data, x.data.ptr, 32, 2, side.ptr)
    side.synchronize()
    np.testing.assert_array_equal(stale, 0.0)
    fresh = np.empty(4)
    side.wait_event(cp.cuda.get_current_stream().record())
    cp.cuda.runtime.memcpyAsync(fresh.ctypes.data, x.data.ptr, 32, 2, side.ptr)
    side.synchronize()
    np.testing.assert_array_equal(fresh, 3.0)


def test_implicit_host_conversion_and_numpy_operands_are_refused(cp: Any) -> None:
    x = cp.ones(3)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(x)
    with pytest.raises(TypeError):
        x + np.ones(3)
    with pytest.raises(TypeError, match="Unsupported type"):
        cp.concatenate([x, np.ones(3)])
    with pytest.raises(TypeError, match="Unsupported type"):
        x[...] = np.ones(3)


def test_memcpy_checks_memory_kinds_and_bounds(cp: Any) -> None:
    x = cp.zeros(4)
    host = np.zeros(8)
    rt = cp.cuda.runtime
    with pytest.raises(rt.CUDARuntimeError, match=r"src .* is host memory"):
        rt.memcpyAsync(x.data.ptr, host.ctypes.data, 32, rt.memcpyDeviceToHost, 0)
    with pytest.raises(rt.CUDARuntimeError, match="past its device allocation"):
        rt.memcpyAsync(host.ctypes.data, x.data.ptr, 64, rt.memcpyDeviceToHost, 0)


def test_fresh_memory_is_poisoned_and_views_share_it(cp: Any) -> None:
    e = cp.empty(2, dtype=cp.uint8)
    assert e.get().tolist() == [cp._fake.POISON] * 2
    pinned = __import__("cupyx").empty_pinned((3,), np.uint8)
    assert pinned.tolist() == [cp._fake.POISON] * 3
    x = cp.arange(10)
    v = x[2:8:2]
    assert not v.flags.c_contiguous and v.data.ptr == x.data.ptr + 2 * x.itemsize
    v[...] = -1
    assert x.get().tolist() == [0, 1, -1, 3, -1, 5, -1, 7, 8, 9]


def test_foreign_interfaces_are_viewed_without_a_copy(cp: Any) -> None:
    memory = np.arange(6.0)

    class Foreign:
        __cuda_array_interface__: ClassVar[dict[str, Any]] = {
            "shape": (3,),
            "typestr": "<f8",
            "data": (memory.ctypes.data + 8, False),
            "strides": (16,),
            "version": 3,
        }

    v = cp.asarray(Foreign())
    assert v.get().tolist() == [1.0, 3.0, 5.0]
    v[...] = 0.0
    cp.cuda.get_current_stream().synchronize()
    assert memory.tolist() == [0.0, 0.0, 2.0, 0.0, 4.0, 0.0]
    torch = pytest.importorskip("torch")
    t = torch.arange(4.0)
    d = cp.from_dlpack(t)
    d[1:] = 9.0
    cp.cuda.get_current_stream().synchronize()
    assert t.tolist() == [0.0, 9.0, 9.0, 9.0]


def test_the_pinned_pool_keeps_freed_blocks_as_cupys_does(cp: Any) -> None:
    cupyx = __import__("cupyx")
    pool = cp.get_default_pinned_memory_pool()
    pool.free_all_blocks()
    a = cupyx.empty_pinned((5000,), np.uint8)
    del a
    assert pool.n_free_blocks() == 1 and pool.total_bytes() >= 5000
    pool.free_all_blocks()
    assert pool.n_free_blocks() == 0


def test_activation_is_undone_after_the_block() -> None:
    import sys

    with fakecupy.active() as cp:
        assert cp.IS_FAKE and fakecupy.is_active()
    assert "cupy" not in sys.modules


def test_find_reads_the_region_table_again_when_a_finaliser_shrinks_it_meanwhile(
    cp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collection inside the copy of the table runs ``_drop`` (CI: "dictionary changed size")."""
    memory = cp._memory
    d = cp.zeros(4)

    class Shrinking(dict):  # type: ignore[type-arg]
        tries = 0

        def values(self) -> Any:
            Shrinking.tries += 1
            if Shrinking.tries == 1:
                raise RuntimeError("dictionary changed size during iteration")
            return super().values()

    monkeypatch.setattr(memory, "_regions", Shrinking(memory._regions))
    region = memory.find(d.data.ptr)
    assert region is not None and region[0] == d.data.ptr and region[3] == memory.DEVICE
    assert Shrinking.tries == 2
