"""A traced run (``MPICOMM_TRACE=<dir>``) under ``mpiexec -n 2`` and ``-n 3``: its merged file, its summary.

The program makes a known list of calls on every rank (rank 1 late on purpose before one
``all_reduce``) and checks their results against numpy; the tests then read the merged Chrome trace
(one row per rank, events matching the calls: names, counts, bytes, async waits) and the summary of
``python -m mpicomm trace`` (counts, the imbalance the late rank caused, the rank holding the job back).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mpijobs import REPO, needs_mpiexec, run_job

from mpicomm.trace.output import MERGED, load
from mpicomm.trace.summary import summarise

pytestmark = [needs_mpiexec, pytest.mark.process]  # every test starts processes

PROGRAM = """
    import time
    import numpy as np
    import mpicomm

    r, w = mpicomm.get_rank(), mpicomm.get_world_size()
    x = np.ones(4)
    mpicomm.all_reduce(x)                                   # 32 B
    assert (x == w).all()
    mpicomm.all_reduce(x)
    assert (x == w * w).all()
    y = np.full(2, float(r))
    if r == 1:
        time.sleep(0.2)                                     # rank 1 late on purpose
    mpicomm.all_reduce(y)                                   # 16 B: the late call
    assert (y == sum(range(w))).all()
    b = np.full(3, 7.0) if r == 0 else np.zeros(3)
    mpicomm.broadcast(b, src=0)                             # 24 B
    assert (b == 7.0).all()
    out = np.empty(4 * w)
    mpicomm.all_gather_into_tensor(out, np.full(4, float(r)))   # 32 B sent, 32 w received
    assert (out == np.repeat(np.arange(w, dtype=float), 4)).all()
    z = np.ones(8)
    work = mpicomm.all_reduce(z, async_op=True)             # 64 B, async: posted, then waited on
    work.wait()
    assert (z == w).all()
    got = np.empty(1)
    mpicomm.sendrecv(np.array([float(r)]), got, dst=(r + 1) % w, src=(r - 1) % w)   # 8 B
    assert got[0] == (r - 1) % w
    mpicomm.barrier()
    objs = [None] * w
    mpicomm.all_gather_object(objs, r)
    assert objs == list(range(w))
    print("rank", r, "done", flush=True)
"""

#: Calls per rank of PROGRAM, and their bytes sent per rank.
CALLS = {
    "all_reduce": 4,
    "broadcast": 1,
    "all_gather_into_tensor": 1,
    "sendrecv": 1,
    "barrier": 1,
    "all_gather_object": 1,
}
SENT = {"all_reduce": 32 + 32 + 16 + 64, "broadcast": 24, "all_gather_into_tensor": 32, "sendrecv": 8}


@pytest.fixture(scope="module", params=[2, 3])
def traced_run(request: Any, tmp_path_factory: Any) -> tuple[int, Path]:
    """The trace directory of PROGRAM run on 2 and on 3 ranks."""
    n = request.param
    where = tmp_path_factory.mktemp(f"trace{n}")
    rc, out, _ = run_job(where, PROGRAM, ranks=n, env={"MPICOMM_TRACE": str(where / "trace")}, timeout=120)
    assert rc == 0, out
    assert out.count("done") == n, out
    return n, where / "trace"


def test_one_merged_file_with_a_row_per_rank(traced_run: tuple[int, Path]) -> None:
    n, where = traced_run
    assert sorted(p.name for p in where.iterdir()) == sorted(
        [MERGED, *(f"mpicomm-trace-rank{r:05d}.json" for r in range(n))]
    )
    doc = json.loads((where / MERGED).read_text())
    events = doc["traceEvents"]
    assert events and all({"ph", "ts", "pid", "tid"} <= e.keys() for e in events)
    assert all(isinstance(e["dur"], float) and e["dur"] >= 0 for e in events if e["ph"] == "X")
    assert {e["pid"] for e in events} == set(range(n))
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(n)}
    assert all(e["ts"] >= 0 for e in events if e["ph"] != "M")


def test_events_match_the_calls(traced_run: tuple[int, Path]) -> None:
    n, where = traced_run
    calls = [e for e in json.loads((where / MERGED).read_text())["traceEvents"] if e.get("cat") == "mpicomm"]
    assert Counter(e["name"] for e in calls) == Counter({k: v * n for k, v in CALLS.items()})
    for r in range(n):
        mine = [e for e in calls if e["pid"] == r]
        assert Counter(e["name"] for e in mine) == Counter(CALLS)
        sent = Counter()
        for e in mine:
            sent[e["name"]] += e["args"]["sent"]
        assert {k: sent[k] for k in SENT} == SENT
        gathered = next(e for e in mine if e["name"] == "all_gather_into_tensor")
        assert gathered["args"]["recv"] == 32 * n
        assert all(e["args"]["site"].endswith(")") and "job.py:" in e["args"]["site"] for e in mine)
        assert all(e["args"]["kind"] in ("numpy", "") and e["args"]["path"] in ("host", "") for e in mine)
        # collectives numbered in call order on the world group; sendrecv is not matched across ranks
        seqs = [e["args"]["seq"] for e in sorted(mine, key=lambda e: e["ts"]) if e["name"] != "sendrecv"]
        assert seqs == list(range(len(seqs)))


def test_async_call_has_its_wait_and_flight(traced_run: tuple[int, Path]) -> None:
    """Each rank's own file, on its own clock: the merge moves each time by the clock offset at that
    time, so in the merged file a flight's end and its wait's end may differ by the drift between
    the wait's start and end (3 us seen under load)."""
    n, where = traced_run
    for r in range(n):
        (own,) = [
            p
            for p in where.glob("mpicomm-trace-rank*.json")
            if json.loads(p.read_text())["mpicomm"]["rank"] == r
        ]
        events = json.loads(own.read_text())["traceEvents"]
        posted = [e for e in events if e["pid"] == r and e.get("cat") == "mpicomm" and e["args"]["async"]]
        assert [e["name"] for e in posted] == ["all_reduce"]
        waits = [e for e in events if e["pid"] == r and e.get("cat") == "mpicomm.wait"]
        call = posted[0]["args"]["call"]
        assert [(e["name"], e["args"]["call"]) for e in waits] == [("wait all_reduce", call)]
        flight = [e for e in events if e["pid"] == r and e.get("cat") == "mpicomm.async"]
        assert [e["ph"] for e in flight] == ["b", "e"]
        assert flight[0]["ts"] == pytest.approx(posted[0]["ts"])
        assert flight[1]["ts"] == pytest.approx(waits[0]["ts"] + waits[0]["dur"])


def test_summary_counts_and_the_late_rank(traced_run: tuple[int, Path]) -> None:
    n, where = traced_run
    s = summarise(load(where))
    assert s.ranks == n
    lines = {x.name: x for x in s.calls}
    assert {k: x.count for k, x in lines.items()} == {k: v * n for k, v in CALLS.items()}
    assert lines["all_reduce"].sent == SENT["all_reduce"] * n
    assert lines["all_reduce"].matched == 4
    assert lines["all_reduce"].imbalance >= 0.15  # rank 1 slept 0.2 s before one all_reduce
    assert lines["all_reduce"].last_rank == 1
    assert max(s.late, key=lambda r: s.late[r]) == 1
    assert lines["sendrecv"].matched == 0  # point-to-point: not matched across ranks
    sites = [x for x in s.sites if x.name.startswith("all_reduce at")]
    program = textwrap.dedent(PROGRAM).splitlines()
    lines_of_calls = [i for i, text in enumerate(program, 1) if ".all_reduce(" in text]
    assert sorted(int(x.name.split(":")[-1].split()[0]) for x in sites) == lines_of_calls
    assert all(x.count == n for x in sites)


def test_cli_prints_the_table_and_plots(traced_run: tuple[int, Path], tmp_path: Path) -> None:
    n, where = traced_run
    png = tmp_path / "trace.png"
    plot = importlib.util.find_spec("matplotlib") is not None
    args = [sys.executable, "-m", "mpicomm", "trace", str(where), *(["--plot", str(png)] if plot else [])]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    rows: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        if line.split():
            rows.setdefault(line.split()[0], line.split())  # the calls' table comes before the sites'

    assert rows["all_reduce"][1] == str(4 * n)
    assert float(rows["all_reduce"][-2]) >= 0.15 and rows["all_reduce"][-1] == "1"
    assert rows["broadcast"][1] == str(n)
    assert "holding the job back: rank 1" in proc.stdout
    assert not plot or png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
