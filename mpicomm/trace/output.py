"""The trace files: each rank's Chrome-trace JSON at exit, and rank 0's merge of them on one clock.

Each rank writes ``mpicomm-trace-rank<N>.json`` (its events on its own clock, and its clock samples);
rank 0 then merges them into ``mpicomm-trace.json``, the file Perfetto (https://ui.perfetto.dev) and
``chrome://tracing`` open: one row (``pid``) per rank, threads below it, every call a complete event
(``ph: "X"``) whose ``args`` hold its group, sequence number, bytes, array kind, path and call site; an
async call's flight from post to completion is an async slice (``ph: "b"``/``"e"``), and its wait a
complete event ``wait <call>``. Times are microseconds from the earliest rank's start.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from time import perf_counter_ns
from typing import Any

import numpy as np

from ..core import groups as _groups
from .clock import estimate, offset_at, together
from .recorder import ASYNC, FAILED, WAIT_WIDTH, WIDTH, Recorder

__all__ = ["MERGED", "finish", "load", "merge", "rank_document"]

#: The merged file's name, in the trace directory.
MERGED = "mpicomm-trace.json"
_RANK = "mpicomm-trace-rank"
#: Seconds the ranks wait for each other at exit before each writes its own file alone.
EXIT_TIMEOUT = 60.0


def rank_document(rec: Recorder, rank: int, size: int, run: int) -> dict[str, Any]:
    """This rank's trace: Chrome-trace events on its own clock (us), and what the merge needs."""
    names, groups, sites = rec.names.items, rec.groups.items, rec.sites.items
    kinds, paths, rows = rec.kinds.items, rec.paths, rec.rows
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        {
            "name": "process_sort_index",
            "ph": "M",
            "ts": 0,
            "pid": rank,
            "tid": 0,
            "args": {"sort_index": rank},
        },
    ]
    starts: list[int] = []
    threads: dict[int, int] = {}  # thread idents as 0, 1, ... in order of their first call
    for i in range(rec.n):
        o = i * WIDTH
        name, flags, start, end = names[rows[o]], rows[o + 10], rows[o + 7], rows[o + 8]
        starts.append(start)
        args = {
            "group": groups[rows[o + 1]], "seq": rows[o + 9], "sent": rows[o + 5], "recv": rows[o + 6],
            "kind": kinds[rows[o + 3]], "path": paths[rows[o + 4]], "site": sites[rows[o + 2]], "call": i,
            "async": bool(flags & ASYNC), "failed": bool(flags & FAILED),
        }  # fmt: skip
        tid = threads.setdefault(rows[o + 11], len(threads))
        events.append(_complete(name, "mpicomm", start, end, rank, tid, args))
    waits = rec.waits
    for j in range(rec.nwaits):
        i, w0, w1, done = waits[j * WAIT_WIDTH : (j + 1) * WAIT_WIDTH]
        o = i * WIDTH
        if i >= rec.n:
            continue
        name, tid = names[rows[o]], threads.get(rows[o + 11], 0)
        events.append(
            _complete(f"wait {name}", "mpicomm.wait", w0, w1, rank, tid, {"call": i, "done": bool(done)})
        )
        flight = {
            "cat": "mpicomm.async",
            "name": f"{name} in flight",
            "id": f"{rank}.{i}",
            "pid": rank,
            "tid": tid,
        }
        events.append({**flight, "ph": "b", "ts": starts[i] / 1e3})
        events.append({**flight, "ph": "e", "ts": w1 / 1e3})
    meta = {"rank": rank, "size": size, "run": run, "clock": [list(s) for s in rec.clock]}
    meta.update(begin=rec.begin / 1e3, end=(rec.end or perf_counter_ns()) / 1e3, dropped=rec.dropped)
    return {"traceEvents": events, "displayTimeUnit": "ms", "mpicomm": meta}


def _complete(
    name: str, cat: str, start: int, end: int, pid: int, tid: int, args: dict[str, Any]
) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "ts": start / 1e3, "dur": (end - start) / 1e3, "pid": pid,
            "tid": tid, "args": args}  # fmt: skip


def _rank_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{_RANK}*.json"))


def merge(directory: str | os.PathLike[str]) -> Path:
    """Merge the rank files of the latest run in ``directory`` into :data:`MERGED`, on rank 0's clock.

    Returns:
        The merged file's path.

    Raises:
        FileNotFoundError: ``directory`` holds no rank file.
    """
    where = Path(directory)
    docs = [json.loads(p.read_text()) for p in _rank_files(where)]
    if not docs:
        raise FileNotFoundError(
            f"mpicomm trace: no {_RANK}*.json in {where}; expected a run with MPICOMM_TRACE={where}"
        )
    latest = max(docs, key=lambda d: (d["mpicomm"]["rank"] == 0, d["mpicomm"]["end"]))["mpicomm"]["run"]
    docs = sorted((d for d in docs if d["mpicomm"]["run"] == latest), key=lambda d: int(d["mpicomm"]["rank"]))
    shift = {d["mpicomm"]["rank"]: _shift(d["mpicomm"]["clock"]) for d in docs}
    origin = min(d["mpicomm"]["begin"] + shift[d["mpicomm"]["rank"]](d["mpicomm"]["begin"]) for d in docs)
    events: list[dict[str, Any]] = []
    begin: dict[int, float] = {}
    end: dict[int, float] = {}
    for d in docs:
        meta, move = d["mpicomm"], shift[d["mpicomm"]["rank"]]
        begin[meta["rank"]] = meta["begin"] + move(meta["begin"]) - origin
        end[meta["rank"]] = meta["end"] + move(meta["end"]) - origin
        for e in d["traceEvents"]:
            if e["ph"] != "M":
                e["ts"] = e["ts"] + move(e["ts"]) - origin
            events.append(e)
    rtt = {d["mpicomm"]["rank"]: [s[2] for s in d["mpicomm"]["clock"]] for d in docs}
    meta = {"ranks": len(docs), "size": docs[0]["mpicomm"]["size"], "run": latest, "begin": begin, "end": end,
            "round_trip_ns": rtt, "dropped": sum(d["mpicomm"]["dropped"] for d in docs)}  # fmt: skip
    out = where / MERGED
    out.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "mpicomm": meta}))
    return out


def _shift(clock: list[list[int]]) -> Any:
    """The offset in us to add to a local time in us, from a rank's clock samples (in ns)."""
    return lambda us: offset_at(clock, us * 1e3) / 1e3


def load(where: str | os.PathLike[str]) -> dict[str, Any]:
    """The merged trace of ``where`` (a merged file, or a directory: its rank files merged again if any)."""
    path = Path(where)
    if path.is_dir():
        path = merge(path) if _rank_files(path) else path / MERGED
    doc: dict[str, Any] = json.loads(path.read_text())
    # JSON keys are strings: the per-rank tables by int rank again
    for key in ("begin", "end", "round_trip_ns"):
        doc["mpicomm"][key] = {int(k): v for k, v in doc["mpicomm"].get(key, {}).items()}
    return doc


def finish(rec: Recorder, directory: str) -> None:
    """At exit (before mpi4py finalizes MPI): compare clocks again, write this rank's file, merge on rank 0.

    Every rank of the job takes part; a rank that does not come within :data:`EXIT_TIMEOUT` leaves the
    others to write their own files without the merge (``python -m mpicomm trace DIR`` merges later).
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return  # no call was made: MPI never started
    comm = rec.comm
    if comm is None:
        world = _groups._State.world
        base = world.comm if world is not None and world.comm is not None else mpi.COMM_WORLD
        if not together(base, EXIT_TIMEOUT):
            _write(rec, directory, base.Get_rank(), base.Get_size(), 0)
            return
        comm = base.Dup()
    ok = together(comm, EXIT_TIMEOUT)
    if ok:
        rec.clock.append(estimate(comm))
    rec.end = perf_counter_ns()
    rank, size = comm.Get_rank(), comm.Get_size()
    run = np.array([secrets.randbits(62) if rank == 0 else 0], np.int64)
    if ok:
        comm.Bcast(run, 0)
    _write(rec, directory, rank, size, int(run[0]))
    if ok and together(comm, EXIT_TIMEOUT):
        if rank == 0:
            merge(directory)
        comm.Free()


def _write(rec: Recorder, directory: str, rank: int, size: int, run: int) -> None:
    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    doc = rank_document(rec, rank, size, run)
    (where / f"{_RANK}{rank:05d}.json").write_text(json.dumps(doc))
