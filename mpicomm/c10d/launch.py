"""torchrun's launch variables from an MPI launcher's, and the refusal of launches MPI did not make.

Programs written for ``torchrun`` read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``,
often before ``init_process_group`` (``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))``), and
torch's ``dist.get_node_local_rank()`` reads ``LOCAL_RANK``. MPI launchers set their own names before the
program starts; :func:`set_launch_variables` (run by ``import mpicomm.torch``) copies them to torchrun's,
reading the environment only: MPI is not started, and a variable the user set is never replaced.

===================  ================================  ===================================
launcher             rank, size                        local rank, local size
===================  ================================  ===================================
Open MPI ``mpirun``  OMPI_COMM_WORLD_RANK, _SIZE       OMPI_COMM_WORLD_LOCAL_RANK, _SIZE
MVAPICH              MV2_COMM_WORLD_RANK, _SIZE        MV2_COMM_WORLD_LOCAL_RANK, _SIZE
MPICH ``mpiexec``    PMI_RANK, PMI_SIZE                MPI_LOCALRANKID, MPI_LOCALNRANKS
Slurm ``srun``       SLURM_PROCID, SLURM_NTASKS        SLURM_LOCALID, SLURM_NTASKS_PER_NODE
                                                       (else SLURM_TASKS_PER_NODE's entry for
                                                       SLURM_NODEID)
===================  ================================  ===================================

The first launcher whose rank and size are both set wins; Slurm's per-task variables fill the local
rank and size only when they describe this same job (``SLURM_PROCID`` is the rank and ``SLURM_NTASKS``
the size): under ``mpiexec`` inside a batch job they describe Hydra's proxies instead.

:func:`check_launch` runs where MPI has started (the torch backend's rendezvous and creator): an
environment that says N ranks while MPI says otherwise (two processes started by hand with
``RANK``/``WORLD_SIZE``, ``srun`` under a PMI the MPI library does not speak, ``torchrun``) is refused on
every process, naming what was found and what to run instead; without the check each process would
silently be rank 0 of 1.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping

from ..errors import GroupError

__all__ = ["LaunchError", "check_launch", "launcher_variables", "set_launch_variables"]

#: torchrun's names, in the order :func:`launcher_variables` fills them.
TORCHRUN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

# (launcher, rank, size, local rank, local size) by launcher, most specific first: Slurm's come last, as
# an mpiexec inside an allocation leaves the allocation's SLURM_* in every rank's environment
_LAUNCHERS = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MVAPICH", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("MPICH Hydra (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("Slurm srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", ""),
)  # fmt: skip
_SLURM_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
# torchrun's own markers (torch.distributed.run sets them for every worker)
_TORCHRUN_MARKERS = ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "ROLE_RANK")


class LaunchError(GroupError):
    """The launch environment and MPI disagree on the job (a RuntimeError, as torch's own refusals)."""


class _State:
    # torchrun's names this process set, each with the launcher variable it came from
    origin: dict[str, str] = {}  # noqa: RUF012 - one per process, on purpose


def _int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "").strip() if name else ""
    return int(text) if text.isdigit() else None


def _slurm_local_size(env: Mapping[str, str]) -> tuple[int | None, str]:
    """This node's task count: SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE's (``2(x3),1``) entry."""
    fixed = _int(env, "SLURM_NTASKS_PER_NODE")
    if fixed is not None:
        return fixed, "SLURM_NTASKS_PER_NODE"
    node, spec = _int(env, "SLURM_NODEID"), env.get("SLURM_TASKS_PER_NODE", "")
    if node is None or not spec:
        return None, ""
    seen = 0
    for item in spec.split(","):
        m = _SLURM_TASKS.match(item.strip())
        if m is None:
            return None, ""
        seen += int(m.group(2) or 1)
        if node < seen:
            return int(m.group(1)), "SLURM_TASKS_PER_NODE"
    return None, ""


def launcher_variables(environ: Mapping[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """The torchrun variables as the launcher's environment gives them: ``{name: (value, source)}``.

    Reads only the environment (MPI is not started). Names that no launcher variable gives are left out;
    with no launcher at all the answer is empty.

    Args:
        environ: The environment to read; ``os.environ`` by default.

    Returns:
        For each of ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` found, its value and
        the launcher variable it came from.

    Example:
        >>> env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
        ...        "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
        >>> {k: v for k, (v, _) in launcher_variables(env).items()}
        {'RANK': '3', 'WORLD_SIZE': '4', 'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2'}
        >>> launcher_variables({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1",
        ...                     "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "4,2"})["LOCAL_WORLD_SIZE"]
        ('2', 'SLURM_TASKS_PER_NODE')
    """
    env = os.environ if environ is None else environ
    for _, rank_var, size_var, local_var, local_size_var in _LAUNCHERS:
        rank, size = _int(env, rank_var), _int(env, size_var)
        if rank is None or size is None:
            continue
        found = {"RANK": (str(rank), rank_var), "WORLD_SIZE": (str(size), size_var)}
        local, local_size = _int(env, local_var), _int(env, local_size_var)
        local_from, local_size_from = local_var, local_size_var
        slurm_same_job = _int(env, "SLURM_PROCID") == rank and _int(env, "SLURM_NTASKS") in (None, size)
        if slurm_same_job and local is None:
            local, local_from = _int(env, "SLURM_LOCALID"), "SLURM_LOCALID"
        if slurm_same_job and local_size is None:
            local_size, local_size_from = _slurm_local_size(env)
        if local is not None:
            found["LOCAL_RANK"] = (str(local), local_from)
        if local_size is not None:
            found["LOCAL_WORLD_SIZE"] = (str(local_size), local_size_from)
        return found
    return {}


def set_launch_variables(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set torchrun's variables the launcher implies and the environment lacks; returns those set.

    A variable already in the environment (the user's, or torchrun's) is kept as it is.

    Args:
        environ: The environment to fill; ``os.environ`` by default.

    Returns:
        The names set, with their values.

    Example:
        >>> env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "LOCAL_RANK": "7"}
        >>> set_launch_variables(env)
        {'RANK': '1', 'WORLD_SIZE': '2'}
        >>> env["LOCAL_RANK"]
        '7'
    """
    env = os.environ if environ is None else environ
    done: dict[str, str] = {}
    for name, (value, source) in launcher_variables(env).items():
        if name not in env:
            env[name] = value
            done[name] = value
            if environ is None:
                _State.origin[name] = source
    return done


def _said_size(env: Mapping[str, str]) -> tuple[int, str] | None:
    """The world size the environment announces, and where it says so (a user's WORLD_SIZE first)."""
    size = _int(env, "WORLD_SIZE")
    if size is not None:
        return size, _State.origin.get("WORLD_SIZE", "WORLD_SIZE")
    found = launcher_variables(env).get("WORLD_SIZE")
    return None if found is None else (int(found[0]), found[1])


def check_launch(mpi_rank: int, mpi_size: int, fn: str, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`LaunchError` when the environment announces a job other than the one MPI started.

    Args:
        mpi_rank: This process's rank in ``MPI.COMM_WORLD``.
        mpi_size: ``MPI.COMM_WORLD``'s size.
        fn: The public call to name in the message.
        environ: The environment to read; ``os.environ`` by default.

    Raises:
        LaunchError: ``WORLD_SIZE`` (or a launcher's size) is not MPI's, or ``RANK`` is not MPI's rank.

    Example:
        >>> check_launch(0, 1, "init_process_group", {"PMI_RANK": "0", "PMI_SIZE": "1"})
        >>> check_launch(0, 1, "init_process_group", {"RANK": "1", "WORLD_SIZE": "2"})
        Traceback (most recent call last):
        ...
        mpicomm.c10d.launch.LaunchError: init_process_group: the environment says 2 ranks (WORLD_SIZE=2), ...
    """
    env = os.environ if environ is None else environ
    said = _said_size(env)
    if said is None:
        return
    size, source = said
    rank = _int(env, "RANK")
    if size == mpi_size and rank in (None, mpi_rank):
        return
    what = f"{size} ranks ({source}={size})" if size != mpi_size else f"rank {rank} (RANK={rank})"
    mpi = f"MPI started {mpi_size} process{'es' if mpi_size != 1 else ''}"
    if size != mpi_size:
        mpi += f" (this one rank {mpi_rank})"
    else:
        mpi = f"MPI numbers this process {mpi_rank} of {mpi_size}"
    raise LaunchError(f"{fn}: the environment says {what}, but {mpi}; {_advice(env, size, source)}")


def _advice(env: Mapping[str, str], size: int, source: str) -> str:
    """What to run instead, for the launch the environment shows."""
    run = f"mpiexec -n {size} python prog.py"
    markers = [m for m in _TORCHRUN_MARKERS if m in env]
    if markers:
        return (
            f"torchrun's environment was found ({', '.join(markers)}, MASTER_ADDR="
            f"{env.get('MASTER_ADDR', '?')}): mpicomm's backend runs over MPI, which torchrun does not "
            f"start; run `{run}` (or `srun -n {size} python prog.py`) instead of torchrun"
        )
    if source.startswith("SLURM_"):
        return (
            "srun started the tasks, but the MPI library did not join srun's job (it does not speak the PMI "
            f"srun offers): run `srun --mpi=pmi2 ...` for an MPI built for Slurm, or the MPI's own `{run}` "
            "inside the allocation"
        )
    if source in ("WORLD_SIZE", "RANK"):
        return (
            f"the processes were started without an MPI launcher: start them with `{run}` (or srun), and "
            "leave RANK and WORLD_SIZE to the launcher"
        )
    return f"the MPI library is not the one {source}'s launcher serves: start the job with that MPI's `{run}`"
