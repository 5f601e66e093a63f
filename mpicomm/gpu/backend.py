"""Every cupy call the GPU paths make, behind one small interface that a CPU test can stand in for.

The staged path needs few things from CUDA: the caller's current stream, two streams of its own for
the copies, events between streams, asynchronous copies between device arrays and pinned host
buffers, and a device-side assignment for layouts a plain copy cannot write. :class:`CupyBackend`
does them with cupy; the unit tests drive the same code with a deliberately lazy stand-in, which
checks the ordering of waits and nothing else (it is no GPU verification).

Each CUDA call costs a few microseconds on a GPU, as much as a small staged call's own Python, so
:class:`CupyBackend` makes none it can spare: events come from a pool (no create and destroy per
call), and a foreign device array is viewed from its pointer and layout (:meth:`CupyBackend.over`)
with no DLPack export and no stream synchronisation: where its producer's stream is not the current
one, the current stream waits for it on the device (one event recorded, one wait).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
import threading
from typing import Any, Protocol

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from .staging import lent_address, pinned_allocator

__all__ = ["Backend", "CupyBackend", "backend", "set_backend", "span_of"]

_D2H, _H2D = 2, 1  # cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice
_MEMORY_DEVICE, _MEMORY_MANAGED = 2, 3  # cudaMemoryTypeDevice, cudaMemoryTypeManaged
#: Idle events kept per device (a few calls in flight at once need no more).
_IDLE_EVENTS = 16


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

    def mark(self, stream: Any) -> Any:
        """An event recorded now on ``stream``; hand it back with :meth:`unmark` once nothing waits for it."""

    def unmark(self, event: Any) -> None:
        """Take back an event of :meth:`mark` (its waits are queued): the next :meth:`mark` may record it."""


class CupyBackend:
    """:class:`Backend` on cupy: two non-blocking copy streams per device, raw ``cudaMemcpyAsync``."""

    def __init__(self) -> None:
        self.cp: Any = importlib.import_module("cupy")
        self._streams: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        # the runtime's own calls: a cupy.cuda.Device() costs a Python object and a device-count check
        self._device = self.cp.cuda.runtime.getDevice
        self._memcpy = self.cp.cuda.runtime.memcpyAsync
        self._record, self._wait = self.cp.cuda.runtime.eventRecord, self.cp.cuda.runtime.streamWaitEvent
        # idle events by device: an event belongs to the device that made it
        self._events: dict[int, list[Any]] = {}
        self._dtypes: dict[str, np.dtype[Any]] = {}

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

    def mark(self, stream: Any) -> Any:
        """See :class:`Backend`. A pooled event without timing (recording one costs less)."""
        event = self._idle_event()
        stream.record(event)
        return event

    def unmark(self, event: Any) -> None:
        """See :class:`Backend`."""
        dev = self._device()
        idle = self._events.get(dev)
        if idle is None:
            idle = self._events.setdefault(dev, [])
        if len(idle) < _IDLE_EVENTS:
            idle.append(event)

    def _idle_event(self) -> Any:
        idle = self._events.get(self._device())
        if idle:
            try:
                return idle.pop()  # atomic: no lock (another thread may have taken the last one)
            except IndexError:
                pass
        return self.cp.cuda.Event(disable_timing=True)

    def after(self, stream: int | None, device: int) -> None:
        """Make the current stream wait (on the device) for the work queued so far on ``stream``.

        ``stream`` is a raw handle (0 and 1: the legacy default stream) or None (nothing to wait
        for). Nothing is done where it is the current stream, or where ``device`` is not the current
        device (the call refuses that array before using it).
        """
        if stream is None or device != self._device():
            return
        current = self.cp.cuda.get_current_stream()
        if (stream or 1) == (current.ptr or 1):  # the usual case: one stream, nothing to order
            return
        event = self._idle_event()
        try:
            self._record(event.ptr, stream)
            self._wait(current.ptr, event.ptr, 0)
        finally:
            self.unmark(event)

    def over(
        self,
        ptr: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...] | None,
        dtype: np.dtype[Any],
        device: int,
        owner: Any,
        stream: int | None,
    ) -> Any:
        """A device array over the memory at ``ptr`` (no copy), ordered after ``owner``'s producer.

        Args:
            ptr: The address of the first element.
            shape: The shape.
            strides: Byte strides, or None for C order.
            dtype: The numpy dtype.
            device: The CUDA device that holds the memory.
            owner: The object that owns the memory (the array keeps it alive).
            stream: The producer's stream (raw handle) the data is ready on, or None; the current
                stream waits for it (:meth:`after`).
        """
        if strides is None:
            lo, size = ptr, math.prod(shape) * dtype.itemsize
        else:
            lo, hi = span_of(ptr, shape, strides, dtype.itemsize)
            size = hi - lo
        mem = self.cp.cuda.UnownedMemory(lo, size, owner, device)
        out = self.cp.ndarray(shape, dtype, self.cp.cuda.MemoryPointer(mem, ptr - lo), strides)
        self.after(stream, device)
        return out

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
        and its synchronisation come after the kernels that wrote ``x``. (torch tensors of the dtypes
        numpy has come by :meth:`over` instead, from :mod:`mpicomm.front.kinds`.)
        ``__cuda_array_interface__`` names the producer's stream only from version 3: the current
        stream then waits for it on the device (:meth:`interface`); torch's has none. Where cupy
        cannot take ``x`` by DLPack (a dtype its DLPack lacks), the interface is used and a torch
        tensor's current stream is synchronised first.
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
            face = getattr(x, "__cuda_array_interface__", None)  # a property: read once
            if face is not None:
                return self.interface(x, face)
            return self.cp.from_dlpack(x)
        except (TypeError, ValueError, RuntimeError, BufferError, KeyError) as exc:
            raise ArgumentTypeError(f"{fn}: {arg} is a device array cupy cannot view: {exc}") from exc

    def interface(self, x: Any, face: dict[str, Any]) -> Any:
        """A device array over a ``__cuda_array_interface__`` object's memory, after its producer's work.

        What ``cupy.asarray`` does, without the stream synchronisation it makes for a version-3
        interface that names a stream (``cudaStreamSynchronize``: the host waits): the current stream
        waits for that stream on the device instead, which orders every use the paths make (they all
        follow the current stream). A masked array goes to cupy, which refuses it.

        Args:
            x: The object.
            face: Its ``__cuda_array_interface__`` (read once: it is often a property that builds it).
        """
        if face.get("mask") is not None:
            return self.cp.asarray(x)
        typestr = face["typestr"]
        dtype = self._dtypes.get(typestr)
        if dtype is None:
            dtype = self._dtypes[typestr] = np.dtype(typestr)
        shape = tuple(face["shape"])
        strides = face.get("strides")
        strides = None if strides is None else tuple(strides)
        ptr = int(face["data"][0])
        device = self._device()
        if ptr and 0 not in shape:  # where the memory lies, as cupy finds it (a zero-size array has none)
            facts = self.cp.cuda.runtime.pointerGetAttributes(ptr)
            if facts.type in (_MEMORY_DEVICE, _MEMORY_MANAGED):
                device = int(facts.device)
        stream = face.get("stream") if face.get("version", 0) >= 3 else None
        return self.over(ptr, shape, strides, dtype, device, x, None if stream is None else int(stream))

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


#: The address of a host array's first byte: kept for the staging buffers lent now, else read.
_address = lent_address


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
