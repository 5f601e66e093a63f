"""``python -m mpicomm info``: the GPU lines (CUDA-awareness and why, cupy, devices, staging chunk).

Each run is a fresh interpreter outside any launcher, since the decision is kept per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpicomm.gpu.cuda_aware import decide, gather_mpi_facts

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
GPU_LINES = ("CUDA-aware MPI", "GPU data path", "cupy", "CUDA devices", "staging chunk")


def info(env: dict[str, str] | None = None) -> dict[str, str]:
    """Run ``python -m mpicomm info`` with ``env`` added to a launcher-free environment; its lines by name."""
    drop = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIEXEC_", "MPICOMM_", "CUDA_VISIBLE_DEVICES", "MPIR_CVAR_")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    clean["OMP_NUM_THREADS"] = "1"
    clean.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "mpicomm", "info"],
        capture_output=True,
        text=True,
        env=clean,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    lines = dict(line.split(":", 1) for line in proc.stdout.splitlines())
    return {name: value.strip() for name, value in lines.items()}


def _cupy_installed() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


def test_info_prints_the_gpu_lines_after_the_mpi_lines() -> None:
    got = info()
    names = list(got)
    assert names[-len(GPU_LINES) :] == list(GPU_LINES)
    assert names.index("thread level") < names.index("CUDA-aware MPI")


def test_info_reports_the_auto_decision_with_its_reason() -> None:
    got = info()
    # the same decision, made here from this interpreter's MPI library (the child loads the same one)
    expected = decide({}, gather_mpi_facts())
    assert got["CUDA-aware MPI"] == f"{'yes' if expected.aware else 'no'} ({expected.reason})"
    assert got["GPU data path"].startswith(f"{expected.path}: ")
    assert got["GPU data path"].endswith("(MPICOMM_CUDA_AWARE unset, so auto)")


@pytest.mark.parametrize(("value", "aware", "path"), [("0", "no", "staged"), ("1", "yes", "direct")])
def test_info_follows_the_override(value: str, aware: str, path: str) -> None:
    got = info({"MPICOMM_CUDA_AWARE": value})
    assert got["CUDA-aware MPI"] == f"{aware} (MPICOMM_CUDA_AWARE={value})"
    assert got["GPU data path"].startswith(f"{path}: ")
    assert got["GPU data path"].endswith(f"(MPICOMM_CUDA_AWARE={value})")


def test_info_reports_bad_values_instead_of_failing() -> None:
    got = info({"MPICOMM_CUDA_AWARE": "perhaps", "MPICOMM_STAGING_CHUNK": "lots"})
    assert got["CUDA-aware MPI"].startswith(
        "error: cuda_awareness: environment variable MPICOMM_CUDA_AWARE is"
    )
    assert "'perhaps'" in got["CUDA-aware MPI"]
    assert got["GPU data path"] == "unknown (see the line above)"
    assert got["staging chunk"].startswith(
        "error: chunk_bytes: environment variable MPICOMM_STAGING_CHUNK is 'lots'"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "4 MiB = 4194304 bytes, MPICOMM_STAGING_CHUNK unset, so the default"),
        ("512K", "512 KiB = 524288 bytes, MPICOMM_STAGING_CHUNK=512K"),
        ("1000", "1000 bytes, MPICOMM_STAGING_CHUNK=1000"),
        ("2G", None),
    ],
)
def test_info_shows_the_staging_chunk(value: str | None, shown: str | None) -> None:
    got = info({} if value is None else {"MPICOMM_STAGING_CHUNK": value})
    if shown is None:
        assert (
            got["staging chunk"].startswith("error: ")
            and "expected 1 to 2147483647 bytes" in got["staging chunk"]
        )
    else:
        assert got["staging chunk"] == shown


@pytest.mark.skipif(_cupy_installed(), reason="cupy is installed: tests/gpu checks these lines")
@pytest.mark.parametrize(("visible", "shown"), [(None, "unset"), ("", "''"), ("0,1", "'0,1'")])
def test_info_without_cupy_says_so_and_shows_cuda_visible_devices(visible: str | None, shown: str) -> None:
    got = info({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})
    assert got["cupy"].startswith("not installed")
    assert got["CUDA devices"] == f"unknown without cupy (CUDA_VISIBLE_DEVICES is {shown})"


def test_info_says_whether_the_c_calls_are_in_use() -> None:
    assert info()["C calls"] == "in use (mpicomm.core.cmpi)"
    assert info({"MPICOMM_C": "0"})["C calls"] == "off: switched off (MPICOMM_C=0)"
