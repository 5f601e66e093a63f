"""Hostile pickle streams of at most 2 KB that ask for far more work than their size (issue 22, item 3).

Shared by the unit tests of the safe unpickler's budget and the multi-rank tests in which a real
rank sends them. Run as a script to print the time and peak memory of refusing each one (the table
in docs/objects.rst)::

    .venv/bin/python tests/hostile_streams.py
"""

from __future__ import annotations

import pickle
import pickletools
import random
import struct
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

P = pickle


def _glob(module: str, name: str) -> bytes:
    return _obj(module) + _obj(name) + P.STACK_GLOBAL


def _obj(value: object) -> bytes:
    """``value`` pickled without PROTO, FRAME, memo entries and STOP, to splice into a crafted stream."""
    data = pickletools.optimize(pickle.dumps(value, protocol=5))
    data = data[11:] if data[2:3] == P.FRAME else data[2:]
    return data[:-1]


def _get(i: int) -> bytes:
    return P.BINGET + bytes([i]) if i < 256 else P.LONG_BINGET + struct.pack("<I", i)


def _crafted(body: bytes) -> bytes:
    return P.PROTO + b"\x05" + body + P.STOP


def str_of_a_self_holding_list(levels: int = 33) -> bytes:
    """``str()`` of a list that holds the level below twice, and itself, per level, all by memo refs.

    Printing it would visit 2**levels lists; the stream is 344 bytes at 33 levels.
    """
    body = P.EMPTY_LIST + P.MEMOIZE  # memo 0: the bottom list
    for i in range(1, levels + 1):
        body += P.EMPTY_LIST + P.MEMOIZE + P.MARK + _get(i - 1) + _get(i - 1) + _get(i) + P.APPENDS
    body += _glob("builtins", "str") + _get(levels) + P.TUPLE1 + P.REDUCE
    return _crafted(body)


def many_ranges(copies: int = 400, n: int = 2**20) -> bytes:
    """A list of ``copies`` calls ``list(range(n))``: 2 KB that ask for 16 GiB at 400 copies of 2**20."""
    body = _glob("builtins", "list") + P.MEMOIZE + P.POP  # memo 0: list
    body += _glob("builtins", "range") + _obj((0, n)) + P.REDUCE + P.TUPLE1 + P.MEMOIZE + P.POP  # memo 1
    return _crafted(body + P.MARK + (_get(0) + _get(1) + P.REDUCE) * copies + P.LIST)


def zero_itemsize_array(n: int = 2**62) -> bytes:
    """A numpy array of ``n`` zero-byte (V0) items: 154 bytes, and its ``copy()`` never ends."""
    stream = pickle.dumps(np.empty(3, np.dtype([])), protocol=5)
    shape = P.BININT1 + b"\x03" + P.TUPLE1
    assert stream.count(shape) == 1
    stream = stream.replace(shape, P.LONG1 + b"\x08" + struct.pack("<Q", n) + P.TUPLE1)
    frame = struct.pack("<Q", len(stream) - 12)  # PROTO 2 bytes, FRAME 9 bytes, STOP 1 byte
    return stream[:3] + frame + stream[11:]


def exponential_tuple_key(levels: int = 40) -> bytes:
    """A dict whose key is a tuple holding the level below twice per level: hashing it is 2**levels."""
    body = P.EMPTY_DICT + _obj(0)
    for _ in range(levels):
        body += P.DUP + P.TUPLE2
    return _crafted(body + _obj(1) + P.SETITEM)


def deep_tuple(levels: int = 100_000) -> bytes:
    """A tuple nested ``levels`` deep through TUPLE1 (no stack growth); hashing it overflows C's stack."""
    return _crafted(P.EMPTY_DICT + _obj(0) + P.TUPLE1 * levels + _obj(1) + P.SETITEM)


def repeated_list_of_bytes(copies: int = 300) -> bytes:
    """``list(b)`` of one 512-byte ``bytes`` object, ``copies`` times: 8 KiB of pointers per 5 bytes."""
    body = _glob("builtins", "list") + P.MEMOIZE + P.POP + _obj((b"x" * 512,)) + P.MEMOIZE + P.POP
    return _crafted(body + P.MARK + (_get(0) + _get(1) + P.REDUCE) * copies + P.LIST)


def budget_filling_ranges() -> bytes:
    """190 calls ``list(range(700))`` in 1 KB: 133,000 items, just inside a 1 KB stream's budget."""
    return many_ranges(copies=190, n=700)


#: Pieces the random streams are made of: pushes, memo traffic, containers, hashing, amplifying calls.
PIECES = [
    P.EMPTY_LIST, P.EMPTY_DICT, P.EMPTY_SET, P.EMPTY_TUPLE, P.MARK, P.DUP, P.POP, P.MEMOIZE,
    P.APPEND, P.APPENDS, P.SETITEM, P.SETITEMS, P.ADDITEMS, P.TUPLE1, P.TUPLE2, P.TUPLE3, P.TUPLE,
    P.LIST, P.DICT, P.FROZENSET, P.REDUCE, P.BUILD, P.STOP,
    P.BINGET + b"\x00", P.BINGET + b"\x01", P.BINGET + b"\x02", P.BINGET + b"\x03",
    _obj(0), _obj(2**20), _obj(2**62), _obj("k"), _obj(b"x" * 200), _obj((0, 2**20)), _obj((0, 700)),
    _obj(1.5), _glob("builtins", "list"), _glob("builtins", "str"), _glob("builtins", "tuple"),
    _glob("builtins", "range"), _glob("builtins", "bytes"), _glob("builtins", "set"),
    _glob("builtins", "frozenset"), _glob("builtins", "dict"), _glob("collections", "Counter"),
    _glob("collections", "deque"), _glob("numpy", "dtype"),
]  # fmt: skip


def random_stream(rng: random.Random, size: int = 1024) -> bytes:
    """A stream of at most ``size`` bytes made of random :data:`PIECES`."""
    body = b"".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 200)))
    return (P.PROTO + b"\x05" + body)[: size - 1] + P.STOP


#: Every hostile stream, by name.
STREAMS: dict[str, Callable[[], bytes]] = {
    "str() of a self-holding list (memo refs)": str_of_a_self_holding_list,
    "400 x list(range(2**20))": many_ranges,
    "V0 array of 2**62 items": zero_itemsize_array,
    "tuple key doubling per level": exponential_tuple_key,
    "tuple key 100,000 deep": deep_tuple,
    "300 x list(512-byte bytes)": repeated_list_of_bytes,
    "190 x list(range(700)), 1 KB": budget_filling_ranges,
}


def cost(stream: bytes) -> tuple[str, float, int]:
    """What safe mode does with ``stream``: the outcome, seconds (untraced) and peak traced bytes."""
    from mpicomm import UnpicklingRefusedError
    from mpicomm.objects.pickling import loads

    def run() -> str:
        try:
            loads(stream, [], safe=True)
        except UnpicklingRefusedError:
            return "refused"
        return "loaded"

    start = time.perf_counter()
    outcome = run()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    try:
        run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return outcome, seconds, peak


def main() -> None:
    print(f"{'stream':45} {'bytes':>6} {'outcome':>8} {'ms':>8} {'peak KiB':>9}")
    for name, make in STREAMS.items():
        stream = make()
        best = min((cost(stream) for _ in range(5)), key=lambda c: c[1])
        print(f"{name:45} {len(stream):6} {best[0]:>8} {1e3 * best[1]:8.2f} {best[2] / 1024:9.1f}")
    rng = random.Random(22)
    costs = [cost(random_stream(rng)) for _ in range(2000)]
    loaded = sum(c[0] == "loaded" for c in costs)
    slowest, largest = max(c[1] for c in costs), max(c[2] for c in costs)
    name = f"2000 random streams <= 1 KB ({loaded} loaded), worst"
    print(f"{name:45} {1024:6} {'':>8} {1e3 * slowest:8.2f} {largest / 1024:9.1f}")


if __name__ == "__main__":
    main()
