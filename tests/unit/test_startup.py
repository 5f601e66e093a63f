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


#: What a numpy program's first all_reduce must not load (issue 44): the GPU, jagged and object
#: machinery, the other data paths' doors, and what only the GPU paths use.
NOT_FOR_NUMPY = (
    "mpicomm.gpu",
    "mpicomm.jagged",
    "mpicomm.objects",
    "mpicomm.front.jagged",
    "mpicomm.front.sparse",
    "mpicomm.dense.alltoall",
    "mpicomm.dense.p2p",
    "mpicomm.dense.batch",
    "mpicomm.c10d.pg_methods",
)
NOT_FOR_NUMPY_STDLIB = ("subprocess", "shutil", "bz2", "lzma", "dataclasses", "copy", "pickle")


@pytest.mark.process
def test_a_first_numpy_all_reduce_loads_no_gpu_jagged_or_object_machinery() -> None:
    got = python("""
        import json, sys
        import numpy as np
        from mpi4py import MPI
        before = set(sys.modules)
        import mpicomm
        mpicomm.init()
        x = np.ones(3)
        mpicomm.all_reduce(x)
        new = sorted(set(sys.modules) - before)
        made = sorted(k for k in ("broadcast", "send") if k in vars(mpicomm.front.collectives))
        print(json.dumps({"x": x.tolist(), "new": new, "doors": made}))
    """)
    assert got["x"] == [1.0] * 3
    assert not [m for m in got["new"] if m.startswith(NOT_FOR_NUMPY) or m in NOT_FOR_NUMPY_STDLIB], got["new"]
    assert got["doors"] == []  # the other calls' doors are made on their first use


def test_the_lazy_doors_are_the_public_calls_and_keep_their_aliases() -> None:
    from mpicomm.front import collectives

    assert mpicomm.all_gather_single is mpicomm.all_gather_into_tensor is collectives.all_gather_into_tensor
    assert mpicomm.reduce_scatter_single is collectives.reduce_scatter_tensor
    assert mpicomm.jagged_all_to_all.__name__ == "jagged_all_to_all"
    for name in collectives.__all__:
        assert getattr(collectives, name) is getattr(mpicomm, name), name
