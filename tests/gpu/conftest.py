"""GPU tests: marked ``gpu``, skipped with a clear reason where cupy or a CUDA device is missing.

With ``PYTHONPATH=tests/fakecupy`` they run on the numpy-backed fake cupy (CPU emulation: plumbing,
stream order and layouts, never GPU verification); the fake then gets Python stand-ins of the
suite's CUDA kernels.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def _gpu_missing() -> str | None:
    try:
        import cupy
    except ImportError:
        return "cupy is not installed (pip install mpicomm[cuda12] or [cuda13])"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device is visible"
    except Exception as exc:  # the CUDA runtime raises its own error types
        return f"the CUDA runtime is not usable: {exc}"
    if getattr(cupy, "IS_FAKE", False):
        cupy._fake.KERNELS["spin_then_fill"] = _spin_then_fill
    return None


def _spin_then_fill(out, value, cycles, n) -> None:  # the fake's stand-in of test_collectives_gpu.SPIN
    out[:n] = value


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _gpu_missing()
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def validation_off() -> Iterator[None]:
    """Validation mode off for one test, then as it was (tests/mpi's fixture, for its tests run here)."""
    import mpicomm

    mpicomm.init()
    saved = mpicomm.is_validation_enabled()
    mpicomm.set_validation(False)
    yield
    mpicomm.set_validation(saved)
