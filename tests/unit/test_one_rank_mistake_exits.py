"""A mistake on one rank under validation mode ends a plain ``python`` job, never hangs it.

The job runs under ``mpiexec`` with plain ``python`` (no ``-m mpi4py``, so no abort on an uncaught
exception): rank 0 alone passes a wrong ``output_split_sizes``; every rank catches the error and
calls ``sys.exit(3)``. Before validation mode carried local failures, the other ranks waited in the
validation exchange forever. The timeout is only a guard that reports a hang.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mpijobs import needs_mpiexec, run_job

pytestmark = [needs_mpiexec, pytest.mark.process]

SCRIPT = """
    import sys

    import numpy as np

    import mpicomm

    mpicomm.init(abort_on_exception=False)
    mpicomm.set_validation(True)
    w, r = mpicomm.get_world_size(), mpicomm.get_rank()
    out_splits = [2] + [1] * (w - 1) if r == 0 else [1] * w
    try:
        mpicomm.all_to_all_single(np.empty(w), np.ones(w), out_splits, [1] * w)
    except mpicomm.ArgumentError as exc:
        print(f"rank {r} caught: {exc}", flush=True)
        sys.exit(3)
    print(f"rank {r} went on", flush=True)
"""


def test_every_rank_catches_the_error_and_the_job_exits(tmp_path: Path) -> None:
    status, out, _ = run_job(tmp_path, SCRIPT, 2, timeout=120)
    assert status != 0
    for rank in (0, 1):
        assert f"rank {rank} caught: all_to_all_single: output_split_sizes" in out, out
    assert "went on" not in out
