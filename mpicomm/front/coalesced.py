"""The public coalesced calls: ``all_reduce_coalesced`` and ``all_gather_coalesced``, torch's signatures.

Each is the host implementation of :mod:`mpicomm.dense.coalesced` behind the front door, so numpy
arrays, torch tensors and the other array kinds all go in as they are. As in torch, ``async_op=True``
returns a :class:`~mpicomm.core.future.Future` (``work.get_future()``), not a Work.
"""

from __future__ import annotations

from typing import Any

from ..core.engine_gate import gate
from ..core.future import Future
from ..core.groups import ProcessGroup
from ..core.reduce_op import ReduceOp
from ..core.watchdog import Site, timed
from ..core.work import Work
from ..dense import coalesced
from ..errors import ArgumentTypeError
from .door import BOTH, READ, WRITE, front_door

__all__ = ["all_gather_coalesced", "all_reduce_coalesced"]

_all_reduce_coalesced = front_door("all_reduce_coalesced", {"tensors": BOTH})(
    gate("all_reduce_coalesced")(coalesced.all_reduce_coalesced)
)
_all_gather_coalesced = front_door(
    "all_gather_coalesced", {"output_tensors": WRITE, "input_tensor_list": READ}
)(gate("all_gather_coalesced")(coalesced.all_gather_coalesced))


@timed(Site("all_reduce_coalesced"))
def all_reduce_coalesced(
    tensors: list[Any] | Any,
    op: ReduceOp = ReduceOp.SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Future | None:
    """Reduce every tensor of ``tensors`` over the group in one MPI call; each gets the result in place.

    ======  ===================  ===================
    rank    tensors in           tensors out (SUM)
    ======  ===================  ===================
    0       [[1, 2], [3]]        [[4, 6], [8]]
    1       [[3, 4], [5]]        [[4, 6], [8]]
    ======  ===================  ===================

    Complex tensors take SUM, AVG and PREMUL_SUM; MAX, MIN, PRODUCT and the bitwise operators on
    them raise a ValueError, as in torch. As in torch, shapes are not compared across ranks.

    Args:
        tensors: Tensors or arrays of one dtype (or one of them), the same list on every rank.
        op: The reduction (see :class:`~mpicomm.ReduceOp`).
        group: The process group; ``None`` for the world.
        async_op: Return a Future of ``tensors`` instead of blocking (torch returns the work's
            future here).

    Returns:
        A :class:`~mpicomm.core.future.Future` if ``async_op``, else None.

    Raises:
        ArgumentTypeError: an entry is not an array.
        ArgumentError: the arrays have different dtypes (a ValueError, as in torch).
        ReductionTypeError: ``op`` is not defined on the dtype (also a ValueError).

    Example:
        >>> import numpy as np, mpicomm
        >>> a, b = np.ones(2), np.full(3, 2.0)
        >>> mpicomm.all_reduce_coalesced([a, b])
        >>> float(b[0]) == 2.0 * mpicomm.get_world_size()
        True
    """
    return _future(_all_reduce_coalesced(tensors, op, group, async_op))


@timed(Site("all_gather_coalesced"))
def all_gather_coalesced(
    output_tensor_lists: list[list[Any]],
    input_tensor_list: list[Any],
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Future | None:
    """Gather every rank's ``input_tensor_list`` into ``output_tensor_lists[rank]`` in one MPI call.

    ======  ==================  =======================================
    rank    input_tensor_list   output_tensor_lists (every rank)
    ======  ==================  =======================================
    0       [[1, 1], [2]]       [[[1, 1], [2]], [[3, 3], [5]]]
    1       [[3, 3], [5]]       [[[1, 1], [2]], [[3, 3], [5]]]
    ======  ==================  =======================================

    Args:
        output_tensor_lists: One list per group rank, each holding tensors of the sizes and dtype of
            ``input_tensor_list``.
        input_tensor_list: This rank's tensors, of one dtype; the same sizes on every rank.
        group: The process group; ``None`` for the world.
        async_op: Return a Future of the outputs instead of blocking (as torch does).

    Returns:
        A :class:`~mpicomm.core.future.Future` if ``async_op``, else None.

    Raises:
        ArgumentTypeError: ``output_tensor_lists`` is not a list of lists, or an entry is not an array.
        ArgumentError: a wrong number of lists, a wrong size or dtype of an output, or mixed dtypes.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> outs = [[np.empty(2)] for _ in range(w)]
        >>> mpicomm.all_gather_coalesced(outs, [np.full(2, float(r))])
        >>> [float(o[0][0]) for o in outs] == [float(i) for i in range(w)]
        True
    """
    fn = "all_gather_coalesced"
    if not isinstance(output_tensor_lists, (list, tuple)) or not all(
        isinstance(each, (list, tuple)) for each in output_tensor_lists
    ):
        raise ArgumentTypeError(
            f"{fn}: output_tensor_lists is {type(output_tensor_lists).__qualname__}; expected a list of "
            "lists of tensors, one list per group rank"
        )
    flat = [t for each in output_tensor_lists for t in each]
    return _future(_all_gather_coalesced(flat, input_tensor_list, group, async_op))


def _future(work: Work | None) -> Future | None:
    return None if work is None else work.get_future()
