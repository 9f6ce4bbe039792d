"""Where CP-ALS's per-mode time goes at 1, 2 and 4 ranks, measured on ONE GPU: each rank's part
(the row blocks the run gives it, `coo_blocks`, nnz_balanced) built into its own engine, one after
the other, and its steps timed alone with CUDA events (the MTTKRP, the solve, the normalisation),
20 launches each after a warm-up. No exchange (NCCL's hand-over is measured elsewhere: stop 56).
The 20M nell-2-like benchmark tensor (bench_cpals_nell2_20m.yaml), rank 16, fp64.
Prints, per mode and rank count: each part's nonzeros, rows, chunk, teams and microseconds, and
the MTTKRP's scaling efficiency T1 / (P x slowest part)."""
import sys
import numpy as np

from hisparse import generators
from hisparse.context import EngineContext
from hisparse.gpu import bind_device, load_module
from hisparse.ops.cpals.gpu import ENGINES
from hisparse.ops.cpals.layout import UnfoldingBlocks, coo_blocks

R = 16
PARTS = [int(p) for p in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["1", "2", "4"])]
device = bind_device(0)
import pycuda.driver as cuda  # noqa: E402

tensor = generators.random_tensor([12092, 9184, 28818], 20_000_000, fibers_per_nnz=0.14, seed=7)
order = tensor.order
print("tensor", tensor.shape, tensor.nnz, flush=True)


def engine_for(local):
    ctx = EngineContext(config={"precision": "fp64", "index_width": "auto"}, backend="gpu",
                        timer=None, device=None, rank=0,
                        load_kernels=lambda name, defines=None, extra_options=():
                        load_module(name, defines=defines, extra_options=extra_options),
                        log=lambda message: None, maybe_fail=lambda phase, iteration=None: None)
    engine = ENGINES["fast"](ctx, local, {"rank": R, "chunk": None, "mttkrp": "fast"})
    engine.upload()
    return engine


def timed(engine, step, count=20):
    for _ in range(3):
        step()
    a, b = cuda.Event(), cuda.Event()
    a.record(engine.stream)
    for _ in range(count):
        step()
    b.record(engine.stream)
    b.synchronize()
    return b.time_since(a) * 1e3 / count  # microseconds


rng = np.random.default_rng(1)
factors = [rng.random((int(s), R)) for s in tensor.shape]
full = {}
for P in PARTS:
    blocks = [coo_blocks(tensor, n, P, "nnz_balanced", np.int32) for n in range(order)]
    rows = {n: [] for n in range(order)}
    for r in range(P):
        engine = engine_for(UnfoldingBlocks(tuple(tensor.shape),
                                            [blocks[n][r] for n in range(order)]))
        engine.load(factors)
        for n in range(order):
            csr = engine.local.modes[n]
            chunk = engine.chunks[n]
            t_m = timed(engine, lambda: engine.mttkrp(n))
            t_s = timed(engine, lambda: engine.solve(n))
            t_n = timed(engine, lambda: engine.normalize(n, first=False, invert_next=False))
            rows[n].append((csr.nnz, csr.n_rows, chunk, -(-csr.nnz // chunk), t_m, t_s, t_n))
        engine.free()
    for n in range(order):
        slowest = max(p[4] for p in rows[n])
        if P == 1:
            full[n] = slowest
        eff = full.get(n, float("nan")) / (P * slowest)
        parts = "  ".join(f"[nnz {a / 1e6:.2f}M rows {b} chunk {c} teams {d} mttkrp {e:.1f} "
                          f"solve {f:.1f} norm {g:.1f}]" for a, b, c, d, e, f, g in rows[n])
        print(f"P={P} mode {n}: slowest {slowest:.1f} us, eff {eff:.3f}  {parts}", flush=True)
device.release()
