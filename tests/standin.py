"""A CPU stand-in for cupy arrays and CUDA streams, to test the GPU paths' logic without a GPU.

It checks the order of waits and the plumbing of the staged path, nothing else: it is never the GPU
verification (that is ``tests/gpu`` on a real GPU). Streams are *maximally lazy*: queued work runs only
when something waits for it, so a missing ``wait_event`` or ``synchronize`` reads stale data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class LazyEvent:
    def __init__(self, stream: LazyStream, upto: int) -> None:
        self.stream, self.upto = stream, upto

    def synchronize(self) -> None:
        self.stream.run(self.upto)

    @property
    def done(self) -> bool:  # a query: the work is taken as finished by then
        self.synchronize()
        return True


class LazyStream:
    def __init__(self, name: str) -> None:
        self.name, self.queue, self.done = name, [], 0

    def enqueue(self, fn: Callable[[], object]) -> None:
        self.queue.append(fn)

    def record(self) -> LazyEvent:
        return LazyEvent(self, len(self.queue))

    def wait_event(self, event: LazyEvent) -> None:
        self.enqueue(event.synchronize)

    def synchronize(self) -> None:
        self.run(len(self.queue))

    def run(self, upto: int) -> None:
        while self.done < upto:
            fn = self.queue[self.done]
            self.done += 1
            fn()


class DeviceArray:
    """Looks like a cupy array to mpicomm (module name and ``__cuda_array_interface__``)."""

    def __init__(self, data: np.ndarray, device: int = 0) -> None:
        self.a = data
        self.device = type("Device", (), {"id": device})()

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:  # host memory: MPI carries it on the direct path
        a = self.a
        strides = None if a.flags.c_contiguous else a.strides
        return {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (a.ctypes.data, False),
            "strides": strides,
            "version": 3,
        }

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)
    size = property(lambda self: self.a.size)
    nbytes = property(lambda self: self.a.nbytes)
    itemsize = property(lambda self: self.a.itemsize)
    ndim = property(lambda self: self.a.ndim)
    flags = property(lambda self: self.a.flags)

    def reshape(self, *shape: Any) -> DeviceArray:
        return DeviceArray(self.a.reshape(*shape), self.device.id)

    def __getitem__(self, key: Any) -> DeviceArray:
        return DeviceArray(self.a[key], self.device.id)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.a[key] = value.a if isinstance(value, DeviceArray) else value

    def get(self) -> np.ndarray:
        return self.a.copy()


DeviceArray.__module__ = "cupy_standin"  # what mpicomm.front.kinds looks for, with the interface


class HostMemory:
    """A numpy view of the memory a ``__cuda_array_interface__`` dict describes (here: host memory)."""

    def __init__(self, face: dict[str, Any]) -> None:
        self.__array_interface__ = {
            "shape": face["shape"],
            "typestr": face["typestr"],
            "data": face["data"],
            "strides": face.get("strides"),
            "version": 3,
        }

    def array(self) -> np.ndarray:
        return np.asarray(self)


class ForeignDeviceArray:
    """A device array of no library mpicomm knows (a torch CUDA tensor's stand-in): only
    ``__cuda_array_interface__``, pointing at host memory, which the staged path then carries."""

    def __init__(self, data: np.ndarray, device_id: int = 0) -> None:
        self.host, self.device_id = data, device_id

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        a = self.host
        return {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (a.ctypes.data, False),
            "strides": None if a.flags.c_contiguous else a.strides,
            "version": 3,
        }


class LazyBackend:
    """The :class:`mpicomm.gpu.backend.Backend` of the stand-in: every copy queued on a lazy stream."""

    def __init__(self) -> None:
        self.current = LazyStream("current")
        self.d2h, self.h2d = LazyStream("d2h"), LazyStream("h2d")
        self.pinned_allocations = 0
        self.device = 0

    def current_stream(self) -> LazyStream:
        return self.current

    def copy_streams(self) -> tuple[LazyStream, LazyStream]:
        return self.d2h, self.h2d

    def mark(self, stream: LazyStream) -> LazyEvent:
        return stream.record()

    def unmark(self, event: LazyEvent) -> None:
        pass

    def contiguous(self, x: DeviceArray) -> DeviceArray:
        if x.flags.c_contiguous:
            return x
        out = DeviceArray(np.empty(x.shape, x.dtype), x.device.id)
        self.current.enqueue(lambda: np.copyto(out.a, x.a))
        return out

    def to_host(self, host: np.ndarray, dev: DeviceArray, stream: LazyStream) -> None:
        src = dev.a
        stream.enqueue(lambda: np.copyto(host, src.reshape(host.shape)))

    def to_device(self, dev: DeviceArray, host: np.ndarray, stream: LazyStream) -> None:
        dst = dev.a
        stream.enqueue(lambda: np.copyto(dst, host.reshape(dst.shape)))

    def check_device(self, x: DeviceArray, fn: str, arg: str) -> None:
        from mpicomm.errors import ArgumentError

        if x.device.id != self.device:
            raise ArgumentError(f"{fn}: {arg} is on CUDA device {x.device.id}; expected {self.device}")

    def pinned(self, nbytes: int) -> np.ndarray:
        self.pinned_allocations += 1
        return np.empty(nbytes, np.uint8)

    def asarray(self, host: np.ndarray) -> DeviceArray:
        return DeviceArray(np.array(host))

    def wrap(self, x: Any, fn: str, arg: str) -> DeviceArray:
        """A DeviceArray over the host memory a :class:`ForeignDeviceArray`'s interface points at."""
        face = x.__cuda_array_interface__
        host = HostMemory(face).array()
        return DeviceArray(host, getattr(x, "device_id", 0))

    def empty(self, shape: tuple[int, ...], dtype: Any) -> DeviceArray:
        return DeviceArray(np.empty(shape, dtype))

    def copy(self, dst: DeviceArray, src: DeviceArray, stream: LazyStream) -> None:
        d, s = dst.a, src.a
        stream.enqueue(lambda: np.copyto(d, s))

    def span(self, x: DeviceArray) -> tuple[int, int]:
        from mpicomm.gpu.backend import span_of

        return span_of(x.a.ctypes.data, x.a.shape, x.a.strides, x.a.itemsize)

    def write_later(self, dev: DeviceArray, values: np.ndarray) -> None:
        """Queue a 'kernel' on the current stream that writes ``values`` into ``dev`` (not run yet)."""
        dst = dev.a
        self.current.enqueue(lambda: np.copyto(dst, values))
