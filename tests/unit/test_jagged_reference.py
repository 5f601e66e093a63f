"""KeyedJaggedArray in one process, and a plain-numpy reference of KJTAllToAll that simulates W ranks.

The reference (``reference_all_to_all``) is written from the contract in the reference semantics,
§2.9: for each output key, for each source rank in stagger order, append that source's rows of the
key. It never calls mpicomm's recat. ``simulate`` feeds mpicomm's recat with what each rank would
receive from MPI (source-major blocks), so the recat is checked at any W without MPI; the multi-rank
tests (tests/mpi/test_jagged.py) check the real collective against the same reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from mpicomm.errors import ArgumentError, ArgumentTypeError
from mpicomm.jagged import KeyedJaggedArray
from mpicomm.jagged.placement import _recat

SAME_ON_EVERY_RANK = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=10,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)

# --------------------------------------------------------------------------------------------------
# the reference: global input for all ranks -> expected output of each rank


@dataclass
class RankInput:
    """One rank's input: rows[key] is the list of its rows (one per batch slot) for that key."""

    keys: list[str]
    rows: dict[str, list[np.ndarray]]
    weights: dict[str, list[np.ndarray]] | None = None
    vbe: bool = False
    lengths_dtype: Any = np.int64
    stride: int = 0
    slots: dict[str, int] = field(default_factory=dict)
    dtype: Any = np.int64

    def to_kja(self) -> KeyedJaggedArray:
        """The KeyedJaggedArray this rank passes to the collective (built by hand, key-major)."""
        flat = [r for k in self.keys for r in self.rows[k]]
        lengths = np.array([len(r) for r in flat], dtype=self.lengths_dtype)
        values = np.concatenate(flat) if flat else np.empty(0, self.dtype)
        weights = None
        if self.weights is not None:
            wflat = [r for k in self.keys for r in self.weights[k]]
            weights = np.concatenate(wflat) if wflat else np.empty(0, np.float32)
        spkpr = [[len(self.rows[k])] for k in self.keys] if self.vbe else None
        stride = None if self.vbe or self.keys else self.stride
        return KeyedJaggedArray(self.keys, values, lengths=lengths, weights=weights, stride=stride,
                                stride_per_key_per_rank=spkpr)  # fmt: skip


def stagger_order(world: int, stagger: int) -> list[int]:
    n = world // stagger
    return [x + n * y for x in range(n) for y in range(stagger)]


def reference_all_to_all(
    inputs: list[RankInput], splits: list[int], stagger: int = 1
) -> list[dict[str, Any]]:
    """Expected output per rank: keys, lengths, values, weights, stride, stride_per_key_per_rank."""
    world = len(inputs)
    keys = inputs[0].keys
    order = stagger_order(world, stagger)
    outputs = []
    start = 0
    for r in range(world):
        mine = keys[start : start + splits[r]]
        start += splits[r]
        rows = [inputs[s].rows[k][i] for k in mine for s in order for i in range(len(inputs[s].rows[k]))]
        out: dict[str, Any] = {
            "keys": mine,
            "lengths": [len(x) for x in rows],
            "values": np.concatenate(rows) if rows else np.empty(0, inputs[0].dtype),
            "weights": None,
        }
        if inputs[0].weights is not None:
            wrows = [
                inputs[s].weights[k][i] for k in mine for s in order for i in range(len(inputs[s].rows[k]))
            ]  # type: ignore[index]
            out["weights"] = np.concatenate(wrows) if wrows else np.empty(0, np.float32)
        if inputs[0].vbe:
            table = [[len(inputs[s].rows[k]) for s in order] for k in mine]
            out["spkpr"] = table
            out["stride"] = max((sum(t) for t in table), default=0)
        else:
            out["spkpr"] = None
            out["stride"] = sum(inputs[s].stride for s in range(world))
        outputs.append(out)
    return outputs


def received_rows(
    r: int, lengths: list[Any], values: list[Any], splits: list[list[int]]
) -> tuple[np.ndarray, np.ndarray]:
    """The reference of a plain jagged all-to-all: the lengths and values rank ``r`` receives.

    Source ``s`` sends its rows in rank order, ``splits[s][d]`` of them to rank ``d``; rank ``r`` gets
    each source's share in source order (``lengths[s]`` counts the values of each of s's rows).
    """
    want_l, want_v = [], []
    for s in range(len(lengths)):
        row0 = sum(splits[s][:r])
        lo = int(lengths[s][:row0].sum())
        n = int(lengths[s][row0 : row0 + splits[s][r]].sum())
        want_l.append(lengths[s][row0 : row0 + splits[s][r]])
        want_v.append(values[s][lo : lo + n])
    return np.concatenate(want_l), np.concatenate(want_v)


def check_output(got: KeyedJaggedArray, want: dict[str, Any]) -> None:
    assert got.keys() == want["keys"]
    assert got.lengths().tolist() == want["lengths"]
    assert got.values().dtype == want["values"].dtype
    np.testing.assert_array_equal(got.values(), want["values"])
    if want["weights"] is None:
        assert got.weights() is None
    else:
        np.testing.assert_array_equal(got.weights(), want["weights"])  # type: ignore[arg-type]
    assert got.stride() == want["stride"]
    assert got.stride_per_key_per_rank() == want["spkpr"]


# --------------------------------------------------------------------------------------------------
# random global inputs, the same on every rank


@st.composite
def global_inputs(draw: st.DrawFn, world: int) -> tuple[list[RankInput], list[int], int]:
    """Inputs of all ``world`` ranks, splits (zeros allowed) and a stagger that divides ``world``."""
    nkeys = draw(st.integers(0, 6))
    cuts = sorted(draw(st.lists(st.integers(0, nkeys), min_size=world - 1, max_size=world - 1)))
    splits = [b - a for a, b in zip([0, *cuts], [*cuts, nkeys], strict=True)]
    stagger = draw(st.sampled_from([d for d in range(1, world + 1) if world % d == 0]))
    vbe = draw(st.booleans())
    weighted = draw(st.booleans())
    dtype = np.dtype(draw(st.sampled_from(["i8", "f4", "f8", "u1", "c16"])))
    lengths_dtype = np.dtype(draw(st.sampled_from(["i8", "i4", "u2"])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    keys = [f"f{i}" for i in range(nkeys)]
    inputs = []
    for _ in range(world):
        stride = int(rng.integers(0, 4))
        slots = {k: (int(rng.integers(0, 4)) if vbe else stride) for k in keys}
        rows = {
            k: [(rng.integers(0, 100, int(rng.integers(0, 4)))).astype(dtype) for _ in range(slots[k])]
            for k in keys
        }
        weights = (
            {k: [rng.random(len(x)).astype(np.float32) for x in rows[k]] for k in keys} if weighted else None
        )
        inputs.append(RankInput(keys, rows, weights, vbe, lengths_dtype, stride, slots, dtype))
    if not weighted:
        for i in inputs:
            i.weights = None
    return inputs, splits, stagger


def simulate(inputs: list[RankInput], splits: list[int], stagger: int) -> list[KeyedJaggedArray]:
    """What each rank's recat returns, fed with the source-major blocks MPI would deliver."""
    world = len(inputs)
    kjas = [i.to_kja() for i in inputs]
    bounds = np.concatenate([[0], np.cumsum(splits)]).astype(int)
    order = np.array(stagger_order(world, stagger))
    outs = []
    for r in range(world):
        lo, hi = bounds[r], bounds[r + 1]
        lens, vals, wts, strides = [], [], [], []
        for kja in kjas:
            spk = np.concatenate([[0], np.cumsum(kja.stride_per_key())]).astype(int)
            opk = kja.offset_per_key()
            lens.append(kja.lengths()[spk[lo] : spk[hi]])
            vals.append(kja.values()[opk[lo] : opk[hi]])
            w = kja.weights()
            if w is not None:
                wts.append(w[opk[lo] : opk[hi]])
            strides.append(kja.stride_per_key()[lo:hi])
        vbe = kjas[0].variable_stride_per_key()
        table = np.array(strides, dtype=np.int64).reshape(world, hi - lo) if vbe else None
        stride_per_rank = np.array([k.stride() for k in kjas], dtype=np.int64)
        outs.append(
            _recat(
                kjas[0].keys()[lo:hi],
                np.concatenate(lens),
                np.concatenate(vals),
                np.concatenate(wts) if wts else None,
                stride_per_rank,
                table,
                order,
            )
        )
    return outs


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_recat_matches_reference_at_simulated_world_sizes(world: int, data: st.DataObject) -> None:
    inputs, splits, stagger = data.draw(global_inputs(world))
    for got, want in zip(
        simulate(inputs, splits, stagger), reference_all_to_all(inputs, splits, stagger), strict=True
    ):
        check_output(got, want)


def test_reference_reproduces_worked_example_2_6() -> None:
    r0 = RankInput(
        ["A", "B", "C"],
        {"A": [[100], [], [101, 102]], "B": [[], [200], [201]], "C": [[300], [301], []]},
        stride=3,
    )  # type: ignore[dict-item]
    r1 = RankInput(
        ["A", "B", "C"],
        {"A": [[103], [104], []], "B": [[], [202], [203, 204]], "C": [[302], [303], []]},
        stride=3,
    )  # type: ignore[dict-item]
    for r in (r0, r1):
        r.rows = {k: [np.array(x, dtype=np.int64) for x in v] for k, v in r.rows.items()}
    out0, out1 = reference_all_to_all([r0, r1], [2, 1])
    assert out0["lengths"] == [1, 0, 2, 1, 1, 0, 0, 1, 1, 0, 1, 2]
    assert out0["values"].tolist() == [100, 101, 102, 103, 104, 200, 201, 202, 203, 204]
    assert out1["lengths"] == [1, 1, 0, 1, 1, 0] and out1["stride"] == 6
    for got, want in zip(simulate([r0, r1], [2, 1], 1), [out0, out1], strict=True):
        check_output(got, want)


def test_stagger_order_matches_torchrec_get_recat() -> None:
    assert stagger_order(4, 2) == [0, 2, 1, 3]
    assert stagger_order(4, 1) == [0, 1, 2, 3]


# --------------------------------------------------------------------------------------------------
# KeyedJaggedArray


def seed_rank0() -> KeyedJaggedArray:
    return KeyedJaggedArray(["A", "B", "C"], np.array([100, 101, 102, 200, 201, 300, 301]),
                            lengths=np.array([1, 0, 2, 0, 1, 1, 1, 1, 0]))  # fmt: skip


def test_keyed_jagged_array_accessors_match_torchrec_doc_example() -> None:
    kja = KeyedJaggedArray(["F0", "F1"], np.arange(8), lengths=np.array([2, 0, 1, 1, 1, 3]))
    assert kja.stride() == 3
    assert kja.length_per_key() == [3, 5]
    assert kja.offset_per_key() == [0, 3, 8]
    assert kja.offsets().tolist() == [0, 2, 2, 3, 4, 5, 8]
    assert kja.stride_per_key() == [3, 3]
    assert kja.weights() is None and not kja.variable_stride_per_key()
    assert [x.tolist() for x in kja.to_dict()["F1"]] == [[3], [4], [5, 6, 7]]


def test_from_offsets_and_from_dict_equal_the_lengths_form() -> None:
    kja = seed_rank0()
    assert KeyedJaggedArray.from_offsets(kja.keys(), kja.values(), kja.offsets()) == kja
    rows = {k: [x.tolist() for x in v] for k, v in kja.to_dict().items()}
    assert KeyedJaggedArray.from_dict(rows) == kja
    assert KeyedJaggedArray.from_dict(rows, dtype=np.float32) != kja


def test_from_dict_with_different_row_counts_is_vbe() -> None:
    kja = KeyedJaggedArray.from_dict(
        {"A": [[1], [2, 3]], "B": [[4]]}, weights={"A": [[0.5], [1, 1]], "B": [[2]]}
    )
    assert kja.stride_per_key_per_rank() == [[2], [1]]
    assert kja.stride() == 2 and kja.stride_per_key() == [2, 1]
    assert kja.weights().tolist() == [0.5, 1, 1, 2]  # type: ignore[union-attr]


def test_vbe_accessors() -> None:
    kja = KeyedJaggedArray(
        ["A", "B"], np.arange(6), lengths=np.array([1, 2, 3]), stride_per_key_per_rank=[[1, 1], [1, 0]]
    )
    assert kja.stride() == 2 and kja.stride_per_key() == [2, 1]
    assert kja.length_per_key() == [3, 3]


def test_zero_keys_keep_the_given_stride() -> None:
    kja = KeyedJaggedArray([], np.empty(0), lengths=np.empty(0, np.int64), stride=6)
    assert kja.stride() == 6 and kja.length_per_key() == [] and kja.to_dict() == {}
    assert "stride=6" in repr(kja)


def test_repr_draws_the_table() -> None:
    text = repr(seed_rank0())
    lines = text.splitlines()
    assert lines[0].startswith("KeyedJaggedArray(keys=3, stride=3")
    assert lines[2].split() == ["A", "[100]", "[]", "[101,", "102]"]
    assert lines[4].split() == ["C", "[300]", "[301]", "[]"]


def test_equality_checks_dtypes_and_weights() -> None:
    a = seed_rank0()
    assert a == seed_rank0()
    b = KeyedJaggedArray(a.keys(), a.values(), lengths=a.lengths(), weights=np.ones(7))
    assert a != b
    assert a != KeyedJaggedArray(a.keys(), a.values().astype(np.int32), lengths=a.lengths())
    assert a.__eq__(3) is NotImplemented


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (
            {"lengths": np.array([1.0, 2.0, 0.0])},
            ArgumentTypeError,
            "lengths has dtype float64; expected an integer",
        ),
        ({"lengths": np.array([4, -1, 0])}, ArgumentError, "negative entry -1"),
        ({"lengths": np.array([1, 1, 0])}, ArgumentError, "lengths sum to 2; expected 3"),
        ({"lengths": np.array([1, 2])}, ArgumentError, "lengths has 2 entries; expected a multiple of 3"),
        ({"lengths": np.array([1, 1, 1]), "weights": np.ones(2)}, ArgumentError, "weights has shape (2,)"),
        (
            {"lengths": np.array([1, 1, 1]), "offsets": np.array([0, 1])},
            ArgumentError,
            "both lengths and offsets",
        ),
        ({}, ArgumentError, "neither lengths and offsets"),
        ({"offsets": np.array([0, 2, 1, 3])}, ArgumentError, "offsets decrease"),
        ({"offsets": np.array([1, 2, 3, 4])}, ArgumentError, "start with 0"),
        ({"lengths": np.array([1, 1, 1]), "stride": 2}, ArgumentError, "stride is 2; expected 1"),
        (
            {"lengths": np.array([3]), "stride_per_key_per_rank": [[1], [0]]},
            ArgumentError,
            "has 2 rows; expected 3",
        ),
        ({"lengths": np.array([3]), "stride_per_key_per_rank": [[1], [1], [1]]}, ArgumentError, "sums to 3"),
    ],
)
def test_construction_rejects_bad_input(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error) as info:
        KeyedJaggedArray(["A", "B", "C"], np.arange(3), **kwargs)
    assert words in str(info.value)
    assert str(info.value).startswith("KeyedJaggedArray: ")


def test_keys_must_be_unique_strings() -> None:
    with pytest.raises(ArgumentError, match=r"duplicates \['A'\]"):
        KeyedJaggedArray(["A", "A"], np.arange(2), lengths=np.array([1, 1]))
    with pytest.raises(ArgumentTypeError, match="keys\\[1\\] is 3; expected a str"):
        KeyedJaggedArray(["A", 3], np.arange(2), lengths=np.array([1, 1]))  # type: ignore[list-item]
    with pytest.raises(ArgumentTypeError, match="keys is a str"):
        KeyedJaggedArray("AB", np.arange(2), lengths=np.array([1, 1]))


def test_a_vbe_table_whose_sum_would_wrap_int64_is_refused() -> None:
    big = 2**63 - 1
    with pytest.raises(
        ArgumentError, match=r"stride_per_key_per_rank has an entry of \d+ slots; expected at most 0"
    ):
        KeyedJaggedArray(
            ["a"], np.zeros(0), lengths=np.zeros(0, np.int64), stride_per_key_per_rank=[[big, big, 2]]
        )
