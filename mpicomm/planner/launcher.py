"""Which program starts a job's ranks, the MPICH wheel's own ``mpiexec`` or ``srun``, chosen when it starts.

On two or more nodes, ``srun --mpi=pmi2`` hangs PyPI's MPICH wheel in ``MPI_Init`` whenever one of its
PMI-1 requests is longer than 1024 bytes: Slurm's pmi2 plugin reads a request in one 1024-byte read, and
MPICH 5.0 sends a fixed 4096-byte network address in segments of up to 1083 bytes. The wheel's own Hydra
``mpiexec``, run inside the allocation, serves PMI itself and asks Slurm only for one proxy per node.
Any other MPI (built against the site's Slurm) keeps ``srun``. The batch scripts decide in shell
(:func:`launch_lines`); ``python -m mpicomm plan`` and ``python -m mpicomm info`` report the same decision
(:func:`choose_launcher`). Nothing here imports ``mpi4py.MPI``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ArgumentError
from .layout import RankLayout

__all__ = [
    "LAUNCHERS",
    "LAUNCHER_ENV",
    "SRUN_MPI_ENV",
    "WHEEL_MARK",
    "LauncherChoice",
    "choose_launcher",
    "is_mpich_wheel",
    "job_launcher",
    "job_python",
    "launch_lines",
    "library_version",
]

LAUNCHER_ENV = "MPICOMM_LAUNCHER"
SRUN_MPI_ENV = "MPICOMM_SRUN_MPI"
LAUNCHERS = ("auto", "mpiexec", "srun")
#: What the MPICH wheel's ``MPI_Get_library_version`` says ("MPICH Custom Information: https://pypi.org/p/
#: mpich/5.0.2/"); no MPI built for a site says it.
WHEEL_MARK = "pypi.org/p/mpich"
_WHY_WHEEL = "the MPI library is PyPI's MPICH wheel, which srun --mpi=pmi2 can hang on 2+ nodes"
_WHY_OTHER = "the MPI library is not PyPI's MPICH wheel"


@dataclass(frozen=True)
class LauncherChoice:
    """The launcher a job uses and why.

    Attributes:
        launcher: ``"mpiexec"`` (the one beside the job's interpreter) or ``"srun"``.
        reason: why, e.g. ``"MPICOMM_LAUNCHER unset, so auto: the MPI library is ..."``.
        srun_mpi: the ``srun --mpi`` plugin (``MPICOMM_SRUN_MPI``, else the script's default); ``srun`` only.
    """

    launcher: str
    reason: str
    srun_mpi: str = "pmi2"

    def describe(self) -> str:
        """One line: the launch command's start and the reason.

        Example:
            >>> LauncherChoice("srun", "MPICOMM_LAUNCHER=srun", "pmix").describe()
            'srun --mpi=pmix (MPICOMM_LAUNCHER=srun)'
        """
        head = (
            "mpiexec beside the interpreter" if self.launcher == "mpiexec" else f"srun --mpi={self.srun_mpi}"
        )
        return f"{head} ({self.reason})"


def is_mpich_wheel(version: str) -> bool:
    r"""Whether an MPI library version string is the one of PyPI's MPICH wheel.

    Args:
        version: what ``python -m mpi4py --mpi-lib-version`` prints (``MPI.Get_library_version()``).

    Returns:
        True when it names the wheel's PyPI page.

    Example:
        >>> is_mpich_wheel("MPICH Version: 5.0.2\nMPICH Custom Information: https://pypi.org/p/mpich/5.0.2/")
        True
        >>> is_mpich_wheel("Open MPI v4.1.4, package: Debian OpenMPI")
        False
    """
    return WHEEL_MARK in version


def choose_launcher(
    version: str | None, environ: Mapping[str, str] | None = None, mpi: str = "pmi2"
) -> LauncherChoice:
    """The launcher a batch script picks, given the job's MPI library version string and environment.

    ``MPICOMM_LAUNCHER`` (``auto``, ``mpiexec`` or ``srun``; default ``auto``) decides; ``auto`` takes
    ``mpiexec`` for PyPI's MPICH wheel and ``srun --mpi=${MPICOMM_SRUN_MPI:-mpi}`` for any other MPI.

    Args:
        version: the MPI library version string, or None when it could not be read (then ``auto`` is srun,
            as in the scripts).
        environ: where ``MPICOMM_LAUNCHER`` and ``MPICOMM_SRUN_MPI`` are read; default ``os.environ``.
        mpi: the script's default ``srun --mpi`` plugin.

    Returns:
        The choice and its reason.

    Raises:
        ArgumentError: ``MPICOMM_LAUNCHER`` is not one of ``auto``, ``mpiexec``, ``srun``.

    Example:
        >>> wheel = "MPICH Custom Information: https://pypi.org/p/mpich/5.0.2/"
        >>> choose_launcher(wheel, {}).launcher
        'mpiexec'
        >>> choose_launcher("Open MPI v4.1.4", {"MPICOMM_SRUN_MPI": "pmix"}).describe()
        "srun --mpi=pmix (MPICOMM_LAUNCHER unset, so auto: the MPI library is not PyPI's MPICH wheel)"
        >>> choose_launcher(wheel, {"MPICOMM_LAUNCHER": "srun"}).describe()
        'srun --mpi=pmi2 (MPICOMM_LAUNCHER=srun)'
    """
    env = os.environ if environ is None else environ
    wanted = env.get(LAUNCHER_ENV, "")
    plugin = env.get(SRUN_MPI_ENV) or mpi
    if wanted not in ("", *LAUNCHERS):
        raise ArgumentError(f"{LAUNCHER_ENV} is {wanted!r}; expected one of {', '.join(LAUNCHERS)}")
    if wanted in ("mpiexec", "srun"):
        return LauncherChoice(wanted, f"{LAUNCHER_ENV}={wanted}", plugin)
    head = f"{LAUNCHER_ENV}={wanted}, so auto" if wanted else f"{LAUNCHER_ENV} unset, so auto"
    if version is None:
        return LauncherChoice("srun", f"{head}: the MPI library version could not be read", plugin)
    if is_mpich_wheel(version):
        return LauncherChoice("mpiexec", f"{head}: {_WHY_WHEEL}", plugin)
    return LauncherChoice("srun", f"{head}: {_WHY_OTHER}", plugin)


def library_version(python: str, timeout: float = 60.0) -> str | None:
    """The MPI library version string of ``python``'s mpi4py, read without starting MPI; None if unreadable.

    Runs ``python -m mpi4py --mpi-lib-version`` (which loads libmpi but never calls ``MPI_Init``) in a
    child process, so that this process never imports ``mpi4py.MPI``.

    Args:
        python: an interpreter, a path or a name on ``PATH``.
        timeout: seconds to wait for it.

    Returns:
        The version text, or None when the interpreter, mpi4py or the MPI library is missing.

    Example:
        >>> library_version("/nonexistent/python") is None
        True
    """
    exe = shutil.which(python)
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "-m", "mpi4py", "--mpi-lib-version"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


def job_launcher(environ: Mapping[str, str] | None = None, mpi: str = "pmi2") -> tuple[str, LauncherChoice]:
    """The launcher a batch script submitted from this environment would use, and the interpreter it asked.

    The interpreter is the scripts' (``job_python``); its MPI library version is read in a
    child process (``library_version``), so the answer holds for the nodes when they see the same
    interpreter.

    Args:
        environ: the submitting environment; default ``os.environ``.
        mpi: the script's default ``srun --mpi`` plugin.

    Returns:
        ``(interpreter, choice)``.

    Raises:
        ArgumentError: ``MPICOMM_LAUNCHER`` is not one of ``auto``, ``mpiexec``, ``srun``.

    Example:
        >>> python, choice = job_launcher({"MPICOMM_PYTHON": "/nonexistent/python"})
        >>> choice.describe()
        'srun --mpi=pmi2 (MPICOMM_LAUNCHER unset, so auto: the MPI library version could not be read)'
    """
    env = os.environ if environ is None else environ
    python = job_python(env)
    wanted = env.get(LAUNCHER_ENV, "")
    version = library_version(python) if wanted in ("", "auto") else None
    return python, choose_launcher(version, env, mpi)


def _hydra_args(layout: RankLayout) -> str:
    """``HYDRA_LAUNCHER_EXTRA_ARGS``: the CPUs (and GPUs) of a node's ranks for Hydra's one proxy per node.

    The ranks per node come from the job at run time (``SLURM_NTASKS_PER_NODE``), as ``srun`` would take
    them, so that a job submitted with another shape reaches the program's layout check.
    """
    shape = layout.shape
    per_node = f"${{SLURM_NTASKS_PER_NODE:-{shape.ntasks_per_node}}}"
    cpus = per_node if shape.cpus_per_task == 1 else f"$(({per_node} * {shape.cpus_per_task}))"
    args = f"--cpus-per-task={cpus}"
    if shape.gpus_per_node:
        args += f" --gpus-per-node={shape.gpus_per_node}"
    return args


def _python_lines() -> list[str]:
    """The script's interpreter, as ``job_python`` answers.

    ``MPICOMM_PYTHON``, else the active virtual environment's, else the job directory's ``.venv``
    (``make venv``), else ``python3``.
    """
    return [
        "# The interpreter: MPICOMM_PYTHON, else the active virtual environment's (sbatch passes",
        "# VIRTUAL_ENV on), else ./.venv's (make venv), else python3 on the PATH.",
        "py=${MPICOMM_PYTHON:-}",
        "venv=${VIRTUAL_ENV:-/nonexistent}",
        'if [ -z "$py" ] && [ -x "$venv/bin/python" ]; then py=$venv/bin/python; fi',
        'if [ -z "$py" ] && [ -x .venv/bin/python ]; then py=$PWD/.venv/bin/python; fi',
        "py=${py:-python3}",
    ]


def job_python(env: Mapping[str, str], cwd: str | None = None) -> str:
    """The interpreter a batch script started in ``cwd`` (default: here) with ``env`` runs.

    Example:
        >>> job_python({"MPICOMM_PYTHON": "/opt/py"}), job_python({}, "/nonexistent")
        ('/opt/py', 'python3')
    """
    if env.get("MPICOMM_PYTHON"):
        return env["MPICOMM_PYTHON"]
    venv = env.get("VIRTUAL_ENV")
    if venv and os.access(os.path.join(venv, "bin", "python"), os.X_OK):
        return os.path.join(venv, "bin", "python")
    local = os.path.join(cwd or os.getcwd(), ".venv", "bin", "python")
    return local if os.access(local, os.X_OK) else "python3"


def _gpu_lines(layout: RankLayout) -> list[str]:
    """``bind``: the command that gives each rank its own GPU, or nothing for a layout without GPUs.

    A rank uses GPU ``local_rank % gpus_per_node`` of its node (docs/jobs.rst): each rank's
    ``CUDA_VISIBLE_DEVICES`` becomes that one device (its entry in the list Slurm set, where it set
    one), so that CUDA, cupy and torch see it as device 0. The local rank is Hydra's
    ``MPI_LOCALRANKID`` (every rank of an mpiexec inherits one ``SLURM_LOCALID``), else srun's.
    """
    gpus = layout.shape.gpus_per_node
    if not gpus:
        return ["bind=()"]
    pick = (
        'l=${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}; IFS=, read -ra d <<< "${CUDA_VISIBLE_DEVICES:-}"; '
        f"if [ ${{#d[@]}} -gt 0 ]; then g=${{d[l % ${{#d[@]}}]}}; else g=$((l % {gpus})); fi; "
        'export CUDA_VISIBLE_DEVICES=$g; exec "$@"'
    )
    return [
        f"# One GPU per rank: GPU local_rank % {gpus} of its node, as the layout places it",
        f"bind=(bash -c '{pick}' bind)",
    ]


def launch_lines(layout: RankLayout, command: Sequence[str], mpi: str = "pmi2") -> list[str]:
    """The shell lines of a batch script that choose the launcher and run ``command`` on every rank.

    ``MPICOMM_LAUNCHER`` (default ``auto``) picks ``mpiexec`` or ``srun`` as :func:`choose_launcher` does,
    reading the version string of the job's interpreter's MPI library (``job_python``: ``MPICOMM_PYTHON``,
    the active virtual environment's, ``./.venv``'s, ``python3``); the script prints its
    choice and reason on stderr. Both forms keep the same promises: the ranks the job got
    (``$SLURM_NTASKS``), the layout's placement (``mpiexec -ppn 1`` deals ranks round robin for a cyclic
    layout, as ``--distribution=cyclic`` does), the CPUs per rank (Hydra's proxy step gets every CPU of its
    node's ranks, and the GPUs), rank-labelled output when ``SLURM_LABELIO`` is set (``[r]`` under
    mpiexec, ``r:`` under srun), and ``-m mpi4py`` so that one failing rank ends the job with a non-zero
    exit code.

    Args:
        layout: the rank layout.
        command: the arguments after ``-m mpi4py``.
        mpi: the default ``srun --mpi`` plugin, overridden by ``MPICOMM_SRUN_MPI`` at run time.

    Returns:
        The lines, without newlines.

    Example:
        >>> from mpicomm.planner import JobShape
        >>> lines = launch_lines(RankLayout.from_shape(JobShape(nodes=2, ntasks_per_node=4)), ["x.py"])
        >>> [line.split()[0] for line in lines if line.lstrip().startswith(("srun ", "HYDRA"))]
        ['HYDRA_LAUNCHER_EXTRA_ARGS="--cpus-per-task=${SLURM_NTASKS_PER_NODE:-4}"', 'srun']
    """
    shape = layout.shape
    run = " ".join(shlex.quote(a) for a in command)
    cyclic = " -ppn 1" if shape.distribution == "cyclic" else ""
    return [
        "# The launcher, chosen now: MPICOMM_LAUNCHER=auto (default), mpiexec or srun. auto takes the",
        "# mpiexec beside the interpreter when its MPI library is PyPI's MPICH wheel (srun's pmi2 plugin",
        "# cuts the wheel's PMI requests over 1024 bytes: on 2+ nodes the job would hang in MPI_Init),",
        "# else srun --mpi=$MPICOMM_SRUN_MPI. See docs/jobs.rst, 'Which launcher for which MPI'.",
        *_python_lines(),
        *_gpu_lines(layout),
        "launcher=${MPICOMM_LAUNCHER:-auto}",
        'why="MPICOMM_LAUNCHER=$launcher"',
        'if [ "$launcher" = auto ]; then',
        '  version=$("$py" -m mpi4py --mpi-lib-version 2>/dev/null || true)',
        "  case $version in",
        f'    *{WHEEL_MARK}*) launcher=mpiexec why="auto: {_WHY_WHEEL}" ;;',
        f'    *) launcher=srun why="auto: {_WHY_OTHER}" ;;',
        "  esac",
        "fi",
        'echo "mpicomm: launcher $launcher ($why)" >&2',
        "case $launcher in",
        "  mpiexec)",
        '    mpiexec=$(dirname "$(command -v "$py" || echo "$py")")/mpiexec',
        '    if [ ! -x "$mpiexec" ]; then',
        '      echo "mpicomm: no mpiexec beside $py (MPICOMM_LAUNCHER=mpiexec needs the MPICH wheel)" >&2',
        "      exit 2",
        "    fi",
        "    # Hydra labels each write, not each line: unbuffered Python output would split the labels",
        '    if [ -n "${SLURM_LABELIO:-}" ]; then unset PYTHONUNBUFFERED; fi',
        "    # Hydra asks srun for one proxy per node: that step gets the CPUs of all the node's ranks",
        f'    HYDRA_LAUNCHER_EXTRA_ARGS="{_hydra_args(layout)}" \\',
        f'      "$mpiexec" -n "${{SLURM_NTASKS:-{layout.world_size}}}"{cyclic}'
        " ${SLURM_LABELIO:+-prepend-rank} \\",
        f'      ${{bind[@]+"${{bind[@]}}"}} "$py" -m mpi4py {run}',
        "    ;;",
        "  srun)",
        f'    srun --mpi="${{{SRUN_MPI_ENV}:-{mpi}}}" --cpus-per-task={shape.cpus_per_task} '
        f'${{bind[@]+"${{bind[@]}}"}} "$py" -m mpi4py {run}',
        "    ;;",
        "  *)",
        f"    echo \"mpicomm: {LAUNCHER_ENV} is '$launcher'; expected auto, mpiexec or srun\" >&2",
        "    exit 2",
        "    ;;",
        "esac",
    ]
