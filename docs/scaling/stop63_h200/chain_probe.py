"""CP-ALS's chain at 1, 2 and 4 ranks' sizes on ONE GPU, without the exchange: rank 0's blocks
of the 20M benchmark tensor (rank 16, fp64) in an engine, the operation's step sequence with
every mode's exchange forked and deferred (the exchange itself empty: nothing moves), the last
mode carried into the next iteration, as a recorded CUDA graph replayed 20 times and launched
20 times; against the same steps' kernels timed alone (MTTKRP parts and solve, 20 launches
each): what the chain adds between its kernels (the 'gaps'), per mode. (d121: the parts on one
stream into one buffer; d122: the first part on a stream of its own into its own buffer.)"""
import sys
import numpy as np

from hisparse import generators
from hisparse.context import EngineContext
from hisparse.gpu import CapturedWork, bind_device, load_module
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
    engine = ENGINES["fast"](ctx, local, {"rank": R, "chunk": None, "mttkrp": "fast",
                                          "max_iters": 64})
    engine.upload()
    return engine


def iteration(engine, carry_in, record=False):
    """The operation's sequence (CPALS._issue_iteration) with an empty exchange."""
    if record and not carry_in:
        engine.invert_ahead(0)
    for n in range(order):
        (engine.mttkrp_after_exchange if n or carry_in else engine.mttkrp)(n)
        engine.solve(n)
        engine.fork_exchange()
        engine.mttkrp_before_exchange((n + 1) % order)
        engine.exchange_done()
        engine.defer_normalize(n, first=False, **({"norm_x": 1.0, "slot": 0}
                                                  if n == order - 1 else {}))
    engine.join_side_streams()


def timed(stream, step, count=20):
    for _ in range(3):
        step()
    a, b = cuda.Event(), cuda.Event()
    a.record(stream)
    for _ in range(count):
        step()
    b.record(stream)
    b.synchronize()
    return b.time_since(a) * 1e3 / count  # microseconds


rng = np.random.default_rng(1)
factors = [rng.random((int(s), R)) for s in tensor.shape]
for P in PARTS:
    blocks = [coo_blocks(tensor, n, P, "nnz_balanced", np.int32) for n in range(order)]
    engine = engine_for(UnfoldingBlocks(tuple(tensor.shape), [blocks[n][0] for n in range(order)]))
    engine.load(factors)
    kernels = []
    for n in range(order):
        # (M counted clean: the part's memset, where M is not, is no kernel of the chain)
        parts = [timed(engine.stream, lambda: (setattr(engine, "m_clean", True),
                                               engine._launch_mttkrp(n, part),
                                               getattr(engine, "_join_early", lambda: None)()))
                 for part in (0, 1)]
        solve = timed(engine.stream, lambda: engine.solve(n, vinv=np.eye(R)))
        kernels.append((parts, solve))
    engine.load(factors)
    iteration(engine, carry_in=False)
    launched = timed(engine.stream, lambda: iteration(engine, carry_in=True))
    state = engine.bookkeeping()
    graph = CapturedWork(engine.stream, lambda: iteration(engine, carry_in=True, record=True),
                         "chain probe")
    engine.restore_bookkeeping(state)
    replayed = timed(engine.stream, lambda: graph.launch(engine.stream))
    total = sum(sum(p) + s for p, s in kernels)
    detail = "  ".join(f"mode {n}: mttkrp {p[0]:.1f}+{p[1]:.1f} solve {s:.1f}"
                       for n, (p, s) in enumerate(kernels))
    print(f"P={P} rank 0's part: kernels alone {total:.1f} us an iteration ({detail}); "
          f"launched {launched:.1f}, graph {replayed:.1f} us: {(replayed - total) / order:.1f} "
          f"us a mode beside the kernels", flush=True)
    graph.free()
    engine.free()
device.release()
