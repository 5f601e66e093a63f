"""``python -m mpicomm info``: the versions and MPI features this installation runs with.

Run it where jobs run (``mpirun -n 2 python -m mpicomm info``) to see which MPI library mpi4py
loaded, whether it has MPI-4 large counts and which thread level MPI granted; only rank 0 prints.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import numpy as np

from . import __version__, _mpi, buffers
from .comm import get_rank, get_world_size, init

__all__ = ["collect", "main"]


def collect() -> list[tuple[str, str]]:
    """Gather the report as ``(name, value)`` pairs, starting MPI if it is not running.

    Returns:
        The lines of the report in order: package versions, the MPI library and what it supports,
        then the GPU lines.

    Example:
        >>> from mpicomm.info import collect
        >>> int(dict(collect())["world size"]) >= 1
        True
    """
    init()
    return _package_lines() + _mpi_lines() + _gpu_lines()


def _package_lines() -> list[tuple[str, str]]:
    import mpi4py

    return [
        ("mpicomm", __version__),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy", np.__version__),
        ("mpi4py", f"{mpi4py.__version__} (ABI variant: {_abi_variant()})"),
    ]


def _mpi_lines() -> list[tuple[str, str]]:
    MPI = _mpi.MPI
    major, minor = MPI.Get_version()
    if buffers.large_counts():
        large = "yes (MPI-4 large-count calls: counts above 2**31 - 1 work)"
    else:
        large = "no (a count above 2**31 - 1 fails; see the docs' sharp bits)"
    level = MPI.Query_thread()
    names = {
        getattr(MPI, f"THREAD_{n}"): f"MPI_THREAD_{n}"
        for n in ("SINGLE", "FUNNELED", "SERIALIZED", "MULTIPLE")
    }
    return [
        ("MPI library", " ".join(_mpi.library_version().split())),
        ("libmpi loaded", _loaded_libmpi()),
        ("MPI standard", f"{major}.{minor}"),
        ("large counts", large),
        ("world size", str(get_world_size())),
        ("thread level", names.get(level, str(level))),
    ]


def _gpu_lines() -> list[tuple[str, str]]:
    """GPU support: cupy and CUDA-aware MPI. None yet; the GPU work adds its lines here."""
    return []


def _abi_variant() -> str:
    """Which of the ABI-portable wheel's extensions mpi4py imported: ``mpich`` or ``openmpi``."""
    parts = Path(str(_mpi.MPI.__file__)).name.split(".")
    return parts[1] if len(parts) == 4 else "none (mpi4py built against one MPI)"


def _loaded_libmpi() -> str:
    """The path of the libmpi this process mapped, read from ``/proc/self/maps`` (Linux only)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown (no /proc/self/maps)"
    paths = {line.split()[-1] for line in maps.splitlines() if "/libmpi" in line}
    return ", ".join(sorted(paths)) or "unknown"


def main() -> int:
    """Print the report on rank 0 and return 0.

    Example:
        >>> from mpicomm.info import main
        >>> main()  # doctest: +ELLIPSIS
        mpicomm: ...
        0
    """
    lines = collect()
    if get_rank() == 0:
        width = max(len(name) for name, _ in lines)
        for name, value in lines:
            print(f"{name + ':':<{width + 1}}  {value}")
        sys.stdout.flush()
    return 0
