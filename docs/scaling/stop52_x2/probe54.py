"""session 52: which CuPy operation imports cupyx (0.41-0.45 s on the H200 host, inside the
tensor generator's first call), with the stack that imports it, and what the import costs with
SciPy's sparse package already imported."""
import subprocess, sys
CASES = {
    "numpy scalar": "a = cp.arange(8, dtype=cp.uint64); b = a * np.uint64(3)",
    "python int": "a = cp.arange(8, dtype=cp.int64); b = a * 3",
    "0-d array": "a = cp.arange(8, dtype=cp.uint64); b = a * cp.asarray(np.uint64(3))",
    "array op": "a = cp.arange(8, dtype=cp.uint64); b = a * a",
    "astype": "a = cp.arange(8, dtype=cp.int64); b = a.astype(cp.float64)",
    "cumsum": "a = cp.arange(8, dtype=cp.int64); b = cp.cumsum(a)",
    "sort": "a = cp.arange(8, dtype=cp.int64); b = cp.sort(a)",
    "bincount": "a = cp.arange(8, dtype=cp.int64); b = cp.bincount(a)",
    "shift": "a = cp.arange(8, dtype=cp.uint64); b = a >> np.uint64(3)",
    "clip": "a = cp.arange(8, dtype=cp.int64); b = cp.clip(a, 1, 5)",
    "floor": "a = cp.arange(8, dtype=cp.float64); b = cp.floor(a)",
}
HOOK = r'''
import sys, time, traceback, importlib.abc
class Trap(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "cupyx" and "cupyx" not in sys.modules:
            stack = [l for l in traceback.format_stack()[:-1] if "importlib" not in l]
            print("  cupyx imported from:", "".join(stack[-6:]).replace("\n", " | ")[:900])
        return None
sys.meta_path.insert(0, Trap())
import numpy as np, cupy as cp
cp.zeros(1)
t = time.perf_counter()
%s
cp.cuda.Device().synchronize()
print("  cupyx in modules:", "cupyx" in sys.modules, "%%.3f s" %% (time.perf_counter() - t))
'''
for name, code in CASES.items():
    print(name, flush=True)
    out = subprocess.run([sys.executable, "-c", HOOK % code], capture_output=True, text=True)
    print(out.stdout.strip()[-1200:], out.stderr.strip()[-300:])
for stmt in ("import scipy.sparse", "import cupy", "import cupyx", "import scipy.sparse; import cupy; import cupyx"):
    code = "import time; t=time.perf_counter(); %s; print(%r, '%%.3f' %% (time.perf_counter()-t))" % (stmt, stmt)
    for _ in range(2):
        print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())
code = "import time; import cupy; t=time.perf_counter(); import scipy.sparse; t1=time.perf_counter(); import cupyx; print('after cupy: scipy.sparse %.3f, then cupyx %.3f' % (t1-t, time.perf_counter()-t1))"
print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())
code = "import time; import cupy; t=time.perf_counter(); import cupyx; print('after cupy: cupyx %.3f' % (time.perf_counter()-t)); import sys; print(sorted(m for m in sys.modules if m.startswith('scipy'))[:8])"
print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())
