"""No pickle-based mpi4py call anywhere in the library: control traffic is typed words (issue 22, item 1).

mpi4py's lowercase methods (``comm.bcast``, ``comm.allgather``, ``comm.recv``, ...) pickle and unpickle
what they carry, so a hostile rank's object would run code on every receiver. The scan reads the
source (ast): a call of one of those names on anything but a module of ours or torch's is refused.
The benchmark keeps them on purpose: they are its baselines, never mpicomm's own traffic.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import mpicomm

PACKAGE = Path(mpicomm.__file__).resolve().parent
PICKLING = {
    "bcast", "allgather", "gather", "scatter", "send", "recv", "isend", "irecv", "issend", "ssend",
    "alltoall", "allreduce", "reduce", "sendrecv", "scan", "exscan", "ibcast", "iallgather", "mprobe",
}  # fmt: skip
#: A receiver that is a communicator, by the names mpicomm and mpi4py give them (``comm``, ``g.comm``,
#: ``g.internal``, ``ctl``, ``MPI.COMM_WORLD``, ``self._comm``, ``intercomm``).
COMM = re.compile(r"(^|[._])(comm|ctl|internal|intercomm|COMM_WORLD|COMM_SELF)$")
#: The benchmark's baselines compare mpicomm with these calls.
BASELINES = {"apps/bench/objects.py"}


def _pickling_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PICKLING:
            owner = ast.unparse(node.func.value)
            if not COMM.search(owner):  # np.add.reduce, lay.recv, collectives.isend: not a communicator
                continue
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node.func)}(...)")
    return found


def test_the_library_makes_no_pickle_based_mpi4py_call() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if str(path.relative_to(PACKAGE)) not in BASELINES:
            bad += _pickling_calls(path)
    assert not bad, "pickle-based mpi4py calls:\n" + "\n".join(bad)


def test_the_scan_finds_such_a_call(tmp_path: Path) -> None:
    probe = PACKAGE / "_probe_for_test.py"
    try:
        probe.write_text("def f(comm):\n    return comm.allgather(1)\n")
        assert _pickling_calls(probe) == ["_probe_for_test.py:2: comm.allgather(...)"]
    finally:
        probe.unlink()
