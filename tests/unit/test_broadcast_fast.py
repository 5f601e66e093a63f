"""broadcast's common call in C (``mpicomm/core/_cmpi_bcast.c``) serves only what the host's fast path serves.

``_cmpi.broadcast_checked`` is the front door's fast entry of :func:`mpicomm.broadcast`: it makes
the common call itself and returns ``NotImplemented``, before any MPI call, for every other one, so
that the host checks it and raises its messages. One process, MPI started (``MPI_Bcast`` on one
rank changes nothing, so a served call shows as ``None``); the state each test changes is restored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm.core import chunks, cmpi, fast, validation, watchdog
from mpicomm.errors import ArgumentError, BackendArgumentError
from mpicomm.front import door


@pytest.fixture
def checked() -> Callable[..., Any]:
    """``broadcast_checked``, where the C calls are in use (the world's parts kept by a first call)."""
    mpicomm.init()
    if cmpi.bound() is not None or not door._c_doors():
        pytest.skip(f"the C calls are not in use here: {cmpi.bound()}")
    mpicomm.broadcast(np.zeros(1))
    fn = fast.broadcast_in_c()
    assert fn is not None
    return fn


def test_the_public_broadcast_has_the_fast_entry(checked: Callable[..., Any]) -> None:
    assert door._PLANS["broadcast"].fast is checked
    x = np.arange(4.0)
    assert mpicomm.broadcast(x, src=0) is None and x.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("src", [None, 0])
@pytest.mark.parametrize("x", [np.arange(3.0), np.arange(6, dtype=np.int32).reshape(2, 3), np.zeros(0)])
def test_the_common_call_is_served(checked: Callable[..., Any], src: Any, x: np.ndarray) -> None:
    want = x.copy()
    mpicomm.broadcast(want.copy())  # its dtype's datatype cached, as a program's first call does
    assert checked(x, src, None, False, None) is None
    assert np.array_equal(x, want)


def _strided(n: int) -> np.ndarray:
    return np.zeros(3 * n)[::3]


def _read_only(n: int) -> np.ndarray:
    x = np.zeros(n)
    x.flags.writeable = False
    return x


class _Sub(np.ndarray):
    pass


@pytest.mark.parametrize(
    ("why", "make", "src", "group", "async_op", "group_src"),
    [
        ("async", np.zeros, 0, None, True, None),
        ("group", np.zeros, 0, "world", False, None),
        ("group_src", np.zeros, None, None, False, 0),
        ("src bool", np.zeros, False, None, False, None),
        ("src numpy int", np.zeros, np.int64(0), None, False, None),
        ("src out of range", np.zeros, 1, None, False, None),
        ("src negative", np.zeros, -1, None, False, None),
        ("src huge", np.zeros, 2**70, None, False, None),
        ("strided", _strided, 0, None, False, None),
        ("read-only", _read_only, 0, None, False, None),
        ("subclass", lambda n: np.zeros(n).view(_Sub), 0, None, False, None),
        ("a list", lambda n: [0.0] * n, 0, None, False, None),
        ("uncached dtype", lambda n: np.zeros(n, dtype=[("a", "i4"), ("b", "f8")]), 0, None, False, None),
    ],
)
def test_every_other_call_is_left_to_the_host(
    checked: Callable[..., Any], why: str, make: Any, src: Any, group: Any, async_op: bool, group_src: Any
) -> None:
    g = mpicomm.init() if group == "world" else group
    assert checked(make(2), src, g, async_op, group_src) is NotImplemented, why


def test_the_state_the_host_reads_is_read_in_place(
    checked: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    x = np.zeros(2)
    assert checked(x, 0, None, False, None) is None
    for obj, name, value in (
        (validation._Flag, "on", True),  # validation mode: the exchange
        (watchdog._Threads, "pending", 1),  # calls queued for the engine: after them
        (chunks.Setting, "least", 8),  # a message the chunk question is asked of
        (cmpi, "bcast", lambda *a: NotImplemented),  # the C call replaced (or not bound)
    ):
        with monkeypatch.context() as m:
            m.setattr(obj, name, value)
            assert checked(x, 0, None, False, None) is NotImplemented, name
    assert checked(np.zeros(1), 0, None, False, None) is None  # 8 bytes: at most least
    kept = fast.WORLD[:]
    fast.WORLD[0] = object()  # the world's parts not kept for this world
    try:
        assert checked(x, 0, None, False, None) is NotImplemented
    finally:
        fast.WORLD[:] = kept
    assert checked(x, 0, None, False, None) is None


def test_the_host_still_raises_for_what_the_fast_entry_leaves(checked: Callable[..., Any]) -> None:
    with pytest.raises(BackendArgumentError, match="broadcast: src is 1"):
        mpicomm.broadcast(np.zeros(2), src=1)
    with pytest.raises(ArgumentError, match="broadcast: tensor"):
        mpicomm.broadcast(_read_only(2), 0)
    with pytest.raises(TypeError):
        checked(np.zeros(2), 0, None, False)  # four parameters: not a call of the door's
