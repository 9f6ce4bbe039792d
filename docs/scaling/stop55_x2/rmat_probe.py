"""session 55: where R-MAT's one-rank generation goes on the GPU host, and what CuPy's sort costs."""
import sys, time
import numpy as np
scale = int(sys.argv[1])
t = time.perf_counter()
from hisparse import generators as g
from hisparse.threads import usable_cores
print("import hisparse", round(time.perf_counter() - t, 3), "cores", usable_cores())
g.rmat_edges(10); g.unit_rows(*g.rmat_edges(12), np.arange(1 << 12), 1 << 12)  # compile
n = 1 << scale
for rep in range(2):
    t = time.perf_counter(); s, d = g.rmat_edges(scale); t1 = time.perf_counter()
    b = g.unit_rows(s, d, np.arange(n), n); t2 = time.perf_counter()
    print(f"edges {t1 - t:.3f} s  unit_rows {t2 - t1:.3f} s  edges {len(s)} nnz {b.nnz}")
blocks = g.rmat_blocks(scale, 16)
t = time.perf_counter()
states = [np.random.default_rng([0, 0, k]).bit_generator.state for k in range(blocks)]
print(f"seed states of {blocks} blocks {time.perf_counter() - t:.3f} s")
t = time.perf_counter(); import cupy as cp; print("import cupy", round(time.perf_counter() - t, 3))
for rep in range(2):
    t = time.perf_counter()
    keys = cp.asarray((s << scale) | d); cp.cuda.Device().synchronize(); t1 = time.perf_counter()
    keys = cp.sort(keys); cp.cuda.Device().synchronize(); t2 = time.perf_counter()
    keep = cp.empty(len(keys), dtype=bool); keep[0] = True; keep[1:] = keys[1:] != keys[:-1]
    unique = keys[keep]; cp.cuda.Device().synchronize(); t3 = time.perf_counter()
    indptr = cp.searchsorted(unique, cp.arange(n + 1, dtype=cp.int64) << scale)
    cols = unique & (n - 1); cp.cuda.Device().synchronize(); t4 = time.perf_counter()
    hi, hc = indptr.get(), cols.get(); t5 = time.perf_counter()
    print(f"h2d {t1-t:.3f} sort {t2-t1:.3f} unique {t3-t2:.3f} csr {t4-t3:.3f} d2h {t5-t4:.3f}",
          len(unique), bool(np.array_equal(hi, b.indptr)), bool(np.array_equal(hc, b.indices)))
    del keys, keep, unique, indptr, cols
