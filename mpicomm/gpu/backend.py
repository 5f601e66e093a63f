"""Every cupy call the GPU paths make, behind one small interface that a CPU test can stand in for.

The staged path needs few things from CUDA: the caller's current stream, two streams of its own for
the copies, events between streams, asynchronous copies between device arrays and pinned host
buffers, and a device-side assignment for layouts a plain copy cannot write. :class:`CupyBackend`
does them with cupy; the unit tests drive the same code with a deliberately lazy stand-in, which
checks the ordering of waits and nothing else (it is no GPU verification).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from typing import Any, Protocol

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from .staging import pinned_allocator

__all__ = ["Backend", "CupyBackend", "backend", "set_backend", "span_of"]

_D2H, _H2D = 2, 1  # cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice


class Backend(Protocol):
    """What the GPU paths ask of CUDA; streams and events use cupy's method names."""

    def current_stream(self) -> Any:
        """The caller's current stream (work queued before a call is on it)."""

    def copy_streams(self) -> tuple[Any, Any]:
        """This device's device-to-host and host-to-device copy streams (made once)."""

    def contiguous(self, x: Any) -> Any:
        """``x`` if it is C-contiguous, else a C-contiguous copy queued on the current stream."""

    def to_host(self, host: np.ndarray, dev: Any, stream: Any) -> None:
        """Queue a copy of the contiguous device array ``dev`` into ``host`` on ``stream``."""

    def to_device(self, dev: Any, host: np.ndarray, stream: Any) -> None:
        """Queue a copy of ``host`` into the device array ``dev`` (any layout) on ``stream``."""

    def check_device(self, x: Any, fn: str, arg: str) -> None:
        """Raise ArgumentError if ``x`` is not on the current device."""

    def pinned(self, nbytes: int) -> np.ndarray:
        """A new pinned host buffer of ``nbytes`` bytes (``uint8``)."""

    def asarray(self, host: np.ndarray) -> Any:
        """A new device array with the contents of ``host`` (blocking)."""

    def wrap(self, x: Any, fn: str, arg: str) -> Any:
        """A device array over the memory of a foreign device array ``x``, without a copy.

        ``x`` is a torch CUDA tensor, or any ``__cuda_array_interface__`` or CUDA DLPack object.
        """

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new C-contiguous device array (its contents undefined)."""

    def copy(self, dst: Any, src: Any, stream: Any) -> None:
        """Queue ``dst[...] = src`` (device arrays of one shape, any layouts) on ``stream``."""

    def span(self, x: Any) -> tuple[int, int]:
        """The device addresses ``[low, high)`` that the elements of ``x`` lie in (``(p, p)`` when empty)."""


class CupyBackend:
    """:class:`Backend` on cupy: two non-blocking copy streams per device, raw ``cudaMemcpyAsync``."""

    def __init__(self) -> None:
        self.cp: Any = importlib.import_module("cupy")
        self._streams: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        # the runtime's own calls: a cupy.cuda.Device() costs a Python object and a device-count check
        self._device = self.cp.cuda.runtime.getDevice
        self._memcpy = self.cp.cuda.runtime.memcpyAsync

    def current_stream(self) -> Any:
        """See :class:`Backend`."""
        return self.cp.cuda.get_current_stream()

    def copy_streams(self) -> tuple[Any, Any]:
        """See :class:`Backend`."""
        dev = self._device()
        made = self._streams.get(dev)  # a dict read is atomic: the lock only guards making them
        if made is None:
            with self._lock:
                made = self._streams.get(dev)
                if made is None:
                    stream = self.cp.cuda.Stream
                    made = self._streams[dev] = (stream(non_blocking=True), stream(non_blocking=True))
        return made

    def contiguous(self, x: Any) -> Any:
        """See :class:`Backend`."""
        return x if x.flags.c_contiguous else self.cp.ascontiguousarray(x)

    def to_host(self, host: np.ndarray, dev: Any, stream: Any) -> None:
        """See :class:`Backend`."""
        if host.nbytes:
            self._memcpy(_address(host), dev.data.ptr, host.nbytes, _D2H, stream.ptr)

    def to_device(self, dev: Any, host: np.ndarray, stream: Any) -> None:
        """See :class:`Backend`."""
        if not host.nbytes:
            return
        if dev.flags.c_contiguous:
            self._memcpy(dev.data.ptr, _address(host), host.nbytes, _H2D, stream.ptr)
            return
        with stream:  # a strided destination: one contiguous copy, then a device-side assignment
            tmp = self.cp.empty(host.shape, host.dtype)
            self._memcpy(tmp.data.ptr, _address(host), host.nbytes, _H2D, stream.ptr)
            dev[...] = tmp

    def check_device(self, x: Any, fn: str, arg: str) -> None:
        """See :class:`Backend`."""
        current = self._device()
        if x.device.id != current:
            raise ArgumentError(
                f"{fn}: {arg} is on CUDA device {x.device.id}; expected the current device {current} "
                "(bind each rank to its GPU with mpicomm.gpu.device.bind_device, or use cupy.cuda.Device)"
            )

    def pinned(self, nbytes: int) -> np.ndarray:
        """See :class:`Backend` (the staging module's pinned allocator)."""
        return pinned_allocator(nbytes)

    def asarray(self, host: np.ndarray) -> Any:
        """See :class:`Backend`."""
        return self.cp.asarray(host)

    def wrap(self, x: Any, fn: str, arg: str) -> Any:
        """See :class:`Backend`. The view is ordered after the work that produced ``x``.

        DLPack first, where ``x`` has it: cupy passes its current stream to ``x.__dlpack__``, and
        the producer makes that stream wait for its own (torch: for its current stream on the
        tensor's device, the one a ``with torch.cuda.stream(s):`` block set), so the call's copies
        and its synchronisation come after the kernels that wrote ``x``.
        ``__cuda_array_interface__`` names the producer's stream only from version 3 (cupy then
        waits for it); torch's has none. Where cupy cannot take ``x`` by DLPack (a dtype its DLPack
        lacks), the interface is used and a torch tensor's current stream is synchronised first.
        """
        try:
            if hasattr(x, "__dlpack__"):
                try:
                    with _device_of_tensor(x):
                        return self.cp.from_dlpack(x)
                except (TypeError, ValueError, RuntimeError, BufferError):
                    if not hasattr(x, "__cuda_array_interface__"):
                        raise
                    _producer_stream_done(x)
            if hasattr(x, "__cuda_array_interface__"):
                return self.cp.asarray(x)
            return self.cp.from_dlpack(x)
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            raise ArgumentTypeError(f"{fn}: {arg} is a device array cupy cannot view: {exc}") from exc

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """See :class:`Backend`."""
        return self.cp.empty(shape, dtype)

    def copy(self, dst: Any, src: Any, stream: Any) -> None:
        """See :class:`Backend`."""
        if dst.size:
            with stream:
                dst[...] = src

    def span(self, x: Any) -> tuple[int, int]:
        """See :class:`Backend`."""
        return span_of(int(x.data.ptr), x.shape, x.strides, x.itemsize)


def _address(host: np.ndarray) -> int:
    """The address of a host array's first byte (``ctypes.data`` builds a ctypes object: slower)."""
    address: int = host.__array_interface__["data"][0]
    return address


def _device_of_tensor(x: Any) -> Any:
    """For a torch CUDA tensor, ``torch.cuda.device(x.device)``; else a context that does nothing.

    torch's ``__dlpack__`` orders the consumer after torch's current stream of torch's *current*
    device: inside this context, that is the stream of the device that holds ``x``, whichever device
    the program last made current in torch.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor) and x.is_cuda:
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def _producer_stream_done(x: Any) -> None:
    """Wait for a torch tensor's current stream (the interface says nothing of its producer's stream)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        torch.cuda.current_stream(x.device).synchronize()


def span_of(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The addresses ``[low, high)`` that an array's elements lie in, from its layout.

    Example:
        >>> span_of(1000, (3, 2), (16, -8), 8)   # a row-reversed view: element [0, 1] is at 992
        (992, 1040)
    """
    if 0 in shape:
        return ptr, ptr
    low = ptr + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    high = ptr + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0) + itemsize
    return low, high


class _Current:
    value: Any = None


def backend() -> Any:
    """The backend in use: cupy's, made on first use (cupy is imported only then).

    Raises:
        ArgumentTypeError: cupy cannot be imported (a cupy-like array came from elsewhere).
    """
    if _Current.value is None:
        try:
            _Current.value = CupyBackend()
        except ImportError as exc:
            raise ArgumentTypeError(
                f"mpicomm: a device array was given but cupy does not import: {exc}"
            ) from exc
    return _Current.value


def set_backend(value: Any) -> Any:
    """Use ``value`` as the backend (``None``: cupy's again) and return the one it replaces (for tests)."""
    old, _Current.value = _Current.value, value
    return old
