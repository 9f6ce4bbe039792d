"""Supernodal sparse Cholesky factorization and solve (``operation.name: cholesky``).

``op.py`` is the plan (``problem.py`` the right-hand sides and the benchmarks' shifted
Laplacian, ``refinement.py`` the iterative refinement, ``tree.py`` strategy subtree's exchanges
along the elimination tree), ``ordering.py`` (with ``metis.py``) the fill-reducing ordering,
``symbolic.py`` the rest of the analysis (its steps in ``etree.py``, ``supernodes.py`` and
``structure.py``: elimination tree and column counts, supernodes, numeric plan; its result in
``factor.py``), ``cpu.py`` and ``gpu.py`` the engines, ``reference.py`` the verification's
backward error, ``peers.py`` the cuSOLVER and CHOLMOD baselines.
"""
from .op import Cholesky, CholeskyLocal
from .problem import make_rhs
from .reference import backward_error

OPERATION = Cholesky

__all__ = ["Cholesky", "CholeskyLocal", "OPERATION", "backward_error", "make_rhs"]
