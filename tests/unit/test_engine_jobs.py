"""Calls queued on mpicomm's communication thread still end the job when a rank never arrives or fails.

A queued call blocks on the engine's thread, not the program's: the watchdog must still end the job
and name the call (and the program's line), and one rank's uncaught exception with calls queued
must still end it within seconds (the engine's thread is a daemon). Each scenario runs in its own
``mpiexec`` under plain ``python`` (see tests/unit/test_timeouts.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mpijobs import needs_mpiexec, run_job

pytestmark = [needs_mpiexec, pytest.mark.process]  # every test starts processes

STUCK = """
    import time
    import numpy as np
    import mpicomm as dist

    dist.init_process_group("gloo", timeout=1)
    w, r = dist.get_world_size(), dist.get_rank()
    x = np.ones(2)
    if r != w - 1:  # the last rank never arrives
        work = dist.all_reduce(x, async_op=True)
        print(f"rank {r} posted: {not work.is_completed()}", flush=True)
        work.wait()
        print(f"rank {r} went on", flush=True)
    else:
        time.sleep(50)
        print("the last rank slept to the end", flush=True)
"""

FAILS = """
    import time
    import numpy as np
    import mpicomm as dist

    dist.init_process_group("gloo")
    w, r = dist.get_world_size(), dist.get_rank()
    if r == 0:
        work = dist.all_reduce(np.ones(2), async_op=True)  # queued: the others never join it
        raise RuntimeError("rank 0 fails with a call queued")
    time.sleep(50)
    print(f"rank {r} slept to the end", flush=True)
"""


@pytest.mark.parametrize("c_calls", ["1", "0"])
def test_a_queued_call_whose_peer_never_arrives_ends_the_job_named(tmp_path: Path, c_calls: str) -> None:
    status, out, seconds = run_job(tmp_path, STUCK, 2, {"MPICOMM_C": c_calls})
    assert status != 0, out
    assert "rank 0 posted: True" in out, out
    assert "went on" not in out and "slept to the end" not in out, out
    assert "mpicomm watchdog: all_reduce (run on mpicomm's communication thread) on group world" in out, out
    assert "past its bound (the timeout group world was made with, 1 s)" in out, out
    assert "called at " in out and "threading.py" not in out, out  # the program's line, not the thread's
    assert seconds < 30, f"took {seconds:.1f} s"


def test_an_uncaught_exception_with_a_call_queued_ends_the_job(tmp_path: Path) -> None:
    status, out, seconds = run_job(tmp_path, FAILS, 2, {})
    assert status != 0, out
    assert "rank 0 fails with a call queued" in out, out
    assert "slept to the end" not in out, out
    assert seconds < 30, f"took {seconds:.1f} s"


FIRST = """
    import numpy as np
    import mpicomm

    x = np.ones(2)
    mpicomm.all_reduce(x, async_op=True).wait()  # the first call of the program: MPI starts here
    mpicomm.all_reduce(x)  # the program's thread owns MPI, not the engine's
    print(f"rank {mpicomm.get_rank()} sum {x[0]:g}", flush=True)
"""


def test_a_first_call_made_async_starts_mpi_on_the_programs_thread(tmp_path: Path) -> None:
    status, out, _ = run_job(tmp_path, FIRST, 2, {})
    assert status == 0, out
    assert "rank 0 sum 4" in out and "rank 1 sum 4" in out, out
