"""Binding ranks to GPUs: each rank takes device ``local_rank % visible devices`` on its node.

The node-local rank comes from MPI (``COMM_TYPE_SHARED`` split of the world group), which is right under
every launcher; the launchers' own variables (``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``,
``SLURM_LOCALID``) are read too, and a disagreement is reported. Device indices count the devices that
``CUDA_VISIBLE_DEVICES`` leaves visible, as CUDA itself does, so a Slurm job that gives each task its own
GPU (``--gpus-per-task=1``) binds every rank to its index 0.

cupy is imported only inside :func:`bind_device`, and only to count devices and make the chosen one
current; without cupy the index is still computed, for use with another CUDA library.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _mpi
from ..core import watchdog
from ..core.groups import init
from ..errors import ArgumentError, ArgumentTypeError

__all__ = [
    "LOCAL_RANK_VARS",
    "bind_device",
    "env_local_rank",
    "local_rank",
    "physical_device",
    "reset_local_rank",
    "select_device",
    "visible_devices",
]

#: The launchers' node-local rank variables, in the order they are trusted. Launcher-specific ones come
#: first: ``SLURM_LOCALID`` is inherited unchanged by every rank when ``mpirun`` runs inside an
#: ``sbatch`` script, while the launcher's own variable is set per rank.
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")

_DEVICES = ("cuda", "cpu")
_UUID = re.compile(r"(GPU|MIG)-\S+")


class _Cache:
    local_rank: int | None = None


def env_local_rank(env: Mapping[str, str]) -> tuple[str, int] | None:
    """The node-local rank the launcher announced, from the first of :data:`LOCAL_RANK_VARS` that is set.

    Args:
        env: The environment, e.g. ``os.environ``.

    Returns:
        ``(variable, value)``, or ``None`` when none of the variables is set (or all are empty).

    Raises:
        ArgumentError: the variable holds something other than a non-negative integer.

    Example:
        >>> from mpicomm.gpu.device import env_local_rank
        >>> env_local_rank({"SLURM_LOCALID": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "3"})
        ('OMPI_COMM_WORLD_LOCAL_RANK', 3)
        >>> env_local_rank({}) is None
        True
    """
    for var in LOCAL_RANK_VARS:
        raw = env.get(var, "").strip()
        if not raw:
            continue
        if not raw.isdigit():
            raise ArgumentError(
                f"local_rank: environment variable {var} is {raw!r}; expected a non-negative integer "
                "(the launcher sets it; unset it if something else did)"
            )
        return var, int(raw)
    return None


@watchdog.timed(watchdog.Site("local_rank"), None)
def local_rank() -> int:
    """This process's rank among the world group's processes on its node (MPI ``COMM_TYPE_SHARED``).

    The world group is the one :func:`mpicomm.init` makes (``COMM_WORLD`` unless you chose another
    communicator). The first call is collective over it: every member must make it; later calls return
    the kept value. Starts MPI if it is not running. Where a launcher variable (:data:`LOCAL_RANK_VARS`)
    disagrees with MPI, MPI's answer is used and a ``RuntimeWarning`` says so.

    Returns:
        The node-local rank, from 0.

    Raises:
        ArgumentError: a launcher variable holds something other than a non-negative integer.

    Example:
        >>> from mpicomm.gpu.device import local_rank
        >>> local_rank() >= 0
        True
    """
    if _Cache.local_rank is None:
        announced = env_local_rank(os.environ)
        world = init()
        # split mpicomm's own duplicate of the world, never the user's communicator
        node = world.comm.Split_type(_mpi.MPI.COMM_TYPE_SHARED, key=world.rank())
        try:
            rank, size = int(node.Get_rank()), int(node.Get_size())
        finally:
            node.Free()
        # the launcher numbers all of COMM_WORLD; compare only when the world group is all of it.
        # srun numbers a node's tasks in world-rank order, as the split does: it must agree exactly;
        # mpirun/mpiexec use their own order (Open MPI 5 gave world ranks 0, 1, 2 the local ranks
        # 0, 2, 1), so theirs need only lie on this node.
        spans_world = world.size() == _mpi.MPI.COMM_WORLD.Get_size()
        wrong = announced is not None and (
            announced[1] != rank if announced[0] == "SLURM_LOCALID" else announced[1] >= size
        )
        if announced is not None and spans_world and wrong:
            warnings.warn(
                f"local_rank: {announced[0]}={announced[1]} but this process is node-local rank {rank} "
                "in MPI's shared-memory split; using MPI's value",
                RuntimeWarning,
                stacklevel=2,
            )
        _Cache.local_rank = rank
    return _Cache.local_rank


def reset_local_rank() -> None:
    """Forget the kept node-local rank, so that the next :func:`local_rank` asks MPI again (for tests).

    Example:
        >>> from mpicomm.gpu.device import reset_local_rank
        >>> reset_local_rank()
    """
    _Cache.local_rank = None


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` that CUDA honours, in order.

    CUDA reads the list up to its first invalid entry: an entry is a device index (``2``) or a UUID
    (``GPU-8932f937-...``, ``MIG-...``, also shortened). So ``"0,1,-1,2"`` shows devices 0 and 1, and
    an empty string (or Slurm's ``NoDevFiles``) shows none.

    Args:
        env: The environment, e.g. ``os.environ``.

    Returns:
        The honoured entries, or ``None`` when the variable is unset (every device is visible).

    Example:
        >>> from mpicomm.gpu.device import visible_devices
        >>> visible_devices({"CUDA_VISIBLE_DEVICES": "2, 3,-1,0"})
        ['2', '3']
        >>> visible_devices({"CUDA_VISIBLE_DEVICES": ""})
        []
        >>> visible_devices({}) is None
        True
    """
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    honoured = []
    for entry in raw.split(","):
        entry = entry.strip()
        if not (entry.isdigit() or _UUID.fullmatch(entry)):
            break
        honoured.append(entry)
    return honoured


def physical_device(index: int, env: Mapping[str, str]) -> str:
    """What device ``index`` (counted among the visible devices) is on the machine, for messages and logs.

    Args:
        index: A device index as CUDA counts it in this process.
        env: The environment holding ``CUDA_VISIBLE_DEVICES``.

    Returns:
        The ``CUDA_VISIBLE_DEVICES`` entry (an index or a UUID), or ``str(index)`` when it is unset or
        shorter.

    Example:
        >>> from mpicomm.gpu.device import physical_device
        >>> physical_device(1, {"CUDA_VISIBLE_DEVICES": "4,6"}), physical_device(1, {})
        ('6', '1')
    """
    visible = visible_devices(env)
    return visible[index] if visible is not None and 0 <= index < len(visible) else str(index)


def select_device(local_rank: int, device_count: int) -> int:
    """The device a rank takes: ``local_rank % device_count`` (ranks share devices when there are more).

    Args:
        local_rank: The rank's node-local rank.
        device_count: How many devices the process sees.

    Returns:
        The device index, counted among the visible devices.

    Raises:
        ArgumentTypeError: an argument is not an int.
        ArgumentError: ``local_rank`` is negative or ``device_count`` is below 1.

    Example:
        >>> from mpicomm.gpu.device import select_device
        >>> [select_device(r, 4) for r in range(6)]
        [0, 1, 2, 3, 0, 1]
    """
    _check_int(local_rank, "select_device", "local_rank", 0)
    _check_int(device_count, "select_device", "device_count", 1)
    return int(local_rank) % int(device_count)


def bind_device(
    device: str = "cuda",
    *,
    local_rank: int | None = None,
    device_count: int | None = None,
    env: Mapping[str, str] | None = None,
) -> int | None:
    """Pick this rank's GPU by its node-local rank and, with cupy installed, make it cupy's current device.

    Call it once at start-up, before any cupy array exists, and best before MPI starts: where the
    launcher announces the node-local rank (:data:`LOCAL_RANK_VARS`) and MPI is not running yet, the
    GPU is chosen from it without starting MPI, so that MPIs which set up CUDA in ``MPI_Init``
    (MVAPICH2-GDR, Cray MPICH) find the right device current. Otherwise (MPI already running, or no
    launcher variable) it is collective over the world group (see :func:`local_rank`).

    Args:
        device: ``"cuda"`` to bind a GPU; ``"cpu"`` does nothing and returns ``None``, so that programs
            can pass their ``--device`` option straight through.
        local_rank: The node-local rank; ``None`` asks MPI (:func:`local_rank`).
        device_count: How many devices this process sees; ``None`` asks cupy, or counts the entries of
            ``CUDA_VISIBLE_DEVICES`` where cupy is not installed.
        env: The environment holding ``CUDA_VISIBLE_DEVICES``; ``None`` for ``os.environ``.

    Returns:
        The device index (among the visible devices), or ``None`` for ``device="cpu"``.

    Raises:
        ArgumentTypeError: an argument has the wrong type.
        ArgumentError: ``device`` is not ``"cuda"`` or ``"cpu"``; no device is visible; or the devices
            cannot be counted (no cupy, no ``CUDA_VISIBLE_DEVICES`` and no ``device_count``).

    Example:
        >>> from mpicomm.gpu.device import bind_device
        >>> bind_device("cpu") is None
        True
        >>> bind_device("cpu", local_rank=5) is None   # "cuda" would pick select_device(5, count)
        True
    """
    fn = "bind_device"
    if not isinstance(device, str):
        raise ArgumentTypeError(f"{fn}: device is a {type(device).__name__}; expected 'cuda' or 'cpu'")
    if device not in _DEVICES:
        raise ArgumentError(f"{fn}: device is {device!r}; expected 'cuda' or 'cpu'")
    if local_rank is not None:
        _check_int(local_rank, fn, "local_rank", 0)
    if device_count is not None:
        _check_int(device_count, fn, "device_count", 0)
    if device == "cpu":
        return None
    env = os.environ if env is None else env
    cupy = _import_cupy()
    count = _count_devices(fn, device_count, cupy, env)
    if count == 0:
        shown = env.get("CUDA_VISIBLE_DEVICES")
        where = "unset" if shown is None else repr(shown)
        raise ArgumentError(
            f"{fn}: device is 'cuda' but no CUDA device is visible (CUDA_VISIBLE_DEVICES is {where}); "
            "expected at least one (ask Slurm for GPUs with --gpus-per-task or --gres=gpu:N, "
            "or pass device='cpu')"
        )
    index = select_device(_local_rank() if local_rank is None else local_rank, count)
    if cupy is not None:
        cupy.cuda.Device(index).use()
    return index


def _local_rank() -> int:
    """The node-local rank for :func:`bind_device`, without starting MPI where the launcher told it.

    MVAPICH2-GDR and Cray MPICH set up their CUDA state in ``MPI_Init``, on the device current then:
    so before MPI runs, the launcher's variable chooses the GPU, and MPI is started later, on it.
    """
    module = sys.modules.get("mpi4py.MPI")
    if module is None or not module.Is_initialized():
        announced = env_local_rank(os.environ)
        if announced is not None:
            return announced[1]
    return local_rank()


def _count_devices(fn: str, given: int | None, cupy: Any, env: Mapping[str, str]) -> int:
    """The visible device count: given, else cupy's, else the length of ``CUDA_VISIBLE_DEVICES``."""
    if given is not None:
        return int(given)
    if cupy is not None:
        try:
            return int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:  # cupy raises its own CUDARuntimeError when there is no driver or device
            if visible_devices(env) == []:
                return 0  # CUDA_VISIBLE_DEVICES hides every device: say that, not the runtime's error
            raise ArgumentError(
                f"{fn}: device is 'cuda' but the CUDA runtime cannot count devices ({exc}); expected a "
                "working CUDA driver and device"
            ) from exc
    visible = visible_devices(env)
    if visible is None:
        raise ArgumentError(
            f"{fn}: device is 'cuda' but cupy is not installed and CUDA_VISIBLE_DEVICES is unset, so the "
            "devices cannot be counted; expected cupy (pip install mpicomm[cuda12]) or device_count="
        )
    return len(visible)


def _import_cupy() -> Any:
    """cupy, or ``None`` where it is not installed."""
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _check_int(value: object, fn: str, arg: str, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{fn}: {arg} is a {type(value).__name__}; expected an int")
    if value < least:
        raise ArgumentError(f"{fn}: {arg} is {value}; expected {least} or more")
