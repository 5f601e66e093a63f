"""The C baselines: the same MPI calls made from a tiny C loop, compiled with the MPI's own ``mpicc``.

The library is built once per process into a temporary folder and loaded with ctypes into the
process that runs the bench, so the C loop runs under the very MPI, thread level and communicator
of the Python calls it is compared with. Each function times ``iters`` back-to-back calls inside C
(no Python between them) and returns seconds per call on this rank:

* ``two_step``: ``MPI_Alltoall`` of int64 value counts, ``malloc`` of what arrives, then one
  ``MPI_Alltoallv`` of the values (bytes), ``free``: the raw form of ``jagged_all_to_all``;
* ``allreduce``: ``MPI_Allreduce`` in place on ``count`` floats.

:func:`load` returns None (and :data:`why` says why) where no ``mpicc`` is found or it fails; the
bench then compares with raw mpi4py only and says so.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

__all__ = ["load", "why"]

SOURCE = r"""
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>

double two_step(const char *send, const int64_t *counts, int iters) {
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int64_t *got = malloc(sizeof(int64_t) * n);
    int *sc = malloc(sizeof(int) * n), *sd = malloc(sizeof(int) * n);
    int *rc = malloc(sizeof(int) * n), *rd = malloc(sizeof(int) * n);
    for (int i = 0, d = 0; i < n; d += (int)counts[i], i++) { sc[i] = (int)counts[i]; sd[i] = d; }
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    for (int k = 0; k < iters; k++) {
        MPI_Alltoall(counts, 1, MPI_INT64_T, got, 1, MPI_INT64_T, MPI_COMM_WORLD);
        int total = 0;
        for (int i = 0; i < n; i++) { rc[i] = (int)got[i]; rd[i] = total; total += rc[i]; }
        char *recv = malloc(total ? total : 1);
        MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, MPI_COMM_WORLD);
        free(recv);
    }
    t = (MPI_Wtime() - t) / iters;
    free(got); free(sc); free(sd); free(rc); free(rd);
    return t;
}

double allreduce(float *buf, int count, int iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    for (int k = 0; k < iters; k++)
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return (MPI_Wtime() - t) / iters;
}
"""

#: Why the C loop is not available (empty once loaded).
why = "not built yet"
_lib: Any = None


def _mpicc() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "mpicc")
    return here if os.access(here, os.X_OK) else shutil.which("mpicc")


def load() -> Any:
    """The loaded C library (``two_step`` and ``allreduce``), or None where it cannot be built."""
    global _lib, why
    if _lib is not None or why != "not built yet":
        return _lib
    cc = _mpicc()
    if cc is None:
        why = "no mpicc next to python or on PATH: compared with raw mpi4py only"
        return None
    folder = tempfile.mkdtemp(prefix="mpicomm-cloop-")
    src, out = os.path.join(folder, "cloop.c"), os.path.join(folder, f"cloop{os.getpid()}.so")
    with open(src, "w") as f:
        f.write(SOURCE)
    try:
        subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", out], check=True, capture_output=True)
        lib = ctypes.CDLL(out)
    except (OSError, subprocess.CalledProcessError) as exc:
        why = f"{cc} failed: {exc}"
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lib.two_step.restype = lib.allreduce.restype = ctypes.c_double
    lib.two_step.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.allreduce.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    _lib, why = lib, ""
    return lib


def two_step(send: np.ndarray, counts_bytes: np.ndarray, iters: int) -> float:
    """Seconds per C two-step call (``send`` C-contiguous; ``counts_bytes`` int64, one per rank)."""
    counts = np.ascontiguousarray(counts_bytes, dtype=np.int64)
    return float(_lib.two_step(send.ctypes.data, counts.ctypes.data, iters))


def allreduce(buf: np.ndarray, iters: int) -> float:
    """Seconds per C ``MPI_Allreduce`` in place on the float32 array ``buf``."""
    return float(_lib.allreduce(buf.ctypes.data, buf.size, iters))
