"""What multi-rank tests start from: this rank and the world size, and every rank's input from one seed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpicomm


def rank_size() -> tuple[int, int]:
    """This rank and the world size (MPI is initialised on first use)."""
    mpicomm.init()
    return mpicomm.get_rank(), mpicomm.get_world_size()


def exact_inputs(seed: int, w: int, n: int) -> np.ndarray:
    """Every rank's float32 input, shape (w, n), the same on every rank: small integers, so sums are exact."""
    return np.random.default_rng(seed).integers(0, 5, (w, n)).astype(np.float32)


def in_threads(*targets: Callable[[], None], names: tuple[str, ...] = (), timeout: float = 60) -> None:
    """Run the targets at once, each on a thread of its own (named from ``names``), and join them.

    Fails the test with what any target raised, or when a thread is still running after ``timeout``.
    """
    errors: list[BaseException] = []

    def run(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(target,), name=names[i] if i < len(names) else None)
        for i, target in enumerate(targets)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=timeout)
    assert not errors, errors
    assert not any(th.is_alive() for th in threads), "a thread hung"


def full_numpy(value: float) -> Any:
    """Three float64s of ``value``, numpy: the C door's case in the thread tests."""
    return np.full(3, value)


def full_torch(value: float) -> Any:
    """Three float64s of ``value``, a torch CPU tensor: the Python wrapper's case (skips without torch)."""
    torch = pytest.importorskip("torch")
    return torch.full((3,), value, dtype=torch.float64)


def as_numpy(x: Any) -> np.ndarray:
    """A numpy view of what :func:`full_numpy` or :func:`full_torch` made."""
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)
