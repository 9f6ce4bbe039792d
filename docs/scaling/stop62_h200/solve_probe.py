"""solve_rows alone on the 20M benchmark's modes (rank 16, fp64) at one and two ranks' rows:
the kernel as it is and variants, each checked against NumPy and timed by CUDA events over 300
prepared launches on one stream (the GPU's time: a launch takes ~3 us of host time, the kernel
15-23 us, Nsight Compute in d106). Variants: M and U declared __restrict__ (they never alias;
without it the compiler cannot issue a thread's later loads of M before its earlier stores of
U), and more, smaller blocks (the partial budget doubled)."""
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
RESTRICT = SOURCE.replace(
    "const INDEX_T n_rows, const INDEX_T rows_per_block, VALUE_T* m_rows,\n"
    "    const VALUE_T* __restrict__ vinv, VALUE_T* u_rows,",
    "const INDEX_T n_rows, const INDEX_T rows_per_block, VALUE_T* __restrict__ m_rows,\n"
    "    const VALUE_T* __restrict__ vinv, VALUE_T* __restrict__ u_rows,")
assert RESTRICT != SOURCE
BASE = ["-DVALUE_T=double", "-DINDEX_T=int", "-DORDER=3", f"-DRANK={R}", "-DSOLVE_THREADS=512"]
VARIANTS = [("as is", SOURCE, [], 1), ("restrict", RESTRICT, [], 1),
            ("restrict, 2x budget", RESTRICT, [], 2), ("as is, 2x budget", SOURCE, [], 2),
            ("restrict, tiles 2048", RESTRICT, ["-DTILE_DOUBLES=2048"], 1)]
rng = np.random.default_rng(1)
stream = cuda.Stream()
budget = engine_module.PARTIAL_BUDGET
for label, source, extra, scale in VARIANTS:
    engine_module.PARTIAL_BUDGET = budget * scale
    mod = SourceModule(source, options=BASE + extra, include_dirs=[KERNELS], no_extern_c=True,
                       arch="sm_90")
    fn = mod.get_function("solve_rows")
    fn.prepare("iiPPPPPPP")
    regs = fn.get_attribute(cuda.function_attribute.NUM_REGS)
    line = []
    for n in (12092, 9184, 28818, 6046, 4592, 14409):
        blocks, rpb = solve_grid(n, R)
        m = gpuarray.to_gpu(rng.standard_normal((n, R)))
        host_m = m.get()
        vinv = gpuarray.to_gpu(np.eye(R) + 0.01 * rng.standard_normal((R, R)))
        u = gpuarray.zeros((n, R), np.float64)
        partial = gpuarray.zeros(blocks * (R * R + 1 + R), np.float64)
        done = gpuarray.zeros(1, np.uint32)
        total = gpuarray.zeros(R * R + 1 + R, np.float64)
        args = (np.int32(n), np.int32(rpb), m.gpudata, vinv.gpudata, u.gpudata, partial.gpudata,
                done.gpudata, total.gpudata, np.intp(0))
        fn.prepared_async_call((blocks, 1), (512, 1, 1), stream, *args)
        stream.synchronize()
        update = host_m @ vinv.get()
        expect = np.concatenate([(update.T @ update).ravel(), [np.sum(update * host_m)],
                                 np.abs(update).max(axis=0)])
        error = np.max(np.abs(total.get() - expect) / np.maximum(np.abs(expect), 1e-300))
        assert error < 1e-10 and not m.get().any(), (label, n, error)  # M zeroed after
        for _ in range(20):
            fn.prepared_async_call((blocks, 1), (512, 1, 1), stream, *args)
        a, b = cuda.Event(), cuda.Event()
        a.record(stream)
        for _ in range(300):
            fn.prepared_async_call((blocks, 1), (512, 1, 1), stream, *args)
        b.record(stream)
        b.synchronize()
        line.append(f"{n}/{blocks}:{b.time_since(a) * 1e3 / 300:6.2f}")
    print(f"{label:24s} regs {regs:3d} ", " ".join(line), "us", flush=True)
engine_module.PARTIAL_BUDGET = budget
