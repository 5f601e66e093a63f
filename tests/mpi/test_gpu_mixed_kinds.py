"""One MPI call sequence per call whatever each rank holds (issue 35 item 1), on the fake cupy.

Every rank of one call may hold a different kind (numpy, torch CPU, cupy) and layout (contiguous,
strided): a host root with device receivers, a device root with host receivers, and mixtures, at
messages of one, two and many chunks (``MPICOMM_STAGING_CHUNK=4K``). Each result is checked against
numpy on the same inputs. On the old code a host rank sent a large message in one MPI call where the
device ranks' pipeline sent chunks: the 16 KiB broadcast from a numpy root into cupy arrays raised
"Message truncated" on the receivers. Now every rank of a call over one chunk answers one question
(mpicomm.core.chunks.split): chunks only where every rank pipelines. CPU emulation (tests/fakecupy):
not GPU verification.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from fakecupy import testing
from fakecupy.testing import inputs, world

import mpicomm
from mpicomm.core import chunks
from mpicomm.front import device as front

try:  # in the dev venv; test_paths_gpu imports this module on the GPU image too: there torch's kinds
    import torch  # become numpy if it has no torch, so the other tests of that module still run
except ImportError:
    torch = None

#: Elements per rank (float64, 512 a 4 KiB chunk): one chunk, two chunks, many chunks.
SIZES = {"1-chunk": 300, "2-chunks": 700, "many-chunks": 3 * 512 + 17}

#: Which kind rank r holds, per scheme (the root is rank 0).
SCHEMES: dict[str, Callable[[int], str]] = {
    "host-root": lambda r: "numpy" if r == 0 else "cupy",
    "device-root": lambda r: "cupy" if r == 0 else ("torch", "numpy-strided")[r % 2],
    "mixed-a": lambda r: ("cupy-strided", "numpy", "torch-strided", "cupy")[r % 4],
    "mixed-b": lambda r: ("torch", "cupy", "numpy-strided", "cupy-strided")[r % 4],
}


@pytest.fixture
def chunk4k(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from testing.chunk_size(monkeypatch, "4K")


def make(cp: Any, kind: str, x: np.ndarray) -> Any:
    """``x`` (1-D) as ``kind``: numpy, torch or cupy, contiguous or every other element of a buffer."""
    base, strided = kind.split("-")[0], kind.endswith("strided")
    m = x.size
    if base == "torch" and torch is None:
        base = "numpy"
    if base == "numpy":
        out = np.zeros(2 * m if strided else m, x.dtype)[:: 2 if strided else 1]
        out[...] = x
        return out
    if base == "torch":
        t = torch.zeros(2 * m if strided else m, dtype=torch.from_numpy(x[:0].copy()).dtype)
        t = t[:: 2 if strided else 1]
        t.copy_(torch.from_numpy(x.copy()))
        return t
    d = cp.zeros(2 * m if strided else m, dtype=x.dtype)[:: 2 if strided else 1]
    d[...] = cp.asarray(x)
    return d


def get(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a.copy()
    if torch is not None and isinstance(a, torch.Tensor):
        return a.numpy().copy()
    return np.asarray(a.get())


def run_dense(call: str, cp: Any, kind: str, k: int) -> None:
    """One dense call on this rank's kind, checked against numpy (every rank builds every input)."""
    r, n = world()
    x = inputs(n, n * k)  # row s: rank s's input (n blocks of k where the call cuts blocks)
    z = np.zeros
    if call == "all_reduce":
        t = make(cp, kind, x[r, :k])
        mpicomm.all_reduce(t)
        np.testing.assert_array_equal(get(t), x[:, :k].sum(axis=0))
    elif call == "broadcast":
        t = make(cp, kind, x[r, :k])
        mpicomm.broadcast(t, src=0)
        np.testing.assert_array_equal(get(t), x[0, :k])
    elif call == "reduce":
        t = make(cp, kind, x[r, :k])
        mpicomm.reduce(t, dst=0)
        np.testing.assert_array_equal(get(t), x[:, :k].sum(axis=0) if r == 0 else x[r, :k])
    elif call == "reduce_scatter_tensor":
        out = make(cp, kind, z(k))
        mpicomm.reduce_scatter_tensor(out, make(cp, kind, x[r]))
        np.testing.assert_array_equal(get(out), x.sum(axis=0)[r * k : (r + 1) * k])
    elif call == "all_gather_into_tensor":
        out = make(cp, kind, z(n * k))
        mpicomm.all_gather_into_tensor(out, make(cp, kind, x[r, :k]))
        np.testing.assert_array_equal(get(out), x[:, :k].reshape(-1))
    elif call == "all_to_all_single":
        out = make(cp, kind, z(n * k))
        mpicomm.all_to_all_single(out, make(cp, kind, x[r]))
        np.testing.assert_array_equal(get(out), x[:, r * k : (r + 1) * k].reshape(-1))
    elif call == "all_gather":
        outs = [make(cp, kind, z(k)) for _ in range(n)]
        mpicomm.all_gather(outs, make(cp, kind, x[r, :k]))
        for s in range(n):
            np.testing.assert_array_equal(get(outs[s]), x[s, :k])
    elif call == "gather":
        outs = [make(cp, kind, z(k)) for _ in range(n)] if r == 0 else None
        mpicomm.gather(make(cp, kind, x[r, :k]), outs, dst=0)
        for s in range(n if outs is not None else 0):
            np.testing.assert_array_equal(get(outs[s]), x[s, :k])  # type: ignore[index]
    elif call == "scatter":
        t = make(cp, kind, z(k))
        pieces = [make(cp, kind, x[0, s * k : (s + 1) * k]) for s in range(n)] if r == 0 else None
        mpicomm.scatter(t, pieces, src=0)
        np.testing.assert_array_equal(get(t), x[0, r * k : (r + 1) * k])
    elif call == "all_to_all":
        outs = [make(cp, kind, z(k)) for _ in range(n)]
        mpicomm.all_to_all(outs, [make(cp, kind, x[r, s * k : (s + 1) * k]) for s in range(n)])
        for s in range(n):
            np.testing.assert_array_equal(get(outs[s]), x[s, r * k : (r + 1) * k])
    elif call == "reduce_scatter":
        out = make(cp, kind, z(k))
        mpicomm.reduce_scatter(out, [make(cp, kind, x[r, s * k : (s + 1) * k]) for s in range(n)])
        np.testing.assert_array_equal(get(out), x.sum(axis=0)[r * k : (r + 1) * k])
    else:
        raise AssertionError(call)


DENSE = [
    "all_reduce",
    "broadcast",
    "reduce",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
    "all_to_all_single",
    "all_gather",
    "gather",
    "scatter",
    "all_to_all",
    "reduce_scatter",
]


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("call", DENSE)
def test_every_dense_call_with_each_rank_holding_its_own_kind_and_layout(
    cp: Any, chunk4k: None, call: str, scheme: str, size: str
) -> None:
    r, _ = world()
    run_dense(call, cp, SCHEMES[scheme](r), SIZES[size])


def test_the_issue_case_a_numpy_root_broadcasts_16k_into_cupy_arrays(cp: Any, chunk4k: None) -> None:
    """The reported failure: host root, device receivers, 4 chunks; it raised "Message truncated"."""
    r, _ = world()
    x = np.arange(2048, dtype=np.float64)  # 16 KiB
    t = x.copy() if r == 0 else cp.zeros(2048)
    mpicomm.broadcast(t, src=0)
    np.testing.assert_array_equal(get(t), x)
    assert front.PATHS["broadcast", "pipelined"] == 0  # a host rank: every rank sends it in one call
    assert front.PATHS["broadcast", "staged"] == (0 if r == 0 else 1)


def test_all_device_ranks_still_pipeline_and_a_later_mixed_call_does_not(cp: Any, chunk4k: None) -> None:
    r, n = world()
    x = inputs(n, 2048)
    d = cp.asarray(x[r])
    mpicomm.all_reduce(d)
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))
    assert front.PATHS["all_reduce", "pipelined"] == 1
    m = x[r].copy() if r == n - 1 else cp.asarray(x[r])
    mpicomm.all_reduce(m)
    np.testing.assert_array_equal(get(m), x.sum(axis=0))
    assert front.PATHS["all_reduce", "pipelined"] == 1  # unchanged: the mixed call went whole
    assert front.PATHS["all_reduce", "staged"] == (0 if r == n - 1 else 1)


@pytest.mark.parametrize("size", list(SIZES))
def test_host_then_device_calls_on_every_rank_chunk_only_the_device_one(
    cp: Any, chunk4k: None, size: str
) -> None:
    """Past one chunk: the all-host call goes whole, the all-device call in chunks (pipelined)."""
    r, n = world()
    k = SIZES[size]
    x = inputs(n, k)
    host = x[r].copy()
    dev = cp.asarray(x[r])
    mpicomm.all_reduce(host)
    mpicomm.all_reduce(dev)
    np.testing.assert_array_equal(dev.get(), host)
    step = chunks.step(k * 8, 8)
    assert front.PATHS["all_reduce", "pipelined"] == (1 if step else 0)
    assert step == (0 if size == "1-chunk" else 4096)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_objects_with_arrays_of_each_ranks_kind(cp: Any, chunk4k: None, scheme: str) -> None:
    r, n = world()
    k = SIZES["many-chunks"]
    x = inputs(n, k)
    kind = SCHEMES[scheme]
    objs: list[Any] = [{"w": make(cp, kind(0), x[0]), "tag": "root"}] if r == 0 else [None]
    mpicomm.broadcast_object_list(objs, src=0)
    np.testing.assert_array_equal(get(objs[0]["w"]), x[0])
    out: list[Any] = [None] * n
    mpicomm.all_gather_object(out, (r, make(cp, kind(r), x[r])))
    for s in range(n):
        assert out[s][0] == s
        np.testing.assert_array_equal(get(out[s][1]), x[s])


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_jagged_all_to_all_with_each_ranks_kind(cp: Any, chunk4k: None, scheme: str) -> None:
    r, n = world()
    kind = SCHEMES[scheme](r).split("-")[0]  # jagged takes contiguous arrays
    rows = 3 * n
    lengths = (np.arange(rows) * 37 + r * 11) % 700  # about 2.5 chunks of float64 per rank pair
    values = np.arange(int(lengths.sum()), dtype=np.float64) + 1000 * r
    got = mpicomm.jagged_all_to_all(make(cp, kind, values), make(cp, kind, lengths), [3] * n)
    want_lengths, want_values = [], []
    for s in range(n):
        ls = (np.arange(rows) * 37 + s * 11) % 700
        vs = np.arange(int(ls.sum()), dtype=np.float64) + 1000 * s
        ends = np.cumsum(ls)
        a = int(ends[3 * r - 1]) if r else 0
        want_lengths.append(ls[3 * r : 3 * r + 3])
        want_values.append(vs[a : int(ends[3 * r + 2])])
    np.testing.assert_array_equal(get(got.lengths), np.concatenate(want_lengths))
    np.testing.assert_array_equal(get(got.values), np.concatenate(want_values))
