"""``python -m mpicomm info``: the versions and MPI features this installation runs with.

Run it where jobs run (``mpirun -n 2 python -m mpicomm info``) to see which MPI library mpi4py
loaded, whether it has MPI-4 large counts, which thread level MPI granted, whether the fast paths'
C calls are in use (:mod:`mpicomm.core.cmpi`), which launcher the Slurm
scripts would start it with and why, whether it takes CUDA device
buffers (and why mpicomm thinks so), cupy and the visible GPUs; only rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import __version__, _mpi
from ..core import algorithms, buffers, cmpi, pieces
from ..core.groups import get_rank, get_world_size, init
from ..errors import MpicommError
from ..gpu import cuda_aware, staging
from ..planner.launcher import choose_launcher

__all__ = ["collect", "main"]


def collect() -> list[tuple[str, str]]:
    """Gather the report as ``(name, value)`` pairs, starting MPI if it is not running.

    Returns:
        The lines of the report in order: package versions, the MPI library and what it supports,
        then the GPU lines.

    Example:
        >>> from mpicomm.apps.info import collect
        >>> int(dict(collect())["world size"]) >= 1
        True
    """
    init()
    return _package_lines() + _mpi_lines() + [_launcher_line()] + _gpu_lines()


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
        (
            "thread level",
            f"{names.get(level, str(level))}, chosen by {_mpi._Start.chosen_by}; "
            f"{_mpi.THREAD_ENV} picks another",
        ),
        ("C calls", "in use (mpicomm.core.cmpi)" if cmpi.bound() is None else f"off: {cmpi.bound()}"),
        (
            "MPICH p2p switch",
            "allreduce/bcast from "
            f"{algorithms.threshold()} B (mpicomm.core.algorithms; MPICOMM_MPICH_P2P_FROM)"
            if algorithms.installed()
            else "off (not MPICH, multiple, MPICOMM_MPICH_P2P_FROM=0, or set by you)",
        ),
        (
            "all_reduce pieces",
            f"over {pieces.piece_bytes()} B (mpicomm.core.pieces; MPICOMM_ALLREDUCE_PIECE)"
            if pieces.piece_bytes()
            else "off (MPICOMM_ALLREDUCE_PIECE=0)",
        ),
    ]


def _launcher_line() -> tuple[str, str]:
    """What a batch script from ``python -m mpicomm plan`` would start this MPI library with, and why."""
    try:
        choice = choose_launcher(str(_mpi.MPI.Get_library_version()))  # every line: the wheel's is the last
    except MpicommError as exc:
        return ("Slurm launcher", f"error: {exc}")
    return ("Slurm launcher", choice.describe())


def _gpu_lines() -> list[tuple[str, str]]:
    """GPU support: the CUDA-awareness decision, cupy, the visible devices and the staging chunk size."""
    raw = os.environ.get(cuda_aware.ENV_VAR, "")
    mode = f"{cuda_aware.ENV_VAR}={raw}" if raw.strip() else f"{cuda_aware.ENV_VAR} unset, so auto"
    try:
        decision = cuda_aware.cuda_awareness()
    except MpicommError as exc:
        aware, path = f"error: {exc}", "unknown (see the line above)"
    else:
        aware = f"{'yes' if decision.aware else 'no'} ({decision.reason})"
        how = (
            "device buffers go to MPI as they are"
            if decision.aware
            else "device data goes through host buffers"
        )
        path = f"{decision.path}: {how} ({mode})"
    cupy_line, devices = _cupy_lines()
    try:
        size = staging.chunk_bytes()
    except MpicommError as exc:
        chunk = f"error: {exc}"
    else:
        shown = os.environ.get(staging.CHUNK_ENV_VAR, "").strip()
        origin = (
            f"{staging.CHUNK_ENV_VAR}={shown}" if shown else f"{staging.CHUNK_ENV_VAR} unset, so the default"
        )
        chunk = f"{_format_bytes(size)}, {origin}"
    return [
        ("CUDA-aware MPI", aware),
        ("GPU data path", path),
        ("cupy", cupy_line),
        ("CUDA devices", devices),
        ("staging chunk", chunk),
    ]


def _cupy_lines() -> tuple[str, str]:
    """The version of cupy and the visible device count, or why they are not known."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if visible is None else repr(visible)
    try:
        import cupy
    except ImportError:
        return "not installed (pip install mpicomm[cuda12] or [cuda13])", (
            f"unknown without cupy (CUDA_VISIBLE_DEVICES is {shown})"
        )
    except Exception as exc:  # a broken CUDA installation can fail the import in many ways
        return f"import failed: {type(exc).__name__}: {exc}", "unknown (cupy does not import)"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # cupy's CUDARuntimeError where there is no driver or device
        return str(cupy.__version__), f"none usable ({exc}; CUDA_VISIBLE_DEVICES is {shown})"
    return str(cupy.__version__), f"{count} visible (CUDA_VISIBLE_DEVICES is {shown})"


def _format_bytes(n: int) -> str:
    """``4 MiB (4194304 bytes)`` for whole binary units, else ``1000 bytes``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % size == 0:
            return f"{n // size} {unit} = {n} bytes"
    return f"{n} bytes"


def _mpi4py_version() -> str:
    try:
        import mpi4py
    except ImportError:
        return "not installed"
    return str(mpi4py.__version__)


def _abi_variant() -> str:
    """Which of the ABI-portable wheel's extensions mpi4py imported: ``mpich`` or ``openmpi``."""
    parts = Path(str(_mpi.MPI.__file__)).name.split(".")
    return parts[1] if len(parts) == 4 else "none (mpi4py built against one MPI)"


def _loaded_libmpi() -> str:
    """The paths of the libmpi this process mapped, read from ``/proc/self/maps`` (Linux only)."""
    return ", ".join(cuda_aware.loaded_libmpi_paths()) or "unknown (no /proc/self/maps or no libmpi mapped)"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report on rank 0 and return 0; without a loadable MPI, print why and return 1.

    Args:
        argv: The options after ``info`` (only ``--help``); ``None`` for none.

    Returns:
        The exit status.

    Example:
        >>> from mpicomm.apps.info import main
        >>> main()  # doctest: +ELLIPSIS
        mpicomm: ...
        0
    """
    argparse.ArgumentParser(
        prog="python -m mpicomm info",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1] if __doc__ else None,
        epilog="Without a loadable MPI library it prints why and what to do, and exits 1.",
    ).parse_args([] if argv is None else list(argv))
    problem = _mpi.diagnose()
    if problem is not None:
        print(f"mpicomm:  {__version__}")
        print(f"python:   {platform.python_version()} ({sys.executable})")
        print(f"numpy:    {np.__version__}")
        print(f"mpi4py:   {_mpi4py_version()}")
        print(f"MPI:      not available\n\n{problem}", flush=True)
        return 1
    lines = collect()
    if get_rank() == 0:
        width = max(len(name) for name, _ in lines)
        for name, value in lines:
            print(f"{name + ':':<{width + 1}}  {value}")
        sys.stdout.flush()
    return 0
