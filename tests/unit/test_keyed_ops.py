"""KeyedJaggedArray's torchrec methods against a plain-Python reference built from per-key rows.

Every random case is a ``{key: [row, ...]}`` dict (numpy-seeded); the reference answer is computed on
those lists and compared with the vectorised method.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mpicomm import JaggedArray, KeyedJaggedArray
from mpicomm.errors import ArgumentError, ArgumentTypeError

Rows = dict[str, list[list[int]]]


def _rows(rng: np.random.Generator, nkeys: int, stride: int | None = None) -> Rows:
    """Random rows per key; the same number per key unless ``stride`` is None (then VBE)."""
    out: Rows = {}
    for k in range(nkeys):
        n = stride if stride is not None else int(rng.integers(0, 5))
        out[f"f{k}"] = [rng.integers(0, 100, size=int(rng.integers(0, 4))).tolist() for _ in range(n)]
    return out


def _kja(rows: Rows, weighted: bool = False, vbe: bool = False) -> KeyedJaggedArray:
    keys = list(rows)
    flat = [r for k in keys for r in rows[k]]
    lengths = np.array([len(r) for r in flat], np.int64)
    values = np.array([v for r in flat for v in r], np.int64)
    weights = values.astype(np.float32) / 10 if weighted else None
    table = [[len(rows[k])] for k in keys] if vbe else None
    stride = None if vbe or keys else 0
    return KeyedJaggedArray(keys, values, weights, lengths, stride=stride, stride_per_key_per_rank=table)


def _as_rows(kja: KeyedJaggedArray) -> Rows:
    return {k: [r.tolist() for r in ja] for k, ja in kja.to_dict().items()}


CASES = [(seed, vbe) for seed in range(12) for vbe in (False, True)]


@pytest.mark.parametrize(("seed", "vbe"), CASES)
def test_split_gives_consecutive_key_groups(seed: int, vbe: bool) -> None:
    rng = np.random.default_rng(seed)
    rows = _rows(rng, int(rng.integers(1, 7)), None if vbe else int(rng.integers(0, 4)))
    kja = _kja(rows, weighted=bool(seed % 2), vbe=vbe)
    keys = list(rows)
    cuts = np.sort(rng.integers(0, len(keys) + 1, size=2))
    segments = [int(cuts[0]), int(cuts[1] - cuts[0]), int(len(keys) - cuts[1])]
    pieces = kja.split(segments)
    start = 0
    for seg, piece in zip(segments, pieces, strict=True):
        want = {k: rows[k] for k in keys[start : start + seg]}
        assert _as_rows(piece) == want and piece.stride() == kja.stride()
        if kja.weights() is not None:
            np.testing.assert_array_equal(piece.weights(), piece.values().astype(np.float32) / 10)
        start += seg
    assert KeyedJaggedArray.concat(pieces) == kja


@pytest.mark.parametrize(("seed", "vbe"), CASES)
def test_permute_reorders_and_selects_keys(seed: int, vbe: bool) -> None:
    rng = np.random.default_rng(100 + seed)
    rows = _rows(rng, int(rng.integers(1, 7)), None if vbe else int(rng.integers(0, 4)))
    kja = _kja(rows, weighted=True, vbe=vbe)
    keys = list(rows)
    order = rng.permutation(len(keys))[: int(rng.integers(1, len(keys) + 1))].tolist()
    got = kja.permute(order)
    assert got.keys() == [keys[i] for i in order]
    assert _as_rows(got) == {keys[i]: rows[keys[i]] for i in order}
    np.testing.assert_array_equal(got.weights(), got.values().astype(np.float32) / 10)
    if vbe:
        assert got.stride_per_key_per_rank() == [[len(rows[keys[i]])] for i in order]
    assert kja.permute(order, indices_tensor=np.array(order)) == got


@pytest.mark.parametrize("seed", range(8))
def test_getitem_and_to_dict_give_jagged_arrays_of_views(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    rows = _rows(rng, 4, int(rng.integers(1, 4)))
    kja = _kja(rows, weighted=True)
    for k in rows:
        ja = kja[k]
        assert isinstance(ja, JaggedArray) and [r.tolist() for r in ja] == rows[k]
        assert ja.lengths().tolist() == [len(r) for r in rows[k]]
        assert ja.offsets().tolist() == np.concatenate([[0], np.cumsum([len(r) for r in rows[k]])]).tolist()
        assert np.shares_memory(ja.values(), kja.values()) or ja.values().size == 0
        np.testing.assert_array_equal(ja.weights(), ja.values().astype(np.float32) / 10)
    assert kja.to_dict() == {k: kja[k] for k in rows}


def test_per_key_accessors_match_torchrec() -> None:
    kja = KeyedJaggedArray.from_lengths_sync(
        ["A", "B", "C"], np.array([100, 101, 102, 200, 201, 300, 301]), np.array([1, 0, 2, 0, 1, 1, 1, 1, 0])
    )
    assert kja.index_per_key() == {"A": 0, "B": 1, "C": 2}
    assert kja.length_per_key() == [3, 2, 2] and kja.offset_per_key() == [0, 3, 5, 7]
    assert kja.lengths_offset_per_key() == [0, 3, 6, 9]
    same = KeyedJaggedArray.from_offsets_sync(kja.keys(), kja.values(), kja.offsets())
    assert same == kja


def test_constructor_takes_torchrec_positional_order() -> None:
    values, weights, lengths = np.arange(3), np.ones(3, np.float32), np.array([2, 1])
    kja = KeyedJaggedArray(["A"], values, weights, lengths, None, 2)
    assert kja.weights() is weights and kja.lengths() is lengths and kja.stride() == 2
    kja = KeyedJaggedArray(["A"], values, None, None, np.array([0, 2, 3]))
    assert kja.lengths().tolist() == [2, 1]
    with pytest.raises(ArgumentError, match="the third positional argument is weights"):
        KeyedJaggedArray(["A"], values, lengths)


def test_torchrec_caches_are_checked() -> None:
    kja = KeyedJaggedArray(
        ["A", "B"],
        np.arange(3),
        lengths=np.array([1, 0, 2, 0]),
        length_per_key=[1, 2],
        offset_per_key=[0, 1, 3],
    )
    assert kja.length_per_key() == [1, 2]
    with pytest.raises(ArgumentError, match=r"length_per_key is \[2, 1\]; expected \[1, 2\]"):
        KeyedJaggedArray(["A", "B"], np.arange(3), lengths=np.array([1, 0, 2, 0]), length_per_key=[2, 1])
    with pytest.raises(ArgumentError, match="index_per_key"):
        KeyedJaggedArray(["A"], np.arange(1), lengths=np.array([1]), index_per_key={"B": 0})


def test_empty_and_empty_like() -> None:
    e = KeyedJaggedArray.empty(is_weighted=True, values_dtype=np.int64)
    assert e.keys() == [] and e.stride() == 0 and e.values().dtype == np.int64 and e.weights() is not None
    assert e.lengths().dtype == np.int32 and e.to_dict() == {}
    kja = _kja(_rows(np.random.default_rng(3), 3, 4), weighted=True)
    like = KeyedJaggedArray.empty_like(kja)
    assert like.keys() == [] and like.stride() == 4 and like.values().dtype == kja.values().dtype
    assert like.weights() is not None and like.weights().dtype == np.float32
    assert KeyedJaggedArray.concat([like, kja]) == kja


@pytest.mark.parametrize(
    ("call", "exc", "words"),
    [
        (
            lambda k: k.split([1]),
            ArgumentError,
            r"split: segments sum to 1; expected 3 \(the number of keys\)",
        ),
        (lambda k: k.split([4, -1]), ArgumentError, "split: segments"),
        (lambda k: k.split("ab"), ArgumentTypeError, "split: segments is 'ab'"),
        (lambda k: k.permute([0, 3]), ArgumentError, r"permute: indices has 3; expected 0 <= index < 3"),
        (lambda k: k.permute([1, 1]), ArgumentError, "permute: indices lists 1 twice"),
        (lambda k: k["Z"], ArgumentError, r"KeyedJaggedArray\[...\]: key is 'Z'"),
        (lambda k: KeyedJaggedArray.concat([]), ArgumentError, "concat: kja_list is"),
        (lambda k: KeyedJaggedArray.concat([k, 3]), ArgumentTypeError, r"concat: kja_list\[1\] is a int"),
        (lambda k: KeyedJaggedArray.concat([k, k]), ArgumentError, "concat: the arrays share keys"),
        (lambda k: KeyedJaggedArray.empty_like(3), ArgumentTypeError, "empty_like: kja is a int"),
    ],
)
def test_bad_arguments_name_the_method(call: Any, exc: type[Exception], words: str) -> None:
    kja = _kja({"A": [[1], []], "B": [[2, 3], [4]], "C": [[], []]})
    with pytest.raises(exc, match=words):
        call(kja)


def test_concat_refuses_arrays_that_do_not_fit_together() -> None:
    a = _kja({"A": [[1], []]})
    with pytest.raises(ArgumentError, match=r"kja_list\[1\] has weights and kja_list\[0\] has no weights"):
        KeyedJaggedArray.concat([a, _kja({"B": [[1], []]}, weighted=True)])
    with pytest.raises(ArgumentError, match=r"kja_list\[1\] has stride 3; expected 2"):
        KeyedJaggedArray.concat([a, _kja({"B": [[1], [], []]})])
    with pytest.raises(ArgumentTypeError, match="values of dtype float64"):
        KeyedJaggedArray.concat([a, KeyedJaggedArray(["B"], np.zeros(1), lengths=np.array([1, 0]))])
    with pytest.raises(ArgumentError, match="differ in VBE"):
        KeyedJaggedArray.concat([a, _kja({"B": [[1]]}, vbe=True)])


def test_wait_returns_the_array_itself() -> None:
    kja = _kja({"A": [[1]]})
    assert kja.wait() is kja
