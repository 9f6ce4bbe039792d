# Archived A/B probe (stop 51): "_old_rb", "_oldsym" and "_oldord" were the modules of commit
# 6b46b2f (git show 6b46b2f:app/distmatrix/_row_blocks.py etc.) copied beside the new ones for the run.
"""session 51: A/B probes on the device host: the SpMV stencil split (old vs new), Cholesky's
pattern steps and supernode boundaries (old vs new), and the NCCL binding's import."""
import os, sys, time, subprocess
import numpy as np
which = sys.argv[1]
if which == "nccl":
    for stmt in ("import cupy_backends.cuda.libs.nccl as n", "from cupy.cuda import nccl as n"):
        code = (f"import time,sys; t=time.perf_counter(); {stmt}; d=time.perf_counter()-t; "
                "print(repr('%s'), round(d,3), 'cupy' in sys.modules, hasattr(n,'NcclCommunicator'), hasattr(n,'get_unique_id'), hasattr(n,'NCCL_FLOAT64'), hasattr(n,'groupStart'), getattr(n,'available','-'));"
                "import pycuda.driver as cu; cu.init(); c=cu.Device(0).retain_primary_context(); c.push();"
                "u=n.get_unique_id(); comm=n.NcclCommunicator(1,u,0); print('comm ok', type(comm).__name__); c.pop()" % stmt)
        print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()[-400:])
        print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stderr.strip()[-300:])
elif which == "split":
    from hisparse import generators
    from hisparse.formats import CSRMatrix
    from hisparse.distmatrix import _row_blocks as new, _old_rb as old
    from hisparse.distmatrix import local_positions
    n = 160 ** 3; h = n // 2
    for r in (0, 1):
        lo, hi = (0, h) if r == 0 else (h, n)
        for mod in (old, new, old, new):
            B = generators.poisson_rows((160, 160, 160), np.arange(lo, hi, dtype=np.int64), stencil=27)
            rows = CSRMatrix(B.indptr, B.indices, B.data, (hi - lo, n))
            pos = local_positions(np.arange(lo, hi, dtype=np.int64), n)
            t = time.perf_counter(); out = mod.split_rows(rows, pos, hi - lo, True)
            print("split rank", r, mod.__name__.split(".")[-1], "%.3f" % (time.perf_counter() - t), out[1].nnz)
elif which == "chol":
    import scipy.sparse as sp
    from hisparse import threads
    from hisparse.ops.cholesky import symbolic as S, _oldsym as O, ordering as NO, _oldord as OO
    A = generators_matrix = None
    from hisparse import generators
    A = generators.poisson((2000, 2000))
    A = sp.csr_matrix((A.data, A.indices, A.indptr), shape=A.shape)
    S.warm_up(2); O.warm_up(2)
    with threads.alone():
        for mod, omod in ((O, OO), (S, NO), (O, OO), (S, NO)):
            B = sp.csr_matrix((A.data, A.indices, A.indptr), shape=A.shape)
            t0 = time.perf_counter(); pos = mod.sorted_positions(B); t1 = time.perf_counter()
            pat = omod.offdiagonal_pattern(pos, True); t2 = time.perf_counter()
            print(mod.__name__.split(".")[-1], "positions %.3f pattern %.3f" % (t1 - t0, t2 - t1))
        f = S.analyze(A, "dissection", "cholmod", pattern_symmetric=True, nranks=2, complete=False)
        parent, counts = f.parent, f.counts
        fund = S.fundamental_supernodes(parent, counts)
        starts = S.relaxed_supernodes(fund, parent, counts, "cholmod", 64)
        for mod in (O, S, O, S):
            t0 = time.perf_counter(); k = mod.keep_top_boundaries(fund, starts, parent, counts, 2)
            t1 = time.perf_counter(); c = mod.cut_top_separators(k, parent, counts, 2, 1024)
            t2 = time.perf_counter()
            print(mod.__name__.split(".")[-1], "keep %.3f cut %.3f" % (t1 - t0, t2 - t1), len(k), len(c))
