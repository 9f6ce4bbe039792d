"""Peer baselines of SpMV, timed in the same run on rank 0 over the whole matrix and the same
number of products per repeat: SciPy on the host, cuSPARSE through CuPy on the rank's GPU."""
from ...timing import time_on_host


def scipy_spmv(problem, x, repeats, iterations):
    """SciPy CSR ``A @ x``, host wall clock."""
    matrix = problem.to_scipy()

    def products():
        for _ in range(iterations):
            matrix @ x

    seconds = time_on_host(products, repeats)
    return {"seconds": seconds, "device": "cpu"}


def cusparse_spmv(problem, x, repeats, iterations):
    """cuSPARSE CSR SpMV through CuPy, timed with CUDA events on the same device."""
    from ...gpu import csr_to_cupy, import_cupy, release_pool, time_with_events
    cupy = import_cupy("peer 'cusparse'")
    matrix = csr_to_cupy(problem)
    x_dev = cupy.asarray(x)
    matrix @ x_dev  # warm-up: cuSPARSE buffer allocation and handle creation

    def products():
        for _ in range(iterations):
            matrix @ x_dev

    seconds = time_with_events(products, repeats)
    matrix = x_dev = None  # drop the device arrays before the pool is emptied
    release_pool()
    return {"seconds": seconds, "device": "gpu", "library": f"cupy {cupy.__version__}"}


#: peer name -> ``runner(problem, x, repeats, iterations)`` returning ``{"seconds": [...], ...}``
PEERS = {"scipy": scipy_spmv, "cusparse": cusparse_spmv}
