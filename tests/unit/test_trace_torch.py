"""The torch backend's calls in a traced run (``MPICOMM_TRACE``): recorded by name, at the user's line.

``dist.all_reduce`` on ``backend="mpicomm"`` reaches the front door through the registered process
group (``mpicomm.c10d.registered``); the trace shows it as ``all_reduce`` of a torch tensor, its call
site the program's line, not torch's or mpicomm's.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from mpijobs import needs_mpiexec, run_job

from mpicomm.trace.output import MERGED

pytestmark = [needs_mpiexec, pytest.mark.process]  # every test starts processes
pytest.importorskip("torch")

PROGRAM = """
    import torch
    import torch.distributed as dist
    import mpicomm.torch

    dist.init_process_group("mpicomm")
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t)
    assert (t == w * w).all()
    b = torch.full((3,), float(r))
    dist.broadcast(b, src=0)
    assert (b == 0).all()
    dist.destroy_process_group()
    print("rank", r, "done", flush=True)
"""


def test_backend_calls_are_traced_at_the_users_line(tmp_path: Path) -> None:
    rc, out, _ = run_job(tmp_path, PROGRAM, ranks=2, env={"MPICOMM_TRACE": str(tmp_path / "t")}, timeout=180)
    assert rc == 0, out
    events = json.loads((tmp_path / "t" / MERGED).read_text())["traceEvents"]
    lines = textwrap.dedent(PROGRAM).splitlines()
    expected = ['dist.init_process_group("mpicomm")', "dist.all_reduce(t)", "dist.all_reduce(t)"]
    expected.append("dist.broadcast(b, src=0)")
    for r in range(2):
        calls = [e for e in events if e["pid"] == r and e.get("cat") == "mpicomm"]
        # init_process_group's barrier is made through the backend too
        assert [e["name"] for e in calls] == ["barrier", "all_reduce", "all_reduce", "broadcast"]
        assert [e["args"]["sent"] for e in calls] == [0, 16, 16, 12]
        assert all(e["args"]["kind"] == "torch" and e["args"]["path"] == "host" for e in calls[1:])
        assert all(e["args"]["group"] == "world" for e in calls)
        assert all(e["args"]["site"].split(":")[0].endswith("job.py") for e in calls)
        sites = [int(e["args"]["site"].split(":")[-1].split()[0]) for e in calls]
        assert [lines[s - 1].strip() for s in sites] == expected
