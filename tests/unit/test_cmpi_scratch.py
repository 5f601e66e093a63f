"""The C list forms never hand a caller bytes of their reused temporary (issue 34, finding 5).

``MPI_Allgather`` says nothing of how much each rank sent, so a slot that a message left short is
copied out as it lies in the temporary. The temporary is one process-wide scratch buffer: before
issue 34 such a slot held an earlier call's bytes. Here the scratch is poisoned by a real call (a
list reduce_scatter packs its inputs there), then ``MPI_Allgather`` is bound to a stand-in that,
like a message that never arrived, writes nothing: the slot must come back cleared, not poisoned.
One process, MPI started: the binding is restored afterwards.

The pack scratch of the point-to-point calls is kept per thread; it is freed when its thread ends
(issue 44: a program that ran calls from 12 threads kept 104 MiB more).
"""

from __future__ import annotations

import ctypes
import resource
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import mpicomm
from mpicomm.core import cmpi
from mpicomm.core.reduce_op import ReduceOp


@pytest.fixture
def silent_allgather(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Bind MPI_Allgather to a function that writes nothing; yields the list of its calls' counts."""
    mpicomm.init()
    if cmpi.bound() is not None:
        pytest.skip(f"the C calls are not in use here: {cmpi.bound()}")
    from mpi4py import MPI

    from mpicomm.core import _cmpi  # type: ignore[attr-defined]

    calls: list[int] = []
    handle = ctypes.c_int if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int) else ctypes.c_void_p
    kind = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.c_int, handle, ctypes.c_void_p, ctypes.c_int, handle, handle
    )

    def nothing(send: int, scount: int, sdt: int, recv: int, rcount: int, rdt: int, comm: int) -> int:
        calls.append(rcount)
        return 0  # MPI_SUCCESS, the receive buffer untouched

    stand_in = kind(nothing)
    real = cmpi._lookup

    def lookup(scopes: tuple[object, ...], name: str) -> object:
        return stand_in if name == "MPI_Allgather" else real(scopes, name)

    monkeypatch.setattr(cmpi, "_lookup", lookup)
    cmpi._bind(_cmpi)
    try:
        yield calls
    finally:
        monkeypatch.undo()
        cmpi._bind(_cmpi)


def test_a_slot_mpi_left_unwritten_comes_back_cleared_not_with_an_earlier_calls_bytes(silent_allgather):
    w = mpicomm.init()
    comm, n = w.comm, 4
    dt, op = ReduceOp.SUM.mpi_op(np.dtype(np.float64), "test")
    out = np.empty(n * w.size())
    ins = [np.full(n * w.size(), 555.0) for _ in range(w.size())]
    # the scratch now holds the packed 555s (the same 32 bytes a rank the allgather below uses)
    assert cmpi.reduce_scatter_list(out[:n], [x[:n] for x in ins], dt, op, comm, 1 << 16) is None
    outs = [np.full(n, -1.0) for _ in range(w.size())]
    assert cmpi.allgather_list(np.ones(n), outs, dt, comm, 1 << 16) is None
    assert silent_allgather == [n]
    for slot in outs:
        assert 555.0 not in slot, slot
        assert slot.tolist() == [0.0] * n


def _rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_the_pack_scratch_of_a_thread_is_freed_when_the_thread_ends() -> None:
    """Issue 44: each thread's strided sendrecv grew scratch memory that outlived the thread."""
    w = mpicomm.init()
    if cmpi.bound() is not None:
        pytest.skip(f"the C calls are not in use here: {cmpi.bound()}")
    from mpicomm.core import _cmpi  # type: ignore[attr-defined]

    n = 1 << 21  # a 16 MiB column each way: 32 MiB of scratch a thread, past malloc's mmap threshold
    u, v = np.ones((n, 2)), np.full((n, 2), -1.0)  # both resident before the first reading (np.zeros is not)
    from mpi4py import MPI

    from mpicomm.core.buffers import _DATATYPES, datatype

    me, dt = w.rank(), datatype(u.dtype)  # (in _DATATYPES from now on)
    # the C function itself: mpicomm's calls belong to the main thread at this thread level, and the
    # main thread waits in join() while the other calls
    consts = (_DATATYPES, int(MPI.PROC_NULL), int(MPI.ANY_TAG))
    assert dt is _DATATYPES[u.dtype]
    held, rss = _cmpi.scratch_held(), _rss()
    errors: list[BaseException] = []

    def exchange(k: float) -> None:
        try:
            u[:, 0] = k
            assert cmpi.sendrecv_checked(u[:, 0], v[:, 0], me, me, 0, None, None, w.comm, *consts) == me
            assert (v[:, 0] == k).all()
            assert _cmpi.scratch_held() >= held + 2 * n * 8  # the scratch is in use
        except BaseException as exc:
            errors.append(exc)

    for k in range(4):
        t = threading.Thread(target=exchange, args=(float(k),))
        t.start()
        t.join()
    assert not errors, errors
    # join() returns when Python is done with the thread; its thread-exit destructors may still be
    # running: wait for them (at most 10 s, never a timed assertion)
    for _ in range(1000):
        if _cmpi.scratch_held() == held:
            break
        time.sleep(0.01)
    assert _cmpi.scratch_held() == held
    # four threads' 32 MiB each would stay resident without the destructor: 128 MiB
    assert _rss() - rss < 48 << 20, (_rss() - rss) >> 20
