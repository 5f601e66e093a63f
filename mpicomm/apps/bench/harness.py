"""The harness's parts: environment, shared buffers, specs, points, the quiet gate, calibration and timing."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

import mpicomm

from ... import _mpi, sizes
from ...core.control import allgather_texts
from ...errors import MpicommError

if TYPE_CHECKING:
    from mpi4py import MPI


#: Bytes per rank swept by default: the anchor sizes (8 B, 1 KiB, 64 KiB, 1, 16, 64 MiB) and between.
DEFAULT_SIZES = (8, 64, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)


MAX_REPS = 1_000_000


F32 = np.float32


Call = Callable[[], object]


#: A contender: the call to time and the arrays it writes, compared once between contenders. The
#: calls are ``functools.partial`` objects with positional arguments only, on both sides: a partial
#: holding keywords builds a dictionary on every call (about 0.1 us on CPython 3.11, more than a
#: direct keyword call costs), which would be the harness's cost, not the call's.
Contender = tuple[Call, list[np.ndarray]]


@dataclass(frozen=True)
class Env:
    """What the builders need: the communicator the raw calls use, this rank and the world size."""

    comm: MPI.Intracomm
    rank: int
    n: int


def _data(count: int, rank: int, salt: int = 0) -> np.ndarray:
    """Small integer-valued float32 data, so that sums are exact in any order."""
    return ((np.arange(count, dtype=np.int32) + salt) % 7 + rank + 1).astype(F32)


class Buffers:
    """The arrays of one build: fresh test data for the check, or zeros shared by both contenders.

    Timing both contenders on the same memory matters: two separately allocated arrays gave the very
    same raw ``Allreduce`` times 0.66x to 1.6x apart at 1-16 MiB (page and cache placement), far more
    than the overhead measured here. Zeros keep in-place reductions finite however often they run.
    """

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.arrays: dict[str, np.ndarray] = {}

    def take(self, key: str, count: int, fill: Callable[[], np.ndarray] | None = None) -> np.ndarray:
        """The array named ``key``: shared zeros when timing, else ``fill()`` (or new zeros)."""
        if not self.shared:
            return fill() if fill is not None else np.zeros(count, F32)
        a = self.arrays.get(key)
        if a is None or a.size != count:
            a = self.arrays[key] = np.zeros(count, F32)
        return a

    def chunks(self, e: Env, c: int) -> list[np.ndarray]:
        """One separately allocated input array per rank, as a user's list would be."""
        return [self.take(f"in{j}", c, partial(_data, c, e.rank, j)) for j in range(e.n)]

    def joined(self, e: Env, c: int) -> np.ndarray:
        """The same inputs as :meth:`chunks`, in one array."""
        return self.take("in", e.n * c, lambda: np.concatenate(Buffers(False).chunks(e, c)))


def _noop() -> None:
    return None


def _medians(ctl: MPI.Intracomm, fns: dict[str, Call], args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per call of each function (max over ranks), rounds interleaved, order alternating."""
    for fn in fns.values():
        _timed(ctl, fn, 2)
    ks = {k: args.iters or calibrate(ctl, fn, args.sample_time) for k, fn in fns.items()}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.rounds):
        for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            quiet_gate(ctl, args.gate, args.gate_wait)
            times[k].append(_timed(ctl, fns[k], ks[k]))
    return {k: statistics.median(t) for k, t in times.items()}


#: (algorithm bytes per byte of size per rank, busbw/algbw factor) as functions of the world size n.
BANDWIDTH: dict[str, tuple[Callable[[int], float], Callable[[int], float]]] = {
    "one": (lambda n: 1.0, lambda n: 1.0),
    "allreduce": (lambda n: 1.0, lambda n: 2 * (n - 1) / n),
    "alltoall": (lambda n: 1.0, lambda n: (n - 1) / n),
    "gather": (lambda n: float(n), lambda n: (n - 1) / n),
    "pingpong": (lambda n: 2.0, lambda n: 1.0),
}


@dataclass(frozen=True)
class Spec:
    """One benchmarked comparison: contender ``a`` against ``b`` (described by ``baseline``)."""

    build: Callable[[Env, int, str, Buffers], Contender]
    a: str
    b: str
    baseline: str
    bw: str = "one"
    sized: bool = True
    min_ranks: int = 1


@dataclass
class Point:
    """The measurement of one comparison at one size; times are seconds per call, max over ranks."""

    op: str
    size: int
    a: str
    b: str
    baseline: str
    check: bool
    reps_a: int
    reps_b: int
    samples_a: list[float]
    samples_b: list[float]
    quiet_a: list[bool]
    quiet_b: list[bool]
    alg_bytes: float
    bus_factor: float
    loadavg: list[float] = field(default_factory=list)

    @property
    def t_a(self) -> float:
        """Median seconds per call of contender A."""
        return statistics.median(self.samples_a)

    @property
    def t_b(self) -> float:
        """Median seconds per call of baseline B."""
        return statistics.median(self.samples_b)

    @property
    def ratio(self) -> float:
        """A's median time over B's (above 1: A is slower)."""
        return self.t_a / self.t_b

    def busbw(self, t: float) -> float | None:
        """Bus bandwidth in GB/s for a time per call, None for size-free ops."""
        return self.alg_bytes * self.bus_factor / t / 1e9 if self.size else None

    def record(self) -> dict[str, Any]:
        """Everything about the point, with the derived figures, for the JSON file."""
        paired = [a / b for a, b in zip(self.samples_a, self.samples_b, strict=True)]
        qa = [t for t, q in zip(self.samples_a, self.quiet_a, strict=True) if q]
        qb = [t for t, q in zip(self.samples_b, self.quiet_b, strict=True) if q]
        derived = {
            "t_a": self.t_a,
            "t_b": self.t_b,
            "ratio": self.ratio,
            "ratio_paired_median": statistics.median(paired),
            "ratio_quiet": statistics.median(qa) / statistics.median(qb) if qa and qb else None,
            "min_a": min(self.samples_a),
            "min_b": min(self.samples_b),
            "busbw_a": self.busbw(self.t_a),
            "busbw_b": self.busbw(self.t_b),
        }
        return {**asdict(self), **derived}


def _busy_jiffies() -> tuple[int, int]:
    """Busy and total CPU time of the whole machine, in jiffies, from /proc/stat; (0, 0) without it."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(v) - v[3] - v[4], sum(v)  # idle and iowait are not busy


def quiet_gate(ctl: MPI.Intracomm, cores: float, wait: float) -> bool:
    """Wait until other processes use fewer than ``cores`` CPU cores; True if that happened in time.

    Every rank sleeps 0.1 s while rank 0 reads the machine's CPU use from /proc/stat, so whatever is
    busy then is someone else; this repeats for up to ``wait`` seconds. ``cores <= 0`` turns it off.
    """
    if cores <= 0:
        return True
    deadline = time.monotonic() + wait
    while True:
        b0, t0 = _busy_jiffies()
        time.sleep(0.1)
        b1, t1 = _busy_jiffies()
        used = (b1 - b0) / (t1 - t0) * (os.cpu_count() or 1) if t1 > t0 else 0.0
        flags = np.array([used < cores, time.monotonic() > deadline], np.uint8)
        ctl.Bcast(flags, root=0)
        quiet, late = bool(flags[0]), bool(flags[1])
        if quiet or late:
            return bool(quiet)


def largest(ctl: MPI.Intracomm, value: float) -> float:
    """The largest ``value`` over the ranks (a float64 ``Allreduce``: the harness pickles nothing)."""
    buf = np.array([value], np.float64)
    ctl.Allreduce(_mpi.MPI.IN_PLACE, buf, op=_mpi.MPI.MAX)
    return float(buf[0])


def everywhere(ctl: MPI.Intracomm, flag: bool) -> bool:
    """Whether ``flag`` holds on every rank."""
    return largest(ctl, 0.0 if flag else 1.0) == 0.0


def _timed(ctl: MPI.Intracomm, fn: Call, k: int) -> float:
    """Seconds per call of ``k`` back-to-back calls, max over ranks, after a barrier."""
    ctl.Barrier()
    t0 = time.perf_counter()
    for _ in repeat(None, k):
        fn()
    elapsed = time.perf_counter() - t0
    return largest(ctl, elapsed / k)


def calibrate(ctl: MPI.Intracomm, fn: Call, target: float) -> int:
    """Calls per sample so that a sample lasts about ``target`` seconds; the same on every rank.

    Every decision is taken on times already reduced with MAX over ranks, so all ranks loop the same
    number of times; the final count is agreed with one more MAX allreduce all the same.
    """
    k = 1
    while True:
        per_call = max(_timed(ctl, fn, k), 1e-9)
        if per_call * k >= target / 4 or k >= MAX_REPS:
            break
        k = min(MAX_REPS, max(2 * k, math.ceil(target / 4 / per_call)))
    k = min(MAX_REPS, max(1, math.ceil(target / per_call)))
    return int(largest(ctl, k))


def check(ctl: MPI.Intracomm, a: Contender, b: Contender) -> bool:
    """Run each contender once on its own test data and compare outputs; the verdict is every rank's."""
    a[0]()
    b[0]()
    flat_a, flat_b = (np.concatenate([o.ravel() for o in x[1]] or [np.empty(0, F32)]) for x in (a, b))
    ok = bool(np.array_equal(flat_a, flat_b))
    return everywhere(ctl, ok)


def fmt_time(t: float) -> str:
    """``2.3 µs``, ``1.25 ms``, ``0.31 s``."""
    for scale, unit in ((1e-6, "µs"), (1e-3, "ms")):
        if t < 1000 * scale:
            return f"{t / scale:.1f} {unit}" if t < 100 * scale else f"{t / scale:.0f} {unit}"
    return f"{t:.2f} s"


def fmt_size(nbytes: int) -> str:
    """``8 B``, ``64 KiB``, ``16 MiB``; ``-`` for size-free ops."""
    if nbytes == 0:
        return "-"
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def fmt_bw(bw: float | None) -> str:
    """GB/s with three significant digits, ``-`` when not defined."""
    return "-" if bw is None else f"{bw:.3g}"


def parse_size(text: str) -> int:
    """``"64KiB"``, ``"1M"``, ``"8"`` to bytes (:func:`mpicomm.sizes.parse_size`); a positive multiple of 4.

    Example:
        >>> parse_size("64KiB"), parse_size("1M"), parse_size("8")
        (65536, 1048576, 8)
    """
    try:
        nbytes = sizes.parse_size(text, "--sizes", "a size")
    except MpicommError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if nbytes <= 0 or nbytes % 4:
        raise argparse.ArgumentTypeError(
            f"size {text!r} is {nbytes} bytes; expected a positive multiple of 4 (the data is float32)"
        )
    return nbytes


def machine(ctl: MPI.Intracomm) -> dict[str, Any]:
    """Where the run happened: host, cores, CPU, OS, library versions, world size, load."""
    import mpi4py

    hosts = sorted({text.decode() for _, text in allgather_texts(ctl, 0, platform.node().encode())})
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    env = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "MPIR_CVAR", "MPICH_"))}
    return {
        "hostname": platform.node(),
        "hosts": hosts,
        "cores": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mpi_library": " ".join(_mpi.library_version().split()),
        "mpi_standard": list(_mpi.MPI.Get_version()),
        "thread_level": _mpi.thread_level(),
        "mpi4py": mpi4py.__version__,
        "numpy": np.__version__,
        "mpicomm": mpicomm.__version__,
        "world_size": ctl.Get_size(),
        "loadavg": list(os.getloadavg()),
        "env": env,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
