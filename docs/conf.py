"""Sphinx configuration for the mpicomm documentation (``make docs``; warnings are errors)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mpicomm
import mpicomm.c10d.pg_methods  # api.rst documents its methods (attached to groups lazily at run time)

project = "mpicomm"
author = "the mpicomm developers"
copyright = "the mpicomm developers"
release = mpicomm.__version__
version = ".".join(release.split(".")[:2])

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
exclude_patterns = ["_build"]
templates_path: list[str] = []
html_static_path: list[str] = ["_static"] if (Path(__file__).parent / "_static").is_dir() else []

html_theme = "furo"
html_title = f"mpicomm {release}"
pygments_style = "sphinx"
default_role = "code"

# The docstrings are Google style; "Attributes:" becomes :ivar: fields so that slot attributes are
# not described twice.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
napoleon_use_rtype = False

# `make docs` runs Sphinx with -n (nitpicky): every cross-reference must resolve. The docs build offline
# (no intersphinx), so the standard library's and numpy's classes that type hints name are listed here
# on purpose; so is ProcessGroup's ``comm``, an instance attribute documented in the class text.
nitpicky = True
nitpick_ignore = [
    ("py:class", name)
    for name in (
        "numpy.ndarray",
        "np.ndarray",
        "collections.abc.Callable",
        "collections.abc.Iterable",
        "collections.abc.Iterator",
        "collections.abc.Mapping",
        "collections.abc.Sequence",
        "pathlib.Path",
        "argparse.ArgumentParser",
        "_pickle.UnpicklingError",
        "collections.Counter",
        "mpicomm.jagged.keyed_ops._K",  # the type variable of KeyedJaggedArray's class methods
        "mpicomm.jagged.keyed_ops.KeyedOps",  # KeyedJaggedArray's private base class of torchrec methods
        "datetime.timedelta",
        "mpicomm.front.door.F",
        "mpicomm.front.jagged._F",  # the type variable of the front KeyedJaggedArray's derived arrays
        # the host classes under the public KeyedJaggedArray, KJTAllToAll and its awaitable
        "mpicomm.jagged.keyed.KeyedJaggedArray",
        "mpicomm.jagged.kjt.KJTAllToAll",
        "mpicomm.jagged.kjt.KJTAllToAllAwaitable",  # front_door's type variable (the wrapped function's type)
    )
] + [("py:attr", "comm")]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "separated"
autodoc_preserve_defaults = True
add_module_names = False


def _check_public_api(app: Any, env: Any) -> None:
    """Warn (an error under -W) for every name in ``mpicomm.__all__`` that no page documents."""
    from sphinx.util import logging

    documented = set(env.get_domain("py").objects)
    missing = [n for n in mpicomm.__all__ if f"mpicomm.{n}" not in documented]
    if missing:
        logging.getLogger(__name__).warning(
            "mpicomm.__all__ names missing from the docs (add them to docs/api.rst): %s", ", ".join(missing)
        )


def setup(app: Any) -> None:
    """Register the check that every public name is documented."""
    app.connect("env-check-consistency", _check_public_api)
