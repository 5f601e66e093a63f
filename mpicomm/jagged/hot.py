"""KJTAllToAll calls whose counts message repeats byte for byte: everything but the data known.

A training loop sends the same shapes, and often the same lengths (fixed pooling factors, every
length 1), call after call. Once a call has received and checked a counts message, a later call
that sends the same message and receives the same bytes has the same receive plan and value
counts, already checked: what is left is to move the values (and weights) and put them in (key,
source) order. A :class:`Repeat` holds what that needs, made from the call that checked the
message, and is kept on that call's :class:`~mpicomm.jagged.repeat.Sent` (its ``hot``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import cmpi
from ..core.buffers import send_view
from .keyed import KeyedJaggedArray

__all__ = ["Repeat"]


class Repeat:
    """A host gather call's checked counts message, and what its repeats need to move the data.

    The values (and weights) move with the int32 counts made for the first call, are gathered with
    its recat index and get a copy of the lengths gathered then (every source sent them inline).
    No receive plan or value count lookup, no ``_Call``, no deferred recat: without weights, the
    whole call is one C call (``cmpi.kjt_repeat``: the counts ``MPI_Alltoall``, the comparison,
    the values' ``MPI_Alltoallv`` and the recat as segment copies). Calls that do not fit (lengths
    in a message of their own, rows of several values, counts past int32, a recat index too large
    to keep) never get one and take the general path every time.

    Attributes:
        got: The bytes of the counts message received and checked.
        scratch: Where later calls receive their counts message (it is compared with ``got``).
    """

    __slots__ = ("got", "index", "keyed", "keys", "lengths", "mine", "recvs", "scratch", "segments", "sends",
                 "shape", "stride", "table", "theirs", "tmp", "types")  # fmt: skip

    def __init__(
        self,
        got: bytes,
        message: np.ndarray,
        c32: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
        index: np.ndarray | None,
        lengths: np.ndarray,
        call: Any,
        shape: tuple[int, ...],
    ) -> None:
        """From the call (a ``mpicomm.jagged.kjt._Call``) that received ``message`` (``got``, its bytes).

        ``c32``: the int32 counts and displacements sent and received; ``index``: the recat gather
        (None: none); ``lengths``: the lengths gathered; ``shape``: of the values received.
        """
        arrived, sent = call.arrived, call.sent
        self.got, self.index, self.lengths, self.shape = got, index, lengths, shape
        self.scratch = np.empty_like(message)
        self.keys = call.a2a._layout.key_range
        self.mine, self.theirs = c32
        self.sends, self.recvs = (sent.counts, sent.starts), (arrived.counts, arrived.displs)
        self.stride, self.table, self.types = call.recv.stride, call.recv.table, call.send.types
        self.keyed: type[KeyedJaggedArray] = call.a2a._keyed  # the class the outputs take
        # the recat as (from, to, count) runs of the index, for the C call (None: no recat)
        self.segments: np.ndarray | None = None
        self.tmp: np.ndarray | None = None  # where the C call receives the values before its recat
        if index is not None and index.size:
            cut = np.flatnonzero(np.diff(index) != 1) + 1
            first, end = np.concatenate(([0], cut)), np.concatenate((cut, [index.size]))
            self.segments = np.stack([index[first], first, end - first], axis=1).astype(np.int64)
            self.tmp = np.empty(shape, dtype=call.kja._values.dtype)

    def fused(self, kja: KeyedJaggedArray, header: np.ndarray, i64: Any, comm: Any) -> Any:
        """The whole call of ``kja`` (sending ``header``) in one C call: this rank's output.

        None when the counts message that arrived (in ``scratch``) differs from ``got`` (nothing
        else has moved); NotImplemented, before any MPI call, when the C call cannot take it
        (weights, a strided array, no C module): then the caller makes the calls from Python.
        """
        if kja._weights is not None or type(kja._values) is not np.ndarray:
            return NotImplemented
        out = np.empty(self.shape, dtype=kja._values.dtype)
        done = cmpi.kjt_repeat(
            header, self.scratch, self.got, kja._values, *self.mine, out, *self.theirs,
            self.segments, out if self.tmp is None else self.tmp, i64, self.types[1], comm,
        )  # fmt: skip
        if done is not True:
            return None if done is False else NotImplemented
        return self.keyed._trusted(
            kja._keys[self.keys], out, self.lengths.copy(), None, self.stride, self.table
        )

    def start(self, kja: KeyedJaggedArray, comm: Any) -> KeyedJaggedArray:
        """Move ``kja``'s values and weights from Python (its counts message is done): the output."""
        _, vt, wt = self.types
        vals, w = send_view(kja._values), kja._weights
        recv_v = np.empty(self.shape, dtype=vals.dtype)
        if cmpi.alltoallv(vals, *self.mine, recv_v, *self.theirs, vt, comm) is NotImplemented:
            comm.Alltoallv([vals, self.sends, vt], [recv_v, self.recvs, vt])
        recv_w = None
        if w is not None:
            w = send_view(w)
            recv_w = np.empty(self.shape[0], dtype=w.dtype)
            if cmpi.alltoallv(w, *self.mine, recv_w, *self.theirs, wt, comm) is NotImplemented:
                comm.Alltoallv([w, self.sends, wt], [recv_w, self.recvs, wt])
        if self.index is not None:
            recv_v = recv_v[self.index]
            recv_w = None if recv_w is None else recv_w[self.index]
        return self.keyed._trusted(
            kja._keys[self.keys], recv_v, self.lengths.copy(), recv_w, self.stride, self.table
        )
