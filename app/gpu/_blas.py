"""CuPy: the one adapter to its libraries: peers (cuSPARSE, cuBLAS, cuSOLVER baselines timed
beside our kernels) and the cuBLAS/cuSOLVER handles our GPU engines use.

CuPy uses the CUDA runtime, which picks up the primary context that :func:`bind_device` made
current, so peers run on the rank's own GPU.
"""
import numpy as np

from ..errors import HisparseError
from ..threads import in_background


def import_cupy(purpose):
    """``cupy``, or a :class:`HisparseError` naming what needs it (``purpose``)."""
    try:
        import cupy
    except ImportError as exc:
        raise HisparseError(f"{purpose} needs CuPy ({exc})") from None
    return cupy


def optional_cupy(purpose):
    """``cupy``, or ``None`` where it does not import: for a step that then runs on the host
    (``purpose`` names it in :func:`import_cupy`'s error, which is not raised)."""
    try:
        return import_cupy(purpose)
    except HisparseError:
        return None


#: the share of the free device memory a step planned on the host may count on (the rest: the
#: pool's rounding, the libraries' workspaces, what another stream holds)
FREE_MEMORY_SHARE = 0.8


def fits_free_memory(cupy, nbytes):
    """Whether ``nbytes`` fit in :data:`FREE_MEMORY_SHARE` of the current GPU's free memory."""
    free, _ = cupy.cuda.runtime.memGetInfo()
    return nbytes <= FREE_MEMORY_SHARE * free


def import_cupy_sparse(purpose):
    """``(cupy, cupyx.scipy.sparse)``, or a :class:`HisparseError` naming what needs them.

    Apart from :func:`import_cupy` because ``cupyx.scipy.sparse`` imports SciPy's sparse package
    (H100 host: 0.13 s with bytecode caches, 0.56 s without), which code that only needs CuPy's
    arrays has no use for. (CuPy 14 itself imports it on its first operation between an array and
    a Python scalar: that loads the ``cupyx`` which ``cupy.random`` imports lazily, and ``cupyx``
    imports ``cupyx.linalg`` and with it ``cupyx.scipy.sparse``; so most GPU set-ups pay it
    anyway, and the driver imports CuPy while CUDA initialises, ``Operation.modules_for_setup``.)"""
    cupy = import_cupy(purpose)
    try:
        import cupyx.scipy.sparse as cupy_sparse
    except ImportError as exc:
        raise HisparseError(f"{purpose} needs cupyx.scipy.sparse ({exc})") from None
    return cupy, cupy_sparse


def csr_to_cupy(matrix, dtype=None):
    """Upload a CSR matrix (ours or SciPy's: ``data``, ``indices``, ``indptr``, ``shape``) as a
    ``cupyx.scipy.sparse.csr_matrix``."""
    cupy, cupy_sparse = import_cupy_sparse("uploading a CSR matrix to CuPy")
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


def cupy_libraries(purpose):
    """CuPy's raw cuBLAS and cuSOLVER bindings ``(cublas, cusolver)``, or a
    :class:`HisparseError` saying what needs them (``purpose``) and how to install CuPy."""
    try:
        from cupy_backends.cuda.libs import cublas, cusolver
    except ImportError as exc:
        raise HisparseError(f"{purpose} needs CuPy for cuBLAS/cuSOLVER ({exc}); install the gpu "
                            f"extra (pip install -e '.[gpu]') or run with backend: cpu") from None
    return cublas, cusolver


def start_library_import():
    """Import CuPy's cuBLAS/cuSOLVER bindings and PyCUDA's ``gpuarray`` in a background thread
    and return the thread (join it before the first use; ``thread.seconds``: what the import
    took, NaN when it failed).

    An engine's first use paid the import (H100 host: ~0.25 s warm, ~1 s cold; the Cholesky
    upload phase of Trefethen_20000 was 0.26-0.36 s where its own work took 0.1 s). Started
    while the host runs work that leaves the interpreter free (METIS), it costs nothing on the
    critical path. Nothing is reported from the thread (a missing CuPy): whoever needs the
    libraries meets and reports the same error where it uses them.

    Running the dense routines once there as well (so that their first call in the timed
    numeric phase would not load their kernels) was measured and not kept: on the H100 it
    took ~0.3 s for a first-call saving of 40-50 ms (Trefethen_20000, the 700^2 grid), and
    slowed the analysis' symbolic part from 0.043 to 0.09-0.14 s on Trefethen_20000."""
    import importlib
    return in_background([lambda: importlib.import_module("pycuda.gpuarray"),
                          lambda: cupy_libraries("the background import")],
                         "hisparse-library-import")


class DenseHandles:
    """cuBLAS and cuSOLVER handles bound to PyCUDA streams (one pair per stream), and the
    routines of one precision: the one place where hisparse makes library handles.

    Parameters
    ----------
    dtype : numpy dtype (float32 or float64)
    streams : list of pycuda.driver.Stream
    purpose : str
        Named in the error when CuPy is missing.

    Attributes
    ----------
    blas, solver : list of handles, one per stream
    gemm, syrk, trsm, potrf, potrf_buffer_size : the typed routines (d* or s*)
    """

    def __init__(self, dtype, streams, purpose="this GPU path"):
        cublas, cusolver = cupy_libraries(purpose)
        self.cublas, self.cusolver = cublas, cusolver
        double = dtype == np.float64
        self.gemm = cublas.dgemm if double else cublas.sgemm
        self.syrk = cublas.dsyrk if double else cublas.ssyrk
        self.trsm = cublas.dtrsm if double else cublas.strsm
        self.potrf = cusolver.dpotrf if double else cusolver.spotrf
        self.potrf_buffer_size = cusolver.dpotrf_bufferSize if double else \
            cusolver.spotrf_bufferSize
        self.blas = [cublas.create() for _ in streams]
        self.solver = [cusolver.create() for _ in streams]
        for q, stream in enumerate(streams):
            cublas.setStream(self.blas[q], stream.handle)
            cusolver.setStream(self.solver[q], stream.handle)
        # Host scalars for alpha/beta (cuBLAS's default host pointer mode reads them at launch).
        self.scalars = {v: np.array([v], dtype=dtype) for v in (1.0, -1.0, 0.0)}

    def alpha(self, value):
        """Host pointer to the scalar ``value`` (1, -1 or 0) of this precision."""
        return self.scalars[value].ctypes.data

    def destroy(self):
        for handle in self.blas:
            self.cublas.destroy(handle)
        for handle in self.solver:
            self.cusolver.destroy(handle)
        self.blas, self.solver = [], []
