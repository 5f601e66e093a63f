"""A torch program as its author writes it, typed: ``make typecheck`` runs mypy (strict) on this file.

mypy fails here if a public call's array argument is typed so that a torch tensor does not fit (it
was ``numpy.ndarray``, and torch users got arg-type errors); the MPI test runs run the same calls
and check their results against numpy, so the program is a real one, not only something a type
checker reads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ranks import rank_size

import mpicomm

pytestmark = pytest.mark.mpi


def test_dense_collectives_take_torch_tensors_for_a_type_checker() -> None:
    r, w = rank_size()
    g = np.random.default_rng(11).integers(0, 5, (w, 4)).astype(np.float32)  # small: exact sums
    t = torch.from_numpy(g[r].copy())
    mpicomm.all_reduce(t)
    np.testing.assert_array_equal(t.numpy(), g.sum(axis=0))
    mine = torch.from_numpy(g[r].copy())
    mpicomm.broadcast(mine, src=0)
    np.testing.assert_array_equal(mine.numpy(), g[0])
    out = torch.empty(4 * w)
    mpicomm.all_gather_into_tensor(out, torch.from_numpy(g[r].copy()))
    np.testing.assert_array_equal(out.numpy(), g.reshape(-1))
    parts: list[torch.Tensor] = [torch.empty(4) for _ in range(w)]
    mpicomm.all_gather(parts, torch.from_numpy(g[r].copy()))
    np.testing.assert_array_equal(torch.stack(parts).numpy(), g)
    one = torch.empty(4)
    mpicomm.reduce_scatter_tensor(one, out)  # every rank's out is g: chunk r summed w times
    np.testing.assert_array_equal(one.numpy(), w * g[r])
    mpicomm.reduce_scatter(one, [torch.from_numpy(g[j].copy()) for j in range(w)])
    np.testing.assert_array_equal(one.numpy(), w * g[r])
    swapped = torch.empty(4 * w)
    mpicomm.all_to_all_single(swapped, out)  # piece r of every rank's g: g[r], w times
    np.testing.assert_array_equal(swapped.numpy(), np.tile(g[r], w))
    got: list[torch.Tensor] = [torch.empty(4) for _ in range(w)]
    mpicomm.all_to_all(got, [torch.from_numpy(g[r].copy()) for _ in range(w)])
    np.testing.assert_array_equal(torch.stack(got).numpy(), g)
    gathered: list[torch.Tensor] | None = [torch.empty(4) for _ in range(w)] if r == 0 else None
    mpicomm.gather(torch.from_numpy(g[r].copy()), gathered, dst=0)
    if gathered is not None:
        np.testing.assert_array_equal(torch.stack(gathered).numpy(), g)
    mpicomm.scatter(one, [torch.from_numpy(g[j].copy()) for j in range(w)] if r == 0 else None, src=0)
    np.testing.assert_array_equal(one.numpy(), g[r])


def test_point_to_point_and_batches_take_torch_tensors_for_a_type_checker() -> None:
    r, w = rank_size()
    t = torch.arange(3, dtype=torch.int64) + 10 * r
    back = torch.zeros(3, dtype=torch.int64)
    right, left = (r + 1) % w, (r - 1) % w  # at one rank both are this rank: sendrecv allows it
    mpicomm.sendrecv(t, back, dst=right, src=left)
    np.testing.assert_array_equal(back.numpy(), np.arange(3) + 10 * left)
    back.zero_()
    if w == 1:  # an isend to itself could never be matched in a batch: refused by name
        with pytest.raises(mpicomm.ArgumentError, match="batch_isend_irecv"):
            mpicomm.batch_isend_irecv([mpicomm.P2POp(mpicomm.isend, t, 0)])
        return
    works = mpicomm.batch_isend_irecv(
        [mpicomm.P2POp(mpicomm.isend, t, right), mpicomm.P2POp(mpicomm.irecv, back, left)]
    )
    for work in works:
        work.wait()
    np.testing.assert_array_equal(back.numpy(), np.arange(3) + 10 * left)


def test_the_jagged_all_to_all_takes_torch_tensors_for_a_type_checker() -> None:
    r, w = rank_size()
    keys = [f"k{j}" for j in range(w)]  # key j goes to rank j: one sample of two values per key
    kja = mpicomm.KeyedJaggedArray(keys, torch.arange(2.0 * w) + 100 * r, lengths=torch.full((w,), 2))
    got = mpicomm.KJTAllToAll(splits=[1] * w)(kja).wait()
    assert isinstance(got.values(), torch.Tensor)
    want = np.concatenate([np.arange(2.0 * r, 2.0 * r + 2) + 100 * s for s in range(w)])
    np.testing.assert_array_equal(got.values().numpy(), want)
    result = mpicomm.jagged_all_to_all(torch.arange(2.0 * w) + 100 * r, torch.full((w,), 2), [1] * w)
    assert isinstance(result, mpicomm.JaggedResult)
    assert isinstance(result.values, torch.Tensor)
    np.testing.assert_array_equal(result.values.numpy(), want)
