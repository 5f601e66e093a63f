"""KJTAllToAll as torchrec users call it: ``KJTAllToAll(pg, splits, device, stagger)`` and the
``awaitable.wait().wait()`` chain, checked against a plain reference built from a shared seed."""

from __future__ import annotations

import numpy as np
import pytest

import mpicomm
from mpicomm import KeyedJaggedArray, KJTAllToAll


def _all_rows(w: int, nkeys: int, seed: int) -> list[dict[str, list[list[int]]]]:
    """Every rank's input as ``{key: rows}``; rank r has ``r + 1`` batch slots."""
    rng = np.random.default_rng(seed)
    keys = [f"f{k}" for k in range(nkeys)]
    return [
        {
            k: [rng.integers(0, 1000, size=int(rng.integers(0, 4))).tolist() for _ in range(r + 1)]
            for k in keys
        }
        for r in range(w)
    ]


def _kja(rows: dict[str, list[list[int]]]) -> KeyedJaggedArray:
    keys = list(rows)
    flat = [x for k in keys for x in rows[k]]
    values = np.array([v for x in flat for v in x], np.int64)
    return KeyedJaggedArray(keys, values, None, np.array([len(x) for x in flat], np.int64))


def _expected(
    everyone: list[dict[str, list[list[int]]]], splits: list[int], r: int
) -> dict[str, list[list[int]]]:
    keys = list(everyone[0])[sum(splits[:r]) : sum(splits[: r + 1])]
    return {k: [row for src in everyone for row in src[k]] for k in keys}


def _rows_of(kja: KeyedJaggedArray) -> dict[str, list[list[int]]]:
    return {k: [x.tolist() for x in ja] for k, ja in kja.to_dict().items()}


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("form", ["torchrec-positional", "torchrec-keywords", "mpicomm"])
def test_kjt_all_to_all_call_forms_give_the_reference(world, form):
    w, r = world.size(), world.rank()
    splits = [(j % 2) + 1 for j in range(w)]
    everyone = _all_rows(w, sum(splits), seed=14)
    if form == "torchrec-positional":
        a2a = KJTAllToAll(world, splits, None, 1)
    elif form == "torchrec-keywords":
        a2a = KJTAllToAll(pg=world, splits=splits, device="cpu", stagger=1)
    else:
        a2a = KJTAllToAll(splits, group=world)
    awaitable = a2a(_kja(everyone[r]))
    out = awaitable.wait().wait()  # torchrec's chain: splits awaitable, then tensors awaitable
    assert _rows_of(out) == _expected(everyone, splits, r)
    assert out.stride() == sum(range(1, w + 1))


@pytest.mark.mpi(min_size=2)
def test_kjt_all_to_all_positional_stagger(world):
    w, r = world.size(), world.rank()
    if w % 2:
        pytest.skip("stagger 2 needs an even group size")
    splits = [1] * w
    everyone = _all_rows(w, w, seed=5)
    got = KJTAllToAll(world, splits, None, 2)(_kja(everyone[r])).wait()
    want = KJTAllToAll(splits, stagger=2)(_kja(everyone[r])).wait()
    assert got == want


@pytest.mark.mpi(min_size=1)
def test_kjt_all_to_all_call_form_mistakes_say_the_right_form(world):
    w = world.size()
    with pytest.raises(
        mpicomm.ArgumentTypeError, match=r"device is 2; expected None or a device name.*stagger=2"
    ):
        KJTAllToAll(world, [1] * w, 2)
    with pytest.raises(mpicomm.ArgumentError, match="the group is given twice"):
        KJTAllToAll(world, [1] * w, group=world)
    with pytest.raises(mpicomm.ArgumentError, match="no splits given"):
        KJTAllToAll(world)
    with pytest.raises(mpicomm.ArgumentTypeError, match=r"pg is 'x'; expected a mpicomm.ProcessGroup"):
        KJTAllToAll("x", [1] * w)  # type: ignore[arg-type]
    with pytest.raises(mpicomm.ArgumentError, match=rf"splits has {w + 1} entries; expected {w}"):
        KJTAllToAll(None, [1] * (w + 1))
