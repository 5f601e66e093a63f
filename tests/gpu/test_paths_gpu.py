"""The CPU checks of issue 24 (tests/mpi/test_gpu_*.py), run again on real cupy and a real GPU.

The tests are the very functions that run on the fake cupy in the CPU suite, imported here with a
``cp`` fixture that gives the real cupy plus the little the fake adds (``_fake.later`` queues a
device assignment on the current stream; ``_fake.drain`` synchronises the device). So on a GPU they
check float16/bfloat16 pipelines, every layout, subgroups and non-members, short receives, rooted
roles, a failing chunk, failed and dropped asynchronous work, batches and aliasing, with poisoned
staging buffers and ``MPICOMM_STAGING_CHUNK=4K``. The direct-path tests run where the CUDA-awareness
decision (made once, automatically) says direct; ``GPU_EXPECT_PATH`` (set by scripts/gpu-window.sh)
makes a wrong decision a failure. Tests that read the fake's own bookkeeping (pending work, pinned
byte counts) stay CPU-only.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpicomm.core import chunks, watchdog
from mpicomm.gpu import cuda_aware, staged

HERE = Path(__file__).resolve().parent


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", HERE.parent / "mpi" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_staged_tests = _load("test_gpu_fakecupy")
_direct_tests = _load("test_gpu_direct")
_batch_tests = _load("test_gpu_batch")
_mixed_tests = _load("test_gpu_mixed_kinds")  # issue 35: host and device ranks in one call, every size
_async_tests = _load("test_gpu_async_mixed")  # issues 34/35: ranks differing in async_op and kind

_CPU_ONLY = {
    "test_async_upload_does_not_wait_for_kernels_queued_after_the_call",  # reads the fake's queue
    "test_pinned_memory_stays_under_the_pool_cap_and_is_freed",  # reads the fake's byte counts
    "test_the_direct_path_asks_only_the_backend_protocol",  # the lazy stand-in, host memory only
}


class _Shim:
    """What the tests ask of the fake beyond cupy's API, done with cupy."""

    POISON = 0xA5

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy

    def later(self, d: Any, values: np.ndarray) -> None:
        d[...] = self.cupy.asarray(np.asarray(values, dtype=d.dtype))  # a kernel on the current stream

    def drain(self) -> None:
        self.cupy.cuda.Device().synchronize()


def _real() -> Any:
    import cupy

    proxy = types.ModuleType("cupy_with_shim")
    proxy.__dict__.update({k: v for k, v in vars(cupy).items() if not k.startswith("__")})
    proxy._fake = _Shim(cupy)
    return proxy


def _expected_path() -> None:
    want = os.environ.get("GPU_EXPECT_PATH", "")
    if want:
        cuda_aware.reset_cuda_awareness()
        saved = os.environ.pop("MPICOMM_CUDA_AWARE", None)
        try:
            assert cuda_aware.cuda_awareness().path == want, cuda_aware.cuda_awareness()
        finally:
            if saved is not None:
                os.environ["MPICOMM_CUDA_AWARE"] = saved
            cuda_aware.reset_cuda_awareness()


@pytest.fixture(scope="module")
def fake() -> Iterator[Any]:  # the name the imported fixtures ask for: here the real cupy
    from mpicomm.gpu.device import bind_device

    bind_device()
    yield _real()


@pytest.fixture
def cp(fake: Any, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Any]:
    from fakecupy import testing

    dtype = getattr(getattr(request.node, "callspec", None), "params", {}).get("dtype")
    if dtype is not None:
        try:
            fake.zeros(1, dtype=dtype)
        except Exception as exc:  # cupy has no bfloat16 arrays before it supports ml_dtypes' type
            pytest.skip(f"cupy {fake.__version__} makes no {np.dtype(dtype)} arrays: {exc}")
    direct = request.node.module is _direct_tests or request.function.__module__ == _direct_tests.__name__
    if direct:
        _expected_path()
        cuda_aware.reset_cuda_awareness()
        monkeypatch.delenv("MPICOMM_CUDA_AWARE", raising=False)
        if cuda_aware.cuda_awareness().path != "direct":
            pytest.skip("the MPI is not CUDA-aware here: the direct path is checked in the direct run")
        testing.use_staged(monkeypatch, aware="1")
    else:
        testing.use_staged(monkeypatch)
    yield fake
    fake._fake.drain()
    watchdog.forget()  # the frames it last saw would keep a dropped Work alive until its next sample
    gc.collect()
    staged.reap()
    assert staged.pool().stats().bytes_in_use == 0
    cuda_aware.reset_cuda_awareness()


@pytest.fixture
def chunk4k(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("MPICOMM_STAGING_CHUNK", "4K")
    chunks.reload()  # the calls read the setting once (mpicomm.core.chunks)
    yield
    monkeypatch.delenv("MPICOMM_STAGING_CHUNK")
    chunks.reload()


def test_the_cuda_awareness_decision_is_the_expected_one() -> None:
    """In the window, auto must choose staged under the mpich wheel and direct under the CUDA Open MPI."""
    if not os.environ.get("GPU_EXPECT_PATH"):
        pytest.skip("GPU_EXPECT_PATH is unset (scripts/gpu-window.sh sets it)")
    _expected_path()


for _module in (_staged_tests, _direct_tests, _batch_tests, _mixed_tests, _async_tests):
    for _name, _fn in vars(_module).items():
        if _name.startswith("test_") and callable(_fn) and _name not in _CPU_ONLY:
            globals()[_name] = _fn
