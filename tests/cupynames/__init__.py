"""The cupy names mpicomm uses, checked against the real cupy package (``make test-cupy-names``)."""
