"""Calls that wait inside C honour the group's timeout: a rank that never arrives ends the job.

``jagged_all_to_all`` (``cmpi.jagged``) and a repeated ``KJTAllToAll`` (``cmpi.kjt_repeat``) block
in C, in the counts ``MPI_Alltoall`` with the GIL released; the watchdog must still end the job with
its message naming the call, with the C calls on and off. Each scenario runs in its own ``mpiexec``
under plain ``python`` (see tests/unit/test_timeouts.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mpijobs import needs_mpiexec, run_job

pytestmark = [needs_mpiexec, pytest.mark.process]

JAGGED = """
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

KJT = """
    import time
    import numpy as np
    import mpicomm as dist
    from mpicomm.core import cmpi
    from mpicomm.jagged.hot import Repeat

    dist.init_process_group("gloo", timeout=1)
    w, r = dist.get_world_size(), dist.get_rank()
    keys = [f"k{{i}}" for i in range(2 * w)]
    kja = dist.KeyedJaggedArray(keys, np.full(4 * w, float(r)), lengths=np.ones(4 * w, np.int64))
    a2a = dist.KJTAllToAll([2] * w)
    for _ in range(3):  # the second call makes the repeat; the third takes it
        a2a(kja).wait()
    hot = [s.hot for p in a2a._send.values() for s in p.sent.values()]
    print(f"rank {{r}} C: {{cmpi.bound() is None}} repeat: {{isinstance(hot[0], Repeat)}}", flush=True)
    if r != w - 1:  # the last rank never arrives
        a2a(kja).wait()
        print(f"rank {{r}} went on", flush=True)
    else:
        time.sleep(50)
        print("the last rank slept to the end", flush=True)
"""

#: Each call's job, and what its rank 0 prints once the path the test means to time out is taken.
SCENARIOS = {
    "jagged_all_to_all": (JAGGED, "rank 0 C: {c}"),
    "KJTAllToAll": (KJT, "rank 0 C: {c} repeat: True"),
}


@pytest.mark.parametrize("c_calls", ["1", "0"])
@pytest.mark.parametrize("call", list(SCENARIOS))
def test_a_rank_that_never_arrives_in_a_call_blocked_in_c_ends_the_job(
    tmp_path: Path, call: str, c_calls: str
) -> None:
    script, taken = SCENARIOS[call]
    status, out, seconds = run_job(tmp_path, script.format(), 2, {"MPICOMM_C": c_calls})
    assert status != 0, out
    assert taken.format(c=c_calls == "1") in out, out
    assert "went on" not in out and "slept to the end" not in out, out
    assert f"mpicomm watchdog: {call} on group world" in out, out
    assert "past its bound (the timeout group world was made with, 1 s)" in out, out
    assert seconds < 30, f"took {seconds:.1f} s"
