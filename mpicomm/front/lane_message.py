"""A point-to-point call as the engine's in-MPI lane takes it (:mod:`mpicomm.core.lane`).

Called on the program's thread after the call's arguments are checked (:mod:`mpicomm.front.prechecks`;
``sendrecv``'s here, as its host checks them), while the communication thread is inside a
collective: no MPI call here. A strided buffer travels packed: a contiguous copy is sent, or
received into and copied back into the caller's view once the message has come.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from .. import _mpi
from ..core import lane
from ..core.buffers import _DATATYPES, check_array, check_disjoint, check_output
from ..core.groups import resolve
from ..core.lane_work import Message
from ..dense import p2p

__all__ = ["message"]

_INT_MAX = 2**31 - 1
_SERVED = frozenset(("send", "recv", "isend", "irecv", "sendrecv"))


def message(
    fn: str, signature: inspect.Signature, args: tuple[Any, ...], kw: dict[str, Any]
) -> Message | None:
    """The call's messages for the lane (:class:`~mpicomm.core.lane_work.Message`), or None.

    None for any call the lane does not serve (not a point-to-point call, a buffer that is not a
    numpy array of an MPI datatype, a rank outside the group, ``MPI_TAG_UB`` not yet known): it
    then waits behind the queue as before.

    Example:
        >>> import inspect, numpy as np
        >>> from mpicomm.dense.p2p import send
        >>> message("all_reduce", inspect.signature(send), (np.ones(1),), {}) is None
        True
    """
    if fn not in _SERVED:
        return None
    given = signature.bind(*args, **kw)
    given.apply_defaults()
    a = given.arguments
    g = resolve(a["group"], fn)
    if g.comm is None or not _tag_bound_known():
        return None
    if fn == "sendrecv":
        return _sendrecv(g, a)
    sending = fn in ("send", "isend")
    name = "dst" if sending else "src"
    tag = int(a["tag"])
    packed = _packed(a["tensor"], not sending)
    if packed is None:
        return None
    peer = p2p._peer(g, a[name], a[f"group_{name}"], fn, name, any_ok=not sending)
    p2p._tag(g, tag, fn)
    array, dt, after = packed
    return Message(
        ((sending, array, dt, peer, tag),),
        g.comm.handle,
        g.ranks,
        after=after,
        result=[a["tensor"]] if fn == "irecv" else None,
        null_source=peer == _mpi.MPI.PROC_NULL,
    )


def _sendrecv(g: Any, a: dict[str, Any]) -> Message | None:
    """The two messages of ``sendrecv``, its arguments checked as its host checks them (no MPI call)."""
    fn = "sendrecv"
    x = check_array(a["tensor"], fn, "tensor")
    y = check_output(a["recv_tensor"], fn, "recv_tensor")
    check_disjoint(y, x, fn, "recv_tensor", "tensor")
    to, frm, stag, rtag = p2p._sendrecv_peers(
        g, a["dst"], a["src"], a["tag"], a["group_dst"], a["group_src"], a["sendtag"], a["recvtag"]
    )
    out, inp = _packed(y, True), _packed(x, False)
    if out is None or inp is None:
        return None
    null = to == _mpi.MPI.PROC_NULL, frm == _mpi.MPI.PROC_NULL
    return Message(
        ((True, inp[0], inp[1], to, stag), (False, out[0], out[1], frm, rtag)),
        g.comm.handle,
        g.ranks,
        after=out[2],
        null_source=null[1],
    )


def _tag_bound_known() -> bool:
    """Whether the tag checks know ``MPI_TAG_UB`` without an MPI call (the lane read it as it started)."""
    return p2p._TagBound.value is not None or lane.tag_upper_bound() is not None


def _packed(x: Any, output: bool) -> tuple[np.ndarray, int, Any] | None:
    """``(contiguous array, datatype handle, copy back or None)`` for MPI; None if the lane cannot take ``x``.

    A strided view is copied: the copy is sent, or received into (holding the view's values, so
    that a shorter message leaves the rest as it was) and copied back once the message has come.
    """
    if type(x) is not np.ndarray or x.size > _INT_MAX or (output and not x.flags.writeable):
        return None
    dt = _DATATYPES.get(x.dtype) or _predefined(x.dtype)
    if dt is None:
        return None
    if x.flags.c_contiguous:
        return x, int(dt.handle), None
    copy = np.ascontiguousarray(x)
    return copy, int(dt.handle), (lambda: np.copyto(x, copy)) if output else None


def _predefined(dtype: np.dtype[Any]) -> Any:
    """The predefined MPI datatype of a native number dtype (mpi4py's table: no MPI call), or None."""
    if not dtype.isnative or dtype.kind not in "biufc":
        return None
    try:
        return _mpi.MPI.Datatype.fromcode(dtype.char)
    except (ValueError, KeyError):
        return None
