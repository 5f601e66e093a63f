"""Plan files: the TOML/JSON spec the CLI reads and the JSON plan it writes."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import ArgumentError
from ..sizes import parse_size
from .layout import JobShape, RankLayout
from .partitioner import SORT_BY
from .result import DeviceLoad, Plan
from .types import Perf, Shard, ShardingOption, Storage, Topology

__all__ = ["PLAN_FORMAT", "Spec", "load_plan", "load_spec", "parse_spec", "plan_to_dict", "save_plan"]

PLAN_FORMAT = "mpicomm-plan/1"
_TOPOLOGY_KEYS = {"world_size", "local_world_size", "hbm_cap", "ddr_cap", "compute_device"}
_OPTION_KEYS = {
    "name",
    "partition_by",
    "dependency",
    "within_host",
    "shards",
    "num_shards",
    "hbm",
    "ddr",
    "perf",
}
_SHARD_KEYS = {"hbm", "ddr", "perf", "size", "offset", "rank"}
_PERF_KEYS = {f.name for f in dataclasses.fields(Perf)}


@dataclasses.dataclass
class Spec:
    """A planning request read from a file.

    Attributes:
        topology: the ranks.
        options: the sharding options.
        shape: the job shape from the ``[job]`` table, or None to derive it from the topology.
        node_names: the ``node_names`` of the ``[job]`` table (a list or a hostlist), or None.
        sort_by: the partitioner's ``sort_by``.
    """

    topology: Topology
    options: list[ShardingOption]
    shape: JobShape | None = None
    node_names: list[str] | str | None = None
    sort_by: str = "storage"


def _table(data: object, where: str, allowed: set[str], source: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ArgumentError(f"{source}: {where} is {type(data).__name__}; expected a table")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ArgumentError(
            f"{source}: {where} has unknown keys {unknown}; expected some of {sorted(allowed)}"
        )
    return data


def _bytes(value: object, where: str, source: str) -> Any:
    """A size from the spec: an int, or a string such as ``"80GiB"`` (:func:`mpicomm.sizes.parse_size`).

    Other types go through unchanged, so that the planner's own checks name them.
    """
    return parse_size(value, source, where) if isinstance(value, str) else value


def _perf(value: object, where: str, source: str) -> Perf:
    if isinstance(value, dict):
        return Perf(**_table(value, where, _PERF_KEYS, source))
    return Perf.of(value)  # type: ignore[arg-type]


def _shard(data: object, where: str, source: str) -> Shard:
    t = _table(data, where, _SHARD_KEYS, source)
    storage = Storage(
        _bytes(t.get("hbm", 0), f"{where}.hbm", source), _bytes(t.get("ddr", 0), f"{where}.ddr", source)
    )
    return Shard(
        storage,
        _perf(t.get("perf", 0.0), f"{where}.perf", source),
        t.get("size"),
        t.get("offset"),
        t.get("rank"),
    )


def _option(data: object, i: int, source: str) -> ShardingOption:
    where = f"options[{i}]"
    t = _table(data, where, _OPTION_KEYS, source)
    for key in ("name", "partition_by"):
        if key not in t:
            raise ArgumentError(f"{source}: {where} has no {key!r}; expected name and partition_by")
    if "shards" in t:
        if "num_shards" in t or any(k in t for k in ("hbm", "ddr", "perf")):
            raise ArgumentError(
                f"{source}: {where} has both shards and num_shards/hbm/ddr/perf; expected one form"
            )
        raw = t["shards"]
        if not isinstance(raw, list):
            raise ArgumentError(
                f"{source}: {where}.shards is {type(raw).__name__}; expected a list of tables"
            )
        shards = [_shard(s, f"{where}.shards[{j}]", source) for j, s in enumerate(raw)]
    else:
        n = t.get("num_shards")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ArgumentError(
                f"{source}: {where}.num_shards is {n!r}; expected a positive int (or a shards list)"
            )
        one = {k: t[k] for k in ("hbm", "ddr", "perf") if k in t}
        shards = [_shard(one, where, source) for _ in range(n)]
    return ShardingOption(
        t["name"], t["partition_by"], shards, t.get("dependency"), t.get("within_host", "device")
    )


def parse_spec(data: object, source: str = "spec") -> Spec:
    """Build a :class:`Spec` from a parsed TOML/JSON document.

    The document has a ``[topology]`` table (the :class:`Topology` arguments), an optional ``[job]``
    table (the :class:`JobShape` fields and ``node_names``), an optional ``[planner]`` table
    (``sort_by``) and ``[[options]]``: each with ``name``, ``partition_by``, optional ``dependency`` and
    ``within_host``, and either ``shards = [{hbm, ddr, perf, size, offset}, ...]`` or ``num_shards`` with
    one ``hbm``/``ddr``/``perf`` for all of them. A perf is a number or a table of the :class:`Perf` parts.
    Sizes (``hbm``, ``ddr``, ``hbm_cap``, ``ddr_cap``) are ints of bytes or strings such as ``"80GiB"``
    or ``"4M"`` (binary units, see :func:`mpicomm.sizes.parse_size`).

    Raises:
        ArgumentError: a missing or unknown key, or a bad value; the message names the file and the key.

    Example:
        >>> spec = parse_spec({"topology": {"world_size": 2, "compute_device": "cpu"},
        ...                    "options": [{"name": "t", "partition_by": "device",
        ...                                 "num_shards": 3, "ddr": 5}]})
        >>> len(spec.options[0].shards), spec.options[0].total_storage
        (3, Storage(hbm=0, ddr=15))
        >>> parse_spec({"topology": {"world_size": 1, "ddr_cap": "1GiB"}, "options": []}).topology.ddr_cap
        1073741824
    """
    doc = _table(data, "the document", {"topology", "job", "planner", "options"}, source)
    if "topology" not in doc:
        raise ArgumentError(f"{source}: no [topology] table; expected one with at least world_size")
    topo_args = _table(doc["topology"], "[topology]", _TOPOLOGY_KEYS, source)
    if "world_size" not in topo_args:
        raise ArgumentError(f"{source}: [topology] has no world_size; expected the number of ranks")
    for cap in ("hbm_cap", "ddr_cap"):
        if cap in topo_args:
            topo_args = {**topo_args, cap: _bytes(topo_args[cap], f"[topology] {cap}", source)}
    topology = Topology(**topo_args)
    raw_options = doc.get("options", [])
    if not isinstance(raw_options, list):
        raise ArgumentError(f"{source}: options is {type(raw_options).__name__}; expected a list of tables")
    options = [_option(o, i, source) for i, o in enumerate(raw_options)]
    shape, names = None, None
    if "job" in doc:
        job = dict(
            _table(
                doc["job"], "[job]", {f.name for f in dataclasses.fields(JobShape)} | {"node_names"}, source
            )
        )
        names = job.pop("node_names", None)
        shape = JobShape(**job)
    planner = _table(doc.get("planner", {}), "[planner]", {"sort_by"}, source)
    sort_by = planner.get("sort_by", "storage")
    if sort_by not in SORT_BY:
        raise ArgumentError(f"{source}: [planner] sort_by is {sort_by!r}; expected one of {list(SORT_BY)}")
    return Spec(topology, options, shape, names, sort_by)


def _read_toml(path: Path) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[import-not-found, no-redef, unused-ignore]
        except ImportError:
            raise ArgumentError(
                f"load_spec: {path} is TOML, which needs Python 3.11 or the tomli package; "
                "pip install tomli, or write the spec as JSON"
            ) from None
    with path.open("rb") as f:
        return tomllib.load(f)


def load_spec(path: str | Path) -> Spec:
    """Read a spec from a ``.toml`` or ``.json`` file (see :func:`parse_spec` for the format).

    Raises:
        ArgumentError: the file is missing, not valid TOML/JSON, or not a valid spec.
    """
    p = Path(path)
    if not p.is_file():
        raise ArgumentError(f"load_spec: {p} does not exist; expected a .toml or .json spec file")
    try:
        data = json.loads(p.read_text()) if p.suffix == ".json" else _read_toml(p)
    except ValueError as exc:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        if isinstance(exc, ArgumentError):
            raise
        raise ArgumentError(f"load_spec: {p} is not valid {p.suffix[1:] or 'TOML'}: {exc}") from None
    return parse_spec(data, str(p))


def _perf_json(perf: Perf) -> float | dict[str, float]:
    parts = dataclasses.asdict(perf)
    return perf.fwd_compute if all(v == 0 for k, v in parts.items() if k != "fwd_compute") else parts


def plan_to_dict(plan: Plan, layout: RankLayout) -> dict[str, Any]:
    """The JSON form of a plan and the layout it runs on."""
    t = plan.topology
    return {
        "format": PLAN_FORMAT,
        "topology": {
            "world_size": t.world_size,
            "local_world_size": t.local_world_size,
            "hbm_cap": t.hbm_cap,
            "ddr_cap": t.ddr_cap,
            "compute_device": t.compute_device,
        },
        "job": layout.to_dict(),
        "options": [
            {
                "name": o.name,
                "partition_by": o.partition_by,
                "dependency": o.dependency,
                "within_host": o.within_host,
                "shards": [
                    {
                        "rank": s.rank,
                        "hbm": s.storage.hbm,
                        "ddr": s.storage.ddr,
                        "perf": _perf_json(s.perf),
                        **({"size": s.size} if s.size is not None else {}),
                        **({"offset": s.offset} if s.offset is not None else {}),
                    }
                    for s in o.shards
                ],
            }
            for o in plan.options
        ],
        "devices": [
            {
                "rank": d.rank,
                "used": {"hbm": d.used.hbm, "ddr": d.used.ddr},
                "capacity": {"hbm": d.capacity.hbm, "ddr": d.capacity.ddr},
                "perf": d.perf.total,
            }
            for d in plan.devices
        ],
    }


def save_plan(path: str | Path, plan: Plan, layout: RankLayout) -> None:
    """Write :func:`plan_to_dict` as indented JSON, ending in a newline."""
    Path(path).write_text(json.dumps(plan_to_dict(plan, layout), indent=1) + "\n")


def load_plan(path: str | Path) -> tuple[Plan, RankLayout]:
    """Read a plan written by :func:`save_plan`; each rank's load is recomputed from its shards.

    Raises:
        ArgumentError: the file is not a plan, or a shard has no valid rank.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"load_plan: cannot read {p}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise ArgumentError(
            f'load_plan: {p} has no "format": {PLAN_FORMAT!r}; expected a plan written by mpicomm.plan'
        )
    topology = Topology(**_table(data["topology"], "topology", _TOPOLOGY_KEYS, str(p)))
    options = []
    for i, o in enumerate(data["options"]):
        raw = {k: v for k, v in o.items() if v is not None}
        options.append(_option(raw, i, str(p)))
    loads = _loads(topology, options, str(p))
    return Plan(topology, options, loads), RankLayout.from_dict(data["job"])


def _loads(topology: Topology, options: list[ShardingOption], source: str) -> list[DeviceLoad]:
    used = [Storage() for _ in range(topology.world_size)]
    perf = [Perf() for _ in range(topology.world_size)]
    for o in options:
        for j, s in enumerate(o.shards):
            if not isinstance(s.rank, int) or not 0 <= s.rank < topology.world_size:
                raise ArgumentError(
                    f"{source}: option {o.name!r} shard {j} has rank {s.rank!r}; expected a planned rank"
                )
            used[s.rank] = used[s.rank] + s.storage
            perf[s.rank] = perf[s.rank] + s.perf
    return [DeviceLoad(r, d.storage, used[r], perf[r]) for r, d in enumerate(topology.devices)]
