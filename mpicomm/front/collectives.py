"""The public calls that take arrays: torch.distributed's collectives, point-to-point and jagged all-to-all.

``mpicomm.all_reduce`` and its siblings are the functions of this module. Each is the host (numpy)
implementation from :mod:`mpicomm.dense` or :mod:`mpicomm.jagged` behind the front door
(:func:`~mpicomm.front.door.front_door`), which names the roles of its array arguments and, where
there is one, its direct and pipelined device implementation (:mod:`mpicomm.gpu`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.engine_gate import drain, gate
from ..core.fast import broadcast_in_c
from ..core.watchdog import _Threads
from . import device, kinds
from .door import BOTH, READ, WRITE, front_door

if TYPE_CHECKING:
    from ..dense import alltoall, batch, gathers, p2p, reductions

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "batch_isend_irecv",
    "broadcast",
    "gather",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "sendrecv",
]


def _later(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported on its first call.

    The device paths (and the sparse one) load with the first array that needs them, so a numpy
    program loads no GPU machinery (issue 44).
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


_DIRECT, _PIPELINE = "mpicomm.gpu.direct", "mpicomm.gpu.pipeline"


def _host(module: str, name: str) -> Any:
    """The host implementation ``mpicomm.dense.<module>.<name>``, imported with its door."""
    return getattr(importlib.import_module(f"mpicomm.dense.{module}"), name)


def _gated(module: str, name: str, **how: bool) -> Any:
    """The host ``mpicomm.dense.<module>.<name>`` behind the engine's gate (:mod:`mpicomm.core.engine`)."""
    return gate(name, **how)(_host(module, name))


def _doors() -> dict[str, Callable[[], Any]]:
    """Each public call's door, made on first use.

    all_reduce, broadcast and sendrecv test the engine's gate inline in their hosts
    (:func:`mpicomm.core.engine.wanted`): the 8-byte budgets have no room for the gate's frame.
    Every other host is wrapped in the gate here.

    Generating a door (its Python wrapper compiled, its C form built) costs about 0.5 ms on a quiet
    machine: a program's first call pays for its own door only (issue 44).
    """
    return {
        "all_reduce": lambda: front_door(
            "all_reduce",
            {"tensor": BOTH},
            pipelined=_later(_PIPELINE, "all_reduce"),
            sparse=_later("mpicomm.front.sparse", "all_reduce_sparse"),
        )(_host("reductions", "all_reduce")),
        "broadcast": lambda: front_door(
            "broadcast",
            {"tensor": BOTH},
            direct=_later(_DIRECT, "broadcast"),
            pipelined=_later(_PIPELINE, "broadcast"),
            fast=broadcast_in_c(),  # its common call whole in C: the 8-byte budget (issue 41)
        )(_host("reductions", "broadcast")),
        "reduce": lambda: front_door("reduce", {"tensor": BOTH}, pipelined=_later(_PIPELINE, "reduce"))(
            _gated("reductions", "reduce")
        ),
        "reduce_scatter": lambda: front_door("reduce_scatter", {"output": WRITE, "input_list": READ})(
            _gated("reductions", "reduce_scatter")
        ),
        "reduce_scatter_tensor": lambda: front_door(
            "reduce_scatter_tensor", {"output": WRITE, "input": READ}
        )(_gated("reductions", "reduce_scatter_tensor")),
        "all_gather": lambda: front_door("all_gather", {"tensor_list": WRITE, "tensor": READ})(
            _gated("gathers", "all_gather")
        ),
        "all_gather_into_tensor": lambda: front_door(
            "all_gather_into_tensor",
            {"output_tensor": WRITE, "input_tensor": READ},
            direct=_later(_DIRECT, "all_gather_into_tensor"),
        )(_gated("gathers", "all_gather_into_tensor")),
        # gather writes gather_list on the root only: BOTH keeps every other rank's arrays as they were.
        "gather": lambda: front_door("gather", {"tensor": READ, "gather_list": BOTH})(
            _gated("gathers", "gather")
        ),
        "scatter": lambda: front_door("scatter", {"tensor": WRITE, "scatter_list": READ})(
            _gated("gathers", "scatter")
        ),
        "all_to_all": lambda: front_door(
            "all_to_all", {"output_tensor_list": WRITE, "input_tensor_list": READ}
        )(_gated("alltoall", "all_to_all")),
        "all_to_all_single": lambda: front_door(
            "all_to_all_single",
            {"output": WRITE, "input": READ},
            direct=_later(_DIRECT, "all_to_all_single"),
            pipelined=_later(_PIPELINE, "all_to_all_single"),
        )(_gated("alltoall", "all_to_all_single")),
        "send": lambda: front_door("send", {"tensor": READ}, direct=_later(_DIRECT, "send"), validated=False)(
            _gated("p2p", "send", p2p=True, validated=False)
        ),
        "recv": lambda: front_door(
            "recv", {"tensor": WRITE}, direct=_later(_DIRECT, "recv"), validated=False
        )(_gated("p2p", "recv", p2p=True, validated=False)),
        "isend": lambda: front_door("isend", {"tensor": READ}, validated=False)(
            _gated("p2p", "isend", p2p=True, posts=True, validated=False)
        ),
        "irecv": lambda: front_door("irecv", {"tensor": WRITE}, validated=False)(
            _gated("p2p", "irecv", p2p=True, posts=True, validated=False)
        ),
        "sendrecv": lambda: front_door("sendrecv", {"tensor": READ, "recv_tensor": WRITE}, validated=False)(
            _host("p2p", "sendrecv")
        ),
    }


#: torch's other names for two of the calls: the same objects.
_ALIASES = {"all_gather_single": "all_gather_into_tensor", "reduce_scatter_single": "reduce_scatter_tensor"}
_MAKE = _doors()

if TYPE_CHECKING:  # the doors have their hosts' signatures (front_door returns the host's type)
    all_reduce = reductions.all_reduce
    broadcast = reductions.broadcast
    reduce = reductions.reduce
    reduce_scatter = reductions.reduce_scatter
    reduce_scatter_tensor = reduce_scatter_single = reductions.reduce_scatter_tensor
    all_gather = gathers.all_gather
    all_gather_into_tensor = all_gather_single = gathers.all_gather_into_tensor
    gather = gathers.gather
    scatter = gathers.scatter
    all_to_all = alltoall.all_to_all
    all_to_all_single = alltoall.all_to_all_single
    send, recv, isend, irecv, sendrecv = p2p.send, p2p.recv, p2p.isend, p2p.irecv, p2p.sendrecv


def __getattr__(name: str) -> Any:
    """A public call's door, made now and kept (PEP 562): the module's attribute from then on."""
    own = _ALIASES.get(name, name)
    make = _MAKE.get(own)
    if make is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    door = globals().get(own)
    if door is None:
        door = globals()[own] = make()
    globals()[name] = door
    return door


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def batch_isend_irecv(p2p_op_list: list[batch.P2POp]) -> list[Any]:
    """Start every send and receive of ``p2p_op_list``; wait on the Works returned.

    All operations are checked first; then each is posted as one MPI non-blocking call, in list
    order. Unlike NCCL, MPI needs no matching order between ranks, so any pattern (a ring, a
    halo exchange) works. Tensors may be numpy arrays, torch tensors or cupy arrays (written in place),
    all on the host or all on the GPU; device ones are staged through pinned host buffers.

    Args:
        p2p_op_list: The operations, all on the same group.

    Returns:
        One Work per operation, in list order (no Work for an operation on a group this rank is not in).

    Raises:
        ArgumentTypeError: an entry is not a P2POp, a tensor is not an array, or host and device
            arrays are mixed.
        ArgumentError: an empty list, operations on different groups, bad peers, tags or buffers,
            or two operations whose memory overlaps where one of them is received into.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> got = np.empty(1)
        >>> ops = [mpicomm.P2POp(mpicomm.isend, np.array([float(r)]), (r + 1) % w),
        ...        mpicomm.P2POp(mpicomm.irecv, got, (r - 1) % w)]
        >>> if w > 1:
        ...     for work in mpicomm.batch_isend_irecv(ops):
        ...         _ = work.wait()
        ...     assert got[0] == (r - 1) % w
    """
    from ..dense import batch

    fn = "batch_isend_irecv"
    if _Threads.pending:
        drain(None, fn)  # posted on this thread, after the calls queued before it
    if isinstance(p2p_op_list, (list, tuple)) and any(
        isinstance(p, batch.P2POp) and kinds.kind_of(p.tensor) not in (kinds.NUMPY, kinds.OTHER)
        for p in p2p_op_list
    ):
        p2p_op_list = [_host_op(p, i, fn) for i, p in enumerate(p2p_op_list)]
        if any(isinstance(p, batch.P2POp) and kinds.kind_of(p.tensor) == kinds.CUPY for p in p2p_op_list):
            return device.batch_on_device(p2p_op_list, fn)
    return batch.batch_isend_irecv(p2p_op_list)


def _host_op(p: Any, i: int, fn: str) -> Any:
    from ..dense import batch, p2p

    if not isinstance(p, batch.P2POp):
        return p
    kind = kinds.kind_of(p.tensor)
    if kind in (kinds.NUMPY, kinds.OTHER):
        return p
    arg = f"p2p_op_list[{i}].tensor"
    v = kinds.view(p.tensor, kind, fn, arg, write=p.op is p2p.irecv)
    op = batch.P2POp(p.op, v, p.peer, p.group, p.tag, p.group_peer)
    return op
