"""The front door's cache of small CPU tensors' numpy views: reused only while the tensor is unchanged.

A tensor whose memory, shape, strides or dtype changed in place (``resize_``, ``set_``,
``transpose_``, ``.data =``) between two calls must get a new view: each test changes one of them
and checks every rank's result against a numpy reference built from the shared seed.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch
from ranks import exact_inputs, rank_size

import mpicomm
from mpicomm import ReduceOp
from mpicomm.core import watchdog
from mpicomm.front import door_parts

pytestmark = pytest.mark.mpi


def test_a_reused_tensor_is_reduced_right_every_time() -> None:
    r, w = rank_size()
    g = exact_inputs(1, w, 6)
    t = torch.from_numpy(g[r].copy())
    want = g.sum(axis=0)
    mpicomm.all_reduce(t)
    np.testing.assert_array_equal(t.numpy(), want)
    t.copy_(torch.from_numpy(g[r]))
    mpicomm.all_reduce(t)  # the second call may use the kept view: the same memory, the same result
    np.testing.assert_array_equal(t.numpy(), want)
    assert id(t) in door_parts.VIEWS


def test_resize_shrinks_the_tensor_and_the_next_call_sees_only_what_is_left() -> None:
    r, w = rank_size()
    g = exact_inputs(2, w, 9)
    t = torch.from_numpy(g[r].copy())
    mpicomm.all_reduce(t)
    alias = t[:]  # the same 9 elements, kept to see what the next call touches
    t.resize_(4)  # the same pointer, a new shape (numpy views forbid growing the storage, not this)
    t.copy_(torch.from_numpy(g[r, :4]))
    mpicomm.all_reduce(t)
    np.testing.assert_array_equal(t.numpy(), g[:, :4].sum(axis=0))
    np.testing.assert_array_equal(alias.numpy()[4:], g[:, 4:].sum(axis=0))  # a stale view would reduce these


def test_set_points_the_tensor_at_other_memory() -> None:
    r, w = rank_size()
    g = exact_inputs(3, w, 5)
    t = torch.from_numpy(g[r].copy())
    mpicomm.all_reduce(t)
    other = torch.from_numpy((2 * g[r]).copy())
    t.set_(other)
    mpicomm.all_reduce(t)
    np.testing.assert_array_equal(other.numpy(), 2 * g.sum(axis=0))


def test_transpose_in_place_changes_shape_and_strides() -> None:
    r, w = rank_size()
    g = exact_inputs(4, w, 6).reshape(w, 2, 3)
    t = torch.from_numpy(g[r].copy())
    out = torch.empty(w * 6)
    mpicomm.all_gather_into_tensor(out, t)
    np.testing.assert_array_equal(out.numpy(), g.reshape(-1))
    t.transpose_(0, 1)  # the same memory, shape (3, 2), strides (1, 3): gathered in its new order
    mpicomm.all_gather_into_tensor(out, t)
    np.testing.assert_array_equal(out.numpy(), g.transpose(0, 2, 1).reshape(-1))


def test_data_swapped_for_another_dtype_view_of_the_same_memory() -> None:
    r, w = rank_size()
    t = torch.full((4,), 1.0)
    mpicomm.all_reduce(t)
    t.data = t.view(torch.int32)  # the same pointer, shape and strides; only the dtype differs
    t.fill_(r + 2)
    mpicomm.all_reduce(t, op=ReduceOp.PRODUCT)  # a float32 view would multiply denormals to 0
    assert t.dtype == torch.int32
    want = np.prod(np.arange(2, w + 2, dtype=np.int64))
    np.testing.assert_array_equal(t.numpy(), np.full(4, want, np.int32))


def test_two_tensor_calls_use_and_refresh_the_cache() -> None:
    r, w = rank_size()
    g = exact_inputs(5, w, 3 * w)
    out = torch.empty(3 * w)
    inp = torch.from_numpy(g[r].copy())
    for _ in range(2):
        mpicomm.all_to_all_single(out, inp)
        want = g.reshape(w, w, 3)[:, r, :].reshape(-1)
        np.testing.assert_array_equal(out.numpy(), want)
    out.resize_(3 * w - 1)  # a wrong size now (a shrink: numpy views forbid growing): the call must refuse
    with pytest.raises(mpicomm.ArgumentError):
        mpicomm.all_to_all_single(out, inp)


def test_the_cache_is_bounded() -> None:
    rank_size()
    tensors = [torch.zeros(4) for _ in range(20)]
    for t in tensors:
        mpicomm.all_reduce(t)
    assert len(door_parts.VIEWS) <= door_parts.VIEW_ENTRIES
    assert id(tensors[-1]) in door_parts.VIEWS


def test_a_large_tensor_is_kept_only_while_it_lives() -> None:
    """A 1 MiB tensor's view is reused (the same result twice) and dropped, memory and all, at its death."""
    r, w = rank_size()
    g = exact_inputs(6, w, 1 << 18)
    t = torch.from_numpy(g[r].copy())
    for _ in range(2):
        t.copy_(torch.from_numpy(g[r]))
        mpicomm.all_reduce(t)
        np.testing.assert_array_equal(t.numpy(), g.sum(axis=0))
    key = id(t)
    assert key in door_parts.VIEWS
    storage = weakref.ref(door_parts.VIEWS[key][1].base)  # the view's owner: what holds the memory
    watchdog.forget()  # the frames it holds (a sample under way, the last seen) would keep t alive
    del t
    assert key not in door_parts.VIEWS
    assert storage() is None


def test_a_new_tensor_under_a_dead_ones_id_gets_its_own_view() -> None:
    r, w = rank_size()
    g = exact_inputs(7, w, 8)
    for i in range(4):  # CPython often gives the new tensor the dead one's id; each must be reduced
        t = torch.from_numpy((g[r] + i).copy())
        mpicomm.all_reduce(t)
        np.testing.assert_array_equal(t.numpy(), g.sum(axis=0) + w * i)
        del t
