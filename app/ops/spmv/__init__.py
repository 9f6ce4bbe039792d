"""SpMV, y = A x, in CSR or CSR5 (see :mod:`.op` for the plan; engines in ``cpu.py`` and
``gpu.py``, peers in ``peers.py``)."""
from .op import SpMV, SpmvLocal, threads_per_row

OPERATION = SpMV

__all__ = ["SpMV", "SpmvLocal", "threads_per_row", "OPERATION"]
