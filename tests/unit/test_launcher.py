"""The launcher choice: ``choose_launcher`` and the shell block of the rendered scripts, run with stand-ins.

A fake interpreter prints an MPI library version (the MPICH wheel's or Debian Open MPI's), a fake
``mpiexec`` beside it and a fake ``srun`` on ``PATH`` print what they were given; the script is run with
``bash`` as sbatch would, with the job's ``SLURM_*`` variables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpicomm.errors import ArgumentError
from mpicomm.plan import main as plan_main
from mpicomm.planner import JobShape, RankLayout, choose_launcher, render_sbatch
from mpicomm.planner.launcher import is_mpich_wheel, library_version

WHEEL = "MPICH Version:      5.0.2\nMPICH Custom Information:\thttps://pypi.org/p/mpich/5.0.2/\n"
OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\n"
SHOW = 'echo "$(basename "$0") $* | HYDRA=${HYDRA_LAUNCHER_EXTRA_ARGS:-} | UNBUF=${PYTHONUNBUFFERED:-}"'


def test_the_wheel_is_told_from_its_version_string() -> None:
    assert is_mpich_wheel(WHEEL) and not is_mpich_wheel(OPEN_MPI)
    assert not is_mpich_wheel("MPICH Version: 4.2.0\nMPICH Device: ch4:ofi")  # a site MPICH


@pytest.mark.parametrize(
    ("version", "env", "want", "words"),
    [
        (WHEEL, {}, "mpiexec", "MPICOMM_LAUNCHER unset, so auto: the MPI library is PyPI's MPICH wheel"),
        (WHEEL, {"MPICOMM_LAUNCHER": "auto"}, "mpiexec", "MPICOMM_LAUNCHER=auto, so auto"),
        (OPEN_MPI, {}, "srun", "auto: the MPI library is not PyPI's MPICH wheel"),
        (None, {}, "srun", "could not be read"),
        (WHEEL, {"MPICOMM_LAUNCHER": "srun"}, "srun", "MPICOMM_LAUNCHER=srun"),
        (OPEN_MPI, {"MPICOMM_LAUNCHER": "mpiexec"}, "mpiexec", "MPICOMM_LAUNCHER=mpiexec"),
    ],
)
def test_choose_launcher(version: str | None, env: dict[str, str], want: str, words: str) -> None:
    choice = choose_launcher(version, env)
    assert choice.launcher == want and words in choice.reason


def test_choose_launcher_srun_plugin_from_the_environment_then_the_default() -> None:
    assert choose_launcher(OPEN_MPI, {"MPICOMM_SRUN_MPI": "pmix"}).describe().startswith("srun --mpi=pmix (")
    assert choose_launcher(OPEN_MPI, {}, mpi="pmix").srun_mpi == "pmix"


def test_choose_launcher_rejects_an_unknown_launcher() -> None:
    with pytest.raises(
        ArgumentError, match="MPICOMM_LAUNCHER is 'mpirun'; expected one of auto, mpiexec, srun"
    ):
        choose_launcher(WHEEL, {"MPICOMM_LAUNCHER": "mpirun"})


@pytest.mark.process
def test_the_version_is_read_in_a_child_without_importing_mpi_here() -> None:
    code = (
        "import sys; from mpicomm.planner import job_launcher; _, c = job_launcher({'MPICOMM_PYTHON': "
        "sys.executable}); assert 'mpi4py.MPI' not in sys.modules; print(c.launcher)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() in ("mpiexec", "srun"), done.stderr
    assert library_version("/nonexistent/python") is None


def _fake_tree(tmp_path: Path, version: str, mpiexec: bool = True, rc: int = 0) -> tuple[Path, Path]:
    """``env/bin/python`` printing ``version`` (and ``mpiexec`` beside it), ``bin/srun`` on PATH."""
    env_bin, path_bin = tmp_path / "env" / "bin", tmp_path / "bin"
    env_bin.mkdir(parents=True)
    path_bin.mkdir()
    python = env_bin / "python"
    python.write_text(f'#!/bin/bash\nif [ "$3" = --mpi-lib-version ]; then printf %s "{version}"; fi\n')
    tools = [python, path_bin / "srun"]
    (path_bin / "srun").write_text(f"#!/bin/bash\n{SHOW}\nexit {rc}\n")
    if mpiexec:
        (env_bin / "mpiexec").write_text(f"#!/bin/bash\n{SHOW}\nexit {rc}\n")
        tools.append(env_bin / "mpiexec")
    for tool in tools:
        tool.chmod(0o755)
    return python, path_bin


def _run_script(
    tmp_path: Path, shape: JobShape, version: str, env: dict[str, str], **fake: object
) -> subprocess.CompletedProcess[str]:
    python, path_bin = _fake_tree(tmp_path, version, **fake)  # type: ignore[arg-type]
    script = tmp_path / "job.sbatch"
    script.write_text(
        render_sbatch(RankLayout.from_shape(shape), ["-m", "prog", "a b"], job_name="j", environ={})
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MPICOMM_", "PYTHONUNBUF"))}
    clean.update({"PATH": f"{path_bin}:{os.environ['PATH']}", "MPICOMM_PYTHON": str(python), **env})
    return subprocess.run(["bash", str(script)], env=clean, capture_output=True, text=True, check=False)


TWO_BY_FOUR = JobShape(nodes=2, ntasks_per_node=4)
JOB = {"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4"}


@pytest.mark.process
def test_auto_runs_the_wheels_mpiexec_with_the_jobs_ranks(tmp_path: Path) -> None:
    done = _run_script(tmp_path, TWO_BY_FOUR, WHEEL, JOB)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"mpiexec -n 8 {tmp_path}/env/bin/python -m mpi4py -m prog a b | ")
    assert "HYDRA=--cpus-per-task=4 |" in done.stdout and "-ppn" not in done.stdout
    assert "mpicomm: launcher mpiexec (auto: the MPI library is PyPI's MPICH wheel" in done.stderr


@pytest.mark.process
def test_auto_runs_srun_for_open_mpi(tmp_path: Path) -> None:
    done = _run_script(tmp_path, TWO_BY_FOUR, OPEN_MPI, JOB)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("srun --mpi=pmi2 --cpus-per-task=1 ")
    assert "mpicomm: launcher srun (auto: the MPI library is not PyPI's MPICH wheel)" in done.stderr


@pytest.mark.process
def test_overrides_launcher_and_srun_plugin(tmp_path: Path) -> None:
    done = _run_script(tmp_path / "a", TWO_BY_FOUR, WHEEL, {**JOB, "MPICOMM_LAUNCHER": "srun"})
    assert (
        done.stdout.startswith("srun --mpi=pmi2 ") and "launcher srun (MPICOMM_LAUNCHER=srun)" in done.stderr
    )
    env = {**JOB, "MPICOMM_SRUN_MPI": "pmix"}
    assert _run_script(tmp_path / "b", TWO_BY_FOUR, OPEN_MPI, env).stdout.startswith("srun --mpi=pmix ")
    done = _run_script(tmp_path / "c", TWO_BY_FOUR, OPEN_MPI, {**JOB, "MPICOMM_LAUNCHER": "mpiexec"})
    assert done.stdout.startswith("mpiexec -n 8 ") and "(MPICOMM_LAUNCHER=mpiexec)" in done.stderr


@pytest.mark.process
def test_cyclic_cpus_gpus_and_labels_under_mpiexec(tmp_path: Path) -> None:
    shape = JobShape(nodes=2, ntasks_per_node=2, cpus_per_task=3, gpus_per_node=2, distribution="cyclic")
    env = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_LABELIO": "1", "PYTHONUNBUFFERED": "1"}
    done = _run_script(tmp_path, shape, WHEEL, env)
    assert done.stdout.startswith("mpiexec -n 4 -ppn 1 -prepend-rank "), done.stdout
    # Hydra's one proxy per node gets the CPUs of the node's 2 ranks, and the GPUs
    assert "HYDRA=--cpus-per-task=6 --gpus-per-node=2 |" in done.stdout
    assert done.stdout.rstrip().endswith("UNBUF="), "labels need line-buffered ranks"


@pytest.mark.process
def test_the_ranks_come_from_the_job_not_the_plan(tmp_path: Path) -> None:
    # submitted on 6 ranks, 3 per node: mpiexec starts 6, and the program's layout check says so
    done = _run_script(tmp_path, TWO_BY_FOUR, WHEEL, {"SLURM_NTASKS": "6", "SLURM_NTASKS_PER_NODE": "3"})
    assert done.stdout.startswith("mpiexec -n 6 ") and "HYDRA=--cpus-per-task=3 |" in done.stdout


@pytest.mark.process
@pytest.mark.parametrize("launcher", ["auto", "srun"])
def test_a_failing_launch_fails_the_script(tmp_path: Path, launcher: str) -> None:
    done = _run_script(tmp_path, TWO_BY_FOUR, WHEEL, {**JOB, "MPICOMM_LAUNCHER": launcher}, rc=3)
    assert done.returncode == 3


@pytest.mark.process
def test_bad_launcher_and_missing_mpiexec_stop_with_a_message(tmp_path: Path) -> None:
    done = _run_script(tmp_path / "a", TWO_BY_FOUR, WHEEL, {**JOB, "MPICOMM_LAUNCHER": "mpirun"})
    assert done.returncode == 2 and done.stdout == ""
    assert "MPICOMM_LAUNCHER is 'mpirun'; expected auto, mpiexec or srun" in done.stderr
    done = _run_script(tmp_path / "b", TWO_BY_FOUR, WHEEL, JOB, mpiexec=False)
    assert done.returncode == 2 and "no mpiexec beside" in done.stderr


@pytest.mark.process
def test_plan_says_which_launcher_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    python, _ = _fake_tree(tmp_path, WHEEL)
    monkeypatch.setenv("MPICOMM_PYTHON", str(python))
    monkeypatch.delenv("MPICOMM_LAUNCHER", raising=False)
    assert plan_main(["--nodes", "2", "--sbatch", str(tmp_path / "j.sbatch"), "--", "x.py"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("launcher: chosen when the job starts (MPICOMM_LAUNCHER=auto|mpiexec|srun")
    assert f"job interpreter {python}" in last and "it is mpiexec beside the interpreter (" in last
    monkeypatch.setenv("MPICOMM_LAUNCHER", "srun")
    assert plan_main(["--sbatch", str(tmp_path / "j.sbatch"), "--", "x.py"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("it is srun --mpi=pmi2 (MPICOMM_LAUNCHER=srun)")


@pytest.mark.process
@pytest.mark.parametrize("launcher", [None, "srun"])
def test_info_says_which_launcher_and_why(launcher: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPICOMM_", "PMI_", "HYDRA_", "OMPI_"))}
    if launcher:
        env["MPICOMM_LAUNCHER"] = launcher
    done = subprocess.run(
        [sys.executable, "-m", "mpicomm", "info"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("Slurm launcher:"))
    want = choose_launcher(
        library_version(sys.executable), {} if launcher is None else {"MPICOMM_LAUNCHER": launcher}
    )
    assert line.split(":", 1)[1].strip() == want.describe()
