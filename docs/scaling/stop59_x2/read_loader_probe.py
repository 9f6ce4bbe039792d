"""stop 59: does the thread that loads the compiled loops from Numba's cache (SpMV's
before_read: load_renumber_loops, and at several ranks the split's) slow R-MAT's read on the
GPU? argv: scale loader(0|1|2: none, the renumbering's, both) [switch interval, seconds: the
interpreter's, while the loader runs]. One read as rmat_read_probe.py times it (rank 0's part of
1 rank), the loader started just before, then its own time."""
import sys
import time

import numpy as np

scale, loader = int(sys.argv[1]), int(sys.argv[2])
if len(sys.argv) > 3:
    sys.setswitchinterval(float(sys.argv[3]))
began = time.perf_counter()
import cupy  # noqa: E402
cupy.zeros(1)
from hisparse import generators  # noqa: E402
from hisparse.formats import load_renumber_loops  # noqa: E402
from hisparse.distmatrix._row_blocks import load_split_loops  # noqa: E402
from hisparse.threads import in_background, fill_into  # noqa: E402
ready = time.perf_counter()
steps = [lambda: load_renumber_loops(np.float64)] + \
    ([lambda: load_split_loops(np.float64)] if loader > 1 else [])
thread = in_background(steps, "probe-loader") if loader else None
spec = generators.validate_spec({"kind": "rmat", "scale": scale, "edge_factor": 16, "seed": 0})
whole = generators.part_source(spec).whole_on_device
t0 = time.perf_counter()
indptr, columns = whole.make()
cupy.cuda.Device().synchronize()
t1 = time.perf_counter()
mine = whole.download(columns, 0, int(indptr[-1]), np.int32)
t2 = time.perf_counter()
del columns
whole.release()
t3 = time.perf_counter()
if thread is not None:
    thread.join()
t4 = time.perf_counter()
print(f"loader {loader} switch {sys.getswitchinterval():.4f}: imports {ready - began:.3f}  make {t1 - t0:.3f}  download {t2 - t1:.3f}  "
      f"release {t3 - t2:.3f}  read {t3 - t0:.3f}  then waited for the loader {t4 - t3:.3f} "
      f"(it took {getattr(thread, 'seconds', float('nan')):.3f})", flush=True)
