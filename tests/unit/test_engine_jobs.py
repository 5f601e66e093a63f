"""Calls queued on mpicomm's communication thread still end the job when a rank never arrives or fails.

A queued call blocks on the engine's thread, not the program's: the watchdog must still end the job
and name the call (and the program's line), and one rank's uncaught exception with calls queued
must still end it within seconds (the engine's thread is a daemon). Each scenario runs in its own
``mpiexec`` under plain ``python`` (see tests/unit/test_timeouts.py).
"""

from __future__ import annotations

import importlib.util
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


BROKEN = """
    import os
    import numpy as np
    import mpicomm as dist

    dist.init_process_group("gloo")
    w, r = dist.get_world_size(), dist.get_rank()
    lines = []
    rows = 2 if r == 0 else 1  # rank 0 sends 2 rows to each rank, which expect 1: MPI truncates there
    out, inp = np.zeros((rows * w, 3)), np.ones((rows * w, 3))
    work = dist.all_to_all_single(out, inp, async_op=True)
    if r > 0:
        try:  # refused at the post if the engine has failed already, else by its Work's wait
            dist.all_reduce(np.ones(2), async_op=True).wait()
        except dist.DistError as exc:
            lines.append(f"queued after: {type(exc).__name__}: {exc}")
    try:
        work.wait()
        lines.append("wait: ok")
    except dist.DistError as exc:
        lines.append(f"wait: {type(exc).__name__}: {exc}")
    calls = {
        "all_reduce": lambda: dist.all_reduce(np.ones(1)),
        "barrier": dist.barrier,
        "send": lambda: dist.send(np.ones(1), (r + 1) % w),
        "broadcast_object_list": lambda: dist.broadcast_object_list([1]),
    }
    for name, call in calls.items() if r > 0 else ():  # rank 0 is fine: its next call would wait
        try:
            call()
            lines.append(f"{name} ran")
        except dist.DistError as exc:
            lines.append(f"{name}: {type(exc).__name__}: {exc}")
    lines.append("done")
    with open(os.path.join(os.environ["JOB_OUT"], f"{r}.txt"), "w") as f:
        f.write("\\n".join(lines))
"""


@pytest.mark.parametrize("level", ["serialized", "multiple"])
def test_a_failed_queued_call_fails_its_wait_and_every_later_call(tmp_path: Path, level: str) -> None:
    """An MPI error on the engine reaches wait(); the call behind it and every later call raise, none runs."""
    status, out, _ = run_job(tmp_path, BROKEN, 3, {"MPICOMM_THREAD_LEVEL": level, "JOB_OUT": str(tmp_path)})
    assert status == 0, out  # every error was caught: the job ends as the program does
    assert (tmp_path / "0.txt").read_text().splitlines() == ["wait: ok", "done"], out
    failed = "all_to_all_single, run on mpicomm's communication thread, failed (CommunicationError: "
    for r in (1, 2):
        lines = (tmp_path / f"{r}.txt").read_text().splitlines()
        assert lines[0].startswith(f"queued after: CommunicationError: all_reduce: not run: {failed}"), lines
        assert lines[1].startswith(
            "wait: CommunicationError: all_to_all_single: MPI reported an error: a "
        ), lines
        assert "longer than the buffer that received it" in lines[1], lines
        for line, name in zip(
            lines[2:6], ("all_reduce", "barrier", "send", "broadcast_object_list"), strict=True
        ):
            who = name if name in ("all_reduce", "send") else "mpicomm"  # outside the gate: its drain
            assert line.startswith(f"{name}: CommunicationError: {who}: not run: {failed}"), lines
        assert lines[6:] == ["done"], lines


ONE_FAILS = """
    import numpy as np
    import mpicomm as dist

    dist.init_process_group("gloo")
    w, r = dist.get_world_size(), dist.get_rank()
    rows = 2 if r == 0 else 1  # rank 0 sends 2 rows to each rank, which expect 1: MPI truncates there
    work = dist.all_to_all_single(np.zeros((rows * w, 3)), np.ones((rows * w, 3)), async_op=True)
    work.wait()  # raises on the other ranks, uncaught: the job ends
    dist.all_reduce(np.ones(1))  # rank 0 waits here for ranks that are gone
    print(f"rank {r} went on", flush=True)
"""


def test_one_ranks_failure_on_the_engine_uncaught_ends_the_job(tmp_path: Path) -> None:
    status, out, seconds = run_job(tmp_path, ONE_FAILS, 3, {})
    assert status != 0, out
    assert "CommunicationError: all_to_all_single: MPI reported an error" in out, out
    assert "went on" not in out, out
    assert seconds < 30, f"took {seconds:.1f} s"


SERIALIZED_P2P = """
    import numpy as np
    import mpicomm as dist
    from mpicomm.core import engine

    engine.STALL = 0.5
    dist.init_process_group("gloo", timeout=4)
    w, r = dist.get_world_size(), dist.get_rank()
    x, y = np.full(2, float(r)), np.zeros(3)
    nxt, prv = (r + 1) % w, (r - 1) % w
    for rep in range(3):
        if r == 0:  # gloo's idiom: post, then send what the next rank needs before its all_reduce
            work = dist.all_reduce(x, async_op=True)
            dist.send(np.full(3, 7.0 + rep) if STRIDED == 0 else np.full(6, 7.0 + rep)[::2], nxt)
            got = dist.recv(y, prv)  # the last rank sends it before its all_reduce too
            work.wait()
        else:
            got = dist.recv(y, prv)
            dist.send(np.full(3, 7.0 + rep), nxt)
            dist.all_reduce(x)
        print(f"rank {r} rep {rep}: sum {x[0]:g} got {y[0]:g} from {got}", flush=True)
"""


@pytest.mark.parametrize("level", ["serialized", "multiple"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_send_the_peer_needs_first_after_an_async_collective(
    tmp_path: Path, level: str, ranks: int
) -> None:
    """gloo's idiom at both levels: at serialized the send runs inside the engine's collective (MPICH)."""
    if level == "serialized" and importlib.util.find_spec("mpicomm.core._lane") is None:
        pytest.skip("the lane's C module (mpicomm.core._lane) is not built")
    body = SERIALIZED_P2P.replace("STRIDED", str(ranks - 2))  # at 3 ranks rank 0 sends a strided view
    status, out, _ = run_job(tmp_path, body, ranks, {"MPICOMM_THREAD_LEVEL": level, "MPICOMM_C": "1"})
    assert status == 0, out
    total = float(sum(range(ranks)))
    for rep in range(3):
        for r in range(ranks):
            line = f"rank {r} rep {rep}: sum {total * ranks**rep:g} got {7 + rep:g} from {(r - 1) % ranks}"
            assert line in out, out
    assert "waited" not in out, out


def test_a_send_the_lane_does_not_serve_waits_says_so_and_ends(tmp_path: Path) -> None:
    """With no lane (MPICOMM_C=0) a send at serialized waits behind the collective: a warning says why."""
    body = SERIALIZED_P2P.replace("STRIDED", "1")
    env = {"MPICOMM_THREAD_LEVEL": "serialized", "MPICOMM_C": "0"}
    status, out, seconds = run_job(tmp_path, body, 2, env)
    assert status != 0, out
    assert "send: waited 0.5 s behind 1 call(s) posted before it with async_op=True" in out, out
    assert "MPICOMM_THREAD_LEVEL=multiple" in out, out
    assert "mpicomm watchdog: send on group world" in out, out
    assert "rep 0:" not in out, out
    assert seconds < 40, f"took {seconds:.1f} s"
