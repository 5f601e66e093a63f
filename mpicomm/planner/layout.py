"""Rank layouts: which node, local rank, GPU and CPUs each rank of a job gets, as Slurm lays them out."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..errors import ArgumentError, ArgumentTypeError
from .hostlist import expand_hostlist
from .types import Topology

__all__ = ["DISTRIBUTIONS", "JobShape", "RankLayout", "RankPlacement"]

DISTRIBUTIONS = ("block", "cyclic")


def _positive(fn: str, arg: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{fn}: {arg} is {type(value).__name__} {value!r}; expected an int")
    if value < minimum:
        raise ArgumentError(f"{fn}: {arg} is {value}; expected at least {minimum}")
    return value


@dataclasses.dataclass(frozen=True)
class JobShape:
    """What a job asks Slurm for: nodes, tasks (ranks) per node, GPUs per node, CPUs per task, distribution.

    Args:
        nodes: ``#SBATCH --nodes``.
        ntasks_per_node: ``--ntasks-per-node``.
        gpus_per_node: ``--gpus-per-node`` (0: no GPUs).
        cpus_per_task: ``--cpus-per-task``; also the ``OMP_NUM_THREADS`` of each rank.
        distribution: ``"block"`` (ranks 0..n-1 on the first node, as Slurm does by default) or
            ``"cyclic"`` (rank r on node ``r % nodes``).

    Example:
        >>> JobShape(nodes=2, ntasks_per_node=4).world_size
        8
    """

    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    distribution: str = "block"

    def __post_init__(self) -> None:
        _positive("JobShape", "nodes", self.nodes)
        _positive("JobShape", "ntasks_per_node", self.ntasks_per_node)
        _positive("JobShape", "gpus_per_node", self.gpus_per_node, 0)
        _positive("JobShape", "cpus_per_task", self.cpus_per_task)
        if self.distribution not in DISTRIBUTIONS:
            raise ArgumentError(
                f"JobShape: distribution is {self.distribution!r}; expected 'block' or 'cyclic'"
            )

    @property
    def world_size(self) -> int:
        """``nodes * ntasks_per_node``."""
        return self.nodes * self.ntasks_per_node

    @classmethod
    def from_topology(
        cls, topology: Topology, *, gpus_per_node: int | None = None, cpus_per_task: int = 1
    ) -> JobShape:
        """The shape that runs one rank per device of ``topology``, one node per host (block distribution).

        ``gpus_per_node`` defaults to the ranks per host for a ``"cuda"`` topology and 0 for ``"cpu"``.

        Example:
            >>> JobShape.from_topology(Topology(world_size=8, local_world_size=4))
            JobShape(nodes=2, ntasks_per_node=4, gpus_per_node=4, cpus_per_task=1, distribution='block')
        """
        lws = topology.local_world_size
        gpus = (lws if topology.compute_device == "cuda" else 0) if gpus_per_node is None else gpus_per_node
        return cls(topology.num_hosts, lws, gpus, cpus_per_task, "block")


@dataclasses.dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs.

    Attributes:
        rank: the global rank (``SLURM_PROCID``).
        node_index: the node's index in the job (``SLURM_NODEID``).
        node_name: the node's name.
        local_rank: the rank's index on its node (``SLURM_LOCALID``).
        gpu: the GPU index on the node it should use, or None without GPUs.
        cpus: the node's logical CPUs it is bound to with a block binding.
    """

    rank: int
    node_index: int
    node_name: str
    local_rank: int
    gpu: int | None
    cpus: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RankLayout:
    """Every rank's :class:`RankPlacement` for a :class:`JobShape`.

    Build it with :meth:`from_shape`. GPUs: rank ``local_rank`` uses GPU ``local_rank % gpus_per_node``
    (one GPU each when there are as many GPUs as tasks; shared round robin when there are fewer). CPUs:
    ``cpus_per_task`` consecutive CPUs per local rank.

    Attributes:
        shape: the job shape.
        node_names: one name per node.
        named: whether the names came from the user (only then does :func:`check_environment`
            compare them with Slurm's).
        ranks: one placement per rank, in rank order.
    """

    shape: JobShape
    node_names: tuple[str, ...]
    named: bool
    ranks: tuple[RankPlacement, ...]

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return len(self.ranks)

    @property
    def tasks_per_node(self) -> list[int]:
        """How many ranks each node runs."""
        return [self.shape.ntasks_per_node] * self.shape.nodes

    def on_node(self, node_index: int) -> list[RankPlacement]:
        """The ranks on one node, by local rank."""
        return sorted((p for p in self.ranks if p.node_index == node_index), key=lambda p: p.local_rank)

    @classmethod
    def from_shape(cls, shape: JobShape, node_names: Sequence[str] | str | None = None) -> RankLayout:
        """Lay out ``shape``'s ranks the way Slurm does.

        Args:
            shape: the job shape.
            node_names: the nodes' names, as a list or a Slurm hostlist (``"n[1-2]"``); default
                ``node0, node1, ...``.

        Returns:
            The layout.

        Raises:
            ArgumentTypeError: ``shape`` is not a JobShape.
            ArgumentError: the number of names is not ``shape.nodes``, or a name repeats.

        Example:
            >>> shape = JobShape(nodes=2, ntasks_per_node=2, distribution="cyclic")
            >>> layout = RankLayout.from_shape(shape, "n[1-2]")
            >>> [(p.rank, p.node_name, p.local_rank) for p in layout.ranks]
            [(0, 'n1', 0), (1, 'n2', 0), (2, 'n1', 1), (3, 'n2', 1)]
        """
        fn = "RankLayout.from_shape"
        if not isinstance(shape, JobShape):
            raise ArgumentTypeError(f"{fn}: shape is {type(shape).__name__}; expected a JobShape")
        named = node_names is not None
        if node_names is None:
            names = [f"node{i}" for i in range(shape.nodes)]
        elif isinstance(node_names, str):
            names = expand_hostlist(node_names)
        else:
            names = [str(n) for n in node_names]
        if len(names) != shape.nodes:
            raise ArgumentError(
                f"{fn}: node_names has {len(names)} names; expected {shape.nodes} (shape.nodes)"
            )
        if len(set(names)) != len(names):
            raise ArgumentError(f"{fn}: node_names {names} repeats a name; expected distinct nodes")
        n, t, c, g = shape.nodes, shape.ntasks_per_node, shape.cpus_per_task, shape.gpus_per_node
        ranks = []
        for r in range(shape.world_size):
            node, local = (r // t, r % t) if shape.distribution == "block" else (r % n, r // n)
            gpu = local % g if g else None
            ranks.append(
                RankPlacement(r, node, names[node], local, gpu, tuple(range(local * c, local * c + c)))
            )
        return cls(shape, tuple(names), named, tuple(ranks))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (the shape and the node names; the ranks follow from them)."""
        return {**dataclasses.asdict(self.shape), "node_names": list(self.node_names) if self.named else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankLayout:
        """The inverse of :meth:`to_dict`."""
        data = dict(data)
        names = data.pop("node_names", None)
        fields = {f.name for f in dataclasses.fields(JobShape)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ArgumentError(
                f"RankLayout.from_dict: unknown keys {unknown}; expected some of {sorted(fields)}"
            )
        return cls.from_shape(JobShape(**data), names)
