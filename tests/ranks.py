"""What multi-rank tests start from: this rank and the world size, and every rank's input from one seed."""

from __future__ import annotations

import numpy as np

import mpicomm


def rank_size() -> tuple[int, int]:
    """This rank and the world size (MPI is initialised on first use)."""
    mpicomm.init()
    return mpicomm.get_rank(), mpicomm.get_world_size()


def exact_inputs(seed: int, w: int, n: int) -> np.ndarray:
    """Every rank's float32 input, shape (w, n), the same on every rank: small integers, so sums are exact."""
    return np.random.default_rng(seed).integers(0, 5, (w, n)).astype(np.float32)
