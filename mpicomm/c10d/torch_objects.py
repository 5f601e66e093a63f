"""torch's object collectives on this backend under mpicomm's safe mode (``MPICOMM_SAFE_PICKLE=1``).

torch's ``broadcast_object_list``, ``all_gather_object``, ``gather_object``, ``scatter_object_list``,
``send_object_list`` and ``recv_object_list`` pickle and unpickle in torch itself, with plain
``pickle``: a group of this backend only carries the bytes. So that safe mode means the same under
torch as under mpicomm's own object collectives, :func:`install` (run by ``import mpicomm.torch``)
routes torch's one unpickling step (``distributed_c10d._tensor_to_object``, which each of them calls by
its module name) through mpicomm's safe unpickler when safe mode is on and the group is an mpicomm
group: no callable the stream names runs, and the call raises
:class:`~mpicomm.errors.UnpicklingRefusedError`. Other groups (gloo, nccl) and safe mode off are torch's
own step, unchanged.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..objects.pickling import is_safe_unpickling, loads
from .registered import MpicommProcessGroup

__all__ = ["install"]

_c10d: Any = importlib.import_module("torch.distributed.distributed_c10d")


class _State:
    torch_step: Any = None  # torch's own _tensor_to_object


def install() -> None:
    """Route torch's unpickling of object collectives on mpicomm groups through safe mode; idempotent."""
    if _State.torch_step is None:
        _State.torch_step = _c10d._tensor_to_object
        _c10d._tensor_to_object = _tensor_to_object


def _tensor_to_object(tensor: Any, tensor_size: Any, group: Any) -> Any:
    """Torch's ``_tensor_to_object``; in safe mode on an mpicomm group, mpicomm's safe unpickler."""
    if not is_safe_unpickling():
        return _State.torch_step(tensor, tensor_size, group)
    pg = group if group is not None else _c10d._get_default_group()
    if not isinstance(pg, MpicommProcessGroup):
        return _State.torch_step(tensor, tensor_size, group)
    data = tensor.cpu().numpy().tobytes()[: int(tensor_size)]
    return loads(data, safe=True)
