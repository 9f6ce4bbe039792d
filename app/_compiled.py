"""Numba for the host-side loops that NumPy cannot vectorise (Cholesky's analysis, R-MAT's edge
bits and keyed permutation, the CSR renumbering, the verification's SpMV and SpGEMM products):
compiled once and cached on disk (``cache=True``), run without the interpreter's lock. Without
Numba the functions stay Python, slow but the same results (the tests call them through
``.py_func`` either way)."""
import functools

try:
    import numba

    def compiled(function):
        return numba.njit(cache=True, nogil=True)(function)

    def compiled_parallel(function):
        """Compiled with its ``prange`` loops run by Numba's threads (independent iterations
        writing disjoint outputs: the results do not depend on the thread count), as many as
        this process may use (:func:`use_cores` before each call: Numba's pool starts with
        one per core of the machine, which oversubscribes a rank bound to a few cores). To be
        called from Python (``.py_func``: the function itself)."""
        dispatcher = numba.njit(cache=True, nogil=True, parallel=True)(function)

        @functools.wraps(function)
        def on_process_cores(*args):
            from . import context  # looked up at each call: tests vary the cores
            use_cores(context.usable_cores())
            return dispatcher(*args)

        on_process_cores.py_func = function
        return on_process_cores

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
