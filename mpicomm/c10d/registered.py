"""The process group torch builds for ``backend="mpicomm"``: c10d's methods on an mpicomm group.

torch accepts a ``torch.distributed.ProcessGroup`` subclass written in Python as a whole group: its
C++ side (DDP's reducer, FSDP2, DeviceMesh, DTensor, functional collectives) calls these methods back.
Each one reads torch's options object once and calls mpicomm's public front door
(:mod:`mpicomm.front.collectives`), so CPU tensors take the host path and CUDA tensors mpicomm's
direct or staged GPU path. Collectives complete before they return and answer a completed
:class:`~mpicomm.c10d.work.Done` (torch's C++ waits on futures, never on the Work), except an
``allreduce`` with ``asyncOp`` (DDP's buckets), which runs on mpicomm's communication thread and
answers a :class:`~mpicomm.c10d.work.Running`, as does an ``all_gather_single`` with ``asyncOp``
(FSDP2's prefetched unshards); an ``allreduce`` of a tensor over 24 MiB goes in
equal pieces on every rank, as every mpicomm all_reduce does (:mod:`mpicomm.core.pieces`).
Point-to-point transfers answer a
:class:`~mpicomm.c10d.work.Pending`.

Roots, peers and ranks are group ranks, as torch passes them. Timeouts: the group's (from
``init_process_group(timeout=...)`` or ``new_group(timeout=...)``) bounds every blocking call; a
barrier's own ``timeout`` option, when set, bounds that barrier.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..core import groups
from ..core.groups import ProcessGroup as Group
from ..core.reduce_op import ReduceOp
from ..core.work import Work, completed
from ..dense.sync import barrier as _barrier
from ..errors import ArgumentError
from ..front import coalesced, collectives
from ..trace.profiled import label_methods
from . import huge, options
from .work import Done, Pending, Running

# the front door's all_reduce, bound once: a module attribute read less on the 8-byte path
_all_reduce = collectives.all_reduce

__all__ = ["DEVICES", "MpicommProcessGroup"]

_RED: Any = dist.ReduceOp.RedOpType  # its members are missing from torch's type stubs
_SUM = _RED.SUM
_SUM_OP = ReduceOp.SUM


def _reduction(opts: Any) -> ReduceOp:
    """The mpicomm reduction for torch's ``opts.reduceOp`` (SUM first: one comparison, no enum read)."""
    rop = opts.reduceOp
    return ReduceOp.SUM if rop == _SUM else _decoded(rop)


def _decoded(rop: Any) -> ReduceOp:
    """The mpicomm reduction for a torch ``ReduceOp`` other than SUM (the adapters' one translation)."""
    return options.reduction(rop, "ProcessGroup")


#: The devices of every group of this backend: the host always, CUDA where this torch has it
#: (CPU-only torch must not be told cuda: torch then puts buffers there and fails).
DEVICES = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def _single(tensors: list[Any], fn: str) -> Any:
    """The one tensor of c10d's list (one device per process)."""
    if len(tensors) != 1:
        raise ArgumentError(
            f"ProcessGroup.{fn}: tensors has {len(tensors)} entries; expected 1 (one per process)"
        )
    return tensors[0]


def _root_list(tensors: list[list[Any]], fn: str) -> list[Any] | None:
    """The root's one list of tensors of a gather or scatter (``[]`` off the root: None)."""
    return list(_single(tensors, fn)) if tensors else None


def _splits(sizes: Any) -> list[int] | None:
    """Torch's split sizes (``[]``: even splits) as mpicomm's (None)."""
    return list(sizes) or None


class MpicommProcessGroup(dist.ProcessGroup):
    """torch's ProcessGroup for ``backend="mpicomm"``, built by torch through the registered creator.

    Args:
        group: The mpicomm group this torch group runs on (its communicator, ranks and timeout).
        name: The name torch gives the group (``setGroupName`` may change it).

    Example:
        >>> import mpicomm, mpicomm.torch
        >>> pg = mpicomm.torch.process_group(mpicomm.init())
        >>> pg.getBackendName(), pg.size() == mpicomm.get_world_size()
        ('mpicomm', True)
    """

    def __init__(self, group: Group, name: str = "") -> None:
        super().__init__(group.rank(), group.size())  # type: ignore[call-arg]  # the stubs lack it
        self._g = group
        self._name = name
        self._desc = group.name
        # the Work of a blocking call (torch's Python wrapper only waits on it, then drops it): one per
        # group, its outputs replaced by each call, saves making a pybind object per 8-byte call
        self._blocking = Done([])

    # -- identity: C++ keeps no name for a Python group; DeviceMesh and funcol look groups up by name

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        """``"mpicomm"``."""
        return "mpicomm"

    def setGroupName(self, name: str) -> None:  # noqa: N802 - c10d's name
        """Keep the name torch registers the group under."""
        self._name = name

    def getGroupName(self) -> str:  # noqa: N802 - c10d's name
        """The name torch registered the group under."""
        return self._name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - c10d's name
        """Keep torch's description of the group."""
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802 - c10d's name
        """Torch's description of the group."""
        return self._desc

    @property
    def group_name(self) -> str:  # type: ignore[override]
        """The name torch registered the group under."""
        return self._name

    @property
    def group_desc(self) -> str:  # type: ignore[override]
        """Torch's description of the group."""
        return self._desc

    @property
    def _device_types(self) -> list[torch.device]:  # type: ignore[override]
        """The devices torch may send to this group: cpu, and cuda where torch has CUDA.

        torch fills this list when a C++ backend is registered on a group for a device, which a group
        written in Python never gets; DCP's ``async_save``, ``_get_pg_default_device``, object
        collectives' device choice and full-state-dict loading with ``broadcast_from_rank0`` read it.
        """
        return DEVICES

    @property
    def mpicomm_group(self) -> Group:
        """The mpicomm group underneath (to call mpicomm directly on the same ranks)."""
        return self._g

    def __repr__(self) -> str:
        return f"<MpicommProcessGroup {self._name or '?'}: {self._g!r}>"

    # -- lifetime

    def shutdown(self) -> None:
        """Torch's ``destroy_process_group``: a subgroup's communicators are freed; the group refuses calls.

        torch drops its references and calls this on each group it destroys. A subgroup torch made is
        mpicomm's own to free (``MPI_Comm_free``: MPI holds a few thousand communicators at most); the
        default group runs on mpicomm's world group, which lives on for mpicomm's own calls and the next
        ``init_process_group``, so only this handle is retired. Either way, a later call on this group
        raises :class:`~mpicomm.errors.GroupError`.
        """
        g = self._g
        if not g.is_member and g.size() == -2:
            return  # destroyed already (torch's world destroy shuts every group down, its own too)
        if g is groups._State.world:
            g = self._g = Group(None, list(g.ranks), g.name, g.backend)  # a stand-in, destroyed below
        groups.destroy_process_group(g)

    # -- reductions

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Done | Running:  # type: ignore[override]
        """``dist.all_reduce``: one tensor reduced in place (``opts.reduceOp``, PREMUL_SUM's factor, AVG).

        The 8-byte path is the front door's call and little else: one read of each option (a pybind
        attribute read is 0.1-0.5 us), SUM told by one comparison without reading the enum, no helper
        calls, and the group's reused Work for a blocking caller (docs/torch.rst, "Speed").
        """
        if opts is None or len(tensors) != 1:
            return self._allreduce_other(tensors, opts)
        rop = opts.reduceOp
        if opts.asyncOp:  # DDP's buckets: on mpicomm's communication thread, overlapping backward
            huge.reused(tensors[0])  # the same buckets at every step: huge pages from the second
            queued = _all_reduce(tensors[0], _SUM_OP if rop == _SUM else _decoded(rop), self._g, True)
            return Running(completed() if queued is None else queued, tensors)
        _all_reduce(tensors[0], _SUM_OP if rop == _SUM else _decoded(rop), self._g, False)
        work = self._blocking
        work._outputs = tensors
        return work

    def _allreduce_other(self, tensors: list[torch.Tensor], opts: Any) -> Done | Running:
        """``allreduce`` without options (C++ callers' defaults: SUM) or with a wrong list."""
        t = _single(tensors, "allreduce")
        op = ReduceOp.SUM if opts is None else _reduction(opts)
        _all_reduce(t, op, self._g, False)
        return Done(tensors) if opts is None else self._work(opts, tensors)

    def _work(self, opts: Any, outputs: list[Any]) -> Done:
        """A fresh Work for an ``asyncOp`` caller (it may keep it); the group's own for a blocking one."""
        if opts.asyncOp:
            return Done(outputs)
        work = self._blocking
        work._outputs = outputs
        return work

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Done:  # type: ignore[override]
        """``dist.all_reduce_coalesced``: every tensor reduced in place, one MPI call per dtype."""
        op = ReduceOp.SUM if opts is None else _reduction(opts)
        coalesced._all_reduce_coalesced(list[Any](tensors), op, self._g, False)
        return Done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Done:  # type: ignore[override]
        """``dist.reduce``: onto group rank ``opts.rootRank``."""
        t = _single(tensors, "reduce")
        op = ReduceOp.SUM if opts is None else _reduction(opts)
        root = options.root(opts)
        collectives.reduce(t, None, op, self._g, False, group_dst=root)
        return Done(tensors)

    def reduce_scatter(  # type: ignore[override]
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Done:
        """``dist.reduce_scatter``: this rank's block of the reduction of every rank's list."""
        out = _single(output_tensors, "reduce_scatter")
        ins = _single(input_tensors, "reduce_scatter")
        op = ReduceOp.SUM if opts is None else _reduction(opts)
        collectives.reduce_scatter(out, list(ins), op, self._g, False)
        return Done(output_tensors)

    def reduce_scatter_single(  # type: ignore[override]
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> Done:
        """``dist.reduce_scatter_tensor`` (FSDP2's call): this rank's block of the reduced ``input``."""
        op = ReduceOp.SUM if opts is None else _reduction(opts)
        collectives.reduce_scatter_tensor(output, input, op, self._g, False)
        return Done([output])

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter_single_coalesced(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Done:
        """Several ``reduce_scatter_tensor`` calls, one after the other (functional collectives)."""
        if len(outputs) != len(inputs):
            raise ArgumentError(
                f"ProcessGroup.reduce_scatter_single_coalesced: {len(outputs)} outputs; expected "
                f"{len(inputs)} (one per input)"
            )
        op = ReduceOp.SUM if opts is None else _reduction(opts)
        for out, inp in zip(outputs, inputs, strict=True):
            collectives.reduce_scatter_tensor(out, inp, op, self._g, False)
        return Done(list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    # -- gathers, broadcast, scatter, all-to-all

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Done:  # type: ignore[override]
        """``dist.broadcast`` from group rank ``opts.rootRank``."""
        t = _single(tensors, "broadcast")
        root = options.root(opts)
        collectives.broadcast(t, None, self._g, False, group_src=root)
        return Done(tensors) if opts is None else self._work(opts, tensors)

    def allgather(  # type: ignore[override]
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Done:
        """``dist.all_gather``: one output tensor per group rank."""
        outs = _single(output_tensors, "allgather")
        collectives.all_gather(list(outs), _single(input_tensors, "allgather"), self._g, False)
        return Done(output_tensors)

    def allgather_coalesced(  # type: ignore[override]
        self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: Any = None
    ) -> Done:
        """``dist.all_gather_coalesced``: ``output_lists[r][i]`` receives rank r's ``input_list[i]``."""
        if len(output_lists) != self._g.size():
            raise ArgumentError(
                f"ProcessGroup.allgather_coalesced: output_lists has {len(output_lists)} entries; expected "
                f"{self._g.size()} (one list per group rank)"
            )
        for i, t in enumerate(input_list):
            collectives.all_gather([outs[i] for outs in output_lists], t, self._g, False)
        return Done(output_lists)

    def all_gather_single(  # type: ignore[override]
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> Done | Running:
        """``dist.all_gather_into_tensor`` (FSDP2's call): every rank's ``input``, concatenated.

        With ``asyncOp`` (FSDP2's explicitly prefetched unshard, functional collectives) the call is
        queued on mpicomm's communication thread and runs while the caller computes: the next
        module's parameters arrive during this module's forward.
        """
        if opts is not None and opts.asyncOp:
            queued = collectives.all_gather_into_tensor(output, input, self._g, True)
            return Running(completed() if queued is None else queued, [output])
        collectives.all_gather_into_tensor(output, input, self._g, False)
        return Done([output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Done:
        """Several ``all_gather_into_tensor`` calls, one after the other (functional collectives, DTensor)."""
        if len(outputs) != len(inputs):
            raise ArgumentError(
                f"ProcessGroup.all_gather_single_coalesced: {len(outputs)} outputs; expected "
                f"{len(inputs)} (one per input)"
            )
        for out, inp in zip(outputs, inputs, strict=True):
            collectives.all_gather_into_tensor(out, inp, self._g, False)
        return Done(list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]

    def gather(  # type: ignore[override]
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Done:
        """``dist.gather`` onto group rank ``opts.rootRank`` (``output_tensors`` is ``[]`` elsewhere)."""
        t = _single(input_tensors, "gather")
        root = options.root(opts)
        outs = _root_list(output_tensors, "gather")
        collectives.gather(t, outs, None, self._g, False, group_dst=root)
        return Done(output_tensors)

    def scatter(  # type: ignore[override]
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Done:
        """``dist.scatter`` from group rank ``opts.rootRank`` (``input_tensors`` is ``[]`` elsewhere)."""
        out = _single(output_tensors, "scatter")
        root = options.root(opts)
        ins = _root_list(input_tensors, "scatter")
        collectives.scatter(out, ins, None, self._g, False, group_src=root)
        return Done(output_tensors)

    def all_to_all_single(  # type: ignore[override]
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Done | Running:
        """``dist.all_to_all_single``: rows of ``input`` to each rank (``[]`` splits: even).

        An ``asyncOp`` call (torchrec's KJT and pooled-embedding all-to-alls) runs on mpicomm's
        communication thread, as gloo's runs on its own, so the caller's work until ``wait`` overlaps it.
        """
        async_op = opts is not None and bool(opts.asyncOp)
        queued = collectives.all_to_all_single(
            output, input, _splits(output_split_sizes), _splits(input_split_sizes), self._g, async_op
        )
        if async_op:
            return Running(completed() if queued is None else queued, [output])
        return Done([output])

    alltoall_base = all_to_all_single  # type: ignore[assignment]

    def alltoall(  # type: ignore[override]
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Done:
        """``dist.all_to_all``: one tensor to and from each group rank."""
        collectives.all_to_all(list(output_tensors), list(input_tensors), self._g, False)
        return Done(output_tensors)

    def barrier(self, opts: Any = None) -> Done:  # type: ignore[override]
        """``dist.barrier``; ``opts.timeout``, when set, bounds it (the group's timeout otherwise)."""
        _barrier(self._g, False, None, options.barrier_timeout(opts))
        return Done([])

    # -- point to point: non-blocking, so that two ranks may both send first

    def _transfer(self, work: Work | None, tensors: list[torch.Tensor]) -> Pending:
        """The Pending of a send or receive (a member always gets a Work; a completed one otherwise)."""
        return Pending(completed() if work is None else work, tensors, self._g.ranks)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> Pending:  # type: ignore[override]  # noqa: N803
        """``dist.send``/``isend`` to group rank ``dstRank``."""
        t = _single(tensors, "send")
        work = collectives.isend(t, None, self._g, tag, group_dst=dstRank)
        return self._transfer(work, tensors)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> Pending:  # type: ignore[override]  # noqa: N803
        """``dist.recv``/``irecv`` from group rank ``srcRank``."""
        t = _single(tensors, "recv")
        work = collectives.irecv(t, None, self._g, tag, group_src=srcRank)
        return self._transfer(work, tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Pending:  # type: ignore[override]
        """``dist.recv(src=None)``: from any rank; the Work's ``_source_rank()`` names the group rank."""
        t = _single(tensors, "recv_anysource")
        work = collectives.irecv(t, None, self._g, tag)
        return self._transfer(work, tensors)


label_methods(MpicommProcessGroup)  # issue 43: named in torch's profiler (mpicomm:all_reduce) while one runs
