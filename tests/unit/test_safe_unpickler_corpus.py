"""A corpus of malicious pickles against safe mode: every one refused, none executed, memory bounded.

Each payload is what an attacker would send: ``__reduce__`` payloads made with ``pickle.dumps``
(protocol 5, as mpicomm writes) and hand-written opcode streams for what ``pickle.dumps`` will not
make (state on functions, planted ``__setstate__``, huge claimed sizes, deep nesting). Payloads that
would run code create a marker file, so "none executed" is checked, not assumed.
"""

from __future__ import annotations

import collections
import copyreg
import importlib
import os
import pickle
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm.objects.pickling import dumps, loads
from mpicomm.objects.unpickler import MAX_DEPTH

#: Peak memory one refused payload may cost, in bytes.
MEMORY_BOUND = 64 << 20


class Reduce:
    """Pickles as ``func(*args)``: the attacker's tool."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def p5(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=5)


def op(name: str) -> bytes:
    return getattr(pickle, name)  # type: ignore[no-any-return]


def glob(module: str, name: str) -> bytes:
    """STACK_GLOBAL of ``module.name``."""
    return p5(module)[2:-1] + p5(name)[2:-1] + pickle.STACK_GLOBAL


def obj(value: Any) -> bytes:
    """``value`` pickled without its PROTO and STOP, to splice into a crafted stream."""
    return p5(value)[2:-1]


def crafted(*parts: bytes) -> bytes:
    return pickle.PROTO + b"\x05" + b"".join(parts) + pickle.STOP


def _code_payloads(marker: str) -> dict[str, bytes]:
    """Payloads that would run a command or code, or import or reach into a module."""
    import builtins
    import operator
    import subprocess

    cmd = f"touch {marker}"
    return {
        "os.system": p5(Reduce(os.system, cmd)),
        "os.popen": p5(Reduce(os.popen, cmd)),
        "os.execv": p5(Reduce(os.execv, "/bin/sh", ["sh", "-c", cmd])),
        "subprocess.Popen": p5(Reduce(subprocess.Popen, ["sh", "-c", cmd])),
        "subprocess.check_output": p5(Reduce(subprocess.check_output, ["sh", "-c", cmd])),
        "subprocess.run": p5(Reduce(subprocess.run, cmd)),
        "eval": p5(Reduce(builtins.eval, f"open({marker!r}, 'w')")),
        "exec": p5(Reduce(builtins.exec, f"open({marker!r}, 'w')")),
        "compile": p5(Reduce(builtins.compile, "1", "x", "eval")),
        "__import__": p5(Reduce(builtins.__import__, "os")),
        "importlib.import_module": p5(Reduce(importlib.import_module, "os")),
        "open": p5(Reduce(builtins.open, marker, "w")),
        "getattr chain": crafted(glob("builtins", "getattr"), obj(("os", "system")), op("REDUCE")),
        "getattr on an allowed class": crafted(
            glob("builtins", "getattr"), obj((dict, "fromkeys")), op("REDUCE")
        ),
        "dotted name": crafted(glob("builtins", "dict.fromkeys"), obj(([1],)), op("REDUCE")),
        "dotted dunder name": crafted(glob("collections", "OrderedDict.__init__"), obj(({},)), op("REDUCE")),
        "operator.attrgetter": p5(Reduce(operator.attrgetter, "system")),
        "operator.methodcaller": p5(Reduce(operator.methodcaller, "system", cmd)),
        "setattr": p5(Reduce(builtins.setattr, collections.OrderedDict, "x", 1)),
        "globals": p5(Reduce(builtins.globals)),
        "type() makes a class": p5(Reduce(type, "X", (), {})),
        "pickle.loads nested": p5(Reduce(pickle.loads, p5(Reduce(os.system, cmd)))),
        "copyreg._reconstructor": p5(Reduce(copyreg._reconstructor, object, object, None)),  # type: ignore[attr-defined]
        "protocol 0 GLOBAL": f"cos\nsystem\n(S'{cmd}'\ntR.".encode(),
        "INST": f"(S'{cmd}'\nios\nsystem\n.".encode(),
        "OBJ": crafted(op("MARK"), glob("os", "system"), obj(cmd), op("OBJ")),
        "NEWOBJ of a disallowed class": crafted(glob("subprocess", "Popen"), obj((cmd,)), op("NEWOBJ")),
        "NEWOBJ_EX": crafted(glob("subprocess", "Popen"), obj((cmd,)), obj({}), op("NEWOBJ_EX")),
        "PERSID": b"P1\n.",
        "BINPERSID": crafted(obj("x"), op("BINPERSID")),
        "REDUCE on an allowed non-callable": crafted(obj(1), obj(()), op("REDUCE")),
    }


NUMPY_CORE = "numpy._core" if int(np.__version__.split(".")[0]) >= 2 else "numpy.core"


def _numpy_payloads() -> dict[str, bytes]:
    core = NUMPY_CORE
    return {
        "object array": p5(np.array([1, "x", None], dtype=object)),
        "object dtype": p5(np.dtype("O")),
        "structured dtype with an object field": p5(np.dtype([("a", "O"), ("b", "i4")])),
        "object scalar via scalar()": crafted(
            glob(f"{core}.multiarray", "scalar"), obj((np.dtype("O"), b"\0" * 8)), op("REDUCE")
        ),
        "ndarray subclass via _reconstruct": crafted(
            glob(f"{core}.multiarray", "_reconstruct"), op("MARK"), glob("numpy", "matrix"), obj((0,)),
            obj(b"b"), op("TUPLE"), op("REDUCE"),
        ),
        "dtype from a dict": crafted(
            glob("numpy", "dtype"), obj(({"names": ["a"], "formats": ["O"]},)), op("REDUCE")
        ),
    }  # fmt: skip


def _state_payloads() -> dict[str, bytes]:
    frombuffer = (f"{NUMPY_CORE}.numeric", "_frombuffer")
    return {
        "rename numpy's _frombuffer": crafted(
            glob(*frombuffer), obj((None, {"__name__": "gone", "__qualname__": "gone"})), op("BUILD")
        ),
        "dict state on a function": crafted(glob(*frombuffer), obj({"x": 1}), op("BUILD")),
        "plant __setstate__ on an OrderedDict": crafted(
            glob("collections", "OrderedDict"), obj(()), op("REDUCE"),
            op("EMPTY_DICT"), obj("__setstate__"), glob("builtins", "bytearray"), op("SETITEM"), op("BUILD"),
            obj({"x": 1}), op("BUILD"),
        ),
        "__class__ in slot state": crafted(
            glob("collections", "OrderedDict"), obj(()), op("REDUCE"),
            obj((None, {"__class__": collections.Counter})), op("BUILD"),
        ),
        "__dict__ key in state": crafted(
            glob("collections", "OrderedDict"), obj(()), op("REDUCE"), obj({"__dict__": {}}), op("BUILD")
        ),
        "non-str key in state": crafted(
            glob("collections", "OrderedDict"), obj(()), op("REDUCE"), obj({1: 2}), op("BUILD")
        ),
        "state on a class": crafted(
            glob("collections", "Counter"), obj((None, {"most_common": 1})), op("BUILD")
        ),
        "APPENDS onto a function": crafted(glob(*frombuffer), op("MARK"), obj(1), op("APPENDS")),
        "SETITEM onto a class": crafted(glob("builtins", "dict"), obj("k"), obj("v"), op("SETITEM")),
        "ADDITEMS onto a class": crafted(glob("builtins", "set"), op("MARK"), obj(1), op("ADDITEMS")),
    }  # fmt: skip


def _memory_payloads() -> dict[str, bytes]:
    deep = MAX_DEPTH + 10
    return {
        "BYTEARRAY8 claims 2**50 bytes": crafted(op("BYTEARRAY8") + struct.pack("<Q", 2**50)),
        "BYTEARRAY8 claims more than the stream": crafted(op("BYTEARRAY8") + struct.pack("<Q", 10**6) + b"x"),
        "BINBYTES8 claims 2**62 bytes": crafted(op("BINBYTES8") + struct.pack("<Q", 2**62)),
        "FRAME claims 2**60 bytes": crafted(op("FRAME") + struct.pack("<Q", 2**60) + op("NONE")),
        "bytes(2**40)": p5(Reduce(bytes, 2**40)),
        "bytearray(2**40)": p5(Reduce(bytearray, 2**40)),
        "bytes.__new__(bytes, 2**40)": crafted(glob("builtins", "bytes"), obj((2**40,)), op("NEWOBJ")),
        "list(range(2**40))": p5(Reduce(list, range(2**40))),
        "set(range(2**40))": p5(Reduce(set, range(2**40))),
        "deque(range(2**40))": p5(Reduce(collections.deque, range(2**40))),
        "lists nested past the bound": crafted(op("EMPTY_LIST") * deep + op("APPEND") * (deep - 1)),
        "dicts nested past the bound": crafted(op("EMPTY_DICT") * deep),
        "MARKs nested past the bound": crafted(op("MARK") * deep),
        "a 10**6-digit LONG": b"L" + b"9" * 10**6 + b"L\n.",
        "a 10**6-digit INT": b"I" + b"9" * 10**6 + b"\n.",
        "memo GET of nothing": crafted(op("BINGET") + b"\x07"),
        "truncated stream": p5({"a": [1, 2, 3]})[:-5],
    }


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "payload-ran"
    yield str(path)
    assert not path.exists(), "a payload ran"


def corpus(marker: str) -> dict[str, bytes]:
    return {**_code_payloads(marker), **_numpy_payloads(), **_state_payloads(), **_memory_payloads()}


def test_the_corpus_holds_at_least_40_payloads(marker: str) -> None:
    assert len(corpus(marker)) >= 40


@pytest.mark.parametrize("name", sorted(corpus("/nonexistent")))
def test_safe_mode_refuses_every_payload_without_running_it_in_bounded_memory(name: str, marker: str) -> None:
    payload = corpus(marker)[name]
    tracemalloc.start()
    try:
        with pytest.raises(mpicomm.UnpicklingRefusedError, match="safe mode"):
            loads(payload, [], safe=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND + len(payload), f"{name}: peak {peak} bytes"


def _still_pickles_a_large_array() -> None:
    big = np.arange(1 << 15, dtype=np.int64)  # 256 KiB: through _frombuffer's name
    stream, buffers = dumps({"x": big})
    assert np.array_equal(loads(stream, buffers, safe=True)["x"], big)
    assert np.array_equal(pickle.loads(pickle.dumps(big, protocol=4)), big)


@pytest.mark.parametrize("name", ["rename numpy's _frombuffer", "plant __setstate__ on an OrderedDict"])
def test_the_two_state_tricks_leave_the_process_unharmed(name: str, marker: str) -> None:
    numeric = importlib.import_module(f"{NUMPY_CORE}.numeric")
    before = numeric._frombuffer.__name__
    with pytest.raises(mpicomm.UnpicklingRefusedError):
        loads(corpus(marker)[name], [], safe=True)
    assert numeric._frombuffer.__name__ == before
    assert "__setstate__" not in collections.OrderedDict.__dict__
    _still_pickles_a_large_array()


def test_allowed_data_still_loads_after_the_corpus(marker: str) -> None:
    for payload in corpus(marker).values():
        with pytest.raises(mpicomm.UnpicklingRefusedError):
            loads(payload, [], safe=True)
    data = {"a": [1, 2.5, "x", b"y", None, True], "n": np.arange(5), "od": collections.OrderedDict(k=1)}
    stream, buffers = dumps(data)
    got = loads(stream, buffers, safe=True)
    assert got["a"] == data["a"] and got["od"] == data["od"] and np.array_equal(got["n"], data["n"])
    _still_pickles_a_large_array()


def _nested(depth: int) -> Callable[[], Any]:
    def make() -> Any:
        out: Any = []
        for _ in range(depth):
            out = [out]
        return out

    return make


def test_nesting_that_pickle_itself_writes_loads() -> None:
    deep = _nested(200)()
    stream, buffers = dumps(deep)
    assert loads(stream, buffers, safe=True) == deep
