"""torch's ``DeviceMesh`` on MPI: an n-dimensional grid of world ranks with one group per dimension.

``init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))`` lays the world out row-major, as
torch does, and makes each dimension's groups with one ``MPI_Comm_split`` of the world (torch makes one
group per line of the grid). Slicing (``mesh["tp"]``, ``mesh["dp", "tp"]``) makes no communicator: a
sub-mesh keeps its parent's groups. :meth:`DeviceMesh._flatten` makes one more split.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _mpi
from ..errors import ArgumentError, ArgumentTypeError
from . import validation, watchdog
from .backend import backend_name
from .groups import ProcessGroup, get_rank, register, resolve

__all__ = ["DeviceMesh", "init_device_mesh"]

_SITE = watchdog.Site("DeviceMesh")


class DeviceMesh:
    """An n-dimensional grid of world ranks with one process group per dimension (torch's ``DeviceMesh``).

    Every world rank makes it together, with the same ``mesh``. A rank's group along dimension ``d``
    holds the ranks that share its coordinates in every other dimension; its group ranks follow the
    sorted world ranks, as torch's groups do. A rank outside ``mesh`` gets ``None`` from
    :meth:`get_coordinate` and non-member groups.

    Args:
        device_type: ``"cpu"``, ``"cuda"``, ...; kept for :attr:`device_type` (every array kind goes
            through every group). A device index (``"cuda:0"``) is refused, as torch refuses it.
        mesh: World ranks, any shape (a numpy array, nested lists or a CPU tensor), each at most once.
        mesh_dim_names: One distinct name per dimension, for slicing and for naming dimensions.
        backend_override: ``{dimension index or name: backend name}``: the name that dimension's
            groups keep (:func:`~mpicomm.get_backend`); every one runs on MPI.

    Raises:
        ArgumentTypeError: ``mesh`` holds something other than integers, or a name is not a str.
        ArgumentError: a rank out of range or listed twice, an empty mesh, names that do not fit.
        CrossRankMismatchError: (validation mode) ranks passed different meshes or names.

    Example:
        >>> import numpy as np, mpicomm
        >>> w = mpicomm.get_world_size()
        >>> mesh = mpicomm.DeviceMesh("cpu", np.arange(w).reshape(1, w), mesh_dim_names=("dp", "tp"))
        >>> mesh.get_coordinate() == (0, mpicomm.get_rank()), mesh["tp"].size() == w
        (True, True)
    """

    __slots__ = ("_coordinate", "_device_type", "_flat", "_groups", "_mesh", "_names")

    def __init__(
        self,
        device_type: str,
        mesh: Any,
        *,
        mesh_dim_names: tuple[str, ...] | None = None,
        backend_override: dict[int | str, str] | None = None,
    ) -> None:
        fn = "DeviceMesh"
        world = resolve(None, fn)
        try:
            _check_device_type(device_type, fn)
            grid = _check_mesh(mesh, world.size(), fn)
            names = _check_names(mesh_dim_names, grid.ndim, fn)
            labels = _labels(backend_override, names, grid.ndim, world.backend, fn)
        except (ArgumentError, ArgumentTypeError) as exc:
            if validation._Flag.on:  # wrong on some ranks only: raise it on every rank together
                validation.report(world, fn, exc)
            raise
        if validation._Flag.on:
            validation.check(world, fn, {"mesh": grid.tolist(), "mesh_dim_names": names})
        self._device_type = device_type
        self._mesh = grid
        self._names = names
        self._coordinate = _coordinate_of(grid, world.rank())
        self._flat: dict[str, DeviceMesh] = {}
        with watchdog.timing(_SITE):
            self._groups = [self._split(world, d, labels[d]) for d in range(grid.ndim)]

    def _split(self, world: ProcessGroup, dim: int, label: str) -> ProcessGroup:
        lines = np.moveaxis(self._mesh, dim, -1).reshape(-1, self._mesh.shape[dim])
        where = self._coordinate
        if where is None:
            comm = world.comm.Split(_mpi.MPI.UNDEFINED, world.rank())
            return register(comm, [], None, label, world.timeout)
        others = tuple(c for i, c in enumerate(where) if i != dim)
        line = int(np.ravel_multi_index(others, self._mesh.shape[:dim] + self._mesh.shape[dim + 1 :]))
        comm = world.comm.Split(line, world.rank())
        name = self._names[dim] if self._names else f"dim{dim}"
        return register(comm, sorted(lines[line].tolist()), f"mesh:{name}", label, world.timeout)

    @property
    def device_type(self) -> str:
        """The device type the mesh was made with."""
        return self._device_type

    @property
    def mesh(self) -> np.ndarray:
        """The grid of world ranks (a read-only numpy array; torch gives a tensor)."""
        return self._mesh

    @property
    def mesh_dim_names(self) -> tuple[str, ...] | None:
        """The dimensions' names, or None."""
        return self._names

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return int(self._mesh.ndim)

    @property
    def shape(self) -> tuple[int, ...]:
        """The grid's shape."""
        return tuple(int(n) for n in self._mesh.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        """The number of ranks in the mesh, or along ``mesh_dim``."""
        if mesh_dim is None:
            return int(self._mesh.size)
        return self.shape[self._dim(mesh_dim, "size")]

    def get_rank(self) -> int:
        """This process's world rank."""
        return get_rank()

    def get_coordinate(self) -> tuple[int, ...] | None:
        """This rank's coordinates in the grid, or None where it is not in the mesh."""
        return self._coordinate

    def get_group(self, mesh_dim: int | str | None = None) -> ProcessGroup:
        """This rank's group along ``mesh_dim`` (optional on a 1-D mesh).

        Raises:
            ArgumentError: no ``mesh_dim`` on a mesh of more than one dimension, or an unknown one.
        """
        return self._groups[self._dim(mesh_dim, "get_group")]

    def get_all_groups(self) -> list[ProcessGroup]:
        """This rank's group along every dimension, in order."""
        return list(self._groups)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's rank in its group along ``mesh_dim`` (optional on a 1-D mesh); -1 outside the mesh."""
        return self._groups[self._dim(mesh_dim, "get_local_rank")].rank()

    def __getitem__(self, mesh_dim_names: str | tuple[str, ...]) -> DeviceMesh:
        """The sub-mesh of the named dimensions that holds this rank, in the order named; no communication.

        A name made by :meth:`_flatten` gives that flattened mesh.

        Raises:
            ArgumentError: the mesh has no names, or a name is unknown or given twice.
        """
        fn = "DeviceMesh.__getitem__"
        wanted = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else mesh_dim_names
        if isinstance(mesh_dim_names, str) and mesh_dim_names in self._flat:
            return self._flat[mesh_dim_names]
        if not self._names:
            raise ArgumentError(f"{fn}: the mesh has no mesh_dim_names; expected a mesh made with names")
        if not isinstance(wanted, tuple) or not wanted or len(set(wanted)) != len(wanted):
            raise ArgumentError(
                f"{fn}: mesh_dim_names is {mesh_dim_names!r}; expected a name or a tuple of distinct "
                f"names of {self._names}"
            )
        dims = [self._dim(name, "__getitem__") for name in wanted]
        at = self._coordinate or (0,) * self.ndim
        index = tuple(slice(None) if d in dims else at[d] for d in range(self.ndim))
        kept = sorted(dims)
        grid = np.transpose(self._mesh[index], [kept.index(d) for d in dims])
        return _view(self, grid, tuple(wanted), [self._groups[d] for d in dims])

    def _flatten(self, mesh_dim_name: str | None = None) -> DeviceMesh:
        """A 1-D mesh of this mesh's ranks, row-major, with its own group (torch's ``_flatten``).

        Every world rank calls it (one ``MPI_Comm_split`` of the world). ``mesh_dim_name`` (default:
        the names joined by ``_``) names it, and slicing with that name gives it back.

        Raises:
            ArgumentTypeError: ``mesh_dim_name`` is not a str.
        """
        fn = "DeviceMesh._flatten"
        if mesh_dim_name is None:
            mesh_dim_name = "_".join(self._names) if self._names else "flat"
        if not isinstance(mesh_dim_name, str):
            raise ArgumentTypeError(f"{fn}: mesh_dim_name is {mesh_dim_name!r}; expected a str or None")
        if mesh_dim_name in self._flat:
            return self._flat[mesh_dim_name]
        world = resolve(None, fn)
        ranks = self._mesh.ravel()
        member = self._coordinate is not None
        with watchdog.timing(_SITE):
            # the smallest rank names this mesh among the meshes that other ranks flatten now
            comm = world.comm.Split(int(ranks.min()) if member else _mpi.MPI.UNDEFINED, world.rank())
        label = self._groups[0].backend if self._groups else world.backend
        group = register(comm, sorted(ranks.tolist()) if member else [], f"mesh:{mesh_dim_name}", label, None)
        flat = _view(self, ranks.copy(), (mesh_dim_name,), [group])
        self._flat[mesh_dim_name] = flat
        return flat

    def _dim(self, mesh_dim: int | str | None, fn: str) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise ArgumentError(
                    f"DeviceMesh.{fn}: mesh_dim is None on a {self.ndim}-D mesh; expected a dimension "
                    f"(an index or one of {self._names})"
                )
            return 0
        if isinstance(mesh_dim, str):
            if self._names is None or mesh_dim not in self._names:
                raise ArgumentError(
                    f"DeviceMesh.{fn}: mesh_dim is {mesh_dim!r}; expected one of "
                    f"{self._names or '(no names: use an index)'}"
                )
            return self._names.index(mesh_dim)
        if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, (int, np.integer)):
            raise ArgumentTypeError(f"DeviceMesh.{fn}: mesh_dim is {mesh_dim!r}; expected an int or a name")
        if not -self.ndim <= mesh_dim < self.ndim:
            raise ArgumentError(
                f"DeviceMesh.{fn}: mesh_dim is {mesh_dim}; expected -{self.ndim} <= mesh_dim < {self.ndim}"
            )
        return int(mesh_dim) % self.ndim

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self._names}" if self._names else ""
        return f"DeviceMesh({self._device_type!r}, {self._mesh.tolist()}{names})"


def _view(parent: DeviceMesh, grid: Any, names: tuple[str, ...], groups: list[ProcessGroup]) -> DeviceMesh:
    sub = DeviceMesh.__new__(DeviceMesh)
    sub._device_type = parent.device_type
    sub._mesh = np.array(grid, np.int64)
    sub._mesh.flags.writeable = False
    sub._names = names
    sub._coordinate = _coordinate_of(sub._mesh, get_rank())
    sub._groups = groups
    sub._flat = parent._flat  # one table for the mesh and its slices: root[name] finds a flattened slice
    return sub


def init_device_mesh(
    device_type: str,
    mesh_shape: tuple[int, ...],
    *,
    mesh_dim_names: tuple[str, ...] | None = None,
    backend_override: dict[int | str, str] | None = None,
) -> DeviceMesh:
    """Lay the world out as a grid of ``mesh_shape``, row-major, as torch's ``init_device_mesh`` does.

    Every world rank calls it with the same arguments; the first call starts MPI if needed.

    Args:
        device_type: ``"cpu"``, ``"cuda"``, ... (see :class:`DeviceMesh`).
        mesh_shape: Positive ints whose product is the world size.
        mesh_dim_names: One distinct name per dimension.
        backend_override: ``{dimension: backend name}`` (see :class:`DeviceMesh`).

    Returns:
        The mesh.

    Raises:
        ArgumentTypeError: ``mesh_shape`` is not a tuple of ints.
        ArgumentError: its product is not the world size, or the names do not fit.

    Example:
        >>> import mpicomm
        >>> w = mpicomm.get_world_size()
        >>> mesh = mpicomm.init_device_mesh("cpu", (w, 1), mesh_dim_names=("dp", "tp"))
        >>> mesh.shape == (w, 1), mesh.get_local_rank("dp") == mpicomm.get_rank()
        (True, True)
    """
    fn = "init_device_mesh"
    world = resolve(None, fn)
    try:
        shape = _check_shape(mesh_shape, world.size(), fn)
    except (ArgumentError, ArgumentTypeError) as exc:
        if validation._Flag.on:  # wrong on some ranks only: raise it on every rank together
            validation.report(world, fn, exc)
        raise
    grid = np.arange(world.size(), dtype=np.int64).reshape(shape)
    return DeviceMesh(device_type, grid, mesh_dim_names=mesh_dim_names, backend_override=backend_override)


def _check_shape(mesh_shape: object, size: int, fn: str) -> tuple[int, ...]:
    shape = tuple(mesh_shape) if isinstance(mesh_shape, (tuple, list)) else ()
    if not shape or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) for n in shape):
        raise ArgumentTypeError(f"{fn}: mesh_shape is {mesh_shape!r}; expected a tuple of ints")
    if any(n < 1 for n in shape) or math.prod(shape) != size:
        raise ArgumentError(
            f"{fn}: mesh_shape is {mesh_shape!r}; expected positive sizes whose product is the world "
            f"size {size}"
        )
    return tuple(int(n) for n in shape)


def _check_device_type(device_type: object, fn: str) -> None:
    if not isinstance(device_type, str) or not device_type:
        raise ArgumentTypeError(
            f"{fn}: device_type is {device_type!r}; expected a str such as 'cpu' or 'cuda'"
        )
    if ":" in device_type:
        raise ArgumentError(
            f"{fn}: device_type is {device_type!r}; expected a device type without an index, such as "
            "'cuda' (torch refuses an index too)"
        )


def _check_mesh(mesh: object, size: int, fn: str) -> np.ndarray:
    try:
        raw = np.asarray(mesh)
    except (TypeError, ValueError, RuntimeError):
        raw = np.asarray(None)
    if raw.dtype.kind not in "iu" or raw.ndim == 0:
        raise ArgumentTypeError(f"{fn}: mesh is {mesh!r}; expected an array of world ranks (integers)")
    grid = raw.astype(np.int64)
    flat = grid.ravel()
    if flat.size == 0:
        raise ArgumentError(f"{fn}: mesh is empty; expected at least one rank")
    bad = flat[(flat < 0) | (flat >= size)]
    if bad.size:
        raise ArgumentError(f"{fn}: mesh has rank {int(bad[0])}; expected world ranks 0 <= rank < {size}")
    if np.unique(flat).size != flat.size:
        raise ArgumentError(f"{fn}: mesh lists a rank twice; expected each world rank at most once")
    grid.flags.writeable = False
    return grid


def _check_names(names: object, ndim: int, fn: str) -> tuple[str, ...] | None:
    if names is None:
        return None
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
        raise ArgumentTypeError(f"{fn}: mesh_dim_names is {names!r}; expected a tuple of str")
    if len(names) != ndim or len(set(names)) != ndim:
        raise ArgumentError(
            f"{fn}: mesh_dim_names is {names!r}; expected {ndim} distinct names, one per mesh dimension"
        )
    return tuple(names)


def _labels(override: object, names: tuple[str, ...] | None, ndim: int, default: str, fn: str) -> list[str]:
    labels = [default] * ndim
    if override is None:
        return labels
    if not isinstance(override, dict):
        raise ArgumentTypeError(f"{fn}: backend_override is {override!r}; expected a dict or None")
    for key, value in override.items():
        if isinstance(key, str) and names is not None and key in names:
            d = names.index(key)
        elif isinstance(key, int) and not isinstance(key, bool) and -ndim <= key < ndim:
            d = key % ndim
        else:
            raise ArgumentError(
                f"{fn}: backend_override has key {key!r}; expected a dimension index or one of {names}"
            )
        labels[d] = backend_name(value, fn, default)
    return labels


def _coordinate_of(grid: np.ndarray, rank: int) -> tuple[int, ...] | None:
    where = np.argwhere(grid == rank)
    return tuple(int(c) for c in where[0]) if len(where) else None
