"""Test controls of the fake cupy (no such module in real cupy): late kernels, views, memory totals."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _memory, cuda
from ._array import ndarray

POISON = _memory.POISON

#: Python stand-ins of CUDA kernels by name, for ``cupy.RawKernel``: ``fn(*args)`` on numpy views.
KERNELS: dict[str, Any] = {}


def later(arr: ndarray, values: Any) -> None:
    """Queue a "kernel" on the current stream that writes ``values`` (numpy) into ``arr``; not run yet."""
    dst, src = arr._a, np.array(values)
    cuda.get_current_stream().launch(lambda: np.copyto(dst, src.reshape(dst.shape), casting="unsafe"))


def pending() -> int:
    """Queued work not yet run, over every live stream."""
    return sum(s.pending for s in list(cuda.Stream._live.values()))


def drain() -> None:
    """Run every live stream's queue (the end of a test: nothing left behind)."""
    for s in list(cuda.Stream._live.values()):
        s.synchronize()


def totals() -> dict[str, int]:
    """Bytes of live fake device and pinned allocations (pinned includes the pinned pool's free blocks)."""
    return _memory.totals()


def peaks() -> dict[str, int]:
    return _memory.peaks()


reset_peaks = _memory.reset_peaks


def _over(ptr: int, face: dict[str, Any], keep: Any, device_id: int) -> ndarray:
    dtype = np.dtype((face.get("descr") and len(face["descr"]) > 1 and face["descr"]) or face["typestr"])
    shape = tuple(face["shape"])
    strides = face.get("strides")
    if shape and min(shape) == 0:
        extent = 0
    elif strides is None:
        extent = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    else:
        extent = dtype.itemsize + sum((n - 1) * abs(s) for n, s in zip(shape, strides, strict=True))
    low = ptr + sum((n - 1) * s for n, s in zip(shape, strides or (), strict=False) if s < 0)
    mem = _memory.Memory(extent, device_id, keep=keep, ptr=low)
    host = np.ndarray(shape, dtype, buffer=mem.array(), offset=ptr - low, strides=strides)
    return ndarray._view(host, mem)


def view_interface(obj: Any, face: dict[str, Any]) -> ndarray:
    """A zero-copy fake array over the memory a ``__cuda_array_interface__`` points at."""
    stream = face.get("stream")
    if stream:
        cuda.stream_of(int(stream)).synchronize()  # the producer's work first, as the protocol asks
    ptr = int(face["data"][0])
    region = _memory.find(ptr)
    return _over(ptr, face, obj, region[2] if region else cuda.Device().id)


class _Host:
    """``x`` seen as host memory by numpy; a CUDA producer is handed the consumer's stream, as cupy does."""

    def __init__(self, x: Any, stream: int | None = None) -> None:
        self.x, self.stream = x, stream

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __dlpack__(self, **kwargs: Any) -> Any:
        if self.stream is None:
            return self.x.__dlpack__()
        return self.x.__dlpack__(stream=self.stream)


def view_dlpack(x: Any) -> ndarray:
    """A zero-copy fake array over a DLPack object (its capsule must describe host memory here)."""
    if isinstance(x, ndarray):
        return x
    if hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] not in (1, 2):
        raise RuntimeError(f"from_dlpack: unsupported device type {x.__dlpack_device__()}")
    # cupy passes its current stream (1 for the legacy default stream) to a CUDA producer, which
    # makes that stream wait for its own work on the array (the DLPack protocol's handshake).
    cuda_producer = hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] == 2
    host = np.from_dlpack(_Host(x, (cuda.get_current_stream().ptr or 1) if cuda_producer else None))
    face = {
        "shape": host.shape,
        "typestr": host.dtype.str,
        "strides": host.strides,
        "data": (host.ctypes.data, False),
    }
    dev_id = x.__dlpack_device__()[1] if hasattr(x, "__dlpack_device__") else 0
    return _over(host.ctypes.data, face, (x, host), dev_id if dev_id >= 0 else 0)


class MemoryPool:
    """What ``cupy.get_default_memory_pool()`` answers about (the fake keeps nothing)."""

    def used_bytes(self) -> int:
        return _memory.totals()[_memory.DEVICE]

    def total_bytes(self) -> int:
        return self.used_bytes()

    def free_all_blocks(self) -> None:
        return None


MEMORY_POOL = MemoryPool()


class RawKernel:
    """``cupy.RawKernel``: a call queues the Python stand-in registered in :data:`KERNELS` under its name."""

    def __init__(
        self, code: str, name: str, options: Any = (), backend: str = "nvrtc", **kwargs: Any
    ) -> None:
        self.code, self.name = code, name

    def __call__(self, grid: Any, block: Any, args: Any, **kwargs: Any) -> None:
        fn = KERNELS.get(self.name)
        if fn is None:
            raise NotImplementedError(
                f"fake cupy: no Python stand-in for kernel {self.name!r} in cupy._fake.KERNELS"
            )
        views = [a._a if isinstance(a, ndarray) else a for a in args]
        cuda.get_current_stream().launch(lambda: fn(*views))


class counting:  # noqa: N801 - a context manager used like a function
    """``with counting() as calls:``: the CUDA runtime calls made inside, by name (``calls`` is a dict)."""

    def __enter__(self) -> dict[str, int]:
        cuda.runtime.CALLS = {}
        return cuda.runtime.CALLS

    def __exit__(self, *exc: object) -> None:
        cuda.runtime.CALLS = None
