"""hisparse run with SpMV's plan pieces timed (printed per rank)."""
import sys, time, functools
import numpy as np
import hisparse.ops.spmv.op as op
import hisparse.ops.spmv.local as local
from hisparse.formats import CSRMatrix
from mpi4py import MPI
R = MPI.COMM_WORLD.rank
def timed(f, label):
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k)
        print(f"r{R} {label}: {time.perf_counter()-t:.3f}", flush=True); return r
    return g
for mod, names in ((op, ("HaloExchange", "renumber_columns", "split_rows", "reorder_local", "SpmvLocal")),
                   (local, ("ghost_rows_in_order",))):
    for n in names:
        setattr(mod, n, timed(getattr(mod, n), n))
CSRMatrix.renumbered = timed(CSRMatrix.renumbered, "renumbered")
class NP:
    def __getattr__(self, n): return getattr(np, n)
w = NP()
w.bincount = timed(np.bincount, "bincount"); w.argsort = timed(np.argsort, "argsort")
op.np = w; local.np = w
from hisparse.cli import main
sys.exit(main(sys.argv[1:]))
