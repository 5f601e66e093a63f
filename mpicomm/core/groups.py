"""Process groups: the world group, sub-groups and node-local groups, each on its own MPI communicator.

mpicomm never sends on a communicator it was handed: :func:`init` duplicates it, and every group made
from that is a new communicator too, so mpicomm's messages can never match the user's own.
"""

from __future__ import annotations

import datetime
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import _mpi
from ..errors import ArgumentError, ArgumentTypeError, BackendArgumentError, GroupError
from . import cmpi, failure, validation, watchdog
from .labels import backend_name
from .late import LateMethods

__all__ = [
    "DefaultGroupError",
    "DestroyedGroupError",
    "ProcessGroup",
    "destroy_process_group",
    "get_global_rank",
    "get_group_rank",
    "get_rank",
    "get_world_size",
    "init",
    "is_initialized",
    "new_group",
    "new_node_group",
]

#: How the watchdog names init's collective (Comm.Dup on the world): the default bound applies.
_INIT = watchdog.Site("init", lambda _: None)


class DefaultGroupError(GroupError, ValueError):
    """The default (world) group is not in a state that allows the call.

    Raised when a call needs the default group after :func:`destroy_process_group` and before a new
    :func:`init_process_group`, or by a second :func:`init_process_group`. It is a ``ValueError``, as
    torch.distributed's error is, and a :class:`GroupError`.
    """


class DestroyedGroupError(DefaultGroupError, AssertionError):
    """:func:`~mpicomm.destroy_process_group` of the default group when there is none (a second call).

    torch asserts (``AssertionError: Process group cannot be None``); this is that type too, and a
    :class:`~mpicomm.DefaultGroupError` (so a ``ValueError`` and a :class:`~mpicomm.GroupError`).
    """


class ProcessGroup(LateMethods):  # torch's methods attach on first use (core.late)
    """A set of ranks with their own MPI communicator; the ``group=`` argument of every call.

    Made by :func:`init` (the world group), :func:`new_group` and :func:`new_node_group`; never built by
    hand. A rank that is not a member holds a group object too (as in torch.distributed) whose
    :attr:`comm` is ``None``: calls on it do nothing and return ``None``.

    As in torch.distributed, :meth:`rank` and :meth:`size` are methods.

    Attributes:
        comm: The group's private ``mpi4py.MPI.Intracomm``, or ``None`` on a non-member rank.
        ranks: The world ranks of the members, in group-rank order.
        backend: The backend name the group was made with, lower-cased (``"mpi"``, ``"gloo"``, ...);
            every one runs on MPI.
        timeout: The ``timeout`` the group was made with, in seconds, or None: it bounds the group's
            blocking :func:`~mpicomm.barrier` (see docs/torch.rst for the other calls).
    """

    __slots__ = ("_index", "_rank", "_size", "backend", "comm", "internal", "name", "ranks", "timeout")

    def __init__(self, comm: Any, ranks: list[int], name: str, backend: str = "mpi") -> None:
        self.comm = comm
        self.backend = backend
        self.timeout: float | None = None
        # a second private communicator for mpicomm's own point-to-point traffic inside collectives
        self.internal: Any = None if comm is None else comm.Dup()
        self.ranks = ranks
        self.name = name
        self._rank = -1 if comm is None else int(comm.Get_rank())
        self._size = -1 if comm is None else int(comm.Get_size())
        self._index = {g: i for i, g in enumerate(ranks)}

    def rank(self) -> int:
        """This process's rank in the group, -1 on a non-member (torch's ``ProcessGroup.rank()``)."""
        return self._rank

    def size(self) -> int:
        """The number of ranks in the group, -1 on a non-member (torch's ``ProcessGroup.size()``)."""
        return self._size

    @property
    def is_member(self) -> bool:
        """Whether this process belongs to the group."""
        return self.comm is not None

    def group_rank(self, global_rank: int) -> int:
        """The group rank of world rank ``global_rank``.

        Raises:
            ArgumentError: ``global_rank`` is not a member.
        """
        try:
            return self._index[global_rank]
        except (KeyError, TypeError):
            raise ArgumentError(
                f"get_group_rank: global_rank is {global_rank!r}, which is not part of group {self.name}; "
                f"expected one of its members {_short(self.ranks)}"
            ) from None

    def __repr__(self) -> str:
        who = f"rank {self._rank} of {self._size}" if self.is_member else "not a member"
        return f"<ProcessGroup {self.name}: {who}, world ranks {_short(self.ranks)}>"


class _StateType:
    """The world group and every group made since: one instance, read by every call (3.11 specialises it)."""

    __slots__ = ("counter", "destroyed", "groups", "world")

    def __init__(self) -> None:
        self.world: ProcessGroup | None = None
        self.groups: list[ProcessGroup] = []
        self.counter = 0
        self.destroyed = False  # destroy_process_group() of the world: calls raise until the next init


_State = _StateType()


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{ranks[0]}, {ranks[1]}, ..., {ranks[-1]}] ({len(ranks)})"


def init(comm: Any = None, *, abort_on_exception: bool | None = None) -> ProcessGroup:
    """Start MPI if needed and make the world group; later calls return the same group.

    Collectives call this on first use, so calling it is optional; call it to pick a communicator
    other than ``MPI.COMM_WORLD`` or to control the abort-on-exception hook.

    Args:
        comm: The mpi4py intracommunicator the world group spans; ``None`` for ``MPI.COMM_WORLD``.
            mpicomm works on a duplicate of it.
        abort_on_exception: With more than one rank, install a ``sys.excepthook`` that prints the
            failing rank's traceback and aborts the whole job, so that one rank's uncaught exception
            never leaves the others hanging. ``None`` reads ``MPICOMM_ABORT_ON_EXCEPTION``
            (default on; ``0`` turns it off).

    Returns:
        The world group.

    Raises:
        ArgumentTypeError: ``comm`` is not an mpi4py intracommunicator.
        GroupError: already initialised on another communicator.

    Example:
        >>> import mpicomm
        >>> world = mpicomm.init()
        >>> world.size() == mpicomm.get_world_size()
        True
    """
    if _State.world is not None:
        if comm is not None and not isinstance(comm, _mpi.MPI.Intracomm):
            raise ArgumentTypeError(
                f"init: comm is a {type(comm).__qualname__}; expected an mpi4py.MPI.Intracomm"
            )
        if comm is not None and not _same_group(comm, _State.world.comm):
            raise GroupError(
                "init: mpicomm is already initialised on another communicator; "
                "call destroy_process_group() first"
            )
        return _State.world
    _mpi.load()
    MPI = _mpi.MPI
    if not MPI.Is_initialized():
        MPI.Init_thread(_mpi.required())  # the level mpicomm chose (mpicomm._mpi)
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm):
        raise ArgumentTypeError(
            f"init: comm is a {type(comm).__qualname__}; expected an mpi4py.MPI.Intracomm"
        )
    with watchdog.timing(_INIT):  # a second init (after destroy) is timed
        dup = comm.Dup()
    cmpi.bind()
    world = ProcessGroup(dup, list(range(dup.Get_size())), "world")
    _State.world = world
    _State.groups = [world]
    _State.destroyed = False

    validation.read_environment()
    if failure.wanted(abort_on_exception) and world.size() > 1:
        failure.install_abort_hook()
    watchdog.start(_State, ProcessGroup)
    return world


def _same_group(comm: Any, ours: Any) -> bool:
    MPI = _mpi.MPI
    return ours is not None and MPI.Comm.Compare(comm, ours) in (MPI.IDENT, MPI.CONGRUENT)


def is_initialized() -> bool:
    """Whether :func:`init` has run (explicitly or through a first collective) and not been undone."""
    return _State.world is not None


def world(fn: str = "new_group") -> ProcessGroup:
    """The world group, initialising on first use.

    Raises:
        DefaultGroupError: the world group was destroyed and not initialised again.
    """
    return _State.world or _first_use(fn)


def _first_use(fn: str) -> ProcessGroup:
    if _State.destroyed:
        raise DefaultGroupError(
            f"{fn}: the default process group was destroyed by destroy_process_group(); expected "
            "init_process_group() (or mpicomm.init()) before the next call, as torch.distributed does"
        )
    return init()


def resolve(group: ProcessGroup | None, fn: str) -> ProcessGroup:
    """The group a call runs on: ``group`` itself, or the world group for ``None``.

    Raises:
        ArgumentTypeError: ``group`` is not a ProcessGroup.
        GroupError: the group was destroyed.
    """
    if group is None:
        return _State.world or _first_use(fn)
    if type(group) is not ProcessGroup:
        raise ArgumentTypeError(
            f"{fn}: group is a {type(group).__qualname__}; expected a mpicomm.ProcessGroup or None"
        )
    if group.comm is None and group._size == -2:
        raise GroupError(f"{fn}: group {group.name} was destroyed; make a new one with new_group()")
    return group


def warn_non_member(group: ProcessGroup, fn: str) -> None:
    """Warn, as torch.distributed does, that a call on a group this rank is not in does nothing."""
    warnings.warn(
        f"{fn}: this rank is not a member of group {group.name}; the call does nothing and returns None",
        stacklevel=3,
    )


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (the world group by default), -1 if it is not a member.

    Example:
        >>> import mpicomm
        >>> 0 <= mpicomm.get_rank() < mpicomm.get_world_size()
        True
    """
    return resolve(group, "get_rank").rank()


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (the world group by default), -1 if this rank is not a member.

    Example:
        >>> import mpicomm
        >>> mpicomm.get_world_size() >= 1
        True
    """
    return resolve(group, "get_world_size").size()


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """Translate a world rank into its rank in ``group``.

    Raises:
        ArgumentError: ``global_rank`` is not a member of ``group``.

    Example:
        >>> import mpicomm
        >>> mpicomm.get_group_rank(mpicomm.init(), 0)
        0
    """
    return resolve(group, "get_group_rank").group_rank(global_rank)


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """Translate a rank in ``group`` into its world rank.

    Raises:
        ArgumentTypeError: ``group_rank`` is not an integer.
        ArgumentError: ``group_rank`` is out of range.

    Example:
        >>> import mpicomm
        >>> mpicomm.get_global_rank(mpicomm.init(), 0)
        0
    """
    g = resolve(group, "get_global_rank")
    if isinstance(group_rank, bool) or not isinstance(group_rank, (int, np.integer)):
        raise ArgumentTypeError(f"get_global_rank: group_rank is {group_rank!r}; expected an int")
    if not 0 <= group_rank < len(g.ranks):
        raise ArgumentError(
            f"get_global_rank: group_rank is {group_rank!r}; expected 0 <= group_rank < {len(g.ranks)}"
        )
    return g.ranks[group_rank]


@watchdog.timed(watchdog.Site("new_group"), None)
def new_group(
    ranks: Iterable[int] | None = None,
    timeout: datetime.timedelta | float | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
) -> ProcessGroup:
    """Make a group of the given world ranks (torch.distributed's signature).

    Every rank of the world calls it, members or not, unless ``use_local_synchronization`` is set:
    then only the members call it (``MPI_Comm_create_group``), as torch allows. Group ranks follow
    the sorted world ranks, as in torch.distributed. Non-members get a group object that makes every
    call a no-op returning ``None`` (torch returns ``GroupMember.NON_GROUP_MEMBER``, which compares
    equal to it).

    Args:
        ranks: World ranks of the members; ``None`` for all of them.
        timeout: A ``timedelta`` or seconds: bounds the group's blocking barriers, which raise
            :class:`~mpicomm.CommunicationError` (a RuntimeError) when not every rank entered in
            time; None: no bound.
        backend: ``None`` (the default group's) or any of torch's backend names; every one runs
            on MPI and is kept for :func:`~mpicomm.get_backend`.
        pg_options: Accepted for torch compatibility and not used.
        use_local_synchronization: Only the members call this function.
        group_desc: A name for the group in messages and ``repr`` (default ``groupN``).
        device_id: Accepted for torch compatibility and not used.

    Returns:
        The new group.

    Raises:
        ArgumentTypeError: ``ranks`` holds something other than integers, or a bad ``timeout`` type.
        ArgumentError: a rank is out of range or listed twice, or an unknown backend name.
        CrossRankMismatchError: ranks passed different member lists (checked with validation off too).

    Example:
        >>> import mpicomm
        >>> evens = mpicomm.new_group(range(0, mpicomm.get_world_size(), 2))
        >>> evens.is_member == (mpicomm.get_rank() % 2 == 0)
        True
    """
    fn = "new_group"
    w = world(fn)
    # wrong on some ranks only: raised on every rank together; not with use_local_synchronization,
    # where only the members call (an exchange over the world would wait for the others forever)
    everyone = None if use_local_synchronization else w
    with validation.reporting(everyone, fn, always=True):
        label = check_backend(backend, fn, w.backend)
        seconds = timeout_seconds(timeout, fn)
        if group_desc is not None and not isinstance(group_desc, str):
            raise ArgumentTypeError(f"{fn}: group_desc is {group_desc!r}; expected a str or None")
        members = _check_ranks(ranks, w.size(), fn)
    if everyone is not None:  # always (issue 34): ranks that disagree would get groups of other ranks
        validation.agree(everyone, fn, {"ranks": validation.fingerprint(members)})
    me = w.rank()
    if use_local_synchronization:
        comm = w.comm.Create_group(w.comm.group.Incl(members)) if me in members else _mpi.MPI.COMM_NULL
    else:
        comm = w.comm.Split(0 if me in members else _mpi.MPI.UNDEFINED, me)
    return register(comm, members, group_desc, label, seconds)


def register(
    comm: Any, members: list[int], name: str | None, backend: str, timeout: float | None
) -> ProcessGroup:
    """The group on a communicator just made (``COMM_NULL``: this rank's non-member group), kept for destroy.

    Args:
        comm: The new communicator, or ``MPI.COMM_NULL`` on a rank outside the group.
        members: The world ranks of the members, in group-rank order.
        name: The group's name; None for the next ``groupN``.
        backend: The backend name the group keeps.
        timeout: The group's timeout in seconds, or None.

    Returns:
        The group.
    """
    _State.counter += 1
    group = ProcessGroup(
        None if comm == _mpi.MPI.COMM_NULL else comm, members, name or f"group{_State.counter}", backend
    )
    group.timeout = timeout
    _State.groups.append(group)
    return group


def check_backend(backend: object, fn: str, default: str = "mpi") -> str:
    """The lower-case name a group keeps for torch's ``backend`` argument (``default`` for None).

    Every name runs on MPI (:func:`mpicomm.core.labels.backend_name` checks it).

    Raises:
        ArgumentTypeError: not a string.
        ArgumentError: an unknown name.
    """
    return backend_name(backend, fn, default)


def timeout_seconds(timeout: object, fn: str) -> float | None:
    """Seconds in torch's ``timeout`` argument (a ``timedelta`` or a number), or None.

    Raises:
        ArgumentTypeError: not a timedelta or a number.
        ArgumentError: negative.
    """
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float, np.integer, np.floating)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise ArgumentTypeError(
            f"{fn}: timeout is {timeout!r}; expected a datetime.timedelta, seconds or None"
        )
    if not seconds >= 0:
        raise ArgumentError(f"{fn}: timeout is {timeout!r}; expected a duration >= 0")
    return seconds


def _check_ranks(
    ranks: Iterable[int] | None, size: int, fn: str, name: str = "ranks", of: str = "world"
) -> list[int]:
    """``ranks`` sorted, checked: integers, distinct, ``0 <= rank < size`` (ranks of the ``of`` group)."""
    if ranks is None:
        return list(range(size))
    try:
        raw = list(ranks)  # once: ranks may be a generator
        members = sorted(
            int(r) for r in raw if not isinstance(r, bool) and (isinstance(r, int) or hasattr(r, "__index__"))
        )
    except TypeError:
        raise ArgumentTypeError(
            f"{fn}: {name} is a {type(ranks).__qualname__}; expected a list of integers"
        ) from None
    if len(members) != len(raw):
        raise ArgumentTypeError(f"{fn}: {name} is {raw!r}; expected a list of integers")
    if len(set(members)) != len(members):
        raise ArgumentError(f"{fn}: {name} {raw!r} lists a rank twice; expected distinct ranks")
    bad = [r for r in members if not 0 <= r < size]
    if bad:
        raise ArgumentError(
            f"{fn}: {name} has {bad[0]}; expected {of} ranks 0 <= rank < {size} (the {of} size)"
        )
    return members


@watchdog.timed(watchdog.Site("new_node_group"))
def new_node_group(group: ProcessGroup | None = None) -> ProcessGroup:
    """Make the group of the ranks of ``group`` that share this node's memory (MPI ``COMM_TYPE_SHARED``).

    Every rank is a member of its own node's group; its rank there is the node-local rank.

    Returns:
        This node's group.

    Example:
        >>> import mpicomm
        >>> node = mpicomm.new_node_group()
        >>> 0 <= node.rank() < node.size()
        True
    """
    g = resolve(group, "new_node_group")
    if g.comm is None:
        raise GroupError(f"new_node_group: this rank is not a member of group {g.name}")
    comm = g.comm.Split_type(_mpi.MPI.COMM_TYPE_SHARED, key=g.rank())
    ranks = np.empty(comm.Get_size(), np.int64)  # int64 words, not a pickled allgather (see core.control)
    comm.Allgather(np.array([g.rank()], np.int64), ranks)
    members = [g.ranks[r] for r in ranks.tolist()]
    _State.counter += 1
    node = ProcessGroup(comm, members, f"node{_State.counter}", g.backend)
    _State.groups.append(node)
    return node


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Free a group's communicator; with ``None`` (or the world group), free every group.

    The group's members must call it together. Using a destroyed group raises :class:`GroupError`.
    After the world is destroyed, every call that needs it raises :class:`DefaultGroupError` (as in
    torch.distributed) until :func:`init_process_group` or :func:`init` starts a new one; MPI itself
    stays initialised, so that is cheap.

    Args:
        group: The group to free; ``None`` for every group.

    Raises:
        GroupError: ``group`` was already destroyed.
        mpicomm.core.groups.DestroyedGroupError: ``group`` is None and there is no default group
            (destroyed already, or never made), as torch raises (an AssertionError).

    Example:
        >>> import mpicomm
        >>> g = mpicomm.new_group()
        >>> mpicomm.destroy_process_group(g)
    """
    if group is None and _State.world is None:
        raise DestroyedGroupError(
            "destroy_process_group: there is no default process group to destroy ("
            + ("it was destroyed already" if _State.destroyed else "it was never initialised")
            + "); expected one call per init_process_group() (torch says: Process group cannot be None)"
        )
    g = None if group is None else resolve(group, "destroy_process_group")
    if g is not None and g is not _State.world:
        _free(g)
        _State.groups = [each for each in _State.groups if each is not g]  # no list of dead groups
        return
    for each in reversed(_State.groups):
        _free(each)
    _State.groups = []
    _State.world = None
    _State.destroyed = True


def _free(group: ProcessGroup) -> None:
    if group.comm is not None:
        group.comm.Free()
        group.internal.Free()
    group.comm = group.internal = None
    group._size = -2  # marks the group as destroyed for resolve()
    group._rank = -1


def root_rank(group: ProcessGroup, global_rank: int | None, group_rank: int | None, fn: str, arg: str) -> int:
    """The group rank of a call's root, from ``src``/``dst`` (world rank) or ``group_src``/``group_dst``.

    Neither given means group rank 0, as in torch.distributed.

    Raises:
        ArgumentError: both given, out of range, or the world rank is not in the group.
    """
    if global_rank is not None and group_rank is not None:
        raise ArgumentError(
            f"{fn}: both {arg}={global_rank} and group_{arg}={group_rank} given; expected one of them"
        )
    if group_rank is None:
        if global_rank is None:
            return 0
        if not isinstance(global_rank, (int, np.integer)) or isinstance(global_rank, bool):
            raise ArgumentTypeError(f"{fn}: {arg} is {global_rank!r}; expected an int world rank")
        if group is _State.world:
            group_rank = global_rank  # world ranks are the world group's ranks: no translation
        else:
            if global_rank not in group._index:
                raise ArgumentError(
                    f"{fn}: {arg} is world rank {global_rank!r}, which is not part of group "
                    f"{group.name} (members {_short(group.ranks)}); expected a member's world rank"
                )
            return group._index[int(global_rank)]
        arg_shown = arg
    else:
        arg_shown = f"group_{arg}"
    if type(group_rank) is not int and (
        not isinstance(group_rank, (int, np.integer)) or isinstance(group_rank, bool)
    ):
        raise ArgumentTypeError(f"{fn}: {arg_shown} is {group_rank!r}; expected an int rank")
    if not 0 <= group_rank < group._size:
        raise BackendArgumentError(  # a ValueError as torch's Python checks, a RuntimeError as gloo's
            f"{fn}: {arg_shown} is {group_rank}; expected 0 <= {arg_shown} < {group._size} (the group size) "
            f"(torch says: invalid root rank: {group_rank})"
        )
    return int(group_rank)
