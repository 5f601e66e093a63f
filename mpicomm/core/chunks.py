"""Chunks on the wire: one MPI call sequence per call, whatever array kind each rank holds.

Which MPI calls a collective makes (how many, their sizes and order) may depend only on what every
rank of a correct call knows alike: sizes, dtype, op, group and the chunk setting
``MPICOMM_STAGING_CHUNK``, never on whether a rank holds numpy, torch, cupy or a torch CUDA tensor.
Device ranks pipeline a large ``all_reduce``, ``broadcast``, ``reduce`` or equal-split
``all_to_all_single`` in chunks of that size (``mpicomm.gpu.pipeline``), so that the copies overlap
MPI. Host ranks do not chunk: cut in 4 MiB calls, a host broadcast of 16 MiB ran 1.6-1.8x slower
and an all_reduce 1.1-1.2x (2 ranks, MPICH, same run). So a call longer than one chunk (:func:`step`)
first asks every rank whether it would pipeline (:func:`split`: one ``MPI_Allreduce`` of one int,
a few microseconds beside a call of milliseconds): the message goes in chunks only where every rank
pipelines, otherwise in one call everywhere (device ranks then stage it whole). Where no rank has
loaded the GPU paths when a group first asks, the group is host-only from then on and nobody asks
again (issue 44: the question cost large host all_reduces 1.05-1.09x raw); the question travels on
the group's private communicator, so that the data communicator sees only the program's own calls.
Every path asks: the host code (a host rank, or a device rank's staged call on its host buffers),
the pipeline and the direct path. ``all_to_all_single`` counts per destination block, whose chunks take a
``1 / group size`` share; ``reduce_scatter_tensor`` is never chunked.

The setting is read once, when mpicomm is imported, and again by :func:`reload`: reading the
environment costs about 0.3 us, as much as a small call's own work. Set it alike on every rank.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _mpi
from ..errors import ArgumentError
from ..sizes import parse_size
from . import cmpi
from .groups import _State

__all__ = [
    "CHUNK_ENV_VAR",
    "DEFAULT_CHUNK_BYTES",
    "ONE_CALL",
    "WIDEST",
    "Setting",
    "answered",
    "chunk_bytes",
    "chunk_step",
    "reload",
    "split",
    "step",
]

#: The environment variable that sets the chunk size of large messages.
CHUNK_ENV_VAR = "MPICOMM_STAGING_CHUNK"

#: The chunk size when ``MPICOMM_STAGING_CHUNK`` is unset: 4 MiB, large enough to reach full copy and
#: network bandwidth, small enough that two chunks' copies overlap well.
DEFAULT_CHUNK_BYTES = 4 << 20

# A chunk must fit an MPI count of bytes in a C int.
_MAX_CHUNK_BYTES = 2**31 - 1


def chunk_bytes(env: Mapping[str, str] | None = None) -> int:
    """The chunk size from ``MPICOMM_STAGING_CHUNK``, or 4 MiB where it is unset or empty.

    The value is a byte count with an optional binary unit: ``1048576``, ``512K``, ``4M``, ``4MiB``,
    ``1G`` (case does not matter). This reads the environment now; the calls use the value
    ``reload()`` kept.

    Args:
        env: The environment to read; ``None`` for ``os.environ``.

    Returns:
        The chunk size in bytes.

    Raises:
        ArgumentError: the value is not a size, is 0, or is above 2**31 - 1 bytes.

    Example:
        >>> from mpicomm.core.chunks import chunk_bytes
        >>> chunk_bytes({}), chunk_bytes({"MPICOMM_STAGING_CHUNK": "512K"})
        (4194304, 524288)
        >>> chunk_bytes({"MPICOMM_STAGING_CHUNK": "1MiB"})
        1048576
    """
    raw = (os.environ if env is None else env).get(CHUNK_ENV_VAR, "")
    if not raw.strip():
        return DEFAULT_CHUNK_BYTES
    value = parse_size(raw, "chunk_bytes", f"environment variable {CHUNK_ENV_VAR}")
    if not 0 < value <= _MAX_CHUNK_BYTES:
        raise ArgumentError(
            f"chunk_bytes: environment variable {CHUNK_ENV_VAR} is {raw!r} ({value} bytes); expected 1 to "
            f"{_MAX_CHUNK_BYTES} bytes"
        )
    return value


def chunk_step(itemsize: int, chunk: int) -> int:
    """The length of a full chunk: ``chunk`` bytes rounded down to whole elements, at least one element.

    Example:
        >>> from mpicomm.core.chunks import chunk_step
        >>> chunk_step(8, 30), chunk_step(16, 4)
        (24, 16)
    """
    return max(itemsize, chunk - chunk % itemsize)


#: The widest element :attr:`Setting.few` allows for: 64 bytes, twice numpy's widest number
#: (``complex256``), so that every dtype a reduction accepts is covered.
WIDEST = 64


class _Setting:
    """The chunk setting the calls use (kept by :func:`reload`); its one instance is :data:`Setting`.

    An instance, not a class of constants: Python 3.11 specialises attribute reads on instances
    with slots (a few instructions), not on classes (a type lookup each, about 130 instructions),
    and the small calls read it on every call.

    Attributes:
        bytes: The chunk size; -1 where ``MPICOMM_STAGING_CHUNK`` is not valid (calls then raise its error).
        least: Messages of at most this many bytes are never chunked (a cheap test before :func:`step`).
        few: Arrays of at most this many elements of at most :data:`WIDEST` bytes each are never
            chunked: ``size <= few`` is the reductions' first test (``size`` costs half of ``nbytes``).
    """

    __slots__ = ("bytes", "few", "least")

    def __init__(self) -> None:
        self.bytes = DEFAULT_CHUNK_BYTES
        self.least = DEFAULT_CHUNK_BYTES // 2
        self.few = DEFAULT_CHUNK_BYTES // 2 // WIDEST


#: The chunk setting every call reads (:func:`reload` keeps it).
Setting = _Setting()


def reload() -> int:
    """Read ``MPICOMM_STAGING_CHUNK`` again; every later call uses the new value (-1: not valid).

    Example:
        >>> from mpicomm.core.chunks import reload
        >>> reload() > 0
        True
    """
    try:
        Setting.bytes = chunk_bytes()
    except ArgumentError:
        Setting.bytes = -1  # every call that might chunk asks step(), which raises the error
    # all_to_all_single's test, nbytes // parts > chunk_step(itemsize, chunk // parts), implies
    # nbytes > chunk / 2 for any group size and itemsize; one bound serves every call
    Setting.least = Setting.bytes // 2 if Setting.bytes > 0 else -1
    Setting.few = Setting.least // WIDEST if Setting.least > 0 else -1
    return Setting.bytes


def step(nbytes: int, itemsize: int, parts: int = 1) -> int:
    """The chunk length (bytes per part) of a message of ``nbytes`` cut in ``parts`` blocks, or 0: one call.

    Args:
        nbytes: The message's bytes (all parts together).
        itemsize: The element size; chunks hold whole elements.
        parts: How many equal blocks move together, one chunk of each per call (the group size for
            ``all_to_all_single``, else 1).

    Returns:
        The bytes of each block's full chunks, or 0 where the message fits one chunk.

    Raises:
        ArgumentError: ``MPICOMM_STAGING_CHUNK`` is not valid.

    Example:
        >>> from mpicomm.core import chunks
        >>> chunks.step(4 << 20, 8), chunks.step((4 << 20) + 8, 8)
        (0, 4194304)
    """
    limit = Setting.bytes if Setting.bytes > 0 else chunk_bytes()
    full = chunk_step(itemsize, max(itemsize, limit // parts))
    return full if nbytes // parts > full else 0


reload()


class _Asked(threading.local):
    # inside an ``answered()`` block: this thread's ranks were all asked about the message the block's
    # (staged host) call sends, and answered "one call"; that call must not ask again
    answered: bool = False


_ASKED = _Asked()


class _OneCall:
    """The type of :data:`ONE_CALL` (a marker, one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "mpicomm.core.chunks.ONE_CALL"


#: What a device rank's pipeline returns where it asked every rank (:func:`split`) and heard "one
#: call": the caller then runs the host call whole, inside :func:`answered`, which does not ask again.
ONE_CALL: Any = _OneCall()


def split(comm: Any, mine: bool) -> bool:
    """Whether every rank of ``comm`` pipelines this call (``mine``: this rank would): chunks, or one call.

    Every rank of a call longer than one chunk calls this once, before its data calls (one
    ``MPI_Allreduce`` of one int, MIN). Inside an :class:`answered` block (a pipeline has already
    asked for the same message), it answers False without asking again.

    Args:
        comm: The group's communicator.
        mine: Whether this rank would send the message in chunks (a device rank's pipeline).

    Returns:
        True where every rank pipelines: the message goes in chunks everywhere.
    """
    if _ASKED.answered:
        _ASKED.answered = False
        return False
    if _HOST_ONLY.get(id(comm)) is comm:
        return False  # no rank could pipeline when this was asked first: one call, nobody asks
    # the question, and whether any rank could ever pipeline (has loaded the pipeline), in one call
    flag = np.array([1 if mine else 0, 0 if _GPU in sys.modules else 1], np.int32)
    mpi = _mpi.MPI
    side = _bookkeeping(comm)
    if cmpi.allreduce(flag, mpi.INT, mpi.MIN, side) is NotImplemented:  # C where bound: ~1 us less
        side.Allreduce(mpi.IN_PLACE, [flag, mpi.INT], mpi.MIN)
    if flag[1]:
        _HOST_ONLY[id(comm)] = comm  # every rank keeps the same answer (an object kept: no id reused)
    return bool(flag[0])


#: The GPU paths' package: a rank that has not loaded it has never seen a device array (a numpy
#: program never loads it, tests/unit/test_startup.py), so it cannot pipeline.
_GPU = "mpicomm.gpu"
#: Communicators on which no rank could pipeline when first asked: host ranks only, from then on.
#: A rank that later loads the pipeline stages its calls on them whole (each rank answers False
#: without asking, the same everywhere): only a group's first large call makes the collective.
_HOST_ONLY: dict[int, Any] = {}


def _bookkeeping(comm: Any) -> Any:
    """The communicator that carries :func:`split`'s question for the data communicator ``comm``.

    The group's private communicator (``ProcessGroup.internal``), never ``comm`` itself: MPICH picks
    some collectives' algorithms by how many collectives a communicator has seen, so mpicomm's own
    questions on the data communicator would make a program's reductions differ (in the last bit)
    from the same program written with mpi4py (issue 44). ``comm`` itself where no group holds it.
    """
    for g in _State.groups:
        if g.comm is comm and g.internal is not None:
            return g.internal
    return comm


class answered:  # noqa: N801 - used as a function: ``with chunks.answered():``
    """A block whose call does not ask :func:`split` again: a pipeline already asked for its message.

    The front door's device path runs the staged host call in one, after a pipeline returned
    :data:`ONE_CALL`: every rank has then answered the question for this message once, and the
    host code's :func:`split` answers False without an MPI call. The mark is this thread's, and
    ends with the block (whether or not a call consumed it).

    Example:
        >>> from mpicomm.core import chunks
        >>> with chunks.answered():
        ...     chunks.split(None, True)  # no MPI call: the question was asked already
        False
    """

    __slots__ = ()

    def __enter__(self) -> None:
        _ASKED.answered = True

    def __exit__(self, *exc: object) -> None:
        _ASKED.answered = False
