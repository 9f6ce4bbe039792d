"""Supernodal sparse Cholesky, A = L L^T, and the solve A x = b (one or many right-hand sides).

Plan (one rank does the work; other ranks wait -- the factorization is single-GPU):

- setup ``analysis`` (host): checks (square, symmetric), fill-reducing ordering (METIS nested
  dissection via pymetis, RCM fallback), elimination tree + postorder, column counts,
  fundamental and relaxed supernodes, split of big supernodes into column blocks, and the
  numeric plan (panel offsets, A-to-panel map, relative indices); see ``_cholesky_symbolic``.
- setup ``upload`` (GPU): the plan's index arrays go to the device once.
- every repeat is a refactorization that reuses the analysis: ``h2d`` (A's values and the
  right-hand sides), ``numeric`` (assembly + factorization; log det from the diagonal),
  ``solve`` (forward and backward substitution), ``d2h`` (the solution).

The result is the solution x (original numbering) of A x = b, with b = A x_true for a known
x_true (``rhs: random_x`` / ``ones_x``) or b = ones. Verification is the componentwise backward
error max_i |b - A x|_i / (|A| |x| + |b|)_i.
"""
import time

import numpy as np

from ..config import Setting, positive
from ..errors import HisparseError
from ..parallel import root_call
from ._base import Operation
from ._cholesky_numeric import GpuFactorEngine, factor_cpu, logdet, solve_cpu
from ._cholesky_symbolic import ORDERINGS, RELAXATIONS, analyze, check_square_symmetric

# Dynamic shared memory of the small-supernode kernel (48 KiB less room for static shared).
SMEM_BYTES = 48 * 1024 - 256


def make_rhs(matrix, kind, nrhs, seed):
    """Right-hand sides b, shape (n, nrhs) float64, and the known solution (or None).

    Parameters
    ----------
    matrix : scipy.sparse matrix, shape (n, n)
    kind : {"random_x", "ones_x", "ones", "unit"}
    """
    n = matrix.shape[0]
    if kind == "ones":
        return np.ones((n, nrhs)), None
    if kind == "unit":
        b = np.zeros((n, nrhs))
        b[0] = 1.0  # x[0] is then inv(A)[0, 0]
        return b, None
    if kind == "ones_x":
        x_true = np.ones((n, nrhs))
    else:
        x_true = np.random.default_rng(seed).uniform(-1.0, 1.0, (n, nrhs))
    return np.asarray(matrix.astype(np.float64) @ x_true), x_true


def backward_error(matrix, x, b):
    """Componentwise backward error max_i |b - A x|_i / (|A| |x| + |b|)_i (worst column)."""
    a64 = matrix.astype(np.float64)
    x = np.asarray(x, dtype=np.float64).reshape(b.shape)
    residual = np.abs(b - a64 @ x)
    scale = abs(a64) @ np.abs(x) + np.abs(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale > 0, residual / scale, np.where(residual > 0, np.inf, 0.0))
    return float(ratio.max()) if ratio.size else 0.0


class Cholesky(Operation):
    """Supernodal Cholesky factorization and solve of a sparse SPD matrix."""

    NAME = "cholesky"
    INPUT_KIND = "matrix"
    PARAMS = {
        "ordering": Setting(str, "auto", "Fill-reducing ordering; auto = metis when pymetis is "
                                         "installed, else rcm.", choices=ORDERINGS),
        "relaxation": Setting(str, "threshold", "Supernode amalgamation: threshold (merge "
                                                "child and parent below merge_threshold "
                                                "columns), cholmod (CHOLMOD's zero-fraction "
                                                "rules) or none.", choices=RELAXATIONS),
        "merge_threshold": Setting(int, 64, "Column threshold of relaxation 'threshold'.",
                                   check=positive),
        "block_size": Setting(int, 1024, "Columns per block task of large supernodes.",
                              check=positive),
        "small_work": Setting(float, 2.0 ** 21, "Supernodes with ncols*nrows^2 at most this go "
                                                "to the batched small-supernode kernel.",
                              check=positive),
        "nrhs": Setting(int, 1, "Right-hand sides solved together.", check=positive),
        "rhs": Setting(str, "random_x", "b = A x_true with x_true random (random_x) or ones "
                                        "(ones_x), b = ones, or b = e_0 (unit: x[0] is then "
                                        "inv(A)[0, 0]).",
                       choices=("random_x", "ones_x", "ones", "unit")),
        "peer_repeats": Setting(int, 1, "Timed repetitions of each peer.", check=positive),
        "peer_max_flops": Setting(float, 1e10, "Skip the cusolver peer when the factor needs "
                                               "more flops than this (it is not supernodal and "
                                               "can run for minutes).", check=positive),
    }
    PARTITIONS = ("single",)
    PEERS = ("cusolver", "cholmod")
    SETUP_PHASES = {"analysis": "setup", "upload": "transfer"}
    REPEAT_PHASES = {"h2d": "transfer", "numeric": "compute", "solve": "compute", "d2h": "transfer"}
    COMPUTE_PHASES = ("numeric",)
    DEFAULT_RTOL = {"fp64": 1e-12, "fp32": 1e-5}

    # -- collective ------------------------------------------------------------------------
    def setup(self, problem):
        ctx = self.ctx
        self.module = None
        if ctx.backend == "gpu":
            value_t = "double" if ctx.value_dtype == np.float64 else "float"
            self.module = ctx.load_kernels("cholesky", {"VALUE_T": value_t, "INDEX_T": "int",
                                                        "SMEM_BYTES": SMEM_BYTES})
        self.engine = None
        root_call(ctx.comm, self._setup_root, problem)

    def _setup_root(self, problem):
        ctx, params = self.ctx, self.params
        with ctx.timer.phase("analysis"):
            matrix = problem.to_scipy()
            check_square_symmetric(matrix)
            self.matrix = matrix
            self.sym = analyze(matrix, params["ordering"], params["relaxation"],
                               params["merge_threshold"], params["block_size"])
        self.values = np.ascontiguousarray(problem.data)
        self.b, self.x_true = make_rhs(matrix, params["rhs"], params["nrhs"],
                                       ctx.config["run.seed"])
        self.x = None
        self.logdet = float("nan")
        if ctx.backend == "gpu":
            import pycuda.driver as cuda
            with ctx.timer.phase("upload"):
                self.engine = GpuFactorEngine(ctx, self.sym, ctx.value_dtype, self.module,
                                              ctx.config["gpu.streams"], params["small_work"],
                                              SMEM_BYTES)
            self.rhs_host = cuda.pagelocked_empty((params["nrhs"], self.sym.n), ctx.value_dtype)
            self.x_host = cuda.pagelocked_empty((params["nrhs"], self.sym.n), ctx.value_dtype)

    def run_once(self):
        root_call(self.ctx.comm, self._run_root)

    def _run_root(self):
        ctx, sym = self.ctx, self.sym
        timer = ctx.timer
        if self.engine is None:
            with timer.phase("numeric"):
                lx = factor_cpu(sym, self.values, ctx.value_dtype)
                self.logdet = logdet(sym, lx)
            with timer.phase("solve"):
                x_perm = solve_cpu(sym, lx, self.b[sym.perm].astype(ctx.value_dtype))
            self.x = np.empty_like(x_perm)
            self.x[sym.perm] = x_perm
            return
        engine, stream = self.engine, self.engine.stream
        with timer.phase("h2d", stream=stream):
            engine.set_values(self.values)
            self.rhs_host[:] = self.b[sym.perm].T
            engine.upload_rhs(self.rhs_host)
        with timer.phase("numeric", stream=stream):
            self.logdet = engine.factor()
        with timer.phase("solve", stream=stream):
            engine.substitute()
        with timer.phase("d2h", stream=stream):
            engine.download_x(self.x_host)
        x = np.empty((sym.n, self.x_host.shape[0]), dtype=self.x_host.dtype)
        x[sym.perm] = self.x_host.T
        self.x = x

    def teardown(self):
        if self.engine is not None:
            self.engine.free()
            self.engine = None

    # -- rank 0 ----------------------------------------------------------------------------
    def result(self):
        return self.x

    def reference(self, problem):
        return self.b

    def compare(self, result, reference):
        if result is None or np.shape(result) != np.shape(reference):
            return float("inf")
        return backward_error(self.matrix, result, reference)

    def work(self, problem):
        item = np.dtype(self.ctx.value_dtype).itemsize
        return {"flops": self.sym.flops, "bytes": float(self.sym.supernodal_nnz * item)}

    def result_arrays(self, result):
        out = {"x": result, "b": self.b}
        if self.x_true is not None:
            out["x_true"] = self.x_true
        return out

    def summary(self):
        stats = {f"chol_{k}": v for k, v in self.sym.stats.items()}
        stats["chol_logdet"] = self.logdet
        if self.engine is not None:
            stats["chol_small_supernodes"] = self.engine.n_small
            stats["chol_large_supernodes"] = self.engine.n_large
            stats["chol_streams"] = self.engine.nstreams
        stats["chol_block_size"] = self.sym.block_size
        return stats

    def rank_info(self):
        if not self.ctx.is_root:
            return {}
        info = {"n_rows": int(self.sym.n), "nnz": int(len(self.values))}
        if self.engine is not None:
            item = np.dtype(self.ctx.value_dtype).itemsize
            info["bytes_h2d"] = int(len(self.values) * item + self.b.size * item)
            info["bytes_d2h"] = int(self.b.size * item)
            info["bytes_plan"] = int(self.engine.bytes_plan)
        return info

    def run_peer(self, name, problem, repeats):
        repeats = min(repeats, self.params["peer_repeats"])
        if name == "cusolver":
            if self.sym.flops > self.params["peer_max_flops"]:
                raise HisparseError(f"factor needs {self.sym.flops:.2e} flops > "
                                    f"operation.params.peer_max_flops "
                                    f"{self.params['peer_max_flops']:.2e}")
            return _cusolver_peer(self.matrix, self.b[:, 0], repeats)
        if name == "cholmod":
            return _cholmod_peer(self.matrix, self.b, repeats)
        raise HisparseError(f"unknown peer {name}")


def _cusolver_peer(matrix, b, repeats):
    """cuSOLVER's sparse Cholesky (cusolverSpDcsrlsvchol: analysis, factorization and solve
    in one call, symrcm reordering) through CuPy's low-level binding, timed with events."""
    from ..gpu._blas import csr_to_cupy, import_cupy, release_pool, time_with_events
    cupy, _ = import_cupy("cusolver")
    from cupy_backends.cuda.libs import cusolver
    from cupy.cuda import device as cupy_device
    a = csr_to_cupy(matrix, np.float64)
    b_dev = cupy.asarray(b, dtype=np.float64)
    x_dev = cupy.empty_like(b_dev)
    singularity = np.zeros(1, dtype=np.int32)
    handle = cupy_device.get_cusolver_sp_handle()

    def factor_and_solve():
        cusolver.dcsrlsvchol(handle, a.shape[0], a.nnz, a._descr.descriptor, a.data.data.ptr,
                             a.indptr.data.ptr, a.indices.data.ptr, b_dev.data.ptr, 1e-14, 1,
                             x_dev.data.ptr, singularity.ctypes.data)

    seconds = time_with_events(factor_and_solve, repeats)
    x = cupy.asnumpy(x_dev)
    error = backward_error(matrix, x[:, None], np.asarray(b)[:, None])
    a = b_dev = x_dev = None  # drop the device arrays before the pool is emptied
    release_pool()
    return {"seconds": seconds, "device": "gpu", "library": f"cupy {cupy.__version__}",
            "includes": "analysis+factorization+solve", "backward_error": error,
            "singularity": int(singularity[0])}


def _cholmod_peer(matrix, b, repeats):
    """CHOLMOD (scikit-sparse) on the host: numeric factorization time, analysis reused."""
    try:
        from sksparse.cholmod import analyze as cholmod_analyze
    except ImportError as exc:
        raise HisparseError(f"peer 'cholmod' needs scikit-sparse ({exc})") from None
    a = matrix.tocsc().astype(np.float64)
    start = time.perf_counter()
    symbolic = cholmod_analyze(a)
    analysis = time.perf_counter() - start
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        factor = symbolic.cholesky(a)
        seconds.append(time.perf_counter() - start)
    x = factor(b)
    return {"seconds": seconds, "device": "cpu", "analysis_seconds": analysis,
            "includes": "factorization", "backward_error": backward_error(matrix, x, b)}


OPERATION = Cholesky
