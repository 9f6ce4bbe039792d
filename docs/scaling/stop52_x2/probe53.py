"""session 52: the tensor generator's per-process cost on CuPy with a warm kernel cache (a fresh
process after probe52.py compiled the kernels): CuPy's and cupyx's imports, the first call on a
few fibers (kernel loads) under cProfile, then calls at full size."""
import cProfile, pstats, time
t = time.perf_counter()
import cupy as cp
cp.zeros(1); cp.cuda.Device().synchronize()
t1 = time.perf_counter()
import cupyx
t2 = time.perf_counter()
print("import cupy+init %.3f, cupyx %.3f" % (t1 - t, t2 - t1))
from hisparse import generators
spec = generators.validate_spec({"kind": "random_tensor", "dims": [12092, 9184, 28818],
                                 "nnz": 76879419, "fibers_per_nnz": 0.14, "mode": 2, "seed": 7})
src = generators.part_source(spec)
prof = cProfile.Profile()
t = time.perf_counter(); prof.enable()
ind, val = src.fibers(range(0, 1000), cp); cp.cuda.Device().synchronize()
prof.disable()
print("first call, 1000 fibers %.3f s" % (time.perf_counter() - t))
st = pstats.Stats(prof).sort_stats("tottime"); st.print_stats(12)
for label, rng in (("1000 again", range(1000, 2000)), ("full", range(0, src.nfibers)),
                   ("full again", range(0, src.nfibers))):
    t = time.perf_counter()
    ind, val = src.fibers(rng, cp); cp.cuda.Device().synchronize()
    print(label, "%.3f s" % (time.perf_counter() - t), len(val), flush=True)
    del ind, val
