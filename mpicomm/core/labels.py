"""The backend name a group keeps: torch's names, checked and lower-cased (no torch imported).

Every backend a torch program names (``"gloo"``, ``"nccl"``, ``"GLOO"``, ``"cpu:gloo,cuda:nccl"``, ...)
is served by MPI. The name is kept, lower-cased as torch keeps it, so that :func:`~mpicomm.get_backend`
answers what the program asked for; the first name other than ``mpi`` warns once per job. It lives in
``core`` because :func:`mpicomm.new_group` (``core.groups``) checks its ``backend`` argument; the torch
room (``mpicomm.c10d.backend_names``) shares :data:`BACKEND_NAMES` as ``BACKEND_NAMES``.
"""

from __future__ import annotations

import os
import sys
import warnings

from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["BACKEND_NAMES", "BackendWarning", "backend_name", "names_in"]

#: torch's backend names (torch.distributed's ``Backend.backend_list``; mpicomm's ``Backend`` shares it).
BACKEND_NAMES = ["undefined", "gloo", "nccl", "xccl", "ucc", "mpi", "fake"]


class BackendWarning(UserWarning):
    """A torch backend name other than ``mpi`` was given: the group runs on MPI all the same."""


class _Warned:
    once = False


def backend_name(backend: object, fn: str, default: str = "mpi") -> str:
    """The lower-case backend name of torch's ``backend`` argument (``default`` for None).

    Accepts torch's names in any case and its device lists (``"cpu:gloo,cuda:nccl"``); the first
    name other than ``mpi`` warns once per job (on rank 0) that MPI serves it.

    Args:
        backend: ``None``, a name such as ``"gloo"``, or ``"device:name,..."``.
        fn: The calling function, for messages.
        default: The name for ``None``.

    Returns:
        The name, lower-cased.

    Raises:
        ArgumentTypeError: ``backend`` is not a string.
        ArgumentError: an unknown name or a malformed device list.

    Example:
        >>> backend_name("MPI", "init_process_group")
        'mpi'
    """
    if backend is None:
        return default
    if not isinstance(backend, str):
        raise ArgumentTypeError(
            f"{fn}: backend is {backend!r}; expected a str such as 'gloo' or 'mpi', or None"
        )
    name = backend.strip().lower()
    names = names_in(name)
    if names is None:
        raise ArgumentError(
            f"{fn}: backend is {backend!r}; expected one of {BACKEND_NAMES[1:]} or a device list "
            "such as 'cpu:gloo,cuda:nccl' (every one of them runs on MPI)"
        )
    if any(n != "mpi" for n in names) and not _Warned.once:
        _Warned.once = True
        if _job_rank() == 0:  # once per job: the same line from every rank is noise
            warnings.warn(
                f"{fn}: backend {backend!r} is served by MPI (mpicomm's only transport); get_backend() "
                f"answers {name!r} as torch would",
                BackendWarning,
                stacklevel=4,  # backend_name <- check_backend <- init_process_group/new_group <- the caller
            )
    return name


def _job_rank() -> int:
    """This process's rank in the job: MPI's if started, else the launcher's (0 when launched by none)."""
    mpi = sys.modules.get("mpi4py.MPI")  # started by whoever imported it; never started here
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return int(mpi.COMM_WORLD.Get_rank())
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        text = os.environ.get(var, "").strip()
        if text.isdigit():
            return int(text)
    return 0


def names_in(name: str) -> list[str] | None:
    """The backend names in a lower-cased ``name`` ("gloo" or "cpu:gloo,cuda:nccl"); None if malformed."""
    names = [part.split(":", 1)[1] if ":" in part else part for part in name.split(",")]
    if (":" not in name and "," in name) or not all(n in BACKEND_NAMES for n in names):
        return None
    return names
