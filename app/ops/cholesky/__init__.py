"""Supernodal sparse Cholesky factorization and solve (``operation.name: cholesky``).

``op.py`` is the plan, ``symbolic.py`` the analysis (ordering, supernodes, numeric plan),
``cpu.py`` and ``gpu.py`` the engines, ``peers.py`` the cuSOLVER and CHOLMOD baselines.
"""
from .op import Cholesky, CholeskyLocal, backward_error, make_rhs

OPERATION = Cholesky

__all__ = ["Cholesky", "CholeskyLocal", "OPERATION", "backward_error", "make_rhs"]
