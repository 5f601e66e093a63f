"""Waits that end the job: a rank that never arrives, and a mistake on one rank in ``init_process_group``.

Each scenario runs in its own ``mpiexec`` under plain ``python`` (no ``-m mpi4py``: nothing from
outside ends the job), and must end within seconds with the message that says what happened. The
``communicate`` timeout is only a guard that reports a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).parent / "mpiexec"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")


def run_job(
    tmp_path: Path, body: str, ranks: int, env: dict[str, str] | None = None
) -> tuple[int, str, float]:
    """Run ``body`` under ``mpiexec -n ranks python``; return its exit status, output and seconds."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
    start = time.monotonic()
    proc = subprocess.Popen(
        [str(MPIEXEC), "-n", str(ranks), sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the job hung:\n{out}")
    return proc.returncode, out, time.monotonic() - start


NEVER_ARRIVES = """
    import time
    import numpy as np
    import mpicomm as dist

    dist.init_process_group("gloo", timeout={timeout})
    w, r = dist.get_world_size(), dist.get_rank()
    group = {group}
    x = np.full(4, float(r))
    if r != w - 1:  # the last rank never arrives
        dist.all_reduce(x, group=group)
        print(f"rank {{r}} went on", flush=True)
    else:
        time.sleep(50)
        print("the last rank slept to the end", flush=True)
"""


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_rank_that_never_arrives_ends_the_job_with_the_watchdogs_message(tmp_path, ranks):
    body = NEVER_ARRIVES.format(timeout=1, group="None")
    status, out, seconds = run_job(tmp_path, body, ranks)
    assert status != 0, out
    assert "went on" not in out and "slept to the end" not in out, out
    assert "mpicomm watchdog: all_reduce on group world (world ranks" in out, out
    assert "past its bound (the timeout group world was made with, 1 s)" in out, out
    assert "Timed out" in out and "job.py:11" in out, out  # the caller's line
    assert seconds < 30, f"took {seconds:.1f} s"


def test_the_watchdog_names_a_subgroup_and_its_own_timeout(tmp_path):
    body = NEVER_ARRIVES.format(timeout="None", group='dist.new_group(timeout=0.5, group_desc="pairs")')
    status, out, seconds = run_job(tmp_path, body, 2)
    assert status != 0, out
    assert "mpicomm watchdog: all_reduce on group pairs (world ranks [0, 1])" in out, out
    assert "the timeout group pairs was made with, 0.5 s" in out, out
    assert seconds < 30


def test_mpicomm_timeout_sets_the_default_bound(tmp_path):
    body = NEVER_ARRIVES.format(timeout="None", group="None")
    status, out, _ = run_job(tmp_path, body, 2, {"MPICOMM_TIMEOUT": "1"})
    assert status != 0, out
    assert "the default timeout, 1 s (torch's; MPICOMM_TIMEOUT changes it)" in out, out


INIT_MISTAKE = """
    import numpy as np
    import mpicomm as dist
    from mpi4py import MPI

    kwargs = {{{kwargs}}} if MPI.COMM_WORLD.Get_rank() == 1 else {{}}  # rank 1 alone is wrong
    dist.init_process_group("gloo", **kwargs)
    x = np.ones(2)
    dist.all_reduce(x)
    print(f"rank {{dist.get_rank()}} sum {{x[0]:g}}", flush=True)
"""


def test_a_mistake_on_one_rank_in_init_process_group_ends_the_job(tmp_path):
    status, out, seconds = run_job(tmp_path, INIT_MISTAKE.format(kwargs="'rank': '1'"), 2)
    assert status != 0, out
    assert (
        "[rank 1] mpicomm.errors.ArgumentTypeError: init_process_group: rank is '1'; expected an int" in out
    )
    assert "aborting the MPI job" in out and " sum " not in out, out
    assert seconds < 30


def test_a_wrong_world_size_on_one_rank_warns_and_the_job_runs(tmp_path):
    status, out, _ = run_job(tmp_path, INIT_MISTAKE.format(kwargs="'world_size': 5"), 2)
    assert status == 0, out
    assert "init_process_group: world_size is 5, and the MPI launch gives 2" in out, out
    assert "rank 0 sum 2" in out and "rank 1 sum 2" in out, out


def test_a_work_wait_that_never_completes_ends_the_job(tmp_path):
    body = """
        import numpy as np
        import mpicomm as dist

        dist.init_process_group(timeout=1)
        got = np.zeros(1)
        if dist.get_rank() == 0:
            dist.irecv(got, src=1, tag=3).wait()  # rank 1 never sends
        else:
            import time
            time.sleep(50)
        print("went on", flush=True)
    """
    status, out, seconds = run_job(tmp_path, body, 2)
    assert status != 0 and "went on" not in out, out
    assert (
        "mpicomm watchdog: Work.wait on its operation's group (not known here; the bound of group world"
        in out
    )
    assert seconds < 30


@pytest.mark.parametrize(("text", "expected"), [("", 1800.0), ("2.5", 2.5), ("0", None), (" 60 ", 60.0)])
def test_mpicomm_timeout_is_read_as_seconds(monkeypatch, text, expected):
    from mpicomm.core import watchdog

    monkeypatch.setenv("MPICOMM_TIMEOUT", text)
    assert watchdog.default_timeout() == expected


@pytest.mark.parametrize("text", ["soon", "-1", "inf", "nan"])
def test_a_bad_mpicomm_timeout_is_refused_by_name(monkeypatch, text):
    import mpicomm
    from mpicomm.core import watchdog

    monkeypatch.setenv("MPICOMM_TIMEOUT", text)
    with pytest.raises(mpicomm.ArgumentError, match=r"MPICOMM_TIMEOUT is .*expected seconds >= 0"):
        watchdog.default_timeout()


def test_a_sample_walks_only_a_thread_blocked_in_one_mpicomm_frame():
    """A thread whose top frame is the same mpicomm frame at two samples is blocked: its call is timed.

    The frame stands for an mpicomm function waiting inside C (as in an MPI call): a function made
    with an mpicomm module name, blocked on a lock.
    """
    import threading
    import time

    from mpicomm.core import watchdog

    lock = threading.Lock()
    lock.acquire()
    env = {"__name__": "mpicomm.dense.stand_in", "lock": lock, "watch": watchdog.watch}
    exec("def blocked():\n    watch()\n    lock.acquire(timeout=5)\n", env)
    thread = threading.Thread(target=env["blocked"], daemon=True)
    thread.start()
    time.sleep(0.05)
    seen: dict = {}
    with watchdog._Dog.sampling:  # the process's own watchdog (started by init) waits meanwhile
        try:
            assert watchdog._sample(seen, 1.0) is None
            assert seen == {}  # one sample: the thread may be running
            assert watchdog._sample(seen, 2.0) is None
            assert [(c.name, c.since) for c in seen.values()] == [("blocked", 1.0)]
        finally:
            lock.release()
            thread.join(5)
        watchdog._sample(seen, 3.0)
        assert seen == {}  # the call returned and the thread ended: nothing is kept


def test_a_sample_leaves_no_cycle_that_holds_a_threads_arrays():
    """A finished sample keeps no frame alive beyond what it records (the blocked calls' frames).

    ``sys._current_frames()`` includes the sampling thread's own frame; kept in the sample's locals,
    it made a cycle (frame -> frames -> frame) that held every thread's top frame, and a 1 MiB
    tensor in one of them, until the next GC pass (seen in CI at 4 ranks).
    """
    import gc
    import threading
    import time
    import weakref

    from mpicomm.core import watchdog

    class Payload:  # stands for a user's array in a frame of a thread that is inside a call
        pass

    release = threading.Event()
    captured: list[weakref.ref] = []

    def inside_a_call() -> None:
        watchdog.watch()
        payload = Payload()
        captured.append(weakref.ref(payload))
        release.wait(5)

    thread = threading.Thread(target=inside_a_call, daemon=True)
    thread.start()
    while not captured:
        time.sleep(0.001)
    collecting = gc.isenabled()
    gc.disable()
    try:
        with watchdog._Dog.sampling:  # the process's own watchdog (started by init) waits meanwhile
            watchdog._sample({}, 1.0)
            release.set()
            thread.join(5)
            watchdog._Dog.tops.clear()  # what the sample keeps on purpose (the last top frames)
            assert captured[0]() is None  # freed when its thread ended, without a GC pass
    finally:
        if collecting:
            gc.enable()


def test_a_thread_that_never_called_init_is_not_sampled():
    """Only threads that called mpicomm.init() are read: another thread's frames may be ending.

    CI segfaulted in the watchdog reading the top frame of pytest-timeout's timer thread as it
    ended; a thread blocked in an mpicomm frame without having called init() is left alone, and the
    same thread is timed once it has called it.
    """
    import threading
    import time

    from mpicomm.core import watchdog

    lock, go = threading.Lock(), threading.Event()
    lock.acquire()
    env = {"__name__": "mpicomm.dense.stand_in", "lock": lock, "go": go, "watch": watchdog.watch}
    exec("def blocked():\n    go.wait(5)\n    watch()\n    lock.acquire(timeout=5)\n", env)
    thread = threading.Thread(target=env["blocked"], daemon=True)
    thread.start()
    seen: dict = {}
    with watchdog._Dog.sampling:  # the process's own watchdog (started by init) waits meanwhile
        try:
            time.sleep(0.05)
            watchdog._sample(seen, 1.0)  # also drops an ended thread that had the same ident
            watchdog._sample(seen, 2.0)
            assert watchdog._Dog.watched.get(thread.ident) is not thread
            assert thread.ident not in watchdog._Dog.tops and seen == {}
            go.set()
            time.sleep(0.05)
            watchdog._sample(seen, 3.0)
            watchdog._sample(seen, 4.0)
            assert [(c.name, c.since) for c in seen.values()] == [("blocked", 3.0)]
        finally:
            lock.release()
            thread.join(5)
        watchdog._sample(seen, 5.0)
        assert thread.ident not in watchdog._Dog.watched  # an ended thread leaves the watched set
