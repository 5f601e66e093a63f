"""Build hook for the two C extensions; everything else is in setup.cfg and pyproject.toml.

``mpicomm.core._cmpi`` makes the fast paths' MPI calls without mpi4py's argument parsing
(see mpicomm/core/cmpi.py); ``mpicomm.front._door`` is the front door's numpy path in C (see
mpicomm/front/door.py). They need only a C compiler and Python's headers, no MPI headers, and
they are optional: where they cannot be built, the install goes on and mpicomm calls MPI through
mpi4py, behind the front door's Python wrappers.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mpicomm.core._cmpi",
            [
                "mpicomm/core/_cmpi.c",
                "mpicomm/core/_cmpi_lists.c",
                "mpicomm/core/_cmpi_pack.c",
                "mpicomm/core/_cmpi_jagged.c",
                "mpicomm/core/_cmpi_bcast.c",
            ],
            depends=["mpicomm/core/_cmpi.h", "mpicomm/core/_slots.h"],
            optional=True,
        ),
        Extension(
            "mpicomm.front._door", ["mpicomm/front/_door.c"], depends=["mpicomm/core/_slots.h"], optional=True
        ),
        Extension("mpicomm.core._lane", ["mpicomm/core/_lane.c"], optional=True),
    ]
)
