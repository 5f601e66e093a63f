"""torch tensors through the front door: every collective, p2p, batch and jagged call, in place, zero-copy.

Every rank builds the global input from the shared seed as numpy arrays, hands torch tensors made
from them to mpicomm, and checks its own output against a plain numpy reference.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import mpicomm
from mpicomm import ArgumentError, ArgumentTypeError, ReduceOp

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]
HALF = [torch.float16, torch.bfloat16]


def _np_dtype(dtype: torch.dtype) -> Any:
    return ml_dtypes.bfloat16 if dtype == torch.bfloat16 else torch.empty(0, dtype=dtype).numpy().dtype


def _global(rng: np.random.Generator, w: int, n: int, dtype: torch.dtype) -> np.ndarray:
    """Every rank's input, shape (w, n): small integers so that sums are exact in every dtype."""
    if dtype == torch.bool:
        return rng.integers(0, 2, (w, n)).astype(bool)
    values = rng.integers(0, 4, (w, n))
    if dtype.is_complex:
        return (values + 1j * rng.integers(0, 4, (w, n))).astype(_np_dtype(dtype))
    return (
        values.astype(np.float32).astype(_np_dtype(dtype))
        if dtype in HALF
        else values.astype(_np_dtype(dtype))
    )


def _tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.astype(np.float32).copy()).to(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


@pytest.mark.parametrize("dtype", DTYPES + HALF, ids=str)
def test_all_reduce_writes_the_tensor_in_place(world: mpicomm.ProcessGroup, rng: Any, dtype: Any) -> None:
    w, r = world.size(), world.rank()
    g = _global(rng, w, 5, dtype)
    t = _tensor(g[r], dtype)
    op = ReduceOp.MAX if dtype == torch.bool else ReduceOp.SUM
    ptr = t.data_ptr()
    assert mpicomm.all_reduce(t, op=op) is None
    expected = (
        g.max(axis=0)
        if dtype == torch.bool
        else g.astype(np.complex128 if dtype.is_complex else np.float64).sum(0)
    )
    assert t.data_ptr() == ptr and t.dtype == dtype
    np.testing.assert_array_equal(_as_numpy(t).astype(expected.dtype), expected)


def test_all_reduce_of_a_leaf_that_requires_grad_writes_it_without_autograd(
    world: mpicomm.ProcessGroup, rng: Any
) -> None:
    w, r = world.size(), world.rank()
    g = _global(rng, w, 4, torch.float32)
    leaf = torch.nn.Parameter(torch.from_numpy(g[r].copy()))
    mpicomm.all_reduce(leaf)
    assert leaf.requires_grad and leaf.grad_fn is None
    np.testing.assert_array_equal(leaf.detach().numpy(), g.sum(0))


def test_async_all_reduce_result_is_the_callers_tensor(world: mpicomm.ProcessGroup, rng: Any) -> None:
    w, r = world.size(), world.rank()
    g = _global(rng, w, 3, torch.float64)
    t = torch.from_numpy(g[r].copy())
    work = mpicomm.all_reduce(t, async_op=True)
    assert work is not None
    [got] = work.result()
    assert got is t
    np.testing.assert_array_equal(t.numpy(), g.sum(0))


def test_broadcast_reduce_and_strided_views(world: mpicomm.ProcessGroup, rng: Any) -> None:
    w, r = world.size(), world.rank()
    g = _global(rng, w, 6, torch.float32)
    full = torch.from_numpy(np.stack([g[r], g[r]], axis=1).copy())  # (6, 2): column 0 is strided
    col = full[:, 0]
    assert not col.is_contiguous()
    mpicomm.broadcast(col, src=w - 1)
    np.testing.assert_array_equal(full[:, 0].numpy(), g[w - 1])
    np.testing.assert_array_equal(full[:, 1].numpy(), g[r])  # the other column untouched
    t = torch.from_numpy(g[r].copy())
    mpicomm.reduce(t, dst=0)
    if r == 0:
        np.testing.assert_array_equal(t.numpy(), g.sum(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.bool], ids=str)
def test_gathers_and_scatters(world: mpicomm.ProcessGroup, rng: Any, dtype: Any) -> None:
    w, r = world.size(), world.rank()
    g = _global(rng, w, 4, dtype)
    out = torch.empty(w * 4, dtype=dtype)
    mpicomm.all_gather_into_tensor(out, _tensor(g[r], dtype))
    np.testing.assert_array_equal(_as_numpy(out), g.reshape(-1))
    outs = [torch.empty(4, dtype=dtype) for _ in range(w)]
    mpicomm.all_gather(outs, _tensor(g[r], dtype))
    for j in range(w):
        np.testing.assert_array_equal(_as_numpy(outs[j]), g[j])
    gl = [torch.empty(4, dtype=dtype) for _ in range(w)] if r == 0 else None
    mpicomm.gather(_tensor(g[r], dtype), gl, dst=0)
    if gl is not None:
        np.testing.assert_array_equal(np.stack([_as_numpy(x) for x in gl]), g)
    got = torch.empty(4, dtype=dtype)
    mpicomm.scatter(got, [_tensor(g[j], dtype) for j in range(w)] if r == 0 else None, src=0)
    np.testing.assert_array_equal(_as_numpy(got), g[r])


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex128, torch.bfloat16], ids=str)
def test_reduce_scatters(world: mpicomm.ProcessGroup, rng: Any, dtype: Any) -> None:
    w, r = world.size(), world.rank()
    g = _global(rng, w * w, 3, dtype).reshape(w, w * 3)  # rank i's input is g[i]
    total = g.astype(np.complex128 if dtype.is_complex else np.float64).sum(0)
    out = torch.empty(3, dtype=dtype)
    mpicomm.reduce_scatter_tensor(out, _tensor(g[r], dtype))
    np.testing.assert_array_equal(_as_numpy(out).astype(total.dtype), total[3 * r : 3 * r + 3])
    out2 = torch.empty(3, dtype=dtype)
    mpicomm.reduce_scatter(out2, list(_tensor(g[r], dtype).split(3)))
    np.testing.assert_array_equal(_as_numpy(out2).astype(total.dtype), total[3 * r : 3 * r + 3])


def test_all_to_alls_with_split_sizes_and_a_non_contiguous_input(
    world: mpicomm.ProcessGroup, rng: Any
) -> None:
    w, r = world.size(), world.rank()
    sends = rng.integers(0, 3, (w, w))  # sends[i, j]: rows rank i sends to rank j
    rows = [rng.integers(0, 100, (int(sends[i].sum()), 2)).astype(np.int64) for i in range(w)]
    base = torch.from_numpy(np.ascontiguousarray(rows[r].T))  # (2, n): its transpose is a strided input
    inp = base.T
    out = torch.empty(int(sends[:, r].sum()), 2, dtype=torch.int64)
    mpicomm.all_to_all_single(out, inp, sends[:, r].tolist(), sends[r].tolist())
    expected = [np.split(rows[i], np.cumsum(sends[i])[:-1])[r] for i in range(w)]
    np.testing.assert_array_equal(out.numpy(), np.concatenate(expected))
    ins = list(torch.from_numpy(rows[r]).split(sends[r].tolist()))
    outs = [torch.empty(int(sends[i, r]), 2, dtype=torch.int64) for i in range(w)]
    mpicomm.all_to_all(outs, ins)
    for i in range(w):
        np.testing.assert_array_equal(outs[i].numpy(), expected[i])


@pytest.mark.parametrize("first", ["numpy", "torch"])
def test_a_call_may_mix_numpy_arrays_and_tensors(world: mpicomm.ProcessGroup, rng: Any, first: str) -> None:
    """One argument numpy, the other a tensor, either way round: the front door views each."""
    w, r = world.size(), world.rank()
    g = _global(rng, w, 3, torch.float64)
    kinds = {"numpy": lambda a: a.copy(), "torch": lambda a: torch.from_numpy(a.copy())}
    other = "torch" if first == "numpy" else "numpy"
    for _ in range(2):  # the second round meets the view cache's entries of the first
        out = kinds[first](np.zeros(w * 3))
        mpicomm.all_gather_into_tensor(out, kinds[other](g[r]))
        np.testing.assert_array_equal(np.asarray(out), g.reshape(-1))
        got = kinds[first](np.zeros(w * 3))
        mpicomm.all_to_all_single(got, kinds[other](np.repeat(g[r], w)))
        expected = np.concatenate([np.repeat(g[i], w)[3 * r : 3 * r + 3] for i in range(w)])
        np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.mpi(min_size=2)
def test_send_recv_sendrecv_and_batch(world: mpicomm.ProcessGroup, rng: Any) -> None:
    w, r = world.size(), world.rank()
    g = _global(rng, w, 3, torch.float32)
    nxt, prv = (r + 1) % w, (r - 1) % w
    got = torch.empty(3)
    if r % 2 == 0:
        mpicomm.send(torch.from_numpy(g[r].copy()), dst=nxt)
        src = mpicomm.recv(got, src=prv)
    else:
        src = mpicomm.recv(got, src=prv)
        mpicomm.send(torch.from_numpy(g[r].copy()), dst=nxt)
    assert src == prv
    np.testing.assert_array_equal(got.numpy(), g[prv])
    got2 = torch.empty(3)
    mpicomm.sendrecv(torch.from_numpy(g[r].copy()), got2, dst=nxt, src=prv)
    np.testing.assert_array_equal(got2.numpy(), g[prv])
    got3 = torch.empty(3)
    ops = [
        mpicomm.P2POp(mpicomm.isend, torch.from_numpy(g[r].copy()), nxt),
        mpicomm.P2POp(mpicomm.irecv, got3, prv),
    ]
    for work in mpicomm.batch_isend_irecv(ops):
        work.wait()
    np.testing.assert_array_equal(got3.numpy(), g[prv])


def test_jagged_all_to_all_answers_in_torch(world: mpicomm.ProcessGroup, rng: Any) -> None:
    w, r = world.size(), world.rank()
    lengths = [rng.integers(0, 3, 2 * w) for _ in range(w)]  # rank i: 2 rows per destination
    values = [np.arange(int(lengths[i].sum()), dtype=np.float32) + 100 * i for i in range(w)]
    res = mpicomm.jagged_all_to_all(torch.from_numpy(values[r]), torch.from_numpy(lengths[r]), [2] * w)
    assert isinstance(res.values, torch.Tensor) and isinstance(res.lengths, torch.Tensor)
    exp_len, exp_val = [], []
    for i in range(w):
        ends = np.cumsum(lengths[i])
        exp_len.append(lengths[i][2 * r : 2 * r + 2])
        start = int(ends[2 * r - 1]) if r else 0
        exp_val.append(values[i][start : int(ends[2 * r + 1])])
    np.testing.assert_array_equal(res.lengths.numpy(), np.concatenate(exp_len))
    np.testing.assert_array_equal(res.values.numpy(), np.concatenate(exp_val))
    assert res.splits == [2] * w


class _ArrayInterfaceOnly:
    """An array of no known library: only ``__array_interface__`` (host memory)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return self.a.__array_interface__


class _DLPackOnly:
    """An array of no known library: only ``__dlpack__`` and ``__dlpack_device__`` (host memory)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.a.__dlpack_device__()


def test_array_interface_and_dlpack_objects(world: mpicomm.ProcessGroup, rng: Any) -> None:
    w, r = world.size(), world.rank()
    g = _global(rng, w, 4, torch.float64)
    holder = _ArrayInterfaceOnly(g[r].copy())
    mpicomm.all_reduce(holder)
    np.testing.assert_array_equal(holder.a, g.sum(0))
    out = np.empty(4 * w)
    mpicomm.all_gather_into_tensor(out, _DLPackOnly(g[r].copy()))
    np.testing.assert_array_equal(out, g.reshape(-1))


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: torch.ones(3).to_sparse(), ("broadcast", "tensor", "sparse", "to_dense")),
        (lambda: torch.ones(3, device="meta"), ("broadcast", "tensor", "meta")),
        (lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8), ("broadcast", "quantized")),
        (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), ("broadcast", "nested")),
        (lambda: torch.ones(3, dtype=torch.complex64).conj(), ("broadcast", "conjugate", "resolve_conj")),
    ],
    ids=["sparse", "meta", "quantized", "nested", "lazy-conj-output"],
)
def test_tensors_mpicomm_cannot_write_are_refused_by_name(
    world: mpicomm.ProcessGroup, make: Any, words: Any
) -> None:
    t = make()
    with pytest.raises((ArgumentTypeError, ArgumentError)) as info:
        mpicomm.broadcast(t, src=0)
    for word in words:
        assert word in str(info.value)


def test_a_lazily_conjugated_input_is_resolved(world: mpicomm.ProcessGroup) -> None:
    w = world.size()
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    out = torch.empty(2 * w, dtype=torch.complex64)
    mpicomm.all_gather_into_tensor(out, z.conj())
    np.testing.assert_array_equal(out.numpy(), np.tile(np.conj(z.numpy()), w))


def test_a_device_array_without_cupy_is_refused_naming_the_call(world: mpicomm.ProcessGroup) -> None:
    from standin import ForeignDeviceArray

    import mpicomm.gpu.backend as backend

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is installed: the device path is taken")
    saved = backend.set_backend(None)
    try:
        with pytest.raises(ArgumentTypeError, match="cupy does not import"):
            mpicomm.all_reduce(ForeignDeviceArray(np.ones(2)))
    finally:
        backend.set_backend(saved)


def test_kjt_all_to_all_on_torch_tensors_answers_in_torch(world: mpicomm.ProcessGroup, rng: Any) -> None:
    """Rank s holds keys k0..k(2W-1) for 2 batch slots; rank r receives keys 2r and 2r+1 from every rank."""
    w, r = world.size(), world.rank()
    nkeys, stride = 2 * w, 2
    lengths = [rng.integers(0, 3, nkeys * stride) for _ in range(w)]  # per source rank, key-major
    values = [rng.integers(0, 1000, int(x.sum())).astype(np.int64) for x in lengths]
    weights = [rng.random(int(x.sum())).astype(np.float32) for x in lengths]
    keys = [f"k{k}" for k in range(nkeys)]
    kja = mpicomm.KeyedJaggedArray(
        keys,
        torch.from_numpy(values[r]),
        weights=torch.from_numpy(weights[r]),
        lengths=torch.from_numpy(lengths[r]),
    )
    out = mpicomm.KJTAllToAll([2] * w)(kja).wait()
    assert isinstance(out.values(), torch.Tensor) and isinstance(out.lengths(), torch.Tensor)
    assert isinstance(out.weights(), torch.Tensor)
    # the reference: key-major, then source rank, then batch slot
    exp_len, exp_val, exp_w = [], [], []
    for k in (2 * r, 2 * r + 1):
        for s in range(w):
            offs = np.concatenate([[0], np.cumsum(lengths[s])])
            cells = slice(k * stride, (k + 1) * stride)
            exp_len.append(lengths[s][cells])
            exp_val.append(values[s][offs[k * stride] : offs[(k + 1) * stride]])
            exp_w.append(weights[s][offs[k * stride] : offs[(k + 1) * stride]])
    assert out.keys() == keys[2 * r : 2 * r + 2]
    np.testing.assert_array_equal(out.lengths().numpy(), np.concatenate(exp_len))
    np.testing.assert_array_equal(out.values().numpy(), np.concatenate(exp_val))
    np.testing.assert_array_equal(out.weights().numpy(), np.concatenate(exp_w))
    assert isinstance(kja.offsets(), torch.Tensor) and kja.length_per_key() == [
        int(lengths[r][k * stride : (k + 1) * stride].sum()) for k in range(nkeys)
    ]


@pytest.mark.parametrize("safe", [False, True], ids=["plain", "safe"])
def test_object_collectives_carry_torch_tensors_out_of_band(
    world: mpicomm.ProcessGroup, rng: Any, safe: bool
) -> None:
    from mpicomm.objects.pickling import dumps

    w, r = world.size(), world.rank()
    big = rng.random(1 << 15)  # 256 KiB: out of band
    small = rng.integers(0, 9, 5)
    half = rng.integers(0, 9, 4).astype(np.float32)
    payload = {
        "big": torch.from_numpy(big.copy()),
        "small": torch.from_numpy(small.copy()),
        "bf16": torch.from_numpy(half.copy()).to(torch.bfloat16),
        "leaf": torch.nn.Parameter(torch.from_numpy(half.copy())),
    }
    stream, buffers = dumps(payload)
    assert [b.nbytes for b in buffers] == [big.nbytes] and len(stream) < 4096
    saved = mpicomm.is_safe_unpickling()
    mpicomm.set_safe_unpickling(safe)
    try:
        objs = [payload if r == 0 else None]
        mpicomm.broadcast_object_list(objs, src=0)
        gathered: list[Any] = [None] * w
        mpicomm.all_gather_object(gathered, {"rank": torch.tensor([r])})
    finally:
        mpicomm.set_safe_unpickling(saved)
    got = objs[0]
    np.testing.assert_array_equal(got["big"].numpy(), big)
    np.testing.assert_array_equal(got["small"].numpy(), small)
    assert got["bf16"].dtype == torch.bfloat16
    np.testing.assert_array_equal(got["bf16"].float().numpy(), half)
    assert got["leaf"].requires_grad
    assert [int(g["rank"][0]) for g in gathered] == list(range(w))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("not an array", "", False), "numpy array of numbers"),
        ((np.zeros(2), "evil", False), "dtype tag"),
        ((np.zeros(2), "", "yes"), "requires_grad"),
    ],
    ids=["not-an-array", "bad-tag", "bad-flag"],
)
def test_safe_mode_refuses_a_forged_tensor_rebuild(args: Any, words: str) -> None:
    import pickle

    from mpicomm import UnpicklingRefusedError
    from mpicomm.objects import tensors
    from mpicomm.objects.pickling import loads

    class Forged:
        def __reduce__(self) -> Any:
            return tensors.from_numpy, args

    with pytest.raises(UnpicklingRefusedError, match=words):
        loads(pickle.dumps(Forged(), protocol=5), safe=True)


def test_all_reduce_of_a_sparse_tensor_sums_the_non_zeros_as_gloo(
    world: mpicomm.ProcessGroup, rng: Any
) -> None:
    w, r = world.size(), world.rank()
    dense = rng.integers(0, 3, (w, 6)) * (rng.random((w, 6)) < 0.4)  # rank i's tensor: dense[i]
    t = torch.from_numpy(dense[r].astype(np.float64)).to_sparse()
    mpicomm.all_reduce(t)
    assert t.is_sparse
    np.testing.assert_array_equal(t.to_dense().numpy(), dense.sum(axis=0))
    with pytest.raises(ArgumentError, match=r"ReduceOp\.SUM"):
        mpicomm.all_reduce(torch.ones(2).to_sparse(), op=ReduceOp.MAX)
