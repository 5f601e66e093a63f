"""Fake ``cupy.cuda``: devices, maximally lazy streams and events, memory pointers, pinned memory.

A stream is a queue of host closures that run only when something waits for them: ``synchronize``,
an event's ``synchronize``/``done``, or another stream that reached a ``wait_event`` for it. So a
missing wait reads stale data (or poison) instead of passing by luck.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from .. import _memory
from . import runtime

__all__ = [
    "Device",
    "Event",
    "MemoryPointer",
    "PinnedMemory",
    "PinnedMemoryPointer",
    "PinnedMemoryPool",
    "Stream",
    "UnownedMemory",
    "alloc_pinned_memory",
    "get_current_stream",
    "get_elapsed_time",
    "is_available",
    "runtime",
    "set_pinned_memory_allocator",
]


def _device_count() -> int:
    return runtime.getDeviceCount()


class _State(threading.local):
    def __init__(self) -> None:
        self.device = 0
        self.streams: dict[int, Stream] = {}


_state = _State()
runtime._current = _state


def is_available() -> bool:
    return True


class Device:
    """A fake CUDA device: ``id``, ``use()``, and a context manager that makes it current."""

    id: int = 0  # cupy's is a read-only attribute of the class

    def __init__(self, device: Any = None) -> None:
        self.id = _state.device if device is None else int(device)
        if not 0 <= self.id < _device_count():
            raise runtime.CUDARuntimeError(f"cudaErrorInvalidDevice: device {self.id} of {_device_count()}")
        self._prev: list[int] = []

    def use(self) -> None:
        _state.device = self.id

    def __enter__(self) -> Device:
        self._prev.append(_state.device)
        self.use()
        return self

    def __exit__(self, *exc: object) -> None:
        _state.device = self._prev.pop()

    def synchronize(self) -> None:
        for stream in list(Stream._live.values()):
            if stream.device_id == self.id:
                stream.synchronize()

    @property
    def compute_capability(self) -> str:
        return "90"

    def __int__(self) -> int:
        return self.id

    def __index__(self) -> int:
        return self.id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


class Stream:
    """A lazy stream: work queued on it runs when someone waits for it, in order."""

    _live: ClassVar[weakref.WeakValueDictionary[int, Stream]] = weakref.WeakValueDictionary()
    _ptrs = itertools.count(0x5000)
    null: Stream

    def __init__(
        self, null: bool = False, non_blocking: bool = False, ptds: bool = False, priority: int = 0
    ) -> None:
        self.ptr = 0 if null else next(Stream._ptrs)
        self.non_blocking = non_blocking
        self.device_id = _state.device
        self._pending: collections.deque[Callable[[], object]] = collections.deque()
        self._issued = self._finished = 0
        self._lock = threading.RLock()
        self._prev: list[Stream | None] = []
        if not null:
            Stream._live[self.ptr] = self

    # -- fake-only: queue work
    def launch(self, fn: Callable[[], object]) -> None:
        """Queue ``fn`` (a "kernel" or copy) on this stream; it runs when the stream is waited for."""
        with self._lock:
            self._pending.append(fn)
            self._issued += 1

    def run(self, upto: int) -> None:
        """Run queued work until ``upto`` items have run (what waiting for that point means)."""
        with self._lock:
            while self._finished < upto:
                fn = self._pending.popleft()
                self._finished += 1
                fn()

    @property
    def pending(self) -> int:
        return self._issued - self._finished

    # -- cupy's API
    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        runtime._count("streamWaitEvent")
        stream, upto = event._stream, event._upto  # the point recorded now, as CUDA takes it
        if stream is not None:
            self.launch(lambda: stream.run(upto + 1))

    def synchronize(self) -> None:
        runtime._count("streamSynchronize")
        self.run(self._issued)

    @property
    def done(self) -> bool:
        """Queried work is treated as finished by then: it runs now (a GPU makes progress by itself)."""
        self.synchronize()
        return True

    def query(self) -> bool:
        return self.done

    def use(self) -> Stream:
        _state.streams[_state.device] = self
        return self

    def __enter__(self) -> Stream:
        self._prev.append(_state.streams.get(_state.device))
        self.use()
        return self

    def __exit__(self, *exc: object) -> None:
        prev = self._prev.pop()
        if prev is None:
            _state.streams.pop(_state.device, None)
        else:
            _state.streams[_state.device] = prev

    def __repr__(self) -> str:
        return f"<fake Stream {self.ptr:#x} device {self.device_id} pending {self.pending}>"


Stream.null = Stream(null=True)
Stream._live[0] = Stream.null


def get_current_stream(device_id: int | None = None) -> Stream:
    dev = _state.device if device_id is None else int(device_id)
    return _state.streams.get(dev, Stream.null)


def stream_of(ptr: int) -> Stream:
    """The stream with handle ``ptr`` (0 and 1, the legacy default stream: the null stream)."""
    if ptr in (0, 1):
        return Stream.null
    stream = Stream._live.get(int(ptr))
    if stream is None:
        raise runtime.CUDARuntimeError(f"cudaErrorInvalidResourceHandle: no stream {ptr:#x}")
    return stream


runtime._stream_of = stream_of


class Event:
    """A point in a stream's queue; waiting for it runs the stream up to there."""

    _ptrs = itertools.count(0x9000)
    _live: ClassVar[weakref.WeakValueDictionary[int, Event]] = weakref.WeakValueDictionary()

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self._ptr = 0
        runtime._count("eventCreate")

    @property
    def ptr(self) -> int:
        """The handle, made (and registered for the runtime's calls) when first read."""
        if not self._ptr:
            self._ptr = next(Event._ptrs)
            Event._live[self._ptr] = self
        return self._ptr
        self._stream: Stream | None = None
        self._upto = 0
        self._stamp: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        runtime._count("eventRecord")
        self._stream = get_current_stream() if stream is None else stream
        self._upto = self._stream._issued
        self._stamp = None
        self._stream.launch(self._mark)

    def _mark(self) -> None:
        self._stamp = time.perf_counter()

    def synchronize(self) -> None:
        runtime._count("eventSynchronize")
        if self._stream is not None:
            self._stream.run(self._upto + 1)

    @property
    def done(self) -> bool:
        self.synchronize()
        return True

    def query(self) -> bool:
        return self.done


def event_of(ptr: int) -> Event:
    """The event with handle ``ptr``."""
    event = Event._live.get(int(ptr))
    if event is None:
        raise runtime.CUDARuntimeError(f"cudaErrorInvalidResourceHandle: no event {ptr:#x}")
    return event


runtime._event_of = event_of


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """Milliseconds between two events (each is run to first)."""
    start_event.synchronize()
    end_event.synchronize()
    return 1000.0 * ((end_event._stamp or 0.0) - (start_event._stamp or 0.0))


class MemoryPointer:
    """``ndarray.data``: the memory and the address of the array's first element (``offset`` into it)."""

    ptr: int = 0  # cupy's is a read-only attribute of the class

    def __init__(self, mem: Any, offset: int) -> None:
        self.mem, self.ptr = mem, int(mem.ptr) + int(offset)
        self.device_id = getattr(mem, "device_id", 0)

    @property
    def device(self) -> Device:
        return Device(self.device_id)

    def __int__(self) -> int:
        return self.ptr


class UnownedMemory(_memory.Memory):
    """Device memory another library owns (``owner`` is kept alive): registered as device memory here.

    As cupy's, ``device_id=-1`` asks the pointer's device (``cudaPointerGetAttributes``).
    """

    def __init__(self, ptr: int, size: int, owner: Any, device_id: int = -1) -> None:
        if device_id < 0:
            facts = runtime.pointerGetAttributes(ptr)
            device_id = facts.device if facts.type == runtime.memoryTypeDevice else _state.device
        if size:  # keep=None would allocate: an owner of None keeps nothing
            super().__init__(size, device_id, keep=() if owner is None else owner, ptr=ptr)
        else:  # nothing to point at: a private empty allocation
            super().__init__(0, device_id)
        self.owner = owner


# ------------------------------------------------------------------ pinned memory


class PinnedMemory(_memory.Memory):
    """One page-locked host allocation (a fake: ordinary memory, registered as pinned, poisoned)."""

    def __init__(self, size: int, flags: int = 0) -> None:
        super().__init__(size, -1, _memory.PINNED)


class PinnedMemoryPointer:
    """A pointer into pinned memory with the buffer protocol (``numpy.frombuffer`` takes it), as cupy's.

    The fake builds it as a ctypes array over the memory (Python 3.11 classes cannot export buffers
    otherwise); arrays made over it keep it, and so its memory, alive.
    """

    def __new__(cls, mem: PinnedMemory, offset: int) -> Any:  # type: ignore[misc]
        size = mem.size - int(offset)
        view = type("PinnedMemoryPointer", (ctypes.c_ubyte * size,), {"size": lambda self: size})
        out = view.from_address(mem.ptr + int(offset))
        out.mem, out.ptr = mem, mem.ptr + int(offset)
        return out


class PinnedMemoryPool:
    """Like cupy's: freed blocks are kept, by size, for the next request of that size."""

    def __init__(self, allocator: Callable[[int], PinnedMemory] = PinnedMemory) -> None:
        self._alloc = allocator
        self._free: dict[int, list[PinnedMemory]] = {}
        self._lock = threading.Lock()

    def malloc(self, size: int) -> PinnedMemoryPointer:
        size = max(512, -(-int(size) // 512) * 512)
        with self._lock:
            blocks = self._free.get(size)
            mem = blocks.pop() if blocks else self._alloc(size)
        ptr = PinnedMemoryPointer(mem, 0)
        weakref.finalize(ptr, self._give_back, mem)
        return ptr

    def _give_back(self, mem: PinnedMemory) -> None:
        with self._lock:
            self._free.setdefault(mem.size, []).append(mem)

    def free_all_blocks(self) -> None:
        with self._lock:
            self._free.clear()

    def n_free_blocks(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._free.values())

    def total_bytes(self) -> int:
        with self._lock:
            return sum(m.size for b in self._free.values() for m in b)


_default_pinned_pool = PinnedMemoryPool()
_pinned_allocator: list[Callable[[int], Any] | None] = [_default_pinned_pool.malloc]


def set_pinned_memory_allocator(allocator: Callable[[int], Any] | None = None) -> None:
    _pinned_allocator[0] = allocator


def alloc_pinned_memory(size: int) -> PinnedMemoryPointer:
    alloc = _pinned_allocator[0]
    if alloc is None:
        return PinnedMemoryPointer(PinnedMemory(size), 0)
    out: PinnedMemoryPointer = alloc(size)
    return out


def pinned_array(shape: Any, dtype: Any, order: str = "C") -> np.ndarray:
    """A numpy array over freshly allocated pinned memory (cupyx.empty_pinned)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    ptr = alloc_pinned_memory(nbytes)
    flat = np.frombuffer(ptr, np.uint8, nbytes)
    return flat.view(dtype).reshape(shape, order=order)  # type: ignore[call-overload]
