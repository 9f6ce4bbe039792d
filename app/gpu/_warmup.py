"""CUDA's initialisation in the background while the process imports the rest.

``cuInit`` (0.18 s on the H100 host) and the creation of the primary context (0.12 s) come
before any GPU work, and PyCUDA makes both holding the interpreter's lock, so nothing else runs
meanwhile. Made here through ctypes, which lets the lock go during a foreign call, in a thread
that ``hisparse run`` starts before it imports NumPy, h5py, MPI and the operations, they overlap
with those imports. PyCUDA then finds the driver initialised and the primary context made (it
takes its own reference); :meth:`CudaWarmup.finish` drops this one. Only the driver library and
the standard library are used here: nothing to import first.
"""
import ctypes
import threading

from ._device import select_device_ordinal


class CudaWarmup:
    """Starts a daemon thread that initialises CUDA and, when ``local_rank`` is known
    (:func:`hisparse.parallel._launcher.guess_local_rank`), retains the primary context of the
    device :func:`~hisparse.gpu.select_device_ordinal` will give that rank. Every failure (no
    driver, no device) ends the thread quietly: the run's own binding meets and reports it."""

    def __init__(self, local_rank, library="libcuda.so.1"):
        self.local_rank = local_rank
        self.library = library
        self.ordinal = None
        self.retained = False  # whether this thread holds a primary-context reference
        self._driver = None
        self._device = ctypes.c_int(-1)
        self.thread = threading.Thread(target=self._warm, name="hisparse-cuda-warmup",
                                       daemon=True)
        self.thread.start()

    def _warm(self):
        try:
            self._initialise()
        except (OSError, AttributeError, ValueError):
            pass  # no driver library, or one without these entry points: the binding reports

    def _initialise(self):
        driver = ctypes.CDLL(self.library)
        if driver.cuInit(0) != 0 or self.local_rank is None:
            return
        count = ctypes.c_int(0)
        if driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            return
        ordinal = select_device_ordinal(self.local_rank, count.value)
        context = ctypes.c_void_p()
        if driver.cuDeviceGet(ctypes.byref(self._device), ordinal) != 0:
            return
        if driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), self._device) == 0:
            self._driver, self.ordinal, self.retained = driver, ordinal, True

    def finish(self):
        """Wait for the thread and drop its primary-context reference (after the run's binding
        took its own, or when the run is not on the GPU: the context then goes). Idempotent."""
        self.thread.join()
        if self.retained:
            release = getattr(self._driver, "cuDevicePrimaryCtxRelease_v2", None) or \
                self._driver.cuDevicePrimaryCtxRelease
            release(self._device)
            self.retained = False
