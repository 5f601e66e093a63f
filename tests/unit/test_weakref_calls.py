"""Every public call takes a weak reference, as a function does, on the C path and off it (issue 44).

Caches keyed weakly by function (functools.singledispatch registries, torch's hooks, a
WeakKeyDictionary of callbacks) hold mpicomm's calls; the C front door (``_cmpi_door.c``) used to
refuse ``weakref.ref``. The test runs in whichever form this process uses (``MPICOMM_C=0``: the
Python wrappers); both are in the Makefile's runs.
"""

from __future__ import annotations

import gc
import weakref

import pytest

import mpicomm
from mpicomm.front import collectives


@pytest.mark.parametrize("name", collectives.__all__)
def test_a_public_call_takes_a_weak_reference(name: str) -> None:
    call = getattr(mpicomm, name)
    ref = weakref.ref(call)
    assert ref() is call
    table: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary({call: 1})
    assert table[call] == 1


def test_a_door_that_goes_away_clears_its_weak_references() -> None:
    from mpicomm.dense import reductions
    from mpicomm.front.door import BOTH, front_door

    # a second door over the real host (a door's wrapper is generated for its host's parameters)
    door = front_door("all_reduce", {"tensor": BOTH})(reductions.all_reduce)
    ref = weakref.ref(door)
    del door
    gc.collect()
    assert ref() is None
