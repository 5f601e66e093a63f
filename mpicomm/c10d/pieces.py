"""The backend's large all_reduce: a tensor over :data:`Piece`'s 24 MiB is reduced in equal pieces.

Why: through MPICH (2 ranks, shared memory) an all_reduce of more than 32 MiB cost 2-3x more per
byte than one of 16 MiB: 64 MiB took 55-90 ms where four 16 MiB calls took 16-40 ms (the shared
2-core machine; docs/overlap.rst, "DDP through the backend"). MPICH's reduction takes a temporary as
large as the message, and from 32 MiB glibc maps it afresh each call (its ``mmap`` threshold stops
growing there), so every page of it faults in again. DDP's buckets are 25 MiB by default and grow to
a whole parameter (the 25M-parameter MLP's 4096 x 4096 weight is a 64 MiB bucket), so DDP's
largest all_reduces were its slowest per byte. A tensor over 24 MiB goes in equal pieces of at most
24 MiB (a single 24 MiB call took 12 ms, at 16 MiB's rate), so every temporary stays under that
threshold; on the communication thread the pieces run back to back, in order.

Every rank cuts a tensor alike: the pieces depend on its size and dtype only, never on
``asyncOp`` or on the tensor's device or layout (a strided tensor is reduced in a contiguous copy,
then copied back), so ranks may differ in those as before. Set ``Piece.bytes = 0`` on every rank
to make one call per tensor.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch

from ..core.groups import ProcessGroup as Group
from ..core.reduce_op import ReduceOp
from ..core.work import Work, completed
from ..front import collectives
from .work import Running

__all__ = ["Piece", "Pieces", "all_reduce"]


class _Piece:
    """The piece size (one instance, :data:`Piece`: an instance attribute is read fastest)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        #: Tensors over this many bytes go in equal pieces of at most this size; 0: never.
        self.bytes = 24 << 20


#: The piece size every rank uses (set alike on every rank).
Piece = _Piece()


class Pieces(Running):
    """The Work of an all_reduce made in pieces: complete once its last piece is, errors of any piece.

    The engine runs the pieces in the order they were posted, so the last one's completion (on the
    communication thread, where the future is completed) means every piece has run.

    Args:
        works: mpicomm's Work of each piece, in order.
        outputs: The tensors the future answers.
        after: Run once every piece has succeeded, before the future completes (a strided tensor's
            copy back from its contiguous copy), or None.

    Example:
        >>> import torch, mpicomm
        >>> from mpicomm.c10d.pieces import Piece, all_reduce
        >>> t = torch.ones(6)
        >>> work = all_reduce(t, mpicomm.ReduceOp.SUM, mpicomm.init(), True, piece=8)
        >>> work.wait() and t.tolist() == [float(mpicomm.get_world_size())] * 6
        True
    """

    def __init__(self, works: list[Work], outputs: list[Any], after: Callable[[], None] | None) -> None:
        self._pieces = works  # set first: the parent's constructor may settle at once
        self._after = after
        super().__init__(works[-1], outputs)

    def _first_error(self) -> BaseException | None:
        for work in self._pieces:
            error = work.exception()
            if error is not None:
                return error
        return None

    def _settle(self, work: Work) -> None:
        error = self._first_error()
        if error is None and self._after is not None:
            try:
                self._after()
            except Exception as exc:  # the future carries it to whoever waits
                error = exc
        if error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(error)  # type: ignore[arg-type]  # the stubs say list[Any]

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Wait for the last piece (a positive timeout bounds the wait); raise any piece's error."""
        super().wait(timeout)
        error = self._first_error()
        if error is not None:
            raise error
        return True

    def exception(self) -> BaseException | None:
        """The first piece's error, if one failed."""
        return self._first_error()


def all_reduce(
    t: torch.Tensor, op: ReduceOp, group: Group, async_op: bool, piece: int | None = None
) -> Pieces | None:
    """All-reduce ``t`` in equal pieces of at most ``piece`` bytes (:data:`Piece`), one call each, in order.

    Returns:
        The pieces' Work if ``async_op``, else None once every piece is reduced.
    """
    size = piece or Piece.bytes
    whole = t if t.is_contiguous() else t.contiguous()
    # equal pieces (a bucket of 64 MiB and a bias is three calls, not a fourth of a few bytes)
    count = -(-t.nbytes // size)
    flat = whole.view(-1)
    n = max(1, -(-flat.numel() // count))
    parts = [flat[i : i + n] for i in range(0, flat.numel(), n)]

    def back() -> None:
        t.copy_(whole)

    after = None if whole is t else back
    if not async_op:
        for part in parts:
            collectives.all_reduce(part, op, group, False)
        if after is not None:
            after()
        return None
    works = [collectives.all_reduce(part, op, group, True) for part in parts]
    return Pieces([completed() if w is None else w for w in works], [t], after)
