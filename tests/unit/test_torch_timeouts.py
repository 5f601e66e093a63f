"""Timeouts of torch's groups on mpicomm: MPICOMM_TIMEOUT under torch, a user's bound, the caller's line.

torch passes its own 30-minute default to a backend when the user gave no timeout; mpicomm tells that
default from a user's choice, so ``MPICOMM_TIMEOUT`` bounds a group made without one, under torch as
under mpicomm's own API. The watchdog's "called at" names the program's line, not torch's wrapper
nor mpicomm's adapter. Each job runs under ``mpiexec`` at 2 and 3 ranks; the last rank never arrives.
"""

from __future__ import annotations

import pytest
from mpijobs import needs_mpiexec, run_job

pytestmark = [needs_mpiexec, pytest.mark.process]  # every test starts processes

NEVER_ARRIVES = """
    import datetime, time
    import mpicomm.torch
    import torch
    import torch.distributed as dist

    dist.init_process_group("mpicomm"{timeout})
    group = {group}
    w, r = dist.get_world_size(), dist.get_rank()
    t = torch.full((4,), float(r))
    if r != w - 1:  # the last rank never arrives
        dist.all_reduce(t, group=group)
        print(f"rank {{r}} went on", flush=True)
    else:
        time.sleep(60)
        print("the last rank slept to the end", flush=True)
"""


def _ended(out: str, status: int) -> None:
    assert status != 0, out
    assert "went on" not in out and "slept to the end" not in out, out
    assert "called at " in out and "job.py:12. Timed out" in out, out  # the program's all_reduce line
    assert "registered.py" not in out and "distributed_c10d.py" not in out, out


@pytest.mark.parametrize("ranks", [2, 3])
def test_mpicomm_timeout_bounds_torchs_default_group(tmp_path, ranks):
    status, out, _ = run_job(
        tmp_path, NEVER_ARRIVES.format(timeout="", group="None"), ranks, {"MPICOMM_TIMEOUT": "1"}, timeout=120
    )
    _ended(out, status)
    assert "mpicomm watchdog: all_reduce on group world" in out and "the default timeout, 1 s" in out, out


def test_mpicomm_timeout_bounds_a_torch_subgroup_made_without_one(tmp_path):
    body = NEVER_ARRIVES.format(timeout="", group="dist.new_group(list(range(dist.get_world_size())))")
    status, out, _ = run_job(tmp_path, body, 2, {"MPICOMM_TIMEOUT": "1"}, timeout=120)
    _ended(out, status)
    assert "the default timeout, 1 s" in out, out


def test_a_users_timeout_wins_over_mpicomm_timeout(tmp_path):
    body = NEVER_ARRIVES.format(timeout=", timeout=datetime.timedelta(seconds=2)", group="None")
    status, out, _ = run_job(tmp_path, body, 2, {"MPICOMM_TIMEOUT": "600"}, timeout=120)
    _ended(out, status)
    assert "the timeout group world was made with, 2 s" in out, out


DISAGREE = """
    import mpicomm.torch
    import torch.distributed as dist

    dist.init_process_group("mpicomm")
    r = dist.get_rank()
    ranks = list(range(dist.get_world_size())) if r == 0 else [r]  # the ranks disagree on the members
    group = dist.new_group(ranks)
    print(f"rank {r} made its group", flush=True)
    dist.barrier()
    print(f"rank {r} went on", flush=True)
"""


def test_ranks_that_disagree_in_torchs_new_group_end_within_the_timeout_naming_the_call(tmp_path):
    status, out, _ = run_job(tmp_path, DISAGREE, 2, {"MPICOMM_TIMEOUT": "1"}, timeout=120)
    assert status != 0 and "went on" not in out, out
    assert "mpicomm watchdog: new_group on group world" in out and "job.py:8. Timed out" in out, out
