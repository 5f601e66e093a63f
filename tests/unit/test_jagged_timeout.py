"""jagged_all_to_all's C call honours the group's timeout: a rank that never arrives ends the job.

The blocking call waits inside C (the counts ``MPI_Alltoall``, with the GIL released); the
watchdog must still end the job with its message naming the call. Each scenario runs in its own
``mpiexec`` under plain ``python`` (see tests/unit/test_timeouts.py).
"""

from __future__ import annotations

import pytest
from mpijobs import needs_mpiexec, run_job

pytestmark = needs_mpiexec

NEVER_ARRIVES = """
    import time
    import numpy as np
    import mpicomm as dist
    from mpicomm.core import cmpi

    dist.init_process_group("gloo", timeout=1)
    w, r = dist.get_world_size(), dist.get_rank()
    lengths = np.ones(3 * w, np.int64)
    values = np.full(3 * w, float(r))
    for _ in range(2):  # the first call meets the dtypes; the second is the C call's where it is bound
        dist.jagged_all_to_all(values, lengths, [3] * w)
    print(f"rank {{r}} C: {{cmpi.bound() is None}}", flush=True)
    if r != w - 1:  # the last rank never arrives
        dist.jagged_all_to_all(values, lengths, [3] * w)
        print(f"rank {{r}} went on", flush=True)
    else:
        time.sleep(50)
        print("the last rank slept to the end", flush=True)
"""


@pytest.mark.parametrize("c_calls", ["1", "0"])
def test_a_rank_that_never_arrives_in_jagged_all_to_all_ends_the_job(tmp_path, c_calls):
    status, out, seconds = run_job(tmp_path, NEVER_ARRIVES.format(), 2, {"MPICOMM_C": c_calls})
    assert status != 0, out
    assert f"rank 0 C: {c_calls == '1'}" in out, out  # the path the test means to time out
    assert "went on" not in out and "slept to the end" not in out, out
    assert "mpicomm watchdog: jagged_all_to_all on group world" in out, out
    assert "past its bound (the timeout group world was made with, 1 s)" in out, out
    assert seconds < 30, f"took {seconds:.1f} s"
