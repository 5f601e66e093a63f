"""Check at run time that the job really has the layout it was planned for."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import ArgumentError, ArgumentTypeError, MpicommError
from .hostlist import expand_hostlist, expand_tasks_per_node
from .layout import RankLayout, RankPlacement

__all__ = ["LayoutMismatchError", "check_environment", "job_rank_and_size"]

_FN = "check_environment"
# Launcher variables, most specific first. They win over SLURM_PROCID: under mpiexec inside a batch job
# every rank sees the launcher proxy's SLURM_PROCID (0), not its own rank.
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


class LayoutMismatchError(MpicommError, RuntimeError):
    """The running job does not match the layout it was planned for (rank count, node, local rank)."""


def _int_var(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise LayoutMismatchError(
            f"{_FN}: the environment variable {name} is {text!r}; expected an integer"
        ) from None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[int | None, str]:
    for name in names:
        value = _int_var(env, name)
        if value is not None:
            return value, name
    return None, ""


def job_rank_and_size(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """This process's rank and the job's size from the launcher's variables, without starting MPI.

    Launcher variables (Open MPI, PMIx, PMI) win over Slurm's; with none at all it is ``(0, 1)``.

    Example:
        >>> job_rank_and_size({"PMI_RANK": "3", "PMI_SIZE": "8", "SLURM_PROCID": "0"})
        (3, 8)
    """
    env = os.environ if environ is None else environ
    rank, _ = _first(env, _RANK_VARS)
    size, _ = _first(env, _SIZE_VARS)
    return (0 if rank is None else rank), (1 if size is None else size)


def _check_args(layout: object, rank: object, world_size: object) -> None:
    if not isinstance(layout, RankLayout):
        raise ArgumentTypeError(f"{_FN}: layout is {type(layout).__name__}; expected a RankLayout")
    for arg, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ArgumentTypeError(f"{_FN}: {arg} is {type(value).__name__}; expected an int or None")
    if rank is not None and rank < 0:  # type: ignore[operator]
        raise ArgumentError(f"{_FN}: rank is {rank}; expected >= 0")


def check_environment(
    layout: RankLayout,
    environ: Mapping[str, str] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> RankPlacement:
    """Check that this process runs where ``layout`` put it, and return its placement.

    The rank and world size come from the arguments when given (e.g. from MPI), else from the launcher's
    variables (``OMPI_COMM_WORLD_RANK``/``_SIZE``, ``PMIX_RANK``, ``PMI_RANK``/``PMI_SIZE``), else from
    Slurm's (``SLURM_PROCID``, ``SLURM_NTASKS``); without any, a world of one. Slurm's per-task variables
    (``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_TASKS_PER_NODE``, ``SLURM_NTASKS_PER_NODE``) are checked
    only when they describe this MPI job, that is when ``SLURM_PROCID`` is this rank and ``SLURM_NTASKS``
    (if set) is the world size; under ``mpiexec`` inside a batch job they describe the launcher's proxies
    instead.
    ``SLURM_NODELIST`` must list ``layout.shape.nodes`` nodes; node names (``SLURM_NODELIST``,
    ``SLURMD_NODENAME``) are compared only when the layout was given names.

    Args:
        layout: the planned layout.
        environ: the environment to read; default ``os.environ``.
        rank: this process's rank, overriding the environment.
        world_size: the number of ranks, overriding the environment.

    Returns:
        This rank's :class:`RankPlacement`.

    Raises:
        ArgumentTypeError: ``layout`` is not a RankLayout, or rank/world_size is not an int.
        LayoutMismatchError: the job differs from the layout, e.g. ``"planned for 8 ranks, running on 6"``.

    Example:
        >>> from mpicomm.planner import JobShape
        >>> layout = RankLayout.from_shape(JobShape(nodes=2, ntasks_per_node=4), "n[1-2]")
        >>> env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        ...        "SLURM_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n2", "SLURM_TASKS_PER_NODE": "4(x2)"}
        >>> check_environment(layout, env).local_rank
        1
        >>> check_environment(layout, {"PMI_RANK": "1", "PMI_SIZE": "6"})
        Traceback (most recent call last):
        ...
        mpicomm.planner.environment.LayoutMismatchError: check_environment: planned for 8 ranks, ...
    """
    _check_args(layout, rank, world_size)
    env: Mapping[str, str] = os.environ if environ is None else environ
    if rank is not None:
        my_rank, rank_from = rank, "the rank argument"
    else:
        found, name = _first(env, _RANK_VARS)
        my_rank, rank_from = (0, "no launcher variable") if found is None else (found, name)
    if world_size is not None:
        size, size_from = world_size, "the world_size argument"
    else:
        found, name = _first(env, _SIZE_VARS)
        size, size_from = (1, "no launcher variable") if found is None else (found, name)
    planned = layout.world_size
    if size != planned:
        raise LayoutMismatchError(
            f"{_FN}: planned for {planned} ranks, running on {size} (from {size_from}); start the job with "
            f"{layout.shape.nodes} node(s) x {layout.shape.ntasks_per_node} task(s), or plan again for {size}"
        )
    if not 0 <= my_rank < size:
        raise LayoutMismatchError(f"{_FN}: rank is {my_rank} (from {rank_from}); expected 0 <= rank < {size}")
    placement = layout.ranks[my_rank]
    _check_nodes(layout, placement, env)
    _check_local(layout, placement, env, size)
    return placement


def _mismatch(
    placement: RankPlacement, what: str, got: object, want: object, source: str
) -> LayoutMismatchError:
    return LayoutMismatchError(
        f"{_FN}: rank {placement.rank} has {what} {got} (from {source}); the layout expects {want}"
    )


def _check_nodes(layout: RankLayout, placement: RankPlacement, env: Mapping[str, str]) -> None:
    nodelist = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if nodelist:
        nodes = expand_hostlist(nodelist)
        if len(nodes) != layout.shape.nodes:
            raise LayoutMismatchError(
                f"{_FN}: planned for {layout.shape.nodes} node(s), running on {len(nodes)} ({nodelist})"
            )
        if layout.named and nodes != list(layout.node_names):
            raise LayoutMismatchError(
                f"{_FN}: the job's nodes are {nodes} (SLURM_NODELIST); "
                f"the layout expects {list(layout.node_names)}"
            )
    local_size, local_size_from = _first(env, _LOCAL_SIZE_VARS)
    if layout.shape.nodes > 1 and local_size is not None and local_size == layout.world_size:
        raise one_machine(layout, f"all {local_size} ranks share this machine, from {local_size_from}")
    here = env.get("SLURMD_NODENAME")
    if here and layout.named and here != placement.node_name:
        raise _mismatch(placement, "the node", repr(here), repr(placement.node_name), "SLURMD_NODENAME")


def one_machine(layout: RankLayout, why: str) -> LayoutMismatchError:
    """The error for a multi-node plan started on one machine (``mpiexec -n 8`` on a laptop).

    Example:
        >>> from mpicomm.planner import JobShape
        >>> layout = RankLayout.from_shape(JobShape(nodes=2, ntasks_per_node=4))
        >>> print(one_machine(layout, "all 8 ranks share this machine"))  # doctest: +NORMALIZE_WHITESPACE
        check_environment: planned for 2 nodes, running on 1 (all 8 ranks share this machine); start the
        job on 2 nodes (sbatch the plan's script, or srun -N 2 --ntasks-per-node 4), or plan again for
        one node (--nodes 1 --ntasks-per-node 8)
    """
    nodes, per_node = layout.shape.nodes, layout.shape.ntasks_per_node
    return LayoutMismatchError(
        f"{_FN}: planned for {nodes} nodes, running on 1 ({why}); start the job on {nodes} nodes (sbatch "
        f"the plan's script, or srun -N {nodes} --ntasks-per-node {per_node}), or plan again for one node "
        f"(--nodes 1 --ntasks-per-node {layout.world_size})"
    )


def _check_local(layout: RankLayout, placement: RankPlacement, env: Mapping[str, str], size: int) -> None:
    procid, ntasks = _int_var(env, "SLURM_PROCID"), _int_var(env, "SLURM_NTASKS")
    slurm_is_this_job = procid == placement.rank and ntasks in (None, size)
    if slurm_is_this_job:
        # srun numbers a node's tasks in the order of the distribution: it must match exactly
        local = _int_var(env, "SLURM_LOCALID")
        if local is not None and local != placement.local_rank:
            raise _mismatch(placement, "local rank", local, placement.local_rank, "SLURM_LOCALID")
        node = _int_var(env, "SLURM_NODEID")
        if node is not None and node != placement.node_index:
            raise _mismatch(placement, "node index", node, placement.node_index, "SLURM_NODEID")
        per_node = env.get("SLURM_TASKS_PER_NODE")
        if per_node and expand_tasks_per_node(per_node) != layout.tasks_per_node:
            raise LayoutMismatchError(
                f"{_FN}: the job runs {per_node} tasks per node (SLURM_TASKS_PER_NODE); the layout expects "
                f"{layout.shape.ntasks_per_node} on each of {layout.shape.nodes} node(s)"
            )
        fixed = _int_var(env, "SLURM_NTASKS_PER_NODE")
        if fixed is not None and fixed != layout.shape.ntasks_per_node:
            raise _mismatch(
                placement, "tasks per node", fixed, layout.shape.ntasks_per_node, "SLURM_NTASKS_PER_NODE"
            )
    # mpiexec/mpirun number a node's processes in their own order (Open MPI 5 by the cores it maps to,
    # e.g. 0, 2, 1 for world ranks 0, 1, 2): only the range can be checked
    local, local_from = _first(env, _LOCAL_VARS)
    here = layout.tasks_per_node[placement.node_index]
    if local is not None and not 0 <= local < here:
        raise _mismatch(placement, "local rank", local, f"one of 0..{here - 1}", local_from)
