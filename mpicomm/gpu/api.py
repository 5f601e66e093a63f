"""The public calls that take arrays, made device-aware: numpy arrays go straight to the host code.

``mpicomm.all_reduce`` and its siblings are the functions of this module: each is the host
implementation from :mod:`mpicomm.dense` or :mod:`mpicomm.jagged` wrapped by
:func:`~mpicomm.gpu.front.device_aware` with the roles of its array arguments and, where there is
one, its direct and pipelined implementation.
"""

from __future__ import annotations

from typing import Any

from ..dense import alltoall, gathers, p2p, reductions
from ..jagged import exchange
from ..jagged.exchange import JaggedResult
from . import direct, pipeline
from .backend import backend
from .front import BOTH, READ, WRITE, device_aware

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
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


def _on_device(res: Any) -> Any:
    """A jagged result's arrays as device arrays (the splits stay a list)."""
    be = backend()
    if isinstance(res, JaggedResult):
        return JaggedResult(be.asarray(res.lengths), be.asarray(res.values), res.splits)
    lengths, values, splits = res
    return [be.asarray(lengths), be.asarray(values), splits]


all_reduce = device_aware({"tensor": BOTH}, pipelined=pipeline.all_reduce)(reductions.all_reduce)
broadcast = device_aware({"tensor": BOTH}, direct=direct.broadcast, pipelined=pipeline.broadcast)(
    reductions.broadcast
)
reduce = device_aware({"tensor": BOTH})(reductions.reduce)
reduce_scatter = device_aware({"output": WRITE, "input_list": READ})(reductions.reduce_scatter)
reduce_scatter_tensor = device_aware({"output": WRITE, "input": READ})(reductions.reduce_scatter_tensor)
reduce_scatter_single = reduce_scatter_tensor
all_gather = device_aware({"tensor_list": WRITE, "tensor": READ})(gathers.all_gather)
all_gather_into_tensor = device_aware(
    {"output_tensor": WRITE, "input_tensor": READ}, direct=direct.all_gather_into_tensor
)(gathers.all_gather_into_tensor)
all_gather_single = all_gather_into_tensor
# gather writes gather_list on the root only: BOTH keeps every other rank's arrays as they were.
gather = device_aware({"tensor": READ, "gather_list": BOTH})(gathers.gather)
scatter = device_aware({"tensor": WRITE, "scatter_list": READ})(gathers.scatter)
all_to_all = device_aware({"output_tensor_list": WRITE, "input_tensor_list": READ})(alltoall.all_to_all)
all_to_all_single = device_aware({"output": WRITE, "input": READ}, direct=direct.all_to_all_single)(
    alltoall.all_to_all_single
)
send = device_aware({"tensor": READ}, direct=direct.send)(p2p.send)
recv = device_aware({"tensor": WRITE}, direct=direct.recv)(p2p.recv)
isend = device_aware({"tensor": READ})(p2p.isend)
irecv = device_aware({"tensor": WRITE})(p2p.irecv)
sendrecv = device_aware({"tensor": READ, "recv_tensor": WRITE})(p2p.sendrecv)
jagged_all_to_all = device_aware({"values": READ, "lengths": READ}, result=_on_device)(
    exchange.jagged_all_to_all
)
