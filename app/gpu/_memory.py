"""One device-memory arena per engine: every allocation of every GPU engine goes through it, so
every operation records its peak device bytes (``peak_device_bytes`` in ``/perf``).

Freed blocks are cached by rounded size and reused across repetitions (a repeat allocates the
same sizes as the one before), so the timed loop does not pay ``cuMemAlloc``/``cuMemFree``.
"""
import numpy as np

from ..errors import HisparseError


class DeviceBuffer:
    """A block handed out by :class:`DeviceArena`; ``int(buffer)`` is its device pointer, so it
    serves as ``gpudata`` of a PyCUDA ``GPUArray`` and as a kernel argument."""

    __slots__ = ("allocation", "size")

    def __init__(self, allocation, size):
        self.allocation, self.size = allocation, size

    @property
    def ptr(self):
        return int(self.allocation)

    def __int__(self):
        return int(self.allocation)

    __index__ = __int__


class DeviceArena:
    """Device allocations with exact accounting and a per-size cache.

    ``peak_reserved`` is the high-water mark of bytes held from the driver (in use + cached), the
    analogue of CuPy's memory-pool total; ``peak_in_use`` that of bytes handed out.

    Parameters
    ----------
    owner : str
        Named in the out-of-memory error (e.g. ``"spgemm"``).
    hint : str
        What the user can do about running out (appended to the error).
    """

    def __init__(self, owner="hisparse", hint="use more ranks or a smaller input"):
        self.owner, self.hint = owner, hint
        self.in_use = 0
        self.reserved = 0
        self.peak_in_use = 0
        self.peak_reserved = 0
        self._cache = {}
        self._arrays = {}  # id(GPUArray) -> (GPUArray, DeviceBuffer), for release()

    @staticmethod
    def _round(nbytes):
        nbytes = max(int(nbytes), 1)
        granule = 2 << 20 if nbytes > (2 << 20) else 512
        return -(-nbytes // granule) * granule

    def alloc(self, nbytes, what="buffer"):
        """A :class:`DeviceBuffer` of at least ``nbytes`` (at least one byte)."""
        import pycuda.driver as cuda
        size = self._round(nbytes)
        cached = self._cache.get(size)
        if cached:
            allocation = cached.pop()
        else:
            try:
                allocation = cuda.mem_alloc(size)
            except cuda.MemoryError:
                self.release_cache()
                try:
                    allocation = cuda.mem_alloc(size)
                except cuda.MemoryError:
                    raise HisparseError(
                        f"{self.owner}: out of device memory allocating {size / 2**20:.1f} MiB "
                        f"for {what} ({self.in_use / 2**20:.1f} MiB in use); "
                        f"{self.hint}") from None
            self.reserved += size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.in_use += size
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return DeviceBuffer(allocation, size)

    def free(self, buffer):
        """Return a buffer to the cache (``None`` is ignored)."""
        if buffer is None:
            return
        self.in_use -= buffer.size
        self._cache.setdefault(buffer.size, []).append(buffer.allocation)

    # -- GPUArray views -------------------------------------------------------------------------
    def empty(self, shape, dtype, what="array"):
        """An uninitialised ``GPUArray`` backed by the arena (a zero-size array still gets a
        valid pointer, so kernels may be handed it)."""
        import pycuda.gpuarray as gpuarray
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64)) if np.ndim(shape) else int(shape)
        buffer = self.alloc(count * dtype.itemsize, what)
        # The driver allocation itself is the array's gpudata, so every PyCUDA call accepts it.
        array = gpuarray.GPUArray(shape, dtype, gpudata=buffer.allocation)
        self._arrays[id(array)] = (array, buffer)
        return array

    def zeros(self, shape, dtype, what="array", stream=None):
        array = self.empty(shape, dtype, what)
        if array.size:
            import pycuda.driver as cuda
            if stream is None:
                cuda.memset_d8(array.gpudata, 0, array.nbytes)
            else:
                cuda.memset_d8_async(array.gpudata, 0, array.nbytes, stream)
        return array

    def to_device(self, host, what="array", stream=None):
        """Upload a host array (asynchronously on ``stream`` when given: the host array must then
        stay alive, and be page-locked for the copy to overlap)."""
        import pycuda.driver as cuda
        host = np.ascontiguousarray(host)
        array = self.empty(host.shape, host.dtype, what)
        if host.size:
            if stream is None:
                cuda.memcpy_htod(array.gpudata, host)
            else:
                cuda.memcpy_htod_async(array.gpudata, host, stream)
        return array

    def release(self, *arrays):
        """Give arrays made by :meth:`empty`/:meth:`to_device` back (others are ignored)."""
        for array in arrays:
            if array is None:
                continue
            entry = self._arrays.pop(id(array), None)
            if entry is not None:
                self.free(entry[1])

    def release_all(self):
        """Give back every array still held, then return the cache to the driver."""
        for _, buffer in list(self._arrays.values()):
            self.free(buffer)
        self._arrays.clear()
        self.release_cache()

    def release_cache(self):
        """Give cached (free) blocks back to the driver."""
        for size, blocks in self._cache.items():
            for allocation in blocks:
                allocation.free()
                self.reserved -= size
        self._cache = {}

    def reset_peaks(self):
        self.peak_in_use = self.in_use
        self.peak_reserved = self.reserved

    def stats(self):
        """Per-rank figures for ``/perf``."""
        return {"peak_device_bytes": int(self.peak_in_use),
                "peak_device_reserved_bytes": int(self.peak_reserved)}
