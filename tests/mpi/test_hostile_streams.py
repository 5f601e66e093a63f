"""A real hostile rank sends forged bytes; every honest rank refuses them in bounded work (issue 22, item 3).

Group rank 0 speaks mpicomm's wire format by hand (no mocks): amplifying pickle streams inside a
broadcast, an object header claiming 8 GiB, KJT per-key counts that do not add up or pass the cap,
validation records nested 30,000 deep, with a row of None, or with a length word that lies. Every
other rank, honest, must raise an mpicomm error (never ``RecursionError``, ``TypeError``, numpy's
``MemoryError`` or an MPI truncation that ends the job), with validation mode on and off, and
must still be in step afterwards.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Callable, Iterator
from typing import Any

import hostile_streams
import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import CommunicationError, CrossRankMismatchError, ObjectCollectiveError, UnpicklingRefusedError
from mpicomm.core import validation
from mpicomm.core.control import SLOT, TEXT_TAG, allgather_texts
from mpicomm.jagged import KeyedJaggedArray, KJTAllToAll
from mpicomm.jagged.kjt import _dtypes
from mpicomm.objects.wire import ENVELOPE

pytestmark = pytest.mark.mpi(min_size=2)
#: The hostile streams that stay within the budget (loaded), and the rest (refused).
LOADED = {"300 x list(512-byte bytes)", "190 x list(range(700)), 1 KB"}
REFUSED = set(hostile_streams.STREAMS) - LOADED
I8 = np.int64


@pytest.fixture(params=[False, True], ids=["plain", "validating"])
def validating(request: pytest.FixtureRequest, world: mpicomm.ProcessGroup) -> Iterator[bool]:
    mpicomm.set_validation(request.param)
    yield request.param
    mpicomm.set_validation(False)
    MPI.COMM_WORLD.Barrier()
    x = np.ones(2)  # still in step: a collective that works
    mpicomm.all_reduce(x)
    assert x.tolist() == [float(world.size())] * 2


def _hostile(world: mpicomm.ProcessGroup) -> bool:
    return world.rank() == 0


def _same_everywhere_but_0(message: str) -> None:
    got = [m.decode() for _, m in allgather_texts(MPI.COMM_WORLD, 0, message.encode())]
    assert len(set(got[1:])) == 1, got


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# -- amplifying streams inside a broadcast ----------------------------------------------------------


def _send_stream(g: mpicomm.ProcessGroup, stream: bytes, validating: bool, loaded: bool) -> None:
    """Rank 0's side of broadcast_object_list with ``stream`` as the one object, then the agreement.

    In validation mode at ``MPI_THREAD_MULTIPLE`` a held call that returns also agrees whether its
    group was raced on any rank (``mpicomm.core.busy._agree``: one Allreduce of one int64 on the
    private communicator; skipped where the call raised): rank 0 answers "not raced" where the
    honest ranks' call returns (``loaded``).
    """
    if validating:
        validation.check(g, "broadcast_object_list", {"src": 0})
    env = np.zeros(ENVELOPE, np.uint8)
    words = np.array([0, 1, len(stream), 0, len(stream)], I8).view(np.uint8)
    env[: words.size] = words
    env[words.size : words.size + len(stream)] = np.frombuffer(stream, np.uint8)
    g.comm.Bcast([env, MPI.BYTE], 0)
    flag = np.zeros(1, I8)
    g.comm.Allreduce(MPI.IN_PLACE, flag, MPI.MAX)
    if flag[0]:
        allgather_texts(g.comm, 0, b"", side=g.internal)
    if validating and loaded and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
        lowest = np.array([g.size()], I8)
        g.internal.Allreduce(MPI.IN_PLACE, lowest, MPI.MIN)


@pytest.mark.parametrize("name", sorted(hostile_streams.STREAMS))
def test_an_amplifying_stream_is_refused_by_every_honest_rank(
    world: mpicomm.ProcessGroup, validating: bool, name: str
) -> None:
    stream = hostile_streams.STREAMS[name]()
    if len(stream) > ENVELOPE - 40:
        stream = stream[: ENVELOPE - 40]  # the deep tuple: cut, still hostile (and then malformed)
    message = ""
    if _hostile(world):
        _send_stream(world, stream, validating, name not in REFUSED)
    else:
        got = [None]
        try:
            mpicomm.broadcast_object_list(got, src=0, safe=True)
            outcome = "loaded"
        except UnpicklingRefusedError as exc:
            outcome, message = "refused", str(exc)
        assert outcome == ("refused" if name in REFUSED else "loaded"), message
    _same_everywhere_but_0(message)


# -- a forged object header ------------------------------------------------------------------------


def test_an_object_header_claiming_8_gib_is_refused_before_allocating(
    world: mpicomm.ProcessGroup, validating: bool
) -> None:
    claim = 8 << 30
    message = ""
    if _hostile(world):
        if validating:
            validation.check(world, "broadcast_object_list", {"src": 0})
        env = np.zeros(ENVELOPE, np.uint8)
        words = np.array([0, 1, claim, 0, claim], I8).view(np.uint8)
        env[: words.size] = words
        world.comm.Bcast([env, MPI.BYTE], 0)
    else:
        before = _rss_kib()
        with pytest.raises(ObjectCollectiveError) as info:
            mpicomm.broadcast_object_list([None], src=0, safe=True)
        message = str(info.value)
        assert str(claim) in message and "MPICOMM_MAX_PAYLOAD" in message and "group rank 0" in message
        assert _rss_kib() - before < 256 << 10, "the victim allocated for the claim"
    _same_everywhere_but_0(message)


# -- forged KJT counts -----------------------------------------------------------------------------


def _kja(w: int) -> KeyedJaggedArray:
    keys = [f"k{i}" for i in range(w)]
    return KeyedJaggedArray(keys, np.arange(2 * w, dtype=np.int64), lengths=np.full(w, 2, np.int64))


def _forge_kjt(g: mpicomm.ProcessGroup, forge: Callable[[np.ndarray, Any], None], validating: bool) -> None:
    """Rank 0's side of a first KJTAllToAll call, its counts message changed by ``forge``."""
    w = g.size()
    a2a, kja = KJTAllToAll([1] * w), _kja(w)
    if validating:
        agree = {"splits": a2a.splits, "stagger": 1, "keys": kja.keys()}
        validation.check(g, "KJTAllToAll", {**agree, "dtypes": _dtypes(kja), "weighted": False, "vbe": False})
    a2a._agree()
    lay = a2a._layout
    header, _ = a2a._send_plan(kja).header(lay, kja._wide_offsets(), kja._values.shape[0])
    forge(header, lay)
    g.internal.Alltoall([header, MPI.INT64_T], [np.empty_like(header), MPI.INT64_T])


FORGED: dict[str, tuple[Callable[[np.ndarray, Any], None], tuple[str, ...]]] = {
    "per-key counts past the sender's total": (
        lambda h, lay: h.__setitem__((slice(None), lay.values0), 1000),
        ("rank 0 sends 1000 values", "holds"),
    ),
    "per-key counts past the cap": (
        lambda h, lay: (
            h.__setitem__((slice(None), lay.values0), 2**31),
            h.__setitem__((slice(None), lay.total_col), 2**40),
        ),
        ("payload cap", "MPICOMM_MAX_PAYLOAD", "rank 0"),
    ),
    "a negative per-key count": (
        lambda h, lay: h.__setitem__((slice(None), lay.values0), -5),
        ("rank 0",),
    ),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_kjt_per_key_counts_raise_communication_error_naming_the_sender(
    world: mpicomm.ProcessGroup, validating: bool, case: str
) -> None:
    forge, words = FORGED[case]
    message = ""
    if _hostile(world):
        _forge_kjt(world, forge, validating)
    else:
        before = _rss_kib()
        with pytest.raises(CommunicationError) as info:
            KJTAllToAll([1] * world.size())(_kja(world.size())).wait()
        message = str(info.value)
        for word in words:
            assert word in message, message
        assert _rss_kib() - before < 256 << 10
    _same_everywhere_but_0(message)


def test_kjt_splits_past_the_cap_raise_a_clear_error_at_construction(world: mpicomm.ProcessGroup) -> None:
    with pytest.raises(mpicomm.ArgumentError, match=r"KJTAllToAll: splits .* ask for 1099511627776 keys"):
        KJTAllToAll([2**40] + [0] * (world.size() - 1))


# -- crafted validation records --------------------------------------------------------------------


def _record(w: int) -> dict[str, bytes]:
    nested = "[" * 30_000 + "]" * 30_000
    return {
        "nested 30,000 deep": json.dumps(["barrier", {"x": 0}, None, None]).replace("0", nested, 1).encode(),
        "a row of None": json.dumps(["all_to_all", {}, [None] * w, [0] * w]).encode(),
        "rows on one side only": json.dumps(["all_to_all", {}, [0] * w, None]).encode(),
        "not a list": b'{"a": 1}',
        "deep field": json.dumps(["barrier", {"x": json.loads("[" * 900 + "]" * 900)}, None, None]).encode(),
    }


@pytest.mark.parametrize(
    "case", ["nested 30,000 deep", "a row of None", "rows on one side only", "not a list", "deep field"]
)
def test_a_crafted_validation_record_raises_a_mismatch_never_a_builtin_error(
    world: mpicomm.ProcessGroup, case: str
) -> None:
    record = _record(world.size())[case]
    message = ""
    mpicomm.set_validation(True)
    try:
        if _hostile(world):
            allgather_texts(world.comm, 0, record, 1 << 20, world.internal)
        else:
            with pytest.raises((CrossRankMismatchError, CommunicationError)) as info:
                mpicomm.barrier()
            message = str(info.value)
            assert "group rank 0" in message or "rank 0" in message, message
    finally:
        mpicomm.set_validation(False)
    _same_everywhere_but_0(message)


def _lying_slot(g: mpicomm.ProcessGroup, claimed: int, sent: int) -> None:
    """A validation record whose length word says ``claimed`` bytes; ``sent`` are sent."""
    slot = np.zeros(SLOT, np.uint8)
    slot[:16].view(I8)[:] = (0, claimed)
    # posted non-blocking, as the library's own exchange is (MPI never matches it with a blocking one)
    g.comm.Iallgather([slot, MPI.BYTE], [np.empty((g.size(), SLOT), np.uint8), MPI.BYTE]).Wait()
    if sent > SLOT - 16:
        rest = np.zeros(sent - (SLOT - 16), np.uint8)
        MPI.Request.Waitall([g.internal.Isend([rest, MPI.BYTE], r, TEXT_TAG) for r in range(1, g.size())])


@pytest.mark.parametrize(("claimed", "sent"), [(300, 5000), (5000, 300 + SLOT), (2**40, 0), (-1, 0)], ids=str)
def test_a_length_word_that_lies_never_reaches_mpi_as_a_truncation(
    world: mpicomm.ProcessGroup, claimed: int, sent: int
) -> None:
    message = ""
    mpicomm.set_validation(True)
    try:
        if _hostile(world):
            _lying_slot(world, claimed, sent)
        else:
            with pytest.raises(CommunicationError, match="rank 0") as info:
                mpicomm.barrier()
            message = str(info.value)
    finally:
        mpicomm.set_validation(False)
    _same_everywhere_but_0(message)


# -- exact dtypes under validation -----------------------------------------------------------------


@pytest.mark.parametrize("pair", [("float16", "float32"), ("float16", "bfloat16"), ("bfloat16", "float32")])
def test_validation_tells_half_dtypes_apart(world: mpicomm.ProcessGroup, pair: tuple[str, str]) -> None:
    import ml_dtypes

    names = {"float16": np.float16, "float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
    mine = pair[0] if world.rank() == 0 else pair[1]
    x = np.ones(4, names[mine])
    mpicomm.set_validation(True)
    try:
        with pytest.raises(CrossRankMismatchError, match="dtype differs") as info:
            mpicomm.all_reduce(x)
        assert pair[0] in str(info.value) and pair[1] in str(info.value)
        assert (x == 1).all()
        y = np.ones(4, names[pair[0]])
        mpicomm.all_reduce(y)  # the same half dtype everywhere still reduces
        assert (y.astype(np.float32) == world.size()).all()
    finally:
        mpicomm.set_validation(False)


def test_jagged_exchanges_tell_one_byte_float_types_apart(
    world: mpicomm.ProcessGroup, validated: bool
) -> None:
    """float8_e4m3fn and float8_e5m2fnuz both print as ``<V1``: the fingerprint uses their names too."""
    import ml_dtypes

    w = world.size()
    kind = ml_dtypes.float8_e4m3fn if world.rank() == 0 else ml_dtypes.float8_e5m2fnuz
    values, lengths = np.ones(w, kind), np.ones(w, np.int64)
    words = "jagged_all_to_all: ranks disagree about dtypes"
    if validated:  # the validation record names them too
        words = r"value shape differs: rank 0: \['int64', '<V1:float8_e4m3fn'.*'<V1:float8_e5m2fnuz'"
    with pytest.raises(CrossRankMismatchError, match=words):
        mpicomm.jagged_all_to_all(values, lengths, [1] * w)
    same = np.arange(w).astype(ml_dtypes.float8_e4m3fn)
    got = mpicomm.jagged_all_to_all(same, lengths, [1] * w)
    assert isinstance(got, mpicomm.JaggedResult)
    assert got.values.astype(np.float32).tolist() == [float(world.rank())] * w
