"""session 52: the CuPy frame that loads cupyx (and with it SciPy's sparse package) at an
operation between an array and a scalar: the stack when cupyx's body starts importing."""
import importlib.abc, sys, traceback


class Trap(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "cupyx.linalg" and name not in sys.modules:
            frames = [f for f in traceback.extract_stack()[:-1] if "importlib" not in f.filename]
            for f in frames[-14:]:
                print(f"  {f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}: {f.line}")
        return None


sys.meta_path.insert(0, Trap())
import numpy as np, cupy as cp
a = cp.arange(8, dtype=cp.int64)
print("array * python int:")
b = a * 3
print("bincount after:", "scipy.sparse" in sys.modules)
