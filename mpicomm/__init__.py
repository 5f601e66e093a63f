"""mpicomm: torch.distributed-style collectives over MPI, for numpy arrays (and cupy arrays on GPUs).

Importing mpicomm starts nothing: MPI is initialised by :func:`init` or by the first call that
needs it, so the planner and command-line tools run on login nodes without MPI.

Example:
    >>> import numpy as np, mpicomm
    >>> x = np.ones(4)
    >>> mpicomm.all_reduce(x)
    >>> bool((x == mpicomm.get_world_size()).all())
    True
"""

from __future__ import annotations

from .core.groups import (
    ProcessGroup,
    destroy_process_group,
    get_global_rank,
    get_group_rank,
    get_rank,
    get_world_size,
    init,
    is_initialized,
    new_group,
    new_node_group,
)
from .core.reduce_op import ReduceOp
from .core.validation import is_validation_enabled, set_validation
from .core.work import Work
from .dense.reductions import barrier
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CommunicationError,
    CrossRankMismatchError,
    GroupError,
    MpicommError,
    MPIUnavailableError,
    ReductionTypeError,
)
from .gpu.api import (
    all_gather,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_to_all,
    all_to_all_single,
    broadcast,
    gather,
    irecv,
    isend,
    jagged_all_to_all,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
    send,
    sendrecv,
)
from .jagged import JaggedResult, KeyedJaggedArray, KJTAllToAll, KJTAllToAllAwaitable
from .objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from .objects.pickling import (
    ObjectCollectiveError,
    UnpicklingRefusedError,
    allow_unpickle,
    is_safe_unpickling,
    set_safe_unpickling,
)

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "CommunicationError",
    "CrossRankMismatchError",
    "GroupError",
    "JaggedResult",
    "KJTAllToAll",
    "KJTAllToAllAwaitable",
    "KeyedJaggedArray",
    "MPIUnavailableError",
    "MpicommError",
    "ObjectCollectiveError",
    "ProcessGroup",
    "ReduceOp",
    "ReductionTypeError",
    "UnpicklingRefusedError",
    "Work",
    "__version__",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "allow_unpickle",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_global_rank",
    "get_group_rank",
    "get_rank",
    "get_world_size",
    "init",
    "irecv",
    "is_initialized",
    "is_safe_unpickling",
    "is_validation_enabled",
    "isend",
    "jagged_all_to_all",
    "new_group",
    "new_node_group",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "sendrecv",
    "send_object_list",
    "set_safe_unpickling",
    "set_validation",
]
