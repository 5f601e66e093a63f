"""Device buffers of the object collectives: cupy arrays and torch CUDA tensors sent as device memory.

The pickler (:mod:`mpicomm.objects.pickling`) takes every device array out of the stream, whatever its
size: the stream holds its dtype, shape and kind, and the array itself (made C-contiguous, in the
order of the caller's current stream) joins the call's out-of-band buffers. Each buffer's header word
is ``2 * bytes + flag``, the flag 1 for a device buffer, so every rank knows which buffers are device
memory and how large each is before anything is received, and makes the same MPI calls.

Where each side's memory lies is its own choice, made by :class:`Hooks` (set by
:func:`mpicomm.wiring.objects` from the GPU backend):

* **direct** (a CUDA-aware MPI): the sender waits for its current stream, then MPI reads the device
  memory; the receiver allocates a device buffer on its current device and MPI writes into it. Device
  memory goes to mpi4py as an object that exposes only ``__cuda_array_interface__``.
* **staged**: the sender copies each device buffer into pinned host memory (after the work queued on
  its current stream) and MPI sends that; the receiver receives into pinned host memory and uploads
  it into a new device buffer.

The wire carries the same bytes either way, so a direct sender and a staged receiver (or the reverse)
work together. The rebuilt arrays view those device buffers: no array byte is pickled, and on the
direct path none passes through host memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _mpi
from ..errors import ArgumentTypeError

__all__ = ["CudaBuffer", "Hooks", "Incoming", "Outgoing", "spec", "split_words", "words"]

U8 = np.uint8
Alloc = Callable[[int], np.ndarray]


class Hooks:
    """How the object collectives reach the GPU; :func:`mpicomm.wiring.objects` fills these in.

    ``backend()`` gives the GPU backend (:mod:`mpicomm.gpu.backend`), ``direct()`` whether this rank
    hands device memory to MPI, ``pool()`` the pinned host buffer pool, ``view(x)`` the backend's
    array over a device array of any kind (a torch CUDA tensor, a ``__cuda_array_interface__`` object).
    """

    backend: Callable[[], Any] | None = None
    direct: Callable[[], bool] | None = None
    pool: Callable[[], Any] | None = None
    view: Callable[[Any], Any] | None = None


def _need(hook: Callable[..., Any] | None, name: str) -> Callable[..., Any]:
    if hook is None:
        raise ArgumentTypeError(
            f"object collectives: a device array was given but the GPU hooks are not set ({name}); "
            "expected the calls from mpicomm (mpicomm.all_gather_object, ...: mpicomm.wiring.objects() "
            "sets them)"
        )
    return hook


class CudaBuffer:
    """A device array as MPI takes it: its ``__cuda_array_interface__`` only (a device pointer).

    mpi4py reads the CUDA array interface of any object; handing it this one alone keeps every
    device array kind on the same, simplest protocol (no DLPack capsule to negotiate).
    """

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, x: Any) -> None:
        self.__cuda_array_interface__ = x.__cuda_array_interface__


def words(buffers: Sequence[Any]) -> list[int]:
    """The header words of out-of-band buffers: ``2 * bytes + 1`` for device memory, ``2 * bytes`` else.

    A buffer is host memory if and only if it is a ``memoryview`` (what pickle hands out for numpy
    arrays); :class:`Outgoing` and :func:`own_copy` use the same rule.

    Example:
        >>> words([memoryview(b"abc")])
        [6]
    """
    return [2 * int(b.nbytes) + (type(b) is not memoryview) for b in buffers]


def split_words(words: Sequence[int]) -> tuple[list[int], list[bool]]:
    """Buffer sizes in bytes and device flags from header words (a negative word stays negative).

    Example:
        >>> split_words([8, 9, 0, -4])
        ([4, 4, 0, -2], [False, True, False, False])
    """
    return [w >> 1 for w in words], [w > 0 and w & 1 == 1 for w in words]


def spec(piece: Any) -> list[Any]:
    """The MPI buffer of a flat uint8 piece: host memory as it is, device memory by its CUDA interface."""
    if isinstance(piece, np.ndarray):
        return [piece, _mpi.MPI.BYTE]
    return [CudaBuffer(piece), _mpi.MPI.BYTE]


def flat_bytes(x: Any) -> Any:
    """A flat uint8 view of a C-contiguous device array."""
    return x.reshape(-1).view(U8)


def contiguous(x: Any) -> Any:
    """A device array (of any kind) as a C-contiguous backend array, queued on the current stream."""
    be = _need(Hooks.backend, "backend")()
    return be.contiguous(_need(Hooks.view, "view")(x))


class Outgoing:
    """The buffers one rank sends: host ones as they are, device ones direct or through pinned memory.

    Call :meth:`close` once every send has completed (it gives the pinned buffers back).
    """

    def __init__(self, buffers: Sequence[Any]) -> None:
        self.lent: list[np.ndarray] = []
        self.bufs: list[Any] = [np.frombuffer(b, U8) for b in buffers if type(b) is memoryview]
        if len(self.bufs) == len(buffers):
            return
        self.bufs = []
        be = _need(Hooks.backend, "backend")()
        stream = be.current_stream()
        direct = _need(Hooks.direct, "direct")()
        pool: Any = None if direct else _need(Hooks.pool, "pool")()
        try:
            for b in buffers:
                if isinstance(b, memoryview):
                    self.bufs.append(np.frombuffer(b, U8))
                elif direct:
                    self.bufs.append(flat_bytes(b))
                else:
                    host = pool.acquire(int(b.nbytes))
                    self.lent.append(host)
                    be.to_host(host, flat_bytes(b), stream)  # after the work already queued on the stream
                    self.bufs.append(host)
        finally:
            stream.synchronize()  # MPI reads device memory (direct) or the host copies (staged) next
            if len(self.bufs) < len(buffers):  # a copy failed: its pinned buffers go back at once
                self.close()

    def close(self) -> None:
        """Give the pinned buffers back."""
        if self.lent:
            pool = _need(Hooks.pool, "pool")()
            for h in self.lent:
                pool.release(h)
            self.lent = []


class Incoming:
    """Receive buffers for one sender's buffers, by their header words; :meth:`finish` gives the arrays.

    Host buffers are new numpy arrays; device buffers are device arrays on the current device (direct)
    or pinned host buffers that :meth:`finish` uploads. If the device buffers cannot be allocated here
    (no GPU, out of memory), every buffer is received into host memory all the same, so that the
    sender is not left blocked, and :attr:`error` keeps the cause for :meth:`result` to report.
    """

    def __init__(
        self, sizes: Sequence[int], flags: Sequence[bool], alloc: Callable[[int], np.ndarray]
    ) -> None:
        self.bufs: list[Any] = []
        self.up: list[tuple[int, np.ndarray]] = []
        self.error: Exception | None = None
        if any(flags):
            try:
                self._device(sizes, flags, alloc)
                return
            except Exception as exc:  # no GPU here (no cupy): receive into host memory all the same
                self.drop()  # and report the cause once the transfers are done (result)
                self.bufs, self.error = [], exc
        self.bufs = [alloc(s) for s in sizes]

    def _device(
        self, sizes: Sequence[int], flags: Sequence[bool], alloc: Callable[[int], np.ndarray]
    ) -> None:
        be = _need(Hooks.backend, "backend")()
        direct = _need(Hooks.direct, "direct")()
        pool: Any = None if direct else _need(Hooks.pool, "pool")()
        for i, (size, dev) in enumerate(zip(sizes, flags, strict=True)):
            if not dev:
                self.bufs.append(alloc(size))
            elif direct:
                self.bufs.append(be.empty((size,), U8))
            else:
                host = pool.acquire(size)
                self.up.append((i, host))
                self.bufs.append(host)
        if direct:  # memory the device pool hands out may still be read by work queued before: MPI
            be.current_stream().synchronize()  # writes outside stream order, so that work finishes first

    def finish(self) -> list[Any]:
        """The received buffers: numpy arrays for host buffers, flat uint8 device arrays for device ones."""
        if not self.up:
            return self.bufs
        be = _need(Hooks.backend, "backend")()
        pool = _need(Hooks.pool, "pool")()
        stream = be.current_stream()
        out = list(self.bufs)
        queued = False
        try:
            for i, host in self.up:
                dev = be.empty((host.size,), U8)
                queued = True
                be.to_device(dev, host, stream)
                out[i] = dev
            stream.synchronize()  # the pinned buffers are read before they go back to the pool
            queued = False
        finally:
            if queued:  # a later upload failed: the earlier ones may still read their buffers
                with contextlib.suppress(Exception):  # the upload's error is the one to report
                    stream.synchronize()
            for _, host in self.up:
                pool.release(host)
            self.up = []
        return out

    def result(self) -> tuple[list[Any], Exception | None]:
        """What :meth:`finish` gives, or (``[]``, the error) if allocating or uploading failed; never raises.

        Call it once every receive has completed: a rank that fails here still took part in them.
        """
        if self.error is None:
            try:
                return self.finish(), None
            except Exception as exc:
                self.error = exc
        self.drop()
        return [], self.error

    def drop(self) -> None:
        """Give the pinned buffers back without uploading (a failed call)."""
        if self.up:
            pool = _need(Hooks.pool, "pool")()
            for _, host in self.up:
                pool.release(host)
            self.up = []


def own_copy(buf: Any) -> Any:
    """A copy of one of this rank's own buffers in its memory (host, or device on its current stream)."""
    if isinstance(buf, memoryview):
        return np.frombuffer(buf, U8).copy()
    return flat_bytes(buf).copy()
