"""The package layout: one folder per concept, imports that point one way, small modules, old names kept.

These read the source (ast) and import modules; they need no MPI.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

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
    "c10d": {"front", "dense", "objects", "core"},  # the torch room: the front door and below
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


def test_no_module_is_over_600_lines() -> None:
    files = [*SOURCES, *PACKAGE.rglob("*.c"), *PACKAGE.rglob("*.h")]  # the C extension's too
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
    graph = {m: {d for d in ds if d in graph and not m.startswith(d + ".")} for m, ds in graph.items()}
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
