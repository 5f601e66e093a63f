"""``python -m mpicomm`` and the ``mpicomm`` command: ``info``, ``demo``, ``plan``, ``bench``, ``trace``.

Each command is a program of :mod:`mpicomm.apps` with its own options (``mpicomm COMMAND --help``); the
old module entry points (``python -m mpicomm.demo``, ``.plan``, ``.bench``) run the same programs.
With no command, the usage is printed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]

_EPILOG = """\
examples:
  python -m mpicomm info                   versions, MPI library, large counts, thread level, GPU support
  mpirun -n 2 python -m mpicomm info       the same as a job sees it (world size 2)
  mpirun -n 8 python -m mpi4py -m mpicomm demo
                                           every collective and a halo exchange on 8 ranks, checked
  python -m mpicomm plan jobs/sharded.toml plan sharding options onto ranks (no MPI needed)
  mpirun -n 2 python -m mpi4py -m mpicomm bench --ops all_reduce
                                           mpicomm against raw mpi4py
  python -m mpicomm trace DIR              the calls of a run made with MPICOMM_TRACE=DIR, per call and site

Every command takes --help. `mpicomm COMMAND` (the installed script) is the same as
`python -m mpicomm COMMAND`; under mpirun, `python -m mpi4py -m mpicomm` makes a failing rank end the job."""

_COMMANDS = {
    "info": "print the versions, the MPI library (or why none loads), large counts, thread level, GPUs",
    "demo": "run every collective and a halo exchange on small data and check them against numpy",
    "plan": "plan sharding options onto ranks, print the plan, write it and the Slurm script (no MPI)",
    "bench": "benchmark mpicomm against raw mpi4py (run it under mpirun)",
    "trace": "merge a run traced with MPICOMM_TRACE=DIR and print where its time went (no MPI)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mpicomm",
        description="mpicomm: torch.distributed-style collectives over MPI for numpy arrays.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"mpicomm {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, text in _COMMANDS.items():
        commands.add_parser(name, help=f"{text} (options: {name} --help)", add_help=False)
    return parser


def _program(command: str) -> Callable[[list[str]], int]:
    """The command's program, imported only when it runs (plan must not load MPI)."""
    if command == "info":
        from .apps.info import main as program
    elif command == "demo":
        from .apps.demo import main as program
    elif command == "plan":
        from .apps.plan import main as program
    elif command == "trace":
        from .apps.trace import main as program
    else:
        from .apps.bench.run import main as program
    return program


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command and return its exit status; without one, print the usage and return 0.

    Args:
        argv: The arguments after ``python -m mpicomm``; ``None`` for ``sys.argv[1:]``.

    Returns:
        The exit status of the command (0 for the usage).

    Example:
        >>> main(["plan", "--nodes", "1", "--ntasks-per-node", "2", "--quiet"])
        0
    """
    from .errors import MPIUnavailableError

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in _COMMANDS:  # each program parses its own options, --help included
        try:
            return _program(args[0])(args[1:])
        except MPIUnavailableError as exc:  # the diagnosis, not a traceback
            print(exc, file=sys.stderr)
            return 1
    parser = _parser()
    parser.parse_args(args)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
