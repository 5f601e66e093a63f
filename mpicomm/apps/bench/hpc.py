"""Issue 33's rows: jagged and KJT against the C two-step, 8 B all_reduce at each thread level, start-up.

Run it outside any launcher; it starts the jobs itself (2 ranks by default)::

    python -m mpicomm.apps.bench.hpc [--ranks 2] [--launches 10] [--json hpc.json]

For each thread level (mpicomm's own choice, then ``multiple`` and ``single``) one job times, in
rounds that alternate the contenders, the median of per-call times (max over ranks):

* ``all_reduce`` of 8 B: mpicomm, raw mpi4py ``Allreduce(IN_PLACE)``, and ``MPI_Allreduce`` from a C
  loop (:mod:`mpicomm.apps.bench.cloop`);
* ``jagged_all_to_all`` at 8 B, 1 KiB, 64 KiB and 1 MiB of values per rank (4 rows per destination),
  against the C two-step (``MPI_Alltoall`` of counts, ``malloc``, ``MPI_Alltoallv``) and the same
  two-step from mpi4py;
* ``KJTAllToAll`` at 1 KiB per rank (the bench's ``jagged`` shape) against the C two-step of its values;
* ``CartGrid.exchange_halos`` of a 512x512 float64 block with one ghost layer (a ``(514, 514)`` array),
  corners included, against the exchange written by hand with mpi4py on a ``Create_cart`` of the same
  shape: each face copied out (``np.ascontiguousarray``), ``Sendrecv``, copied back into the ghost
  layer, the rows spanning the ghost columns (the corners). Two grids: the ranks in one row (the
  strided columns travel; the other axis is a fixed boundary) and in one column (the rows travel).
* ``all_reduce`` of 4, 8, 16 and 64 MiB against raw ``Allreduce(IN_PLACE)`` (issue 44, :func:`large_rows`;
  64 MiB goes in pieces, :mod:`mpicomm.core.pieces`).

Start-up: ``--launches`` runs each of ``mpiexec -n 2 python -c "import mpicomm; mpicomm.get_rank()"``
and ``... "import numpy; from mpi4py import MPI; MPI.COMM_WORLD.Get_rank()"``, interleaved; medians.
Then issue 44's first call (:data:`FIRST_CALL`): the first numpy ``all_reduce`` against mpi4py's
first ``Allreduce``, and imports + MPI start + that call, timed inside each process; medians.
It says so where mpicomm's modules have no cached bytecode (an editable install under
``PYTHONDONTWRITEBYTECODE=1``): they are then compiled at every start, about 15 ms a process.
The table at the end gives each target of the issue, its measured ratio and whether it is met.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main"]

LEVELS = ("mpicomm", "multiple", "single")
#: The halo rows: name, the grid's dims at ``n`` ranks, periodic per axis.
HALO_GRIDS = (
    ("columns", lambda n: (1, n), (False, True)),
    ("rows", lambda n: (n, 1), (True, False)),
)
#: The block's interior cells per axis.
HALO_N = 512
JAGGED_SIZES = (8, 1 << 10, 64 << 10, 1 << 20)
IMPORTS = {
    "mpicomm": "import mpicomm; mpicomm.get_rank()",
    "numpy+mpi4py": "import numpy; from mpi4py import MPI; MPI.COMM_WORLD.Get_rank()",
}


def _per_call(comm: Any, fn: Callable[[], object], iters: int) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def _iters(nbytes: int) -> int:
    return 2000 if nbytes <= 1024 else 400 if nbytes <= 64 << 10 else 40


def child(rounds: int) -> dict[str, Any]:
    """One job's timings (rank 0 returns them; the others an empty dict)."""
    import mpicomm
    from mpicomm import _mpi
    from mpicomm.apps.bench import cloop
    from mpicomm.apps.bench.dense import split_counts
    from mpicomm.apps.bench.jagged import KEYS_PER_RANK, jagged_lengths

    mpicomm.init()
    MPI = _mpi.MPI
    comm = MPI.COMM_WORLD.Dup()
    r, n = comm.Get_rank(), comm.Get_size()
    lib = cloop.load()
    rows: dict[str, dict[str, float]] = {}

    def measure(name: str, contenders: dict[str, Callable[[], float]]) -> None:
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for i in range(rounds):
            order = list(contenders) if i % 2 == 0 else list(contenders)[::-1]
            for k in order:
                times[k].append(contenders[k]())
        mine = np.array([statistics.median(times[k]) for k in contenders])
        worst = np.empty_like(mine)
        comm.Allreduce(mine, worst, op=MPI.MAX)
        rows[name] = {k: float(v) * 1e6 for k, v in zip(contenders, worst, strict=True)}

    x = np.zeros(2, np.float32)
    ar: dict[str, Callable[[], float]] = {
        "mpicomm": partial(_per_call, comm, partial(mpicomm.all_reduce, x), 5000),
        "mpi4py": partial(_per_call, comm, partial(comm.Allreduce, MPI.IN_PLACE, [x, MPI.FLOAT]), 5000),
    }
    if lib is not None:
        ar["C"] = partial(cloop.allreduce, x, 5000)
    measure("all_reduce 8 B", ar)

    i64 = MPI.INT64_T
    for nbytes in JAGGED_SIZES:
        cnt = max(nbytes // 8, 1)
        vals = np.zeros(cnt * n, np.float64)
        lens = np.zeros(4 * n, np.int64)
        lens[::4] = cnt
        splits = [4] * n
        counts = np.full(n, cnt, np.int64)
        got = np.empty(n, np.int64)

        def raw(
            vals: np.ndarray = vals, counts: np.ndarray = counts, got: np.ndarray = got, c: int = cnt
        ) -> None:
            comm.Alltoall([counts, i64], [got, i64])
            rc = got.tolist()
            out = np.empty(sum(rc))
            rd = [sum(rc[:j]) for j in range(n)]
            comm.Alltoallv(
                [vals, ([c] * n, [c * j for j in range(n)]), MPI.DOUBLE], [out, (rc, rd), MPI.DOUBLE]
            )

        it = _iters(nbytes)
        jag: dict[str, Callable[[], float]] = {
            "mpicomm": partial(_per_call, comm, partial(mpicomm.jagged_all_to_all, vals, lens, splits), it),
            "mpi4py": partial(_per_call, comm, raw, it),
        }
        if lib is not None:
            jag["C"] = partial(cloop.two_step, vals, counts * 8, it)
        measure(f"jagged_all_to_all {nbytes} B", jag)

    c = (1 << 10) // 4
    lens = jagged_lengths(c, r, n)
    vals32 = np.zeros(int(lens.sum()), np.float32)
    keys = [f"k{i}" for i in range(KEYS_PER_RANK * n)]
    kja, a2a = mpicomm.KeyedJaggedArray(keys, vals32, lengths=lens), mpicomm.KJTAllToAll([KEYS_PER_RANK] * n)
    kjt: dict[str, Callable[[], float]] = {
        "mpicomm": partial(_per_call, comm, lambda: a2a(kja).wait(), 2000),
    }
    if lib is not None:
        sends = split_counts(c, n)[r] * 4
        kjt["C"] = partial(cloop.two_step, vals32, sends, 2000)
    measure("KJTAllToAll 1 KiB", kjt)

    for name, dims_at, periodic in HALO_GRIDS:
        grid = mpicomm.CartGrid(dims_at(n), periodic=periodic)
        cart = comm.Create_cart(list(grid.dims), list(periodic), reorder=False)
        ours, theirs = (np.random.default_rng(r).random((HALO_N + 2, HALO_N + 2)) for _ in range(2))
        shifts = (cart.Shift(0, 1), cart.Shift(1, 1))
        halo: dict[str, Callable[[], float]] = {
            "mpicomm": partial(_per_call, comm, partial(grid.exchange_halos, ours), 400),
            "mpi4py": partial(_per_call, comm, partial(hand_halos, cart, theirs, shifts), 400),
        }
        measure(f"exchange_halos {HALO_N}x{HALO_N} {name}", halo)
        cart.Free()
        mpicomm.destroy_process_group(grid.group)
    large_rows(mpicomm, comm, measure)
    comm.Free()
    if r != 0:
        return {}
    return {"thread_level": _mpi.thread_level(), "c_loop": cloop.why or "built with mpicc", "rows": rows}


def hand_halos(cart: Any, u: np.ndarray, shifts: tuple[tuple[int, int], tuple[int, int]]) -> None:
    """The ghost layers of ``u`` filled as a hand-written mpi4py code fills them (the bench's baseline).

    Columns first (interior rows), then rows spanning the ghost columns (the corners); each face copied
    out, one ``Sendrecv``, the ghost layer copied back where a neighbour sent one.
    """
    from mpi4py import MPI

    (up, down), (left, right) = shifts
    null = MPI.PROC_NULL
    rows = u.shape[0] - 2
    for face, ghost, dst, src, tag in ((1, -1, left, right, 2), (-2, 0, right, left, 3)):
        got = np.empty(rows)
        cart.Sendrecv(np.ascontiguousarray(u[1:-1, face]), dst, tag, got, src, tag)
        if src != null:
            u[1:-1, ghost] = got
    for face, ghost, dst, src, tag in ((1, -1, up, down, 0), (-2, 0, down, up, 1)):
        got = np.empty(u.shape[1])
        cart.Sendrecv(np.ascontiguousarray(u[face]), dst, tag, got, src, tag)
        if src != null:
            u[ghost] = got


#: Issue 44's large all_reduce sizes: one chunk, two, four (``MPICOMM_STAGING_CHUNK``'s default 4 MiB),
#: and one of DDP's 64 MiB buckets (three pieces, :mod:`mpicomm.core.pieces`).
LARGE_SIZES = (4 << 20, 8 << 20, 16 << 20, 64 << 20)


def large_rows(
    mpicomm: Any, comm: Any, measure: Callable[[str, dict[str, Callable[[], float]]], None]
) -> None:
    """``all_reduce`` of 4-64 MiB of float64 in place: mpicomm against raw ``Allreduce(IN_PLACE)``.

    mpicomm's calls go on its world, the raw ones on the bench's own communicator: each sees only its
    own calls (the raw one also the bench's timing barriers, as mpicomm's world sees none of them).
    """
    from mpicomm import _mpi

    MPI = _mpi.MPI
    for nbytes in LARGE_SIZES:
        x = np.ones(nbytes // 8)
        it = 10
        measure(
            f"all_reduce {nbytes >> 20} MiB",
            {
                "mpicomm": partial(_per_call, comm, partial(mpicomm.all_reduce, x), it),
                "mpi4py": partial(
                    _per_call, comm, partial(comm.Allreduce, MPI.IN_PLACE, [x, MPI.DOUBLE]), it
                ),
            },
        )


def large_targets(own: dict[str, dict[str, float]]) -> list[tuple[str, float, float]]:
    """Issue 44's target for the large all_reduce rows: at most 1.03x raw at each size."""
    out = []
    for nbytes in LARGE_SIZES:
        row = own.get(f"all_reduce {nbytes >> 20} MiB")
        if row is not None:
            out.append(
                (f"all_reduce {nbytes >> 20} MiB <= 1.03x mpi4py", row["mpicomm"] / row["mpi4py"], 1.03)
            )
    return out


def level_rows(jobs: dict[str, dict[str, Any]]) -> list[str]:
    """The large rows at each thread level: mpicomm / raw in each job, and raw against raw at ``single``.

    The two contenders of a job share its level (one process), so a cost of the level itself shows
    in the raw column across jobs, a cost of mpicomm's at one level in that job's ratio only.
    """
    lines = []
    for nbytes in LARGE_SIZES:
        name = f"all_reduce {nbytes >> 20} MiB"
        rows = {level: job["rows"].get(name) for level, job in jobs.items()}
        base = rows.get("single")
        if base is None or any(row is None for row in rows.values()):
            continue
        parts = [
            f"{level} {row['mpicomm'] / row['mpi4py']:.3f}x (raw {row['mpi4py'] / base['mpi4py']:.3f}x)"
            for level, row in rows.items()
            if row is not None
        ]
        lines.append(f"  {name:<18} " + "  ".join(parts))
    return lines


def _run_child(level: str, ranks: int, rounds: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPI4PY_RC_", "MPICOMM_THREAD"))}
    env["OMP_NUM_THREADS"] = "1"
    if level != "mpicomm":
        env["MPICOMM_THREAD_LEVEL"] = level
    cmd = [
        _mpiexec(),
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "mpicomm.apps.bench.hpc",
        "--child",
        "--rounds",
        str(rounds),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the {level} job failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else "mpiexec"


def startup(ranks: int, launches: int) -> dict[str, float]:
    """Median seconds of each start-up command under ``mpiexec -n ranks``, launches interleaved."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPI4PY_RC_", "MPICOMM_THREAD"))}
    env["OMP_NUM_THREADS"] = "1"
    times: dict[str, list[float]] = {k: [] for k in IMPORTS}
    for i in range(launches):
        for name in list(IMPORTS) if i % 2 == 0 else list(IMPORTS)[::-1]:
            start = time.perf_counter()
            subprocess.run(
                [_mpiexec(), "-n", str(ranks), sys.executable, "-c", IMPORTS[name]],
                env=env,
                check=True,
                timeout=120,
            )
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


#: Issue 44's first call: the same program with mpicomm and with numpy + mpi4py, timed inside the
#: process from before its imports: (seconds of the first all_reduce of a numpy array, seconds of
#: imports + MPI start + that call). Rank 0 prints them.
FIRST_CALL = {
    "mpicomm": "import numpy as np; import mpicomm; mpicomm.init(); x = np.ones(4); t1 = perf_counter(); "
    "mpicomm.all_reduce(x)",
    "numpy+mpi4py": "import numpy as np; from mpi4py import MPI; x = np.ones(4); t1 = perf_counter(); "
    "MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x)",
}
_TIMED = (
    "from time import perf_counter; t0 = perf_counter()\n{body}\nt2 = perf_counter()\n"
    "import os\nif os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '0')) == '0': "
    "print('FIRST', t2 - t1, t2 - t0)"
)


def first_call(ranks: int, launches: int) -> dict[str, dict[str, float]]:
    """Median first-call and import+init+first-call seconds of each :data:`FIRST_CALL` program."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPI4PY_RC_", "MPICOMM_THREAD"))}
    env["OMP_NUM_THREADS"] = "1"
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in FIRST_CALL}
    for i in range(launches):
        for name in list(FIRST_CALL) if i % 2 == 0 else list(FIRST_CALL)[::-1]:
            code = _TIMED.format(body=FIRST_CALL[name])
            out = subprocess.run(
                [_mpiexec(), "-n", str(ranks), sys.executable, "-c", code],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
            line = next(ln for ln in out.stdout.splitlines() if ln.startswith("FIRST "))
            first, total = (float(v) for v in line.split()[1:])
            got[name].append((first, total))
    return {
        k: {"first": statistics.median(f for f, _ in v), "total": statistics.median(t for _, t in v)}
        for k, v in got.items()
    }


def first_call_targets(first: dict[str, dict[str, float]]) -> list[tuple[str, float, float]]:
    """Issue 44's start-up targets as (target, measured, limit): ms over mpi4py's, and a ratio."""
    own, raw = first["mpicomm"], first["numpy+mpi4py"]
    return [
        ("first all_reduce - mpi4py's first (ms) <= 10", (own["first"] - raw["first"]) * 1e3, 10.0),
        ("import+init+first call <= 1.15x numpy+mpi4py", own["total"] / raw["total"], 1.15),
    ]


def uncompiled(root: str | None = None) -> list[str]:
    """The modules ``import mpicomm; mpicomm.get_rank()`` loads whose bytecode is not cached (or stale).

    Each is compiled from source at every start (about 1 ms a module), which numpy, byte-compiled by
    pip at install, never pays: an editable install under ``PYTHONDONTWRITEBYTECODE=1`` starts that
    way until ``python -m compileall`` has run on it (``make venv`` runs it).

    Args:
        root: The package's folder (default: the ``mpicomm`` imported).
    """
    import importlib.util

    import mpicomm

    root = root or os.path.dirname(mpicomm.__file__)
    names = ("__init__.py", "_mpi.py", "errors.py", "core/groups.py", "core/validation.py")
    out = []
    for name in names:
        source = os.path.join(root, name)
        cached = importlib.util.cache_from_source(source)
        if not os.path.exists(cached) or os.path.getmtime(cached) < os.path.getmtime(source):
            out.append(name)
    return out


def targets(jobs: dict[str, dict[str, Any]], start: dict[str, float]) -> list[tuple[str, float, float]]:
    """(target, measured ratio, limit) for each of the issue's targets that these runs measure."""
    own = jobs["mpicomm"]["rows"]
    out = []
    for nbytes in JAGGED_SIZES:
        row = own[f"jagged_all_to_all {nbytes} B"]
        if "C" in row:
            limit = 2.0 if nbytes <= 64 << 10 else 1.1
            out.append(
                (f"jagged_all_to_all {nbytes} B <= {limit}x C two-step", row["mpicomm"] / row["C"], limit)
            )
    if "C" in own["KJTAllToAll 1 KiB"]:
        row = own["KJTAllToAll 1 KiB"]
        out.append(("KJTAllToAll 1 KiB <= 1.5x C two-step", row["mpicomm"] / row["C"], 1.5))
    ar = own["all_reduce 8 B"]
    raw_multiple = jobs["multiple"]["rows"]["all_reduce 8 B"]["mpi4py"]
    out.append(("all_reduce 8 B <= 0.75x mpi4py at MULTIPLE", ar["mpicomm"] / raw_multiple, 0.75))
    if "C" in ar:
        out.append(("all_reduce 8 B <= 1.3x C at mpicomm's level", ar["mpicomm"] / ar["C"], 1.3))
    out.append(("start-up <= 1.3x numpy+mpi4py", start["mpicomm"] / start["numpy+mpi4py"], 1.3))
    for name, _, _ in HALO_GRIDS:
        row = own.get(f"exchange_halos {HALO_N}x{HALO_N} {name}")
        if row is not None:
            out.append(
                (f"exchange_halos {HALO_N}^2 {name} <= 1.15x mpi4py", row["mpicomm"] / row["mpi4py"], 1.15)
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the jobs and the start-up launches; print the rows and the targets' table."""
    p = argparse.ArgumentParser(prog="python -m mpicomm.apps.bench.hpc", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7, help="samples per contender (median; default 7)")
    p.add_argument("--launches", type=int, default=10, help="start-up runs per command (default 10)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        got = child(args.rounds)
        if got:
            print(json.dumps(got), flush=True)
        return 0
    print(f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    jobs = {level: _run_child(level, args.ranks, args.rounds) for level in LEVELS}
    for level, job in jobs.items():
        print(f"\n{level}: thread level {job['thread_level']}; C loop: {job['c_loop']}")
        for name, row in job["rows"].items():
            print(f"  {name:<28} " + "  ".join(f"{k} {v:8.2f} us" for k, v in row.items()))
    large = level_rows(jobs)
    if large:
        print(
            "\nlarge all_reduce, mpicomm / raw at each level (raw against raw at single):", *large, sep="\n"
        )
    start = startup(args.ranks, args.launches)
    print(f"\nstart-up (median of {args.launches}): " + "  ".join(f"{k} {v:.3f} s" for k, v in start.items()))
    stale = uncompiled()
    if stale:
        print(
            f"  (mpicomm's bytecode is not cached for {', '.join(stale)}: each start compiles them, "
            "~1 ms a module; run python -m compileall on the package, as pip does at install)"
        )
    first = first_call(args.ranks, args.launches)
    for name, v in first.items():
        ms = f"{v['first'] * 1e3:.2f} ms; import+init+first call {v['total'] * 1e3:.1f} ms"
        print(f"first call, {name}: {ms}")
    rows = targets(jobs, start) + first_call_targets(first) + large_targets(jobs["mpicomm"]["rows"])
    print(f"\n{'target':<48} {'ratio':>6}  met")
    for text, ratio, limit in rows:
        print(f"{text:<48} {ratio:6.2f}  {'yes' if ratio <= limit else 'NO'}")
    print(f"load {os.getloadavg()[0]:.2f} at the end", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"jobs": jobs, "startup": start, "first_call": first, "targets": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
