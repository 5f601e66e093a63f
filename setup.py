"""Build hook for the one C extension; everything else is in setup.cfg and pyproject.toml.

``mpicomm.core._cmpi`` makes the fast paths' MPI calls without mpi4py's argument parsing
(see mpicomm/core/cmpi.py). It needs only a C compiler and Python's headers, no MPI headers, and
it is optional: where it cannot be built, the install goes on and mpicomm calls MPI through mpi4py.
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
                "mpicomm/core/_cmpi_door.c",
            ],
            depends=["mpicomm/core/_cmpi.h"],
            optional=True,
        )
    ]
)
