"""MPI's thread level: chosen by mpicomm when it starts MPI, the user's choice respected, enforced.

Each test runs a real job (``mpiexec -n 2 python job.py``) in which mpicomm, not ``python -m
mpi4py``, starts MPI.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mpijobs import needs_mpiexec, run_job

pytestmark = [needs_mpiexec, pytest.mark.process]


TWO_THREADS = """
    import threading
    import numpy as np
    import mpicomm
    from mpicomm import _mpi
    from mpicomm.errors import DistError

    mpicomm.init()
    n, r = mpicomm.get_world_size(), mpicomm.get_rank()
    print(f"rank {{r}} level {{_mpi.thread_level()}}", flush=True)
    groups = [mpicomm.new_group(list(range(n))) for _ in range(2)]
    results, refused = {{}}, []

    def work(t):
        try:
            total = 0.0
            for i in range(100):
                x = np.array([float(r + t + i)])
                mpicomm.all_reduce(x, group=groups[t])
                assert x[0] == sum(s + t + i for s in range(n)), (x, t, i)
                total += x[0]
            results[t] = total
        except DistError as exc:
            refused.append(str(exc))

    if {concurrent}:
        threads = [threading.Thread(target=work, args=(t,), name=f"worker{{t}}") for t in range(2)]
        [th.start() for th in threads]
        [th.join() for th in threads]
    else:
        work(0)
        th = threading.Thread(target=work, args=(1,), name="worker1")
        th.start()
        th.join()
        work(1)  # the main thread still communicates after the refusal
    print(f"rank {{r}} results {{sorted(results)}} refused {{refused}}", flush=True)
"""


def test_mpicomm_asks_for_serialized_and_refuses_a_second_thread_before_mpi(tmp_path: Path) -> None:
    status, out, _ = run_job(tmp_path, TWO_THREADS.format(concurrent=False))
    assert status == 0, out
    for r in range(2):
        assert f"rank {r} level serialized (chosen by mpicomm (its default))" in out, out
        assert f"rank {r} results [0, 1] refused [\"mpicomm: a call from thread 'worker1'" in out, out
    assert "set MPICOMM_THREAD_LEVEL=multiple" in out, out


def test_two_threads_on_their_own_groups_run_at_once_with_the_multiple_level(tmp_path: Path) -> None:
    status, out, _ = run_job(
        tmp_path, TWO_THREADS.format(concurrent=True), env={"MPICOMM_THREAD_LEVEL": "multiple"}
    )
    assert status == 0, out
    for r in range(2):
        assert f"rank {r} level multiple (chosen by MPICOMM_THREAD_LEVEL)" in out, out
        assert f"rank {r} results [0, 1] refused []" in out, out


@pytest.mark.parametrize(
    ("setting", "env", "want"),
    [
        (
            "import mpi4py; mpi4py.rc.thread_level = 'funneled'",
            {},
            "funneled (chosen by the user: mpi4py.rc)",
        ),
        ("", {"MPI4PY_RC_THREAD_LEVEL": "multiple"}, "multiple (chosen by the user: MPI4PY_RC_THREAD_LEVEL"),
        ("", {"MPICOMM_THREAD_LEVEL": "single"}, "single (chosen by MPICOMM_THREAD_LEVEL)"),
        (
            "from mpi4py import MPI",
            {},
            "multiple (chosen by inherited: mpi4py.MPI was imported before mpicomm)",
        ),
    ],
    ids=["mpi4py.rc", "MPI4PY_RC_THREAD_LEVEL", "MPICOMM_THREAD_LEVEL", "MPI-started-first"],
)
def test_the_users_choice_is_respected(tmp_path: Path, setting: str, env: dict[str, str], want: str) -> None:
    body = f"""
    {setting}
    import sys
    import mpicomm
    from mpicomm import _mpi
    mpicomm.init()
    sys.stdout.write(f"level {{_mpi.thread_level()}}\\n")
    """
    status, out, _ = run_job(tmp_path, body, env=env)
    assert status == 0, out
    assert out.count(f"level {want}") == 2, out


def test_the_watchdog_ends_a_stuck_job_at_serialized(tmp_path: Path) -> None:
    body = """
    import time
    import numpy as np
    import mpicomm
    from mpicomm import _mpi

    mpicomm.init_process_group(timeout=1)
    r = mpicomm.get_rank()
    print(f"rank {r} level {_mpi.thread_level().split()[0]}", flush=True)
    if r == 0:
        mpicomm.all_reduce(np.zeros(2))
        print("rank 0 went on", flush=True)
    else:
        time.sleep(60)
        print("rank 1 slept to the end", flush=True)
    """
    status, out, seconds = run_job(tmp_path, body)
    assert status != 0, out
    assert "rank 0 level serialized" in out, out
    assert "mpicomm watchdog: all_reduce on group world" in out, out
    assert "went on" not in out and "slept to the end" not in out, out
    assert seconds < 40, f"took {seconds:.1f} s"


TORCH_FROM_A_THREAD = """
    import threading
    import torch
    import torch.distributed as dist
    import mpicomm.torch
    from mpicomm import _mpi

    dist.init_process_group("mpicomm")
    r, n = dist.get_rank(), dist.get_world_size()
    print(f"rank {r} level {_mpi.thread_level()}", flush=True)
    sums = []

    def step(value):  # as autograd's device threads call DDP's hooks
        try:
            t = torch.full((3,), float(value + r))
            dist.all_reduce(t)
            sums.append(t.tolist())
        except Exception as exc:
            sums.append(type(exc).__name__)

    th = threading.Thread(target=step, args=(10,))
    th.start()
    th.join()
    step(20)
    print(f"rank {r} sums {sums}", flush=True)
    dist.destroy_process_group()
"""


def test_the_torch_backend_asks_for_multiple_so_torchs_threads_may_call_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    status, out, _ = run_job(tmp_path, TORCH_FROM_A_THREAD)
    assert status == 0, out
    want = [[float(2 * v + 1)] * 3 for v in (10, 20)]  # ranks 0 and 1 add v + 0 and v + 1
    for r in range(2):
        assert f"rank {r} level multiple (chosen by mpicomm: the torch backend" in out, out
        assert f"rank {r} sums {want}" in out, out


def test_the_users_level_wins_over_the_torch_backends(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    status, out, _ = run_job(tmp_path, TORCH_FROM_A_THREAD, env={"MPICOMM_THREAD_LEVEL": "serialized"})
    assert status == 0, out
    for r in range(2):
        assert f"rank {r} level serialized (chosen by MPICOMM_THREAD_LEVEL)" in out, out
        assert f"rank {r} sums ['DistError', {[41.0] * 3}]" in out, out
