"""Peers of the Cholesky operation, timed in the same run on the same matrix and right-hand
sides: cuSOLVER's sparse Cholesky (through :mod:`hisparse.gpu._blas`, the one CuPy adapter) and
CHOLMOD (scikit-sparse) on the host. Each returns ``{"seconds": [...], ...attrs}`` with the
backward error of its solution."""
import time

import numpy as np

from ...errors import HisparseError
from ...gpu import cupy_libraries, csr_to_cupy, import_cupy, release_pool, time_with_events
from ...timing import time_on_host
from .reference import backward_error


def cusolver_peer(matrix, b, repeats):
    """cuSOLVER's sparse Cholesky (cusolverSpDcsrlsvchol: analysis, factorization and solve
    in one call, symrcm reordering) through CuPy's low-level binding, timed with events."""
    cupy = import_cupy("peer 'cusolver'")
    _, cusolver = cupy_libraries("peer 'cusolver'")
    from cupy.cuda import device as cupy_device
    a = csr_to_cupy(matrix, np.float64)
    b_dev = cupy.asarray(b, dtype=np.float64)
    x_dev = cupy.empty_like(b_dev)
    singularity = np.zeros(1, dtype=np.int32)
    handle = cupy_device.get_cusolver_sp_handle()

    def factor_and_solve():
        cusolver.dcsrlsvchol(handle, a.shape[0], a.nnz, a._descr.descriptor, a.data.data.ptr,
                             a.indptr.data.ptr, a.indices.data.ptr, b_dev.data.ptr, 1e-14, 1,
                             x_dev.data.ptr, singularity.ctypes.data)

    seconds = time_with_events(factor_and_solve, repeats)
    x = cupy.asnumpy(x_dev)
    error = backward_error(matrix, x[:, None], np.asarray(b)[:, None])
    a = b_dev = x_dev = None  # drop the device arrays before the pool is emptied
    release_pool()
    return {"seconds": seconds, "device": "gpu", "library": f"cupy {cupy.__version__}",
            "includes": "analysis+factorization+solve", "backward_error": error,
            "singularity": int(singularity[0])}


def cholmod_peer(matrix, b, repeats):
    """CHOLMOD (scikit-sparse) on the host: numeric factorization time, analysis reused."""
    try:
        from sksparse.cholmod import analyze as cholmod_analyze
    except ImportError as exc:
        raise HisparseError(f"peer 'cholmod' needs scikit-sparse ({exc})") from None
    a = matrix.tocsc().astype(np.float64)
    start = time.perf_counter()
    symbolic = cholmod_analyze(a)
    analysis = time.perf_counter() - start
    last = {}

    def factorize():
        last["factor"] = symbolic.cholesky(a)

    seconds = time_on_host(factorize, repeats)
    x = last["factor"](b)
    return {"seconds": seconds, "device": "cpu", "analysis_seconds": analysis,
            "includes": "factorization", "backward_error": backward_error(matrix, x, b)}
