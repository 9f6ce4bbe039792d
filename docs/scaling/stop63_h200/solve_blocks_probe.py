"""solve_rows alone (rank 16, fp64) on the 20M benchmark's modes at one, two and four ranks'
rows, with fewer blocks than today's grid (at most PARTIAL_BUDGET / 273 = 120) and 256, 512 or
1024 threads a block: the last block adds up every block's partial products (273 doubles each),
a chain that grows with the blocks, while a block's own rows (39 at four ranks' 4592 rows) are a
few multiply-adds a thread. Each variant checked against NumPy, timed by CUDA events over 300
prepared launches on one stream (stop 62's solve_probe.py: 14-20 us as is)."""
import os
import numpy as np
import pycuda.autoinit  # noqa: F401
import pycuda.driver as cuda
import pycuda.gpuarray as gpuarray
from pycuda.compiler import SourceModule
import hisparse.ops.cpals.gpu as engine_module
from hisparse.ops.cpals.gpu import solve_grid

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.abspath(os.path.join(HERE, "../../../kernels_cu"))
R = 16
SOURCE = open(os.path.join(KERNELS, "cpals_dense.cu")).read()
ROWS = (12092, 9184, 28818, 6046, 4592, 14409, 3023, 2296, 7205)
rng = np.random.default_rng(1)
stream = cuda.Stream()
default_blocks, default_rows = engine_module.MAX_SOLVE_BLOCKS, engine_module.MIN_SOLVE_ROWS
# d117: (threads, most blocks); d118: MIN_SOLVE_ROWS instead, at 512 threads ("rows" argument)
import sys
BY_ROWS = sys.argv[1:] == ["rows"]
SETTINGS = [(512, default_blocks, rows) for rows in (32, 64, 96, 128, 160)] if BY_ROWS else \
    [(threads, most, default_rows) for threads in (512, 256, 1024)
     for most in (default_blocks, 64, 32, 16, 8)]
modules = {}
for threads, most, min_rows in SETTINGS:
    if True:
        if threads not in modules:
            mod = SourceModule(SOURCE, options=["-DVALUE_T=double", "-DINDEX_T=int", "-DORDER=3",
                                                f"-DRANK={R}", f"-DSOLVE_THREADS={threads}"],
                               include_dirs=[KERNELS], no_extern_c=True, arch="sm_90")
            fn = mod.get_function("solve_rows")
            fn.prepare("iiPPPPPPP")
            modules[threads] = (mod, fn)
        fn = modules[threads][1]
        engine_module.MAX_SOLVE_BLOCKS = most
        engine_module.MIN_SOLVE_ROWS = min_rows
        line = []
        for n in ROWS:
            blocks, rpb = solve_grid(n, R)
            m = gpuarray.to_gpu(rng.standard_normal((n, R)))
            host_m = m.get()
            vinv = gpuarray.to_gpu(np.eye(R) + 0.01 * rng.standard_normal((R, R)))
            u = gpuarray.zeros((n, R), np.float64)
            partial = gpuarray.zeros(blocks * (R * R + 1 + R), np.float64)
            done = gpuarray.zeros(1, np.uint32)
            total = gpuarray.zeros(R * R + 1 + R, np.float64)
            args = (np.int32(n), np.int32(rpb), m.gpudata, vinv.gpudata, u.gpudata,
                    partial.gpudata, done.gpudata, total.gpudata, np.intp(0))
            fn.prepared_async_call((blocks, 1), (threads, 1, 1), stream, *args)
            stream.synchronize()
            update = host_m @ vinv.get()
            expect = np.concatenate([(update.T @ update).ravel(), [np.sum(update * host_m)],
                                     np.abs(update).max(axis=0)])
            error = np.max(np.abs(total.get() - expect) / np.maximum(np.abs(expect), 1e-300))
            assert error < 1e-10 and not m.get().any(), (threads, most, n, error)
            for _ in range(20):
                fn.prepared_async_call((blocks, 1), (threads, 1, 1), stream, *args)
            a, b = cuda.Event(), cuda.Event()
            a.record(stream)
            for _ in range(300):
                fn.prepared_async_call((blocks, 1), (threads, 1, 1), stream, *args)
            b.record(stream)
            b.synchronize()
            line.append(f"{n}/{blocks}:{b.time_since(a) * 1e3 / 300:6.2f}")
        print(f"threads {threads:4d} most {most:3d} min rows {min_rows:3d} ", " ".join(line), "us", flush=True)
engine_module.MAX_SOLVE_BLOCKS, engine_module.MIN_SOLVE_ROWS = default_blocks, default_rows
