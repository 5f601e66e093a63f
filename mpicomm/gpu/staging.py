"""Host staging for MPI libraries that are not CUDA-aware: a pool of reusable host buffers and chunk plans.

Device data goes device → host buffer → MPI → host buffer → device. Two things make that fast:

* the host buffers are allocated once and reused (:class:`HostBufferPool`); on a GPU they are pinned
  (page-locked) memory, which copies at full PCIe/NVLink speed and can be copied asynchronously;
* a large message is cut into chunks (:func:`plan_chunks`) that alternate between two buffers, so that
  the copy of chunk ``i + 1`` runs while MPI moves chunk ``i`` (double buffering).

Nothing here imports cupy: the pool takes an allocator (numpy memory on the CPU, as in the tests;
:func:`pinned_allocator` on a GPU), and the plans are plain numbers.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.chunks import CHUNK_ENV_VAR, DEFAULT_CHUNK_BYTES, chunk_bytes, chunk_step
from ..errors import ArgumentError, ArgumentTypeError

__all__ = [
    "CHUNK_ENV_VAR",
    "DEFAULT_CHUNK_BYTES",
    "Chunk",
    "ChunkPlan",
    "HostBufferPool",
    "PoolStats",
    "chunk_bytes",
    "chunk_step",
    "forget_address",
    "keep_address",
    "lent_address",
    "numpy_allocator",
    "pinned_allocator",
    "plan_chunks",
    "size_class",
]

#: The smallest size class of the pool: smaller requests share 4 KiB buffers.
MIN_CLASS_BYTES = 4 << 10

# Above this size the classes are quarter steps between powers of two.
_FINE_FROM = 64 << 10

#: An allocator takes a byte count and returns a 1-D ``uint8`` host array of that many bytes.
Allocator = Callable[[int], np.ndarray]

#: The host views of staged calls in flight, by id, with their addresses: reading an address from
#: ``__array_interface__`` costs ~0.9 us, twice per small staged call. An entry holds its view, so
#: no other array can take its id while it is there; :func:`forget_address` drops it.
_ADDRESSES: dict[int, tuple[np.ndarray, int]] = {}


def lent_address(host: np.ndarray) -> int:
    """The address of ``host``'s first byte: kept by :func:`keep_address`, else read from numpy.

    Example:
        >>> import numpy as np
        >>> from mpicomm.gpu.staging import lent_address
        >>> a = np.zeros(4)
        >>> lent_address(a) == a.ctypes.data
        True
    """
    entry = _ADDRESSES.get(id(host))
    if entry is not None:
        return entry[1]
    address: int = host.__array_interface__["data"][0]
    return address


def keep_address(host: np.ndarray, address: int) -> None:
    """Remember ``host``'s address (its first byte) until :func:`forget_address`; holds ``host``."""
    _ADDRESSES[id(host)] = (host, address)


def forget_address(host: np.ndarray) -> None:
    """Drop what :func:`keep_address` kept for ``host``."""
    _ADDRESSES.pop(id(host), None)


def numpy_allocator(nbytes: int) -> np.ndarray:
    """Allocate ``nbytes`` of ordinary (pageable) host memory; the pool's default.

    Example:
        >>> from mpicomm.gpu.staging import numpy_allocator
        >>> numpy_allocator(16).nbytes
        16
    """
    return np.empty(nbytes, np.uint8)


def pinned_allocator(nbytes: int) -> np.ndarray:
    """Allocate ``nbytes`` of pinned host memory through cupy (imported here, not at module import).

    The memory comes straight from ``cudaHostAlloc`` (``cupy.cuda.PinnedMemory``), not from cupy's
    pinned memory pool: that pool keeps every freed block for reuse, so memory the
    :class:`HostBufferPool` frees to stay under its cap would stay pinned. It is freed when the
    returned array (and every view of it) is.

    Raises:
        ModuleNotFoundError: cupy is not installed.

    Example:
        >>> from mpicomm.gpu.staging import pinned_allocator
        >>> callable(pinned_allocator)
        True
    """
    cuda: Any = importlib.import_module("cupy.cuda")
    mem = cuda.PinnedMemory(nbytes)
    out: np.ndarray = np.frombuffer(cuda.PinnedMemoryPointer(mem, 0), np.uint8, nbytes)
    return out


def size_class(nbytes: int) -> int:
    """The buffer size the pool uses for a request of ``nbytes``: at least 4 KiB, at most 25% more.

    Up to 64 KiB the classes are powers of two; above, each power of two is cut in four steps
    (1, 1.25, 1.5 and 1.75 times it), so that a buffer serves many request sizes while holding at
    most a quarter more memory than asked (plain powers of two could nearly double it).

    Example:
        >>> from mpicomm.gpu.staging import size_class
        >>> size_class(0), size_class(4096), size_class(4097), size_class(3 << 20), size_class((4 << 20) + 1)
        (4096, 4096, 8192, 3145728, 5242880)
    """
    n = max(MIN_CLASS_BYTES, int(nbytes))
    top = 1 << (n - 1).bit_length()
    if top <= _FINE_FROM:
        return top
    step = top // 8  # the classes between top / 2 and top are top / 2 + k * top / 8
    return -(-n // step) * step


#: Request sizes seen -> their size class (a small call asks the same few sizes again and again).
_CLASSES: dict[int, int] = {}


def _size_class_kept(nbytes: int) -> int:
    if len(_CLASSES) >= 1024:  # many sizes: start again rather than grow without bound
        _CLASSES.clear()
    size = _CLASSES[nbytes] = size_class(nbytes)
    return size


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's bookkeeping.

    Attributes:
        allocations: Buffers allocated and kept by the pool.
        reuses: Requests served by a buffer allocated earlier.
        overflows: Requests served by a one-off buffer because keeping it would pass the cap.
        evictions: Idle buffers freed to make room under the cap.
        bytes_held: Bytes of all buffers the pool keeps, in use or idle.
        bytes_in_use: Bytes of the kept buffers lent out now.
    """

    allocations: int
    reuses: int
    overflows: int
    evictions: int
    bytes_held: int
    bytes_in_use: int


class HostBufferPool:
    """Host buffers reused across calls, one free list per size class, holding at most ``cap_bytes``.

    A request takes an idle buffer of its size class if there is one, else allocates a new one. When
    a new buffer would take the pool over its cap, idle buffers of other classes are freed first
    (largest first); if that is not enough, the request gets a one-off buffer that is dropped when
    returned. So a pool never holds more than its cap, and a steady workload allocates nothing after
    its first call. The pool is safe to use from several threads.

    Args:
        allocator: Makes a buffer: takes a byte count, returns a 1-D ``uint8`` host array. Defaults
            to :func:`numpy_allocator`; the GPU path passes :func:`pinned_allocator`.
        cap_bytes: The most bytes the pool keeps; default 256 MiB.

    Raises:
        ArgumentTypeError: ``allocator`` is not callable or ``cap_bytes`` is not an int.
        ArgumentError: ``cap_bytes`` is negative.

    Example:
        >>> import numpy as np
        >>> from mpicomm.gpu.staging import HostBufferPool
        >>> pool = HostBufferPool()
        >>> with pool.borrow(1000) as buf:
        ...     buf[:3] = [1, 2, 3]
        >>> with pool.borrow(3000) as again:   # the same 4 KiB size class: reused
        ...     len(again)
        3000
        >>> pool.stats().allocations, pool.stats().reuses, pool.stats().bytes_held
        (1, 1, 4096)
    """

    def __init__(self, allocator: Allocator | None = None, cap_bytes: int = 256 << 20) -> None:
        if allocator is not None and not callable(allocator):
            raise ArgumentTypeError(
                f"HostBufferPool: allocator is a {type(allocator).__name__}; "
                "expected a callable(nbytes) -> array"
            )
        if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, (int, np.integer)):
            raise ArgumentTypeError(
                f"HostBufferPool: cap_bytes is a {type(cap_bytes).__name__}; expected an int"
            )
        if cap_bytes < 0:
            raise ArgumentError(f"HostBufferPool: cap_bytes is {cap_bytes}; expected 0 or more bytes")
        self._allocate = allocator or numpy_allocator
        self.cap_bytes = int(cap_bytes)
        self._free: dict[int, list[np.ndarray]] = {}
        # id of a kept buffer -> its address (read once, when it is allocated)
        self._at: dict[int, int] = {}
        # id of a lent view -> (the view, kept so that its id stays unique; its pooled buffer; size class)
        self._lent: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
        self._lock = threading.Lock()
        self._allocations = self._reuses = self._overflows = self._evictions = 0
        self._held = self._in_use = 0

    def acquire(self, nbytes: int) -> np.ndarray:
        """Lend a host buffer of exactly ``nbytes`` bytes (a view of a pooled buffer of its size class).

        Give it back with :meth:`release`, or use :meth:`borrow`, which does so for you.

        Args:
            nbytes: How many bytes are needed, 0 or more.

        Returns:
            A 1-D ``uint8`` array of ``nbytes`` bytes; its contents are whatever was there before.

        Raises:
            ArgumentTypeError: ``nbytes`` is not an int.
            ArgumentError: ``nbytes`` is negative.
        """
        if type(nbytes) is not int:  # the exact type first: a bool is refused below
            if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
                raise ArgumentTypeError(
                    f"HostBufferPool.acquire: nbytes is a {type(nbytes).__name__}; expected an int"
                )
            nbytes = int(nbytes)
        if nbytes < 0:
            raise ArgumentError(f"HostBufferPool.acquire: nbytes is {nbytes}; expected 0 or more")
        size = _CLASSES.get(nbytes) or _size_class_kept(nbytes)
        with self._lock:
            idle = self._free.get(size)
            if idle:
                base = idle.pop()
                self._reuses += 1
            elif self._make_room(size):
                base = self._new(size)
                self._at[id(base)] = lent_address(base)
                self._allocations += 1
                self._held += size
            else:
                self._overflows += 1
                return self._new(max(1, int(nbytes)))[:nbytes]  # one-off: exactly what is asked
            view = base[:nbytes]
            self._lent[id(view)] = (view, base, size)
            self._in_use += size
        return view

    def address(self, buf: np.ndarray) -> int | None:
        """The address of a buffer lent by :meth:`acquire` now (None for a one-off buffer).

        Example:
            >>> from mpicomm.gpu.staging import HostBufferPool
            >>> pool = HostBufferPool()
            >>> buf = pool.acquire(100)
            >>> pool.address(buf) == buf.ctypes.data
            True
        """
        entry = self._lent.get(id(buf))
        return None if entry is None else self._at.get(id(entry[1]))

    def release(self, buf: np.ndarray) -> None:
        """Take back a buffer lent by :meth:`acquire`; one-off (overflow) buffers are simply dropped.

        Args:
            buf: The array :meth:`acquire` returned.

        Raises:
            ArgumentError: ``buf`` is a pooled buffer that is not lent out now (returned twice).
        """
        with self._lock:
            entry = self._lent.pop(id(buf), None)
            if entry is None:
                if any(np.may_share_memory(b, buf) for bufs in self._free.values() for b in bufs):
                    raise ArgumentError(
                        "HostBufferPool.release: buf was already released; expected a lent buffer"
                    )
                return
            _, base, size = entry
            self._in_use -= size
            self._free.setdefault(size, []).append(base)

    @contextmanager
    def borrow(self, nbytes: int) -> Iterator[np.ndarray]:
        """Lend a buffer of ``nbytes`` bytes for the ``with`` block, and take it back after.

        Example:
            >>> from mpicomm.gpu.staging import HostBufferPool
            >>> with HostBufferPool().borrow(8) as buf:
            ...     buf.view("float64").shape
            (1,)
        """
        buf = self.acquire(nbytes)
        try:
            yield buf
        finally:
            self.release(buf)

    def stats(self) -> PoolStats:
        """The pool's counters now.

        Example:
            >>> from mpicomm.gpu.staging import HostBufferPool
            >>> HostBufferPool().stats().bytes_held
            0
        """
        with self._lock:
            return PoolStats(
                self._allocations, self._reuses, self._overflows, self._evictions, self._held, self._in_use
            )

    def clear(self) -> None:
        """Free every idle buffer (lent ones stay lent and come back to the pool when released)."""
        with self._lock:
            for size, bufs in self._free.items():
                self._held -= size * len(bufs)
                for b in bufs:
                    self._at.pop(id(b), None)
            self._free.clear()

    def _make_room(self, size: int) -> bool:
        """Free idle buffers, largest first, until ``size`` more bytes fit under the cap; False if not."""
        if self._in_use + size > self.cap_bytes:
            return False
        for cls in sorted(self._free, reverse=True):
            bufs = self._free[cls]
            while bufs and self._held + size > self.cap_bytes:
                self._at.pop(id(bufs.pop()), None)
                self._held -= cls
                self._evictions += 1
        return self._held + size <= self.cap_bytes

    def _new(self, size: int) -> np.ndarray:
        buf = self._allocate(size)
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1 or buf.nbytes < size:
            raise ArgumentTypeError(
                f"HostBufferPool: the allocator returned {type(buf).__name__} "
                f"{getattr(buf, 'dtype', '')} {getattr(buf, 'shape', '')}; expected a 1-D uint8 numpy array "
                f"of {size} bytes"
            )
        return buf


@dataclass(frozen=True)
class Chunk:
    """One piece of a staged message.

    Attributes:
        index: The chunk's position, from 0.
        start: Its first byte in the message.
        stop: One past its last byte.
        buffer: Which staging buffer it uses, ``index % buffers``: chunk ``i + 1`` is copied into the
            other buffer while chunk ``i`` is in flight.
    """

    index: int
    start: int
    stop: int
    buffer: int

    @property
    def nbytes(self) -> int:
        """The chunk's length in bytes."""
        return self.stop - self.start


@dataclass(frozen=True)
class ChunkPlan:
    """How a message of ``nbytes`` is cut into chunks, each a whole number of elements.

    Attributes:
        nbytes: The message's length in bytes.
        itemsize: The element size the chunks are aligned to.
        chunk_bytes: The length of every chunk but the last (a multiple of ``itemsize``).
        buffers: How many staging buffers the chunks rotate through (2: double buffering).
        chunks: The chunks in order; empty for an empty message.
    """

    nbytes: int
    itemsize: int
    chunk_bytes: int
    buffers: int
    chunks: tuple[Chunk, ...]

    def __len__(self) -> int:
        return len(self.chunks)

    def __iter__(self) -> Iterator[Chunk]:
        return iter(self.chunks)

    @property
    def buffer_bytes(self) -> int:
        """The size each staging buffer needs, that is the largest chunk (0 for an empty message)."""
        return min(self.chunk_bytes, self.nbytes)


def plan_chunks(nbytes: int, itemsize: int = 1, chunk: int | None = None, buffers: int = 2) -> ChunkPlan:
    """Cut a message of ``nbytes`` into chunks of about ``chunk`` bytes that hold whole elements.

    The chunk length is ``chunk`` rounded down to a multiple of ``itemsize`` (at least one element);
    the last chunk holds what is left. Chunk ``i`` uses staging buffer ``i % buffers``.

    Args:
        nbytes: The message's length in bytes, a multiple of ``itemsize``.
        itemsize: The element size in bytes.
        chunk: The target chunk length; ``None`` reads :func:`chunk_bytes` (``MPICOMM_STAGING_CHUNK``).
        buffers: How many staging buffers the chunks rotate through; 2 for double buffering.

    Returns:
        The plan.

    Raises:
        ArgumentTypeError: an argument is not an int.
        ArgumentError: a size is negative or zero where it must be positive, or ``nbytes`` is not a
            multiple of ``itemsize``.

    Example:
        >>> from mpicomm.gpu.staging import plan_chunks
        >>> plan = plan_chunks(80, itemsize=8, chunk=30)   # 24-byte chunks: 3 float64 each
        >>> [(c.start, c.stop, c.buffer) for c in plan]
        [(0, 24, 0), (24, 48, 1), (48, 72, 0), (72, 80, 1)]
    """
    fn = "plan_chunks"
    for name, value in (("nbytes", nbytes), ("itemsize", itemsize), ("chunk", chunk), ("buffers", buffers)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
            raise ArgumentTypeError(f"{fn}: {name} is a {type(value).__name__}; expected an int")
    if nbytes < 0:
        raise ArgumentError(f"{fn}: nbytes is {nbytes}; expected 0 or more")
    for name, value in (("itemsize", itemsize), ("chunk", chunk), ("buffers", buffers)):
        if value is not None and value < 1:
            raise ArgumentError(f"{fn}: {name} is {value}; expected 1 or more")
    target = chunk_bytes() if chunk is None else int(chunk)
    step = chunk_step(itemsize, target)
    if nbytes % itemsize:
        raise ArgumentError(
            f"{fn}: nbytes is {nbytes}, which is not a multiple of itemsize {itemsize}; "
            "expected whole elements"
        )
    starts = np.arange(0, int(nbytes), step, dtype=np.int64)
    stops = np.minimum(starts + step, int(nbytes))
    index = np.arange(starts.size)
    chunks = tuple(
        Chunk(int(i), int(a), int(b), int(k))
        for i, a, b, k in zip(index, starts, stops, index % buffers, strict=True)
    )
    return ChunkPlan(int(nbytes), int(itemsize), step, int(buffers), chunks)
