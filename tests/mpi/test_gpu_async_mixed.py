"""Ranks that differ in ``async_op`` with device arrays past one staging chunk (issues 34 and 35, item 1).

A device call longer than one chunk first asks every rank whether it pipelines
(``mpicomm.core.chunks.split``), whatever its ``async_op`` (an asynchronous one asks on mpicomm's
communication thread). Each test lets a
different set of ranks ask for a Work, with each rank holding its own kind (numpy, torch CPU, cupy,
strided or not), at one, two and many chunks of ``MPICOMM_STAGING_CHUNK=4K``, on the staged path and
on the direct path (CUDA-aware MPI assumed: the fake cupy's memory is host memory), and checks every
rank's result against numpy. A rank whose MPI calls differed from the others' would hang (then
pytest-timeout ends the run) or raise "Message truncated". CPU emulation (tests/fakecupy): not GPU
verification.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakecupy import testing
from fakecupy.testing import inputs, world
from mpi4py import MPI

import mpicomm
from mpicomm.front import device as front
from mpicomm.gpu import direct
from mpicomm.gpu.cuda_aware import cuda_awareness


def _mixed_kinds() -> Any:
    """tests/mpi/test_gpu_mixed_kinds.py by its path: tests/gpu/test_paths_gpu.py loads this module too."""
    path = Path(__file__).with_name("test_gpu_mixed_kinds.py")
    spec = importlib.util.spec_from_file_location("gpu_async_mixed_kinds", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_kinds = _mixed_kinds()
DENSE, SIZES, get, make = _kinds.DENSE, _kinds.SIZES, _kinds.get, _kinds.make

#: Which ranks ask for a Work.
ASYNC: dict[str, Callable[[int, int], bool]] = {
    "rank0": lambda r, n: r == 0,
    "rank1": lambda r, n: r == 1,
    "all": lambda r, n: True,
}

#: Which kind rank r holds.
KINDS: dict[str, Callable[[int], str]] = {
    "all-cupy": lambda r: "cupy",
    "cupy-strided": lambda r: ("cupy", "cupy-strided")[r % 2],
    "host-rank0": lambda r: "numpy" if r == 0 else "cupy",
    "host-last": lambda r: ("cupy", "torch", "cupy-strided")[r % 3],
}


#: At 2 ranks: every call, async choice and mix at many chunks, and at one and two chunks a Latin
#: square (for each call and chunk count the three async choices meet three different mixes, and over
#: the calls every mix meets every async choice at every chunk count): half the full product's cases,
#: which took 86 s of CI's 2 cores. At other sizes (each rank a process on those 2 cores): many chunks
#: and two mixes; every call, path and async choice still runs.
_FEW = MPI.COMM_WORLD.Get_size() != 2
RUN_SIZES = ["many-chunks"] if _FEW else list(SIZES)
RUN_KINDS = ["all-cupy", "host-last"] if _FEW else list(KINDS)


def _cases() -> list[tuple[str, str, str, str]]:
    """(call, which, kinds, size) for the dense-call test, as the comment above says."""
    out = []
    for c, call in enumerate(DENSE):
        for w, which in enumerate(ASYNC):
            for z, size in enumerate(RUN_SIZES):
                if size == "many-chunks":
                    out += [(call, which, kinds, size) for kinds in RUN_KINDS]
                else:
                    out.append((call, which, RUN_KINDS[(c + w + z) % len(RUN_KINDS)], size))
    return out


@pytest.fixture(params=["staged", "direct"])
def cp(fake: Any, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from testing.staged_fake(fake, monkeypatch, aware="1" if request.param == "direct" else "0")


@pytest.fixture
def chunk4k(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from testing.chunk_size(monkeypatch, "4K")


def _done(work: Any, flag: bool) -> None:
    if flag:
        assert isinstance(work, mpicomm.Work), work
        assert work.wait()
    else:
        assert work is None


def run(call: str, cp: Any, kind: str, k: int, flag: bool) -> None:
    """One dense call with ``async_op=flag`` on this rank's kind, checked against numpy."""
    r, n = world()
    x = inputs(n, n * k)
    z = np.zeros
    a = {"async_op": flag}
    if call == "all_reduce":
        t = make(cp, kind, x[r, :k])
        _done(mpicomm.all_reduce(t, **a), flag)
        np.testing.assert_array_equal(get(t), x[:, :k].sum(axis=0))
    elif call == "broadcast":
        t = make(cp, kind, x[r, :k])
        _done(mpicomm.broadcast(t, src=0, **a), flag)
        np.testing.assert_array_equal(get(t), x[0, :k])
    elif call == "reduce":
        t = make(cp, kind, x[r, :k])
        _done(mpicomm.reduce(t, dst=0, **a), flag)
        np.testing.assert_array_equal(get(t), x[:, :k].sum(axis=0) if r == 0 else x[r, :k])
    elif call == "reduce_scatter_tensor":
        out = make(cp, kind, z(k))
        _done(mpicomm.reduce_scatter_tensor(out, make(cp, kind, x[r]), **a), flag)
        np.testing.assert_array_equal(get(out), x.sum(axis=0)[r * k : (r + 1) * k])
    elif call == "all_gather_into_tensor":
        out = make(cp, kind, z(n * k))
        _done(mpicomm.all_gather_into_tensor(out, make(cp, kind, x[r, :k]), **a), flag)
        np.testing.assert_array_equal(get(out), x[:, :k].reshape(-1))
    elif call == "all_to_all_single":
        out = make(cp, kind, z(n * k))
        _done(mpicomm.all_to_all_single(out, make(cp, kind, x[r]), **a), flag)
        np.testing.assert_array_equal(get(out), x[:, r * k : (r + 1) * k].reshape(-1))
    elif call == "all_gather":
        outs = [make(cp, kind, z(k)) for _ in range(n)]
        _done(mpicomm.all_gather(outs, make(cp, kind, x[r, :k]), **a), flag)
        for s in range(n):
            np.testing.assert_array_equal(get(outs[s]), x[s, :k])
    elif call == "gather":
        outs = [make(cp, kind, z(k)) for _ in range(n)] if r == 0 else None
        _done(mpicomm.gather(make(cp, kind, x[r, :k]), outs, dst=0, **a), flag)
        for s in range(n if outs is not None else 0):
            np.testing.assert_array_equal(get(outs[s]), x[s, :k])  # type: ignore[index]
    elif call == "scatter":
        t = make(cp, kind, z(k))
        pieces = [make(cp, kind, x[0, s * k : (s + 1) * k]) for s in range(n)] if r == 0 else None
        _done(mpicomm.scatter(t, pieces, src=0, **a), flag)
        np.testing.assert_array_equal(get(t), x[0, r * k : (r + 1) * k])
    elif call == "all_to_all":
        outs = [make(cp, kind, z(k)) for _ in range(n)]
        ins = [make(cp, kind, x[r, s * k : (s + 1) * k]) for s in range(n)]
        _done(mpicomm.all_to_all(outs, ins, **a), flag)
        for s in range(n):
            np.testing.assert_array_equal(get(outs[s]), x[s, r * k : (r + 1) * k])
    elif call == "reduce_scatter":
        out = make(cp, kind, z(k))
        ins = [make(cp, kind, x[r, s * k : (s + 1) * k]) for s in range(n)]
        _done(mpicomm.reduce_scatter(out, ins, **a), flag)
        np.testing.assert_array_equal(get(out), x.sum(axis=0)[r * k : (r + 1) * k])
    else:
        raise AssertionError(call)


@pytest.mark.parametrize(("call", "which", "kinds", "size"), _cases())
def test_every_dense_call_with_ranks_differing_in_async_op_and_kind(
    cp: Any, chunk4k: None, call: str, which: str, kinds: str, size: str
) -> None:
    r, n = world()
    run(call, cp, KINDS[kinds](r), SIZES[size], ASYNC[which](r, n))


def test_the_reported_case_blocking_rank0_async_rank1_16k_device_all_reduce(cp: Any, chunk4k: None) -> None:
    """Rank 0 blocking, the others async, 4 chunks of cupy: one agreement question on every rank."""
    r, n = world()
    x = inputs(n, 2048)
    d = cp.asarray(x[r])
    work = mpicomm.all_reduce(d, async_op=r != 0)
    _done(work, r != 0)
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))
    d2 = cp.asarray(x[r])  # and the next call still matches (no question left over on any rank)
    mpicomm.broadcast(d2, src=n - 1)
    np.testing.assert_array_equal(d2.get(), x[n - 1])


@pytest.mark.parametrize("call", ["all_reduce", "broadcast", "reduce", "all_to_all_single"])
@pytest.mark.parametrize("which", list(ASYNC))
@pytest.mark.usefixtures("validation_off")  # validation mode: no async pipelining
def test_async_device_calls_pipeline_like_blocking_ones(
    cp: Any, chunk4k: None, call: str, which: str
) -> None:
    """Every rank on cupy, some async: the same path on every rank (direct or pipelined)."""
    r, n = world()
    flag = ASYNC[which](r, n)
    run(call, cp, "cupy", SIZES["many-chunks"], flag)
    path = "direct" if cuda_awareness().aware and call in direct.COMPLETING else "pipelined"
    assert front.PATHS[call, path] == 1
    assert sum(front.PATHS.values()) == 1


def test_an_async_pipelined_work_shows_the_callers_array(cp: Any, chunk4k: None) -> None:
    r, n = world()
    x = inputs(n, 2048)
    d = cp.asarray(x[r])
    work = mpicomm.all_reduce(d, async_op=True)  # queued on the engine (tests/mpi/test_gpu_async_paths.py)
    assert work.wait()
    assert work.is_completed()
    (shown,) = work.result()
    assert shown is d
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))


@pytest.mark.parametrize("call", ["all_reduce", "reduce"])
@pytest.mark.parametrize("kinds", RUN_KINDS)
@pytest.mark.parametrize("which", list(ASYNC))
def test_float16_reductions_reduced_in_float32_with_ranks_differing_in_async_op(
    cp: Any, chunk4k: None, call: str, which: str, kinds: str
) -> None:
    """float16 goes through float32 copies (twice the bytes: the host code may ask chunks.split twice)."""
    r, n = world()
    k = 3 * 2048 + 5  # float16: three 4 KiB chunks and a bit
    x = inputs(n, k, "float16")
    t = make(cp, KINDS[kinds](r), x[r])
    flag = ASYNC[which](r, n)
    if call == "all_reduce":
        _done(mpicomm.all_reduce(t, async_op=flag), flag)
        want = x.astype(np.float32).sum(axis=0).astype(np.float16)
    else:
        _done(mpicomm.reduce(t, dst=n - 1, async_op=flag), flag)
        want = x.astype(np.float32).sum(axis=0).astype(np.float16) if r == n - 1 else x[r]
    np.testing.assert_array_equal(get(t), want)
