"""MPICH's point-to-point algorithm for large all_reduce and broadcast (mpicomm.core.algorithms).

The switch acts only below ``MPI_THREAD_MULTIPLE``, where mpicomm (not ``python -m mpi4py``) starts
MPI: so each case is a job of its own under ``mpiexec``. Every rank builds the global input from a
shared seed (integer-valued floats, so sums are exact whatever the algorithm) and checks its result
against numpy, counts the calls the C module switched, and reads MPICH's variable back afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mpijobs import needs_mpiexec, run_job

pytestmark = [needs_mpiexec, pytest.mark.process]  # every test starts processes

PRELUDE = """
    import sys

    import numpy as np
    import mpicomm
    from mpicomm.core import algorithms, cmpi
    from mpicomm.c10d.waiting import read_cvar, write_cvar

    mpicomm.init()
    from mpi4py import MPI

    w = MPI.COMM_WORLD
    rank, size = w.Get_rank(), w.Get_size()
    if "MPICH" not in MPI.Get_library_version() or cmpi.bound() is not None:
        print("NOT MPICH WITH THE C CALLS", flush=True)
        sys.exit(0)
    AR, BC = algorithms.VARIABLES
    rng = np.random.default_rng(44)


    def glob(nbytes):
        return rng.integers(-1000, 1000, size=(size, nbytes // 8)).astype(np.float64)
"""

SWITCHED = (
    PRELUDE
    + """
    assert MPI.Query_thread() == MPI.THREAD_SERIALIZED, MPI.Query_thread()
    assert algorithms.installed() == algorithms.VARIABLES, algorithms.installed()
    for nbytes in (8, algorithms.FROM - 8, algorithms.FROM, 1 << 20):
        big = nbytes >= algorithms.FROM
        g = glob(nbytes)
        # contiguous (the C call) and strided (staged, then the C call) all_reduce
        for x in (g[rank].copy(), np.zeros((g.shape[1], 2))[:, 0]):
            x[...] = g[rank]
            before = algorithms.switches()
            mpicomm.all_reduce(x)
            assert np.array_equal(x, g.sum(0)), (rank, nbytes)
            assert algorithms.switches()[0] - before[0] == big, (nbytes, before, algorithms.switches())
            assert read_cvar(AR) == 2, read_cvar(AR)  # MPICH's default back after the call
        # broadcast: contiguous (the C call) and strided (mpi4py's, inside algorithms.large)
        for y in (np.zeros(g.shape[1]), np.zeros((g.shape[1], 3))[:, 1]):
            if rank == size - 1:
                y[...] = g[size - 1]
            before = algorithms.switches()
            mpicomm.broadcast(y, size - 1)
            assert np.array_equal(y, g[size - 1]), (rank, nbytes)
            if y.flags.c_contiguous:
                assert algorithms.switches()[1] - before[1] == big, (nbytes, before, algorithms.switches())
            assert read_cvar(BC) == 2, read_cvar(BC)
    # a value set through the tool interface is the user's choice: kept, never switched
    assert write_cvar(AR, 1)  # release_gather
    g = glob(1 << 20)
    x = g[rank].copy()
    before = algorithms.switches()
    mpicomm.all_reduce(x)
    assert np.array_equal(x, g.sum(0))
    assert algorithms.switches() == before and read_cvar(AR) == 1
    assert write_cvar(AR, 2)
    print(f"SWITCHED OK {rank}", flush=True)
"""
)

LEFT_ALONE = (
    PRELUDE
    + """
    assert algorithms.installed() == (), algorithms.installed()
    g = glob(1 << 20)
    x = g[rank].copy()
    mpicomm.all_reduce(x)
    assert np.array_equal(x, g.sum(0))
    y = g[0].copy() if rank == 0 else np.zeros(g.shape[1])
    mpicomm.broadcast(y, 0)
    assert np.array_equal(y, g[0])
    assert algorithms.switches() == (0, 0), algorithms.switches()
    print(f"LEFT ALONE OK {rank}", flush=True)
"""
)


def _ran(out: str, word: str, ranks: int) -> bool:
    """Whether every rank printed ``word OK`` (False, with the reason printed, off MPICH)."""
    if "NOT MPICH WITH THE C CALLS" in out:
        pytest.skip("MPICH with mpicomm's C calls only")
    return out.count(f"{word} OK") == ranks


@pytest.mark.parametrize("ranks", [2, 3])
def test_large_calls_take_the_point_to_point_algorithm_at_serialized(tmp_path: Path, ranks: int) -> None:
    status, out, _ = run_job(tmp_path, SWITCHED, ranks, timeout=120)
    assert status == 0, out
    assert _ran(out, "SWITCHED", ranks), out


@pytest.mark.parametrize(
    "env",
    [
        {"MPI4PY_RC_THREAD_LEVEL": "multiple"},  # MPICH has no release_gather there
        {"MPICOMM_MPICH_P2P_FROM": "0"},  # switched off
        {"MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM": "auto", "MPICH_BCAST_POSIX_INTRA_ALGORITHM": "auto"},
    ],
    ids=["multiple", "off", "user-set"],
)
def test_the_switch_stays_off_where_it_should(tmp_path: Path, env: dict[str, str]) -> None:
    status, out, _ = run_job(tmp_path, LEFT_ALONE, 2, env, timeout=120)
    assert status == 0, out
    assert _ran(out, "LEFT ALONE", 2), out


KMEANS = """
    import sys

    import numpy as np
    import mpicomm

    mpicomm.init()
    from mpi4py import MPI

    sys.path.insert(0, {mpi_tests!r})
    import test_kmeans_twin as t

    if {twin!r}:  # raw mpi4py, at mpi4py's own default level (run with MPI4PY_RC_THREAD_LEVEL=multiple)
        got = t._twin(MPI.COMM_WORLD.Dup())
    else:  # mpicomm at its default level (serialized), the large sums switched to point-to-point
        got = t._ours(mpicomm.new_group(list(range(mpicomm.get_world_size()))))
    if MPI.COMM_WORLD.Get_rank() == 0:
        np.save({out!r}, got)
    print(f"KMEANS {{MPI.Query_thread()}}", flush=True)
"""


def test_kmeans_at_serialized_equals_its_mpi4py_twin_at_mpi4py_default_level(tmp_path: Path) -> None:
    """The twin of tests/mpi/test_kmeans_twin.py at 4 ranks across levels: MPICH's point-to-point
    algorithm at ``serialized`` is the one a plain mpi4py program gets at ``multiple``."""
    import numpy as np

    mpi_tests = str(Path(__file__).resolve().parent.parent / "mpi")
    results = {}
    for twin, env in ((True, {"MPI4PY_RC_THREAD_LEVEL": "multiple"}), (False, {})):
        out = str(tmp_path / f"centers_{twin}.npy")
        body = KMEANS.format(mpi_tests=mpi_tests, twin=twin, out=out)
        status, text, _ = run_job(tmp_path, body, 4, env, timeout=180)
        assert status == 0, text
        assert text.count(f"KMEANS {3 if twin else 2}") == 4, text  # multiple (3), serialized (2)
        results[twin] = np.load(out)
    assert results[True].tobytes() == results[False].tobytes(), np.abs(results[True] - results[False]).max()


def test_the_threshold_reads_a_size_and_refuses_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpicomm.core import algorithms
    from mpicomm.errors import ArgumentError

    monkeypatch.delenv("MPICOMM_MPICH_P2P_FROM", raising=False)
    assert algorithms.threshold() == algorithms.FROM
    for text, want in (("0", 0), ("65536", 65536), ("64K", 65536), ("1MiB", 1 << 20)):
        monkeypatch.setenv("MPICOMM_MPICH_P2P_FROM", text)
        assert algorithms.threshold() == want
    for bad in ("-1", "lots", "1.5"):
        monkeypatch.setenv("MPICOMM_MPICH_P2P_FROM", bad)
        with pytest.raises(ArgumentError, match="MPICOMM_MPICH_P2P_FROM"):
            algorithms.threshold()
