"""SpTV peers timed in the same run on the whole tensor (rank 0): NumPy on the CPU, and cuSPARSE
CSR SpMV (CuPy) on the transposed mode-n unfolding.

Each takes ``fibers`` (the whole tensor as a FiberTensor of the contracted mode), ``vector`` (v)
and ``repeats``, and returns ``{"seconds": [...], "device": ..., "library": ...}``.
"""
import numpy as np

from ...errors import HisparseError
from ...timing import time_on_host


def numpy_peer(fibers, vector, repeats):
    """NumPy on the COO tensor: bincount of value · v[i_n] by precomputed fiber ids."""
    fiber_of = np.repeat(np.arange(fibers.nfibers), fibers.fiber_lengths)
    index = fibers.fiber_index.astype(np.intp)
    seconds = time_on_host(lambda: np.bincount(fiber_of, weights=fibers.values * vector[index],
                                               minlength=fibers.nfibers), repeats)
    return {"seconds": seconds, "device": "cpu", "library": f"numpy {np.__version__}"}


def cusparse_peer(fibers, vector, repeats, full):
    """cuSPARSE CSR SpMV (CuPy) on the transposed mode-n unfolding: one row per fiber position —
    all prod(I_m, m != n) of them (``full``, the seed's peer) or only the non-empty fibers — and
    one column per mode-n index. Timed with CUDA events."""
    from ...gpu import import_cupy_sparse, release_pool, time_with_events
    peer = "cusparse_full" if full else "cusparse_fibers"
    cupy, csp = import_cupy_sparse(f"peer '{peer}'")
    if full:
        dims = [fibers.shape[m] for m in fibers.other_modes]
        nrows = float(np.prod([float(d) for d in dims]))
        if nrows >= np.iinfo(np.int32).max:
            raise HisparseError(f"the full unfolding has {nrows:.3g} rows, over cuSPARSE's "
                                f"int32 row limit")
        nrows = int(nrows)
        keys = np.ravel_multi_index(tuple(fibers.fiber_coords.T), dims)
        row_counts = np.zeros(nrows, dtype=np.int64)
        row_counts[keys] = fibers.fiber_lengths
        indptr = np.concatenate([[0], np.cumsum(row_counts)])
    else:
        nrows = fibers.nfibers
        indptr = fibers.fiber_ptr
    if fibers.nnz >= np.iinfo(np.int32).max:
        raise HisparseError("more than 2**31 nonzeros: over cuSPARSE's int32 CSR limit")
    matrix = csp.csr_matrix((cupy.asarray(fibers.values),
                             cupy.asarray(fibers.fiber_index.astype(np.int32)),
                             cupy.asarray(indptr.astype(np.int32))),
                            shape=(nrows, fibers.shape[fibers.mode]))
    v = cupy.asarray(vector)
    matrix @ v  # warm-up: handle creation and buffer allocation
    seconds = time_with_events(lambda: matrix @ v, repeats)
    matrix = v = None  # drop the device arrays before the pool is emptied
    release_pool()
    return {"seconds": seconds, "device": "gpu", "library": f"cupy {cupy.__version__}",
            "rows": nrows}
