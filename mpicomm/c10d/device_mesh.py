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
from ..core import validation, watchdog
from ..core.groups import ProcessGroup, get_rank, register, resolve
from ..errors import ArgumentError, ArgumentTypeError
from .backend_names import backend_name

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
        CrossRankMismatchError: ranks passed different meshes or names (checked with validation off too).

    Example:
        >>> import numpy as np, mpicomm
        >>> w = mpicomm.get_world_size()
        >>> mesh = mpicomm.DeviceMesh("cpu", np.arange(w).reshape(1, w), mesh_dim_names=("dp", "tp"))
        >>> mesh.get_coordinate() == (0, mpicomm.get_rank()), mesh["tp"].size() == w
        (True, True)
    """

    # _root: the mesh this one was sliced or flattened from (itself for a made mesh); _axes: the root
    # dimensions behind each of this mesh's dimensions (several for a flattened one); _flat: on the
    # root, name -> (root dimensions, this rank's flattened mesh)
    __slots__ = ("_axes", "_coordinate", "_device_type", "_flat", "_groups", "_mesh", "_names", "_root")

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
        with watchdog.timing(_SITE):
            with validation.reporting(world, fn, always=True):
                _check_device_type(device_type, fn)
                grid = _check_mesh(mesh, world.size(), fn)
                names = _check_names(mesh_dim_names, grid.ndim, fn)
                labels = _labels(backend_override, names, grid.ndim, world.backend, fn)
            # always (issue 34): ranks with other grids would get groups of other ranks
            validation.agree(
                world, fn, {"mesh": validation.fingerprint(grid.tolist()), "mesh_dim_names": names}
            )
            self._fill(device_type, grid, names)
            self._groups = [self._split(world, d, labels[d]) for d in range(grid.ndim)]

    def _fill(self, device_type: str, grid: np.ndarray, names: tuple[str, ...] | None) -> None:
        self._device_type = device_type
        self._mesh = grid
        self._names = names
        self._coordinate = _coordinate_of(grid, get_rank())
        self._root = self
        self._axes: list[tuple[int, ...]] = [(d,) for d in range(grid.ndim)]
        self._flat: dict[str, tuple[tuple[int, ...], DeviceMesh]] = {}

    @staticmethod
    def from_group(
        group: ProcessGroup | list[ProcessGroup],
        device_type: str,
        mesh: Any = None,
        *,
        mesh_dim_names: tuple[str, ...] | None = None,
    ) -> DeviceMesh:
        """A mesh over groups you already have, one per dimension (torch's ``DeviceMesh.from_group``).

        No communication: the groups become the mesh's dimension groups. One group gives a 1-D mesh
        of its ranks; a list needs ``mesh`` (world ranks, one dimension per group) and
        ``mesh_dim_names``, and each group must be this rank's line of ``mesh`` along its dimension.

        Args:
            group: A group, or a list of groups (one per dimension).
            device_type: As for :class:`DeviceMesh`.
            mesh: The grid; for one group, its ranks if given.
            mesh_dim_names: One distinct name per dimension.

        :meth:`_flatten` on such a mesh is still a collective over the world.

        Raises:
            ArgumentTypeError: ``group`` is not a group or a list of them (``None`` included).
            ArgumentError: ``mesh`` does not match the groups, or a missing ``mesh`` or names.
            GroupError: a group was destroyed.

        Example:
            >>> import mpicomm
            >>> mesh = mpicomm.DeviceMesh.from_group(mpicomm.init(), "cpu", mesh_dim_names=("dp",))
            >>> mesh.get_group("dp") is mpicomm.init()
            True
        """
        fn = "DeviceMesh.from_group"
        single = not isinstance(group, (list, tuple))
        given: list[Any] = [group] if single else list(group)  # type: ignore[arg-type]
        if any(g is None for g in given):  # resolve() would take None for the world
            raise ArgumentTypeError(
                f"{fn}: group is {group!r}; expected a mpicomm.ProcessGroup or a list of them (a rank "
                "that split_group left out has no group to wrap)"
            )
        groups = [resolve(g, fn) for g in given]
        world = resolve(None, fn)
        _check_device_type(device_type, fn)
        if single:
            if mesh is not None:
                given_grid = _check_mesh(mesh, world.size(), fn)
                if given_grid.ndim != 1 or given_grid.tolist() != groups[0].ranks:
                    raise ArgumentError(
                        f"{fn}: mesh is {mesh!r}; expected the group's world ranks {groups[0].ranks} or None"
                    )
            mesh = groups[0].ranks
        elif not groups or mesh is None or mesh_dim_names is None:
            raise ArgumentError(
                f"{fn}: group is a list of {len(groups)} groups with mesh={mesh!r} and mesh_dim_names="
                f"{mesh_dim_names!r}; expected at least one group, and a mesh and names for a list"
            )
        grid = _check_mesh(mesh, world.size(), fn)
        if grid.ndim != len(groups):
            raise ArgumentError(
                f"{fn}: mesh has {grid.ndim} dimensions; expected one per group ({len(groups)})"
            )
        names = _check_names(mesh_dim_names, grid.ndim, fn)
        out = DeviceMesh.__new__(DeviceMesh)
        out._fill(device_type, grid, names)
        where = out._coordinate
        for d, g in enumerate(groups):
            line = None if where is None else _line(grid, where, d)
            if line is not None and g.ranks != line:
                raise ArgumentError(
                    f"{fn}: group[{d}] holds world ranks {g.ranks}; expected this rank's line of mesh along "
                    f"dimension {d}, world ranks {line}"
                )
        out._groups = groups
        return out

    def _split(self, world: ProcessGroup, dim: int, label: str) -> ProcessGroup:
        where = self._coordinate
        if where is None:
            comm = world.comm.Split(_mpi.MPI.UNDEFINED, world.rank())
            return register(comm, [], None, label, world.timeout)
        members = _line(self._mesh, where, dim)
        comm = world.comm.Split(members[0], world.rank())  # the line's smallest rank names it
        name = self._names[dim] if self._names else f"dim{dim}"
        return register(comm, members, f"mesh:{name}", label, world.timeout)

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
        """The number of ranks in the mesh, or along ``mesh_dim`` (an index or a name).

        Example:
            >>> import mpicomm
            >>> mpicomm.init_device_mesh("cpu", (mpicomm.get_world_size(), 1)).size(1)
            1
        """
        if mesh_dim is None:
            return int(self._mesh.size)
        dims, _ = self._resolve(mesh_dim, "size")
        return math.prod(self._root._mesh.shape[d] for d in dims)

    def get_rank(self) -> int:
        """This process's world rank."""
        return get_rank()

    def get_coordinate(self) -> tuple[int, ...] | None:
        """This rank's coordinates in the grid, or None where it is not in the mesh."""
        return self._coordinate

    def get_group(self, mesh_dim: int | str | None = None) -> ProcessGroup:
        """This rank's group along ``mesh_dim`` (optional on a 1-D mesh).

        ``mesh_dim`` is an index, a name, or, on a mesh that was not sliced, a name given to
        :meth:`_flatten`.

        Raises:
            ArgumentError: no ``mesh_dim`` on a mesh of more than one dimension, or an unknown one.

        Example:
            >>> import mpicomm
            >>> w = mpicomm.get_world_size()
            >>> mesh = mpicomm.init_device_mesh("cpu", (1, w), mesh_dim_names=("dp", "tp"))
            >>> mesh.get_group("tp").ranks == list(range(mpicomm.get_world_size()))
            True
        """
        return self._resolve(mesh_dim, "get_group")[1]

    def get_all_groups(self) -> list[ProcessGroup]:
        """This rank's group along every dimension, in order."""
        return list(self._groups)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's rank in its group along ``mesh_dim`` (as :meth:`get_group` takes it); -1 outside.

        Example:
            >>> import mpicomm
            >>> mesh = mpicomm.init_device_mesh("cpu", (mpicomm.get_world_size(),))
            >>> mesh.get_local_rank() == mpicomm.get_rank()
            True
        """
        return self._resolve(mesh_dim, "get_local_rank")[1].rank()

    def __getitem__(self, mesh_dim_names: str | tuple[str, ...]) -> DeviceMesh:
        """The sub-mesh of the named dimensions that holds this rank, in the order named; no communication.

        On the mesh :func:`init_device_mesh` made, a name given to :meth:`_flatten` stands for the
        dimensions it flattened (``mesh["dp_cp", "tp"]``). An order other than the mesh's gives the
        transposed sub-mesh (torch 2.13 refuses it).

        Raises:
            ArgumentError: the mesh has no names, or a name is unknown, or two name a dimension twice.

        Example:
            >>> import mpicomm
            >>> w = mpicomm.get_world_size()
            >>> mesh = mpicomm.init_device_mesh("cpu", (1, w), mesh_dim_names=("dp", "tp"))
            >>> mesh["tp"].mesh.tolist() == list(range(mpicomm.get_world_size()))
            True
        """
        fn = "__getitem__"
        wanted = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else mesh_dim_names
        if not self._names:
            raise ArgumentError(
                f"DeviceMesh.{fn}: the mesh has no mesh_dim_names; expected a mesh made with names"
            )
        if not isinstance(wanted, tuple) or not wanted or not all(isinstance(n, str) for n in wanted):
            raise ArgumentError(
                f"DeviceMesh.{fn}: mesh_dim_names is {mesh_dim_names!r}; expected a name or a tuple of "
                f"names of {self._names}"
            )
        if wanted == self._names:
            return self
        if (
            len(wanted) == 1
            and self._root is self
            and wanted[0] not in self._names
            and wanted[0] in self._flat
        ):
            return self._flat[wanted[0]][1]
        found = [self._resolve(name, fn) for name in wanted]
        dims = [d for each, _ in found for d in each]
        if len(set(dims)) != len(dims):
            raise ArgumentError(
                f"DeviceMesh.{fn}: mesh_dim_names is {mesh_dim_names!r}, which names a dimension twice; "
                "expected distinct dimensions"
            )
        return _view(self._root, [each for each, _ in found], tuple(wanted), [g for _, g in found])

    def _flatten(self, mesh_dim_name: str | None = None) -> DeviceMesh:
        """A 1-D mesh of this mesh's ranks, row-major, with its own group (torch's ``_flatten``).

        Every world rank calls it (one ``MPI_Comm_split`` of the world). ``mesh_dim_name`` (default:
        the names joined by ``_``) names it on the root mesh: ``root[name]``, ``root.get_group(name)``.
        The same name and dimensions again give the same mesh; a 1-D mesh flattened under its own
        name is itself.

        Raises:
            ArgumentTypeError: ``mesh_dim_name`` is not a str.
            ArgumentError: the mesh has no names, or the name is a dimension's or flattens others.
            CrossRankMismatchError: ranks passed different names (checked with validation off too).

        Example:
            >>> import mpicomm
            >>> w = mpicomm.get_world_size()
            >>> mesh = mpicomm.init_device_mesh("cpu", (1, w), mesh_dim_names=("dp", "tp"))
            >>> flat = mesh._flatten()
            >>> flat is mesh["dp_tp"], flat.get_group().size() == mpicomm.get_world_size()
            (True, True)
        """
        fn = "DeviceMesh._flatten"
        world = resolve(None, fn)
        root = self._root
        dims = tuple(d for each in self._axes for d in each)
        with watchdog.timing(_SITE):
            with validation.reporting(world, fn, always=True):
                name = self._flat_name(mesh_dim_name, dims, fn)
            mesh = validation.fingerprint(root._mesh.tolist())
            validation.agree(world, fn, {"mesh_dim_name": name, "dims": list(dims), "mesh": mesh})  # issue 34
            if self.ndim == 1 and self._names and name == self._names[0]:
                return self
            if name in root._flat:
                return root._flat[name][1]
            ranks = self._mesh.ravel()
            member = self._coordinate is not None
            # the smallest rank names this slice among the slices that other ranks flatten now
            comm = world.comm.Split(int(ranks.min()) if member else _mpi.MPI.UNDEFINED, world.rank())
            members = sorted(ranks.tolist()) if member else []
            group = register(comm, members, f"mesh:{name}", self._groups[0].backend, world.timeout)
        flat = _view(root, [dims], (name,), [group])
        root._flat[name] = (dims, flat)
        return flat

    def _flat_name(self, name: object, dims: tuple[int, ...], fn: str) -> str:
        if not self._names:
            raise ArgumentError(f"{fn}: the mesh has no mesh_dim_names; expected a mesh made with names")
        if name is None:
            name = "_".join(self._names)
        if not isinstance(name, str):
            raise ArgumentTypeError(f"{fn}: mesh_dim_name is {name!r}; expected a str or None")
        root = self._root
        own = self.ndim == 1 and name == self._names[0]
        if not own and root._names and name in root._names:
            raise ArgumentError(
                f"{fn}: mesh_dim_name is {name!r}, a dimension of the mesh; expected a new name"
            )
        if name in root._flat and root._flat[name][0] != dims:
            raise ArgumentError(
                f"{fn}: mesh_dim_name is {name!r}, which already flattens other dimensions of the mesh; "
                "expected a new name"
            )
        return name

    def _resolve(self, mesh_dim: int | str | None, fn: str) -> tuple[tuple[int, ...], ProcessGroup]:
        """The root dimensions and this rank's group behind ``mesh_dim``."""
        if mesh_dim is None:
            if self.ndim != 1:
                raise ArgumentError(
                    f"DeviceMesh.{fn}: mesh_dim is None on a {self.ndim}-D mesh; expected a dimension "
                    f"(an index or one of {self._names})"
                )
            return self._axes[0], self._groups[0]
        if isinstance(mesh_dim, str):
            if self._names and mesh_dim in self._names:
                i = self._names.index(mesh_dim)
                return self._axes[i], self._groups[i]
            if self._root is self and mesh_dim in self._flat:
                dims, flat = self._flat[mesh_dim]
                return dims, flat._groups[0]
            raise ArgumentError(
                f"DeviceMesh.{fn}: mesh_dim is {mesh_dim!r}; expected one of "
                f"{self._names or '(no names: use an index)'}"
            )
        if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, (int, np.integer)):
            raise ArgumentTypeError(f"DeviceMesh.{fn}: mesh_dim is {mesh_dim!r}; expected an int or a name")
        if not -self.ndim <= mesh_dim < self.ndim:
            raise ArgumentError(
                f"DeviceMesh.{fn}: mesh_dim is {mesh_dim}; expected -{self.ndim} <= mesh_dim < {self.ndim}"
            )
        i = int(mesh_dim) % self.ndim
        return self._axes[i], self._groups[i]

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self._names}" if self._names else ""
        return f"DeviceMesh({self._device_type!r}, {self._mesh.tolist()}{names})"


def _view(
    root: DeviceMesh, axes: list[tuple[int, ...]], names: tuple[str, ...], groups: list[ProcessGroup]
) -> DeviceMesh:
    """The mesh over ``axes`` (root dimensions each) that holds this rank; no communication."""
    used = [d for each in axes for d in each]
    others = [d for d in range(root.ndim) if d not in used]
    at = root._coordinate or (0,) * root.ndim  # a rank outside the mesh: the first slice
    moved = np.transpose(root._mesh, used + others)
    picked = moved[(slice(None),) * len(used) + tuple(at[d] for d in others)]
    sub = DeviceMesh.__new__(DeviceMesh)
    sub._device_type = root._device_type
    sub._mesh = np.array(picked.reshape([math.prod(root._mesh.shape[d] for d in each) for each in axes]))
    sub._mesh.flags.writeable = False
    sub._names = names
    sub._coordinate = _coordinate_of(sub._mesh, get_rank()) if root._coordinate is not None else None
    sub._groups = groups
    sub._root = root
    sub._axes = list(axes)
    sub._flat = {}
    return sub


@watchdog.timed(watchdog.Site("init_device_mesh"), None)
def init_device_mesh(
    device_type: str,
    mesh_shape: tuple[int, ...],
    *,
    mesh_dim_names: tuple[str, ...] | None = None,
    backend_override: dict[int | str, str] | None = None,
) -> DeviceMesh:
    """Lay the world out as a grid of ``mesh_shape``, row-major, as torch's ``init_device_mesh`` does.

    Every world rank calls it with the same arguments; the first call starts MPI if needed. Unlike
    torch's, ``device_type="cuda"`` does not pick this rank's GPU: call
    :func:`mpicomm.gpu.device.bind_device` first (node-local rank modulo the visible GPUs, as torch).

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
    with validation.reporting(world, fn, always=True):  # DeviceMesh's agreement meets it
        shape = _check_shape(mesh_shape, world.size(), fn)
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


def _line(grid: np.ndarray, coordinate: tuple[int, ...], dim: int) -> list[int]:
    """The world ranks that share ``coordinate`` in every dimension but ``dim``, sorted."""
    index = tuple(slice(None) if d == dim else c for d, c in enumerate(coordinate))
    return sorted(grid[index].tolist())


def _coordinate_of(grid: np.ndarray, rank: int) -> tuple[int, ...] | None:
    where = np.argwhere(grid == rank)
    return tuple(int(c) for c in where[0]) if len(where) else None
