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
    assert 'srun --mpi="${MPICOMM_SRUN_MPI:-pmi2}" --cpus-per-task=1 "$py" -m mpi4py x.py' in text
    assert "py=${MPICOMM_PYTHON:-python3}" in text and text.endswith("esac\n")
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
    assert '    srun --mpi="${MPICOMM_SRUN_MPI:-pmi2}" --cpus-per-task=6 "$py"' in text
