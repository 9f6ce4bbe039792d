"""Where the 2-rank 160^3 split goes: fresh pages vs the passes. mpirun -n 2 python3 split_probe.py"""
import time, sys
import numpy as np
from mpi4py import MPI
from hisparse.layout._rows import generate_row_part
from hisparse.distmatrix import split_rows, local_positions
from hisparse.distmatrix._row_blocks import load_split_loops
from hisparse.formats import CSRMatrix
from hisparse.compiled import compiled_parallel, prange
comm = MPI.COMM_WORLD
n = int(sys.argv[1]) if len(sys.argv) > 1 else 160
mode = sys.argv[2] if len(sys.argv) > 2 else "none"
if mode != "none":
    import pycuda.driver as cuda
    cuda.init()
    context = cuda.Device(comm.rank % cuda.Device.count()).make_context()
    if mode == "cupy":
        import cupy
        cupy.zeros(10)
if comm.rank == 0:
    for f in ("enabled", "defrag"):
        try:
            print(f, open(f"/sys/kernel/mm/transparent_hugepage/{f}").read().strip())
        except OSError as e:
            print(f, e)
t = time.perf_counter()
part = generate_row_part(comm, {"kind": "poisson", "dims": [n, n, n], "stencil": 27})
load_split_loops(np.float64)
tg = time.perf_counter() - t
rows = CSRMatrix(part.indptr, part.indices.astype(np.int32), part.data, (len(part.rows), part.shape[1]))
position = local_positions(np.asarray(part.rows, np.int64), part.shape[1])
comm.Barrier()
for k in range(2):
    t = time.perf_counter()
    local, ghost, gr, gh = split_rows(rows, position, len(part.rows))
    ts = time.perf_counter() - t
    print(f"{mode} rank {comm.rank} gen {tg:.2f} split#{k} {ts:.3f} s nnz {rows.nnz} ghost {ghost.nnz}", flush=True)
    del local, ghost

@compiled_parallel
def fill(a, b):
    for i in prange(len(a)):
        a[i] = b[i % len(b)]

@compiled_parallel
def fill1(a):
    for i in prange(len(a)):
        a[i] = i

def seqmove(a, shift):
    a[:len(a) - shift] = a[shift:]

b = np.arange(1000.0)
fill(np.empty(1000), b); fill1(np.empty(1000))
comm.Barrier()
for k in range(2):
    t = time.perf_counter(); a = np.empty(55_000_000); t0 = time.perf_counter() - t
    t = time.perf_counter(); fill1(a); t1 = time.perf_counter() - t
    t = time.perf_counter(); fill1(a); t2 = time.perf_counter() - t
    t = time.perf_counter(); c = np.empty_like(a); c[:] = a; t3 = time.perf_counter() - t
    t = time.perf_counter(); c[:] = a; t4 = time.perf_counter() - t
    t = time.perf_counter(); a[:-100000] = a[100000:]; t5 = time.perf_counter() - t
    t = time.perf_counter(); a[100000:] = a[:-100000]; t6 = time.perf_counter() - t
    print(f"{mode} rank {comm.rank} 440MB: empty {t0:.4f} parfill-fresh {t1:.3f} parfill-again {t2:.3f} copy-fresh {t3:.3f} copy-again {t4:.3f} move-down {t5:.3f} move-up {t6:.3f}", flush=True)
    del a, c

if mode != "none":
    context.pop()
