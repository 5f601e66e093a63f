"""``import mpicomm.torch``: mpicomm becomes torch.distributed's backend ``"mpicomm"`` (cpu; cuda with CUDA).

The one line a torch program adds. On import, without starting MPI:

- torchrun's variables ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are set from
  the launcher's (``mpiexec``/``mpirun`` of MPICH or Open MPI, ``srun``; see
  :mod:`mpicomm.c10d.launch`) where the environment lacks them, so that programs written for torchrun
  and ``dist.get_node_local_rank()`` find them; a value already set is kept;
- ``"mpicomm"`` is registered, and becomes the default backend for ``cpu``: ``init_process_group()``
  without a backend, and ``init_device_mesh("cpu", ...)`` with no default group, start it.

Then ``dist.init_process_group("mpicomm")`` under ``mpiexec`` (or ``mpirun``, ``srun``) needs no
``MASTER_ADDR``, ``MASTER_PORT``, rank or world size, and DDP, FSDP2, DeviceMesh, DTensor and
functional collectives run over MPI. See ``docs/torch.rst``.

Example:
    >>> import torch.distributed as dist
    >>> import mpicomm.torch
    >>> "MPICOMM" in dist.Backend._plugins, dist.Backend.default_device_backend_map["cpu"]
    (True, 'mpicomm')
"""

from __future__ import annotations

from .c10d.launch import set_launch_variables
from .c10d.registered import MpicommProcessGroup
from .c10d.registration import NAME, process_group, register

__all__ = ["NAME", "MpicommProcessGroup", "process_group", "register"]

set_launch_variables()
register()
