"""Device arrays written on another stream than cupy's current one (torch's ``with torch.cuda.stream(s):``).

A torch CUDA tensor's ``__cuda_array_interface__`` names no stream, so a call that viewed it through
the interface read it before the kernels queued on torch's stream had run. Through DLPack, cupy
hands its current stream to the producer, which makes that stream wait for its own: the stand-in
below does what torch's ``Tensor.__dlpack__`` does, on the fake cupy (tests/fakecupy), whose
streams run their work only when waited for. On the staged and the direct path, over real MPI.
Not GPU verification: tests/gpu/test_paths_gpu.py runs the same with real torch on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fakecupy import testing
from fakecupy.testing import inputs, world

import mpicomm
from mpicomm.front import device as front

# validation mode never takes the direct path (mpicomm/gpu/direct.py): these tests force it
pytestmark = pytest.mark.usefixtures("validation_off")


class SideStreamTensor:
    """Stands in for a torch CUDA tensor whose values a kernel on ``producer`` has yet to write.

    Like torch's: a version-2 ``__cuda_array_interface__`` with no stream, and ``__dlpack__(stream=)``
    that has the consumer's stream wait for the producer's (torch records an event on its current
    stream and makes the consumer's stream wait for it). ``asked`` lists the streams it was given.
    """

    def __init__(self, cp: Any, values: np.ndarray, producer: Any) -> None:
        self.cp, self.producer, self.asked = cp, producer, []
        self.d = cp.empty(values.shape, values.dtype)  # poison until the kernel runs
        with producer:
            cp._fake.later(self.d, values)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        a = self.d._a
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False), "version": 2}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.d.device.id)

    def __dlpack__(self, stream: int | None = None, **kwargs: Any) -> Any:
        self.asked.append(stream)
        if stream is not None and stream != -1:
            consumer = self.cp.cuda.stream_of(stream)
            if consumer is not self.producer:
                consumer.wait_event(self.producer.record())
        return self.d._a.__dlpack__()  # the fake's truth: host memory

    def values(self) -> np.ndarray:
        out: np.ndarray = self.d.get()
        return out


@pytest.fixture(params=["staged", "direct"])
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cp(path: str, fake: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    testing.use_staged(monkeypatch, aware="1" if path == "direct" else "0")
    yield fake
    fake._fake.drain()


def _current_handle(cp: Any) -> int:
    return int(cp.cuda.get_current_stream().ptr or 1)


def _took(fn: str, path: str, call: Any) -> None:
    """Run ``call`` and check that ``fn`` took ``path`` (the direct path serves what it implements)."""
    before = front.PATHS[fn, path]
    call()
    assert front.PATHS[fn, path] == before + 1


def test_all_reduce_reads_what_the_producer_stream_wrote(cp: Any, path: str) -> None:
    r, n = world()
    x = inputs(n, 37)
    t = SideStreamTensor(cp, x[r], cp.cuda.Stream(non_blocking=True))
    _took("all_reduce", "staged", lambda: mpicomm.all_reduce(t))  # no direct all_reduce: staged on both
    assert t.asked == [_current_handle(cp)]
    np.testing.assert_array_equal(t.values(), x.sum(axis=0))


def test_broadcast_from_a_tensor_written_on_the_producer_stream(cp: Any, path: str) -> None:
    r, n = world()
    x = inputs(n, 19)
    src = n - 1
    t = SideStreamTensor(cp, x[r], cp.cuda.Stream(non_blocking=True))
    _took("broadcast", path, lambda: mpicomm.broadcast(t, src=src))
    np.testing.assert_array_equal(t.values(), x[src])


def test_the_producer_is_handed_cupys_current_stream_whichever_it_is(cp: Any, path: str) -> None:
    r, n = world()
    x = inputs(n, 8)
    t = SideStreamTensor(cp, x[r], cp.cuda.Stream(non_blocking=True))
    out = cp.zeros(8 * n)
    with cp.cuda.Stream(non_blocking=True) as mine:
        _took("all_gather_into_tensor", path, lambda: mpicomm.all_gather_into_tensor(out, t))
        assert t.asked == [mine.ptr]
        got = out.get()
    np.testing.assert_array_equal(got, np.concatenate(x))
