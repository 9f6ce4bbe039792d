"""solve_rows alone (CUDA events, 300 launches each), before and after stop 56's change and with
parts of the new kernel switched off, on the three modes of the 20M nell-2-like tensor (rank 16,
fp64) at one and two ranks' rows. Diagnosis only: the variants that skip a phase give wrong sums."""
import os
import numpy as np
import pycuda.autoinit  # noqa: F401
import pycuda.driver as cuda
import pycuda.gpuarray as gpuarray
from pycuda.compiler import SourceModule
from hisparse.ops.cpals.gpu import solve_grid

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.abspath(os.path.join(HERE, "../../../kernels_cu"))
R = 16
NEW = open(os.path.join(KERNELS, "cpals_dense.cu")).read()
# The kernel before stop 56 (commit 2572bbe), from git where this runs in a checkout (the device
# got a copy of it beside this script for d62/d63), else that variant is left out.
OLD_COPY = os.path.join(HERE, "cpals_dense_before.cu")
if os.path.exists(OLD_COPY):
    OLD = open(OLD_COPY).read()
else:
    import subprocess
    try:
        OLD = subprocess.run(["git", "show", "2572bbe:kernels_cu/cpals_dense.cu"], check=True,
                             capture_output=True, text=True, cwd=HERE).stdout
    except (OSError, subprocess.CalledProcessError):
        OLD = None
BASE = ["-DVALUE_T=double", "-DINDEX_T=int", "-DORDER=3", f"-DRANK={R}", "-DSOLVE_THREADS=512"]
VARIANTS = [
    ("before (HEAD)", OLD, []),  # left out below when OLD is None
    ("new", NEW, []),
    ("new, V^-1 from global", NEW, ["-DVINV_SHARED=0"]),
    ("new, tiles of 2048", NEW, ["-DTILE_DOUBLES=2048"]),
    ("new, no last-block reduce", NEW.replace("if (!last_block) return;", "return;"), []),
]
rng = np.random.default_rng(1)
for label, source, extra in VARIANTS:
    if source is None:
        continue
    mod = SourceModule(source, options=BASE + extra, include_dirs=[KERNELS], no_extern_c=True,
                       arch="sm_90")
    fn = mod.get_function("solve_rows")
    regs = fn.get_attribute(cuda.function_attribute.NUM_REGS)
    line = []
    for n in (12092, 9184, 28818, 6046, 4592, 14409):
        blocks, rpb = solve_grid(n, R)
        m = gpuarray.to_gpu(rng.standard_normal((n, R)))
        vinv = gpuarray.to_gpu(np.eye(R) + 0.01 * rng.standard_normal((R, R)))
        u = gpuarray.zeros((n, R), np.float64)
        partial = gpuarray.zeros(blocks * (R * R + 1 + R), np.float64)
        done = gpuarray.zeros(1, np.uint32)
        total = gpuarray.zeros(R * R + 1 + R, np.float64)
        args = (np.int32(n), np.int32(rpb), m.gpudata, vinv.gpudata, u.gpudata, partial.gpudata,
                done.gpudata, total.gpudata)
        host_m, host_vinv = m.get(), vinv.get()
        fn(*args, block=(512, 1, 1), grid=(blocks, 1))
        update = host_m @ host_vinv
        expect = np.concatenate([(update.T @ update).ravel(), [np.sum(update * host_m)],
                                 np.abs(update).max(axis=0)])
        error = np.max(np.abs(total.get() - expect) / np.maximum(np.abs(expect), 1e-300))
        checked = "" if "no " in label else f"(err {error:.1e})"
        for _ in range(20):
            fn(*args, block=(512, 1, 1), grid=(blocks, 1))
        a, b = cuda.Event(), cuda.Event()
        a.record()
        for _ in range(300):
            fn(*args, block=(512, 1, 1), grid=(blocks, 1))
        b.record(); b.synchronize()
        line.append(f"{n}:{b.time_since(a) * 1e3 / 300:6.2f}{checked}")
    print(f"{label:30s} regs {regs:3d} ", " ".join(line), "us", flush=True)
