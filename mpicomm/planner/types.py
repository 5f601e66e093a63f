"""The planner's vocabulary: storage, perf, shards, sharding options, devices, topologies and errors."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from typing import Any, Literal, TypeVar, Union

from ..errors import ArgumentError, ArgumentTypeError, MpicommError

__all__ = [
    "GIB",
    "Device",
    "PartitionBy",
    "Perf",
    "PerfLike",
    "PlannerError",
    "PlannerErrorKind",
    "Shard",
    "ShardingOption",
    "Storage",
    "Topology",
]

GIB = 1024**3
PartitionBy = Literal["uniform", "device", "host"]
PARTITION_BY: tuple[str, ...] = ("uniform", "device", "host")
WITHIN_HOST: tuple[str, ...] = ("device", "uniform")


def _count(fn: str, arg: str, value: object) -> int:
    """``value`` as a non-negative int, else a clear error naming ``fn`` and ``arg``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{fn}: {arg} is {type(value).__name__} {value!r}; expected an int")
    if value < 0:
        raise ArgumentError(f"{fn}: {arg} is {value}; expected a number >= 0")
    return value


def _real(fn: str, arg: str, value: object) -> float:
    """``value`` as a finite, non-negative float, else a clear error."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{fn}: {arg} is {type(value).__name__} {value!r}; expected a number")
    if not math.isfinite(value) or value < 0:
        raise ArgumentError(f"{fn}: {arg} is {value}; expected a finite number >= 0")
    return float(value)


_T = TypeVar("_T")


def _trusted(cls: type[_T], **fields: object) -> _T:
    """A frozen dataclass instance from values known to be valid (sums of valid values): no checks.

    The partitioner adds storage and perf once per shard; skipping the argument checks there makes
    planning 100,000 shards several times faster.
    """
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


class PlannerErrorKind(enum.Enum):
    """Why planning failed; the same taxonomy as torchrec's ``PlannerErrorType``."""

    INSUFFICIENT_STORAGE = "insufficient_storage"
    STRICT_CONSTRAINTS = "strict_constraints"
    PARTITION = "partition"
    OTHER = "other"


class PlannerError(MpicommError, ValueError):
    """No placement satisfies the request; the message ends in a numbered "Possible solutions" list.

    Attributes:
        kind: why planning failed (:class:`PlannerErrorKind`).
    """

    def __init__(self, message: str, kind: PlannerErrorKind = PlannerErrorKind.OTHER) -> None:
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass(frozen=True, order=True)
class Storage:
    """Bytes of device memory (``hbm``) and host memory (``ddr``); compared as the tuple ``(hbm, ddr)``.

    Example:
        >>> Storage(1000, 2000) + Storage(1, 2)
        Storage(hbm=1001, ddr=2002)
        >>> Storage(10, 10).fits_in(Storage(10, 20))
        True
    """

    hbm: int = 0
    ddr: int = 0

    def __post_init__(self) -> None:
        _count("Storage", "hbm", self.hbm)
        _count("Storage", "ddr", self.ddr)

    def __add__(self, other: Storage) -> Storage:
        return _trusted(Storage, hbm=self.hbm + other.hbm, ddr=self.ddr + other.ddr)

    def __sub__(self, other: Storage) -> Storage:
        return _trusted(Storage, hbm=self.hbm - other.hbm, ddr=self.ddr - other.ddr)

    def fits_in(self, other: Storage) -> bool:
        """Whether both parts are at most those of ``other`` (the test is ``<=``)."""
        return self.hbm <= other.hbm and self.ddr <= other.ddr


@dataclasses.dataclass(frozen=True)
class Perf:
    """Estimated seconds of work, split as torchrec splits it; ``total`` is what the planner balances.

    A plain number anywhere a perf is expected means ``Perf(fwd_compute=number)``.

    Example:
        >>> (Perf(40, 30, 20, 10) + Perf(40, 30, 20, 10)).total
        200.0
    """

    fwd_compute: float = 0.0
    fwd_comms: float = 0.0
    bwd_compute: float = 0.0
    bwd_comms: float = 0.0
    prefetch_compute: float = 0.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, _real("Perf", field.name, getattr(self, field.name)))

    def __add__(self, other: Perf) -> Perf:
        return _trusted(
            Perf,
            fwd_compute=self.fwd_compute + other.fwd_compute,
            fwd_comms=self.fwd_comms + other.fwd_comms,
            bwd_compute=self.bwd_compute + other.bwd_compute,
            bwd_comms=self.bwd_comms + other.bwd_comms,
            prefetch_compute=self.prefetch_compute + other.prefetch_compute,
        )

    @property
    def total(self) -> float:
        """The sum of the five parts, added in torchrec's order.

        ``fwd_compute + bwd_compute + fwd_comms + bwd_comms + prefetch_compute``: float addition is
        not associative, and near-ties between ranks break by the last bit, so any other order places
        some shards elsewhere than torchrec does.

        Example:
            >>> Perf(0.3, 0.2, 0.1).total  # 0.3 + 0.1 + 0.2, not 0.3 + 0.2 + 0.1
            0.6000000000000001
        """
        return self.fwd_compute + self.bwd_compute + self.fwd_comms + self.bwd_comms + self.prefetch_compute

    @classmethod
    def of(cls, value: PerfLike) -> Perf:
        """``value`` itself if it is a Perf, else ``Perf(fwd_compute=value)``."""
        return value if isinstance(value, Perf) else cls(fwd_compute=_real("Perf", "value", value))


PerfLike = Union[Perf, float, int]  # noqa: UP007 (a runtime alias: Perf | float is an error on 3.9-)


def _index_list(value: Sequence[int] | None, arg: str) -> list[int] | None:
    """``size`` or ``offset`` of a shard as a list of ints >= 0 (None stays None)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ArgumentTypeError(f"Shard: {arg} is {value!r}; expected a list of ints >= 0")
    if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in value):
        raise ArgumentError(f"Shard: {arg} is {list(value)!r}; expected a list of ints >= 0")
    return [int(x) for x in value]


class Shard:
    """One piece of a sharding option; the partitioner fills in ``rank``.

    Args:
        storage: what the shard occupies on its rank: a :class:`Storage`, or a plain number of
            bytes, which counts against the topology's compute device (HBM on ``"cuda"``, DDR on
            ``"cpu"``): the partitioner sets ``storage`` accordingly (``Storage(hbm=n)`` until then).
        perf: its estimated cost: a :class:`Perf`, or a plain number, the total.
        size: the shard's shape in the sharded object (informational), e.g. ``[rows, cols]``.
        offset: where the shard starts in the sharded object (informational).
        rank: the rank it is placed on; None until planned.

    Example:
        >>> Shard(Storage(10, 0), 2.5).perf.total
        2.5
        >>> Shard(storage=1, perf=1).storage
        Storage(hbm=1, ddr=0)
    """

    __slots__ = ("_amount", "offset", "perf", "rank", "size", "storage")

    def __init__(
        self,
        storage: Storage | int,
        perf: PerfLike = 0.0,
        size: Sequence[int] | None = None,
        offset: Sequence[int] | None = None,
        rank: int | None = None,
    ) -> None:
        if isinstance(storage, Storage):
            self._amount: int | None = None
        elif isinstance(storage, int) and not isinstance(storage, bool):
            self._amount = _count("Shard", "storage", storage)
            storage = Storage(self._amount, 0)
        else:
            raise ArgumentTypeError(
                f"Shard: storage is {type(storage).__name__}; expected a Storage(hbm, ddr) or an int "
                "of bytes on the compute device"
            )
        self.storage = storage
        self.perf = Perf.of(perf)
        self.size = _index_list(size, "size")
        self.offset = _index_list(offset, "offset")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ArgumentError(f"Shard: rank is {rank!r}; expected None or a rank >= 0")
        self.rank = rank

    def on_device(self, compute_device: str) -> None:
        """Count a plain-number storage against ``compute_device``: HBM for ``"cuda"``, DDR for ``"cpu"``."""
        if self._amount is not None:
            hbm = compute_device == "cuda"
            self.storage = Storage(self._amount if hbm else 0, 0 if hbm else self._amount)

    def __repr__(self) -> str:
        return (
            f"Shard(storage={self.storage!r}, perf={self.perf!r}, size={self.size!r}, "
            f"offset={self.offset!r}, rank={self.rank!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shard):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass
class ShardingOption:
    """A named object to place (an embedding table, a domain block) and how it is cut into shards.

    Args:
        name: unique within one proposal.
        partition_by: ``"uniform"`` (shard i on rank i; needs one shard per rank), ``"device"`` (each
            shard onto the least-loaded rank that fits) or ``"host"`` (all shards within one host).
        shards: the pieces.
        dependency: options with the same dependency are placed together as one group (host options
            only); by default each option is its own group.
        within_host: for ``"host"`` options, how shards are placed on the host's ranks: ``"device"``
            (least loaded first, like torchrec's table-column-wise) or ``"uniform"`` (shard i on the
            host's i-th rank, like table-row-wise; needs ``local_world_size`` shards).
        tensor, module, input_lengths, batch_size, sharding_type, compute_kernel, ...: torchrec's
            other ShardingOption arguments, keyword only: kept on the option (not compared, not
            shown) so that torchrec code that builds options by keyword runs unchanged; the
            partitioner does not use them.

    Example:
        >>> opt = ShardingOption("t0", "device", [Shard(Storage(4, 0), 1.0)] * 2)
        >>> opt.total_storage, opt.total_perf
        (Storage(hbm=8, ddr=0), 2.0)
    """

    name: str
    partition_by: str
    shards: list[Shard]
    dependency: str | None = None
    within_host: str = "device"
    # torchrec's other ShardingOption arguments, accepted by keyword so that torchrec code builds
    # options unchanged; the partitioner does not read them.
    tensor: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    module: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    input_lengths: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    batch_size: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    sharding_type: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    compute_kernel: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    cache_params: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    enforce_hbm: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    stochastic_rounding: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    bounds_check_mode: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    is_pooled: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    feature_names: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    output_dtype: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)
    key_value_params: Any = dataclasses.field(default=None, kw_only=True, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ArgumentError(f"ShardingOption: name is {self.name!r}; expected a non-empty string")
        if self.partition_by not in PARTITION_BY:
            raise ArgumentError(
                f"ShardingOption: partition_by of {self.name!r} is {self.partition_by!r}; "
                f"expected one of {', '.join(map(repr, PARTITION_BY))}"
            )
        if self.dependency is not None and not isinstance(self.dependency, str):
            raise ArgumentTypeError(
                f"ShardingOption: dependency of {self.name!r} is {self.dependency!r}; "
                "expected a string or None"
            )
        if self.within_host not in WITHIN_HOST:
            raise ArgumentError(
                f"ShardingOption: within_host of {self.name!r} is {self.within_host!r}; "
                f"expected one of {', '.join(map(repr, WITHIN_HOST))}"
            )
        if not isinstance(self.shards, Sequence) or isinstance(self.shards, str) or not self.shards:
            raise ArgumentError(
                f"ShardingOption: shards of {self.name!r} is {self.shards!r}; expected a non-empty list"
            )
        for i, shard in enumerate(self.shards):
            if not isinstance(shard, Shard):
                got = type(shard).__name__
                raise ArgumentTypeError(
                    f"ShardingOption: shards[{i}] of {self.name!r} is {got}; expected a Shard"
                )
        self.shards = list(self.shards)

    @property
    def group(self) -> tuple[str, str]:
        """The key that options placed together share, that is the dependency, else the option's own name.

        The two live apart (``("dependency", d)`` and ``("name", n)``), so an option named ``a`` is
        not grouped with options whose dependency is ``"a"``.
        """
        return ("dependency", self.dependency) if self.dependency else ("name", self.name)

    @property
    def total_storage(self) -> Storage:
        """The sum of the shards' storage."""
        hbm = sum(s.storage.hbm for s in self.shards)
        return Storage(hbm, sum(s.storage.ddr for s in self.shards))

    @property
    def total_perf(self) -> float:
        """The sum of the shards' ``perf.total``."""
        return sum(s.perf.total for s in self.shards)

    @property
    def ranks(self) -> list[int | None]:
        """The planned rank of each shard (None before planning)."""
        return [s.rank for s in self.shards]


@dataclasses.dataclass(frozen=True)
class Device:
    """One rank's capacity (``storage``) and the perf already on it (``perf``)."""

    rank: int
    storage: Storage
    perf: Perf = dataclasses.field(default_factory=Perf)


class Topology:
    """The ranks a plan is made for: how many, how they group into hosts, and what each can hold.

    Args:
        world_size: the number of ranks (devices).
        local_world_size: ranks per host; hosts are runs of consecutive ranks. Default: ``world_size``
            (one host).
        hbm_cap: device memory per rank in bytes. Default: 32 GiB for ``"cuda"``, 0 for ``"cpu"``.
        ddr_cap: host memory per rank in bytes. Default: 128 GiB.
        compute_device: ``"cuda"`` or ``"cpu"``.

    Attributes:
        devices: one :class:`Device` per rank, in rank order.

    Example:
        >>> topo = Topology(world_size=4, local_world_size=2, compute_device="cpu", ddr_cap=1000)
        >>> topo.num_hosts, topo.devices[3].storage
        (2, Storage(hbm=0, ddr=1000))
    """

    def __init__(
        self,
        world_size: int,
        local_world_size: int | None = None,
        hbm_cap: int | None = None,
        ddr_cap: int | None = None,
        compute_device: str = "cuda",
    ) -> None:
        if _count("Topology", "world_size", world_size) == 0:
            raise ArgumentError("Topology: world_size is 0; expected at least 1 rank")
        if compute_device not in ("cuda", "cpu"):
            raise ArgumentError(f"Topology: compute_device is {compute_device!r}; expected 'cuda' or 'cpu'")
        lws = (
            world_size
            if local_world_size is None
            else _count("Topology", "local_world_size", local_world_size)
        )
        if lws == 0 or world_size % lws:
            raise ArgumentError(
                f"Topology: local_world_size is {lws}; expected a divisor of world_size {world_size} "
                "(every host has the same number of ranks)"
            )
        default_hbm = 32 * GIB if compute_device == "cuda" else 0
        hbm = default_hbm if hbm_cap is None else _count("Topology", "hbm_cap", hbm_cap)
        ddr = 128 * GIB if ddr_cap is None else _count("Topology", "ddr_cap", ddr_cap)
        self.world_size = world_size
        self.local_world_size = lws
        self.hbm_cap = hbm
        self.ddr_cap = ddr
        self.compute_device = compute_device
        cap = Storage(hbm, ddr)
        self.devices: list[Device] = [Device(r, cap) for r in range(world_size)]

    @property
    def num_hosts(self) -> int:
        """``world_size // local_world_size``."""
        return self.world_size // self.local_world_size

    def __repr__(self) -> str:
        return (
            f"Topology(world_size={self.world_size}, local_world_size={self.local_world_size}, "
            f"hbm_cap={self.hbm_cap}, ddr_cap={self.ddr_cap}, compute_device={self.compute_device!r})"
        )
