"""``python -m mpicomm``: the command line (``info``, ``demo``); with no command it prints its usage."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]

_EPILOG = """\
examples:
  python -m mpicomm info                   versions, MPI library, large counts, thread level, GPU support
  mpirun -n 2 python -m mpicomm info       the same as a job sees it (world size 2)
  mpirun -n 8 python -m mpi4py -m mpicomm demo
                                           every collective on 8 ranks, checked against numpy"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mpicomm",
        description="mpicomm: torch.distributed-style collectives over MPI for numpy arrays.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "info",
        help="print the versions, the MPI library, large counts, world size, thread level, CUDA-awareness, "
        "cupy and GPUs",
    )
    commands.add_parser(
        "demo", help="run every collective on small data and check it (options: demo --help)", add_help=False
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command and return its exit status; without one, print the usage and return 0.

    Args:
        argv: The arguments after ``python -m mpicomm``; ``None`` for ``sys.argv[1:]``.

    Returns:
        The exit status.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "demo":  # the demo parses its own options
        from .apps.demo import main as demo_main

        return demo_main(args[1:])
    parser = _parser()
    command = parser.parse_args(args).command
    if command == "info":
        from .apps.info import main as info_main

        return info_main()
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
