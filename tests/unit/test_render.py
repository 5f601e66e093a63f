"""render_sbatch against committed golden files, and its argument checks.

Regenerate the golden files after an intended change with
``MPICOMM_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_render.py \
tests/unit/test_plan_cli.py``
and review the diff before committing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mpicomm.errors import ArgumentError, ArgumentTypeError
from mpicomm.planner import JobShape, RankLayout, render_sbatch

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MPICOMM_REGENERATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.read_text() == text, (
        f"{path} differs; regenerate with MPICOMM_REGENERATE_GOLDEN=1 if intended"
    )


def test_block_layout_with_gpus_account_and_partition() -> None:
    shape = JobShape(nodes=2, ntasks_per_node=4, gpus_per_node=4, cpus_per_task=8)
    text = render_sbatch(
        RankLayout.from_shape(shape, "gpu[01-02]"),
        ["-m", "mpicomm.demo", "--json", "out file.json"],
        job_name="demo",
        time="1-00:00:00",
        output="logs/%x-%j.out",
        account="proj42",
        partition="gpu",
        mpi="pmix",
        header=["a header line"],
        environ={"MPICOMM_ACCOUNT": "ignored-when-given"},
    )
    check_golden("render_block_gpus.sbatch", text)
    assert "#SBATCH --account=proj42\n" in text and "export OMP_NUM_THREADS=8\n" in text
    assert text.count("-m mpi4py -m mpicomm.demo --json 'out file.json'\n") == 2  # mpiexec and srun
    hydra = 'HYDRA_LAUNCHER_EXTRA_ARGS="--cpus-per-task=$((${SLURM_NTASKS_PER_NODE:-4} * 8))'
    assert hydra + ' --gpus-per-node=4"' in text


def test_cyclic_layout_account_and_partition_from_the_environment() -> None:
    shape = JobShape(nodes=3, ntasks_per_node=2, distribution="cyclic")
    env = {"MPICOMM_ACCOUNT": "envacct", "MPICOMM_PARTITION": "debug"}
    text = render_sbatch(RankLayout.from_shape(shape), ["-m", "mpicomm.bench"], job_name="bench", environ=env)
    check_golden("render_cyclic_env.sbatch", text)
    assert "#SBATCH --account=envacct\n#SBATCH --partition=debug\n" in text


def test_no_account_or_partition_lines_without_arguments_or_environment() -> None:
    text = render_sbatch(RankLayout.from_shape(JobShape()), ["x.py"], job_name="j", environ={})
    assert "--account" not in text and "--partition" not in text and "--gpus-per-node" not in text
    bound = '${bind[@]+"${bind[@]}"}'  # empty without GPUs
    assert f'srun --mpi="${{MPICOMM_SRUN_MPI:-pmi2}}" --cpus-per-task=1 {bound} "$py" -m mpi4py x.py' in text
    assert "py=${py:-python3}" in text and text.endswith("esac\n")
    assert "bind=()" in text and "CUDA_VISIBLE_DEVICES" not in text
    sbatch = [i for i, line in enumerate(text.splitlines()) if line.startswith("#SBATCH")]
    first_command = next(i for i, line in enumerate(text.splitlines()) if line and not line.startswith("#"))
    assert max(sbatch) < first_command, "sbatch stops reading #SBATCH lines at the first command"


def test_environment_is_read_at_render_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPICOMM_PARTITION", "fromenv")
    monkeypatch.delenv("MPICOMM_ACCOUNT", raising=False)
    text = render_sbatch(RankLayout.from_shape(JobShape()), ["x.py"], job_name="j")
    assert "#SBATCH --partition=fromenv\n" in text and "--account" not in text


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"command": []}, ArgumentError, "command is []"),
        ({"command": "-m x"}, ArgumentError, "expected a non-empty list"),
        ({"command": ["-m", 3]}, ArgumentTypeError, "expected strings only"),
        ({"job_name": "my job"}, ArgumentError, "job_name is 'my job'"),
        ({"time": "ten minutes"}, ArgumentError, "time is 'ten minutes'"),
        ({"account": "a\nb"}, ArgumentError, "account is 'a\\nb'"),
        ({"header": ["two\nlines"]}, ArgumentError, "header line"),
        ({"layout": JobShape()}, ArgumentTypeError, "layout is JobShape; expected a RankLayout"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], exc: type[Exception], words: str) -> None:
    args: dict[str, object] = {
        "layout": RankLayout.from_shape(JobShape()),
        "command": ["x.py"],
        "job_name": "j",
    }
    args.update(kwargs)
    layout, command = args.pop("layout"), args.pop("command")
    with pytest.raises(exc) as info:
        render_sbatch(layout, command, environ={}, **args)  # type: ignore[arg-type]
    assert str(info.value).startswith("render_sbatch: ") and words in str(info.value)


def test_srun_gets_the_cpus_per_task_itself() -> None:
    # Slurm >= 22.05: srun does not take --cpus-per-task from sbatch, so every task would get one CPU
    text = render_sbatch(RankLayout.from_shape(JobShape(cpus_per_task=6)), ["x.py"], job_name="j", environ={})
    assert "#SBATCH --cpus-per-task=6" in text and "export OMP_NUM_THREADS=6" in text
    assert '    srun --mpi="${MPICOMM_SRUN_MPI:-pmi2}" --cpus-per-task=6 ${bind[@]+' in text


def _shell(lines: str, env: dict[str, str], cwd: Path) -> str:
    import subprocess

    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
    done = subprocess.run(
        ["bash", "-c", lines], capture_output=True, text=True, env=clean, cwd=cwd, check=True
    )
    return done.stdout.strip()


def _lines_from(text: str, first: str, last: str) -> str:
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(first))
    j = next(k for k, line in enumerate(lines) if line.startswith(last))
    return "\n".join(lines[i : j + 1])


@pytest.mark.process
def test_the_interpreter_is_the_virtual_environments_not_a_bare_python3(tmp_path: Path) -> None:
    """Issue 44: the scripts ran python3 from the PATH, not the venv mpicomm was installed in."""
    text = render_sbatch(RankLayout.from_shape(JobShape()), ["x.py"], job_name="j", environ={})
    pick = _lines_from(text, "py=${MPICOMM_PYTHON:-}", "py=${py:-python3}") + '\necho "$py"'
    assert _shell(pick, {}, tmp_path) == "python3"
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("#!/bin/sh\n")
    (venv / "python").chmod(0o755)
    assert _shell(pick, {}, tmp_path) == str(venv / "python")  # make venv's, in the job's folder
    other = tmp_path / "other"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "python").write_text("#!/bin/sh\n")
    (other / "bin" / "python").chmod(0o755)
    assert _shell(pick, {"VIRTUAL_ENV": str(other)}, tmp_path) == str(other / "bin" / "python")
    assert _shell(pick, {"VIRTUAL_ENV": str(other), "MPICOMM_PYTHON": "/x/py"}, tmp_path) == "/x/py"


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"MPI_LOCALRANKID": "5"}, "1"),  # Hydra's local rank, no list from Slurm: GPU 5 % 4
        ({"SLURM_LOCALID": "2"}, "2"),
        ({"MPI_LOCALRANKID": "3", "SLURM_LOCALID": "0", "CUDA_VISIBLE_DEVICES": "4,6,7,9"}, "9"),
        ({"SLURM_LOCALID": "6", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, "GPU-a"),
    ],
)
@pytest.mark.process
def test_each_rank_of_a_gpu_layout_sees_its_own_gpu(tmp_path: Path, env: dict[str, str], want: str) -> None:
    """Issue 44: a layout with GPUs bound none per rank; now each sees GPU local_rank % gpus_per_node."""
    shape = JobShape(nodes=2, ntasks_per_node=8, gpus_per_node=4)
    text = render_sbatch(RankLayout.from_shape(shape), ["x.py"], job_name="j", environ={})
    bind = next(line for line in text.splitlines() if line.startswith("bind=(bash"))
    assert text.count('${bind[@]+"${bind[@]}"} "$py" -m mpi4py x.py') == 2  # under mpiexec and srun
    got = _shell(f'{bind}\n"${{bind[@]}}" bash -c \'echo "$CUDA_VISIBLE_DEVICES"\'', env, tmp_path)
    assert got == want
