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

import importlib
from typing import TYPE_CHECKING, Any

from .c10d import backend_names as _backend_names  # noqa: F401 - installs torch's backend-name check in core.groups
from .core import late as _late

# The public names load with their modules on first use (PEP 562), so that ``import mpicomm`` and a
# first ``get_rank()`` import only what they need (neither the front door nor the data paths).
# ``if TYPE_CHECKING`` below imports the same names, so mypy, IDEs and the docs see the whole API.
_WHERE: dict[str, str] = {
    "Backend": "mpicomm.c10d.backend_names",
    "BackendWarning": "mpicomm.c10d.backend_names",
    "is_available": "mpicomm.c10d.backend_names",
    "is_backend_available": "mpicomm.c10d.backend_names",
    "is_gloo_available": "mpicomm.c10d.backend_names",
    "is_mpi_available": "mpicomm.c10d.backend_names",
    "is_nccl_available": "mpicomm.c10d.backend_names",
    "is_ucc_available": "mpicomm.c10d.backend_names",
    "is_xccl_available": "mpicomm.c10d.backend_names",
    "reduce_op": "mpicomm.c10d.backend_names",
    "DeviceMesh": "mpicomm.c10d.device_mesh",
    "init_device_mesh": "mpicomm.c10d.device_mesh",
    "GroupMember": "mpicomm.c10d.startup",
    "get_backend": "mpicomm.c10d.startup",
    "get_node_local_rank": "mpicomm.c10d.startup",
    "get_pg_count": "mpicomm.c10d.startup",
    "get_process_group_ranks": "mpicomm.c10d.startup",
    "group": "mpicomm.c10d.startup",
    "init_process_group": "mpicomm.c10d.startup",
    "is_torchelastic_launched": "mpicomm.c10d.startup",
    "new_subgroups": "mpicomm.c10d.startup",
    "new_subgroups_by_enumeration": "mpicomm.c10d.startup",
    "split_group": "mpicomm.c10d.startup",
    "Array": "mpicomm.core.arrays",
    "DebugLevel": "mpicomm.core.debug",
    "get_debug_level": "mpicomm.core.debug",
    "set_debug_level": "mpicomm.core.debug",
    "set_debug_level_from_env": "mpicomm.core.debug",
    "Future": "mpicomm.core.future",
    "DefaultGroupError": "mpicomm.core.groups",
    "ProcessGroup": "mpicomm.core.groups",
    "destroy_process_group": "mpicomm.core.groups",
    "get_global_rank": "mpicomm.core.groups",
    "get_group_rank": "mpicomm.core.groups",
    "get_rank": "mpicomm.core.groups",
    "get_world_size": "mpicomm.core.groups",
    "init": "mpicomm.core.groups",
    "is_initialized": "mpicomm.core.groups",
    "new_group": "mpicomm.core.groups",
    "new_node_group": "mpicomm.core.groups",
    "ReduceOp": "mpicomm.core.reduce_op",
    "supports_complex": "mpicomm.core.reduce_op",
    "is_validation_enabled": "mpicomm.core.validation",
    "set_validation": "mpicomm.core.validation",
    "Work": "mpicomm.core.work",
    "wait_all": "mpicomm.core.work",
    "P2POp": "mpicomm.dense.batch",
    "barrier": "mpicomm.dense.sync",
    "monitored_barrier": "mpicomm.dense.sync",
    "ArgumentError": "mpicomm.errors",
    "ArgumentTypeError": "mpicomm.errors",
    "CommunicationError": "mpicomm.errors",
    "CrossRankMismatchError": "mpicomm.errors",
    "DistBackendError": "mpicomm.errors",
    "DistError": "mpicomm.errors",
    "DistNetworkError": "mpicomm.errors",
    "DistStoreError": "mpicomm.errors",
    "DtypeMismatchError": "mpicomm.errors",
    "GroupError": "mpicomm.errors",
    "MPIUnavailableError": "mpicomm.errors",
    "MpicommError": "mpicomm.errors",
    "ReductionTypeError": "mpicomm.errors",
    "all_gather_coalesced": "mpicomm.front.coalesced",
    "all_reduce_coalesced": "mpicomm.front.coalesced",
    "all_gather": "mpicomm.front.collectives",
    "all_gather_into_tensor": "mpicomm.front.collectives",
    "all_gather_single": "mpicomm.front.collectives",
    "all_reduce": "mpicomm.front.collectives",
    "all_to_all": "mpicomm.front.collectives",
    "all_to_all_single": "mpicomm.front.collectives",
    "batch_isend_irecv": "mpicomm.front.collectives",
    "broadcast": "mpicomm.front.collectives",
    "gather": "mpicomm.front.collectives",
    "irecv": "mpicomm.front.collectives",
    "isend": "mpicomm.front.collectives",
    "jagged_all_to_all": "mpicomm.front.jagged_call",
    "recv": "mpicomm.front.collectives",
    "reduce": "mpicomm.front.collectives",
    "reduce_scatter": "mpicomm.front.collectives",
    "reduce_scatter_single": "mpicomm.front.collectives",
    "reduce_scatter_tensor": "mpicomm.front.collectives",
    "scatter": "mpicomm.front.collectives",
    "send": "mpicomm.front.collectives",
    "sendrecv": "mpicomm.front.collectives",
    "CartGrid": "mpicomm.front.grid",
    "KJTAllToAll": "mpicomm.front.jagged",
    "KJTAllToAllAwaitable": "mpicomm.front.jagged",
    "KeyedJaggedArray": "mpicomm.front.jagged",
    "all_reduce_sparse": "mpicomm.front.sparse",
    "JaggedArray": "mpicomm.jagged",
    "JaggedResult": "mpicomm.jagged",
    "all_gather_object": "mpicomm.objects",
    "broadcast_object_list": "mpicomm.objects",
    "gather_object": "mpicomm.objects",
    "recv_object_list": "mpicomm.objects",
    "scatter_object_list": "mpicomm.objects",
    "send_object_list": "mpicomm.objects",
    "ObjectCollectiveError": "mpicomm.objects.pickling",
    "UnpicklingRefusedError": "mpicomm.objects.pickling",
    "allow_unpickle": "mpicomm.objects.pickling",
    "is_safe_unpickling": "mpicomm.objects.pickling",
    "set_safe_unpickling": "mpicomm.objects.pickling",
}


def _attach_torch_methods() -> None:
    """Attach torch's ProcessGroup methods (``pg.allreduce([t])``, ...): on a group's first use of one."""
    importlib.import_module("mpicomm.c10d.pg_methods")


#: The names :mod:`mpicomm.c10d.pg_methods` attaches (tests/unit/test_late_methods.py checks the two agree).
#: A run-time plug, listed in :data:`mpicomm.wiring.PLUGS` (the wiring module itself loads on first
#: use of an object collective: ``import mpicomm`` reads no file more for it).
_TORCH_GROUP_METHODS = (
    "allreduce",
    "broadcast",
    "allgather",
    "reduce_scatter",
    "alltoall_base",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "reduce",
    "gather",
    "scatter",
    "allreduce_coalesced",
    "alltoall",
    "_allgather_base",
    "_reduce_scatter_base",
)
_late.later(_TORCH_GROUP_METHODS, _attach_torch_methods)


def __getattr__(name: str) -> Any:
    """A public name, imported with its module on first use (then kept in the package's namespace)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'mpicomm' has no attribute {name!r}")
    if where.startswith("mpicomm.objects"):
        importlib.import_module("mpicomm.wiring").objects()  # their GPU hooks, before the first one
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


if TYPE_CHECKING:
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
    from .dense.sync import barrier, monitored_barrier
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
        recv,
        reduce,
        reduce_scatter,
        reduce_scatter_single,
        reduce_scatter_tensor,
        scatter,
        send,
        sendrecv,
    )
    from .front.grid import CartGrid
    from .front.jagged import KeyedJaggedArray, KJTAllToAll, KJTAllToAllAwaitable
    from .front.jagged_call import jagged_all_to_all
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
    "CartGrid",
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

# issue 43: with MPICOMM_TRACE=<dir>, the public calls are traced ones (mpicomm.trace); unset, nothing changes
if importlib.import_module("os").environ.get("MPICOMM_TRACE"):
    importlib.import_module("mpicomm.trace").install(__name__)
