"""Stop 64 probe (one GPU): the SpMV chain's step between products (``scale_sum_squares`` of
``kernels_cu/spmv_csr.cu``: x = y * s, and the sum of the new x^2, in one launch) at the sizes of
27-pt 160^3 on one GPU (4,096,000 rows) and at one rank's share at 2 and 4 ranks, with the
grid's block count varied and against a variant that reads and writes two values per load
(16-byte vectors, two loads in flight per thread per step). Back-to-back launches on one stream,
timed by CUDA events; the sums checked against NumPy.

    python3 docs/scaling/stop64_h200/next_x_probe.py
"""
import os

import numpy as np
import pycuda.autoinit  # noqa: F401
import pycuda.driver as cuda
import pycuda.gpuarray as gpuarray
from pycuda.compiler import SourceModule

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "..", "..", "..", "kernels_cu")

VARIANT = r'''
#include "spmv_csr.cu"
// two 16-byte vectors (4 values) a thread per step, the remainder by thread 0
extern "C" __global__ void scale_sum_squares_vec(const long long n, const int scaled,
    const double* __restrict__ y, double* __restrict__ x, double* __restrict__ partial,
    unsigned int* __restrict__ blocks_done, double* norm2)
{
    __shared__ bool last_block;
    double scale = 1.0;
    if (scaled) {
        const double squared = norm2[0];
        scale = squared > 0.0 ? 1.0 / sqrt(squared) : 0.0;
    }
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long pairs = n / 2;
    const double2* y2 = reinterpret_cast<const double2*>(y);
    double2* x2 = reinterpret_cast<double2*>(x);
    double sum = 0;
    long long i = global_thread_id();
    for (; i + stride < pairs; i += 2 * stride) {
        double2 a = __ldcs(&y2[i]);
        double2 b = __ldcs(&y2[i + stride]);
        a.x *= scale; a.y *= scale; b.x *= scale; b.y *= scale;
        x2[i] = a; x2[i + stride] = b;
        sum += a.x * a.x + a.y * a.y + b.x * b.x + b.y * b.y;
    }
    if (i < pairs) {
        double2 a = y2[i];
        a.x *= scale; a.y *= scale;
        x2[i] = a;
        sum += a.x * a.x + a.y * a.y;
    }
    if (global_thread_id() == 0 && (n & 1)) {
        const double v = y[n - 1] * scale;
        x[n - 1] = v;
        sum += v * v;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sum;
        __threadfence();
        last_block = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_block) return;
    sum = 0;
    for (unsigned int b = threadIdx.x; b < gridDim.x; b += blockDim.x)
        sum += ((volatile double*)partial)[b];
    sum = block_sum(sum);
    if (threadIdx.x == 0) { norm2[0] = sum; *blocks_done = 0u; }
}
'''

module = SourceModule(VARIANT, include_dirs=[os.path.abspath(KERNELS)], no_extern_c=True,
                      options=["-DVALUE_T=double", "-DINDEX_T=int", "-O3"])
kernels = {"current": module.get_function("scale_sum_squares"),
           "vec": module.get_function("scale_sum_squares_vec")}
stream = cuda.Stream()
start, end = cuda.Event(), cuda.Event()
LAUNCHES = 400
for n in (4_096_000, 2_048_000, 1_024_000):
    rng = np.random.default_rng(n)
    host = rng.standard_normal(n)
    y = gpuarray.to_gpu(host)
    x = gpuarray.empty_like(y)
    for name, kernel in kernels.items():
        for blocks in (264, 528, 1024, 2112, 4224):
            partial = gpuarray.zeros(blocks, np.float64)
            done = gpuarray.zeros(1, np.uint32)
            norm2 = gpuarray.to_gpu(np.array([4.0]))
            args = (np.int64(n), np.int32(1), y.gpudata, x.gpudata, partial.gpudata,
                    done.gpudata, norm2.gpudata)
            kernel(*args, block=(256, 1, 1), grid=(blocks, 1), stream=stream)
            stream.synchronize()
            got = norm2.get()[0]
            want = float(np.sum((host * 0.5) ** 2))
            ok = abs(got - want) <= 1e-9 * want and np.allclose(x.get(), host * 0.5)
            norm2.set(np.array([4.0]))
            start.record(stream)
            for _ in range(LAUNCHES):
                kernel(*args, block=(256, 1, 1), grid=(blocks, 1), stream=stream)
                # (norm2 now changes each launch; the time does not depend on its value)
            end.record(stream)
            end.synchronize()
            us = end.time_since(start) * 1e3 / LAUNCHES
            gbps = 2 * n * 8 / us / 1e3
            print(f"n={n:>9,} {name:8s} blocks={blocks:5d}: {us:7.2f} us  {gbps:7.1f} GB/s"
                  f"  {'ok' if ok else 'WRONG'}")
