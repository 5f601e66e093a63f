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


#: The asynchronous engine (issue 44): loaded by the first call that needs it, never by a blocking one.
ENGINE = ("mpicomm.core.engine", "mpicomm.core.engine_work", "mpicomm.core.lane")
#: What only an asynchronous program needs: the engine, and the futures of its Works.
ASYNC_ONLY = (*ENGINE, "mpicomm.core.future")


@pytest.mark.process
def test_blocking_calls_never_load_the_engine_and_the_first_async_call_loads_and_runs_it() -> None:
    got = python(f"""
        import json, sys, threading
        import numpy as np
        import mpicomm
        engine = {ASYNC_ONLY!r}
        mpicomm.init()
        x, y, z = np.ones(3), np.arange(4.0), np.arange(2.0)
        mpicomm.all_reduce(x)
        mpicomm.broadcast(y, 0)
        mpicomm.reduce(z, 0)  # a gated door (mpicomm.core.engine_gate.gate)
        out = [np.empty(4)]
        mpicomm.all_gather(out, y)
        blocking = sorted(m for m in engine if m in sys.modules)
        threads = sorted(t.name for t in threading.enumerate())
        work = mpicomm.all_reduce(x, async_op=True)
        loaded = sorted(m for m in engine if m in sys.modules)
        done = work.wait()
        fut = mpicomm.broadcast(y, 0, async_op=True).get_future()
        mpicomm.all_reduce(z)  # blocking behind a queued call: through the engine's queue
        print(json.dumps({{
            "blocking": blocking, "threads": threads, "loaded": loaded, "done": done,
            "x": x.tolist(), "y": fut.wait()[0].tolist(), "z": z.tolist(),
            "engine_thread": any(t.name == "mpicomm-engine" for t in threading.enumerate()),
            "pending": mpicomm.core.engine_gate.pending(),
        }}))
    """)
    assert got["blocking"] == [], got  # four blocking calls, two of them through the gate's wrapper
    assert "mpicomm-engine" not in got["threads"]
    assert got["loaded"] == sorted(ENGINE)  # the future loads with the first get_future()
    assert got["engine_thread"] and got["done"] is True and got["pending"] == 0
    assert got["x"] == [1.0] * 3 and got["y"] == [0.0, 1.0, 2.0, 3.0] and got["z"] == [0.0, 1.0]


@pytest.mark.process
def test_a_gated_host_loads_the_engine_at_its_first_async_call_only() -> None:
    got = python("""
        import json, sys
        import numpy as np
        from mpicomm.core import engine_gate, groups
        groups.init()
        ran = []
        host = engine_gate.gate("example")(lambda x, group=None, async_op=False: ran.append(float(x.sum())))
        host(np.ones(1))
        before = "mpicomm.core.engine" in sys.modules
        work = host(np.ones(2), async_op=True)
        work.wait()
        host(np.ones(3))
        print(json.dumps({"before": before, "ran": ran, "after": "mpicomm.core.engine" in sys.modules,
                          "queued": engine_gate.pending(), "work": type(work).__module__}))
    """)
    assert got == {
        "before": False,
        "ran": [1.0, 2.0, 3.0],
        "after": True,
        "queued": 0,
        "work": "mpicomm.core.engine_work",
    }
