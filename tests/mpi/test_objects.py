"""Object collectives on real MPI ranks, checked against the objects every rank builds from a shared seed.

Every failure case asserts that every rank raises the same error: a rank that raised something else,
or hung, fails the test (pytest-timeout ends a hang).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import threading
import types
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import mpicomm
from mpicomm import ArgumentError, ArgumentTypeError, ObjectCollectiveError
from mpicomm import UnpicklingRefusedError as Refused
from mpicomm.objects import pickling
from mpicomm.objects import wire as object_wire
from mpicomm.objects.pickling import OUT_OF_BAND_MIN

NO_CUPY = importlib.util.find_spec("cupy") is None

SAME_ON_EVERY_RANK = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=20,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
TORCH_VECTOR = ["foo", 12, {1: 2}]


def same(a: Any, b: Any) -> bool:
    """Deep equality that compares arrays by dtype, shape and values, and containers by type."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            type(a) is type(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def payload(seed: int, r: int) -> dict[str, Any]:
    """Rank r's object: small values, a small array (in the stream) and a large one (out of band)."""
    rng = np.random.default_rng([seed, r])
    return {
        "rank": r,
        "name": f"rank-{r}",
        "small": rng.integers(-5, 5, size=(3, r + 1)).astype(np.int32),
        "large": rng.standard_normal(OUT_OF_BAND_MIN // 8 + 17 * r),
        "nested": [(r, None), {"x": r * 0.5}],
    }


def raises_everywhere(error: type[Exception], *words: str) -> Any:
    return pytest.raises(error, match=".*".join(words))


# ------------------------------------------------------------------------------ reference vectors


@pytest.mark.mpi(min_size=1)
def test_broadcast_torch_vector_from_every_source(world: mpicomm.ProcessGroup) -> None:
    for src in range(world.size()):
        objs = list(TORCH_VECTOR) if world.rank() == src else [None] * 3
        before = list(objs)
        mpicomm.broadcast_object_list(objs, src=src)
        assert objs == TORCH_VECTOR
        if world.rank() == src:
            assert all(a is b for a, b in zip(objs, before, strict=True))  # the source's own objects


@pytest.mark.mpi(min_size=1)
def test_broadcast_with_arrays_gives_every_rank_equal_writeable_copies(world, rng) -> None:
    glob = [payload(7, r) for r in range(3)]
    objs = [payload(7, r) for r in range(3)] if world.rank() == 0 else [None] * 3
    mpicomm.broadcast_object_list(objs, group_src=0)
    assert same(objs, glob)
    if world.rank() != 0:
        assert objs[0]["large"].flags.writeable


@pytest.mark.mpi(min_size=1)
def test_all_gather_object_torch_vector(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    out: list[Any] = [None] * w + ["untouched"]
    mine = TORCH_VECTOR[r % 3]
    mpicomm.all_gather_object(out, mine)
    assert out == [TORCH_VECTOR[i % 3] for i in range(w)] + ["untouched"]
    if isinstance(mine, dict):
        assert out[r] is not mine  # this rank's entry is a copy too, as in torch


@pytest.mark.mpi(min_size=1)
def test_all_gather_object_with_arrays(world: mpicomm.ProcessGroup) -> None:
    out: list[Any] = [None] * world.size()
    mpicomm.all_gather_object(out, payload(11, world.rank()))
    assert same(out, [payload(11, r) for r in range(world.size())])


@pytest.mark.mpi(min_size=1)
def test_gather_object_to_every_destination(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    for dst in range(w):
        out = [None] * w if r == dst else None
        mpicomm.gather_object(payload(dst, r), out, dst=dst)
        if r == dst:
            assert same(out, [payload(dst, i) for i in range(w)])
        else:
            assert out is None


@pytest.mark.mpi(min_size=1)
def test_scatter_object_list_torch_vector_and_arrays(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    for src in range(w):
        inputs = [[TORCH_VECTOR[i % 3], payload(src, i)] for i in range(w)]
        out: list[Any] = [None, "untouched"]
        mpicomm.scatter_object_list(out, inputs if r == src else None, src=src)
        assert same(out[0], [TORCH_VECTOR[r % 3], payload(src, r)]) and out[1] == "untouched"
        if r == src:
            assert out[0][1]["large"] is not inputs[r][1]["large"]
            assert not np.shares_memory(out[0][1]["large"], inputs[r][1]["large"])


@pytest.mark.mpi(min_size=2)
def test_send_recv_object_list_around_a_ring(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    nxt, prev = (r + 1) % w, (r - 1) % w
    got: list[Any] = [None, None]
    if r == 0:
        mpicomm.send_object_list([r, payload(3, r)], dst=nxt)
        sender = mpicomm.recv_object_list(got)  # from any rank
    else:
        sender = mpicomm.recv_object_list(got, src=prev)
        mpicomm.send_object_list([r, payload(3, r)], dst=nxt)
    assert sender == prev
    assert same(got, [prev, payload(3, prev)])


@pytest.mark.mpi(min_size=2)
def test_objects_on_a_sub_group_use_world_ranks_for_src(world: mpicomm.ProcessGroup) -> None:
    odd = mpicomm.new_group(range(1, world.size(), 2))
    objs = ["from 1", 1] if world.rank() == 1 else [None, None]
    if odd.is_member:
        mpicomm.broadcast_object_list(objs, src=1, group=odd)
        assert objs == ["from 1", 1]
        out = [None] * odd.size()
        mpicomm.all_gather_object(out, world.rank(), group=odd)
        assert out == list(range(1, world.size(), 2))
    else:
        with pytest.warns(UserWarning, match="not a member"):
            assert mpicomm.broadcast_object_list(objs, src=1, group=odd) is None
        assert objs == [None, None]
    mpicomm.destroy_process_group(odd)


@pytest.mark.mpi(min_size=1)
def test_small_chunks_and_the_large_size_fallbacks_move_the_same_objects(world, monkeypatch) -> None:
    """The over-2-GiB code paths (chunked messages, point to point instead of v-collectives), small."""
    monkeypatch.setattr(object_wire, "CHUNK", 1000)
    monkeypatch.setattr(object_wire, "INT_MAX", 5000)
    w, r = world.size(), world.rank()
    objs = [payload(5, 0), "x" * 20000] if r == 0 else [None, None]
    mpicomm.broadcast_object_list(objs)
    assert same(objs, [payload(5, 0), "x" * 20000])
    out: list[Any] = [None] * w
    mpicomm.all_gather_object(out, payload(5, r))
    assert same(out, [payload(5, i) for i in range(w)])
    out2 = [None] * w if r == w - 1 else None
    mpicomm.gather_object(payload(6, r), out2, dst=w - 1)
    assert r != w - 1 or same(out2, [payload(6, i) for i in range(w)])
    one: list[Any] = [None]
    mpicomm.scatter_object_list(one, [payload(8, i) for i in range(w)] if r == 0 else None)
    assert same(one[0], payload(8, r))


# ------------------------------------------------------------------------------ property tests

SCALAR_DTYPES = ["?", "i1", "u2", "i4", "i8", "f2", "f4", "f8", "c8", "c16", ">i4", "<U3"]


def _array(spec: tuple[str, tuple[int, ...], int, bool]) -> np.ndarray:
    dtype, shape, seed, fortran = spec
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 100, size=shape).astype(dtype)
    return np.asfortranarray(x) if fortran else x


arrays = st.tuples(
    st.sampled_from(SCALAR_DTYPES),
    st.one_of(
        st.lists(st.integers(0, 4), max_size=3).map(tuple),
        st.sampled_from([(OUT_OF_BAND_MIN // 4 + 1,), (3, OUT_OF_BAND_MIN // 8)]),  # out of band
    ),
    st.integers(0, 2**32 - 1),
    st.booleans(),
).map(_array)
leaves = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
    arrays,
)
nested = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=4),
    ),
    max_leaves=12,
)


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_broadcast_of_nested_structures_equals_the_source(world, data) -> None:
    glob = data.draw(st.lists(nested, min_size=1, max_size=4), label="objects")
    src = data.draw(st.integers(0, world.size() - 1), label="src")
    objs = list(glob) if world.rank() == src else [None] * len(glob)
    mpicomm.broadcast_object_list(objs, src=src)
    assert same(objs, glob)


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_gathers_and_scatter_of_nested_structures(world, data) -> None:
    w, r = world.size(), world.rank()
    glob = data.draw(st.lists(nested, min_size=w, max_size=w), label="one object per rank")
    root = data.draw(st.integers(0, w - 1), label="root")
    out: list[Any] = [None] * w
    mpicomm.all_gather_object(out, glob[r])
    assert same(out, glob)
    got = [None] * w if r == root else None
    mpicomm.gather_object(glob[r], got, dst=root)
    assert r != root or same(got, glob)
    one: list[Any] = [None]
    mpicomm.scatter_object_list(one, list(glob) if r == root else None, src=root)
    assert same(one[0], glob[r])


# ------------------------------------------------------------------------------ symmetric failures


def _local_class() -> object:
    class Local:
        pass

    return Local()


UNPICKLABLE = {
    "lock": (threading.Lock, "TypeError: cannot pickle '_thread.lock' object"),
    "lambda": (lambda: lambda x: x, "lambda"),
    "local class": (_local_class, "local object"),
}


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", list(UNPICKLABLE))
def test_unpicklable_element_raises_the_same_error_on_every_rank(world, kind: str) -> None:
    make, cause = UNPICKLABLE[kind]
    src = world.size() - 1
    objs = ["ok", make()] if world.rank() == src else [None, None]
    before = list(objs)
    with raises_everywhere(
        ObjectCollectiveError, r"broadcast_object_list: object_list\[1\]", f"rank {src}", cause
    ):
        mpicomm.broadcast_object_list(objs, src=src)
    assert objs == before or world.rank() == src
    out: list[Any] = [None] * world.size()
    bad = world.rank() == src
    with raises_everywhere(ObjectCollectiveError, r"all_gather_object: obj\[0\]", f"on rank {src}", cause):
        mpicomm.all_gather_object(out, make() if bad else "fine")
    assert out == [None] * world.size()  # nothing was written on any rank
    with raises_everywhere(ObjectCollectiveError, "gather_object", f"on rank {src}", cause):
        mpicomm.gather_object(make() if bad else 1, [None] * world.size() if world.rank() == 0 else None)
    inputs = ["a"] * world.size()
    inputs[-1] = make()
    with raises_everywhere(ObjectCollectiveError, rf"scatter_object_input_list\[{world.size() - 1}\]", cause):
        mpicomm.scatter_object_list([None], inputs if world.rank() == 0 else None, src=0)


def _only_on(rank: int) -> str:
    if mpicomm.get_rank() != rank:
        raise RuntimeError(f"this object exists only on rank {rank}")
    return "rebuilt"


class OnlyOnSource:
    """Unpickles on its own rank only, like an object of a class that the other ranks lack."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return _only_on, (self.rank,)


@pytest.mark.mpi(min_size=2)
def test_receiver_that_cannot_unpickle_makes_every_rank_raise(world) -> None:
    objs = [1, OnlyOnSource(0)] if world.rank() == 0 else [None, None]
    with raises_everywhere(
        ObjectCollectiveError,
        r"broadcast_object_list: object_list\[1\] from rank 0 cannot be unpickled on rank 1",
        "RuntimeError: this object exists only on rank 0",
    ):
        mpicomm.broadcast_object_list(objs, src=0)
    assert world.rank() == 0 or objs == [None, None]
    out: list[Any] = [None] * world.size()
    with raises_everywhere(ObjectCollectiveError, "all_gather_object: the object from rank 1", "on rank 0"):
        mpicomm.all_gather_object(out, OnlyOnSource(world.rank()))


@pytest.mark.mpi(min_size=2)
def test_class_whose_module_exists_only_on_the_source(world) -> None:
    name = "mpicomm_test_module_only_on_rank0"
    module = types.ModuleType(name)

    class Private:
        pass

    Private.__module__, Private.__qualname__ = name, "Private"
    module.Private = Private  # type: ignore[attr-defined]
    if world.rank() == 0:
        sys.modules[name] = module
    try:
        objs = [Private()] if world.rank() == 0 else [None]
        with raises_everywhere(
            ObjectCollectiveError, "cannot be unpickled on rank 1", "ModuleNotFoundError", name
        ):
            mpicomm.broadcast_object_list(objs)
    finally:
        sys.modules.pop(name, None)


@pytest.mark.mpi(min_size=1)
def test_empty_list_on_the_source_raises_on_every_rank(world) -> None:
    objs: list[Any] = [] if world.rank() == 0 else [None]
    with raises_everywhere(
        ArgumentError, "broadcast_object_list: object_list is empty on the sending rank 0"
    ):
        mpicomm.broadcast_object_list(objs)


@pytest.mark.mpi(min_size=2)
def test_lengths_that_differ_raise_on_every_rank(world) -> None:
    r, w = world.rank(), world.size()
    objs = ["a", "b"] if r == 0 else [None] * (3 if r == w - 1 else 2)
    with raises_everywhere(
        ArgumentError, f"object_list has 3 entries on rank {w - 1} but 2 on the source rank 0", "same length"
    ):
        mpicomm.broadcast_object_list(objs)
    short: list[Any] = [None] * (w - 1 if r == 1 else w)
    with raises_everywhere(ArgumentError, "all_gather_object: object_list has", "on rank 1", f"at least {w}"):
        mpicomm.all_gather_object(short, r)
    with raises_everywhere(
        ArgumentError, "gather_object: object_gather_list is given on rank 1", "expected None"
    ):
        mpicomm.gather_object(r, [None] * w, dst=0)
    with raises_everywhere(
        ArgumentError, "gather_object: object_gather_list is missing on the destination rank 0"
    ):
        mpicomm.gather_object(r, None, dst=0)
    with raises_everywhere(ArgumentError, "scatter_object_list: scatter_object_input_list is a list of 1"):
        mpicomm.scatter_object_list([None], ["only one"] if r == 0 else None, src=0)
    with raises_everywhere(ArgumentError, "scatter_object_output_list is empty on rank 1"):
        mpicomm.scatter_object_list([] if r == 1 else [None], list(range(w)) if r == 0 else None, src=0)


@pytest.mark.mpi(min_size=1)
def test_the_group_still_works_after_every_failure(world) -> None:
    """A failed call leaves no message behind: the next calls pair up as usual."""
    objs = [threading.Lock()] if world.rank() == 0 else [None]
    with pytest.raises(ObjectCollectiveError):
        mpicomm.broadcast_object_list(objs)
    out: list[Any] = [None] * world.size()
    mpicomm.all_gather_object(out, world.rank())
    assert out == list(range(world.size()))


# ------------------------------------------------------------------------------ safe mode


class RunsCommand:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (self.command,)


class Settings:
    def __init__(self, lr: float) -> None:
        self.lr = lr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and other.lr == self.lr


@pytest.mark.mpi(min_size=2)
def test_safe_mode_refuses_a_command_payload_on_every_rank(world) -> None:
    path = [os.path.join(tempfile.gettempdir(), f"mpicomm-safe-{os.getpid()}")]
    mpicomm.broadcast_object_list(path)  # one marker path for all ranks (rank 0's pid)
    marker = path[0]
    objs = [RunsCommand(f"touch {marker}")] if world.rank() == 0 else [None]
    with raises_everywhere(Refused, "cannot be unpickled on rank 1", "refused to unpickle posix.system"):
        mpicomm.broadcast_object_list(objs, safe=True)
    assert not os.path.exists(marker)
    out: list[Any] = [None] * world.size()
    with raises_everywhere(Refused, "refused to unpickle posix.system"):
        mpicomm.all_gather_object(out, RunsCommand(f"touch {marker}") if world.rank() == 1 else 0, safe=True)
    assert not os.path.exists(marker)


@pytest.fixture
def allow_list_restored() -> Any:
    """Whatever a test adds with allow_unpickle is taken off the allow-list again afterwards."""
    before = set(pickling._ALLOWED)
    yield
    pickling._ALLOWED.intersection_update(before)


@pytest.mark.mpi(min_size=2)
def test_safe_mode_global_setting_and_allow_list(world, allow_list_restored) -> None:
    objs = [Settings(0.1), {"a": np.ones(3)}] if world.rank() == 0 else [None, None]
    mpicomm.set_safe_unpickling(True)
    try:
        with raises_everywhere(Refused, "test_objects.Settings", r"allow_unpickle\(Settings\)"):
            mpicomm.broadcast_object_list(objs)
        mpicomm.allow_unpickle(Settings)
        mpicomm.broadcast_object_list(objs)
    finally:
        mpicomm.set_safe_unpickling(False)
    assert objs[0] == Settings(0.1) and same(objs[1], {"a": np.ones(3)})


@pytest.mark.mpi(min_size=2)
def test_allow_list_is_restored_after_the_previous_test(world) -> None:
    assert (Settings.__module__, Settings.__qualname__) not in pickling._ALLOWED
    objs = [Settings(0.2)] if world.rank() == 0 else [None]
    with raises_everywhere(Refused, "test_objects.Settings"):
        mpicomm.broadcast_object_list(objs, safe=True)


class FakePointers:
    """Unpickles as an object array whose one element is the pointer 0x4141414141414141 (the attack)."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return np.ndarray, ((1,), np.dtype("O"), b"A" * 8)


@pytest.mark.mpi(min_size=2)
def test_safe_mode_refuses_an_object_array_made_from_raw_bytes_on_every_rank(world) -> None:
    objs = [FakePointers()] if world.rank() == 0 else [None]
    with raises_everywhere(Refused, "cannot be unpickled on rank 1", "object dtype"):
        mpicomm.broadcast_object_list(objs, safe=True)
    assert world.rank() == 0 or objs == [None]
    out: list[Any] = [None] * world.size()
    with raises_everywhere(Refused, "the object from rank 0", "object dtype"):
        mpicomm.all_gather_object(
            out, np.array([None, 1], dtype=object) if world.rank() == 0 else 0, safe=True
        )


# ------------------------------------------------------------------------------ bad arguments


@pytest.mark.mpi(min_size=1)
def test_bad_arguments_raise_clear_errors(world) -> None:
    w = world.size()
    with pytest.raises(
        ArgumentTypeError, match="broadcast_object_list: object_list is a tuple; expected a list"
    ):
        mpicomm.broadcast_object_list(("a",))  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=rf"broadcast_object_list: src is {w}; expected 0 <= src < {w}"):
        mpicomm.broadcast_object_list([1], src=w)
    with pytest.raises(ArgumentError, match="both src=0 and group_src=0 given"):
        mpicomm.broadcast_object_list([1], src=0, group_src=0)
    with pytest.raises(
        ArgumentTypeError, match="all_gather_object: safe is 'yes'; expected True, False or None"
    ):
        mpicomm.all_gather_object([None] * w, 1, safe="yes")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="gather_object: device is 'tpu'"):
        mpicomm.gather_object(1, None, device="tpu")
    with pytest.raises(
        ArgumentTypeError, match="gather_object: object_gather_list is a dict; expected a list or None"
    ):
        mpicomm.gather_object(1, {})  # type: ignore[arg-type]
    with pytest.raises(
        ArgumentTypeError, match="scatter_object_list: scatter_object_output_list is a NoneType"
    ):
        mpicomm.scatter_object_list(None, [1] * w)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="send_object_list: dst is this rank"):
        mpicomm.send_object_list([1], dst=world.rank())
    with pytest.raises(ArgumentError, match="send_object_list: no dst given"):
        mpicomm.send_object_list([1])
    mpicomm.barrier()  # every rank is still in step


@pytest.mark.mpi(min_size=1)
@pytest.mark.skipif(not NO_CUPY, reason="cupy is installed here")
def test_cuda_device_without_cupy_raises_on_every_rank(world) -> None:
    objs = ["x"] if world.rank() == 0 else [None]
    with pytest.raises(ArgumentError, match="broadcast_object_list: device is 'cuda', which needs cupy"):
        mpicomm.broadcast_object_list(objs, device="cuda")
    mpicomm.broadcast_object_list(objs, device="cpu")
    assert objs == ["x"]


@pytest.mark.mpi(min_size=2)
def test_validation_mode_catches_ranks_that_disagree_on_the_source(world) -> None:
    objs = ["x"] if world.rank() == 0 else [None]
    mpicomm.set_validation(True)
    try:
        with raises_everywhere(
            mpicomm.CrossRankMismatchError, "broadcast_object_list: validation", "src differs"
        ):
            mpicomm.broadcast_object_list(objs, src=0 if world.rank() == 0 else 1)
        with raises_everywhere(mpicomm.CrossRankMismatchError, "ranks called different functions"):
            if world.rank() == 0:
                mpicomm.gather_object(1, [None] * world.size())
            else:
                mpicomm.all_gather_object([None] * world.size(), 1)
        mpicomm.broadcast_object_list(objs, src=0)
    finally:
        mpicomm.set_validation(False)
    assert objs == ["x"]


# ------------------------------------------------------------------------------ problems on one rank only


def _call(fn: str, world: mpicomm.ProcessGroup, bad: int, arg: str) -> None:
    """Call ``fn`` on every rank with a bad ``arg`` on rank ``bad`` only; rank 0 is the source/destination."""
    w, r = world.size(), world.rank()
    mine = r == bad
    kw: dict[str, Any] = {}
    if arg == "device":
        kw["device"] = "cuda" if mine else None
    if arg == "safe":
        kw["safe"] = "yes" if mine else None
    wrong = arg == "list" and mine
    if fn == "broadcast_object_list":
        objs = [payload(1, 0), "x"] if r == 0 else [None, None]
        mpicomm.broadcast_object_list(None if wrong else objs, src=0, **kw)  # type: ignore[arg-type]
    elif fn == "all_gather_object":
        mpicomm.all_gather_object(tuple([None] * w) if wrong else [None] * w, payload(2, r), **kw)  # type: ignore[arg-type]
    elif fn == "gather_object":
        out = [None] * w if r == 0 else None
        mpicomm.gather_object(payload(3, r), {} if wrong else out, dst=0, **kw)  # type: ignore[arg-type]
    else:
        inputs = [payload(4, i) for i in range(w)] if r == 0 else None
        mpicomm.scatter_object_list(None if wrong else [None], inputs, src=0, **kw)  # type: ignore[arg-type]


PROBLEMS = {
    "list": (ArgumentTypeError, "is a (NoneType|tuple|dict); expected a list"),
    "device": (ArgumentError, "device is 'cuda', which needs cupy"),
    "safe": (ArgumentTypeError, "safe is 'yes'; expected True, False or None"),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("arg", list(PROBLEMS))
@pytest.mark.parametrize(
    "fn", ["broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"]
)
def test_an_argument_problem_on_one_rank_raises_on_every_rank(world, fn: str, arg: str) -> None:
    """A wrong list, device or safe flag on the root or on the last rank only: nobody is left waiting."""
    if arg == "device" and not NO_CUPY:
        pytest.skip("cupy is installed here: device='cuda' is valid")
    error, words = PROBLEMS[arg]
    for bad in sorted({0, world.size() - 1}):
        with raises_everywhere(error, fn, words):
            _call(fn, world, bad, arg)
        out: list[Any] = [None] * world.size()
        mpicomm.all_gather_object(out, world.rank())  # the group still works
        assert out == list(range(world.size()))


@pytest.mark.mpi(min_size=2)
def test_send_recv_object_list_with_a_wrong_list_on_either_side(world) -> None:
    r = world.rank()
    big = payload(9, 0)  # holds an out-of-band array: the sender blocks until it is received
    if r == 0:
        with pytest.raises(
            ArgumentTypeError, match="send_object_list: object_list is a tuple; expected a list"
        ):
            mpicomm.send_object_list(("a",), dst=1)  # type: ignore[arg-type]
        mpicomm.send_object_list([big], dst=1)
        got: list[Any] = [None]
        mpicomm.recv_object_list(got, src=1)
        assert got == ["after"]
    elif r == 1:
        with pytest.raises(ArgumentTypeError, match="send_object_list: object_list is a tuple"):
            mpicomm.recv_object_list([None], src=0)
        with pytest.raises(ArgumentTypeError, match="recv_object_list: object_list is a NoneType"):
            mpicomm.recv_object_list(None, src=0)  # type: ignore[arg-type]
        mpicomm.send_object_list(["after"], dst=0)  # the big message was taken: the pair is still in step
    mpicomm.barrier()


class ExitsOnLoad:
    """Its __setstate__ raises SystemExit on one rank: a BaseException that is not an Exception."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __setstate__(self, state: dict[str, int]) -> None:
        if mpicomm.get_rank() == state["rank"]:
            raise SystemExit(3)
        self.__dict__.update(state)


@pytest.mark.mpi(min_size=2)
def test_system_exit_while_unpickling_reaches_every_rank(world) -> None:
    r, w = world.rank(), world.size()
    victim = w - 1
    objs = [ExitsOnLoad(victim)] if r == 0 else [None]
    if r == victim:
        with pytest.raises(SystemExit):
            mpicomm.broadcast_object_list(objs, safe=False)
    else:
        with raises_everywhere(
            ObjectCollectiveError, f"cannot be unpickled on rank {victim}", "SystemExit: 3"
        ):
            mpicomm.broadcast_object_list(objs, safe=False)
    out: list[Any] = [None] * w
    with pytest.raises(SystemExit) if r == victim else raises_everywhere(ObjectCollectiveError, "SystemExit"):
        mpicomm.all_gather_object(out, ExitsOnLoad(victim) if r == 0 else r, safe=False)
    mpicomm.all_gather_object(out, r)
    assert out == list(range(w))


def _raise_on_world_rank(rank: int) -> str:
    if mpicomm.get_rank() == rank:
        raise RuntimeError(f"refusing on world rank {rank}")
    return "fine"


class FailsOn:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return _raise_on_world_rank, (self.rank,)


@pytest.mark.mpi(min_size=3)
def test_messages_on_a_sub_group_name_world_ranks(world) -> None:
    """Group ranks 0, 1, ... are world ranks 1, 2, ...: every message must say the world rank."""
    w, r = world.size(), world.rank()
    sub = mpicomm.new_group(range(1, w))
    if sub.is_member:
        objs = [threading.Lock()] if r == 1 else [None]
        with raises_everywhere(
            ObjectCollectiveError, r"object_list\[0\] \(a lock\) cannot be pickled on rank 1:"
        ):
            mpicomm.broadcast_object_list(objs, group_src=0, group=sub)
        objs = [FailsOn(2)] if r == 1 else [None]
        with raises_everywhere(
            ObjectCollectiveError, r"object_list\[0\] from rank 1 cannot be unpickled on rank 2"
        ):
            mpicomm.broadcast_object_list(objs, src=1, group=sub)
        objs = ["a"] if r == 1 else [None] * (2 if r == 2 else 1)
        with raises_everywhere(ArgumentError, "2 entries on rank 2 but 1 on the source rank 1"):
            mpicomm.broadcast_object_list(objs, src=1, group=sub)
        out: list[Any] = [None] * sub.size()
        with raises_everywhere(ObjectCollectiveError, "the object from rank 2 cannot be unpickled on rank 1"):
            mpicomm.all_gather_object(out, FailsOn(1) if r == 2 else 0, group=sub)
        with raises_everywhere(
            ArgumentError, "object_gather_list is given on rank 2, which is not the destination 1"
        ):
            mpicomm.gather_object(r, [None] * sub.size(), dst=1, group=sub)
        with raises_everywhere(ArgumentError, "scatter_object_output_list is empty on rank 2"):
            mpicomm.scatter_object_list(
                [] if r == 2 else [None], list(range(sub.size())) if r == 1 else None, src=1, group=sub
            )
    mpicomm.destroy_process_group(sub)
    if r == 2:
        mpicomm.send_object_list([FailsOn(1)], dst=1)
    if r == 1:
        with pytest.raises(
            ObjectCollectiveError, match="recv_object_list: object_list\\[0\\] from rank 2 cannot be"
        ):
            mpicomm.recv_object_list([None], src=2)
    mpicomm.barrier()
