"""Torch in, torch out for every object a torch-built KeyedJaggedArray derives (one process, no MPI).

Each operation runs on two arrays of the same content, one built from torch tensors and one from
numpy arrays: the torch-built one must answer torch tensors of the same dtypes and values as the
numpy-built one's numpy arrays, which stay numpy.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm import jagged as host

torch = pytest.importorskip("torch")

KJA = mpicomm.KeyedJaggedArray
Op = Callable[[KJA], list[Any]]

#                         slot 0     slot 1        slot 2
# A                        [1.5]         []          [2, 3]
# B                       [4, 5]        [6]              []
# C                           []   [7, 8, 9]            [10]
KEYS = ["A", "B", "C"]
VALUES = np.array([1.5, 2, 3, 4, 5, 6, 7, 8, 9, 10], dtype=np.float32)
LENGTHS = np.array([1, 0, 2, 2, 1, 0, 0, 3, 1], dtype=np.int32)
WEIGHTS = np.linspace(0.0, 1.0, VALUES.size)  # float64: a dtype other than the values'
VBE = [[1, 1], [2, 2], [2, 1]]  # the same nine lengths as a VBE table of two ranks: 2, 4 and 3 slots


def _build(kind: str, vbe: bool = False) -> KJA:
    """The table above as a KeyedJaggedArray built from torch tensors or numpy arrays (fresh copies)."""
    arrays = [VALUES.copy(), LENGTHS.copy(), WEIGHTS.copy()]
    values, lengths, weights = [torch.from_numpy(a) for a in arrays] if kind == "torch" else arrays
    table = VBE if vbe else None
    return KJA(KEYS, values, weights, lengths, stride_per_key_per_rank=table)


def _accessors(x: Any) -> list[Any]:
    """What a KeyedJaggedArray or JaggedArray answers: values, lengths, offsets, weights (twice)."""
    return [x.values(), x.lengths(), x.offsets(), x.weights(), x.weights_or_none()]


def _check(got: list[Any], want: list[Any], kind: str) -> None:
    """``got`` (from the ``kind``-built array) holds ``want``'s arrays, in ``kind``."""
    assert len(got) == len(want) > 0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert isinstance(w, np.ndarray), (i, type(w))
        if kind == "torch":
            assert isinstance(g, torch.Tensor), (i, type(g))
            g = g.numpy()
        assert type(g) is np.ndarray, (i, type(g))
        assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w), (i, g, w)


def _received(a2a: host.KJTAllToAll, kja: Any) -> host.KJTAllToAllAwaitable:
    """The host exchange on a one-rank group, without MPI: a copy of the input, already in place.

    As the host's call does: it reads the arrays inside ``kja`` (numpy, whatever the kind it was
    built from) and makes its output and handle in the classes ``a2a`` names.
    """
    w = kja._weights
    out = a2a._keyed(kja.keys(), kja._values.copy(), None if w is None else w.copy(), kja._lengths.copy())
    return a2a._awaitable(None, [out])


def _exchanged(kja: KJA) -> KJA:
    """``KJTAllToAll([1])(kja).wait()`` through the front's classes, the host exchange replaced."""
    a2a = mpicomm.KJTAllToAll.__new__(mpicomm.KJTAllToAll)  # no group: the host call is _received
    out: KJA = a2a(kja).wait()
    return out


OPS: dict[str, Op] = {
    "getitem": lambda k: _accessors(k["B"]),
    "to_dict": lambda k: [a for ja in k.to_dict().values() for a in _accessors(ja)],
    "to_dense": lambda k: k["C"].to_dense(),
    "row_index": lambda k: [k["A"][0], k["A"][-1], k["C"][1]],
    "row_slice": lambda k: k["B"][:2],
    "rows_iterated": lambda k: list(k["C"]),
    "permute": lambda k: _accessors(k.permute([2, 0])),
    "split": lambda k: [a for p in k.split([1, 0, 2]) for a in _accessors(p)],
    "concat": lambda k: _accessors(KJA.concat(k.split([2, 1])[::-1])),
    "empty_like": lambda k: _accessors(KJA.empty_like(k)),
    "wait": lambda k: _accessors(k.wait()),
    "split_then_permute_then_getitem": lambda k: _accessors(k.split([1, 2])[1].permute([1, 0])["C"]),
    "permute_then_split_then_to_dense": lambda k: k.permute([2, 1, 0]).split([2, 1])[0]["B"].to_dense(),
    "concat_then_to_dict": lambda k: [
        a
        for ja in KJA.concat([k.permute([1]), k.split([1, 2])[0]]).to_dict().values()
        for a in _accessors(ja)
    ],
    "empty_like_then_split": lambda k: _accessors(KJA.empty_like(k).split([0])[0]),
}


@pytest.mark.parametrize("vbe", [False, True], ids=["fixed", "vbe"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_derived_arrays_answer_in_the_kind_the_array_was_built_from(kind: str, op: str, vbe: bool) -> None:
    want = OPS[op](_build("numpy", vbe))
    _check(OPS[op](_build(kind, vbe)), want, kind)


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_permute_takes_torchrecs_indices_tensor(kind: str) -> None:
    order = torch.tensor([2, 0]) if kind == "torch" else np.array([2, 0])
    want = _accessors(_build("numpy").permute([2, 0]))
    _check(_accessors(_build(kind).permute([2, 0], order)), want, kind)


@pytest.mark.parametrize("kinds", [("torch", "numpy"), ("numpy", "torch")])
def test_concat_of_torch_and_numpy_built_arrays_answers_in_torch(kinds: tuple[str, str]) -> None:
    first, second = _build(kinds[0]).split([1, 2])[0], _build(kinds[1]).split([1, 2])[1]
    want = _accessors(KJA.concat(_build("numpy").split([1, 2])))
    _check(_accessors(KJA.concat([first, second])), want, "torch")


@pytest.mark.parametrize("form", ["from_lengths_sync", "from_offsets_sync", "from_offsets"])
@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_classmethod_constructors_answer_in_the_kind_they_are_given(kind: str, form: str) -> None:
    def build(k: str) -> KJA:
        ref = _build(k)
        cut = ref.lengths() if form == "from_lengths_sync" else ref.offsets()
        made: KJA = getattr(KJA, form)(KEYS, ref.values(), cut, ref.weights())
        return made

    want = build("numpy")
    _check(
        _accessors(build(kind)) + _accessors(build(kind)["B"]), _accessors(want) + _accessors(want["B"]), kind
    )


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_kjt_all_to_all_output_and_what_it_derives_answer_in_the_inputs_kind(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host.KJTAllToAll, "__call__", _received)
    want, got = _exchanged(_build("numpy")), _exchanged(_build(kind))
    assert type(got) is KJA
    for op in ("getitem", "to_dense", "permute", "split", "empty_like", "permute_then_split_then_to_dense"):
        _check(_accessors(got) + OPS[op](got), _accessors(want) + OPS[op](want), kind)


def test_numpy_built_arrays_give_the_host_jagged_array() -> None:
    kja = _build("numpy")
    assert type(kja["A"]) is mpicomm.JaggedArray
    assert all(type(ja) is mpicomm.JaggedArray for ja in kja.to_dict().values())
    assert isinstance(_build("torch")["A"], mpicomm.JaggedArray)


def test_torch_built_jagged_array_repr_and_equality_match_the_numpy_built_one() -> None:
    a, b = _build("torch"), _build("numpy")
    assert repr(a) == repr(b) and repr(a["C"]) == repr(b["C"])
    assert a["C"] == b["C"] and a.permute([1, 2, 0]) == b.permute([1, 2, 0])


def test_a_permuted_copy_does_not_keep_the_callers_tensor_alive() -> None:
    values = torch.from_numpy(VALUES.copy())
    gone = weakref.ref(values)
    kja = KJA(KEYS, values, lengths=torch.from_numpy(LENGTHS.copy()))
    copied = kja.permute([2, 1])
    del kja, values
    gc.collect()
    assert gone() is None
    assert isinstance(copied.values(), torch.Tensor) and copied.values().tolist() == [7, 8, 9, 10, 4, 5, 6]
