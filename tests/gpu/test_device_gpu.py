"""bind_device with real cupy on a real GPU (skipped by conftest.py where there is none).

Runs as one process (``make test-unit``) or on several ranks sharing the GPUs (``make test-gpu``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mpicomm
from mpicomm.gpu import device

REPO = Path(__file__).resolve().parents[2]


def _child(code: str, visible: str) -> dict[str, object]:
    """Run ``code`` in a new interpreter outside MPI, CUDA_VISIBLE_DEVICES=visible; it prints JSON last."""
    drop = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL", "SLURM_", "MPICOMM_")
    # Open MPI's singleton start runs orted, which refuses root unless these two are set (GPU machines
    # run as root): they are the user's settings, not the launcher's, so the child keeps them.
    keep = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
    env = {k: v for k, v in os.environ.items() if k in keep or not k.startswith(drop)}
    # Open MPI's orted also wants a remote shell it never uses on one node; machines without ssh have none.
    env.setdefault("OMPI_MCA_plm_rsh_agent", "false")
    env["CUDA_VISIBLE_DEVICES"] = visible
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_bind_device_makes_the_local_rank_device_current() -> None:
    import cupy

    world = mpicomm.init()
    count = cupy.cuda.runtime.getDeviceCount()
    index = device.bind_device()
    assert index == device.local_rank() % count
    assert cupy.cuda.Device().id == index
    x = cupy.arange(4)
    assert x.device.id == index
    picks = [index] if world.size() == 1 else world.comm.allgather(index)
    assert picks == [r % count for r in range(world.size())]  # one node: local rank == world rank


def test_bind_device_counts_only_the_visible_devices() -> None:
    got = _child(
        """
        import json, cupy
        from mpicomm.gpu.device import bind_device
        index = bind_device(local_rank=3)   # one visible device: every local rank takes index 0
        print(json.dumps({"index": index, "current": cupy.cuda.Device().id,
                          "count": cupy.cuda.runtime.getDeviceCount()}))
        """,
        visible="0",
    )
    assert got == {"index": 0, "current": 0, "count": 1}


def test_bind_device_with_every_device_hidden_is_a_clear_error() -> None:
    got = _child(
        """
        import json
        from mpicomm.gpu.device import bind_device
        from mpicomm.errors import ArgumentError
        try:
            bind_device(local_rank=0)
        except ArgumentError as exc:
            print(json.dumps({"error": str(exc)}))
        else:
            print(json.dumps({"error": None}))
        """,
        visible="",
    )
    assert isinstance(got["error"], str)
    assert got["error"].startswith("bind_device: device is 'cuda' but no CUDA device is visible")


@pytest.mark.parametrize("mode", ["0", "1"])
def test_info_reports_cupy_and_the_devices(mode: str) -> None:
    got = _child(
        f"""
        import json, os
        os.environ["MPICOMM_CUDA_AWARE"] = "{mode}"
        from mpicomm.apps.info import collect
        print(json.dumps(dict(collect())))
        """,
        visible="0",
    )
    assert got["CUDA devices"] == "1 visible (CUDA_VISIBLE_DEVICES is '0')"
    assert not str(got["cupy"]).startswith(("not installed", "import failed"))
    assert got["CUDA-aware MPI"] == f"{'yes' if mode == '1' else 'no'} (MPICOMM_CUDA_AWARE={mode})"
