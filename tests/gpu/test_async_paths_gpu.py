"""tests/mpi/test_gpu_async_paths.py on real cupy and a GPU: async direct and pipelined calls (issue 41).

The same test functions as on the fake cupy, with real cupy plus the shim of tests/gpu/test_paths_gpu.py
(``_fake.later``: an assignment queued on the current stream). ``pipelined`` forces the staged
pipeline (``MPICOMM_CUDA_AWARE=0``, 4 KiB chunks) on any MPI; ``direct`` runs only where the automatic
CUDA-awareness decision says direct (the window's CUDA Open MPI run; ``GPU_EXPECT_PATH`` makes a wrong
decision fail). The torch-like side-stream test reads the fake's memory directly: CPU only. Under
``PYTHONPATH=tests/fakecupy`` (make test-gpu-fake) this runs on the fake: CPU emulation, not GPU
verification.
"""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mpicomm.core import chunks, watchdog
from mpicomm.gpu import cuda_aware, staged

HERE = Path(__file__).resolve().parent


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_tests = _load(HERE.parent / "mpi" / "test_gpu_async_paths.py", "gpu_async_paths_on_gpu")
_paths = _load(HERE / "test_paths_gpu.py", "gpu_async_paths_shim")  # its real-cupy shim and path check

_CPU_ONLY = {"test_a_torch_like_tensor_written_on_its_side_stream_is_read_after_that_work"}


@pytest.fixture(scope="module")
def fake() -> Iterator[Any]:  # the name the imported tests ask for: here the real cupy
    from mpicomm.gpu.device import bind_device

    bind_device()
    yield _paths._real()


@pytest.fixture(params=["direct", "pipelined"])
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cp(fake: Any, monkeypatch: pytest.MonkeyPatch, path: str) -> Iterator[Any]:
    from fakecupy import testing

    if path == "direct":
        _paths._expected_path()
        cuda_aware.reset_cuda_awareness()
        monkeypatch.delenv("MPICOMM_CUDA_AWARE", raising=False)
        if cuda_aware.cuda_awareness().path != "direct":
            pytest.skip("the MPI is not CUDA-aware here: the direct path is checked in the direct run")
    testing.use_staged(monkeypatch, aware="1" if path == "direct" else "0")
    monkeypatch.setenv("MPICOMM_STAGING_CHUNK", "4K")
    chunks.reload()
    yield fake
    fake._fake.drain()
    watchdog.forget()
    gc.collect()
    staged.reap()
    assert staged.pool().stats().bytes_in_use == 0
    monkeypatch.delenv("MPICOMM_STAGING_CHUNK")
    chunks.reload()
    cuda_aware.reset_cuda_awareness()


for _name, _fn in vars(_tests).items():
    if _name.startswith("test_") and callable(_fn) and _name not in _CPU_ONLY:
        globals()[_name] = _fn
