"""Safe mode against a hostile rank: nothing mpicomm receives is unpickled with plain pickle.

Two angles, as an attacker would try them:

* a tripwire replaces ``mpi4py.MPI.pickle.loads`` and ``pickle.loads`` while every error path of the
  object collectives, validation mode and KJTAllToAll runs in safe mode: it must never fire;
* group rank 0 speaks mpicomm's wire format by hand and puts a ``__reduce__`` payload (which would
  create a marker file) into the data and into every control message; every other rank, honest and
  in safe mode, must refuse it with an mpicomm error, and the marker must not exist.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import CrossRankMismatchError, MpicommError, ObjectCollectiveError
from mpicomm.core.control import allgather_texts, bcast_text
from mpicomm.jagged import KeyedJaggedArray, KJTAllToAll
from mpicomm.objects.wire import ENVELOPE

# rank 0 speaks the wire by hand, outside validation's exchange: each test turns validation on itself
# where it means to
pytestmark = pytest.mark.usefixtures("validation_off")

I8 = np.int64


class Payload:
    """Unpickled with plain pickle, this creates the file ``path`` (harmless, and easy to see)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


@contextlib.contextmanager
def tripwire() -> Iterator[list[str]]:
    """Count every plain unpickle (mpi4py's lowercase calls and ``pickle.loads``) while inside."""
    fired: list[str] = []
    saved_pickle = pickle.loads
    protocol, threshold = MPI.pickle.PROTOCOL, MPI.pickle.THRESHOLD

    def mpi_loads(data: Any) -> Any:
        fired.append("mpi4py.MPI.pickle.loads")
        return saved_pickle(data)

    def pickle_loads(*args: Any, **kwargs: Any) -> Any:
        fired.append("pickle.loads")
        return saved_pickle(*args, **kwargs)

    MPI.pickle.__init__(pickle.dumps, mpi_loads, protocol, threshold)  # type: ignore[misc]
    pickle.loads = pickle_loads  # type: ignore[assignment]
    try:
        yield fired
    finally:
        MPI.pickle.__init__(pickle.dumps, saved_pickle, protocol, threshold)  # type: ignore[misc]
        pickle.loads = saved_pickle


@pytest.fixture
def safe() -> Iterator[None]:
    mpicomm.set_safe_unpickling(True)
    yield
    mpicomm.set_safe_unpickling(False)
    mpicomm.set_validation(False)


def raises_everywhere(call: Callable[[], Any], cls: type[BaseException] = MpicommError) -> str:
    with pytest.raises(cls) as info:
        call()
    return str(info.value)


def _last(world: mpicomm.ProcessGroup) -> bool:
    return world.rank() == world.size() - 1


def _error_paths(world: mpicomm.ProcessGroup) -> None:
    """Every error path that sends a control message, in safe mode."""
    lock = threading.Lock()
    w = world.size()
    # an object that cannot be pickled, on one rank (gathers' error exchange, status agreement)
    raises_everywhere(lambda: mpicomm.all_gather_object([None] * w, lock if _last(world) else 1))
    out = [None] * w if world.rank() == 0 else None
    raises_everywhere(lambda: mpicomm.gather_object(lock if _last(world) else 1, out, dst=0))
    # on the source of a broadcast and of a scatter (the scatter's error broadcast)
    objs = [lock] if world.rank() == 0 else [None]
    raises_everywhere(lambda: mpicomm.broadcast_object_list(objs, src=0))
    ins = [lock] * w if world.rank() == 0 else None
    raises_everywhere(lambda: mpicomm.scatter_object_list([None], ins, src=0))
    # an unpickle failure: safe mode refuses a class
    raises_everywhere(lambda: mpicomm.all_gather_object([None] * w, Payload("/nonexistent/x")))
    # validation mismatches, in the object calls, the dense calls and KJTAllToAll
    mpicomm.set_validation(True)
    one: list[Any] = [1]
    raises_everywhere(lambda: mpicomm.broadcast_object_list(one, src=world.rank()), CrossRankMismatchError)
    x = np.ones(2, np.float64 if world.rank() == 0 else np.float32)
    raises_everywhere(lambda: mpicomm.all_reduce(x), CrossRankMismatchError)
    keys = ["a", "b", "c"] if world.rank() == 0 else ["a", "b", "d"]
    kja = KeyedJaggedArray(keys, np.arange(3, dtype=np.int64), lengths=np.ones(3, np.int64))
    raises_everywhere(lambda: KJTAllToAll([3] + [0] * (w - 1))(kja).wait(), CrossRankMismatchError)
    # a mistake on one rank only, sent in the validation exchange
    splits = [2] * w if world.rank() == 0 else [1] * w
    raises_everywhere(lambda: mpicomm.all_to_all_single(np.empty(w), np.ones(w), splits, [1] * w))
    mpicomm.set_validation(False)


@pytest.mark.mpi(min_size=2)
def test_error_paths_in_safe_mode_never_unpickle_with_plain_pickle(
    world: mpicomm.ProcessGroup, safe: None
) -> None:
    with tripwire() as fired:
        _error_paths(world)
        node = mpicomm.new_node_group()  # its member exchange, too
        assert world.ranks[world.rank()] in node.ranks
        mpicomm.destroy_process_group(node)
    assert fired == []


def _control_exchanges(world: mpicomm.ProcessGroup) -> None:
    """Every public call that exchanges control data (counts, members, records, reports), none of
    them carrying objects: in a working call and, where one exists, a failing one."""
    from mpicomm import jagged_all_to_all

    w, r = world.size(), world.rank()
    mine, every = mpicomm.new_subgroups()  # ranks per node: one int64 word per rank
    assert mine is not None and world.ranks[r] in mine.ranks
    for g in every:
        mpicomm.destroy_process_group(g)
    _, every = mpicomm.new_subgroups(1)
    for g in every:
        mpicomm.destroy_process_group(g)
    _, every = mpicomm.new_subgroups_by_enumeration([[i] for i in range(w)])
    for g in every:
        mpicomm.destroy_process_group(g)
    node = mpicomm.new_node_group()
    mpicomm.destroy_process_group(node)
    mpicomm.monitored_barrier(timeout=30)
    values, lengths = np.arange(w, dtype=np.float64), np.ones(w, np.int64)
    got = jagged_all_to_all(values, lengths, [1] * w)
    assert got is not None and not isinstance(got, mpicomm.Work)
    assert got.values.tolist() == [float(r)] * w
    odd = values.astype(np.float32) if _last(world) else values
    raises_everywhere(lambda: jagged_all_to_all(odd, lengths, [1] * w), CrossRankMismatchError)
    keys = [f"k{i}" for i in range(w)]
    kja = KeyedJaggedArray(keys, np.full(w, r, np.int64), lengths=np.ones(w, np.int64))
    assert KJTAllToAll([1] * w)(kja).wait().values().tolist() == list(range(w))
    mpicomm.set_validation(True)
    try:
        sub = mpicomm.new_group(list(range(w)))  # the members' record
        mpicomm.destroy_process_group(sub)
        ranks = list(range(w)) if r == 0 else list(range(w - 1))
        raises_everywhere(lambda: mpicomm.new_group(ranks), CrossRankMismatchError)
        mpicomm.barrier()
        x = np.ones(2, np.float16 if _last(world) else np.float32)
        raises_everywhere(lambda: mpicomm.all_reduce(x), CrossRankMismatchError)
        assert KJTAllToAll([1] * w)(kja).wait().values().tolist() == list(range(w))
    finally:
        mpicomm.set_validation(False)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("safe_mode", [True, False], ids=["safe", "not-safe"])
def test_every_control_exchange_never_unpickles_with_plain_pickle(
    world: mpicomm.ProcessGroup, safe_mode: bool
) -> None:
    """Control words are typed whatever safe mode says; object data is unpickled safely in safe mode."""
    mpicomm.set_safe_unpickling(safe_mode)
    try:
        with tripwire() as fired:
            _control_exchanges(world)
            if safe_mode:
                _error_paths(world)
                w = world.size()
                out: list[Any] = [None] * w
                mpicomm.all_gather_object(out, {"r": world.rank()})
                assert out == [{"r": i} for i in range(w)]
                if world.rank() == 0:
                    mpicomm.send_object_list([{"to": 1}], dst=1)
                elif world.rank() == 1:
                    got: list[Any] = [None]
                    assert mpicomm.recv_object_list(got, src=0) == 0 and got == [{"to": 1}]
        assert fired == []
    finally:
        mpicomm.set_safe_unpickling(False)


@pytest.fixture
def marker(world: mpicomm.ProcessGroup) -> Iterator[str]:
    """A path no rank has created yet, the same on every rank."""
    name = tempfile.mkdtemp(prefix="mpicomm-hostile-") if world.rank() == 0 else None
    name = MPI.COMM_WORLD.bcast(name, 0)
    path = os.path.join(name, "payload-ran")
    yield path
    MPI.COMM_WORLD.Barrier()
    if world.rank() == 0:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        os.rmdir(name)


def _envelope(header: list[int], stream: bytes) -> np.ndarray:
    env = np.zeros(ENVELOPE, np.uint8)
    words = np.array(header, I8).view(np.uint8)
    env[: words.size] = words
    env[words.size : words.size + len(stream)] = np.frombuffer(stream, np.uint8)
    return env


def _hostile_bcast_data(g: mpicomm.ProcessGroup, payload: bytes) -> None:
    """Rank 0's side of broadcast_object_list, with the payload as the object, then as the error report."""
    g.comm.Bcast([_envelope([0, 1, len(payload), 0, len(payload)], payload), MPI.BYTE], 0)
    g.comm.Allreduce(MPI.IN_PLACE, np.zeros(1, I8), MPI.MAX)
    allgather_texts(g.comm, 2, payload, side=g.internal)


def _hostile_bcast_error(g: mpicomm.ProcessGroup, payload: bytes) -> None:
    """An error header whose message is the payload."""
    g.comm.Bcast([_envelope([2, 0, len(payload), 0], payload), MPI.BYTE], 0)


def _hostile_gather(g: mpicomm.ProcessGroup, payload: bytes) -> None:
    """all_gather_object's meta exchange: a failure whose report is the payload."""
    g.comm.Allgather(np.array([2, 0, 0], I8), np.empty((g.size(), 3), I8))
    allgather_texts(g.comm, 2, payload, side=g.internal)


def _hostile_scatter(g: mpicomm.ProcessGroup, payload: bytes) -> None:
    """scatter_object_list's rows, then the error broadcast, carrying the payload."""
    rows = np.zeros((g.size(), 4), I8)
    rows[:, 0] = 2
    g.comm.Scatter(rows, np.empty(4, I8), 0)
    bcast_text(g.comm, payload, 0, side=g.internal)


def _hostile_validation(g: mpicomm.ProcessGroup, payload: bytes) -> None:
    """A validation record that is the payload instead of JSON."""
    allgather_texts(g.comm, 0, payload, 1 << 20, g.internal)


def _honest_calls(g: mpicomm.ProcessGroup) -> dict[str, Callable[[], Any]]:
    w = g.size()
    return {
        "bcast data": lambda: mpicomm.broadcast_object_list([None], src=0, safe=True),
        "bcast error": lambda: mpicomm.broadcast_object_list([None], src=0, safe=True),
        "gather": lambda: mpicomm.all_gather_object([None] * w, 1, safe=True),
        "scatter": lambda: mpicomm.scatter_object_list([None], None, src=0, safe=True),
        "validation": lambda: mpicomm.barrier(),
    }


HOSTILE = {
    "bcast data": _hostile_bcast_data,
    "bcast error": _hostile_bcast_error,
    "gather": _hostile_gather,
    "scatter": _hostile_scatter,
    "validation": _hostile_validation,
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("path", sorted(HOSTILE))
def test_a_hostile_rank_speaking_the_wire_format_is_refused_everywhere(
    world: mpicomm.ProcessGroup, marker: str, path: str
) -> None:
    payload = pickle.dumps(Payload(marker), protocol=5)
    mpicomm.set_validation(path == "validation")
    try:
        if world.rank() == 0:
            HOSTILE[path](world, payload)
        else:
            with tripwire() as fired:
                raises_everywhere(_honest_calls(world)[path])
            assert fired == []
    finally:
        mpicomm.set_validation(False)
    MPI.COMM_WORLD.Barrier()
    assert not os.path.exists(marker)


@pytest.mark.mpi(min_size=2)
def test_a_forged_huge_size_claim_gives_the_same_clear_error_everywhere(world: mpicomm.ProcessGroup) -> None:
    if world.rank() == 0:
        world.comm.Bcast([_envelope([0, 1, 2**50, 0, 2**50], b""), MPI.BYTE], 0)
        messages = [""]
    else:
        message = raises_everywhere(
            lambda: mpicomm.broadcast_object_list([None], src=0), ObjectCollectiveError
        )
        assert "2**50" in message or str(2**50) in message
        messages = [message]
    got = MPI.COMM_WORLD.allgather(messages[0])
    assert len(set(got[1:])) == 1


@pytest.mark.mpi(min_size=2)
def test_a_forged_jagged_count_is_refused_before_allocating(world: mpicomm.ProcessGroup) -> None:
    from mpicomm import jagged_all_to_all
    from mpicomm.jagged.wire import _DTYPES, _JAGGED_WORDS, _ROWS, _VALUES, _fingerprint

    w = world.size()
    values, lengths = np.ones(w), np.ones(w, np.int64)
    if world.rank() == 0:
        header = np.zeros((w, _JAGGED_WORDS), I8)
        header[:, _DTYPES] = _fingerprint(str(lengths.dtype), values.dtype.str, values.shape[1:])
        header[:, _ROWS], header[:, _VALUES] = 1, 2**50
        world.internal.Alltoall([header, MPI.INT64_T], [np.empty_like(header), MPI.INT64_T])
    else:
        message = raises_everywhere(
            lambda: jagged_all_to_all(values, lengths, [1] * w), mpicomm.CommunicationError
        )
        assert str(2**50) in message and "rank 0" in message
    MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi(min_size=2)
def test_a_forged_size_in_a_gather_gives_the_same_clear_error_everywhere(world: mpicomm.ProcessGroup) -> None:
    if world.rank() == 0:
        world.comm.Allgather(np.array([0, 2**50, 0], I8), np.empty((world.size(), 3), I8))
        message = ""
    else:
        message = raises_everywhere(
            lambda: mpicomm.all_gather_object([None] * world.size(), 1), ObjectCollectiveError
        )
        assert str(2**50) in message and "group rank 0" in message
    got = MPI.COMM_WORLD.allgather(message)
    assert len(set(got[1:])) == 1


@pytest.mark.mpi(min_size=2)
def test_a_forged_size_in_a_point_to_point_message_is_refused(world: mpicomm.ProcessGroup) -> None:
    from mpicomm.objects.p2p import P2P_TAG

    if world.rank() == 0:
        header = np.array([0, 1, 2**50, 0, 2**50], I8)
        world.internal.Send([header.view(np.uint8), MPI.BYTE], 1, P2P_TAG)
    elif world.rank() == 1:
        message = raises_everywhere(lambda: mpicomm.recv_object_list([None], src=0), ObjectCollectiveError)
        assert str(2**50) in message
    MPI.COMM_WORLD.Barrier()
