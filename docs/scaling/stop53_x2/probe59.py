"""session 53: the same matrix file written with h5py's automatic chunks (hisparse's writer:
~100 KB) and with chunks of 1 MiB and 4 MiB: read_range of indices and data at 32 and 16
threads (best of 3), and the files' sizes."""
import os, sys, time
import h5py, numpy as np
from hisparse.io._hdf5 import read_range
source = sys.argv[1]
with h5py.File(source, "r") as f:
    arrays = {name: f[name][...] for name in ("indptr", "indices", "data")}
for target in (None, 1 << 20, 1 << 22):
    path = source if target is None else f"{source}.{target}.h5"
    if target is not None:
        t = time.perf_counter()
        with h5py.File(path, "w") as f:
            for name, a in arrays.items():
                f.create_dataset(name, data=a, compression="gzip", compression_opts=4, shuffle=True,
                                 chunks=(max(1, min(len(a), target // a.dtype.itemsize)),))
        written = time.perf_counter() - t
    else:
        written = float("nan")
    with h5py.File(path, "r") as f:
        for W in (32, 16):
            os.environ["HISPARSE_HOST_THREADS"] = str(W)
            times = {}
            for name in ("indices", "data"):
                best = []
                for _ in range(3):
                    t = time.perf_counter(); x = read_range(f[name]); best.append(time.perf_counter() - t)
                    assert np.array_equal(x, arrays[name])
                times[name] = min(best)
            print(f"chunks {f['data'].chunks} W {W}: write {written:.2f} s, {os.path.getsize(path)/1e6:.1f} MB; "
                  f"read indices {times['indices']:.3f} data {times['data']:.3f}", flush=True)
