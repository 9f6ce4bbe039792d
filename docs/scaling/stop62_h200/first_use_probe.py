"""What the SpMV plan's GPU passes (hisparse.gpu.RowsOnDevice) pay the first time a process
runs them, beyond the work: each pass run twice in a fresh process on the same blocks (an
R-MAT-like power-law matrix, 2M rows, 16M entries, uniform values; this rank half its rows),
the second run's time the work alone. CuPy's element-wise and scan kernels are compiled once
per machine (its disk cache, warmed by a first process) and then loaded once per process."""
import sys
import time
import numpy as np

from hisparse import generators
from hisparse.distmatrix import local_positions
from hisparse.formats import CSRMatrix
from hisparse.gpu import RowsOnDevice, bind_device

device = bind_device(0)
began = time.perf_counter()
import cupy  # noqa: E402,F401  (timed: what a process pays for it)
print(f"import cupy {time.perf_counter() - began:.3f} s", flush=True)
n = 2_000_000
whole = generators.random_matrix(n, n, nnz_per_row=8, seed=3, power_law=1.2)
half = n // 2
matrix = CSRMatrix(whole.indptr[:half + 1].copy(), whole.indices[:whole.indptr[half]].copy(),
                   np.full(int(whole.indptr[half]), 1.0), (half, n))
position = local_positions(np.arange(half, dtype=np.int64), n)
print(f"block {matrix.nrows} rows, {matrix.nnz} entries", flush=True)
rows = RowsOnDevice(same_values=True)
steps = [
    ("split", lambda: rows.split(matrix, position, half)),
    ("degree_order", lambda: rows.degree_order(np.diff(matrix.indptr), matrix.nnz)),
    ("use_order", lambda: rows.use_order(matrix.indices, n)),
]
order = None
for label, step in steps:
    times = []
    for _ in range(2):
        began = time.perf_counter()
        made = step()
        times.append(time.perf_counter() - began)
    assert made is not None, label
    if label == "degree_order":
        order = made
    print(f"{label:14s} first {times[0]:.3f} s  second {times[1]:.3f} s", flush=True)
local = rows.split(matrix, position, half)[0]
row_ids, inverse = order
new_column = np.arange(local.ncols, dtype=np.int64)[::-1].copy()
for label, step in [("renumbered", lambda: rows.renumbered(local, row_ids, new_column)),
                    ("rows", lambda: rows.rows(local, row_ids[: local.nrows // 2]))]:
    times = []
    for _ in range(2):
        began = time.perf_counter()
        made = step()
        times.append(time.perf_counter() - began)
    assert made is not None, label
    print(f"{label:14s} first {times[0]:.3f} s  second {times[1]:.3f} s", flush=True)
device.release()
sys.exit(0)
