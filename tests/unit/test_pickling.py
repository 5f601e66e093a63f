"""mpicomm.objects.pickling on one process: out-of-band buffers, the safe unpickler, the device argument."""

from __future__ import annotations

import collections
import datetime
import importlib.util
import os
import pickle
import pickletools
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import mpicomm
from mpicomm.objects import pickling
from mpicomm.objects.pickling import OUT_OF_BAND_MIN, check_device, dumps, loads


class RunsCommand:
    """Unpickling this runs a shell command: the classic pickle attack, with a harmless command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (self.command,)


@dataclass
class Config:
    name: str
    steps: int


@dataclass
class NotAllowed:
    value: int


@dataclass(frozen=True)
class Frozen:
    x: Any
    label: str


class Pair(NamedTuple):
    x: Any
    label: str


@pytest.fixture(autouse=True)
def _global_mode_is_restored() -> Iterator[None]:
    before = mpicomm.is_safe_unpickling()
    allowed = set(pickling._ALLOWED)
    yield
    mpicomm.set_safe_unpickling(before)
    pickling._ALLOWED.intersection_update(allowed)  # classes a test allowed stay out of the next tests


def body(obj: object) -> bytes:
    """The opcodes that push ``obj`` (protocol 3, no memo), to splice into a hand-made pickle."""
    stream = pickletools.optimize(pickle.dumps(obj, protocol=3))
    assert stream[:2] == b"\x80\x03" and stream[-1:] == pickle.STOP
    return stream[2:-1]


def global_(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def crafted(*parts: bytes) -> bytes:
    """A protocol 3 pickle made of the given opcodes: what a malicious sender can put on the wire."""
    return pickle.PROTO + b"\x03" + b"".join(parts) + pickle.STOP


#: ``numpy.ndarray((1,), dtype("O"), b"AAAAAAAA")``: an object array whose one pointer is 0x4141414141414141;
#: reading it crashes the process. The reviewer's payload, called through REDUCE.
FAKE_POINTER_ARRAY = crafted(
    global_("numpy", "ndarray"), body(((1,), np.dtype("O"), b"A" * 8)), pickle.REDUCE
)


def test_large_arrays_travel_out_of_band_and_come_back_equal():
    big = np.arange(OUT_OF_BAND_MIN, dtype=np.float32).reshape(4, -1)
    fortran = np.asfortranarray(np.arange(OUT_OF_BAND_MIN // 4, dtype=np.int64).reshape(64, -1))
    obj = {"big": big, "fortran": fortran, "meta": [1, "two", (3.0, None)]}
    stream, buffers = dumps(obj)
    assert [b.nbytes for b in buffers] == [big.nbytes, fortran.nbytes]
    assert len(stream) < 1000  # the array bytes are not in the stream
    copies = [np.frombuffer(b, np.uint8).copy() for b in buffers]
    got = loads(stream, copies)
    np.testing.assert_array_equal(got["big"], big)
    np.testing.assert_array_equal(got["fortran"], fortran)
    assert got["fortran"].flags.f_contiguous and got["meta"] == obj["meta"]
    assert np.shares_memory(got["big"], copies[0])  # rebuilt on the received buffer, no copy


def test_small_and_strided_arrays_stay_in_the_stream():
    small = np.arange(10, dtype=np.int16)
    strided = np.arange(2 * OUT_OF_BAND_MIN, dtype=np.uint8)[::2]
    stream, buffers = dumps([small, strided])
    assert buffers == []
    got = loads(stream, [])
    np.testing.assert_array_equal(got[0], small)
    np.testing.assert_array_equal(got[1], strided)


def test_objects_share_one_buffer_iterator_in_order():
    a, b = np.ones(OUT_OF_BAND_MIN), np.zeros(OUT_OF_BAND_MIN)
    (sa, ba), (sb, bb) = dumps(a), dumps(b)
    it = iter([x.tobytes() for x in ba + bb])
    np.testing.assert_array_equal(loads(sa, it), a)
    np.testing.assert_array_equal(loads(sb, it), b)


def test_safe_mode_loads_containers_numpy_and_datetimes():
    obj = {
        "arrays": [np.arange(6).astype(d).reshape(2, 3) for d in ("f4", "i8", "c16", "?", ">u2")],
        "record": np.zeros(3, dtype=[("a", "<i2"), ("b", "<f8")]),
        "scalars": (np.float32(1.5), np.int64(-3), 2**70, 1.5j, True, None, b"raw", bytearray(b"ba")),
        "sets": ({1, 2}, frozenset({"x"})),
        "ordered": collections.OrderedDict(a=1),
        "counts": collections.Counter("abca"),
        "when": datetime.datetime(2026, 11, 22, 1, 2, 3),
        "dtype": np.dtype("f8"),
        "range": range(3),
    }
    stream, buffers = dumps(obj)
    got = loads(stream, buffers, safe=True)
    assert got["scalars"] == obj["scalars"] and got["when"] == obj["when"]
    assert got["sets"] == obj["sets"] and got["counts"] == obj["counts"] and got["dtype"] == obj["dtype"]
    for x, y in zip(got["arrays"], obj["arrays"], strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(got["record"], obj["record"])


def test_safe_mode_refuses_a_payload_that_would_run_a_command(tmp_path: Path):
    marker = tmp_path / "pwned"
    stream, buffers = dumps([1, RunsCommand(f"touch {marker}")])
    with pytest.raises(mpicomm.UnpicklingRefusedError, match=r"refused to unpickle posix\.system"):
        loads(stream, buffers, safe=True)
    assert not marker.exists()


@pytest.mark.process
def test_unsafe_mode_really_runs_the_command_which_is_why_safe_mode_exists(tmp_path: Path):
    marker = tmp_path / "ran"
    stream, buffers = dumps(RunsCommand(f"touch {marker}"))
    assert loads(stream, buffers, safe=False) == 0
    assert marker.exists()


def test_refusal_names_the_class_and_allow_unpickle_lets_it_in():
    stream, buffers = dumps(Config("run", 3))
    with pytest.raises(pickle.UnpicklingError, match=r"test_pickling\.Config.*allow_unpickle\(Config\)"):
        loads(stream, buffers, safe=True)
    mpicomm.allow_unpickle(Config)
    assert loads(stream, buffers, safe=True) == Config("run", 3)
    with pytest.raises(mpicomm.UnpicklingRefusedError, match="NotAllowed"):
        loads(*dumps(NotAllowed(1)), safe=True)


def test_allow_unpickle_wants_classes():
    with pytest.raises(mpicomm.ArgumentTypeError, match=r"allow_unpickle: got 'os\.system'; expected"):
        mpicomm.allow_unpickle("os.system")  # type: ignore[arg-type]


def test_global_setting_decides_when_safe_is_none(tmp_path: Path):
    marker = tmp_path / "global"
    stream, buffers = dumps(RunsCommand(f"touch {marker}"))
    mpicomm.set_safe_unpickling(True)
    assert mpicomm.is_safe_unpickling()
    with pytest.raises(mpicomm.UnpicklingRefusedError):
        loads(stream, buffers)
    assert not marker.exists()
    with pytest.raises(mpicomm.ArgumentTypeError, match="set_safe_unpickling: enabled is 'yes'"):
        mpicomm.set_safe_unpickling("yes")  # type: ignore[arg-type]


@pytest.mark.process
@pytest.mark.parametrize(("value", "expected"), [("1", "True"), ("0", "False"), ("", "False")])
def test_environment_variable_sets_the_default(value: str, expected: str):
    code = "import mpicomm; print(mpicomm.is_safe_unpickling())"
    env = {**os.environ, "MPICOMM_SAFE_PICKLE": value}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == expected


def test_device_argument_is_checked():
    assert check_device(None, "f") is None
    assert check_device("cpu", "f") == "cpu"
    with pytest.raises(mpicomm.ArgumentError, match="f: device is 'tpu'; expected None, 'cpu', 'cuda'"):
        check_device("tpu", "f")
    with pytest.raises(mpicomm.ArgumentError, match="device is 'cuda:x'"):
        check_device("cuda:x", "f")
    with pytest.raises(mpicomm.ArgumentTypeError, match="device is 3"):
        check_device(3, "f")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed here")
def test_cuda_without_cupy_is_a_clear_error():
    with pytest.raises(mpicomm.ArgumentError, match="f: device is 'cuda', which needs cupy, but cupy is not"):
        check_device("cuda", "f")


def test_place_leaves_objects_alone_on_the_host():
    obj = {"a": np.ones(3)}
    assert pickling.place(obj, None) is obj
    assert pickling.place(obj, "cpu") is obj


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (FAKE_POINTER_ARRAY, "object dtype"),
        (
            crafted(global_("numpy", "ndarray"), body(((1,), np.dtype("f8"), b"A" * 8)), pickle.REDUCE),
            "ndarray",
        ),
        (pickle.dumps(np.array([1, "two", None], dtype=object), protocol=5), "object dtype"),
        (pickle.dumps({"a": np.zeros(2, dtype=[("x", "f4"), ("o", "O")])}, protocol=5), "object dtype"),
        (pickle.dumps(np.array([None], dtype=object)[0:1], protocol=5), "object dtype"),
    ],
    ids=["fake-pointers", "ndarray-called", "object-array", "object-field", "object-slice"],
)
def test_safe_mode_refuses_object_arrays_and_calling_ndarray(payload: bytes, words: str):
    with pytest.raises(mpicomm.UnpicklingRefusedError, match=words):
        loads(payload, [], safe=True)


@pytest.mark.process
def test_the_fake_pointer_payload_crashes_without_safe_mode_so_it_is_a_real_attack():
    code = (
        "import pickle, sys; a = pickle.loads(sys.stdin.buffer.read()); "
        "print(a.dtype, flush=True); print(repr(a[0]))"
    )
    done = subprocess.run([sys.executable, "-c", code], input=FAKE_POINTER_ARRAY, capture_output=True)
    assert done.stdout.startswith(b"object") and done.returncode != 0  # killed by a signal reading a[0]


DTYPE_V8 = global_("numpy", "dtype") + body(("V8", False, True)) + pickle.REDUCE


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (crafted(DTYPE_V8, body((3, "|", None, None, None, 8, 1, 1)), pickle.BUILD), "object dtype"),
        (
            crafted(
                DTYPE_V8, body((3, "|", None, ("a",), {"a": (np.dtype("f8"), 100)}, 8, 1, 16)), pickle.BUILD
            ),
            "field lies outside",
        ),
        (
            crafted(DTYPE_V8, body((3, "|", None, None, None, 8, 1, 0)), pickle.BUILD)[:-1]
            + body((3, "|", None, None, None, 4096, 1, 0))
            + pickle.BUILD
            + pickle.STOP,
            "only once",
        ),
        (
            crafted(
                DTYPE_V8,
                pickle.BINPUT + b"\x00" + pickle.POP,
                global_("numpy._core.numeric", "_frombuffer"),
                pickle.MARK
                + body(b"\x00" * 8)
                + pickle.BINGET
                + b"\x00"
                + body((1,))
                + body("C")
                + pickle.TUPLE,
                pickle.REDUCE,
            ),
            "uses a numpy dtype before its state was set",
        ),
        (crafted(pickle.MARK + pickle.INST + b"builtins\nlist\n"), "INST opcode"),
    ],
    ids=["hasobject-flag", "field-outside-item", "second-state", "used-before-state", "inst"],
)
def test_safe_mode_refuses_dtype_tampering_and_old_opcodes(payload: bytes, words: str):
    with pytest.raises(mpicomm.UnpicklingRefusedError, match=words):
        loads(payload, [], safe=True)


def test_safe_mode_refuses_state_set_on_a_class():
    payload = crafted(global_("collections", "Counter"), body((None, {"most_common": int})), pickle.BUILD)
    original = collections.Counter.__dict__["most_common"]
    try:
        with pytest.raises(mpicomm.UnpicklingRefusedError, match=r"class collections\.Counter itself"):
            loads(payload, [], safe=True)
        assert collections.Counter.__dict__["most_common"] is original
    finally:
        collections.Counter.most_common = original  # type: ignore[method-assign]


def test_safe_mode_still_loads_every_numpy_layout():
    obj = {
        "strided": np.arange(20, dtype=np.int16)[::3],  # _reconstruct + state, in the stream
        "big": np.arange(OUT_OF_BAND_MIN, dtype=np.float64),  # _frombuffer, out of band
        "subarray": np.zeros(2, dtype=[("v", "<f4", (3,)), ("n", "u1")]),
        "aligned": np.zeros(2, dtype=np.dtype([("a", "u1"), ("b", "<i8")], align=True)),
        "text": np.array(["ab", "cde"]),
        "scalars": [np.float16(1.5), np.complex64(1j), np.datetime64("2026-11-22"), np.bytes_(b"x")],
        "collections": [collections.deque([1, 2], maxlen=5), collections.defaultdict(list, {"a": [1]})],
    }
    stream, buffers = dumps(obj)
    got = loads(stream, buffers, safe=True)
    for key in ("strided", "big", "subarray", "aligned", "text"):
        assert got[key].dtype == obj[key].dtype
        np.testing.assert_array_equal(got[key], obj[key])
    assert got["scalars"] == obj["scalars"] and got["collections"] == obj["collections"]


def test_place_walks_namedtuples_and_frozen_dataclasses():
    def to_list(x: object) -> object:
        return x.tolist() if isinstance(x, np.ndarray) else None

    obj = {"pair": Pair(np.arange(2), "p"), "frozen": Frozen(np.arange(3), "f")}
    got = pickling._walk(obj, to_list, set())
    assert got["pair"] == Pair([0, 1], "p") and type(got["pair"]) is Pair
    assert got["frozen"] == Frozen([0, 1, 2], "f")


def test_describe_names_where_an_error_of_another_library_was_raised():
    from mpicomm.objects.pickling import describe

    def deep() -> None:
        raise RuntimeError("dictionary changed size during iteration")

    try:
        deep()
    except RuntimeError as exc:
        assert describe(exc) == "RuntimeError: dictionary changed size during iteration"
        assert describe(exc, where=True).endswith(
            f"(at unit/test_pickling.py:{deep.__code__.co_firstlineno + 1}, in deep)"
        )
