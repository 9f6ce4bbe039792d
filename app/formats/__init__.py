"""In-memory sparse formats shared by every operation.

- :class:`CSRMatrix` — compressed sparse rows, the matrix input of SpMV, SpGEMM and Cholesky.
- :class:`COOTensor` — coordinate N-order tensor, the input of SpTV and CP-ALS.

Kernel-specific formats (CSR5 tiles, fiber-compressed tensors, supernodal factors) live beside the
operation that owns them.
"""
from ._csr import CSRMatrix, index_dtype_for, rows_sorted
from ._coo import COOTensor

__all__ = ["CSRMatrix", "COOTensor", "index_dtype_for", "rows_sorted"]
