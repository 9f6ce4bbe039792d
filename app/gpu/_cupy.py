"""CuPy for the peers (cuSPARSE, cuBLAS, cuSOLVER baselines timed beside our kernels).

CuPy uses the CUDA runtime, which picks up the primary context that :func:`bind_device` made
current, so peers run on the rank's own GPU.
"""
from ..errors import HisparseError


def import_cupy(peer):
    """``(cupy, cupyx.scipy.sparse)``, or a :class:`HisparseError` naming the peer that needs it."""
    try:
        import cupy
        import cupyx.scipy.sparse as cupy_sparse
    except ImportError as exc:
        raise HisparseError(f"peer '{peer}' needs CuPy ({exc})") from None
    return cupy, cupy_sparse


def csr_to_cupy(matrix, dtype=None):
    """Upload a CSR matrix (ours or SciPy's: ``data``, ``indices``, ``indptr``, ``shape``) as a
    ``cupyx.scipy.sparse.csr_matrix``."""
    cupy, cupy_sparse = import_cupy("cupy")
    data = matrix.data if dtype is None else matrix.data.astype(dtype)
    return cupy_sparse.csr_matrix((cupy.asarray(data), cupy.asarray(matrix.indices),
                                   cupy.asarray(matrix.indptr)), shape=tuple(matrix.shape))


def time_with_events(body, repeats):
    """Seconds of ``body()`` per repeat, measured with CUDA events on the current stream.

    Returns
    -------
    list of float, length ``repeats``
    """
    import cupy
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    seconds = []
    for _ in range(repeats):
        start.record()
        body()
        end.record()
        end.synchronize()
        seconds.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return seconds


def release_pool():
    """Return CuPy's cached device memory, so our kernels and the next peer start clean."""
    import cupy
    cupy.get_default_memory_pool().free_all_blocks()
