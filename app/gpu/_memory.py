"""One device-memory arena per engine: every allocation of every GPU engine goes through it, so
every operation records its peak device bytes (``peak_device_bytes`` in ``/perf``).

Freed blocks are cached by rounded size and reused across repetitions (a repeat allocates the
same sizes as the one before), so the timed loop does not pay ``cuMemAlloc``/``cuMemFree``.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import HisparseError

#: Host arrays of at least this many bytes are uploaded through page-locked staging buffers
#: that several threads fill while the previous piece crosses PCIe (:class:`UploadStager`): the
#: driver's own copy of pageable memory ran at 7.4 GB/s on the H100 host, 16 MiB pieces filled
#: by 4 threads at 15.8 GB/s (1 GiB; 4 MiB pieces: 9.5 GB/s, one thread: 5.5-7.8 GB/s).
STAGED_UPLOAD_MIN_BYTES = 32 << 20
STAGING_PIECE_BYTES = 16 << 20
STAGING_BUFFERS = 3
STAGING_THREADS = 4


def staging_threads():
    """Threads that fill the staging buffers: :data:`STAGING_THREADS`, or as many cores as this
    process may run on when fewer (a launcher's binding); 1 means the driver's own copy."""
    from ..threads import usable_cores
    return max(1, min(STAGING_THREADS, usable_cores()))


class UploadStager:
    """Page-locked buffers, an event for each, one stream and a pool of threads: a large host
    array goes to the device piece by piece, the threads copying the next piece into a free
    buffer while the stream carries the one before. Made by an arena on its first large upload,
    closed with it."""

    def __init__(self, threads):
        import pycuda.driver as cuda
        self.threads = threads
        self.buffers = [cuda.pagelocked_empty(STAGING_PIECE_BYTES, np.uint8)
                        for _ in range(STAGING_BUFFERS)]
        self.events = [cuda.Event() for _ in self.buffers]
        self.stream = cuda.Stream()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="hisparse-upload")

    def upload(self, device_pointer, host):
        """Copy the C-contiguous ``host`` to ``device_pointer``; returns when it is there."""
        import pycuda.driver as cuda

        def send(slot, target, offset):
            cuda.memcpy_htod_async(device_pointer + offset, target, self.stream)
            self.events[slot].record(self.stream)

        upload_in_pieces(host, self.buffers, send, lambda slot: self.events[slot].synchronize(),
                         self.pool, self.threads)
        self.stream.synchronize()

    def close(self):
        self.pool.shutdown()
        for buffer in self.buffers:
            buffer.base.free()
        self.buffers = []


def upload_in_pieces(host, buffers, send, wait, pool=None, threads=1):
    """The piece loop of a staged upload: the C-contiguous ``host``'s bytes in pieces of a
    page-locked buffer's size, each copied into the next free buffer of ``buffers`` (uint8
    arrays) by ``threads`` threads of ``pool`` at once (NumPy lets the interpreter's lock go
    while it copies), then ``send(slot, buffer_piece, byte_offset)`` starts its copy to the
    device; ``wait(slot)`` returns once the buffer's previous piece has left it. The caller
    waits for the last sends."""
    source = host.reshape(-1).view(np.uint8)
    piece_bytes = len(buffers[0])
    pending = [False] * len(buffers)
    for number, lo in enumerate(range(0, len(source), piece_bytes)):
        hi = min(lo + piece_bytes, len(source))
        slot = number % len(buffers)
        if pending[slot]:
            wait(slot)
        target = buffers[slot][:hi - lo]
        _copy_on(pool, threads, target, source[lo:hi])
        send(slot, target, lo)
        pending[slot] = True


def _copy_on(pool, threads, target, source):
    """``target[...] = source`` (uint8 arrays of one length): in ``threads`` slices at once on
    ``pool`` (NumPy lets the interpreter's lock go while it copies), or here without a pool."""
    if pool is None:
        target[:] = source
        return
    share = -(-len(target) // threads)
    list(pool.map(lambda a: np.copyto(target[a:a + share], source[a:a + share]),
                  range(0, len(target), share)))


def download_in_pieces(out, buffers, fetch, wait, pool=None, threads=1):
    """The piece loop of a staged download, :func:`upload_in_pieces` turned round: the
    C-contiguous ``out``'s bytes in pieces of a page-locked buffer's size (``buffers``: two or
    more uint8 arrays); ``fetch(slot, buffer_piece, byte_offset)`` starts piece k's copy from
    the device into buffer ``k % len(buffers)``, and while it crosses piece k - 1 is copied
    out of its buffer into ``out`` (by ``threads`` threads of ``pool``, where fresh memory's
    page faults then run in parallel too) once ``wait(slot)`` says it landed. A buffer is
    refilled only after its piece was copied out (the piece before it, two or more back)."""
    target = out.reshape(-1).view(np.uint8)
    piece_bytes = len(buffers[0])
    pending = None  # (slot, lo, hi) of the piece fetched last, not yet copied out

    def copy_out(slot, lo, hi):
        wait(slot)
        _copy_on(pool, threads, target[lo:hi], buffers[slot][:hi - lo])

    for number, lo in enumerate(range(0, len(target), piece_bytes)):
        hi = min(lo + piece_bytes, len(target))
        slot = number % len(buffers)
        fetch(slot, buffers[slot][:hi - lo], lo)
        if pending is not None:
            copy_out(*pending)
        pending = (slot, lo, hi)
    if pending is not None:
        copy_out(*pending)


def free_pinned(array):
    """Give a page-locked host array (``pycuda.driver.pagelocked_*``) back now, not at garbage
    collection, while this rank's context is current."""
    if array is not None and hasattr(array.base, "free"):
        array.base.free()


def staged_download(device_pointer, out, stream, piece_bytes, buffers=None):
    """Copy ``out.nbytes`` bytes from ``device_pointer`` into the C-contiguous host array
    ``out`` in pieces, through two page-locked buffers: the stream copies piece i into one
    while the host copies piece i - 1 out of the other. Returns when ``out`` holds them.

    ``buffers``: two page-locked uint8 arrays of the same size to reuse (a caller downloading
    several arrays); by default two of ``piece_bytes`` (at most ``out``'s size) are made and
    given back here. (SpTV's Y: 2 MiB pieces measured best; SpGEMM's C: 64 MiB.)"""
    import pycuda.driver as cuda
    flat = out.reshape(-1).view(np.uint8)
    own = buffers is None
    if own:
        size = max(1, min(int(piece_bytes), flat.nbytes))
        buffers = [cuda.pagelocked_empty(size, np.uint8) for _ in range(2)]
    try:
        landed = [cuda.Event() for _ in buffers]

        def fetch(slot, piece, offset):
            cuda.memcpy_dtoh_async(piece, int(device_pointer) + offset, stream)
            landed[slot].record(stream)

        download_in_pieces(out, buffers, fetch, lambda slot: landed[slot].synchronize())
    finally:
        if own:
            for buffer in buffers:
                free_pinned(buffer)


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
        self._stager = None  # UploadStager, made on the first large upload

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
        stay alive, and be page-locked for the copy to overlap). Without a stream, an array of
        at least :data:`STAGED_UPLOAD_MIN_BYTES` goes through the arena's
        :class:`UploadStager` when this process may use more than one core."""
        import pycuda.driver as cuda
        host = np.ascontiguousarray(host)
        array = self.empty(host.shape, host.dtype, what)
        if host.size:
            if stream is None and host.nbytes >= STAGED_UPLOAD_MIN_BYTES and \
                    (self._stager is not None or staging_threads() > 1):
                if self._stager is None:
                    self._stager = UploadStager(staging_threads())
                self._stager.upload(int(array.gpudata), host)
            elif stream is None:
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
        if self._stager is not None:
            self._stager.close()
            self._stager = None

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
