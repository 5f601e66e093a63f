"""The public calls that take arrays: torch.distributed's collectives, point-to-point and jagged all-to-all.

``mpicomm.all_reduce`` and its siblings are the functions of this module. Each is the host (numpy)
implementation from :mod:`mpicomm.dense` or :mod:`mpicomm.jagged` behind the front door
(:func:`~mpicomm.front.door.front_door`), which names the roles of its array arguments and, where
there is one, its direct and pipelined device implementation (:mod:`mpicomm.gpu`).
"""

from __future__ import annotations

from typing import Any

from ..core.engine import drain, gate
from ..core.watchdog import _Threads
from ..dense import alltoall, batch, gathers, p2p, reductions
from ..gpu import direct, pipeline
from ..jagged import exchange
from . import device, jagged, kinds, sparse
from .door import BOTH, READ, WRITE, front_door

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
    "jagged_all_to_all",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "sendrecv",
]

# all_reduce, broadcast and sendrecv test the engine's gate inline (mpicomm.core.engine.wanted): the
# 8-byte budgets have no room for the wrapper's frame; every other host is wrapped in the gate here.
all_reduce = front_door(
    "all_reduce", {"tensor": BOTH}, pipelined=pipeline.all_reduce, sparse=sparse.all_reduce_sparse
)(reductions.all_reduce)
broadcast = front_door("broadcast", {"tensor": BOTH}, direct=direct.broadcast, pipelined=pipeline.broadcast)(
    reductions.broadcast
)
reduce = front_door("reduce", {"tensor": BOTH}, pipelined=pipeline.reduce)(gate("reduce")(reductions.reduce))
reduce_scatter = front_door("reduce_scatter", {"output": WRITE, "input_list": READ})(
    gate("reduce_scatter")(reductions.reduce_scatter)
)
reduce_scatter_tensor = front_door("reduce_scatter_tensor", {"output": WRITE, "input": READ})(
    gate("reduce_scatter_tensor")(reductions.reduce_scatter_tensor)
)
reduce_scatter_single = reduce_scatter_tensor
all_gather = front_door("all_gather", {"tensor_list": WRITE, "tensor": READ})(
    gate("all_gather")(gathers.all_gather)
)
all_gather_into_tensor = front_door(
    "all_gather_into_tensor",
    {"output_tensor": WRITE, "input_tensor": READ},
    direct=direct.all_gather_into_tensor,
)(gate("all_gather_into_tensor")(gathers.all_gather_into_tensor))
all_gather_single = all_gather_into_tensor
# gather writes gather_list on the root only: BOTH keeps every other rank's arrays as they were.
gather = front_door("gather", {"tensor": READ, "gather_list": BOTH})(gate("gather")(gathers.gather))
scatter = front_door("scatter", {"tensor": WRITE, "scatter_list": READ})(gate("scatter")(gathers.scatter))
all_to_all = front_door("all_to_all", {"output_tensor_list": WRITE, "input_tensor_list": READ})(
    gate("all_to_all")(alltoall.all_to_all)
)
all_to_all_single = front_door(
    "all_to_all_single",
    {"output": WRITE, "input": READ},
    direct=direct.all_to_all_single,
    pipelined=pipeline.all_to_all_single,
)(gate("all_to_all_single")(alltoall.all_to_all_single))
send = front_door("send", {"tensor": READ}, direct=direct.send, validated=False)(
    gate("send", p2p=True, validated=False)(p2p.send)
)
recv = front_door("recv", {"tensor": WRITE}, direct=direct.recv, validated=False)(
    gate("recv", p2p=True, validated=False)(p2p.recv)
)
isend = front_door("isend", {"tensor": READ}, validated=False)(
    gate("isend", p2p=True, posts=True, validated=False)(p2p.isend)
)
irecv = front_door("irecv", {"tensor": WRITE}, validated=False)(
    gate("irecv", p2p=True, posts=True, validated=False)(p2p.irecv)
)
sendrecv = front_door("sendrecv", {"tensor": READ, "recv_tensor": WRITE}, validated=False)(p2p.sendrecv)
jagged_all_to_all = front_door(
    "jagged_all_to_all",
    {"values": READ, "lengths": READ},
    direct=jagged.jagged_all_to_all_direct,
    returns="values",
)(gate("jagged_all_to_all", queued=False)(exchange.jagged_all_to_all))


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
    if not isinstance(p, batch.P2POp):
        return p
    kind = kinds.kind_of(p.tensor)
    if kind in (kinds.NUMPY, kinds.OTHER):
        return p
    arg = f"p2p_op_list[{i}].tensor"
    v = kinds.view(p.tensor, kind, fn, arg, write=p.op is p2p.irecv)
    op = batch.P2POp(p.op, v, p.peer, p.group, p.tag, p.group_peer)
    return op
