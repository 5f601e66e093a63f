"""Render the Slurm batch script that runs a command on a rank layout (a pure function of its inputs)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from ..errors import ArgumentError, ArgumentTypeError
from .launcher import launch_lines
from .layout import RankLayout

__all__ = ["check_time", "render_sbatch"]

_FN = "render_sbatch"
_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2})$")
_PLAIN = re.compile(r"^[A-Za-z0-9_.%@+=:,/-]+$")


def _plain(arg: str, value: object, pattern: re.Pattern[str] = _PLAIN) -> str:
    """A value that goes into an ``#SBATCH`` line unquoted: no spaces, quotes or newlines."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{_FN}: {arg} is {type(value).__name__}; expected a string")
    if not pattern.match(value):
        raise ArgumentError(
            f"{_FN}: {arg} is {value!r}; expected letters, digits and _.%@+=:,/- only "
            "(it goes into an #SBATCH line)"
        )
    return value


def check_time(time: object, fn: str = _FN, arg: str = "time") -> str:
    """Return ``time`` if it is a Slurm time limit, else raise with the formats Slurm takes.

    Raises:
        ArgumentTypeError: ``time`` is not a string.
        ArgumentError: ``time`` is not ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` or
            ``D-HH:MM:SS``.

    Example:
        >>> check_time("00:10:00"), check_time("1-12")
        ('00:10:00', '1-12')
        >>> check_time("banana")
        Traceback (most recent call last):
        ...
        mpicomm.errors.ArgumentError: render_sbatch: time is 'banana'; expected a Slurm time limit: ...
    """
    if not isinstance(time, str):
        raise ArgumentTypeError(f"{fn}: {arg} is {type(time).__name__}; expected a string such as '00:10:00'")
    if not _TIME.match(time):
        raise ArgumentError(
            f"{fn}: {arg} is {time!r}; expected a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
            "D-HH:MM:SS (e.g. 30 for half an hour, 00:10:00, 1-12:00:00)"
        )
    return time


def render_sbatch(
    layout: RankLayout,
    command: Sequence[str],
    *,
    job_name: str,
    time: str = "00:10:00",
    output: str = "%x-%j.out",
    account: str | None = None,
    partition: str | None = None,
    mpi: str = "pmi2",
    header: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    chdir: str | None = None,
) -> str:
    """The text of a batch script that runs ``command`` on every rank of ``layout``.

    The launcher is chosen when the job starts (``mpicomm.planner.launch_lines``):
    ``MPICOMM_LAUNCHER=auto`` (the default) runs the MPICH wheel's own ``mpiexec`` beside the interpreter
    when the job's MPI library is PyPI's MPICH wheel, and ``srun --mpi="${MPICOMM_SRUN_MPI:-<mpi>}"
    --cpus-per-task=<n>`` for any other MPI; ``mpiexec`` or ``srun`` force one. The interpreter is
    ``"${MPICOMM_PYTHON:-python3}"``, run as ``-m mpi4py <command...>`` so that one rank's uncaught
    exception ends the whole job. The script's exit code is the launcher's: non-zero when any rank fails.
    With ``chdir`` the job runs in a fixed directory wherever the script is submitted from, so relative
    paths in ``command`` (a plan file) still resolve.

    Args:
        layout: the rank layout (nodes, tasks per node, GPUs per node, CPUs per task, distribution).
        command: the arguments after the interpreter, e.g. ``["-m", "mpicomm.demo"]``.
        job_name: ``#SBATCH --job-name``.
        time: the time limit, ``[D-]HH:MM:SS``.
        output: ``#SBATCH --output`` (``%x`` is the job name, ``%j`` the job id).
        account: ``#SBATCH --account``; default the ``MPICOMM_ACCOUNT`` environment variable, else none.
        partition: ``#SBATCH --partition``; default ``MPICOMM_PARTITION``, else none.
        mpi: the default ``srun --mpi`` plugin when srun launches: ``pmi2`` for MPICH, ``pmix`` for Open MPI.
        header: comment lines put under the ``#!`` line (without the ``#``), e.g. how to regenerate.
        environ: where ``MPICOMM_ACCOUNT``/``MPICOMM_PARTITION`` are read; default ``os.environ``.
        chdir: where the job runs: an absolute path becomes ``#SBATCH --chdir``; a relative one is taken
            from the script's own directory, found at run time (``scontrol show job``'s ``Command``, or
            ``BASH_SOURCE`` when run with ``bash``), so the script and its files can move together;
            ``None`` runs in the submit directory.

    Returns:
        The script, ending in a newline.

    Raises:
        ArgumentTypeError: a non-string where a string is expected, or ``layout`` is not a RankLayout.
        ArgumentError: an empty command, a malformed time, a value with spaces or quotes.

    Example:
        >>> from mpicomm.planner import JobShape, RankLayout
        >>> text = render_sbatch(RankLayout.from_shape(JobShape(nodes=2, ntasks_per_node=4)),
        ...                      ["-m", "mpicomm.demo"], job_name="demo", environ={})
        >>> [line.split()[:3] for line in text.splitlines() if line.lstrip().startswith("srun ")]
        [['srun', '--mpi="${MPICOMM_SRUN_MPI:-pmi2}"', '--cpus-per-task=1']]
        >>> text.count('"$py" -m mpi4py -m mpicomm.demo')  # under mpiexec and under srun
        2
    """
    if not isinstance(layout, RankLayout):
        raise ArgumentTypeError(f"{_FN}: layout is {type(layout).__name__}; expected a RankLayout")
    if isinstance(command, str) or not isinstance(command, Sequence) or not command:
        raise ArgumentError(f"{_FN}: command is {command!r}; expected a non-empty list of arguments")
    if not all(isinstance(a, str) for a in command):
        raise ArgumentTypeError(f"{_FN}: command is {command!r}; expected strings only")
    env = os.environ if environ is None else environ
    account = account if account is not None else env.get("MPICOMM_ACCOUNT") or None
    partition = partition if partition is not None else env.get("MPICOMM_PARTITION") or None
    shape = layout.shape
    sb = [
        f"--job-name={_plain('job_name', job_name)}",
        f"--nodes={shape.nodes}",
        f"--ntasks-per-node={shape.ntasks_per_node}",
        f"--cpus-per-task={shape.cpus_per_task}",
    ]
    if shape.gpus_per_node:
        sb.append(f"--gpus-per-node={shape.gpus_per_node}")
    sb.append(f"--distribution={shape.distribution}")
    if layout.named:
        sb.append(f"--nodelist={','.join(_plain('node_names', n) for n in layout.node_names)}")
    sb.append(f"--time={check_time(time)}")
    sb.append(f"--output={_plain('output', output)}")
    if account:
        sb.append(f"--account={_plain('account', account)}")
    if partition:
        sb.append(f"--partition={_plain('partition', partition)}")
    if chdir is not None and os.path.isabs(_plain("chdir", chdir)):
        sb.append(f"--chdir={chdir}")
    lines = ["#!/bin/bash"]
    for line in header:
        if "\n" in line:
            raise ArgumentError(f"{_FN}: header line {line!r} has a newline; expected one line per item")
        lines.append(f"# {line}".rstrip())
    lines += [f"#SBATCH {s}" for s in sb]
    plugin = _plain("mpi", mpi)
    lines += [
        "# The interpreter comes from MPICOMM_PYTHON, the launcher from MPICOMM_LAUNCHER (below). The exit",
        "# code is the launcher's: non-zero when any rank fails.",
        "set -euo pipefail",
        *(_cd_lines(chdir) if chdir is not None and not os.path.isabs(chdir) else []),
        f"export OMP_NUM_THREADS={shape.cpus_per_task}",
        *launch_lines(layout, command, plugin),
    ]
    return "\n".join(lines) + "\n"


def _cd_lines(relative: str) -> list[str]:
    """Shell lines that change to ``relative`` from the script's own directory, wherever it was submitted.

    sbatch runs a copy of the script from its spool directory, so the original path comes from
    ``scontrol show job`` (its ``Command=``); run with ``bash`` instead, from ``BASH_SOURCE``. When
    neither names an existing file (a script piped into sbatch), the job stays in the submit directory.
    """
    return [
        f"# run in {relative} from this script's directory, wherever it is submitted from",
        'script=$({ scontrol show job "${SLURM_JOB_ID:-none}" 2>/dev/null || true; } '
        "| sed -n 's/^ *Command=\\([^ ]*\\).*/\\1/p')",
        '[ -n "${SLURM_JOB_ID:-}" ] || script=${BASH_SOURCE[0]}',
        f'if [ -f "$script" ]; then cd "$(dirname "$script")/{relative}"; fi',
    ]
