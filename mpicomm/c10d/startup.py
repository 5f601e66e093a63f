"""torch.distributed's set-up names: ``init_process_group``, ``group.WORLD``, ``new_subgroups``, ...

So that a torch.distributed script runs with ``import mpicomm as dist``. MPI's launcher (``mpiexec``,
``srun``) has already done what torch's rendezvous does, so ``init_method``, ``store`` and the
environment variables torchrun sets are not needed; the ones given are checked against MPI.
"""

from __future__ import annotations

import datetime
import os
import warnings
from typing import Any

import numpy as np

from .. import _mpi
from ..core import failure, validation, watchdog
from ..core.groups import (
    DefaultGroupError,
    ProcessGroup,
    _check_ranks,
    _State,
    check_backend,
    destroy_process_group,
    init,
    new_group,
    new_node_group,
    register,
    resolve,
    timeout_seconds,
)
from ..errors import ArgumentError, ArgumentTypeError, GroupError
from .backend_names import Backend, is_available, is_mpi_available  # the last two: their old home

__all__ = [
    "GroupMember",
    "get_backend",
    "get_node_local_rank",
    "get_process_group_ranks",
    "group",
    "init_process_group",
    "get_pg_count",
    "is_available",
    "is_mpi_available",
    "is_torchelastic_launched",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group",
]

# Launchers' node-local rank variables, torchrun's first.
_LOCAL_RANK_VARS = (
    "LOCAL_RANK",
    "MPI_LOCALRANKID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PMI_LOCAL_RANK",
    "SLURM_LOCALID",
)


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: datetime.timedelta | float | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Start the default group on ``MPI.COMM_WORLD`` (torch.distributed's signature).

    Calling it is optional: collectives start the default group on first use, and a default group
    started that way (or by :func:`init`) is taken over; only a second ``init_process_group`` raises,
    as in torch. Every backend name torch knows (``"gloo"``, ``"nccl"``, ``"GLOO"``,
    ``"cpu:gloo,cuda:nccl"``, ...) is served by MPI, with one warning per process for a name other
    than ``mpi``; :func:`get_backend` answers the name given, lower-cased. The MPI launch decides
    ranks, as for torch's own MPI backend: a ``world_size`` or ``rank`` that disagrees with it
    warns and is ignored (the tutorial's ``init_process_group("mpi", rank=0, world_size=0)``).
    ``init_method``, ``pg_options`` and ``device_id`` are accepted and not needed (the MPI
    launcher did the rendezvous).

    Args:
        backend: ``None`` (``"mpi"``) or any of torch's backend names.
        init_method: Accepted (``"env://"``, ``"tcp://..."``, ``"file://..."``) and not used.
        timeout: A ``timedelta`` or seconds: bounds the default group's blocking barriers (they
            raise a RuntimeError naming the group when not every rank entered in time).
        world_size: -1, or the number of MPI processes (another value warns and is ignored).
        rank: -1, or this process's MPI rank (another value warns and is ignored).
        store: Must be None: there is no torch Store without torch.
        group_name: Accepted and not used.
        pg_options: Accepted and not used.
        device_id: Accepted and not used (see :func:`mpicomm.gpu.device.bind_device` for GPUs).

    Raises:
        DefaultGroupError: the default group is already initialised (as torch raises).
        ArgumentError: an unknown backend name.
        ArgumentTypeError: arguments of the wrong type.

    Warns:
        BackendWarning: the first backend name other than ``mpi`` in this process.
        UserWarning: ``rank`` or ``world_size`` disagrees with the MPI launch.

    Example:
        >>> import mpicomm as dist
        >>> if not dist.is_initialized():
        ...     dist.init_process_group(backend="mpi")
        >>> dist.get_backend()
        'mpi'
    """
    fn = "init_process_group"
    # MPI first, then the abort hook, then the checks: a mistake on one rank (a bad argument, a
    # second call) ends the whole job under plain ``python`` instead of leaving the others waiting.
    size, me = _mpi_world()
    if failure.wanted() and size > 1:
        failure.install_abort_hook()
    if _State.world is not None and _State.world is _Explicit.world:
        raise DefaultGroupError(
            f"{fn}: trying to initialize the default process group twice; expected one call"
        )
    label = check_backend(backend, fn)
    seconds = timeout_seconds(timeout, fn)
    for name, value in (("init_method", init_method), ("group_name", group_name)):
        if value is not None and not isinstance(value, str):
            raise ArgumentTypeError(f"{fn}: {name} is {value!r}; expected a str or None")
    if store is not None:
        raise ArgumentError(f"{fn}: store is {store!r}; expected None (MPI's launcher does the rendezvous)")
    _check_given(fn, "world_size", world_size, size, "the number of MPI processes")
    _check_given(fn, "rank", rank, me, "this process's MPI rank")
    _Explicit.world = world = init()
    world.backend = label
    world.timeout = seconds


class _Explicit:
    """The default group the last init_process_group started or took over (a second call raises)."""

    world: ProcessGroup | None = None


def _mpi_world() -> tuple[int, int]:
    _mpi.load()
    MPI = _mpi.MPI
    if not MPI.Is_initialized():
        MPI.Init_thread()
    return MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()


def _check_given(fn: str, name: str, value: object, actual: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{fn}: {name} is {value!r}; expected an int")
    if value not in (-1, actual):
        warnings.warn(
            f"{fn}: {name} is {value}, and the MPI launch gives {actual} ({what}); using {actual}, "
            "as torch's MPI backend does",
            stacklevel=3,
        )


def get_pg_count() -> int:
    """The number of process groups this rank holds now, the world's included (torch's ``get_pg_count``).

    torch counts every group made since ``init_process_group``; mpicomm counts the live ones
    (:func:`destroy_process_group` of a group takes it off), 0 before :func:`init` and after the
    world is destroyed.

    Example:
        >>> import mpicomm
        >>> before = mpicomm.get_pg_count()
        >>> g = mpicomm.new_group()
        >>> mpicomm.get_pg_count() - before
        1
        >>> mpicomm.destroy_process_group(g)
    """
    return len(_State.groups)


def is_torchelastic_launched() -> bool:
    """Whether torchrun (torch elastic) started this process: ``TORCHELASTIC_RUN_ID`` is set, as torch checks.

    mpicomm's ranks come from the MPI launcher; torchrun's workers are not MPI ranks, so under
    torchrun mpicomm sees each worker as a world of its own.

    Example:
        >>> import mpicomm
        >>> isinstance(mpicomm.is_torchelastic_launched(), bool)
        True
    """
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_backend(group: ProcessGroup | None = None) -> Backend:
    """The backend name ``group`` was made with, lower-cased, as torch answers it.

    Every group runs on MPI; the name is the one the program gave to :func:`init_process_group`
    or :func:`new_group` (``"mpi"`` when none was given), so that code which branches on it
    (``if dist.get_backend() == dist.Backend.NCCL``) takes the branch it took under torch.

    Args:
        group: The process group; ``None`` for the world.

    Returns:
        The name, a :class:`Backend` (a ``str``).

    Raises:
        ArgumentError: this rank is not a member of ``group`` (torch raises ValueError too).

    Example:
        >>> import mpicomm
        >>> mpicomm.get_backend()
        'mpi'
    """
    g = resolve(group, "get_backend")
    if not g.is_member:
        raise ArgumentError(
            f"get_backend: this rank is not a member of group {g.name}; expected a member "
            "(torch says: Invalid process group specified)"
        )
    return Backend(g.backend)


def get_process_group_ranks(group: ProcessGroup | None) -> list[int]:
    """The world ranks of ``group``'s members, in group-rank order.

    Args:
        group: The process group; ``None`` for the world.

    Returns:
        A new list of world ranks.

    Example:
        >>> import mpicomm
        >>> mpicomm.get_process_group_ranks(None) == list(range(mpicomm.get_world_size()))
        True
    """
    return list(resolve(group, "get_process_group_ranks").ranks)


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its node, from the launcher's environment (starts nothing).

    Reads ``LOCAL_RANK`` (torchrun), then the MPI launchers' variables (``MPI_LOCALRANKID`` of
    MPICH's hydra, ``OMPI_COMM_WORLD_LOCAL_RANK``, ``MV2_COMM_WORLD_LOCAL_RANK``,
    ``PMI_LOCAL_RANK``, ``SLURM_LOCALID``); torch reads only the first. For the node-local rank
    from MPI itself, use :func:`mpicomm.new_node_group` (a collective call).

    Args:
        fallback_rank: Returned when no variable is set.

    Returns:
        The node-local rank.

    Raises:
        GroupError: no variable is set and no ``fallback_rank`` given (a RuntimeError, as torch's).

    Example:
        >>> import mpicomm
        >>> mpicomm.get_node_local_rank(fallback_rank=0) >= 0
        True
    """
    for name in _LOCAL_RANK_VARS:
        text = os.environ.get(name)
        if text is not None and text.strip().isdigit():
            return int(text)
    if fallback_rank is not None:
        return int(fallback_rank)
    raise GroupError(
        f"get_node_local_rank: none of {', '.join(_LOCAL_RANK_VARS)} is in the environment; expected a "
        "launcher that sets one, or fallback_rank=..."
    )


class _NonGroupMember:
    """torch's ``GroupMember.NON_GROUP_MEMBER``: equal to every group this rank is not a member of."""

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, ProcessGroup) and not other.is_member)

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


class _WorldMeta(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:  # noqa: N802 - torch's name
        """The default group, or None before it is initialised (torch's ``group.WORLD``)."""
        return _State.world


class group(metaclass=_WorldMeta):  # noqa: N801 - torch's name
    """torch's ``group`` namespace: ``group.WORLD`` is the default group (None before init).

    Example:
        >>> import mpicomm
        >>> mpicomm.group.WORLD is mpicomm.init()
        True
    """


class GroupMember(metaclass=_WorldMeta):
    """torch's ``GroupMember``: ``WORLD`` and ``NON_GROUP_MEMBER``.

    mpicomm gives a non-member rank a :class:`ProcessGroup` on which every call does nothing, not a
    sentinel; ``NON_GROUP_MEMBER`` compares equal (``==``, not ``is``) to such a group.

    Example:
        >>> import mpicomm
        >>> mpicomm.GroupMember.WORLD == mpicomm.GroupMember.NON_GROUP_MEMBER
        False
    """

    NON_GROUP_MEMBER = _NonGroupMember()


def new_subgroups(
    group_size: int | None = None,
    group: ProcessGroup | None = None,
    timeout: datetime.timedelta | float | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[ProcessGroup]]:
    """Cut the world (or ``group``) into equal consecutive subgroups; every world rank calls it.

    Args:
        group_size: Ranks per subgroup; it must divide the group size. ``None`` takes the ranks per
            node (torch takes the GPUs per node); every node must have as many.
        group: The group to cut; ``None`` for the world.
        timeout: A ``timedelta`` or seconds: each subgroup's, as :func:`new_group` takes it.
        backend: ``None`` (the parent's) or any of torch's backend names (all run on MPI).
        pg_options: Accepted and not used.
        group_desc: Prefix of the subgroups' names.

    Returns:
        ``(this rank's subgroup, every subgroup)``; the first is None on a rank outside ``group``.

    Raises:
        ArgumentError: ``group_size`` not positive, larger than the group, or not a divisor of it.

    Example:
        >>> import mpicomm
        >>> mine, every = mpicomm.new_subgroups(1)
        >>> mine.size(), len(every) == mpicomm.get_world_size()
        (1, True)
    """
    fn = "new_subgroups"
    with validation.reporting(resolve(None, fn), fn, always=True):  # raised on every rank together
        parent = resolve(group, fn)
        label = check_backend(backend, fn, parent.backend)
        seconds = timeout_seconds(timeout, fn)
        if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)):
            raise ArgumentTypeError(f"{fn}: group_size is {group_size!r}; expected an int")
    # before any other collective (issue 34): a rank with group_size None would split by node alone
    validation.agree(
        resolve(None, fn), fn, {"group_size": group_size, "group": validation.fingerprint(parent.ranks)}
    )
    size = len(parent.ranks)
    if group_size is None:
        group_size = _ranks_per_node(fn)
    if not 0 < group_size <= size or size % group_size:
        raise ArgumentError(
            f"{fn}: group_size is {group_size}; expected a positive divisor of {size} (the group size)"
        )
    lists = [parent.ranks[i : i + group_size] for i in range(0, size, group_size)]
    return _make(lists, group_desc or "subgroup", label, seconds)


def _ranks_per_node(fn: str) -> int:
    world = resolve(None, fn)
    node = new_node_group(world)
    sizes = np.empty(world.size(), np.int64)  # int64 words, not a pickled allgather
    world.comm.Allgather(np.array([node.size()], np.int64), sizes)
    destroy_process_group(node)
    if len(set(sizes.tolist())) != 1:
        raise ArgumentError(
            f"{fn}: group_size is None and the nodes have {sorted(set(sizes.tolist()))} ranks; expected "
            "the same number on every node, or an explicit group_size"
        )
    return int(sizes[0])


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: list[list[int]],
    timeout: datetime.timedelta | float | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[ProcessGroup]]:
    """Make one subgroup per list of world ranks; every world rank calls it.

    Args:
        ranks_per_subgroup_list: Disjoint lists of world ranks.
        timeout: A ``timedelta`` or seconds: each subgroup's, as :func:`new_group` takes it.
        backend: ``None`` (the parent's) or any of torch's backend names (all run on MPI).
        pg_options: Accepted and not used.
        group_desc: Prefix of the subgroups' names.

    Returns:
        ``(this rank's subgroup or None, every subgroup)``.

    Raises:
        ArgumentError: an empty list, a bad rank, or a rank in two subgroups.

    Example:
        >>> import mpicomm
        >>> w = mpicomm.get_world_size()
        >>> mine, every = mpicomm.new_subgroups_by_enumeration([[r] for r in range(w)])
        >>> mine.ranks == [mpicomm.get_rank()]
        True
    """
    fn = "new_subgroups_by_enumeration"
    world = resolve(None, fn)
    with validation.reporting(world, fn, always=True):  # raised on every rank together
        label = check_backend(backend, fn, world.backend)
        seconds = timeout_seconds(timeout, fn)
        if not isinstance(ranks_per_subgroup_list, (list, tuple)) or not ranks_per_subgroup_list:
            raise ArgumentError(
                f"{fn}: ranks_per_subgroup_list is {ranks_per_subgroup_list!r}; "
                "expected a non-empty list of lists"
            )
        lists = [_check_ranks(ranks, world.size(), fn) for ranks in ranks_per_subgroup_list]
        _check_disjoint(lists, fn)
    validation.agree(world, fn, {"ranks_per_subgroup_list": validation.fingerprint(lists)})  # issue 34
    return _make(lists, group_desc or "subgroup", label, seconds)


def _check_disjoint(lists: list[list[int]], fn: str) -> None:
    seen: dict[int, int] = {}
    for i, ranks in enumerate(lists):
        for r in ranks:
            if r in seen:
                raise ArgumentError(
                    f"{fn}: rank {r} is in subgroup {seen[r]} and in subgroup {i}; "
                    "expected disjoint subgroups"
                )
            seen[r] = i


@watchdog.timed(watchdog.Site("split_group"), "parent_pg")
def split_group(
    parent_pg: ProcessGroup | None = None,
    split_ranks: list[list[int]] | None = None,
    timeout: datetime.timedelta | float | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: str | None = None,
) -> ProcessGroup | None:
    """Split a group into disjoint subgroups with one ``MPI_Comm_split``; every member of it calls it.

    torch's ``split_group`` (NCCL only there): where :func:`new_subgroups_by_enumeration` makes one
    communicator per subgroup, each a collective over the world, this is one collective over the
    parent group, however many subgroups. Ranks in no list get ``None``.

    Args:
        parent_pg: The group to split; ``None`` for the world.
        split_ranks: Disjoint, non-empty lists of *group* ranks of ``parent_pg`` (as in torch).
            Group ranks of a subgroup follow its sorted parent ranks.
        timeout: A ``timedelta`` or seconds: the subgroup's, as :func:`new_group` takes it.
        pg_options: Accepted for torch compatibility and not used.
        group_desc: The subgroup's name in messages and ``repr``.
        backend: ``None`` (the parent's) or any of torch's backend names (all run on MPI).

    Returns:
        This rank's subgroup, or ``None`` where this rank is in no list.

    Raises:
        ArgumentTypeError: ``split_ranks`` is not a list of lists of integers.
        ArgumentError: an empty list, a rank outside the parent group, a rank in two lists, or a
            caller that is not a member of ``parent_pg``.
        CrossRankMismatchError: ranks passed different ``split_ranks`` (checked with validation off too).

    Example:
        >>> import mpicomm
        >>> w = mpicomm.get_world_size()
        >>> halves = [list(range(w // 2)), list(range(w // 2, w))] if w > 1 else [[0]]
        >>> mine = mpicomm.split_group(split_ranks=halves)
        >>> mine.ranks == next(h for h in halves if mpicomm.get_rank() in h)
        True
    """
    fn = "split_group"
    if parent_pg is not None and type(parent_pg) is not ProcessGroup:
        raise ArgumentTypeError(
            f"{fn}: parent_pg is a {type(parent_pg).__qualname__}; expected a mpicomm.ProcessGroup or None"
        )
    parent = resolve(parent_pg, fn)
    if not parent.is_member:
        raise ArgumentError(
            f"{fn}: parent_pg is {parent.name}, which this rank is not a member of; expected a group "
            "that holds every rank calling split_group"
        )
    with validation.reporting(parent, fn, always=True):  # wrong on some ranks only: raised on every rank
        label = check_backend(backend, fn, parent.backend)
        seconds = timeout_seconds(timeout, fn)
        if group_desc is not None and not isinstance(group_desc, str):
            raise ArgumentTypeError(f"{fn}: group_desc is {group_desc!r}; expected a str or None")
        lists = _split_lists(split_ranks, parent, fn)
    # always (issue 34); the same subgroups in another order are the same split
    validation.agree(parent, fn, {"split_ranks": validation.fingerprint(sorted(lists))})
    me = parent.rank()
    mine = next((ranks for ranks in lists if me in ranks), None)
    # the colour is the subgroup's smallest rank, not its place in the list: ranks that list the same
    # subgroups in different orders still agree (torch's split depends on the subgroup only)
    comm = parent.comm.Split(_mpi.MPI.UNDEFINED if mine is None else mine[0], me)
    if mine is None:
        _State.counter += 1  # as register() does on the members: default names stay the same on all ranks
        return None
    return register(comm, [parent.ranks[r] for r in mine], group_desc, label, seconds)


def _split_lists(split_ranks: object, parent: ProcessGroup, fn: str) -> list[list[int]]:
    if not isinstance(split_ranks, (list, tuple)):
        raise ArgumentTypeError(
            f"{fn}: split_ranks is {split_ranks!r}; expected a non-empty list of lists of group ranks"
        )
    if not split_ranks:
        raise ArgumentError(
            f"{fn}: split_ranks is {split_ranks!r}; expected a non-empty list of lists of group ranks"
        )
    lists = []
    for i, ranks in enumerate(split_ranks):
        what = f"split_ranks[{i}]"
        checked = (
            [] if ranks is None else _check_ranks(ranks, parent.size(), fn, what, f"group {parent.name}")
        )
        if not checked:
            raise ArgumentError(f"{fn}: {what} is {ranks!r}; expected a non-empty list of ranks")
        lists.append(checked)
    _check_disjoint(lists, fn)
    return lists


def _make(
    lists: list[list[int]], prefix: str, backend: str, timeout: float | None
) -> tuple[ProcessGroup | None, list[ProcessGroup]]:
    every = [new_group(ranks, timeout, backend, group_desc=f"{prefix}{i}") for i, ranks in enumerate(lists)]
    mine = next((g for g in every if g.is_member), None)
    return mine, every
