"""SpGEMM, C = A B (or A A), CSR in and CSR out with sorted columns, over row partitions of A.

``op`` is the plan (partition, distribute, gather, verify), ``cpu`` and ``gpu`` the engines
(``gpu`` also plans the hash tables' bins), ``peers`` the SciPy and cuSPARSE baselines.
"""
from .op import SpGEMM

OPERATION = SpGEMM

__all__ = ["SpGEMM", "OPERATION"]
