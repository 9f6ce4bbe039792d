"""Peer baselines of SpGEMM timed in the same run (rank 0): SciPy on the host and cuSPARSE
through CuPy (:mod:`hisparse.gpu._blas`)."""
from ...errors import HisparseError
from ...timing import time_on_host


def scipy_spgemm(a, b, repeats):
    """SciPy ``A @ B`` (single-threaded host), timed per product.

    Parameters
    ----------
    a : CSRMatrix
    b : CSRMatrix or None
        None for ``A @ A``.
    """
    a = a.to_scipy()
    b = a if b is None else b.to_scipy()
    seconds = time_on_host(lambda: a @ b, repeats)
    return {"seconds": seconds, "device": "cpu"}


def cusparse_spgemm(a, b, repeats):
    """cuSPARSE SpGEMM through CuPy (``A @ B`` on ``cupyx`` CSR matrices) on the current device.

    Timed with CUDA events around each product (descriptor set-up, workspace allocation from the
    warm pool and the copy of C included, as a CuPy user sees it). The peak device memory is the
    pool's total after the first product, which started from an empty pool (inputs included).

    Parameters
    ----------
    a : CSRMatrix
    b : CSRMatrix or None
        None for ``A @ A`` (A uploaded once).

    Raises
    ------
    HisparseError
        CuPy missing, or cuSPARSE failed (e.g. out of memory on its workspace).
    """
    from ...gpu import csr_to_cupy, import_cupy, release_pool, time_with_events
    cupy = import_cupy("peer 'cusparse'")
    pool = cupy.get_default_memory_pool()
    release_pool()
    operands = {}
    try:
        operands["a"] = csr_to_cupy(a)
        operands["b"] = operands["a"] if b is None else csr_to_cupy(b)
        c = operands["a"] @ operands["b"]
        cupy.cuda.Device().synchronize()
        peak = int(pool.total_bytes())
        nnz = int(c.nnz)
        c = None

        def product():
            nonlocal peak
            operands["a"] @ operands["b"]  # C is dropped at once, as the loop above did
            peak = max(peak, int(pool.total_bytes()))

        seconds = time_with_events(product, repeats)
    except HisparseError:
        raise
    except Exception as exc:  # cuSPARSE status errors and CuPy's OutOfMemoryError alike
        raise HisparseError(f"cuSPARSE SpGEMM (CuPy A @ B) failed: {type(exc).__name__}: "
                            f"{str(exc)[:300]}") from None
    finally:
        operands.clear()
        release_pool()
    return {"seconds": seconds, "device": "gpu", "library": f"cupy {cupy.__version__}",
            "peak_device_bytes": peak, "nnz_c": nnz}
