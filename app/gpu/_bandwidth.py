"""Measured memory bandwidth: the roofline every bandwidth-bound kernel is compared with."""
import time

import numpy as np


def device_copy_bandwidth(nbytes=1 << 29, repeats=5):
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written.

    Median of ``repeats`` copies of ``nbytes`` timed with CUDA events.
    """
    import pycuda.driver as cuda
    nbytes = int(min(nbytes, cuda.mem_get_info()[0] // 4))
    src, dst = cuda.mem_alloc(nbytes), cuda.mem_alloc(nbytes)
    try:
        cuda.memset_d8(src, 1, nbytes)
        start, end = cuda.Event(), cuda.Event()
        times = []
        for _ in range(repeats + 1):
            start.record()
            cuda.memcpy_dtod(dst, src, nbytes)
            end.record()
            end.synchronize()
            times.append(end.time_since(start) * 1e-3)
        return 2.0 * nbytes / float(np.median(times[1:]))
    finally:
        src.free()
        dst.free()


def host_to_device_bandwidth(nbytes=1 << 28, repeats=5):
    """Pinned host-to-device copy bandwidth in bytes/s (median of ``repeats``)."""
    import pycuda.driver as cuda
    host = cuda.pagelocked_empty(nbytes, np.uint8)
    dev = cuda.mem_alloc(nbytes)
    try:
        start, end = cuda.Event(), cuda.Event()
        times = []
        for _ in range(repeats + 1):
            start.record()
            cuda.memcpy_htod_async(dev, host)
            end.record()
            end.synchronize()
            times.append(end.time_since(start) * 1e-3)
        return nbytes / float(np.median(times[1:]))
    finally:
        dev.free()
        del host


def host_copy_bandwidth(nbytes=1 << 26, repeats=3):
    """Host memory copy bandwidth in bytes/s (read + write), for the CPU backend's roofline."""
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return 2.0 * src.nbytes / min(times)
