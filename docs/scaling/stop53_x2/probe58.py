"""session 53: where a gzip HDF5 read goes on the GPU host (the 27-pt 160^3 file): the raw chunk
reads (serial, h5py), zlib alone, the unshuffle alone (NumPy's transposed byte copy, and a
shift-or of the byte planes), each over a thread pool of W workers; read_range itself at W.
Under mpirun each rank reads its half of `data` (rank r of R)."""
import os, sys, time, zlib
from concurrent.futures import ThreadPoolExecutor
import numpy as np, h5py
from hisparse.io._hdf5 import read_range
from hisparse import threads as th

rank, size = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0)), int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
f = h5py.File(sys.argv[1], "r")
for name in ("indices", "data"):
    d = f[name]
    ch, n = d.chunks[0], d.shape[0]
    lo, hi = rank * n // size, (rank + 1) * n // size
    first, last = lo // ch, (hi - 1) // ch
    t = time.perf_counter()
    raws = [d.id.read_direct_chunk((k * ch,))[1] for k in range(first, last + 1)]
    t_raw = time.perf_counter() - t
    isz = d.dtype.itemsize
    for W in ([32, 16] if size == 1 else [16]):
        with ThreadPoolExecutor(W) as pool:
            t = time.perf_counter(); decs = list(pool.map(zlib.decompress, raws, chunksize=32)); t_dec = time.perf_counter() - t
            out = np.empty(len(decs) * ch, d.dtype); flat = out.view(np.uint8)
            def transpose(k):
                data = np.frombuffer(decs[k], np.uint8)
                m = len(data) // isz
                flat[k * ch * isz:(k * ch + m) * isz].reshape(-1, isz)[:] = data.reshape(isz, m).T
            def shiftor(k):
                data = np.frombuffer(decs[k], np.uint8)
                m = len(data) // isz
                planes = data.reshape(isz, m)
                word = np.uint64 if isz == 8 else np.uint32
                v = planes[0].astype(word)
                tmp = np.empty(m, word)
                for j in range(1, isz):
                    np.left_shift(planes[j], word(8 * j), out=tmp, dtype=word)
                    v |= tmp
                out.view(word)[k * ch:k * ch + m] = v
            t = time.perf_counter(); list(pool.map(transpose, range(len(decs)), chunksize=32)); t_tr = time.perf_counter() - t
            ref = out.copy()
            t = time.perf_counter(); list(pool.map(shiftor, range(len(decs)), chunksize=32)); t_so = time.perf_counter() - t
            same = np.array_equal(ref.view(np.uint8), out.view(np.uint8))
        os.environ["HISPARSE_HOST_THREADS"] = str(W)
        t = time.perf_counter(); x = read_range(d, lo, hi); t_rr = time.perf_counter() - t
        print(f"rank {rank}/{size} {name} chunks {len(raws)} MB {sum(map(len, decs))/1e6:.0f} W {W}: raw {t_raw:.3f} "
              f"zlib {t_dec:.3f} transpose {t_tr:.3f} shiftor {t_so:.3f} (same {same}) read_range {t_rr:.3f}", flush=True)
