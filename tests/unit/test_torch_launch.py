"""``import mpicomm.torch`` under MPI launchers: torchrun's variables, a mesh without init, launch mistakes.

The variables are checked as pure functions of an environment (each launcher's names, Slurm's derived
local size, a user's value kept). Then ``tests/torchlaunch/program.py``, a torchrun-style program
(LOCAL_RANK read before init, ``init_device_mesh`` with no group, DDP, FSDP2 saved with DCP and
resumed), runs under ``torchrun`` on gloo and, with its one line added, under ``mpiexec`` on mpicomm, at
2 and 3 ranks: the parameters must agree (bitwise at 2 ranks; at 3, gloo's ring and MPI add in other
orders, so float32 rounding). Last, launches MPI did not make are refused on every process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mpicomm.c10d.launch import LaunchError, check_launch, launcher_variables, set_launch_variables
from tests.mpijobs import MPIEXEC, REPO, needs_mpiexec

PROGRAM = REPO / "tests" / "torchlaunch" / "program.py"
_LAUNCH = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIEXEC_", "MPICOMM_", "SLURM_", "MV2_", "TORCHELASTIC_")
_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


pytestmark = pytest.mark.process  # every test starts processes


def _values(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, (v, _) in launcher_variables(env).items()}


def test_each_launcher_gives_torchruns_four_variables() -> None:
    hydra = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    ompi = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    srun = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"}
    assert _values(hydra) == {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert _values(ompi) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert _values(srun) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert launcher_variables({}) == {} and launcher_variables({"PMI_RANK": "0"}) == {}


def test_srun_local_size_derived_from_tasks_per_node() -> None:
    base = {"SLURM_NTASKS": "7", "SLURM_TASKS_PER_NODE": "3(x2),1"}
    for rank, node, local, size in ((0, 0, 0, "3"), (4, 1, 1, "3"), (6, 2, 0, "1")):
        env = {**base, "SLURM_PROCID": str(rank), "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local)}
        assert _values(env)["LOCAL_WORLD_SIZE"] == size, env
    assert "LOCAL_WORLD_SIZE" not in _values({**base, "SLURM_PROCID": "0"})  # no node index: not guessed


def test_mpiexec_inside_an_allocation_ignores_the_proxys_slurm_variables() -> None:
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    assert _values(env) == {"RANK": "3", "WORLD_SIZE": "4"}
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE and Slurm's own for the same task: Slurm fills the local ones
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1"}
    assert _values(env) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}


def test_set_launch_variables_never_overrides_the_users_values() -> None:
    env = {
        "PMI_RANK": "1",
        "PMI_SIZE": "2",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "2",
        "LOCAL_RANK": "0",
    }
    assert set_launch_variables(env) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert env["LOCAL_RANK"] == "0"
    assert set_launch_variables(env) == {}  # idempotent


def test_check_launch_names_what_was_found_and_what_to_run() -> None:
    check_launch(1, 2, "f", {"RANK": "1", "WORLD_SIZE": "2"})
    check_launch(0, 1, "f", {})
    cases = {
        "without an MPI launcher": {"RANK": "1", "WORLD_SIZE": "2"},
        "srun --mpi=pmi2": {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
        "instead of torchrun": {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "x",
            "MASTER_ADDR": "h",
        },
    }
    for advice, env in cases.items():
        with pytest.raises(LaunchError, match="f: the environment says 2 ranks") as info:
            check_launch(0, 1, "f", env)
        assert advice in str(info.value) and "mpiexec -n 2" in str(info.value), info.value
    with pytest.raises(LaunchError, match=r"says rank 1 .*numbers this process 0 of 2"):
        check_launch(0, 2, "f", {"RANK": "1", "WORLD_SIZE": "2"})
    assert issubclass(LaunchError, RuntimeError)


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH) and k not in _TORCHRUN}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **extra})
    return env


def _program(tmp_path: Path, ranks: int, backend: str) -> dict[str, object]:
    out, ckpt = tmp_path / f"{backend}.json", tmp_path / f"ckpt-{backend}"
    if backend == "mpicomm":
        cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable]
        env = _clean_env({"PROGRAM_MPICOMM": "1"})
    else:
        torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        cmd, env = [sys.executable, *torchrun], _clean_env({})
    done = subprocess.run(
        [*cmd, str(PROGRAM), str(out), str(ckpt)], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, object] = json.loads(out.read_text())
    return result


@needs_mpiexec
@pytest.mark.parametrize("ranks", [2, 3])
def test_torchrun_program_runs_on_mpicomm_with_one_line_as_on_gloo(tmp_path: Path, ranks: int) -> None:
    ours, theirs = _program(tmp_path, ranks, "mpicomm"), _program(tmp_path, ranks, "gloo")
    assert (ours["backend"], theirs["backend"]) == ("mpicomm", "gloo")
    # under mpiexec -n N on one machine, what torchrun gives its N workers
    assert ours["seen"] == theirs["seen"], (ours["seen"], theirs["seen"])
    for r, seen in enumerate(ours["seen"]):  # type: ignore[arg-type]
        assert seen == {
            "RANK": str(r),
            "WORLD_SIZE": str(ranks),
            "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(ranks),
            "node_local_rank": r,
        }
    for part in ("ddp", "fsdp", "resumed"):
        a, b = ours[part], theirs[part]
        assert isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
        for name in a:
            if ranks <= 2:
                assert a[name] == b[name], (part, name)
            else:
                torch.testing.assert_close(torch.tensor(a[name]), torch.tensor(b[name]), rtol=1e-5, atol=1e-6)
    # the resumed model continued from the checkpoint exactly where the saved one went on
    assert ours["resumed"] == ours["fsdp"]


_START = textwrap.dedent(
    """
    import mpicomm.torch
    import torch.distributed as dist
    dist.init_process_group("mpicomm")
    print("STARTED", dist.get_rank(), dist.get_world_size())
    """
)


def _two_by_hand(extra: list[dict[str, str]]) -> list[str]:
    """Start two plain ``python`` processes (no MPI launcher) with the given environments; their outputs."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _START],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_clean_env(e),
        )
        for e in extra
    ]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode != 0, out
        outs.append(out)
    return outs


def test_two_processes_with_rank_and_world_size_but_no_mpi_launcher_are_refused() -> None:
    outs = _two_by_hand([{"RANK": str(r), "WORLD_SIZE": "2"} for r in range(2)])
    for out in outs:
        assert "LaunchError: init_process_group: the environment says 2 ranks (WORLD_SIZE=2)" in out, out
        assert "without an MPI launcher" in out and "STARTED" not in out


def test_srun_tasks_that_mpi_did_not_join_are_refused() -> None:
    outs = _two_by_hand([{"SLURM_PROCID": str(r), "SLURM_NTASKS": "2"} for r in range(2)])
    for out in outs:
        assert "the environment says 2 ranks (SLURM_NTASKS=2)" in out and "srun --mpi=pmi2" in out, out


def test_torchrun_without_an_mpi_launcher_is_refused_on_every_worker(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(_START)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    done = subprocess.run(
        [*torchrun, str(prog)], capture_output=True, text=True, env=_clean_env({}), timeout=180
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "STARTED" not in out, out
    assert out.count("torchrun's environment was found") >= 2, out  # both workers, not only the first
    assert "run `mpiexec -n 2 python prog.py`" in out, out
