"""In-memory sparse formats shared by every operation.

- :class:`CSRMatrix` — compressed sparse rows, the matrix input of SpMV, SpGEMM and Cholesky.
- :class:`COOTensor` — coordinate N-order tensor, the input of SpTV and CP-ALS.

- :class:`CSR5Matrix` — CSR5 tiles (SpMV, SpTV's CSR5 engine); :class:`FiberTensor` — fiber-compressed
  tensors (SpTV, CP-ALS).
"""
from ._checks import first_non_finite
from ._csr import (CSRMatrix, balanced_row_cuts, index_dtype_for, load_renumber_loops,
                   row_entries, row_sums, rows_sorted, uniform_value)
from ._coo import COOTensor, sorted_nonzeros
from ._csr5 import (CSR5Matrix, MAX_SIGMA, OMEGA, build_csr5, csr5_spmv, csr5_spmv_compiled,
                    default_sigma, descriptor_layout, row_length_census, sigma_check)
from ._fiber import (FiberTensor, fiber_index_dtype, fibers_by_sort, linear_fiber_keys, sortable,
                     stable_argsort)

__all__ = ["CSRMatrix", "COOTensor", "first_non_finite", "index_dtype_for", "rows_sorted",
           "balanced_row_cuts", "load_renumber_loops",
           "row_entries", "row_sums", "uniform_value", "sorted_nonzeros", "CSR5Matrix",
           "MAX_SIGMA", "OMEGA", "build_csr5", "csr5_spmv", "csr5_spmv_compiled",
           "default_sigma", "descriptor_layout", "row_length_census", "sigma_check",
           "FiberTensor", "fiber_index_dtype", "fibers_by_sort",
           "linear_fiber_keys", "sortable", "stable_argsort"]
