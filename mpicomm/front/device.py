"""The device side of the front door: a call with device arrays takes the direct or the staged path.

A call whose arguments hold device arrays (cupy arrays, or torch CUDA tensors and other device
objects already viewed as the GPU backend's arrays by :mod:`mpicomm.front.kinds`) is checked (all
arrays on one side, device ones on the current device), then takes one path:

* **direct**: the MPI is CUDA-aware (:func:`~mpicomm.gpu.cuda_aware.cuda_awareness`) and it is a
  data-movement call with a direct implementation (``mpicomm.gpu.direct``), blocking or one of the
  collectives that serve ``async_op=True``; device pointers go to MPI after the caller's current
  stream has run the work queued before the call.
* **staged**: everything else; through pinned host buffers around the host implementation
  (``mpicomm.gpu.staged``), or the chunked pipeline for large element-wise reductions
  (``mpicomm.gpu.pipeline``).

Which path a call takes, and so which MPI calls it makes, does not depend on ``async_op``, so ranks
may differ in ``async_op`` as they may in array kind (``mpicomm.core.chunks``). An asynchronous call
returns at once on every path: a direct or pipelined one is queued whole on mpicomm's communication
thread (``mpicomm.core.engine``), after an event recorded on the caller's stream that the engine
waits for (``mpicomm.gpu.posted``); a staged call downloads its inputs on the caller's stream, and
its host part is queued like a host call (the upload follows in its Work's ``wait``), so stream
order holds. A blocking direct or pipelined call made while calls are queued waits for the queue,
then runs on the caller's thread.

The staged path copies only what the host code reads and writes on this rank: nothing on a rank
outside the group; the root's array only down and the others' only up for ``broadcast``; every
rank's down and only the destination's up for ``reduce``; the gather list only up on the root. A
receive may be shorter than its array: receive buffers are copied down first, so the elements MPI
does not write keep their values. An argument that lies inside another one's memory (the in-place
idiom of ``all_gather_into_tensor``, or an ``all_to_all_single`` whose input is its output) is
staged as a view of that one's host buffer, so the host code sees the same aliasing and takes the
same decision (its in-place path, or its overlap error).

The path each call took is counted in :data:`PATHS` (for tests and ``info``).
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import chunks
from ..core.engine_gate import drain
from ..core.groups import resolve, root_rank
from ..core.watchdog import _Threads
from ..core.work import Work, completed
from ..errors import ArgumentTypeError
from . import kinds
from .kinds import backend

if TYPE_CHECKING:
    from ..gpu.staged import Staging

# The GPU paths (cuda_aware, direct, staged) are imported where a device array first needs them:
# a numpy program loads none of them (nor subprocess and shutil, which cuda_aware uses), issue 44.

__all__ = ["BOTH", "PATHS", "READ", "WRITE", "Bound", "on_device"]

#: Calls per (function, path) in this process, e.g. ``PATHS["all_reduce", "staged"]``.
PATHS: Counter[tuple[str, str]] = Counter()

#: Roles of array arguments: read (input), written (output), or both (the front door names them).
READ, WRITE, BOTH = "read", "write", "both"
_READS, _WRITES = (READ, BOTH), (WRITE, BOTH)

# Calls whose receive buffer MPI may fill only in part (a shorter message).
_PARTIAL = frozenset(("recv", "irecv", "sendrecv"))
# Rooted calls: (root argument, group-rank argument, argument -> (role on the root, role elsewhere)).
_ROOTED: dict[str, tuple[str, str, dict[str, tuple[str | None, str | None]]]] = {
    "broadcast": ("src", "group_src", {"tensor": (READ, WRITE)}),
    "reduce": ("dst", "group_dst", {"tensor": (BOTH, READ)}),
    "gather": ("dst", "group_dst", {"gather_list": (WRITE, None)}),
    "scatter": ("src", "group_src", {"scatter_list": (READ, None)}),
}


class Bound:
    """A call's arguments as the device paths read them: ``inspect.BoundArguments``' three fields.

    Made from the front door's list of every parameter's value, without ``inspect`` (``bind`` and
    its ``args``/``kwargs`` cost about 2 us a call, a tenth of a small staged call's own work).

    Args:
        names: Every parameter's name, in order.
        values: Their values.
        positional: How many leading parameters are passed by position (the rest are keyword-only).
    """

    __slots__ = ("_names", "_positional", "arguments")

    def __init__(self, names: list[str], values: list[Any], positional: int) -> None:
        self.arguments: dict[str, Any] = dict(zip(names, values, strict=True))
        self._names, self._positional = names, positional

    @property
    def args(self) -> tuple[Any, ...]:
        """The positional arguments."""
        arguments = self.arguments
        return tuple([arguments[n] for n in self._names[: self._positional]])

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword-only arguments."""
        return {n: self.arguments[n] for n in self._names[self._positional :]}


def on_device(
    fn: str,
    host: Callable[..., Any],
    bound: Bound | inspect.BoundArguments,
    roles: dict[str, str],
    direct: Callable[..., Any] | None,
    pipelined: Callable[..., Any] | None,
    returns: str | None,
) -> Any:
    """Run ``fn`` on the device arrays in ``bound`` by the first path that serves it (see the module).

    Args:
        fn: The public name.
        host: The host implementation.
        bound: The call's arguments, device arrays as the backend's arrays.
        roles: Argument name -> role (``read``, ``write``, ``both``).
        direct: The direct implementation, or None.
        pipelined: The pipelined implementation, or None.
        returns: Whether (the argument whose kind) the call allocates arrays: they are made device arrays.

    Returns:
        What the host implementation returns, with allocated arrays on the device.

    Raises:
        ArgumentTypeError: host and device arrays mixed in one call.
        ArgumentError: a device array on another device than the current one.
        mpi4py.MPI.Exception: MPI reported an error (the front door makes it a CommunicationError).
    """
    arguments = bound.arguments
    largest = _check_sides(fn, arguments, roles)
    if _Threads.pending and arguments.get("async_op") is not True:
        drain(None, fn)  # a blocking direct or pipelined call enters MPI here: after the queued calls
    if largest <= chunks.Setting.least:
        pipelined = None  # one chunk: the pipeline would decline (core.chunks)
    from ..gpu.cuda_aware import cuda_awareness
    from ..gpu.direct import COMPLETING

    if (
        direct is not None
        and cuda_awareness().aware
        and (not arguments.get("async_op", False) or fn in COMPLETING)
    ):
        done = direct(*bound.args, **bound.kwargs)
        if done is not NotImplemented:
            PATHS[fn, "direct"] += 1
            return done
    asked = False
    if pipelined is not None:
        done = pipelined(*bound.args, **bound.kwargs)
        asked = done is chunks.ONE_CALL
        if done is not NotImplemented and not asked:
            PATHS[fn, "pipelined"] += 1
            return done
    PATHS[fn, "staged"] += 1
    roles_here = _roles_here(fn, arguments, roles)
    if asked:  # every rank answered the pipeline's question: the host call must not ask it again
        with chunks.answered():
            return _staged(fn, host, bound, roles_here, returns is not None)
    return _staged(fn, host, bound, roles_here, returns is not None)


def _arrays(arguments: dict[str, Any], roles: dict[str, str]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for arg in roles:
        value = arguments.get(arg)
        items = value if isinstance(value, (list, tuple)) else [value]
        found.extend((f"{arg}[{i}]" if items is value else arg, x) for i, x in enumerate(items))
    return [(a, x) for a, x in found if x is not None]


def _check_sides(fn: str, arguments: dict[str, Any], roles: dict[str, str]) -> int:
    """All arrays of a call on one side (host or device), device ones on the current device.

    Returns:
        The largest array's bytes.
    """
    if len(roles) == 1:  # one array argument (all_reduce, broadcast, send, ...): the common small call
        for arg in roles:
            x = arguments.get(arg)
            if type(x) is np.ndarray or x is None:
                return 0 if x is None else int(x.nbytes)
            if type(x) is not list and type(x) is not tuple:
                if kinds.kind_of(x) == kinds.CUPY:
                    backend().check_device(x, fn, arg)
                return int(getattr(x, "nbytes", 0))
    arrays = _arrays(arguments, roles)
    host = dev = None
    largest = 0
    be = backend()
    for arg, x in arrays:
        if isinstance(x, np.ndarray):
            host = host or arg
        elif kinds.kind_of(x) == kinds.CUPY:
            dev = dev or arg
            be.check_device(x, fn, arg)
        largest = max(largest, int(getattr(x, "nbytes", 0)))
    if host is not None and dev is not None:
        raise ArgumentTypeError(
            f"{fn}: {dev} is a device array and {host} a host array; expected the arrays of one call all on "
            "the GPU or all on the host (move one with cupy.asarray / .get(), or tensor.cuda() / .cpu())"
        )
    return largest


def _roles_here(fn: str, arguments: dict[str, Any], roles: dict[str, str]) -> dict[str, str | None]:
    """The roles on this rank: none outside the group, the root's or the others' in rooted calls.

    Where the group or the root is not valid the declared roles stay (the host code raises). The
    answer for a member is kept per call and side (the caller only reads it).
    """
    rooted = _ROOTED.get(fn)
    mine = False
    try:
        g = resolve(arguments.get("group"), fn)
        if g.comm is None:
            return dict.fromkeys(roles)
        if rooted is not None:
            arg, local, _ = rooted
            mine = root_rank(g, arguments.get(arg), arguments.get(local), fn, arg) == g.rank()
    except Exception:
        return dict(roles)
    kept = _HERE.get((fn, mine))
    if kept is not None and kept[0] is roles:
        return kept[1]
    here: dict[str, str | None] = dict(roles)
    if rooted is not None:
        here.update({name: pair[0] if mine else pair[1] for name, pair in rooted[2].items()})
    if fn in _PARTIAL:
        here = {a: BOTH if r == WRITE else r for a, r in here.items()}
    _HERE[fn, mine] = (roles, here)  # holds roles: no other dict can take its id while kept
    return here


#: (call, this rank is the root) -> (the declared roles, the roles here), made once.
_HERE: dict[tuple[str, bool], tuple[dict[str, str], dict[str, str | None]]] = {}


def _on_device(res: Any) -> Any:
    """A host result's arrays as device arrays (other fields, such as a list of splits, stay)."""
    be = backend()
    if isinstance(res, tuple) and hasattr(res, "_fields"):
        return type(res)(*(be.asarray(v) if isinstance(v, np.ndarray) else v for v in res))
    return [be.asarray(v) if isinstance(v, np.ndarray) else v for v in res]


def _stage_all(
    stage: Staging, bound: Bound | inspect.BoundArguments, roles: dict[str, str | None]
) -> list[Any]:
    """Replace every device argument by its host buffer (nested in a container's where it lies inside one).

    Returns:
        The device arrays the call writes (what its Work shows).
    """
    if len(roles) == 1:  # one array argument: nothing to alias
        for arg, role in roles.items():
            x = bound.arguments.get(arg)
            if x is None:
                return []
            if type(x) is not list and type(x) is not tuple:
                write = role in _WRITES
                bound.arguments[arg] = stage.host(x, role in _READS, write)
                return [x] if write else []
    be = stage.be
    entries: list[tuple[str, int | None, Any, bool, bool]] = []
    for arg, role in roles.items():
        value = bound.arguments.get(arg)
        if value is None:
            continue
        read, write = role in (READ, BOTH), role in (WRITE, BOTH)
        if isinstance(value, (list, tuple)):
            bound.arguments[arg] = list(value)
            entries.extend((arg, i, x, read, write) for i, x in enumerate(value))
        else:
            entries.append((arg, None, value, read, write))
    if len(entries) == 1 and entries[0][1] is None:  # one array (all_reduce, broadcast): nothing to alias
        arg, _, x, read, write = entries[0]
        bound.arguments[arg] = stage.host(x, read, write)
        return [x] if write else []
    spans = [be.span(x) for _, _, x, _, _ in entries]
    order = sorted(range(len(entries)), key=lambda k: spans[k][0] - spans[k][1])  # the largest first
    placed: list[tuple[int, np.ndarray]] = []
    shown: list[Any] = []
    for k in order:
        arg, i, x, read, write = entries[k]
        inside = _container(k, spans, entries, placed)
        if inside is not None:
            j, buf = inside
            outer_read, outer_write = entries[j][3], entries[j][4]
            off = spans[k][0] - spans[j][0]
            view = buf.reshape(-1).view(np.uint8)[off : off + int(x.nbytes)]
            h = stage.host(x, read and not outer_read, write and not outer_write, inside=view)
        else:
            h = stage.host(x, read, write)
        placed.append((k, h))
        if i is None:
            bound.arguments[arg] = h
        else:
            bound.arguments[arg][i] = h
        if write:
            shown.append(x)
    return shown


def _container(
    k: int, spans: list[tuple[int, int]], entries: list[Any], placed: list[tuple[int, np.ndarray]]
) -> tuple[int, np.ndarray] | None:
    """A staged contiguous argument whose memory holds all of entry ``k``'s (contiguous) memory."""
    lo, hi = spans[k]
    if lo == hi or not entries[k][2].flags.c_contiguous:
        return None
    for j, buf in placed:
        a, b = spans[j]
        if a <= lo and hi <= b and entries[j][2].flags.c_contiguous:
            return j, buf
    return None


def _staged(
    fn: str,
    host: Callable[..., Any],
    bound: Bound | inspect.BoundArguments,
    roles: dict[str, str | None],
    allocates: bool,
) -> Any:
    from ..gpu.staged import StagedWork, Staging

    stage = Staging()
    try:
        shown = _stage_all(stage, bound, roles)
        stage.download()
        out = host(**bound.arguments)  # every parameter by name (Bound holds them all)
    except BaseException:
        stage.release()
        raise
    if isinstance(out, Work):
        if not allocates:
            return StagedWork(out, stage, shown)
        try:  # calls that allocate their outputs finish here, and hand back a completed Work
            out._wait()  # timed by the call's own token, with its group's bound
            out.wait()  # raises the operation's error, if any (done by now: no token stays long)
        except BaseException:
            stage.release()
            raise
        stage.upload()
        return completed(list(_on_device(out.result())))
    stage.upload()
    return _on_device(out) if allocates and out is not None else out


def batch_on_device(ops: list[Any], fn: str) -> list[Any]:
    """``batch_isend_irecv`` of device arrays: staged, one pinned buffer per operation.

    Everything is checked first (sides, devices, aliasing across the batch, then the host checks on
    the host buffers); the receive buffers are copied down too, so that a shorter message leaves the
    rest of the array as it was. Each receive's ``Work`` uploads its buffer when it completes.

    Raises:
        ArgumentTypeError: host and device arrays mixed in the batch.
        ArgumentError: two operations overlap where one receives, or the host checks fail.
    """
    from ..dense import batch, p2p
    from ..gpu.staged import StagedWork, Staging

    arrays = {f"p2p_op_list[{i}].tensor": p.tensor for i, p in enumerate(ops)}
    _check_sides(fn, arrays, dict.fromkeys(arrays, READ))
    writes = [p.op is p2p.irecv for p in ops]
    be = backend()
    batch.check_batch_aliasing([p.tensor for p in ops], writes, fn, span=be.span, exact=lambda a, b: True)
    stages = [Staging() for _ in ops]
    staged_ops = []
    for stage, p, write in zip(stages, ops, writes, strict=True):
        h = stage.host(p.tensor, True, write)
        staged_ops.append(batch.P2POp(p.op, h, p.peer, p.group, p.tag, p.group_peer))
    try:
        for stage in stages:
            stage.download()
        works = batch.batch_isend_irecv(staged_ops)
    except BaseException:
        for stage in stages:
            stage.release()
        raise
    PATHS[fn, "staged"] += 1
    if not works:  # a rank outside the group: nothing was posted
        for stage in stages:
            stage.release()
        return []
    return [
        StagedWork(w, s, [p.tensor] if write else [])
        for w, s, p, write in zip(works, stages, ops, writes, strict=True)
    ]
