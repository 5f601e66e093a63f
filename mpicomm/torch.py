"""``import mpicomm.torch``: mpicomm becomes torch.distributed's backend ``"mpicomm"`` (cpu and cuda).

The one line a torch program adds; then ``dist.init_process_group("mpicomm")`` under ``mpiexec``
(or ``mpirun``, ``srun``) needs no ``MASTER_ADDR``, ``MASTER_PORT``, rank or world size, and DDP,
FSDP2, DeviceMesh, DTensor and functional collectives run over MPI. See ``docs/torch.rst``.

Example:
    >>> import torch.distributed as dist
    >>> import mpicomm.torch
    >>> "MPICOMM" in dist.Backend._plugins
    True
"""

from __future__ import annotations

from .c10d.registered import MpicommProcessGroup
from .c10d.registration import NAME, process_group, register

__all__ = ["NAME", "MpicommProcessGroup", "process_group", "register"]

register()
