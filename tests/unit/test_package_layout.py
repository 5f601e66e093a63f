"""The package layout: one folder per concept, imports that point one way, small modules, old names kept.

These read the source (ast) and import modules; they need no MPI.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import mpicomm
import mpicomm.planner

PACKAGE = Path(mpicomm.__file__).resolve().parent

#: What each folder may import inside mpicomm (besides itself, ``errors``, ``_mpi`` and ``sizes``).
#: Programs -> data paths -> core: an arrow never points back up.
ALLOWED = {
    "core": set(),
    "dense": {"core"},
    "jagged": {"core"},
    "objects": {"core", "dense"},
    "gpu": {"core", "dense"},
    "front": {"core", "dense", "jagged", "objects", "gpu"},
    "c10d": {"front", "dense", "objects", "core", "trace"},  # the torch room: the front door and below
    "trace": {"front", "core"},  # tracing (issue 43): wraps the front door's calls
    "planner": set(),
    "apps": {"*"},
}
SHARED = {"errors", "_mpi", "sizes"}
#: The planner's job-side check runs inside the MPI job and uses the public API, imported lazily.
EXCEPTIONS = {("mpicomm.planner.run_plan", "mpicomm")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of the mpicomm modules that ``path`` imports, at any depth of its code."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            if node.module:
                found.add(".".join([*base, node.module]))
            else:  # from .. import _mpi: the names are modules
                found.update(".".join([*base, a.name]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mpicomm"):
            found.add(str(node.module))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mpicomm"))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


#: Modules written by a generator, which is what a reader edits (and under 600 lines itself); a test
#: holds each to what its generator writes. front/_doors.py: one wrapper per public call, each read
#: alone (tests/unit/test_front_doors_generated.py, mpicomm/front/gen_doors.py).
GENERATED = {PACKAGE / "front" / "_doors.py"}


def test_no_module_is_over_600_lines() -> None:
    files = [*SOURCES, *PACKAGE.rglob("*.c"), *PACKAGE.rglob("*.h")]  # the C extensions' too
    files = [p for p in files if p not in GENERATED]
    long = {str(p.relative_to(PACKAGE)): n for p in files if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"modules over 600 lines: {long}"


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_a_folder_imports_only_the_layers_below_it(folder: str) -> None:
    allowed = ALLOWED[folder]
    bad = []
    for path in (PACKAGE / folder).rglob("*.py"):
        for target in _imports(path):
            parts = target.split(".")
            top = parts[1] if len(parts) > 1 else ""
            if top in (folder, *SHARED) or "*" in allowed or top in allowed:
                continue
            if (_module_name(path), target) in EXCEPTIONS:
                continue
            bad.append(f"{_module_name(path)} imports {target}")
    assert not bad, "\n".join(bad)


def test_every_folder_says_what_it_is_and_what_it_may_import() -> None:
    for folder in ALLOWED:
        doc = importlib.import_module(f"mpicomm.{folder}").__doc__ or ""
        assert len(doc) > 40, folder
        assert folder == "planner" or "import" in doc, f"mpicomm/{folder}/__init__.py: say what it may import"


def test_no_import_cycle_between_modules() -> None:
    """Module-level imports form no cycle (a package and its own submodules excepted)."""
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.parse(path.read_text()).body:  # top level only: TYPE_CHECKING blocks are ifs
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                deps.add(mod)
                deps.update(f"{mod}.{a.name}" for a in node.names)
        graph[name] = deps
    # (``from . import x`` in a package names the package itself: not an edge)
    graph = {
        m: {d for d in ds if d in graph and d != m and not m.startswith(d + ".")} for m, ds in graph.items()
    }
    _fail_on_cycle(graph)


def _fail_on_cycle(graph: dict[str, set[str]]) -> None:
    """Fail with the first import cycle a depth-first walk of ``graph`` (module -> imports) meets."""
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path[path.index(d) :], d]))
            if d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def _runtime_imports(path: Path) -> set[str]:
    """The mpicomm modules ``path`` imports when it runs, at any depth (``if TYPE_CHECKING:`` left out)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            mod = ".".join(base + ([node.module] if node.module else []))
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mpicomm"):
            found.add(str(node.module))
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mpicomm"))
    return found


def test_no_import_cycle_hidden_in_functions() -> None:
    """Imports at any depth (a function-level import too) form no cycle between folders' modules."""
    graph = {_module_name(p): _runtime_imports(p) for p in SOURCES}
    graph = {
        m: {d for d in ds if d in graph and not m.startswith(d + ".") and d != "mpicomm"}
        for m, ds in graph.items()
    }
    _fail_on_cycle(graph)


def test_the_public_array_calls_are_the_front_doors_and_none_is_defined_under_gpu() -> None:
    import inspect

    import mpicomm.front.collectives as front

    for name in front.__all__:
        assert getattr(mpicomm, name) is getattr(front, name), name
    for name in mpicomm.__all__:
        obj = getattr(mpicomm, name)
        if not callable(obj):
            continue
        assert not str(getattr(obj, "__module__", "")).startswith("mpicomm.gpu"), name
        target = inspect.unwrap(obj)  # a front door (a function, or its C form) to the function it wraps
        source = inspect.getsourcefile(target) or ""
        assert "/mpicomm/gpu/" not in source.replace("\\", "/"), f"{name} is defined in {source}"


#: Every name that ``mpicomm`` and ``mpicomm.planner`` exported before the layout change (issue 11),
#: and the entry modules users run with ``python -m``.
OLD_PUBLIC = [
    "ArgumentError",
    "ArgumentTypeError",
    "CommunicationError",
    "CrossRankMismatchError",
    "GroupError",
    "JaggedResult",
    "KJTAllToAll",
    "KJTAllToAllAwaitable",
    "KeyedJaggedArray",
    "MpicommError",
    "ObjectCollectiveError",
    "ProcessGroup",
    "ReduceOp",
    "ReductionTypeError",
    "UnpicklingRefusedError",
    "Work",
    "__version__",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "allow_unpickle",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_global_rank",
    "get_group_rank",
    "get_rank",
    "get_world_size",
    "init",
    "irecv",
    "is_initialized",
    "is_safe_unpickling",
    "is_validation_enabled",
    "isend",
    "jagged_all_to_all",
    "new_group",
    "new_node_group",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "set_safe_unpickling",
    "set_validation",
]


@pytest.mark.parametrize("name", OLD_PUBLIC)
def test_every_old_public_name_is_still_importable_from_mpicomm(name: str) -> None:
    assert hasattr(mpicomm, name)
    assert name in mpicomm.__all__


def test_every_old_planner_name_is_still_importable() -> None:
    for name in mpicomm.planner.__all__:
        assert hasattr(mpicomm.planner, name), name
    assert {"GreedyPerfPartitioner", "RankLayout", "render_sbatch"} <= set(mpicomm.planner.__all__)


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "mpicomm.jagged",
            ["JaggedResult", "KJTAllToAll", "KJTAllToAllAwaitable", "KeyedJaggedArray", "jagged_all_to_all"],
        ),
        ("mpicomm.objects", ["broadcast_object_list", "all_gather_object", "send_object_list"]),
        ("mpicomm.demo", ["main"]),
        ("mpicomm.plan", ["main"]),
        ("mpicomm.bench", ["main"]),
    ],
)
def test_old_module_paths_still_give_their_names(module: str, names: list[str]) -> None:
    mod = importlib.import_module(module)
    for name in names:
        assert callable(getattr(mod, name)), f"{module}.{name}"


# ------------------------------------------------------------------ run-time wiring (issue 40 item 4)
#
# Imports are not the only arrows: an upper layer can also plug into a lower one when it runs, by
# assigning into a lower layer's attribute, ``setattr`` on one of its classes, changing an object's
# ``__class__``, or calling a lower layer's plug point. Every such place is listed in
# ``mpicomm.wiring.PLUGS`` (with why it is not an argument); these find them in the source and
# compare. ``tests/unit/test_wiring.py`` imports each lower layer alone and checks it without them.


def _bound_names(path: Path, tree: ast.AST) -> dict[str, str]:
    """Names that the imports of ``path`` (at any depth) bind to mpicomm objects: name -> dotted name."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("mpicomm")):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = str(node.module)
            bound.update({a.asname or a.name: f"{mod}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("mpicomm"):
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else "mpicomm"
    return bound


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _folder(dotted: str) -> str:
    """The folder of an mpicomm name (``core``, ``front``, ...), or the top-level module's own name."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else ""


def _plugs_in(path: Path, source: str | None = None) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """The run-time plugs in ``path``'s source: ``(module, lower-layer name)`` pairs, in two sets.

    The first: assignments into another folder's attributes, ``setattr``/``delattr`` on its objects,
    and any ``__class__`` assignment. The second: calls into another folder (plugs where they call
    a plug point listed in ``PLUGS``, such as ``core.late.later``).
    """
    tree = ast.parse(path.read_text() if source is None else source)
    module, bound = _module_name(path), _bound_names(path, tree)
    mine = _folder(module) if path.name == "__init__.py" or module.count(".") > 1 else module

    def resolve(expr: ast.expr) -> str | None:
        chain = _chain(expr)
        if not chain or chain[0] not in bound:
            return None
        dotted = ".".join([bound[chain[0]], *chain[1:]])
        return dotted if _folder(dotted) != mine else None  # a plug comes from another folder

    sets, calls = set(), set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for tt in node.targets for t in (tt.elts if isinstance(tt, ast.Tuple) else [tt])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr == "__class__":
                sets.add((module, "__class__"))
            elif isinstance(t, ast.Attribute) and (dotted := resolve(t)):
                sets.add((module, dotted))
        if isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id in ("setattr", "delattr") and node.args:
                if dotted := resolve(node.args[0]):
                    sets.add((module, dotted))
            elif dotted := resolve(fn):
                calls.add((module, dotted))
    return sets, calls


def _is_class(dotted: str) -> bool:
    """Whether ``dotted`` (``mpicomm.core.groups.ProcessGroup``) names a class, not a context manager."""
    module, _, name = dotted.rpartition(".")
    found = getattr(importlib.import_module(module), name, None)
    return isinstance(found, type) and not hasattr(found, "__enter__")


def _listed(found: tuple[str, str], plugs: Iterable[Any]) -> bool:
    where, into = found
    return any(p.where == where and (into == p.into or into.startswith(p.into + ".")) for p in plugs)


def test_every_run_time_plug_into_a_lower_layer_is_listed_in_wiring() -> None:
    from mpicomm.wiring import PLUGS

    found: set[tuple[str, str]] = set()
    for path in SOURCES:
        sets, calls = _plugs_in(path)
        # a call of a plug point is a plug; a call of a class that is plugged into makes an instance
        # (a context manager's class, as chunks.answered, is a plug point: its block is the plug)
        found |= sets | {(w, i) for w, i in calls if any(i == p.into for p in PLUGS) and not _is_class(i)}
    unlisted = sorted(f"{w} sets or plugs into {i}" for w, i in found if not _listed((w, i), PLUGS))
    assert not unlisted, "run-time plugs not listed in mpicomm.wiring.PLUGS:\n" + "\n".join(unlisted)
    stale = [p for p in PLUGS if not any(_listed(f, [p]) for f in found)]
    assert not stale, f"mpicomm.wiring.PLUGS rows whose plug is no longer in the source (drop them): {stale}"


def test_the_wiring_check_finds_each_kind_of_plug() -> None:
    """The scan itself: an assignment, a setattr, a __class__ swap and a call, from another folder."""
    source = (
        "from ..objects.devbufs import Hooks\n"
        "from ..core import chunks, late\n"
        "def f(x):\n"
        "    Hooks.view = len\n"
        "    setattr(chunks.Setting, 'bytes', 1)\n"
        "    x.__class__ = int\n"
        "    late.later([], f)\n"
        "    from . import kinds\n"
        "    kinds.LIST = 1\n"  # the same folder: not a plug
    )
    sets, calls = _plugs_in(PACKAGE / "front" / "probe.py", source)  # as if it were front/probe.py
    name = "mpicomm.front.probe"
    assert sets == {
        (name, "mpicomm.objects.devbufs.Hooks.view"),
        (name, "mpicomm.core.chunks.Setting"),
        (name, "__class__"),
    }
    assert calls == {(name, "mpicomm.core.late.later")}
