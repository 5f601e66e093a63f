"""What the multi-rank tests on the fake cupy share: activation, a poisoning pool, inputs, a world view."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from . import fixture

SEED = 2024

#: The byte every staging buffer is filled with when lent (item 5(c) of issue 24): bytes MPI did
#: not write show up as this pattern.
POISON = 0x5A


def activate() -> Iterator[Any]:
    """A module fixture's body: the fake cupy for the module's tests."""
    yield from fixture()


def poisoning_pool() -> Any:
    """A pinned pool that fills every buffer it lends with :data:`POISON`."""
    from mpicomm.gpu.backend import backend
    from mpicomm.gpu.staging import HostBufferPool

    class PoisonPool(HostBufferPool):
        def acquire(self, nbytes: int) -> np.ndarray:
            buf = super().acquire(nbytes)
            buf.fill(POISON)
            return buf

    return PoisonPool(lambda nbytes: backend().pinned(nbytes))


def use_staged(monkeypatch: Any, aware: str = "0") -> None:
    """Fresh state for one test: the CUDA-awareness mode, a poisoning pool, path counters cleared."""
    from mpicomm.front import device as front
    from mpicomm.gpu import cuda_aware, staged

    monkeypatch.setenv("MPICOMM_CUDA_AWARE", aware)
    cuda_aware.reset_cuda_awareness()
    staged.reset_pool()
    staged._Pool.value = poisoning_pool()
    front.PATHS.clear()


def staged_fake(fake: Any, monkeypatch: Any, aware: str = "0") -> Iterator[Any]:
    """A fixture's body: ``fake`` (the module's fake cupy) for one test, set up by :func:`use_staged`.

    After the test the fake's streams are drained and every staging buffer must be back in the pool.
    The watchdog forgets the frames it last sampled and cycles are collected first: either would keep
    a dropped Work, and so its buffers, alive past the test without any leak in mpicomm. That
    collection walks only what the test made: tests/conftest.py freezes the rest before each test.
    """
    import gc

    from mpicomm.core import watchdog
    from mpicomm.gpu import staged

    use_staged(monkeypatch, aware)
    yield fake
    fake._fake.drain()
    watchdog.forget()
    gc.collect()
    staged.reap()
    assert staged.pool().stats().bytes_in_use == 0, "a staged call kept buffers"


def chunk_size(monkeypatch: Any, value: str) -> Iterator[None]:
    """A fixture's body: ``MPICOMM_STAGING_CHUNK=value`` for one test (read again now and after)."""
    from mpicomm.core import chunks

    monkeypatch.setenv("MPICOMM_STAGING_CHUNK", value)
    chunks.reload()
    yield
    monkeypatch.delenv("MPICOMM_STAGING_CHUNK")
    chunks.reload()


def world() -> tuple[int, int]:
    import mpicomm

    return mpicomm.get_rank(), mpicomm.get_world_size()


def inputs(n: int, count: int, dtype: Any = "float64") -> np.ndarray:
    """Every rank's input, the same on every rank: row r is rank r's (small integers, exact sums)."""
    rng = np.random.default_rng(SEED)
    return rng.integers(-50, 50, size=(n, count)).astype(dtype)
