"""Numba for the host-side loops that NumPy cannot vectorise (Cholesky's analysis, the SpMV
verification's products): compiled once and cached on disk (``cache=True``), run without the
interpreter's lock. Without Numba the functions stay Python, slow but the same results (the
tests call them through ``.py_func`` either way)."""
try:
    import numba

    def compiled(function):
        return numba.njit(cache=True, nogil=True)(function)

    def compiled_parallel(function):
        """Compiled with its ``prange`` loops run by Numba's threads (independent iterations
        writing disjoint outputs: the results do not depend on the thread count)."""
        return numba.njit(cache=True, nogil=True, parallel=True)(function)

    prange = numba.prange
    thread_count = numba.get_num_threads
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised through .py_func in the tests
    def compiled(function):
        function.py_func = function
        return function

    compiled_parallel = compiled
    prange = range

    def thread_count():
        return 1

    HAVE_NUMBA = False


def use_cores(cores):
    """Let Numba's parallel loops use ``cores`` threads (at most the pool it started with: it
    starts one per core of the machine, not of this process's affinity)."""
    if HAVE_NUMBA:
        numba.set_num_threads(max(1, min(int(cores), numba.config.NUMBA_NUM_THREADS)))
