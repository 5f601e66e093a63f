"""Honest senders over the payload cap, and a control text whose rest is too long to receive.

The cap (``MPICOMM_MAX_PAYLOAD``, read once per process into ``control._Cap.value``) is set small on
every rank here. A source whose own message passes it must find that out itself, before it sends
anything: every rank then raises the same error, and none is left waiting for buffers that a
receiver refused to take.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import CommunicationError, ObjectCollectiveError
from mpicomm.core import control

#: The cap set for these tests, in bytes; every payload sent is past it.
CAP = 64 << 10
BIG = 1 << 20


@pytest.fixture(autouse=True)
def small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control._Cap, "value", CAP)


def same_everywhere(text: str) -> None:
    """Every rank of the world holds the same ``text`` (compared by a digest, without pickle)."""
    digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
    every = np.empty((MPI.COMM_WORLD.Get_size(), digest.size), np.uint8)
    MPI.COMM_WORLD.Allgather(digest, every)
    assert (every == digest).all(), text


def big(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, BIG, dtype=np.uint8)


@pytest.mark.parametrize("where", ["out_of_band", "in_stream"])
def test_a_broadcast_past_the_cap_raises_on_every_rank(where: str, world: mpicomm.ProcessGroup) -> None:
    payload: Any = big(1) if where == "out_of_band" else big(1).tobytes().hex()[:BIG]
    objs = [{"a": payload}] if world.rank() == 0 else [None]
    with pytest.raises(ObjectCollectiveError, match="MPICOMM_MAX_PAYLOAD") as err:
        mpicomm.broadcast_object_list(objs, src=0)
    same_everywhere(str(err.value))
    # the group still works: a small broadcast after the refused one
    ok = [7] if world.rank() == 0 else [None]
    mpicomm.broadcast_object_list(ok, src=0)
    assert ok == [7]


def test_a_scatter_past_the_cap_raises_on_every_rank(world: mpicomm.ProcessGroup) -> None:
    n = world.size()
    inputs = [{"a": big(s)} for s in range(n)] if world.rank() == 0 else None
    with pytest.raises(ObjectCollectiveError, match="MPICOMM_MAX_PAYLOAD") as err:
        mpicomm.scatter_object_list([None], inputs, src=0)
    same_everywhere(str(err.value))
    out: list[Any] = [None]
    mpicomm.scatter_object_list(out, list(range(n)) if world.rank() == 0 else None, src=0)
    assert out == [world.rank()]


@pytest.mark.mpi(min_size=2)
def test_a_send_past_the_cap_raises_on_both_ranks(world: mpicomm.ProcessGroup) -> None:
    if world.rank() in (0, 1):
        with pytest.raises(ObjectCollectiveError, match="MPICOMM_MAX_PAYLOAD") as err:
            if world.rank() == 0:
                mpicomm.send_object_list([big(3)], dst=1)
            else:
                mpicomm.recv_object_list([None], src=0)
        text = str(err.value)
    else:
        text = ""
    digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
    if world.rank() == 1:
        world.internal.Send([digest, MPI.BYTE], 0, 77)
    elif world.rank() == 0:
        other = np.empty(32, np.uint8)
        world.internal.Recv([other, MPI.BYTE], 1, 77)
        assert (other == digest).all()
    MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi(min_size=2)
def test_a_text_rest_longer_than_claimed_is_received_and_dropped(
    world: mpicomm.ProcessGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root claims a short text but sends a longer rest (within the cap): refused, the rest received.

    A rest left matched but never received would never complete its (rendezvous-sized) send.
    """
    comm, side, limit, huge = world.comm, world.internal, 1000, 4 << 20
    monkeypatch.setattr(control._Cap, "value", 2 * huge)  # the rest is past the text limit, not the cap
    if world.rank() == 0:
        head = control._slot(0, b"x" * (control.SLOT - 16 + 10))  # claims 10 bytes past its slot
        comm.Bcast([head, MPI.BYTE], 0)
        request = side.Isend([np.ones(huge, np.uint8), MPI.BYTE], 1, control.TEXT_TAG)
        deadline = time.monotonic() + 20
        while not request.Test() and time.monotonic() < deadline:
            time.sleep(0.01)
        done = request.Test()
        if not done:
            request.Cancel()
        assert done, "the over-long rest was never received"
    elif world.rank() == 1:
        with pytest.raises(CommunicationError, match=f"sent {huge}"):
            control.bcast_text(comm, b"", 0, limit=limit, side=side)
    else:
        comm.Bcast([np.empty(control.SLOT, np.uint8), MPI.BYTE], 0)
    MPI.COMM_WORLD.Barrier()
    out: list[Any] = [None] * world.size()
    mpicomm.all_gather_object(out, world.rank())  # the group still works
    assert out == list(range(world.size()))
