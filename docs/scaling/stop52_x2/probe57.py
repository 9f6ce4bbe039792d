"""session 52: which CuPy routines load SciPy's sparse package (through cupyx), each alone in a
fresh process: the candidates for a set-up without scalar operands."""
import subprocess, sys
SETUP = "a = cp.arange(1000, dtype=cp.int64) % 7 if False else cp.arange(1000, dtype=cp.int64)"
CASES = {
    "fancy index a[idx]": "i = cp.arange(10, dtype=cp.int64); b = a[i]",
    "take": "i = cp.arange(10, dtype=cp.int64); b = cp.take(a, i)",
    "argsort": "b = cp.argsort(a)",
    "sort copy": "b = cp.sort(a)",
    "unique": "b = cp.unique(a)",
    "flatnonzero": "b = cp.flatnonzero(a[1:] != a[:-1])",
    "nonzero": "b = cp.nonzero(a[1:] != a[:-1])",
    "concatenate": "b = cp.concatenate([a, a])",
    "stack": "b = cp.stack([a, a], axis=1)",
    "full": "b = cp.full(5, 3, dtype=cp.int64)",
    "zeros": "b = cp.zeros(5, dtype=cp.int64)",
    "ones": "b = cp.ones(5, dtype=cp.int64)",
    "empty+fill": "b = cp.empty(5, dtype=cp.int64); b.fill(3)",
    "unravel_index": "b = cp.unravel_index(a, (10, 100))",
    "searchsorted": "b = cp.searchsorted(a, a[::7], side='right')",
    "diff": "b = cp.diff(a)",
    "all()": "b = bool((a[1:] > a[:-1]).all())",
    "count_nonzero": "b = int(cp.count_nonzero(a))",
    "max": "b = int(a.max())",
    "setitem scalar": "a[3] = 5",
    "setitem column array": "m = cp.zeros((1000, 3), dtype=cp.int64); m[:, 1] = a",
    "ascontiguousarray": "b = cp.ascontiguousarray(cp.stack([a, a], axis=1)[:, 0])",
    "view/reshape": "b = a.reshape(10, 100)",
    "getitem int": "b = int(a[5])",
    "raw kernel scalar args": "k = cp.RawKernel(r'extern \"C\" __global__ void f(long long* x, long long n, double s){ if (threadIdx.x < n) x[threadIdx.x] += (long long) s; }', 'f'); k((1,), (32,), (a, cp.int64(5), cp.float64(2.0)))",
}
CODE = r'''
import sys, time
import numpy as np, cupy as cp
%s
cp.cuda.Device().synchronize()
before = "scipy.sparse" in sys.modules
%s
cp.cuda.Device().synchronize()
print("after", "scipy.sparse" in sys.modules, "(before %%s)" %% before)
'''
for name, code in CASES.items():
    out = subprocess.run([sys.executable, "-c", CODE % (SETUP, code)], capture_output=True, text=True)
    print(f"{name:24s}", out.stdout.strip()[-60:], out.stderr.strip()[-200:], flush=True)
