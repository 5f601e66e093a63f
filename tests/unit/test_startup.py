"""Start-up: ``import mpicomm`` and a first ``get_rank()`` import only what they need; the API is whole."""

from __future__ import annotations

import pytest
from mpijobs import python

import mpicomm

HEAVY = (
    "mpicomm.front",
    "mpicomm.dense",
    "mpicomm.jagged",
    "mpicomm.objects",
    "mpicomm.gpu",
    "mpicomm.c10d.pg_methods",
)


@pytest.mark.process
def test_a_first_get_rank_imports_neither_the_front_door_nor_the_data_paths() -> None:
    got = python("""
        import json, sys
        import mpicomm
        mpicomm.get_rank()
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("mpicomm") or m in ("torch", "cupy"))))
    """)
    assert "mpicomm.core.groups" in got
    assert not [m for m in got if m.startswith(HEAVY) or m in ("torch", "cupy")], got


@pytest.mark.process
def test_torchs_group_methods_attach_on_first_use() -> None:
    got = python("""
        import json
        import numpy as np
        import mpicomm
        world = mpicomm.init()
        x = np.ones(3)
        world.allreduce([x]).wait()
        print(json.dumps({"x": x.tolist(), "method": callable(mpicomm.ProcessGroup.allreduce)}))
    """)
    assert got == {"x": [1.0, 1.0, 1.0], "method": True}


def test_every_public_name_resolves_and_is_listed() -> None:
    for name in mpicomm.__all__:
        assert getattr(mpicomm, name) is not None, name
    assert set(mpicomm.__all__) <= set(dir(mpicomm))
    assert mpicomm.all_reduce.__module__.startswith("mpicomm.")
