"""The pieces of ``mpicomm.trace`` in one process: the wrapper, the recorder's table, the clock, the merge.

The wrapped calls here are plain Python functions with a public call's parameters, so that no MPI
is needed; the runs under ``mpiexec`` are in tests/unit/test_trace_run.py.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpijobs import python

from mpicomm.trace import Recorder, traced, untraced
from mpicomm.trace.clock import offset_at
from mpicomm.trace.output import MERGED, load, merge, rank_document
from mpicomm.trace.recorder import FAILED, FIELDS, WIDTH


def fake_all_gather(output: Any, input: Any, group: Any = None, async_op: bool = False) -> None:
    """A stand-in with the parameters of ``all_gather_into_tensor``."""
    for start in range(0, len(output), len(input)):
        output[start : start + len(input)] = input


def _row(rec: Recorder, i: int) -> dict[str, Any]:
    row = dict(zip(FIELDS, rec.rows[i * WIDTH : (i + 1) * WIDTH], strict=True))
    row["name"], row["site"] = rec.names.items[row["name"]], rec.sites.items[row["site"]]
    row["kind"], row["path"] = rec.kinds.items[row["kind"]], rec.paths[row["path"]]
    return row


def _wrapped(rec: Recorder) -> Any:
    rec.unsynced = False  # no world group here: no clock comparison
    return traced("all_gather_into_tensor", fake_all_gather, {"output": "write", "input": "read"}, rec)


def test_a_call_is_one_row_with_its_bytes_site_and_kind() -> None:
    rec = Recorder()
    call = _wrapped(rec)
    out = np.zeros(6)
    call(out, np.arange(3.0))
    line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    call(output=out, input=np.arange(3, dtype=np.float32))
    assert rec.n == 2
    first, second = _row(rec, 0), _row(rec, 1)
    assert first["name"] == "all_gather_into_tensor"
    assert (first["sent"], first["recv"], second["sent"], second["recv"]) == (24, 48, 12, 48)
    assert first["site"] == f"{__file__}:{line} (test_a_call_is_one_row_with_its_bytes_site_and_kind)"
    assert (first["kind"], first["path"]) == ("numpy", "host")
    assert (first["seq"], second["seq"]) == (0, 1)  # a collective: numbered in its group
    assert first["start"] <= first["end"] <= second["start"] <= second["end"]


def test_torch_tensors_are_their_kind() -> None:
    torch = pytest.importorskip("torch")
    rec = Recorder()
    _wrapped(rec)(torch.zeros(4), torch.ones(2))
    assert (_row(rec, 0)["kind"], _row(rec, 0)["sent"]) == ("torch", 8)


def test_the_wrapper_keeps_the_call_and_gives_it_back() -> None:
    call = _wrapped(Recorder())
    assert call.__name__ == "fake_all_gather" and call.__doc__ == fake_all_gather.__doc__
    assert inspect.signature(call) == inspect.signature(fake_all_gather)
    assert untraced(call) is fake_all_gather and untraced(fake_all_gather) is fake_all_gather


def test_a_call_made_inside_a_traced_call_is_not_recorded_again() -> None:
    rec = Recorder()
    inner = _wrapped(rec)

    def outer(output: Any, input: Any, group: Any = None) -> None:
        inner(output, input)

    traced("outer", outer, {}, rec)(np.zeros(2), np.ones(1))
    assert rec.n == 1 and _row(rec, 0)["name"] == "outer"


def test_a_failing_call_is_recorded_and_raises() -> None:
    rec = Recorder()
    with pytest.raises(ValueError):
        _wrapped(rec)(np.zeros(5), np.ones(2))  # 5 is no multiple of 2: the last slice is short
    assert rec.n == 1 and _row(rec, 0)["flags"] & FAILED
    assert rec.depth == 0


@pytest.mark.parametrize(("limit", "kept", "dropped"), [(64, 5, 0), (4, 4, 1)])
def test_the_table_grows_to_its_limit(limit: int, kept: int, dropped: int) -> None:
    rec = Recorder(capacity=2, limit=limit)
    call = _wrapped(rec)
    for _ in range(5):
        call(np.zeros(2), np.ones(1))
    assert (rec.n, rec.dropped) == (kept, dropped)
    assert len(rec.rows) == rec.cap * WIDTH >= kept * WIDTH


def test_a_ring_starts_again() -> None:
    rec = Recorder(capacity=2, ring=True)
    call = _wrapped(rec)
    for _ in range(5):
        call(np.zeros(2), np.ones(1))
    assert (rec.n, rec.cap, len(rec.rows)) == (1, 2, 2 * WIDTH)


def test_offsets_between_samples_are_interpolated() -> None:
    clock = [(1000, 10, 3), (0, 0, 3)]
    assert [offset_at(clock, t) for t in (-5, 0, 250, 1000, 5000)] == [0.0, 0.0, 2.5, 10.0, 10.0]


def test_merge_puts_ranks_on_rank_0s_clock(tmp_path: Path) -> None:
    """Rank 1's clock reads 1 s less than rank 0's: its events move 1 s later; both start at 0."""
    docs = []
    for rank, offset in ((0, 0), (1, 10**9)):
        rec = Recorder()
        call = _wrapped(rec)
        call(np.zeros(2), np.ones(1))
        rec.clock = [(rec.begin, offset, 1000)]
        doc = rank_document(rec, rank, 2, run=7)
        doc["mpicomm"]["begin"] = 5e6 if rank == 0 else 4e6  # us: both started at the same moment
        (tmp_path / f"mpicomm-trace-rank{rank:05d}.json").write_text(json.dumps(doc))
        docs.append(doc)
    merge(tmp_path)
    merged = load(tmp_path / MERGED)
    assert merged["mpicomm"]["begin"] == {0: 0.0, 1: 0.0}
    calls = {e["pid"]: e for e in merged["traceEvents"] if e["ph"] == "X"}
    local = {r: d["traceEvents"][-1]["ts"] for r, d in enumerate(docs)}
    assert calls[0]["ts"] == pytest.approx(local[0] - 5e6)
    assert calls[1]["ts"] == pytest.approx(local[1] + 1e6 - 5e6)
    assert load(tmp_path)["mpicomm"]["run"] == 7  # a directory: merged again from its rank files


@pytest.mark.process
def test_untraced_when_the_variable_is_unset() -> None:
    got = python(
        """
        import json, sys, mpicomm
        print(json.dumps({"trace": "mpicomm.trace" in sys.modules, "door": type(mpicomm.all_reduce).__name__,
                          "mpi": "mpi4py.MPI" in sys.modules}))
        """
    )
    assert got == {"trace": False, "door": got["door"], "mpi": False}
    assert got["door"] in ("Door", "function")


@pytest.mark.process
def test_traced_when_set_and_import_starts_no_mpi(tmp_path: Path) -> None:
    got = python(
        """
        import json, sys, mpicomm
        from mpicomm.front import collectives
        from mpicomm.trace import untraced
        print(json.dumps({"traced": mpicomm.all_reduce is not untraced(mpicomm.all_reduce),
                          "same": collectives.all_reduce is mpicomm.all_reduce,
                          "alias": mpicomm.all_gather_single is mpicomm.all_gather_into_tensor,
                          "mpi": "mpi4py.MPI" in sys.modules}))
        """,
        env={"MPICOMM_TRACE": str(tmp_path / "t")},
    )
    assert got == {"traced": True, "same": True, "alias": True, "mpi": False}
    assert not (tmp_path / "t").exists()  # no call, no MPI: nothing written


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
