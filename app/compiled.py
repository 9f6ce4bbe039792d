"""Numba for the host-side loops that NumPy cannot vectorise (Cholesky's analysis, R-MAT's edge
bits and keyed permutation, the CSR renumbering, the verification's SpMV and SpGEMM products,
array fingerprints): compiled once and cached on disk (``cache=True``), run without the
interpreter's lock. Without Numba the functions stay Python, slow but the same results (the tests
call them through ``.py_func`` either way).

Numba is imported at the first call of a compiled function, not with this module: its import is
~0.3 s (H100 host), half of ``hisparse.driver``'s, and a run that calls no compiled code before
its results (an SpTV or CP-ALS run, an SpMV on a stencil) paid it in its start-up."""
import functools
import importlib.util
import threading
import types

import numpy as np

#: Whether Numba can be imported (found without importing it).
HAVE_NUMBA = importlib.util.find_spec("numba") is not None


def _numba():
    """Numba, or None when it is found but does not import (the functions then stay Python)."""
    try:
        import numba
    except ImportError:
        return None
    if not _COMPILE_TIMER:
        _listen_to_compiles(numba)
    return numba


#: The listener summing Numba's compilations in this process (made with Numba's import).
_COMPILE_TIMER = []


def _listen_to_compiles(numba):
    """Sum the seconds Numba compiles in this process (its ``numba:compile`` events fire on a
    compilation, not on a load from its on-disk cache): a fresh install's first run compiles
    host code for seconds, which its time to solution holds once."""
    try:
        from numba.core import event
        listener = event.TimingListener()
        event.register("numba:compile", listener)
    except (ImportError, AttributeError):  # an older Numba without events: not measured
        listener = None
    _COMPILE_TIMER.append(listener)


def host_compile_seconds():
    """Seconds Numba has spent compiling in this process (0 when nothing compiled, Numba was
    never imported, or it cannot say)."""
    listener = _COMPILE_TIMER[0] if _COMPILE_TIMER else None
    return float(listener.duration) if listener is not None and listener.done else 0.0


#: Held while a compiled function is made: the first calls may come from several threads at once
#: (R-MAT's edge blocks), and each function is to be made once.
_MAKING = threading.RLock()


#: Whether this process has said that Numba compiles (once: the functions compile one by one).
_ANNOUNCED = []


def _announce_compiling(dispatcher):
    """Say once, on stderr and from the world's rank 0, that Numba compiles: a function whose
    on-disk cache has no index yet (a fresh install) is compiled at its first call, which takes
    seconds. Cheap: one ``stat``; a stale index (an edited source) compiles without a word."""
    import os
    import sys
    if _ANNOUNCED:
        return
    try:
        cache = dispatcher._cache  # Numba's FunctionCache (njit(cache=True))
        index, where = cache._cache_file._index_path, cache._cache_path
    except AttributeError:  # a plain Python function (no Numba), or Numba's internals moved
        return
    if os.path.exists(index):
        return
    _ANNOUNCED.append(True)
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and \
            mpi.COMM_WORLD.rank != 0:
        return
    sys.stderr.write(f"hisparse: compiling host code with Numba (first run only; cached in "
                     f"{where})...\n")
    sys.stderr.flush()


def prange(*args):
    """``range`` in Python; Numba's parallel ``prange`` in a function compiled by
    :func:`compiled_parallel` (the compiled copy's globals hold Numba's, see :class:`_Compiled`)."""
    return range(*args)


class _Compiled:
    """A function compiled by Numba at its first call (``.py_func``: the function itself).

    Numba reads a function's globals when it compiles it; here it compiles a copy of the
    function whose globals are the module's, with :func:`prange` replaced by Numba's and every
    other :class:`_Compiled` by its compiled function (compiled then), so compiled functions
    call each other compiled. The module's own names stay these objects."""

    def __init__(self, function, parallel):
        functools.update_wrapper(self, function)
        self.py_func = function
        self.parallel = parallel
        self._dispatcher = None

    def dispatcher(self):
        """The compiled function (Numba imported, and the function compiled or loaded from the
        cache, on first use)."""
        made = self._dispatcher
        if made is None:
            with _MAKING:  # re-entrant: making one makes the compiled functions it calls
                if self._dispatcher is None:
                    self._dispatcher = self._make()
                    _announce_compiling(self._dispatcher)
                made = self._dispatcher
        return made

    def _make(self):
        numba = _numba()
        function = self.py_func
        if numba is None:
            return function
        scope = dict(function.__globals__)
        for name in function.__code__.co_names:
            value = scope.get(name)
            if value is prange:
                scope[name] = numba.prange
            elif isinstance(value, _Compiled):
                scope[name] = value.dispatcher()
        copy = types.FunctionType(function.__code__, scope, function.__name__,
                                  function.__defaults__, function.__closure__)
        copy.__qualname__, copy.__module__ = function.__qualname__, function.__module__
        copy.__doc__ = function.__doc__
        return numba.njit(cache=True, nogil=True, parallel=self.parallel)(copy)

    def __call__(self, *args):
        if self.parallel:
            from . import threads  # looked up at each call: tests vary the cores
            use_cores(threads.usable_cores())
        return self.dispatcher()(*args)

    def load(self, *args):
        """Make the compiled version for ``args``' types ready (loaded from Numba's disk cache,
        or compiled) without running it: what a warm-up thread does, where running a parallel
        function beside the main thread's would make two parallel regions at once (Numba's
        ``workqueue`` threading layer aborts on that)."""
        dispatcher = self.dispatcher()
        if dispatcher is self.py_func:  # no Numba: nothing to make
            return
        import numba
        dispatcher.compile(tuple(numba.typeof(arg) for arg in args))


if HAVE_NUMBA:
    def compiled(function):
        return _Compiled(function, parallel=False)

    def compiled_parallel(function):
        """Compiled with its ``prange`` loops run by Numba's threads (independent iterations
        writing disjoint outputs: the results do not depend on the thread count), as many as
        this process may use (:func:`use_cores` before each call: Numba's pool starts with
        one per core of the machine, which oversubscribes a rank bound to a few cores). To be
        called from Python."""
        return _Compiled(function, parallel=True)

    def thread_count():
        numba = _numba()
        return numba.get_num_threads() if numba is not None else 1
else:  # pragma: no cover - exercised through .py_func in the tests
    def compiled(function):
        function.py_func = function
        function.load = lambda *args: None
        return function

    compiled_parallel = compiled

    def thread_count():
        return 1


def use_cores(cores):
    """Let Numba's parallel loops use ``cores`` threads (at most the pool it started with: it
    starts one per core of the machine, not of this process's affinity)."""
    numba = _numba() if HAVE_NUMBA else None
    if numba is not None:
        numba.set_num_threads(max(1, min(int(cores), numba.config.NUMBA_NUM_THREADS)))


# -- fingerprints of arrays ---------------------------------------------------------------------

#: words per block of :func:`_fingerprint_words` (blocks are summed, so the split does not
#: change the result)
_FINGERPRINT_BLOCK = 1 << 16


# SplitMix64's constants as uint64 scalars: compiled code then keeps every operation in wrapping
# uint64 arithmetic (a plain int would promote to float64 there).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))
_MIX_FACTORS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


@compiled
def splitmix64(z):
    """SplitMix64's finaliser on one uint64 word: a bijective scramble, for compiled code (the
    array form, for NumPy and CuPy, is ``generators._keyed_permutation._mix64``)."""
    s30, s27, s31 = _MIX_SHIFTS
    m1, m2 = _MIX_FACTORS
    z = (z ^ (z >> s30)) * m1
    z = (z ^ (z >> s27)) * m2
    return z ^ (z >> s31)


@compiled_parallel
def _fingerprint_words(words, salt):
    """Sum, modulo 2**64, of :func:`splitmix64` of ``words[i] ^ (salt + i * golden)`` over every
    word: a bijection of each word, so changing any one word changes the sum, and keyed by
    position, so moving words does too (with the odds of a 64-bit collision)."""
    n = len(words)
    blocks = (n + _FINGERPRINT_BLOCK - 1) // _FINGERPRINT_BLOCK
    partial = np.zeros(max(blocks, 1), np.uint64)
    for block in prange(blocks):
        total = np.uint64(0)
        for i in range(block * _FINGERPRINT_BLOCK, min(n, (block + 1) * _FINGERPRINT_BLOCK)):
            total += splitmix64(np.uint64(words[i]) ^ (salt + np.uint64(i) * _GOLDEN))
        partial[block] = total
    total = np.uint64(0)
    for block in range(len(partial)):
        total += partial[block]
    return total


def fingerprint(*arrays):
    """A value that changes when any element of ``arrays`` changes, moves or changes dtype (a
    tuple of dtype, shape and a 64-bit keyed sum per array, computed on every core): to tell
    whether arrays handed to other code came back untouched without keeping a copy."""
    from .arrays import repeated_value
    out = []
    for position, array in enumerate(arrays):
        one = repeated_value(array)
        if one is not None:  # one value repeated (read-only): its value and length say it all
            out.append((array.dtype.str, array.shape, ("repeated", one.tobytes())))
            continue
        flat = np.ascontiguousarray(array).reshape(-1)
        width = flat.dtype.itemsize
        if width not in (1, 2, 4, 8):
            raise TypeError(f"fingerprint: {flat.dtype} elements are not 1, 2, 4 or 8 bytes")
        words = flat.view(f"u{width}")
        out.append((flat.dtype.str, array.shape,
                    int(_fingerprint_words(words, np.uint64(position + 1)))))
    return tuple(out)
