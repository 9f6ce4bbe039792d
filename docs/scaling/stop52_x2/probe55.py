"""session 52: which CuPy operations load SciPy's sparse package (through cupyx), checked by
sys.modules after each in a fresh process; and whether that import overlaps MPI's and CUDA's
start in a background thread."""
import subprocess, sys
CASES = {
    "numpy scalar": "a = cp.arange(8, dtype=cp.uint64); b = a * np.uint64(3)",
    "python int": "a = cp.arange(8, dtype=cp.int64); b = a * 3",
    "array op": "a = cp.arange(8, dtype=cp.uint64); b = a * a",
    "astype": "a = cp.arange(8, dtype=cp.int64); b = a.astype(cp.float64)",
    "cumsum": "a = cp.arange(8, dtype=cp.int64); b = cp.cumsum(a)",
    "sort": "a = cp.arange(8, dtype=cp.int64); b = cp.sort(a)",
    "bincount": "a = cp.arange(8, dtype=cp.int64); b = cp.bincount(a)",
    "clip": "a = cp.arange(8, dtype=cp.int64); b = cp.clip(a, 1, 5)",
    "elementwise kernel": "k = cp.ElementwiseKernel('T x', 'T y', 'y = x * 3', 'probe55_k'); b = k(cp.arange(8))",
    "raw module": "m = cp.RawModule(code='extern \"C\" __global__ void f(long long* x){x[threadIdx.x]*=3;}'); a = cp.arange(8); m.get_function('f')((1,), (8,), (a,))",
}
CODE = r'''
import sys, time
import numpy as np, cupy as cp
cp.zeros(1)
before = "scipy.sparse" in sys.modules
t = time.perf_counter()
%s
cp.cuda.Device().synchronize()
print("  scipy.sparse before %%s after %%s; %%.3f s" %% (before, "scipy.sparse" in sys.modules, time.perf_counter() - t))
'''
for name, code in CASES.items():
    out = subprocess.run([sys.executable, "-c", CODE % code], capture_output=True, text=True)
    print(name, out.stdout.strip()[-300:], out.stderr.strip()[-300:], flush=True)
START = r'''
import threading, time, sys
t0 = time.perf_counter()
side = None
if %r:
    side = threading.Thread(target=lambda: __import__("scipy.sparse")); side.start()
from mpi4py import MPI
import pycuda.driver as cu
cu.init(); ctx = cu.Device(0).retain_primary_context(); ctx.push()
import cupy
t1 = time.perf_counter()
if side: side.join()
t2 = time.perf_counter()
import scipy.sparse
t3 = time.perf_counter()
print("  thread %%s: main %%.3f, joined %%.3f, all %%.3f" %% (%r, t1 - t0, t2 - t0, t3 - t0))
ctx.pop()
'''
for _ in range(3):
    for threaded in (False, True):
        out = subprocess.run([sys.executable, "-c", START % (threaded, threaded)], capture_output=True, text=True)
        print(out.stdout.strip(), out.stderr.strip()[-300:], flush=True)
