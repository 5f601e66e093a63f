"""Importing mpicomm starts nothing; without a launcher it runs as a world of one rank.

Each check runs in a fresh interpreter, since the test process itself may have started MPI already.
"""

from __future__ import annotations

import pkgutil

import pytest
from mpijobs import python

import mpicomm
from mpicomm import errors


@pytest.mark.process
def test_import_does_not_load_mpi() -> None:
    got = python("""
        import json, sys
        import mpicomm
        import mpicomm.errors
        from mpicomm import ReduceOp, ArgumentError
        print(json.dumps({"mpi": "mpi4py.MPI" in sys.modules, "init": mpicomm.is_initialized(),
                          "validation": mpicomm.is_validation_enabled(),
                          "hooked": sys.excepthook is not sys.__excepthook__}))
    """)
    assert got == {"mpi": False, "init": False, "validation": False, "hooked": False}


@pytest.mark.process
def test_import_loads_neither_torch_nor_cupy() -> None:
    got = python("""
        import json, sys
        import numpy as np
        import mpicomm
        mpicomm.all_reduce(np.ones(2))  # a numpy call recognises its kind without them too
        print(json.dumps({"torch": "torch" in sys.modules, "cupy": "cupy" in sys.modules}))
    """)
    assert got == {"torch": False, "cupy": False}


@pytest.mark.process
def test_importing_every_submodule_does_not_load_mpi() -> None:
    names = sorted(
        m.name for m in pkgutil.walk_packages(mpicomm.__path__, "mpicomm.") if not m.name.endswith("__main__")
    )
    assert {"mpicomm.core.groups", "mpicomm.dense.reductions", "mpicomm.jagged.kjt"} <= set(names)
    got = python(f"""
        import importlib, json, sys
        loaded = {{}}
        for name in {names!r}:
            importlib.import_module(name)
            loaded[name] = "mpi4py.MPI" in sys.modules
        import mpicomm
        print(json.dumps({{"loaded": loaded, "init": mpicomm.is_initialized()}}))
    """)
    assert not any(got["loaded"].values()), f"these imports loaded mpi4py.MPI: {got['loaded']}"
    assert got["init"] is False


@pytest.mark.process
def test_errors_module_alone() -> None:
    got = python("""
        import json, sys
        from mpicomm.errors import CrossRankMismatchError
        value = issubclass(CrossRankMismatchError, ValueError)
        print(json.dumps({"mpi": "mpi4py.MPI" in sys.modules, "value": value}))
    """)
    assert got == {"mpi": False, "value": True}


@pytest.mark.process
def test_validation_environment_is_read_at_init() -> None:
    code = """
        import json, mpicomm
        before = mpicomm.is_validation_enabled()
        mpicomm.init()
        print(json.dumps({"before": before, "after": mpicomm.is_validation_enabled()}))
    """
    assert python(code, env={"MPICOMM_VALIDATE": "1"}) == {"before": False, "after": True}
    assert python(code, env={"MPICOMM_VALIDATE": "0"}) == {"before": False, "after": False}
    assert python(code) == {"before": False, "after": False}


@pytest.mark.process
def test_world_of_one_without_a_launcher() -> None:
    got = python("""
        import json, sys
        import numpy as np
        import mpicomm
        from mpicomm import ReduceOp

        res = {}
        x = np.arange(4.0)
        mpicomm.all_reduce(x)                       # starts MPI on first use
        res["initialized"] = mpicomm.is_initialized()
        res["size"], res["rank"] = mpicomm.get_world_size(), mpicomm.get_rank()
        res["all_reduce"] = x.tolist()
        y = np.array([-7, 7, 5], np.int64)
        mpicomm.all_reduce(y, op=ReduceOp.AVG)
        res["avg"] = y.tolist()
        z = np.array([1.0, 2.0])
        mpicomm.all_reduce(z, op=ReduceOp.PREMUL_SUM(0.5))
        res["premul"] = z.tolist()
        b = np.arange(3.0)
        mpicomm.broadcast(b, src=0)
        res["broadcast"] = b.tolist()
        r = np.arange(3)
        mpicomm.reduce(r, dst=0, op=ReduceOp.MAX)
        res["reduce"] = r.tolist()
        outs = [np.empty(2)]
        mpicomm.all_gather(outs, np.array([1.0, 2.0]))
        res["all_gather"] = outs[0].tolist()
        flat = np.empty(2)
        mpicomm.all_gather_into_tensor(flat, np.array([3.0, 4.0]))
        res["all_gather_into_tensor"] = flat.tolist()
        g = [np.empty(1)]
        mpicomm.gather(np.array([5.0]), g, dst=0)
        res["gather"] = g[0].tolist()
        s = np.empty(1)
        mpicomm.scatter(s, [np.array([6.0])], src=0)
        res["scatter"] = s.tolist()
        o = np.empty(2)
        mpicomm.reduce_scatter(o, [np.array([7.0, 8.0])])
        res["reduce_scatter"] = o.tolist()
        mpicomm.reduce_scatter_tensor(o, np.array([9.0, 10.0]))
        res["reduce_scatter_tensor"] = o.tolist()
        a = [np.empty(2)]
        mpicomm.all_to_all(a, [np.array([11.0, 12.0])])
        res["all_to_all"] = a[0].tolist()
        a2 = np.empty(3)
        mpicomm.all_to_all_single(a2, np.array([1.0, 2.0, 3.0]), [3], [3])
        res["all_to_all_single"] = a2.tolist()
        mpicomm.barrier()
        w = mpicomm.all_reduce(np.ones(2), async_op=True)
        res["work"] = w.wait()
        try:
            mpicomm.send(np.ones(1), dst=0)
        except mpicomm.ArgumentError as exc:
            res["send_to_self"] = str(exc)
        mpicomm.set_validation(True)
        v = np.ones(2)
        mpicomm.all_reduce(v)
        res["validated"] = v.tolist()
        res["hooked"] = sys.excepthook is not sys.__excepthook__
        print(json.dumps(res))
    """)
    assert got["initialized"] is True
    assert (got["size"], got["rank"]) == (1, 0)
    assert got["all_reduce"] == [0.0, 1.0, 2.0, 3.0]
    assert got["avg"] == [-7, 7, 5]
    assert got["premul"] == [0.5, 1.0]
    assert got["broadcast"] == [0.0, 1.0, 2.0]
    assert got["reduce"] == [0, 1, 2]
    assert got["all_gather"] == [1.0, 2.0]
    assert got["all_gather_into_tensor"] == [3.0, 4.0]
    assert got["gather"] == [5.0]
    assert got["scatter"] == [6.0]
    assert got["reduce_scatter"] == [7.0, 8.0]
    assert got["reduce_scatter_tensor"] == [9.0, 10.0]
    assert got["all_to_all"] == [11.0, 12.0]
    assert got["all_to_all_single"] == [1.0, 2.0, 3.0]
    assert got["work"] is True
    assert got["send_to_self"].startswith("send: dst")
    assert got["validated"] == [1.0, 1.0]
    assert got["hooked"] is False, "the abort hook is for multi-rank jobs only"


def test_error_hierarchy() -> None:
    """Each class is a MpicommError and the built-in a Python user would catch."""
    expected = {
        errors.ArgumentError: ValueError,
        errors.ArgumentTypeError: TypeError,
        errors.ReductionTypeError: TypeError,
        errors.DtypeMismatchError: TypeError,
        errors.CrossRankMismatchError: ValueError,
        errors.GroupError: RuntimeError,
        errors.CommunicationError: RuntimeError,
        errors.MPIUnavailableError: RuntimeError,
        errors.DistError: RuntimeError,
        errors.DistBackendError: RuntimeError,
        errors.DistNetworkError: RuntimeError,
        errors.DistStoreError: RuntimeError,
    }
    for cls, builtin in expected.items():
        assert issubclass(cls, errors.MpicommError) and issubclass(cls, builtin), cls
        assert getattr(mpicomm, cls.__name__) is cls
    assert issubclass(errors.ReductionTypeError, errors.ArgumentTypeError)
    # torch raises ValueError for complex MAX and for lists of mixed dtypes: these are both types
    assert issubclass(errors.ReductionTypeError, ValueError) and issubclass(
        errors.DtypeMismatchError, ValueError
    )
    assert not issubclass(errors.ArgumentError, TypeError)
    assert not issubclass(errors.ArgumentTypeError, ValueError)
    assert set(errors.__all__) == {c.__name__ for c in expected} | {"MpicommError"}


@pytest.mark.parametrize("name", sorted(mpicomm.__all__))
def test_public_names_exist(name: str) -> None:
    assert hasattr(mpicomm, name), name


def test_names_that_moved_still_import_from_their_old_modules() -> None:
    from mpicomm.c10d import backend_names as backend
    from mpicomm.c10d import startup as torch_compat
    from mpicomm.core import fast

    assert torch_compat.is_available is backend.is_available is mpicomm.is_available
    assert torch_compat.is_mpi_available is backend.is_mpi_available is mpicomm.is_mpi_available
    world = mpicomm.init()
    other = (world.rank() + 1) % world.size()
    assert fast.peer(world, other, None, 0) is (world.size() > 1)
    assert fast.peer(world, other, 0, 0) is False and fast.peer(world, other, None, -1) is False
