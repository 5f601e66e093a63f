"""torch drop-in, round 2 (issue 21): coalesced collectives, Backend names, c10d's ProcessGroup methods,
Work.get_future, sparse all_reduce and torch's exception types. Every rank builds the global input from
a shared seed and checks its own result against numpy."""

from __future__ import annotations

import datetime
import warnings

import numpy as np
import pytest

import mpicomm
import mpicomm as dist

torch = pytest.importorskip("torch")

SEED = 2126


def _inputs(w: int, dtype: type = np.float64) -> list[list[np.ndarray]]:
    """Rank r's list of arrays, for every r: the same shapes on every rank, from one seed."""
    rng = np.random.default_rng(SEED)
    shapes = [tuple(rng.integers(0, 4, size=rng.integers(0, 3))) for _ in range(4)]
    return [[np.asarray(rng.standard_normal(s) * 8, dtype) for s in shapes] for _ in range(w)]


# ----------------------------------------------------------------------------- coalesced


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize(
    ("op", "ref"), [("SUM", np.sum), ("MAX", np.max), ("MIN", np.min), ("PRODUCT", np.prod)]
)
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_all_reduce_coalesced_reduces_every_array_in_place(world, op, ref, kind):
    w, r = world.size(), world.rank()
    every = _inputs(w)
    mine = [a.copy() for a in every[r]]
    tensors = [torch.from_numpy(a) for a in mine] if kind == "torch" else mine
    assert dist.all_reduce_coalesced(tensors, getattr(dist.ReduceOp, op)) is None
    for i, got in enumerate(mine):
        np.testing.assert_allclose(got, ref(np.stack([every[q][i] for q in range(w)]), axis=0))


@pytest.mark.mpi(min_size=1)
def test_all_reduce_coalesced_async_returns_a_future_of_the_callers_tensors(world):
    w = world.size()
    tensors = [torch.ones(2), torch.full((3,), 2.0)]
    fut = dist.all_reduce_coalesced(tensors, async_op=True)
    assert isinstance(fut, dist.Future)
    value = fut.wait()
    assert value[0] is tensors[0] and value[1] is tensors[1] and fut.done()
    assert tensors[1].tolist() == [2.0 * w] * 3


@pytest.mark.mpi(min_size=1)
def test_all_reduce_coalesced_refuses_mixed_dtypes_and_complex_max_with_value_error(world):
    with pytest.raises(
        ValueError, match=r"all_reduce_coalesced: tensors\[1\] has dtype float32; expected float64"
    ):
        dist.all_reduce_coalesced([torch.ones(2, dtype=torch.float64), torch.ones(2)])
    with pytest.raises(ValueError, match=r"all_reduce_coalesced: .*does not support MAX on complex"):
        dist.all_reduce_coalesced([torch.ones(2, dtype=torch.complex64)], dist.ReduceOp.MAX)
    with pytest.raises(ValueError, match=r"all_reduce: op ReduceOp\.BXOR on complex dtype complex128"):
        dist.all_reduce(np.ones(2, complex), dist.ReduceOp.BXOR)
    # torch: ValueError for a list of mixed dtypes, TypeError for an output of another type
    outs = [torch.ones(1) for _ in range(world.size())]
    with pytest.raises(ValueError, match="all_gather: tensor_list has dtype float32; expected float64"):
        dist.all_gather(outs, torch.ones(1, dtype=torch.float64))
    with pytest.raises(
        TypeError, match="all_gather_into_tensor: output_tensor has dtype float32; expected float64"
    ):
        dist.all_gather_into_tensor(torch.ones(world.size()), torch.ones(1, dtype=torch.float64))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_all_gather_coalesced_fills_one_list_per_rank(world, kind):
    w, r = world.size(), world.rank()
    every = _inputs(w, np.float32)
    outs = [[np.full(a.shape, -1, np.float32) for a in every[r]] for _ in range(w)]
    if kind == "torch":
        outs_t = [[torch.from_numpy(o) for o in each] for each in outs]
        dist.all_gather_coalesced(outs_t, [torch.from_numpy(a) for a in every[r]])
    else:
        dist.all_gather_coalesced(outs, every[r])
    for q in range(w):
        for i in range(len(every[q])):
            np.testing.assert_array_equal(outs[q][i], every[q][i])


@pytest.mark.mpi(min_size=1)
def test_all_gather_coalesced_async_and_bad_output_lists(world):
    w, r = world.size(), world.rank()
    outs = [[torch.zeros(2, dtype=torch.complex64)] for _ in range(w)]
    fut = dist.all_gather_coalesced(
        outs, [torch.full((2,), complex(r, -r), dtype=torch.complex64)], async_op=True
    )
    fut.wait()
    assert [o[0][1].item() for o in outs] == [complex(q, -q) for q in range(w)]
    with pytest.raises(
        TypeError, match="all_gather_coalesced: output_tensor_lists is Tensor; expected a list"
    ):
        dist.all_gather_coalesced(torch.zeros(2), [torch.zeros(2)])
    with pytest.raises(ValueError, match=r"output_tensor_lists\[0\]\[0\] has 3 elements of float32"):
        dist.all_gather_coalesced([[torch.zeros(3)] for _ in range(w)], [torch.zeros(2)])


# ----------------------------------------------------------------------------- backend names


@pytest.mark.mpi(min_size=1)
def test_backend_names_parse_as_in_torch(world):
    assert dist.Backend("GLOO") == dist.Backend.GLOO == "gloo"
    assert dist.Backend.NCCL == "nccl" and dist.Backend.MPI == "mpi"
    assert dist.Backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    with pytest.warns(FutureWarning, match="reduce_op is deprecated"):
        assert dist.reduce_op.SUM is dist.ReduceOp.SUM


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["gloo", "GLOO", "nccl", "cpu:gloo,cuda:nccl"])
def test_get_backend_answers_the_name_a_group_was_made_with(world, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dist.BackendWarning)
        g = dist.new_group(backend=name)
    assert dist.get_backend(g) == name.lower() and isinstance(dist.get_backend(g), dist.Backend)
    x = np.ones(1)
    dist.all_reduce(x, group=g)  # served by MPI all the same
    assert x[0] == world.size()
    sub, _ = dist.new_subgroups(1, group=g)
    assert dist.get_backend(sub) == name.lower()
    dist.destroy_process_group(g)


# ----------------------------------------------------------------------------- ProcessGroup methods


@pytest.mark.mpi(min_size=1)
def test_process_group_methods_return_works(world):
    w, r = world.size(), world.rank()
    x = torch.full((3,), float(r + 1))
    assert world.allreduce([x]).wait() and x.tolist() == [w * (w + 1) / 2] * 3
    y = torch.full((2,), float(r + 1))
    world.allreduce(y, op=dist.ReduceOp.MAX).wait()
    assert y.tolist() == [float(w)] * 2
    b = torch.full((2,), float(r))
    world.broadcast([b], w - 1).wait()
    assert b.tolist() == [float(w - 1)] * 2
    outs = [torch.zeros(1) for _ in range(w)]
    world.allgather([outs], [torch.tensor([float(r)])]).wait()
    assert [o.item() for o in outs] == [float(q) for q in range(w)]
    out = torch.zeros(2)
    world.reduce_scatter([out], [[torch.full((2,), float(q)) for q in range(w)]]).wait()
    assert out.tolist() == [float(r * w)] * 2
    a2a = torch.zeros(w)
    world.alltoall_base(a2a, torch.arange(w, dtype=torch.float32) + 10 * r, [], []).wait()
    assert a2a.tolist() == [float(r + 10 * q) for q in range(w)]
    assert world.barrier().wait()
    world.monitored_barrier(60)
    assert world.rank() == r and world.size() == w


@pytest.mark.mpi(min_size=2)
def test_process_group_send_recv_take_group_ranks(world):
    w, r = world.size(), world.rank()
    if r == 0:
        world.send([torch.arange(3.0)], w - 1, 7).wait()
    elif r == w - 1:
        got = torch.zeros(3)
        world.recv([got], 0, 7).wait()
        assert got.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.mpi(min_size=1)
def test_future_then_chains_callbacks_and_passes_errors(world):
    w = world.size()
    fut = world.allreduce([torch.full((2,), 2.0)]).get_future()
    res = fut.then(lambda f: [t * 3 for t in f.wait()]).then(lambda f: [t + 1 for t in f.value()]).wait()
    assert res[0].tolist() == [2.0 * w * 3 + 1] * 2

    def boom(f: dist.Future) -> None:
        raise KeyError("callback failed")

    failing = world.allreduce([torch.ones(1)]).get_future().then(boom)
    after = failing.then(lambda f: "never")
    with pytest.raises(KeyError, match="callback failed"):
        after.wait()
    assert failing.done()


# ----------------------------------------------------------------------------- sparse all_reduce


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dense_dims", [0, 2])
def test_all_reduce_sparse_sums_every_ranks_non_zeros(world, dense_dims):
    w, r = world.size(), world.rank()

    def make(q: int) -> torch.Tensor:
        idx = torch.arange(q + 1).reshape(1, q + 1)
        return torch.sparse_coo_tensor(idx, torch.ones([q + 1] + [2] * dense_dims), [w] + [2] * dense_dims)

    t = make(r)
    assert dist.all_reduce_sparse(t) is None
    expected = sum(make(q).to_dense() for q in range(w))
    assert t.is_sparse and t.is_coalesced()
    np.testing.assert_array_equal(t.to_dense().numpy(), expected.numpy())
    with pytest.raises(
        ValueError,
        match=r"all_reduce_sparse: op is ReduceOp\.MAX on a sparse COO tensor; expected ReduceOp\.SUM",
    ):
        dist.all_reduce_sparse(make(r), dist.ReduceOp.MAX)
    with pytest.raises(
        TypeError, match="all_reduce_sparse: tensor is a Tensor; expected a torch sparse COO tensor"
    ):
        dist.all_reduce_sparse(torch.ones(2))
    # all_reduce itself hands sparse tensors to all_reduce_sparse
    t2 = make(r)
    assert dist.all_reduce(t2) is None
    np.testing.assert_array_equal(t2.to_dense().numpy(), expected.numpy())


@pytest.mark.mpi(min_size=1)
def test_mpicomm_names_are_exported(world):
    for name in (
        "Backend",
        "reduce_op",
        "all_reduce_coalesced",
        "all_gather_coalesced",
        "all_reduce_sparse",
        "Future",
    ):
        assert name in mpicomm.__all__ and hasattr(mpicomm, name)


# ----------------------------------------------------------------------------- timeouts


@pytest.mark.mpi(min_size=2)
def test_new_group_timeout_bounds_its_barrier(world):
    import time

    g = dist.new_group(timeout=datetime.timedelta(seconds=0.3))
    assert g.timeout == pytest.approx(0.3)
    if world.rank() == 0:  # only rank 0 enters: it raises after the group's timeout
        start = time.monotonic()
        with pytest.raises(
            RuntimeError, match=r"barrier: not every rank of group .* within 0\.3 s; .*Timed out"
        ):
            dist.barrier(g)
        assert time.monotonic() - start >= 0.3
    dist.destroy_process_group(g)  # a group that timed out is not used again
    fine = dist.new_group(timeout=30)
    dist.barrier(fine)  # everyone enters: no error
    dist.destroy_process_group(fine)


@pytest.mark.mpi(min_size=2)
def test_work_wait_timeout_raises_and_the_work_can_still_complete(world):
    r = world.rank()
    if r == 1:
        got = torch.zeros(2)
        work = dist.irecv(got, src=0)
        with pytest.raises(RuntimeError, match=r"Work\.wait: the operation did not complete within 0\.2 s"):
            work.wait(timeout=0.2)
        dist.send(torch.ones(1), dst=0)  # now rank 0 sends
        assert work.wait(timeout=datetime.timedelta(seconds=30)) and got.tolist() == [3.0, 3.0]
    elif r == 0:
        dist.recv(torch.zeros(1), src=1)  # waits until rank 1's wait has timed out
        dist.send(torch.full((2,), 3.0), dst=1)


# ----------------------------------------------------------------------------- c10d methods, round 3


def _rows(w: int, n: int = 3) -> np.ndarray:
    """Row r is rank r's data (shared seed)."""
    return np.random.default_rng(SEED + 1).standard_normal((w, n))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("root", [0, -1])
def test_process_group_reduce_gather_scatter_take_c10d_lists_and_options(world, root):
    w, r = world.size(), world.rank()
    root = root % w
    rows = _rows(w)

    class ReduceOptions:  # torch's options objects carry these attributes
        reduceOp = dist.ReduceOp.MAX  # noqa: N815
        rootRank = root  # noqa: N815

    x = torch.from_numpy(rows[r].copy())
    assert world.reduce([x], ReduceOptions()).wait()
    np.testing.assert_array_equal(x.numpy(), rows.max(axis=0) if r == root else rows[r])
    y = rows[r].copy()
    assert world.reduce(y, root, dist.ReduceOp.SUM).wait()  # c10d's (tensor, root, op) overload
    if r == root:
        np.testing.assert_allclose(y, rows.sum(axis=0), rtol=1e-12)

    outs = [[torch.zeros(3).double() for _ in range(w)]] if r == root else []
    assert world.gather(outs, [torch.from_numpy(rows[r].copy())], root).wait()
    if r == root:
        np.testing.assert_array_equal(np.stack([o.numpy() for o in outs[0]]), rows)

    out = np.zeros(3)
    ins = [[rows[i] * 2 for i in range(w)]] if r == root else []
    assert world.scatter([out], ins, root).wait()
    np.testing.assert_array_equal(out, rows[r] * 2)
    out2 = np.zeros(3)
    assert world.scatter(out2, [rows[i] for i in range(w)] if r == root else [], root=root).wait()
    np.testing.assert_array_equal(out2, rows[r])


@pytest.mark.mpi(min_size=1)
def test_process_group_allreduce_coalesced_alltoall_and_base_methods(world):
    w, r = world.size(), world.rank()
    every = _inputs(w)
    mine = [a.copy() for a in every[r]]
    assert world.allreduce_coalesced([torch.from_numpy(a) for a in mine]).wait()
    for i, a in enumerate(mine):
        np.testing.assert_allclose(a, np.sum([every[q][i] for q in range(w)], axis=0), rtol=1e-12)

    rows = _rows(w * w).reshape(w, w, 3)  # rows[src][dst]
    outs = [np.zeros(3) for _ in range(w)]
    assert world.alltoall(outs, [rows[r][d].copy() for d in range(w)]).wait()
    np.testing.assert_array_equal(np.stack(outs), rows[:, r])

    flat = np.zeros(w * 3)
    assert world._allgather_base(flat, _rows(w)[r].copy()).wait()
    np.testing.assert_array_equal(flat, _rows(w).reshape(-1))
    got = np.zeros(3)
    assert world._reduce_scatter_base(got, rows[r].reshape(-1).copy()).wait()
    np.testing.assert_allclose(got, rows[:, r].sum(axis=0), rtol=1e-12)


# ----------------------------------------------------------------------------- torch's types, round 3


@pytest.mark.mpi(min_size=2)
def test_bad_all_to_all_single_splits_raise_runtime_error_as_torch_and_value_error(world):
    w = world.size()
    out, inp = torch.empty(w), torch.arange(float(w))
    cases = [
        ([1] * w, [1] * (w + 1), r"input_split_sizes has \d+ entries.*not equal to group size"),
        ([1] * w, [2] + [1] * (w - 1), r"input_split_sizes sums to .*doesn't match total dim 0 size"),
    ]
    for out_splits, in_splits, pattern in cases:
        with pytest.raises(RuntimeError, match=pattern) as info:  # gloo's TORCH_CHECK type
            dist.all_to_all_single(out, inp, out_splits, in_splits)
        assert isinstance(info.value, ValueError) and isinstance(info.value, mpicomm.ArgumentError)
    dist.set_validation(True)  # a mistake on rank 0 only: every rank raises it, with its type
    try:
        with pytest.raises(RuntimeError, match=r"input_split_sizes sums to .*found on rank 0"):
            dist.all_to_all_single(out, inp, [1] * w, [2] + [1] * (w - 1) if world.rank() == 0 else [1] * w)
    finally:
        dist.set_validation(False)
    with pytest.raises(RuntimeError, match="invalid root rank") as info:  # gloo's, on the default group
        dist.broadcast(np.ones(1), src=w + 3)
    assert isinstance(info.value, ValueError)


# ----------------------------------------------------------------------------- in-place idiom, strided


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["columns", "flat", "torch"])
def test_all_gather_into_tensor_in_place_on_a_strided_output(world, layout):
    """torch's idiom ``all_gather_into_tensor(out, out.reshape(W, -1)[rank])`` with a strided ``out``."""
    w, r = world.size(), world.rank()
    rows = _rows(w)
    if layout == "columns":
        base = np.zeros((w, 6))
        out = base[:, ::2]
    elif layout == "flat":
        base = np.zeros(2 * w * 3)
        out = base[::2]
    else:
        tbase = torch.zeros(w, 6, dtype=torch.float64)
        out, base = tbase[:, ::2], tbase.numpy()
    mine = out.reshape(w, -1)[r]
    assert np.shares_memory(np.asarray(mine), base)  # a view: the call gathers in place
    mine[:] = torch.from_numpy(rows[r]) if layout == "torch" else rows[r]
    dist.all_gather_into_tensor(out, mine)
    np.testing.assert_array_equal(np.asarray(out).reshape(w, 3), rows)
    np.testing.assert_array_equal(base.reshape(-1)[1::2], 0)  # the gaps are untouched
