"""A torch CPU tensor passed to mpicomm stays resizable (issue 32, item 3).

FSDP-style code frees a parameter's memory between steps with ``untyped_storage().resize_(0)`` and
brings it back with ``resize_(n)``; ``t.numpy()`` marks the storage as not resizable for ever, so a
tensor that had been through a collective refused both ("Trying to resize storage that is not
resizable"). Each test runs calls, resizes, and checks the next calls' results on every rank against
a numpy reference built from a shared seed: a stale view kept from before the resize would reduce
the wrong memory (or freed memory).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from ranks import exact_inputs, rank_size

import mpicomm
from mpicomm.front import door_parts

pytestmark = pytest.mark.mpi


def test_all_reduce_leaves_tensor_and_storage_resizable() -> None:
    r, w = rank_size()
    g = exact_inputs(1, w, 12)
    t = torch.tensor(g[r, :6])
    mpicomm.all_reduce(t)
    np.testing.assert_array_equal(np.array(t.tolist(), np.float32), g[:, :6].sum(axis=0))
    t.resize_(12)  # grows: new memory (raised "not resizable" before)
    t.copy_(torch.from_numpy(g[r]))
    mpicomm.all_reduce(t)
    np.testing.assert_array_equal(np.array(t.tolist(), np.float32), g.sum(axis=0))
    t.untyped_storage().resize_(0)  # FSDP frees the memory
    assert t.untyped_storage().nbytes() == 0
    t.untyped_storage().resize_(12 * 4)  # and brings it back before the next use
    t.copy_(torch.from_numpy(2 * g[r]))
    mpicomm.all_reduce(t)
    np.testing.assert_array_equal(np.array(t.tolist(), np.float32), 2 * g.sum(axis=0))
    t.untyped_storage().resize_(0)  # still resizable after the reuse


def test_broadcast_and_other_dtypes_and_layouts_stay_resizable() -> None:
    r, w = rank_size()
    g = exact_inputs(2, w, 8)
    src = w - 1
    cases = [
        torch.tensor(g[r]),
        torch.tensor(g[r]).to(torch.int64),
        torch.tensor(g[r]).to(torch.bfloat16),
        torch.tensor(g[r]).reshape(2, 4).t(),  # a transposed (strided) view
    ]
    for t in cases:
        want = torch.tensor(g[src]).to(t.dtype).reshape(t.shape if t.dim() == 1 else (2, 4))
        mpicomm.broadcast(t, src=src)
        assert torch.equal(t, want if t.dim() == 1 else want.t())
        t.untyped_storage().resize_(0)
        t.untyped_storage().resize_(t.numel() * t.element_size())
        t.fill_(r)
        mpicomm.broadcast(t, src=src)  # the memory is new (or reused at the same address): still right
        assert torch.equal(t, torch.full_like(t, src))


def test_async_handle_keeps_a_dropped_tensor_alive_and_resizable() -> None:
    r, w = rank_size()
    g = exact_inputs(3, w, 1 << 12)
    work = mpicomm.all_reduce(torch.tensor(g[r]), async_op=True)  # the caller keeps no reference
    gc.collect()
    junk = [torch.full((1 << 12,), -1.0) for _ in range(8)]  # would take the freed memory
    work.wait()
    (out,) = work.result()
    np.testing.assert_array_equal(np.array(out.tolist(), np.float32), g.sum(axis=0))
    out.resize_(1 << 13)
    out.untyped_storage().resize_(0)
    del junk
    if w == 1:
        return  # no peer for the point-to-point half (a rank cannot isend to itself)
    t = torch.tensor(g[r])
    recv = torch.empty(1 << 12)
    peer_to, peer_from = (r + 1) % w, (r - 1) % w
    works = [mpicomm.isend(t, peer_to), mpicomm.irecv(recv, peer_from)]
    for wk in works:
        wk.wait()
    np.testing.assert_array_equal(np.array(recv.tolist(), np.float32), g[peer_from])
    t.untyped_storage().resize_(0)
    recv.resize_(3)


def test_a_resized_tensor_is_never_served_a_stale_view() -> None:
    r, w = rank_size()
    g = exact_inputs(4, w, 64)
    t = torch.tensor(g[r])
    mpicomm.all_reduce(t)
    assert id(t) in door_parts.VIEWS
    for step in range(3):  # free and bring back the same size: the address may come back the same
        t.untyped_storage().resize_(0)
        t.untyped_storage().resize_(64 * 4)
        t.copy_(torch.from_numpy(g[r] + step))
        mpicomm.all_reduce(t)
        np.testing.assert_array_equal(np.array(t.tolist(), np.float32), g.sum(axis=0) + w * step)
    t.untyped_storage().resize_(0)
    t.untyped_storage().resize_(16)  # smaller than the shape needs: refused by name, not read past the end
    with pytest.raises(mpicomm.ArgumentError, match=r"all_reduce: tensor .*storage holds 16 bytes"):
        mpicomm.all_reduce(t)


def test_freed_storage_is_refused_on_every_rank() -> None:
    rank_size()
    t = torch.ones(5)
    mpicomm.all_reduce(t)
    t.untyped_storage().resize_(0)
    with pytest.raises(mpicomm.ArgumentError, match="resize_"):
        mpicomm.all_reduce(t)


def test_a_tensor_sent_inside_an_object_stays_resizable() -> None:
    r, w = rank_size()
    g = np.stack([exact_inputs(seed, w, 8) for seed in (2, 3)])  # (2, w, 8)
    mine = torch.tensor(g[0, r])
    big = torch.tensor(np.tile(g[1, r], 4096))  # 128 KiB: out of band
    got = [None] * w
    mpicomm.all_gather_object(got, {"small": mine, "big": big})
    for s in range(w):
        assert torch.equal(got[s]["small"], torch.from_numpy(g[0, s]))  # never .numpy(): it marks
        assert torch.equal(got[s]["big"], torch.from_numpy(np.tile(g[1, s], 4096)))
    objs = [big if r == 0 else None]
    mpicomm.broadcast_object_list(objs, src=0)
    assert torch.equal(objs[0], torch.from_numpy(np.tile(g[1, 0], 4096)))
    for t in (mine, big):  # the senders' tensors: raised "not resizable" before
        t.resize_(3)
        t.untyped_storage().resize_(0)
        assert t.untyped_storage().nbytes() == 0
