"""The safe unpickler's work budget (issue 22, item 3): short streams cannot ask for long work.

Every hostile stream of ``hostile_streams`` and thousands of random streams of at most 1 KB built
from the opcodes that amplify (memo references, DUP, calls of allowed classes over ranges, bytes
and containers, tuples, frozensets, dict keys) are loaded or refused within 100 MB of traced memory;
their time is measured by ``python tests/hostile_streams.py`` (docs/objects.rst), never asserted.
Honest objects with shared references, hashed tuple keys and nesting that pickle writes still load.
"""

from __future__ import annotations

import collections
import pickle
import tracemalloc
import warnings
from typing import Any

import hostile_streams
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpicomm
from mpicomm.core import control
from mpicomm.objects import budget
from mpicomm.objects.pickling import dumps, loads

#: Traced memory one stream of at most 2 KB may cost (the issue's target is 100 MB and 50 ms).
PEAK = 100 << 20
P = pickle


def _peak(stream: bytes) -> tuple[str, int]:
    tracemalloc.start()
    try:
        try:
            loads(stream, [], safe=True)
            outcome = "loaded"
        except mpicomm.UnpicklingRefusedError:
            outcome = "refused"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return outcome, peak


LOADED = {"300 x list(512-byte bytes)", "190 x list(range(700)), 1 KB"}
REFUSED = [name for name in hostile_streams.STREAMS if name not in LOADED]


@pytest.mark.parametrize("name", REFUSED)
def test_each_hostile_stream_is_refused_in_bounded_memory(name: str) -> None:
    stream = hostile_streams.STREAMS[name]()
    outcome, peak = _peak(stream)
    assert outcome == "refused"
    assert peak < PEAK, f"{name}: {peak} bytes"


def test_the_issue_streams_have_the_issue_sizes() -> None:
    assert len(hostile_streams.str_of_a_self_holding_list()) < 400
    assert 1900 < len(hostile_streams.many_ranges()) <= 2100
    assert len(hostile_streams.zero_itemsize_array()) < 160


def test_work_within_the_budget_is_loaded_and_bounded() -> None:
    """300 copies of list(bytes(512)): 153,600 items from 2 KB, within the budget; loaded."""
    outcome, peak = _peak(hostile_streams.repeated_list_of_bytes())
    assert outcome == "loaded" and peak < PEAK
    outcome, _ = _peak(hostile_streams.repeated_list_of_bytes(copies=2000))
    assert outcome == "refused"
    outcome, peak = _peak(hostile_streams.budget_filling_ranges())
    assert outcome == "loaded" and peak < PEAK
    outcome, _ = _peak(hostile_streams.many_ranges(copies=400, n=700))  # 280,000 items from 2 KB
    assert outcome == "refused"


def test_messages_name_the_construct() -> None:
    cases = {
        hostile_streams.str_of_a_self_holding_list(): "holds itself",
        hostile_streams.many_ranges(): "budget",
        hostile_streams.zero_itemsize_array(): "take no bytes",
        hostile_streams.exponential_tuple_key(): "expands",
        hostile_streams.deep_tuple(): "nested over",
    }
    for stream, words in cases.items():
        with pytest.raises(mpicomm.UnpicklingRefusedError, match=words):
            loads(stream, [], safe=True)


# -- random streams of at most 1 KB ----------------------------------------------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(hostile_streams.PIECES), min_size=1, max_size=200))
def test_random_streams_of_at_most_1_kb_are_loaded_or_refused_in_bounded_memory(pieces: list[bytes]) -> None:
    stream = (P.PROTO + b"\x05" + b"".join(pieces))[:1023] + P.STOP
    _, peak = _peak(stream)
    assert peak < PEAK, f"{len(stream)}-byte stream: {peak} bytes"


# -- honest objects still load --------------------------------------------------------------------


def _roundtrip(obj: Any) -> Any:
    stream, buffers = dumps(obj)
    return loads(stream, buffers, safe=True)


def test_shared_references_within_the_budget_load() -> None:
    row = list(range(50))
    obj = {"rows": [row] * 100, "name": "x" * 300, "names": ["x" * 300] * 20}
    got = _roundtrip(obj)
    assert got == obj and got["rows"][0] is got["rows"][1]


def test_hashed_tuple_keys_sets_and_frozensets_load() -> None:
    obj = {
        (1, (2, 3)): "a",
        "set": {(1, 2), (3, (4, 5))},
        "fs": frozenset({(1,), (2,)}),
        "counter": collections.Counter("hello"),
    }
    assert _roundtrip(obj) == obj


def test_numpy_arrays_and_scalars_still_load() -> None:
    obj = [np.arange(6, dtype=np.int16).reshape(2, 3), np.float32(1.5), np.zeros((0, 3))]
    got = _roundtrip(obj)
    assert all(np.array_equal(a, b) for a, b in zip(got, obj, strict=True))


def test_a_list_that_holds_itself_is_refused() -> None:
    a: list[Any] = [1]
    a.append(a)
    with pytest.raises(mpicomm.UnpicklingRefusedError, match="holds itself"):
        _roundtrip(a)


def test_a_long_string_referenced_many_times_is_charged() -> None:
    text = "x" * 60_000
    assert _roundtrip([text] * 50) == [text] * 50  # 3 MB from 60 KB: within 32 units per byte
    with pytest.raises(mpicomm.UnpicklingRefusedError, match="budget"):
        _roundtrip([text] * 5_000)  # 300 MB of text to print from a 75 KB stream


# -- the measure itself ---------------------------------------------------------------------------


def test_measure_counts_shared_references_each_time_in_linear_time() -> None:
    x: list[Any] = [1, 2]
    for _ in range(60):
        x = [x, x]  # 2**61 items when expanded, 61 distinct lists
    with pytest.raises(mpicomm.UnpicklingRefusedError, match="expands"):
        budget.measure(x, 10**6, "x")
    assert budget.measure([[1, 2], [1, 2]], 100, "x") == 7


def test_measure_refuses_cycles_and_depth() -> None:
    a: list[Any] = []
    b: list[Any] = [a]
    a.append(b)
    with pytest.raises(mpicomm.UnpicklingRefusedError, match="holds itself"):
        budget.measure(a, 10**6, "x")
    deep: Any = 0
    for _ in range(budget.MAX_DEPTH + 1):
        deep = (deep,)
    with pytest.raises(mpicomm.UnpicklingRefusedError, match="nested over"):
        budget.measure(deep, 10**9, "x")


def test_brief_never_prints_a_whole_value() -> None:
    assert len(budget.brief("y" * 10**6)) < 100
    assert len(budget.brief(10**5000)) < 100
    assert budget.brief([1] * 10**6) == "a list"


# -- the payload cap ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8G", 8 << 30), ("512m", 512 << 20), ("100", 100), ("1TiB", 1 << 40), (" 2 KB ", 2 << 10)],
)
def test_the_payload_cap_reads_bytes_with_binary_suffixes(text: str, expected: int) -> None:
    assert control._read_cap(text) == expected


@pytest.mark.parametrize("text", ["x", "0", "-5", "1.5G"])
def test_a_payload_cap_it_cannot_read_warns_and_keeps_the_default(text: str) -> None:
    with pytest.warns(UserWarning, match="MPICOMM_MAX_PAYLOAD"):
        got = control._read_cap(text)
    assert got == control.physical_memory() // 4


def test_the_default_payload_cap_is_a_quarter_of_memory() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert control._read_cap("") == control.physical_memory() // 4
