"""torch.compile and this backend: dynamo runs mpicomm's frames, never traces them.

DDP's C++ reducer calls the group's ``broadcast`` while it rebuilds its buckets, inside the forward pass
that ``torch.compile`` (dynamo) is compiling: dynamo's frame hook then tries to trace mpicomm's Python
group method, and fails at step 2 (gloo is C++, never traced). Listing mpicomm in dynamo's skip list
(``torch._dynamo.trace_rules.add``) makes dynamo run those frames as they are. Importing
``torch._dynamo`` costs seconds, so :func:`install` (run by ``import mpicomm.torch``) does it at once only
when dynamo is already loaded, and otherwise when dynamo's trace rules are first imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["install"]

_RULES = "torch._dynamo.trace_rules"


def _skip_mpicomm(rules: ModuleType) -> None:
    rules.add("mpicomm")


class _AfterRules(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of dynamo's trace rules to list mpicomm once they load."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != _RULES:
            return None
        sys.meta_path.remove(self)  # once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _skip_mpicomm(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Keep dynamo from tracing mpicomm: now if dynamo is loaded, else when it loads; idempotent."""
    rules = sys.modules.get(_RULES)
    if rules is not None:
        _skip_mpicomm(rules)
    elif not any(isinstance(f, _AfterRules) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterRules())
