"""Stop 58: a large host array to a CuPy array, three ways, on one GPU: cupy.asarray (CuPy's
copy through a page-locked buffer it allocates), cupy.empty + ndarray.set (the driver's copy of
pageable memory), and the project's host_to_device (pieces through page-locked buffers filled
on threads); each three times, int32 and float64, 128 MiB to 1 GiB, checked equal."""
import time

import numpy as np
import cupy

from hisparse.gpu import host_to_device

rng = np.random.default_rng(0)
for nbytes in (128 << 20, 512 << 20, 1 << 30):
    for dtype in (np.int32, np.float64):
        host = rng.integers(0, 1 << 30, nbytes // np.dtype(dtype).itemsize).astype(dtype)
        ways = {"asarray": lambda: cupy.asarray(host),
                "empty+set": lambda: (lambda a: (a.set(host), a)[1])(cupy.empty(host.shape, host.dtype)),
                "host_to_device": lambda: host_to_device(cupy, host)}
        for name, way in ways.items():
            seconds = []
            for _ in range(3):
                cupy.cuda.Device().synchronize()
                began = time.perf_counter()
                out = way()
                cupy.cuda.Device().synchronize()
                seconds.append(time.perf_counter() - began)
                assert bool((out[-5:].get() == host[-5:]).all()) and out.shape == host.shape
                del out
                cupy.get_default_memory_pool().free_all_blocks()
            print(f"{nbytes >> 20:5d} MiB {np.dtype(dtype).name:8s} {name:15s} "
                  + " ".join(f"{s:6.3f}" for s in seconds)
                  + f"  ({nbytes / min(seconds) / 1e9:5.1f} GB/s)", flush=True)
