"""session 52: where the tensor generator's `read` goes on the GPU host (SpTV 77M and CP-ALS 20M
took 0.69 s at 1 and at 2 ranks alike): the first and later calls of the generator on CuPy,
halves and the whole, and a cProfile of the first call."""
import cProfile, os, pstats, sys, time
t = time.perf_counter()
import cupy as cp
cp.zeros(1); cp.cuda.Device().synchronize()
print("cupy import+init %.3f" % (time.perf_counter() - t))
cache = os.path.expanduser(os.environ.get("CUPY_CACHE_DIR", "~/.cupy/kernel_cache"))
print("kernel cache", cache, len(os.listdir(cache)) if os.path.isdir(cache) else "absent")
from hisparse import generators
for name, spec in (("sptv77m", {"kind": "random_tensor", "dims": [12092, 9184, 28818],
                                 "nnz": 76879419, "fibers_per_nnz": 0.14, "mode": 2, "seed": 7}),
                   ("cpals20m", {"kind": "random_tensor", "dims": [12092, 9184, 28818],
                                 "nnz": 20000000, "fibers_per_nnz": 0.14, "seed": 7})):
    spec = generators.validate_spec(spec)
    src = generators.part_source(spec)
    n = src.nfibers
    for label, rng in (("half0", range(0, n // 2)), ("half1", range(n // 2, n)),
                       ("full", range(0, n)), ("half0 again", range(0, n // 2))):
        prof = cProfile.Profile() if label == "half0" and name == "sptv77m" else None
        t = time.perf_counter()
        if prof: prof.enable()
        ind, val = src.fibers(rng, cp); cp.cuda.Device().synchronize()
        if prof: prof.disable()
        print(name, label, "%.3f s" % (time.perf_counter() - t), len(val), flush=True)
        del ind, val
        if prof:
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
print("kernel cache after", len(os.listdir(cache)) if os.path.isdir(cache) else "absent")
