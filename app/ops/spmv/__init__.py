"""SpMV, y = A x, as a distributed operator in CSR or CSR5 (see :mod:`.op` for the operation,
:mod:`.plan` for its set-up plan, the local and ghost blocks from :mod:`hisparse.distmatrix`, the
engines' data in ``local.py``; engines in ``cpu.py`` and ``gpu.py``, peers in ``peers.py``)."""
from .local import SpmvLocal, threads_per_row
from .op import SpMV, chained_products

OPERATION = SpMV

__all__ = ["SpMV", "SpmvLocal", "chained_products", "threads_per_row", "OPERATION"]
