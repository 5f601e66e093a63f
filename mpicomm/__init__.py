"""mpicomm: torch.distributed-style collectives over MPI, for numpy arrays, torch tensors and cupy arrays.

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

from .c10d import pg_methods as _pg_methods  # noqa: F401 - attaches c10d's methods to ProcessGroup
from .c10d.backend_names import (
    Backend,
    BackendWarning,
    is_available,
    is_backend_available,
    is_gloo_available,
    is_mpi_available,
    is_nccl_available,
    is_ucc_available,
    is_xccl_available,
    reduce_op,
)
from .c10d.device_mesh import DeviceMesh, init_device_mesh
from .c10d.startup import (
    GroupMember,
    get_backend,
    get_node_local_rank,
    get_pg_count,
    get_process_group_ranks,
    group,
    init_process_group,
    is_torchelastic_launched,
    new_subgroups,
    new_subgroups_by_enumeration,
    split_group,
)
from .core.arrays import Array
from .core.debug import DebugLevel, get_debug_level, set_debug_level, set_debug_level_from_env
from .core.future import Future
from .core.groups import (
    DefaultGroupError,
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
from .core.reduce_op import ReduceOp, supports_complex
from .core.validation import is_validation_enabled, set_validation
from .core.work import Work, wait_all
from .dense.batch import P2POp
from .dense.reductions import barrier
from .dense.sync import monitored_barrier
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CommunicationError,
    CrossRankMismatchError,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    DtypeMismatchError,
    GroupError,
    MpicommError,
    MPIUnavailableError,
    ReductionTypeError,
)
from .front import objects as _objects  # noqa: F401 - gives the object collectives the GPU hooks
from .front.coalesced import all_gather_coalesced, all_reduce_coalesced
from .front.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_to_all,
    all_to_all_single,
    batch_isend_irecv,
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
from .front.jagged import KeyedJaggedArray, KJTAllToAll, KJTAllToAllAwaitable
from .front.sparse import all_reduce_sparse
from .jagged import JaggedArray, JaggedResult
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
    "Array",
    "Backend",
    "BackendWarning",
    "CommunicationError",
    "CrossRankMismatchError",
    "DebugLevel",
    "DefaultGroupError",
    "DeviceMesh",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "DtypeMismatchError",
    "Future",
    "GroupError",
    "GroupMember",
    "JaggedArray",
    "JaggedResult",
    "KJTAllToAll",
    "KJTAllToAllAwaitable",
    "KeyedJaggedArray",
    "MPIUnavailableError",
    "MpicommError",
    "ObjectCollectiveError",
    "P2POp",
    "ProcessGroup",
    "ReduceOp",
    "ReductionTypeError",
    "UnpicklingRefusedError",
    "Work",
    "__version__",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_reduce_sparse",
    "all_to_all",
    "all_to_all_single",
    "allow_unpickle",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_backend",
    "get_debug_level",
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_pg_count",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init",
    "init_device_mesh",
    "init_process_group",
    "irecv",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_safe_unpickling",
    "is_torchelastic_launched",
    "is_ucc_available",
    "is_validation_enabled",
    "is_xccl_available",
    "isend",
    "jagged_all_to_all",
    "monitored_barrier",
    "new_group",
    "new_node_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "sendrecv",
    "send_object_list",
    "set_debug_level",
    "set_debug_level_from_env",
    "set_safe_unpickling",
    "set_validation",
    "supports_complex",
    "wait_all",
]
