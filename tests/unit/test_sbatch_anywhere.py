"""Generated batch scripts run in the directory they were generated for, wherever they are submitted from.

sbatch runs a spooled copy of the script, so the script finds its original place through ``scontrol
show job`` (faked here) or, run with ``bash``, through ``BASH_SOURCE``. A fake ``srun`` prints where it
runs and what it was given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpicomm.apps.plan import main as plan_main


@pytest.fixture
def generated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """A repository with jobs/run.sbatch generated from its root, a fake bin dir and another directory."""
    repo, fake, elsewhere = tmp_path / "repo", tmp_path / "bin", tmp_path / "elsewhere"
    for d in (repo / "jobs", fake, elsewhere):
        d.mkdir(parents=True)
    monkeypatch.chdir(repo)
    argv = ["--nodes", "1", "--ntasks-per-node", "2", "--quiet", "--sbatch", "jobs/run.sbatch"]
    assert plan_main([*argv, "--", "-m", "mpicomm.planner.run_plan", "jobs/plan.json"]) == 0
    (fake / "srun").write_text('#!/bin/bash\necho "cwd=$PWD"\necho "args=$*"\n')
    script = repo / "jobs" / "run.sbatch"
    (fake / "scontrol").write_text(f'#!/bin/bash\necho "   Command={script} WorkDir=/x"\n')
    for tool in ("srun", "scontrol"):
        (fake / tool).chmod(0o755)
    return repo, fake, elsewhere


def _run(script: Path, cwd: Path, path: str, job: bool) -> str:
    env = {**os.environ, "PATH": path, "MPICOMM_LAUNCHER": "srun"}  # the fake srun, whatever MPI is here
    env.pop("SLURM_JOB_ID", None)
    if job:
        env["SLURM_JOB_ID"] = "42"
    done = subprocess.run(
        ["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.process
def test_sbatch_copy_in_a_spool_directory_runs_in_the_repository(generated, tmp_path):
    repo, fake, elsewhere = generated
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copy(repo / "jobs" / "run.sbatch", spool / "slurm_script")
    out = _run(spool / "slurm_script", elsewhere, f"{fake}:{os.environ['PATH']}", job=True)
    assert f"cwd={repo}" in out
    assert "-m mpicomm.planner.run_plan jobs/plan.json" in out


@pytest.mark.process
def test_bash_from_another_directory_runs_in_the_repository(generated):
    repo, fake, elsewhere = generated
    (fake / "scontrol").unlink()  # no Slurm client: BASH_SOURCE gives the place
    out = _run(repo / "jobs" / "run.sbatch", elsewhere, f"{fake}:{os.environ['PATH']}", job=False)
    assert f"cwd={repo}" in out


@pytest.mark.process
def test_a_piped_script_stays_in_the_submit_directory(generated, tmp_path):
    repo, fake, elsewhere = generated
    (fake / "scontrol").write_text('#!/bin/bash\necho "   Command=(null)"\n')
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copy(repo / "jobs" / "run.sbatch", spool / "slurm_script")
    out = _run(spool / "slurm_script", elsewhere, f"{fake}:{os.environ['PATH']}", job=True)
    assert f"cwd={elsewhere}" in out


def test_explicit_chdir_becomes_an_sbatch_directive(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--quiet", "--chdir", "work", "--sbatch", "run.sbatch", "--", "x.py"]
    assert plan_main(argv) == 0
    text = (tmp_path / "run.sbatch").read_text()
    assert f"#SBATCH --chdir={tmp_path / 'work'}\n" in text
    assert "scontrol" not in text


def test_repository_job_scripts_find_the_repository_root():
    root = Path(__file__).resolve().parents[2]
    for script in sorted((root / "jobs").glob("*.sbatch")):
        text = script.read_text()
        assert 'if [ -f "$script" ]; then cd "$(dirname "$script")/.."; fi' in text, script.name
    assert sys.executable  # the scripts' interpreter comes from MPICOMM_PYTHON at submit time
