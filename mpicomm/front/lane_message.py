"""A blocking ``send``/``recv`` as the engine's in-MPI lane takes it (:mod:`mpicomm.core.lane`).

Called on the program's thread after the call's arguments are checked (:mod:`mpicomm.front.prechecks`),
while the communication thread is inside a collective: no MPI call here.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from .. import _mpi
from ..core.buffers import _DATATYPES
from ..core.groups import resolve
from ..dense import p2p

__all__ = ["message"]

_INT_MAX = 2**31 - 1


def message(fn: str, signature: inspect.Signature, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    """``(send, array, count, datatype handle, peer, tag, comm handle, world ranks)``, or None.

    None for any call the lane does not serve (not ``send``/``recv``, a buffer that is not a
    contiguous numpy array of an MPI datatype, a rank outside the group): it then waits behind the
    queue as before.

    Example:
        >>> import inspect, numpy as np
        >>> from mpicomm.dense.p2p import send
        >>> message("all_reduce", inspect.signature(send), (np.ones(1),), {}) is None
        True
    """
    if fn not in ("send", "recv"):
        return None
    given = signature.bind(*args, **kw)
    given.apply_defaults()
    a = given.arguments
    x = a["tensor"]
    if type(x) is not np.ndarray or not x.flags.c_contiguous or x.size > _INT_MAX:
        return None
    if fn == "recv" and not x.flags.writeable:
        return None
    dt = _DATATYPES.get(x.dtype) or _predefined(x.dtype)
    g = resolve(a["group"], fn)
    if dt is None or g.comm is None:
        return None
    name = "dst" if fn == "send" else "src"
    peer = p2p._peer(g, a[name], a[f"group_{name}"], fn, name, any_ok=fn == "recv")
    return (fn == "send", x, x.size, dt.handle, peer, int(a["tag"]), g.comm.handle, g.ranks)


def _predefined(dtype: np.dtype[Any]) -> Any:
    """The predefined MPI datatype of a native number dtype (mpi4py's table: no MPI call), or None."""
    if not dtype.isnative or dtype.kind not in "biufc":
        return None
    try:
        return _mpi.MPI.Datatype.fromcode(dtype.char)
    except (ValueError, KeyError):
        return None
