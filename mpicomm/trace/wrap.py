"""The traced public calls: a wrapper around each, put in place of the untraced one at import.

:func:`install` runs once, from ``mpicomm/__init__.py``, only where ``MPICOMM_TRACE`` is set: it
replaces each public call of :data:`CALLS` in ``mpicomm``'s namespace and in the modules the torch
backend and torch's group methods call through (``mpicomm.front.collectives``, ``.coalesced``,
``.sparse``, ``mpicomm.objects``, ``mpicomm.dense.sync``) by :func:`traced`'s wrapper, and makes
``Work.wait`` and ``Work.is_completed`` note when an async call's Work completes. Without the
variable nothing here is imported, and the public calls are the untraced ones.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, TypeVar

from ..core import groups as _groups
from ..core.work import Work
from ..front.device import BOTH, READ, WRITE
from . import output
from .recorder import FAILED, Call, Recorder

__all__ = ["CALLS", "RECORDER", "install", "traced", "untraced"]

F = TypeVar("F", bound=Callable[..., Any])

#: The recorder of this process's traced calls.
RECORDER = Recorder()

#: Every traced public call and the roles of its array arguments (what it sends and receives).
CALLS: dict[str, dict[str, str]] = {
    "all_reduce": {"tensor": BOTH},
    "broadcast": {"tensor": BOTH},
    "reduce": {"tensor": BOTH},
    "reduce_scatter": {"output": WRITE, "input_list": READ},
    "reduce_scatter_tensor": {"output": WRITE, "input": READ},
    "all_gather": {"tensor_list": WRITE, "tensor": READ},
    "all_gather_into_tensor": {"output_tensor": WRITE, "input_tensor": READ},
    "gather": {"tensor": READ, "gather_list": WRITE},
    "scatter": {"tensor": WRITE, "scatter_list": READ},
    "all_to_all": {"output_tensor_list": WRITE, "input_tensor_list": READ},
    "all_to_all_single": {"output": WRITE, "input": READ},
    "send": {"tensor": READ},
    "recv": {"tensor": WRITE},
    "isend": {"tensor": READ},
    "irecv": {"tensor": WRITE},
    "sendrecv": {"tensor": READ, "recv_tensor": WRITE},
    "batch_isend_irecv": {},
    "jagged_all_to_all": {"values": READ, "lengths": READ},
    "all_reduce_coalesced": {"tensors": BOTH},
    "all_gather_coalesced": {"output_tensor_lists": WRITE, "input_tensor_list": READ},
    "all_reduce_sparse": {},
    "barrier": {},
    "monitored_barrier": {},
    "all_gather_object": {},
    "broadcast_object_list": {},
    "gather_object": {},
    "scatter_object_list": {},
    "send_object_list": {},
    "recv_object_list": {},
    "wait_all": {},
}
#: Calls only some ranks of the group make: no sequence number (they are not matched across ranks).
POINT_TO_POINT = frozenset(
    [
        "send",
        "recv",
        "isend",
        "irecv",
        "sendrecv",
        "batch_isend_irecv",
        "send_object_list",
        "recv_object_list",
        "wait_all",
    ]
)
#: Where the torch backend, torch's group methods and mpicomm's own programs find the calls; each name
#: of these modules that is one of the untraced calls is replaced. Private names: the torch backend's.
_MODULES = ("mpicomm.front.collectives", "mpicomm.front.coalesced", "mpicomm.front.sparse", "mpicomm.objects",
            "mpicomm.dense.sync", "mpicomm.core.work")  # fmt: skip
_PRIVATE: dict[str, tuple[str, dict[str, str]]] = {
    "_all_reduce_coalesced": ("all_reduce_coalesced", {"tensors": BOTH}),
    "_all_gather_coalesced": ("all_gather_coalesced", {"output_tensors": WRITE, "input_tensor_list": READ}),
}


def traced(fn_name: str, public_callable: F, roles: dict[str, str], recorder: Recorder | None = None) -> F:
    """``public_callable`` with each call recorded: name, group, bytes, array kind and path, call site, times.

    A call made while another traced call runs (one public call made by another) is not recorded
    again. The wrapper keeps the call's name, docstring and signature (``functools.wraps``).

    Args:
        fn_name: The public name, as the trace shows it.
        public_callable: The untraced call.
        roles: Argument name -> ``READ`` (its bytes are sent), ``WRITE`` (received) or ``BOTH``.
        recorder: Where the calls are recorded (:data:`RECORDER` by default).

    Returns:
        The traced call.

    Example:
        >>> import numpy as np, mpicomm
        >>> from mpicomm.trace import Recorder, traced
        >>> rec = Recorder()
        >>> all_reduce = traced("all_reduce", mpicomm.all_reduce, {"tensor": "both"}, rec)
        >>> all_reduce(np.ones(4))
        >>> rec.n, rec.names.items[rec.rows[0]], rec.rows[5]    # one call, its name, 32 bytes sent
        (1, 'all_reduce', 32)
    """
    rec = RECORDER if recorder is None else recorder
    names = list(inspect.signature(public_callable).parameters)
    slots = tuple(
        (names.index(a), a, role in (READ, BOTH), role in (WRITE, BOTH))
        for a, role in roles.items()
        if a in names
    )
    group = names.index("group") if "group" in names else -1
    call = Call(fn_name, rec.names.id(fn_name), slots, group, fn_name not in POINT_TO_POINT)
    public: Callable[..., Any] = public_callable
    now = perf_counter_ns

    @functools.wraps(public_callable)
    def traced_call(*args: Any, **kwargs: Any) -> Any:
        if rec.depth:
            return public(*args, **kwargs)
        if rec.unsynced and call.collective:
            _first_collective(rec, call, args, kwargs)
        rec.depth = 1
        start = now()
        try:
            out = public(*args, **kwargs)
        except BaseException:
            rec.depth = 0
            rec.add(call, args, kwargs, start, now(), None, FAILED)
            raise
        end = now()
        rec.depth = 0
        rec.add(call, args, kwargs, start, end, out, 0)
        return out

    traced_call.__mpicomm_untraced__ = public_callable  # type: ignore[attr-defined]
    return traced_call  # type: ignore[return-value]


def untraced(fn: F) -> F:
    """The untraced call behind a traced one (``fn`` itself if it is not traced).

    Example:
        >>> import mpicomm
        >>> untraced(mpicomm.get_rank) is mpicomm.get_rank
        True
    """
    return getattr(fn, "__mpicomm_untraced__", fn)  # type: ignore[no-any-return]


def _first_collective(rec: Recorder, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Compare the clocks before the first collective on the world group (every rank makes it, first)."""
    g = call.group
    group = args[g] if 0 <= g < len(args) else kwargs.get("group")
    if group is not None and group is not _groups._State.world:
        return
    rec.unsynced = False
    world = _groups.world(call.name)  # initialised as the call itself would
    if world.comm is None:
        return
    from .clock import estimate

    rec.comm = world.comm.Dup()  # the trips never match a message of the program's
    rec.clock.append(estimate(rec.comm))


def install(namespace: str, directory: str | None = None) -> None:
    """Trace every public call of ``namespace`` (``mpicomm``) and of the modules the torch backend calls.

    Also records waits on async calls' Works and registers the exit handler that writes the trace
    into ``directory`` (``MPICOMM_TRACE`` by default). Run once, at ``import mpicomm``.

    Args:
        namespace: The package whose public calls are replaced (``"mpicomm"``).
        directory: The trace directory; ``None`` for ``MPICOMM_TRACE``.
    """
    where = directory or os.environ.get("MPICOMM_TRACE", "")
    if not where or getattr(RECORDER, "installed", False):
        return
    package = sys.modules[namespace]
    wrapped: dict[int, Any] = {}  # by id of the untraced call: an alias gets the same wrapper
    for name, roles in CALLS.items():
        public = getattr(package, name)
        inner = _waits_all(RECORDER, public) if name == "wait_all" else public
        wrapped[id(public)] = (public, traced(name, inner, roles))
        setattr(package, name, wrapped[id(public)][1])
    for alias in ("reduce_scatter_single", "all_gather_single"):
        setattr(package, alias, wrapped[id(getattr(package, alias))][1])
    for module in map(importlib.import_module, _MODULES):
        for attr, value in list(vars(module).items()):
            known = wrapped.get(id(value))
            if known is not None and known[0] is value:
                setattr(module, attr, known[1])
            elif attr in _PRIVATE and callable(value):
                setattr(module, attr, traced(*_PRIVATE[attr][:1], value, _PRIVATE[attr][1]))
    _watch_works(RECORDER)
    RECORDER.installed = True  # type: ignore[attr-defined]
    # mpi4py finalizes MPI from a C-level exit hook (Py_AtExit), which runs after every handler of
    # Python's atexit whenever they were registered: the files are written while MPI still works
    atexit.register(output.finish, RECORDER, where)


def _waits_all(rec: Recorder, wait_all: F) -> F:
    """``wait_all`` noting each async call's Work it completed (it waits on them together, not one by one)."""
    pending, now = rec.pending, perf_counter_ns

    @functools.wraps(wait_all)
    def waits_all(works: Any, timeout: Any = None) -> bool:
        start = now()
        done = bool(wait_all(works, timeout))  # a failure leaves the Works pending: no wait recorded
        end = now()
        for w in works if isinstance(works, (list, tuple)) else ():
            i = pending.pop(id(w), None)
            if i is not None:
                rec.add_wait(i, start, end, False)
        return done

    return waits_all  # type: ignore[return-value]


def _watch_works(rec: Recorder) -> None:
    """Make ``wait`` and ``is_completed`` record when an async call's Work is seen complete.

    Every Work waits through ``Work.wait`` (each kind changes only its ``_block``); the engine's
    defines its own ``is_completed``.
    """
    from ..core.engine import EngineWork

    Work.wait, Work.is_completed = _traced(rec, Work)  # type: ignore[method-assign]
    EngineWork.is_completed = _traced(rec, EngineWork)[1]  # type: ignore[method-assign]


def _traced(rec: Recorder, cls: type[Work]) -> tuple[Any, Any]:
    """``cls``'s ``wait`` and ``is_completed``, recording when they first see a traced Work complete."""
    wait, is_completed = cls.wait, cls.is_completed
    pending, now = rec.pending, perf_counter_ns

    @functools.wraps(wait)
    def traced_wait(self: Work, timeout: Any = None) -> bool:
        i = pending.pop(id(self), None)
        if i is None:
            return wait(self, timeout)
        start = now()
        try:
            return wait(self, timeout)
        finally:
            rec.add_wait(i, start, now(), False)

    @functools.wraps(is_completed)
    def traced_is_completed(self: Work) -> bool:
        done = is_completed(self)
        if done and id(self) in pending:
            t = now()
            rec.add_wait(pending.pop(id(self)), t, t, True)
        return done

    return traced_wait, traced_is_completed
