"""What a small staged call asks of CUDA, and the stream order it keeps (issue 35 item 2), on the fake cupy.

On a GPU each CUDA runtime call costs a few microseconds, as much as a small call's own Python. The
fake cupy counts the calls (``cupy._fake.counting``): a staged ``all_reduce`` of one array makes four
(copy down on the caller's stream, synchronise it, copy up, synchronise the upload stream); a
broadcast root two; a receiver four, with a pooled event (none made per call). A torch CUDA tensor
(a CPU tensor that says it is on CUDA stands in) and a ``__cuda_array_interface__`` object are
viewed from their pointer: no DLPack export and no synchronisation of the producer's stream: where
it is not the current stream, the current stream waits for it on the device (an event recorded on
it and one wait); the lazy streams prove the data are read after the producer's work. Over real MPI
at any size; not GPU verification (tests/gpu is).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fakecupy.testing import inputs, world

import mpicomm
from mpicomm.front import kinds

COPIES = {"memcpyAsync": 2, "streamSynchronize": 2}  # all_reduce: down, wait, up, wait


def test_a_small_staged_all_reduce_makes_four_cuda_calls(cp: Any) -> None:
    r, n = world()
    x = inputs(n, 1024)
    d = cp.asarray(x[r])
    mpicomm.all_reduce(cp.zeros(4))  # the first call makes the copy streams
    with cp._fake.counting() as calls:
        mpicomm.all_reduce(d)
    assert calls == COPIES
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))


def test_a_broadcast_makes_two_calls_on_the_root_and_four_with_a_pooled_event_elsewhere(cp: Any) -> None:
    r, n = world()
    x = inputs(n, 512)
    mpicomm.broadcast(cp.zeros(512), src=0)  # the pool's event is made here, on the receivers
    d = cp.asarray(x[r])
    with cp._fake.counting() as calls:
        mpicomm.broadcast(d, src=0)
    if r == 0:
        assert calls == {"memcpyAsync": 1, "streamSynchronize": 1}
    else:  # no eventCreate: the event comes from the backend's pool
        assert calls == {"eventRecord": 1, "streamWaitEvent": 1, "memcpyAsync": 1, "streamSynchronize": 1}
    np.testing.assert_array_equal(d.get(), x[0])


def test_a_receive_is_written_after_the_callers_kernels_queued_before_the_call(cp: Any) -> None:
    """The upload waits for the pooled event: a kernel still writing the array cannot overwrite the result."""
    r, n = world()
    d = cp.zeros(300)
    cp._fake.later(d, np.full(300, float(r)))  # queued before the call, not run yet
    mpicomm.broadcast(d, src=n - 1)
    np.testing.assert_array_equal(d.get(), np.full(300, float(n - 1)))


# ---- __cuda_array_interface__ objects: the producer's stream, waited for on the device ----------------


class Interfaced:
    """A device array seen only through a version-3 interface naming the stream its data are ready on."""

    def __init__(self, d: Any, stream: int) -> None:
        self.d, self.stream = d, stream

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        a = self.d._a
        return {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (a.ctypes.data, False),
            "strides": None,
            "stream": self.stream,
            "version": 3,
        }


def test_an_interface_object_is_read_after_the_work_on_its_producers_stream(cp: Any) -> None:
    r, n = world()
    x = inputs(n, 64)
    side = cp.cuda.Stream(non_blocking=True)
    mpicomm.all_reduce(Interfaced(cp.zeros(4), side.ptr))  # the first makes the pool's event
    d = cp.zeros(64)
    with side:
        cp._fake.later(d, x[r])  # not run: only a wait for side runs it
    with cp._fake.counting() as calls:
        mpicomm.all_reduce(Interfaced(d, side.ptr))
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))
    # one pointer query (the device), one event on side and one wait (the order); no host sync of side
    assert calls == {**COPIES, "pointerGetAttributes": 1, "eventRecord": 1, "streamWaitEvent": 1}


def test_an_interface_object_on_the_current_stream_costs_one_pointer_query(cp: Any) -> None:
    r, n = world()
    x = inputs(n, 64)
    d = cp.asarray(x[r])
    mpicomm.all_reduce(cp.zeros(4))
    with cp._fake.counting() as calls:
        mpicomm.all_reduce(Interfaced(d, 1))  # 1: the legacy default stream, cupy's current one
    assert calls == {**COPIES, "pointerGetAttributes": 1}
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))


# ---- torch CUDA tensors: pointer, layout, device and torch's current stream ----------------------------


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A torch tensor type that says it is on CUDA device 0 (its memory is host memory, as the fake's)."""
    torch = pytest.importorskip("torch")

    class OnCuda(torch.Tensor):  # type: ignore[misc]
        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

        @property
        def is_cpu(self) -> bool:  # type: ignore[override]
            return False

        def get_device(self) -> int:  # type: ignore[override]
            return 0

    OnCuda.__module__ = "torch._stand_in"  # what mpicomm.front.kinds takes for torch's own
    monkeypatch.setattr(kinds, "_RAW_STREAM", [lambda device: 0])  # torch's default stream
    return OnCuda


def _tensor(on_cuda: Any, values: np.ndarray) -> tuple[Any, np.ndarray]:
    import torch

    plain = torch.from_numpy(values.copy())
    return plain.as_subclass(on_cuda), plain.numpy()


@pytest.mark.parametrize("fn", ["all_reduce", "broadcast"])
def test_a_torch_cuda_tensor_is_viewed_with_no_cuda_call_of_its_own(cp: Any, on_cuda: Any, fn: str) -> None:
    r, n = world()
    x = inputs(n, 128)
    t, memory = _tensor(on_cuda, x[r])
    mpicomm.broadcast(cp.zeros(4), src=0)
    with cp._fake.counting() as calls:
        if fn == "all_reduce":
            mpicomm.all_reduce(t)
        else:
            mpicomm.broadcast(t, src=0)
    want = x.sum(axis=0) if fn == "all_reduce" else x[0]
    np.testing.assert_array_equal(memory, want)
    if fn == "all_reduce":
        assert calls == COPIES
    elif r == 0:
        assert calls == {"memcpyAsync": 1, "streamSynchronize": 1}
    else:
        assert calls == {"eventRecord": 1, "streamWaitEvent": 1, "memcpyAsync": 1, "streamSynchronize": 1}


@pytest.mark.parametrize("fn", ["all_reduce", "broadcast"])
def test_a_torch_tensor_written_on_torchs_side_stream_is_read_after_that_work(
    cp: Any, on_cuda: Any, monkeypatch: pytest.MonkeyPatch, fn: str
) -> None:
    """torch's current stream is a side stream whose kernel has yet to write the input (or the output)."""
    r, n = world()
    x = inputs(n, 96)
    t, memory = _tensor(on_cuda, np.zeros(96))
    side = cp.cuda.Stream(non_blocking=True)
    monkeypatch.setattr(kinds, "_RAW_STREAM", [lambda device: side.ptr])
    side.launch(lambda: np.copyto(memory, x[r]))  # torch's kernel, queued on its side stream
    if fn == "all_reduce":
        mpicomm.all_reduce(t)
    else:
        mpicomm.broadcast(t, src=n - 1)
    cp._fake.drain()  # a kernel that ran late would overwrite the result now
    np.testing.assert_array_equal(memory, x.sum(axis=0) if fn == "all_reduce" else x[n - 1])


def test_a_strided_torch_cuda_tensor_keeps_the_elements_between(cp: Any, on_cuda: Any) -> None:
    r, n = world()
    x = inputs(n, 40)
    base, memory = _tensor(on_cuda, np.full(80, -1.0))
    memory[::2] = x[r]
    t = base[::2]
    mpicomm.all_reduce(t)
    np.testing.assert_array_equal(memory[::2], x.sum(axis=0))
    np.testing.assert_array_equal(memory[1::2], -1.0)


def test_a_kept_view_is_used_again_and_still_waits_for_torchs_stream(
    cp: Any, on_cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, n = world()
    x = inputs(n, 50)
    t, memory = _tensor(on_cuda, x[r])
    view = kinds.torch_view(t, "all_reduce", "tensor", True)
    assert kinds.torch_view(t, "all_reduce", "tensor", True) is view  # kept: four facts checked
    side = cp.cuda.Stream(non_blocking=True)
    monkeypatch.setattr(kinds, "_RAW_STREAM", [lambda device: side.ptr])
    side.launch(lambda: np.copyto(memory, 2 * x[r]))  # torch's kernel, queued after the view was made
    mpicomm.all_reduce(t)
    cp._fake.drain()
    np.testing.assert_array_equal(memory, 2 * x.sum(axis=0))


def test_a_tensor_whose_memory_changed_gets_a_new_view_and_a_dead_one_is_forgotten(
    cp: Any, on_cuda: Any
) -> None:
    import gc
    import weakref

    import torch

    t, _ = _tensor(on_cuda, np.zeros(8))
    first = kinds.torch_view(t, "all_reduce", "tensor", True)
    t.set_(torch.zeros(16, dtype=torch.float64))  # new memory: the kept view no longer describes it
    second = kinds.torch_view(t, "all_reduce", "tensor", True)
    assert second is not first and second.shape == (16,)
    alive = weakref.ref(t)
    key = id(t)
    del t, first, second
    gc.collect()
    assert alive() is None, "the kept view held the tensor"
    assert key not in kinds._CUDA_VIEWS
