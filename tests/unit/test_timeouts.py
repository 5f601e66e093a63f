"""Waits that end the job: a rank that never arrives, and a mistake on one rank in ``init_process_group``.

Each scenario runs in its own ``mpiexec`` under plain ``python`` (no ``-m mpi4py``: nothing from
outside ends the job), and must end within seconds with the message that says what happened. The
``communicate`` timeout is only a guard that reports a hang.
"""

from __future__ import annotations

import sys

import pytest
from mpijobs import needs_mpiexec, run_job

pytestmark = needs_mpiexec


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


@pytest.mark.process
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


@pytest.mark.process
def test_the_watchdog_names_a_subgroup_and_its_own_timeout(tmp_path):
    body = NEVER_ARRIVES.format(timeout="None", group='dist.new_group(timeout=0.5, group_desc="pairs")')
    status, out, seconds = run_job(tmp_path, body, 2)
    assert status != 0, out
    assert "mpicomm watchdog: all_reduce on group pairs (world ranks [0, 1])" in out, out
    assert "the timeout group pairs was made with, 0.5 s" in out, out
    assert seconds < 30


@pytest.mark.process
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


@pytest.mark.process
def test_a_mistake_on_one_rank_in_init_process_group_ends_the_job(tmp_path):
    status, out, seconds = run_job(tmp_path, INIT_MISTAKE.format(kwargs="'rank': '1'"), 2)
    assert status != 0, out
    assert (
        "[rank 1] mpicomm.errors.ArgumentTypeError: init_process_group: rank is '1'; expected an int" in out
    )
    assert "aborting the MPI job" in out and " sum " not in out, out
    assert seconds < 30


@pytest.mark.process
def test_a_wrong_world_size_on_one_rank_warns_and_the_job_runs(tmp_path):
    status, out, _ = run_job(tmp_path, INIT_MISTAKE.format(kwargs="'world_size': 5"), 2)
    assert status == 0, out
    assert "init_process_group: world_size is 5, and the MPI launch gives 2" in out, out
    assert "rank 0 sum 2" in out and "rank 1 sum 2" in out, out


@pytest.mark.process
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


@pytest.fixture
def any_thread(monkeypatch):
    """Calls from every thread, as at MPI_THREAD_MULTIPLE (a single-process run starts MPI at serialized)."""
    import mpicomm
    from mpicomm.core import watchdog

    mpicomm.init()
    monkeypatch.setattr(watchdog._Threads, "owner", None)


def test_a_call_under_way_is_timed_from_the_first_sample_that_saw_it_in_any_thread(any_thread):
    """A call's token on the watchdog's list from start to end; a sample times it, then forgets it.

    The call runs in a thread that never called ``mpicomm.init()``: every thread's calls are timed.
    """
    import threading

    import mpicomm
    from mpicomm.core import watchdog

    mpicomm.init()
    lock, inside = threading.Lock(), threading.Event()
    lock.acquire()

    @watchdog.timed(watchdog.Site("stand_in"))
    def blocked(group: object = None) -> None:
        inside.set()
        lock.acquire(timeout=5)

    thread = threading.Thread(target=blocked, daemon=True)
    thread.start()
    inside.wait(5)
    seen: dict = {}
    try:
        assert watchdog._sample(seen, 1.0) is None
        assert watchdog._sample(seen, 2.0) is None
        assert [(c.name, c.since) for c in seen.values()] == [("stand_in", 1.0)]
        (call,) = seen.values()
        assert call.bound() >= 2.0 and "timeout" in call.source
        assert watchdog._sample(seen, 1.0 + call.bound() + 0.5) is call  # overdue
    finally:
        lock.release()
        thread.join(5)
    assert watchdog._sample(seen, 3.0) is None
    assert seen == {}  # the call returned: nothing is kept


def test_a_sample_reads_no_frame_of_another_thread(monkeypatch, any_thread):
    """Sampling never calls ``sys._current_frames()``.

    On CPython 3.11 a collection that runs inside it and frees a ``threading.local`` waits for a lock
    its own thread holds (CPython gh-106883): a rank froze for good in CI that way, and reading
    frames of running threads crashed it now and then.
    """
    import threading

    import mpicomm
    from mpicomm.core import watchdog

    mpicomm.init()

    def refuse() -> dict:
        raise AssertionError("sys._current_frames() called by a sample")

    monkeypatch.setattr(sys, "_current_frames", refuse)
    go, done = threading.Event(), threading.Event()

    @watchdog.timed(watchdog.Site("stand_in"))
    def blocked(group: object = None) -> None:
        go.set()
        done.wait(5)

    thread = threading.Thread(target=blocked, daemon=True)
    thread.start()
    go.wait(5)
    seen: dict = {}
    try:
        watchdog._sample(seen, 1.0)
        watchdog._sample(seen, 2.0)
        assert [c.name for c in seen.values()] == ["stand_in"]
    finally:
        done.set()
        thread.join(5)


def test_a_front_door_token_holds_the_group_and_no_array():
    """The token of a call through the front door: its site, its group, no array (none kept alive)."""

    import numpy as np

    import mpicomm
    from mpicomm.core import watchdog

    world = mpicomm.init()
    seen: list = []

    def profile(frame, event, arg):
        host = frame.f_globals.get("__name__") != "mpicomm.front._doors"  # the host code, inside the call
        if event == "call" and frame.f_code.co_name == "all_reduce" and host and not seen:
            seen.append(list(watchdog._live))

    x = np.ones(4)
    sys.setprofile(profile)
    try:
        mpicomm.all_reduce(x, group=world)
    finally:
        sys.setprofile(None)
    tokens = [t for t in seen[0] if t[1].name == "all_reduce"]
    assert len(tokens) == 1 and tokens[0][2] is world, seen
    assert not any(isinstance(v, np.ndarray) for t in seen[0] for v in t)
    assert not [t for t in watchdog._live if t[1].name == "all_reduce"]  # gone when the call returned


def test_a_failing_call_takes_its_token_off_the_list():
    import pytest

    import mpicomm
    from mpicomm.core import watchdog

    mpicomm.init()
    before = list(watchdog._live)
    with pytest.raises(mpicomm.ArgumentTypeError):
        mpicomm.all_reduce("not an array")
    with pytest.raises(mpicomm.ArgumentTypeError):
        mpicomm.barrier(async_op="no")
    assert watchdog._live == before


def test_a_call_takes_off_its_own_token_not_another_threads_equal_one(any_thread):
    """Two calls of one site on one group: the one that returns must not take the other's token.

    Tokens were equal tuples then, and ``list.remove`` takes the first equal one: a thread blocked
    in ``Work.wait`` lost its token (and its timing restarted) each time another thread waited.
    """
    import threading

    import mpicomm
    from mpicomm.core import watchdog

    mpicomm.init()
    site = watchdog.Site("stand_in")
    go, done = threading.Event(), threading.Event()

    @watchdog.timed(site)
    def call(wait: bool, group: object = None) -> None:
        if wait:
            go.set()
            done.wait(5)

    thread = threading.Thread(target=call, args=(True,), daemon=True)
    thread.start()
    go.wait(5)
    try:
        (blocked,) = [t for t in watchdog._live if t[1] is site]
        call(False)  # the same site and group, returns at once
        assert [t for t in watchdog._live if t[1] is site] == [blocked]
        assert next(t for t in watchdog._live if t[1] is site) is blocked
    finally:
        done.set()
        thread.join(5)


def test_monitored_barrier_without_a_timeout_is_bounded_by_twice_its_groups():
    """Given no timeout, monitored_barrier's other ranks wait twice the group's timeout for rank 0.

    The watchdog must give them that long (and its grace) before it ends the job; any other call is
    bounded by the group's timeout and the grace.
    """
    import mpicomm
    from mpicomm.core import watchdog

    mpicomm.init()
    group = mpicomm.new_group(list(range(mpicomm.get_world_size())), timeout=10.0)
    grace = watchdog._grace(10.0)
    cases = {"monitored_barrier": 2 * 10.0 + grace, "all_reduce": 10.0 + grace}
    for name, expected in cases.items():
        call = watchdog._Call((watchdog.serial(), watchdog.Site(name), group, None), 0.0)
        assert call.bound() == pytest.approx(expected), name
    own = watchdog._Call((watchdog.serial(), watchdog.Site("monitored_barrier"), group, 3.0), 0.0)
    assert own.bound() == pytest.approx(2 * 3.0 + watchdog._grace(3.0))  # its timeout= argument
