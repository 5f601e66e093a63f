"""A large ``all_reduce`` in pieces: one ``MPI_Allreduce`` per at most 24 MiB.

Why: MPI reduces into a temporary as large as the message (MPICH's algorithms allocate it on each
call), and glibc serves an allocation of 32 MiB or more with a fresh ``mmap`` each time (its
threshold stops growing there), so every page of the temporary faults in again on every call. Two
ranks, MPICH 5.0.2, the 2-core machine (28 Nov 2026, raw mpi4py at ``multiple``): a 64 MiB
``Allreduce`` took 35 ms whole and 18 ms in four calls of 16 MiB; mpicomm's took 31 ms whole and
16.5 ms in pieces of 1-16 MiB (any piece size from 1 MiB on was as fast). A pieces' call costs one
more latency (tens of microseconds), under 0.3 % of a 24 MiB call.

What: the C ``allreduce`` (:mod:`mpicomm.core.cmpi`) and the mpi4py path both cut a buffer of more
than :func:`piece_bytes` bytes into equal pieces (:func:`per_call` elements each, the last one
shorter), and make one in-place ``MPI_Allreduce`` per piece, in order. So every ``all_reduce`` of
mpicomm, numpy or torch, blocking or on the communication thread, and the torch backend's (DDP's
64 MiB bucket) takes it; the device paths' staged calls end in the same host call. Past the same
size a ``reduce_scatter_tensor`` takes the pairwise exchange of the list form instead of
``MPI_Reduce_scatter_block`` (whose temporary faults in alike: 64 MiB over 2 ranks, 80-125 ms in
one call, 32-42 ms exchanged).

Every rank cuts alike: the pieces depend only on the element count and size, which every rank of a
correct call shares. The reduction is elementwise, so the result is the same value as one call's
wherever MPI's algorithm orders each element's operands alike (two ranks: always; three or more
may round floating point differently, as MPI promises no order either). ``MPICOMM_ALLREDUCE_PIECE``
sets the size (a byte count with an optional binary unit, ``0``: one call however large); set it
alike on every rank. It is read when MPI starts (:func:`reload` reads it again).
"""

from __future__ import annotations

import os
from typing import Any

from .. import _mpi
from ..sizes import parse_size

__all__ = [
    "DEFAULT_PIECE_BYTES",
    "PIECE_ENV_VAR",
    "install",
    "made",
    "per_call",
    "piece_bytes",
    "reload",
]

#: The environment variable of the piece size.
PIECE_ENV_VAR = "MPICOMM_ALLREDUCE_PIECE"
#: The piece size where the variable is unset (under glibc's 32 MiB, far above a call's latency).
DEFAULT_PIECE_BYTES = 24 << 20


class _State:
    bytes = DEFAULT_PIECE_BYTES
    reduce = 1 << 62  # the largest reduce a call (a third of bytes at multiple); the C reduce serves no more
    module: Any = None


def piece_bytes() -> int:
    """The largest ``MPI_Allreduce`` message in bytes (0: no pieces).

    Example:
        >>> from mpicomm.core import pieces
        >>> pieces.piece_bytes() >= 0
        True
    """
    return _State.bytes


def per_call(count: int, nbytes: int, size: int | None = None) -> int:
    """Elements per MPI call for a buffer of ``count`` elements and ``nbytes`` bytes.

    Equal pieces of at most ``size`` bytes (:func:`piece_bytes` by default; a 64 MiB buffer and a
    few bytes more is three calls, not a fourth of a few bytes); ``count`` itself when one call takes
    it all or the size is 0.

    Example:
        >>> from mpicomm.core.pieces import per_call
        >>> per_call(16 << 20, 64 << 20)  # 64 MiB of float32: three pieces of 21.3 MiB
        5592406
        >>> per_call(10, 40)
        10
    """
    size = _State.bytes if size is None else size
    if size <= 0 or nbytes <= size or count <= 0:
        return count
    calls = -(-nbytes // size)
    return -(-count // calls)


def reload(env: dict[str, str] | None = None) -> int:
    """Read ``MPICOMM_ALLREDUCE_PIECE`` again and hand it to the C calls; the size now in use.

    Args:
        env: The environment to read; ``None`` for ``os.environ``.

    Raises:
        ArgumentError: the value is not a byte count.

    Example:
        >>> from mpicomm.core import pieces
        >>> pieces.reload({"MPICOMM_ALLREDUCE_PIECE": "8M"})
        8388608
        >>> pieces.reload({}) == pieces.DEFAULT_PIECE_BYTES
        True
        >>> _ = pieces.reload()
    """
    raw = (os.environ if env is None else env).get(PIECE_ENV_VAR, "").strip()
    _State.bytes = (
        parse_size(raw, "init", f"environment variable {PIECE_ENV_VAR}") if raw else DEFAULT_PIECE_BYTES
    )
    MPI = _mpi.MPI
    multiple = MPI is not None and MPI.Is_initialized() and MPI.Query_thread() >= MPI.THREAD_MULTIPLE
    # reduce: a third, only at multiple (below it MPICH's release_gather took a whole 64 MiB call in
    # 38-45 ms against 45-48 in pieces, and 16 MiB alike either way)
    _State.reduce = _State.bytes // 3 if _State.bytes and multiple else 1 << 62
    if _State.module is not None:
        _State.module.set_piece(_State.bytes)
    return _State.bytes


def install(module: Any) -> int:
    """Hand the C module the piece size (called once the C calls bind); the size.

    Example:
        >>> import mpicomm
        >>> from mpicomm.core import pieces
        >>> _ = mpicomm.init()
        >>> bound = pieces._State.module  # None with MPICOMM_C=0
        >>> bound is None or pieces.install(bound) == pieces.piece_bytes()
        True
    """
    _State.module = module
    module.set_piece(_State.bytes)
    return _State.bytes


def made() -> int:
    """How many ``MPI_Allreduce`` calls the C calls made for buffers cut in pieces (0: not bound).

    Example:
        >>> from mpicomm.core import pieces
        >>> pieces.made() >= 0
        True
    """
    return 0 if _State.module is None else int(_State.module.allreduce_pieces())
