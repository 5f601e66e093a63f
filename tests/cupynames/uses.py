"""Every cupy/cupyx name mpicomm uses, how it calls it, and the checks against a cupy package.

:data:`CALLS` lists each callable with the arguments mpicomm passes (placeholders of the right kind);
:data:`ATTRS` lists the attributes mpicomm reads on cupy objects. :func:`scan` finds every ``cupy.*``,
``cupyx.*`` (and ``cp.*``, ``self.cp.*``) chain in mpicomm's source with ``ast``, so that a new use
must be added here. :func:`problems` checks a cupy package (the real one in CI's cupy venv, where
cupy imports without a driver; the fake in the unit suite) and returns what is missing or does not
take the call.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[2] / "mpicomm"

#: name -> the calls mpicomm makes: (positional placeholders, keyword names).
CALLS: dict[str, list[tuple[int, tuple[str, ...]]]] = {
    "cupy.asarray": [(1, ())],
    "cupy.asnumpy": [(1, ())],
    "cupy.ascontiguousarray": [(1, ())],
    "cupy.empty": [(2, ())],
    "cupy.from_dlpack": [(1, ())],
    "cupy.cuda.Device": [(0, ()), (1, ())],
    "cupy.cuda.Stream": [(0, ("non_blocking",))],
    "cupy.cuda.get_current_stream": [(0, ())],
    "cupy.cuda.runtime.memcpyAsync": [(5, ())],
    "cupy.cuda.runtime.getDeviceCount": [(0, ())],
    "cupy.cuda.runtime.getDevice": [(0, ())],
    "cupy.cuda.PinnedMemory": [(1, ())],
    "cupy.cuda.PinnedMemoryPointer": [(2, ())],
    "cupy.ones": [(2, ())],
    "cupyx.empty_pinned": [(2, ())],
    "cupy.cuda.Event": [(0, ()), (0, ("disable_timing",))],
    "cupy.cuda.get_elapsed_time": [(2, ())],
    # the staged path's pooled events and foreign views (issue 35): raw runtime calls, no objects
    "cupy.cuda.runtime.eventRecord": [(2, ())],
    "cupy.cuda.runtime.streamWaitEvent": [(3, ())],
    "cupy.cuda.runtime.pointerGetAttributes": [(1, ())],
    "cupy.cuda.UnownedMemory": [(4, ())],
    "cupy.cuda.MemoryPointer": [(2, ())],
    "cupy.ndarray": [(4, ())],
}

#: Names mpicomm reads but does not call (modules, classes, constants).
NAMES = ("cupy.ndarray", "cupy.cuda", "cupy.cuda.runtime", "cupy.__version__")

#: class -> attributes and methods mpicomm uses on its instances (``ptr``: set in ``__init__``).
ATTRS: dict[str, tuple[str, ...]] = {
    "cupy.ndarray": (
        "data",
        "device",
        "flags",
        "shape",
        "dtype",
        "strides",
        "nbytes",
        "itemsize",
        "size",
        "reshape",
        "get",
        "__setitem__",
        "__getitem__",
        "__cuda_array_interface__",
    ),
    "cupy.cuda.MemoryPointer": ("ptr",),
    "cupy.cuda.Device": ("id", "use", "__enter__", "__exit__"),
    "cupy.cuda.Stream": ("record", "wait_event", "synchronize", "__enter__", "__exit__"),
    "cupy.cuda.Event": ("synchronize", "done", "record"),
}

#: Instance attributes a class sets in ``__init__`` (not visible on the class): checked in the docs.
INSTANCE_ATTRS = {"cupy.cuda.Stream": ("ptr",), "cupy.cuda.Event": ("ptr",)}

_ROOTS = {"cupy": "cupy", "cupyx": "cupyx", "cp": "cupy"}  # cp: what mpicomm calls the module


def _imported(node: ast.AST) -> str | None:
    """The module of an ``importlib.import_module("cupy...")`` call, else None."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "import_module" and str(node.args[0].value).startswith("cupy"):
            return str(node.args[0].value)
    return None


def _chain(node: ast.AST, roots: dict[str, str]) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    module = _imported(node)
    if module is not None:
        return [*module.split("."), *parts[::-1]]
    if isinstance(node, ast.Name):
        parts.append(node.id)
        out = parts[::-1]
        if out[0] in roots:
            out = [*roots[out[0]].split("."), *out[1:]]
        return out
    return None


def scan() -> set[str]:
    """The dotted cupy names in mpicomm's code (``cp`` and ``self.cp`` read as ``cupy``)."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        roots = dict(_ROOTS)
        for node in ast.walk(tree):  # names bound to import_module("cupy..."): cuda = ...("cupy.cuda")
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and _imported(node.value) is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                roots.update({t.id: str(_imported(node.value)) for t in targets if isinstance(t, ast.Name)})
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            parts = _chain(node, roots)
            if not parts:
                continue
            if parts[:2] == ["self", "cp"]:
                parts = ["cupy", *parts[2:]]
            if parts[0] in ("cupy", "cupyx") and len(parts) > 1:
                found.add(".".join(parts))
    return {name for name in found if not _is_prefix(name, found)}


def _is_prefix(name: str, names: set[str]) -> bool:
    return any(other.startswith(name + ".") for other in names)


def resolve(name: str) -> Any:
    """The object a dotted cupy name stands for (imports the package)."""
    parts = name.split(".")
    obj: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[: i + 1]))
    return obj


def signature(obj: Any) -> inspect.Signature:
    """``inspect.signature``, or the one Cython writes on the docstring's first line."""
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        pass
    first = (obj.__doc__ or "").strip().splitlines()[0]
    inside = first[first.index("(") + 1 : first.rindex(")")]
    params: list[inspect.Parameter] = []
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    for raw in [p.strip() for p in inside.split(",") if p.strip()]:
        if raw == "*":
            kind = inspect.Parameter.KEYWORD_ONLY
            continue
        head, _, default = raw.partition("=")
        pname = head.split()[-1].lstrip("*")
        if pname == "self":
            continue
        params.append(inspect.Parameter(pname, kind, default=default if default else inspect.Parameter.empty))
    return inspect.Signature(params)


def problems() -> list[str]:
    """What the importable cupy lacks, or refuses, of mpicomm's uses (empty: all there)."""
    out: list[str] = []
    for name in [*CALLS, *NAMES, *ATTRS]:
        try:
            resolve(name)
        except (AttributeError, ImportError) as exc:
            out.append(f"{name}: missing ({exc})")
    for name, calls in CALLS.items():
        try:
            sig = signature(resolve(name))
        except Exception as exc:
            out.append(f"{name}: no signature ({exc})")
            continue
        for npos, kws in calls:
            try:
                sig.bind(*range(npos), **dict.fromkeys(kws, 0))
            except TypeError as exc:
                out.append(f"{name}{sig}: does not take {npos} positional and {kws}: {exc}")
    for name, attrs in ATTRS.items():
        cls = resolve(name)
        out += [f"{name}.{a}: missing" for a in attrs if not hasattr(cls, a)]
    for name, attrs in INSTANCE_ATTRS.items():
        doc = inspect.getsource(resolve(name)) if _has_source(resolve(name)) else ""
        doc += resolve(name).__doc__ or ""
        out += [f"{name}.{a}: not documented" for a in attrs if a not in doc]
    return out


def _has_source(obj: Any) -> bool:
    try:
        inspect.getsource(obj)
    except (OSError, TypeError):
        return False
    return True
