"""Each lower layer works alone, without the run-time plugs of ``mpicomm.wiring`` (issue 40 item 4).

Each test runs one lower layer in a fresh interpreter where ``mpicomm`` is a bare package: its
``__init__`` (which imports the wiring and the torch room) never runs, so no upper layer has
plugged anything in. The layer must then do its job on one rank, leave its plug points empty, and
import nothing above it. ``tests/unit/test_package_layout.py`` checks that every plug is listed.
"""

from __future__ import annotations

from typing import Any

import pytest
from mpijobs import python

import mpicomm

#: Opens every job: ``mpicomm`` as a bare package (its __init__ not run), numpy, a JSON answer.
BARE = f"""
import json, sys, types
import numpy as np
package = types.ModuleType("mpicomm")
package.__path__ = {list(mpicomm.__path__)!r}
sys.modules["mpicomm"] = package
"""

#: Prints the answer ``out``, with the mpicomm folders the job imported.
ANSWER = """
out["folders"] = sorted({m.split(".")[1] for m in sys.modules if m.startswith("mpicomm.")})
print(json.dumps(out))
"""

SHARED = {"_mpi", "errors", "sizes"}


pytestmark = pytest.mark.process  # every test starts processes


def _alone(body: str) -> dict[str, Any]:
    got: dict[str, Any] = python(BARE + body + ANSWER)
    return got


def test_core_alone_has_no_torch_methods_and_asks_its_own_chunk_question() -> None:
    got = _alone("""
from mpicomm.core import chunks, groups
g = groups.init()
out = {"world": [g.rank(), g.size()], "sub": groups.new_group([0], backend="MPI").size()}
names = ("allreduce", "send", "_allgather_base")
out["torch_methods"] = [n for n in names if hasattr(groups.ProcessGroup, n)]
out["split"] = [chunks.split(g.comm, True), chunks.split(g.comm, False)]  # asked: MIN over one rank
""")
    assert got["world"] == [0, 1] and got["sub"] == 1
    assert got["torch_methods"] == []  # wiring.later names them; nothing below it does
    assert got["split"] == [True, False]
    assert {"core"} <= set(got["folders"]) <= {"core"} | SHARED


def test_dense_alone_reduces_small_and_chunk_sized_arrays() -> None:
    got = _alone("""
from mpicomm.dense import reductions
small, large = np.arange(3.0), np.ones((4 << 20) // 8 + 1)  # past one chunk: asks every rank first
reductions.all_reduce(small)
reductions.all_reduce(large)
out = {"small": small.tolist(), "large": [float(large.min()), float(large.max())]}
""")
    assert got["small"] == [0.0, 1.0, 2.0] and got["large"] == [1.0, 1.0]
    assert {"core", "dense"} <= set(got["folders"]) <= {"core", "dense"} | SHARED


def test_objects_alone_move_host_objects_and_name_the_missing_gpu_hooks() -> None:
    got = _alone("""
from mpicomm.objects import all_gather_object, broadcast_object_list, devbufs, tensors
objs = [{"a": np.arange(3)}, "b"]
broadcast_object_list(objs, src=0)
gathered = [None]
all_gather_object(gathered, {"k": (1, 2.5)})
out = {"objs": [objs[0]["a"].tolist(), objs[1]], "gathered": gathered[0]["k"]}
out["hooks"] = [devbufs.Hooks.backend, devbufs.Hooks.view, tensors.CpuView.view]

class Device:  # a device array by its protocol: it needs the GPU hooks the wiring gives
    __cuda_array_interface__ = {"shape": (2,), "typestr": "<f8", "data": (0, False), "version": 3}

try:
    all_gather_object(gathered, Device())
    out["device"] = "sent"
except Exception as e:
    out["device"] = str(e)
""")
    assert got["objs"] == [[0, 1, 2], "b"] and got["gathered"] == [1, 2.5]
    assert got["hooks"] == [None, None, None]
    assert "GPU hooks are not set" in got["device"] and "mpicomm.wiring.objects()" in got["device"]
    assert {"core", "dense", "objects"} <= set(got["folders"]) <= {"core", "dense", "objects"} | SHARED


def test_jagged_alone_answers_in_its_own_classes() -> None:
    got = _alone("""
from mpicomm.jagged import KJTAllToAll, KeyedJaggedArray, jagged_all_to_all
from mpicomm.jagged import kjt
kja = KeyedJaggedArray(["a", "b"], np.arange(4.0), lengths=np.array([1, 2, 0, 1]))
a2a = KJTAllToAll([2])
handle = a2a(kja)
done = handle.wait()
result = jagged_all_to_all(np.arange(3.0), np.array([2, 1]), [2])
out = {"kjt": [type(handle).__module__, type(done).__module__, done.values().tolist()]}
out["device_path"] = KJTAllToAll._device is None
out["classes"] = [KJTAllToAll._keyed is KeyedJaggedArray, KJTAllToAll._awaitable is kjt.KJTAllToAllAwaitable]
out["jagged"] = [result.values.tolist(), result.lengths.tolist()]
""")
    assert got["kjt"] == ["mpicomm.jagged.kjt", "mpicomm.jagged.keyed", [0.0, 1.0, 2.0, 3.0]]
    assert got["device_path"] and got["classes"] == [True, True]
    assert got["jagged"] == [[0.0, 1.0, 2.0], [2, 1]]
    assert {"core", "jagged"} <= set(got["folders"]) <= {"core", "jagged"} | SHARED


def test_import_mpicomm_names_the_torch_methods_and_hands_out_object_calls_with_their_hooks() -> None:
    """With mpicomm's __init__ run: torch's methods named (not loaded), the GPU hooks set on demand."""
    got = python("""
        import json, sys
        import mpicomm
        from mpicomm.objects import devbufs
        out = {"named": "allreduce" in dir(mpicomm.ProcessGroup), "before": devbufs.Hooks.backend is None}
        out["wiring_at_import"] = "mpicomm.wiring" in sys.modules  # no file more at start-up
        mpicomm.all_gather_object  # an object collective handed out: its hooks first
        out["after"] = [devbufs.Hooks.backend is not None, devbufs.Hooks.view is not None]
        out["pg_methods"] = "mpicomm.c10d.pg_methods" in sys.modules
        print(json.dumps(out))
    """)
    assert got == {
        "named": True,
        "before": True,
        "wiring_at_import": False,
        "after": [True, True],
        "pg_methods": False,
    }
