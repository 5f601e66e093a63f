"""``backend="mpicomm"`` in torch.distributed: the registered creator and the rendezvous over MPI.

:func:`register` (run by ``import mpicomm.torch``) registers the backend ``"mpicomm"`` for ``cpu`` (and
``cuda`` where torch has CUDA) with torch's extended creator API, and teaches torch's ``env://``
rendezvous to ask MPI when the launcher (``mpiexec``, ``mpirun``, ``srun``) set no
``MASTER_ADDR``/``MASTER_PORT``. Then

    dist.init_process_group("mpicomm")

needs nothing else. The store torch still wants (its ``PrefixStore`` of every group, gloo side groups,
``TORCH_DIST_INIT_BARRIER=1``) is a ``TCPStore`` served by world rank 0 on a free port; the port and
rank 0's host name travel to the other ranks in one ``MPI_Bcast`` of a numpy buffer. When
``MASTER_ADDR`` and ``MASTER_PORT`` are set (torchrun), ``env://`` is torch's own, unchanged.
``init_method="mpicomm://"`` asks for the MPI rendezvous explicitly.

torch calls the creator on the members of a new group only (DeviceMesh makes one group per mesh
line), so a subgroup's communicator is made with ``MPI_Comm_create_group`` by its members alone.
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore
from torch.distributed import constants as _constants

from .. import _mpi
from ..core import groups
from ..dense.sync import barrier
from ..errors import ArgumentError
from . import compiled, options, torch_objects
from .launch import check_launch
from .registered import DEVICES, MpicommProcessGroup
from .waiting import sleep_in_long_waits

__all__ = ["NAME", "process_group", "register"]

#: The backend name (torch keeps ``"mpi"`` for its own MPI backend, absent from the PyPI wheels).
NAME = "mpicomm"
_FN = "init_process_group"
_HOST_BYTES = 256
# the module (torch.distributed.rendezvous, the attribute, is a function of the same name)
_rdzv = importlib.import_module("torch.distributed.rendezvous")


class _State:
    torch_env: Any = None  # torch's own env:// handler, called when MASTER_ADDR/PORT are set


def register() -> None:
    """Register ``"mpicomm"`` with torch.distributed (cpu and cuda) and the MPI rendezvous; idempotent.

    Example:
        >>> import torch.distributed as dist
        >>> from mpicomm.c10d.registration import register
        >>> register()
        >>> "MPICOMM" in dist.Backend._plugins
        True
    """
    # torch calls the group from its own threads too (autograd's device threads run DDP's hooks),
    # which mpicomm refuses below MPI_THREAD_MULTIPLE: ask for it where mpicomm starts MPI.
    _mpi.need("multiple", "the torch backend (torch calls it from its own threads)")
    if NAME.upper() not in dist.Backend._plugins:
        # the devices this torch has: told "cuda" on a CPU-only torch, torch puts buffers there
        # (ShardedTensor's gather asks the backend's device map for its non-cpu device)
        devices = [d.type for d in DEVICES]
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=devices)
    # a group started without a backend name (init_device_mesh("cpu", ...) with no default group calls
    # init_process_group() bare) takes the default backend of the machine's device: mpicomm for cpu.
    # CUDA keeps its own default (nccl), which the user chose by installing a CUDA torch.
    dist.Backend.default_device_backend_map["cpu"] = NAME
    handlers = _rdzv._rendezvous_handlers
    if _State.torch_env is None:
        _State.torch_env = handlers["env"]
        handlers["env"] = _env_or_mpi  # torch's register_rendezvous_handler refuses a second "env"
    if "mpicomm" not in handlers:
        handlers["mpicomm"] = _mpi_rendezvous
    torch_objects.install()
    compiled.install()


def process_group(group: groups.ProcessGroup, name: str = "") -> MpicommProcessGroup:
    """Torch's ProcessGroup on an mpicomm group, outside torch's registry (for direct use and tests).

    Args:
        group: The mpicomm group (``mpicomm.init()``, ``mpicomm.new_group(...)``).
        name: The group name to report.

    Returns:
        The torch ProcessGroup; its methods call mpicomm on ``group``.

    Example:
        >>> import torch, mpicomm
        >>> from mpicomm.c10d.registration import process_group
        >>> t = torch.ones(1)
        >>> process_group(mpicomm.init()).allreduce([t]).wait() and float(t[0]) == mpicomm.get_world_size()
        True
    """
    return MpicommProcessGroup(group, name)


def _create(opts: Any, backend_options: Any) -> MpicommProcessGroup:
    """Torch's creator (extended API): the group of ``opts.global_ranks_in_group`` (empty: the world)."""
    helper = _helper_locals()
    _refuse_mixed_devices(helper)
    w = groups.world(_FN)
    ranks = list(opts.global_ranks_in_group)
    # torch passes its own default (30 minutes) when the user gave none: the group then takes
    # mpicomm's default (MPICOMM_TIMEOUT), as a group made by mpicomm without a timeout does
    timeout = None if _torch_default_timeout(helper, opts.timeout) else options.seconds(opts.timeout, _FN)
    if not ranks:
        if opts.group_size != w.size() or opts.group_rank != w.rank():
            check_launch(w.rank(), w.size(), _FN)  # torchrun's rank and size, not the user's arguments
            raise ArgumentError(
                f"{_FN}: rank {opts.group_rank} of world_size {opts.group_size} given; expected rank "
                f"{w.rank()} of {w.size()} (what MPI launched); leave rank and world_size out under mpiexec"
            )
        w.timeout = timeout
        group = w
        sleep_in_long_waits(w.size())  # oversubscribed: MPICH's waits sleep, as gloo's (c10d/waiting.py)
    else:
        group = groups.new_group(
            ranks, timeout=timeout, use_local_synchronization=True, group_desc=f"torch:{opts.group_id}"
        )
        if group.rank() != opts.group_rank:
            raise ArgumentError(
                f"new_group: torch says this is group rank {opts.group_rank} of {ranks}; MPI's group "
                f"gives {group.rank()}"
            )
    return MpicommProcessGroup(group, str(opts.group_id))


def _helper_locals() -> dict[str, Any]:
    """The locals of torch's ``_new_process_group_helper`` frame, the creator's caller ({} if not found).

    It alone keeps what the creator's options lose: the backend string of every device and whether
    the timeout is torch's default object or one the user passed.
    """
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name != "_new_process_group_helper":
        frame = frame.f_back  # type: ignore[assignment]
    return {} if frame is None else dict(frame.f_locals)


def _torch_default_timeout(helper: dict[str, Any], given: datetime.timedelta) -> bool:
    """Whether torch filled the timeout in itself (its default object, not one the user made)."""
    defaults = (_constants.default_pg_timeout, _constants.default_pg_nccl_timeout)
    if "timeout" in helper:
        return any(helper["timeout"] is d for d in defaults)
    return given == _constants.default_pg_timeout  # torch moved its helper: tell by value


def _refuse_mixed_devices(helper: dict[str, Any]) -> None:
    """Raise for a backend string that gives some device another backend (``"cpu:mpicomm,cuda:nccl"``).

    torch uses a Python-written group for every device and would drop the other backend silently;
    the string is read from torch's ``_new_process_group_helper`` frame, the only place it is kept.
    """
    config = helper.get("backend_config")
    if config is None:
        return
    devices = {str(d): str(b) for d, b in config.get_device_backend_map().items()}
    others = {d: b for d, b in devices.items() if b != NAME}
    if others:
        spec = ",".join(f"{d}:{b}" for d, b in devices.items())
        raise ArgumentError(
            f"{_FN}: backend {spec!r} gives {others} a backend other than mpicomm; expected 'mpicomm' "
            "for every device (e.g. 'mpicomm' or 'cpu:mpicomm,cuda:mpicomm'): torch runs a backend "
            "written in Python for all devices of its group, and would drop the other one silently"
        )


def _env_or_mpi(
    url: str, timeout: datetime.timedelta = dist.default_pg_timeout, **kwargs: Any
) -> Iterator[Any]:
    """``env://``: torch's own when MASTER_ADDR and MASTER_PORT are set, else the rendezvous over MPI."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return _State.torch_env(url, timeout=timeout, **kwargs)  # type: ignore[no-any-return]
    return _mpi_rendezvous(url, timeout=timeout, **kwargs)


def _mpi_rendezvous(
    url: str, timeout: datetime.timedelta = dist.default_pg_timeout, **kwargs: Any
) -> Iterator[Any]:
    """Rank and size from MPI (a given one is checked), and rank 0's TCPStore, its port sent over MPI."""
    w = groups.world(_FN)
    rank, size = w.rank(), w.size()
    check_launch(rank, size, _FN)
    query = dict(p.split("=", 1) for p in urlparse(url).query.split("&") if "=" in p)
    for key, actual in (("rank", rank), ("world_size", size)):
        given = int(query.get(key, "-1"))
        if given not in (-1, actual):
            raise ArgumentError(
                f"{_FN}: {key} is {given}; expected {actual} (what MPI launched) or nothing under mpiexec"
            )
    store = _tcp_store(w, options.clamped(timeout))
    yield store, rank, size
    raise RuntimeError(f"{_FN}: the MPI rendezvous cannot run again (re-rendezvous)")


def _tcp_store(w: groups.ProcessGroup, timeout: datetime.timedelta) -> TCPStore:
    """World rank 0 serves a TCPStore on a free port; the others connect (port and host by MPI_Bcast)."""
    me = socket.gethostname()
    words = np.zeros(1, dtype=np.int64)
    host = np.zeros(_HOST_BYTES, dtype=np.uint8)
    store = None
    if w.rank() == 0:
        try:
            store = TCPStore("0.0.0.0", 0, w.size(), True, timeout, wait_for_workers=False)
            words[0] = store.port
        except Exception:
            words[0] = -1  # the others must not wait for a store that will never come
            w.comm.Bcast(words, root=0)
            raise
        raw = me.encode()[:_HOST_BYTES]
        host[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    w.comm.Bcast(words, root=0)
    w.comm.Bcast(host, root=0)
    port = int(words[0])
    if port <= 0 or port > 65535:
        raise ArgumentError(f"{_FN}: rank 0 could not open the TCPStore (port {port}); see rank 0's error")
    if store is None:
        master = host.tobytes().rstrip(b"\0").decode(errors="replace")
        address = "127.0.0.1" if master == me else master
        store = TCPStore(address, port, w.size(), False, timeout, wait_for_workers=False)
    # every rank connected before any goes on: a rank that fails next (a refused backend string)
    # and exits must not take the server away from a rank still connecting
    barrier(w, False, None, timeout)
    return store
