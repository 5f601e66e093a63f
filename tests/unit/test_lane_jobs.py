"""The in-MPI lane's multi-rank tests (tests/mpi/test_lane_p2p.py) at MPI's serialized thread level.

``python -m mpi4py`` starts MPI at ``multiple``, where point-to-point calls run on the caller's
thread beside the engine's queue; the lane serves them only below it. So each rank count here runs
that file under ``mpiexec`` with ``MPI4PY_RC_THREAD_LEVEL=serialized`` (MPICH with the C module:
elsewhere its tests skip, saying why).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from mpijobs import needs_mpiexec, run_job

pytestmark = [needs_mpiexec, pytest.mark.process]  # every test starts processes

LANE_TESTS = Path(__file__).resolve().parent.parent / "mpi" / "test_lane_p2p.py"

BODY = f"""
    import sys

    import pytest

    args = ["--with-mpi", "-x", "-q", "-rs", "-p", "no:cacheprovider", "--timeout", "60",
            "--timeout-method", "thread", {str(LANE_TESTS)!r}]
    sys.exit(pytest.main(args))
"""


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_lane_serves_point_to_point_calls_at_serialized(tmp_path: Path, ranks: int) -> None:
    if importlib.util.find_spec("mpicomm.core._lane") is None:
        pytest.skip("the lane's C module (mpicomm.core._lane) is not built")
    status, out, _ = run_job(tmp_path, BODY, ranks, {"MPI4PY_RC_THREAD_LEVEL": "serialized"}, timeout=240)
    assert status == 0, out
    assert "thread_level: serialized" in out, out
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed in [\d.]+s", summary), out  # none skipped: the lane served them
