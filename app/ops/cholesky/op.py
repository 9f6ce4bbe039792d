"""Supernodal sparse Cholesky, A = L L^T, and the solve A x = b (one or many right-hand sides).

Plan (one rank does the work; other ranks wait -- the factorization is single-GPU):

- setup ``analysis`` (host): checks (square, symmetric), fill-reducing ordering (METIS nested
  dissection via pymetis, RCM fallback), elimination tree + postorder, column counts,
  fundamental and relaxed supernodes, split of big supernodes into column blocks, and the
  numeric plan (panel offsets, A-to-panel map, relative indices); see :mod:`.symbolic`.
- setup ``upload`` (GPU): the engine is built: its chunk schedule (levels of 64-column chunks,
  see :mod:`.gpu`) is planned and the plan's index arrays go to the device once.
- every repeat is a refactorization that reuses the analysis: ``h2d`` (A's values and the
  right-hand sides), ``numeric`` (assembly + factorization; log det from the diagonal),
  ``solve`` (forward and backward substitution, the factor resident), ``refine`` (iterative
  refinement, :func:`refine`), ``d2h`` (the solution).
  The engine (:mod:`.cpu` or :mod:`.gpu`) does each step; the CPU engine moves no data, so it
  records no ``upload``, ``h2d`` or ``d2h``. No collective is needed: the other ranks wait.
  ``summary()`` adds its phases' seconds (:meth:`Cholesky.phase_seconds`).

The result is the solution x (original numbering) of A x = b, with b = A x_true for a known
x_true (``rhs: random_x`` / ``ones_x``) or b = ones. Verification is the componentwise backward
error max_i |b - A x|_i / (|A| |x| + |b|)_i.
"""
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from ...config import Setting, positive
from ...errors import HisparseError
from ...gpu import start_library_import
from ...parallel import root_call
from ...timing import event_else_wall
from .. import Operation
from .ordering import METIS_NITER, ORDERINGS, SPLIT_CHOICES, start_ordering_pool
from .reference import backward_error
from .symbolic import RELAXATIONS, SymbolicFactor, analyze, check_square_symmetric, warm_up


@dataclass
class CholeskyLocal:
    """What the factoring rank's engine works on.

    Attributes
    ----------
    sym : SymbolicFactor
        The analysis: ordering, supernodes and the numeric plan.
    kernels : hisparse.gpu.Kernels or None
        ``kernels_cu/cholesky.cu`` for the GPU engine, loaded in :meth:`Cholesky.setup` by every
        rank of the node (the node-local compile is collective), ``None`` on the CPU.
    matrix : scipy.sparse.csr_matrix or None
        A as given (its pattern; the values come with every ``load``), for the residual of the
        iterative refinement; ``None``: the engine cannot refine.
    """

    sym: SymbolicFactor
    kernels: object = None
    matrix: object = None


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


def shifted_laplacian(graph, shift):
    """The graph Laplacian D - W of a graph's adjacency pattern (symmetrised, unit weights, no
    self loops) plus ``shift`` I: SPD for shift > 0. The benchmarks' stand-in for circuit
    matrices (sparse, nearly planar networks), e.g. on ``luxembourg_osm``.

    Parameters
    ----------
    graph : scipy.sparse matrix, shape (n, n)
    shift : float

    Returns
    -------
    scipy.sparse.csr_matrix, float64
    """
    import scipy.sparse as sp
    adjacency = sp.csr_matrix(graph, dtype=np.float64)
    adjacency = (adjacency + adjacency.T).tocsr()
    adjacency.setdiag(0)
    adjacency.eliminate_zeros()
    adjacency.data[:] = 1.0
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    return sp.csr_matrix(sp.diags(degree + shift) - adjacency)


def write_shifted_laplacian(source, output, shift=0.01):
    """Write :func:`shifted_laplacian` of a Matrix Market graph (``.mtx`` or ``.mtx.gz``) to an
    HDF5 input file, e.g. ``write_shifted_laplacian("../shared/data/matrices/graphs/
    luxembourg_osm.mtx.gz", "data/luxembourg_laplacian.h5")``."""
    import scipy.io
    from ...formats import CSRMatrix
    from ...io import write_matrix
    laplacian = shifted_laplacian(scipy.io.mmread(str(source)), shift)
    write_matrix(output, CSRMatrix.from_scipy(laplacian, symmetric=True), overwrite=True)


#: ``refinement`` values: ``auto`` or a fixed number of steps.
REFINEMENT = ("auto", 0, 1, 2)

#: Fewest rows for which the GPU libraries are imported while METIS runs: below it METIS takes
#: milliseconds and the import (mostly Python holding the interpreter) would run on into the
#: symbolic analysis, so it is made in the upload (docs/ops/cholesky.md, "Figures moved out of
#: the code").
OVERLAP_IMPORT_MIN_ROWS = 10_000


def refine(engine, steps, tolerance):
    """Iterative refinement of the engine's solution, in place: the residual r = b - A x
    (fp64, A's values as loaded), a solve A d = r with the resident factor, x += d.

    Parameters
    ----------
    engine : CpuFactorEngine or GpuFactorEngine
        After ``solve()``.
    steps : {"auto", 0, 1, 2}
        ``auto``: one step when the measured componentwise backward error of the solution
        exceeds ``tolerance``, none otherwise (the common case then pays one residual and an
        8-byte read, not a second solve); an integer: that many steps.
    tolerance : float

    Returns
    -------
    (int, float)
        The steps made, and the backward error of the unrefined solution (NaN when
        ``steps`` is 0: not measured).
    """
    if steps == 0:
        return 0, float("nan")
    engine.residual()
    error = engine.backward_error()
    if steps == "auto":
        steps = 1 if error > tolerance else 0
    for step in range(steps):
        if step:
            engine.residual()
        engine.correct()
    return steps, error


def _symmetric_or_explain(matrix, problem):
    """:func:`check_square_symmetric`, whose refusal of a matrix that stores one triangle only
    (a converted CSparse triplet file) says what to do about it."""
    try:
        return check_square_symmetric(matrix)
    except HisparseError as exc:
        from ...io import one_triangle
        side = one_triangle(problem)
        if side is None:
            raise
        raise HisparseError(f"{exc}; the matrix stores only its {side} triangle: if it is one "
                            f"half of a symmetric matrix, convert the source again with "
                            f"`hisparse convert --symmetric` (triplet files) or store both "
                            f"triangles") from None


class Cholesky(Operation):
    """Supernodal Cholesky factorization and solve of a sparse SPD matrix."""

    NAME = "cholesky"
    INPUT_KIND = "matrix"
    PARAMS = {
        "ordering": Setting(str, "auto", "Fill-reducing ordering; auto = metis when pymetis is "
                                         "installed, else rcm.", choices=ORDERINGS),
        "metis_niter": Setting(int, METIS_NITER, "METIS refinement passes per level of its "
                                                 "nested dissection (METIS's own default: 10).",
                               check=positive),
        "ordering_split": Setting((str, int), "auto", "Top levels of the METIS ordering split "
                                                      "over worker processes (each split by "
                                                      "METIS's vertex separator, the parts "
                                                      "ordered concurrently): auto (by the "
                                                      "matrix's size and the cores) or a "
                                                      "number (0: one METIS call).",
                                  choices=SPLIT_CHOICES),
        "relaxation": Setting(str, "threshold", "Supernode amalgamation: threshold (merge "
                                                "child and parent below merge_threshold "
                                                "columns), cholmod (CHOLMOD's zero-fraction "
                                                "rules) or none.", choices=RELAXATIONS),
        "merge_threshold": Setting(int, 64, "Column threshold of relaxation 'threshold'.",
                                   check=positive),
        "block_size": Setting(int, 1024, "Columns per block task of large supernodes.",
                              check=positive),
        "small_work": Setting(float, 2.0 ** 30, "Supernodes with ncols*nrows^2 at most this are "
                                                "factored by the batched chunk kernels (one "
                                                "launch pair per level); larger ones by "
                                                "cuBLAS/cuSOLVER block tasks.",
                              check=positive),
        "cuda_graphs": Setting(bool, True, "GPU: capture the factorization and the solve as CUDA "
                                           "graphs at their first call and replay them (one "
                                           "launch each instead of hundreds); gpu.graphs: "
                                           "false turns them off too."),
        "solve_schedule": Setting(str, "flow", "GPU solve: flow (one launch per direction; "
                                               "every chunk task waits on counters of the "
                                               "chunks it depends on) or levels (one launch "
                                               "per chunk level and direction).",
                                  choices=("flow", "levels")),
        "refinement": Setting((str, int), "auto", "Iterative refinement steps after the solve "
                                                  "(residual in fp64, one more solve, x += d): "
                                                  "0, 1, 2, or auto (one step when the "
                                                  "measured backward error exceeds "
                                                  "refinement_tolerance).",
                              choices=REFINEMENT),
        "refinement_tolerance": Setting(float, 5e-15, "Componentwise backward error above which "
                                                      "refinement 'auto' makes its step.",
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
    # Rank 0 factors alone: nothing moves between ranks on the device.
    DEVICE_COLLECTIVES = False
    SETUP_PHASES = {"analysis": "setup", "upload": "transfer"}
    REPEAT_PHASES = {"h2d": "transfer", "numeric": "compute", "solve": "compute",
                     "refine": "compute", "d2h": "transfer"}
    COMPUTE_PHASES = ("numeric",)
    DEFAULT_RTOL = {"fp64": 1e-12, "fp32": 1e-5}

    @classmethod
    def estimate_memory(cls, config, header, nranks):
        """Rank 0 alone: A, its factor (at least A's lower triangle), and the right-hand sides
        B and the solution X (n x nrhs each)."""
        from .. import MemoryEstimate
        n = header.nrows
        factor = header.csr_bytes(n, (header.nnz + n) // 2)
        estimate = MemoryEstimate().add(header.key, header.part_bytes(1) + factor,
                                        root_only=True)
        return estimate.add("operation.params.nrhs",
                            2 * n * config["operation.params.nrhs"] * header.value_bytes,
                            root_only=True)

    # -- collective ------------------------------------------------------------------------
    def setup(self, problem):
        ctx = self.ctx
        self.kernels = None
        # The ordering's worker processes start first, on rank 0 (the one that factors): their
        # start (a fresh interpreter importing the analysis) then overlaps the kernel load, Numba's start-up and the matrix checks instead of the analysis.
        self.ordering_pool = start_ordering_pool(problem.nnz, self.params["ordering"],
                                                 self.params["ordering_split"]) \
            if ctx.is_root else None
        try:
            if ctx.backend == "gpu":
                # Every rank of the node takes part (the node-local compile is collective),
                # though only rank 0 factors.
                from .gpu import load_kernels
                self.kernels = load_kernels(ctx)
            self.engine = None
            root_call(ctx.comm, self._setup_root, problem)
        finally:
            if self.ordering_pool is not None:
                self.ordering_pool.shutdown(wait=False, cancel_futures=True)
                self.ordering_pool = None

    def _setup_root(self, problem):
        ctx, params = self.ctx, self.params
        # One-time per process, recorded apart (chol_compiled_load_seconds): Numba's start-up
        # and the load of the compiled analysis loops from its disk cache.
        self.compiled_load_seconds = warm_up()
        # The libraries the GPU engine uses are imported while METIS runs (through ctypes: the
        # interpreter is free), not in the upload, where it would add to the time to solution;
        # not at the analysis' start, where it slowed the Python parts. Small matrices import in
        # the upload (OVERLAP_IMPORT_MIN_ROWS).
        self.library_import, self.library_times = None, (float("nan"),) * 2
        overlap_import = ctx.backend == "gpu" and problem.shape[0] >= OVERLAP_IMPORT_MIN_ROWS
        with ctx.timer.phase("analysis"):
            matrix = problem.to_scipy()
            pattern_symmetric = _symmetric_or_explain(matrix, problem)
            self.matrix = matrix
            self.sym = analyze(matrix, params["ordering"], params["relaxation"],
                               params["merge_threshold"], params["block_size"],
                               params["metis_niter"], pattern_symmetric,
                               pool=self.ordering_pool,
                               before_ordering=self._start_library_import
                               if overlap_import else None,
                               split=params["ordering_split"])
        self.values = np.ascontiguousarray(problem.data)
        self.b, self.x_true = make_rhs(matrix, params["rhs"], params["nrhs"],
                                       ctx.config["run.seed"])
        self.x = None
        self.logdet = float("nan")
        self.timed_repeats = 0
        self.refinement_steps, self.unrefined_error = 0, float("nan")
        with self._transfer("upload"):
            if ctx.backend == "gpu" and not overlap_import:
                self._start_library_import()
            self._join_library_import()  # within the phase: a wait for it is counted
            self.engine = self.pick_engine(CholeskyLocal(self.sym, self.kernels, matrix))

    def _start_library_import(self):
        self.library_import = start_library_import()

    def _join_library_import(self):
        """Wait for the library import, if one was started; record what it took and the wait."""
        if self.library_import is not None:
            waited = time.perf_counter()
            self.library_import.join()
            self.library_times = (self.library_import.seconds, time.perf_counter() - waited)

    def _transfer(self, phase, stream=None):
        """Time a transfer phase when the engine is on the GPU; on the CPU nothing moves, so
        the phase is not recorded."""
        if self.ctx.backend != "gpu":
            return nullcontext()
        return self.ctx.timer.phase(phase, stream=stream)

    def run_once(self):
        root_call(self.ctx.comm, self._run_root)

    def _run_root(self):
        engine, timer = self.engine, self.ctx.timer
        if timer.enabled:
            self.timed_repeats += 1
        stream = engine.stream
        with self._transfer("h2d", stream):
            engine.load(self.values, self.b)
        with timer.phase("numeric", stream=stream):
            self.logdet = engine.factor()
        with timer.phase("solve", stream=stream):
            engine.solve()
        with timer.phase("refine", stream=stream):
            self.refinement_steps, self.unrefined_error = refine(
                engine, self.params["refinement"], self.params["refinement_tolerance"])
        with self._transfer("d2h", stream):
            x_perm = engine.solution()
        self.x = np.empty(x_perm.shape, dtype=x_perm.dtype)
        self.x[self.sym.perm] = x_perm

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
        if self.engine.BACKEND == "gpu":
            stats["chol_small_supernodes"] = self.engine.n_small
            stats["chol_large_supernodes"] = self.engine.n_large
            stats["chol_streams"] = self.engine.nstreams
            stats["chol_factor_levels"], stats["chol_solve_levels"] = self.engine.chunk_levels
            stats["chol_solve_schedule"] = self.engine.solve_schedule
            stats["chol_solve_tasks"] = self.engine.flow.ntasks if self.engine.flow else 0
            stats["chol_cuda_graphs"] = self.engine.graphed
            stats["chol_cuda_graph_error"] = self.engine.graph_error
        stats["chol_block_size"] = self.sym.block_size
        stats["chol_compiled_load_seconds"] = self.compiled_load_seconds
        # The background import of the GPU libraries (started with the ordering): what it
        # took, and how long the upload waited for it.
        stats["chol_library_import_seconds"], stats["chol_library_wait_seconds"] = \
            self.library_times
        stats["chol_refinement"] = str(self.params["refinement"])
        stats["chol_refinement_steps"] = self.refinement_steps
        stats["chol_unrefined_backward_error"] = self.unrefined_error
        stats.update(self.phase_seconds())
        return stats

    def phase_seconds(self):
        """Its phases in seconds, the parts of the driver's ``time_to_solution_seconds``:
        ``chol_analysis_seconds`` and ``chol_upload_seconds`` (once), the median over the timed
        repeats of ``chol_numeric_seconds``, ``chol_solve_seconds``, ``chol_refine_seconds`` and
        ``chol_transfer_seconds`` (h2d + d2h); CUDA-event time where recorded, else wall time."""
        timer = self.ctx.timer
        repeats = max(self.timed_repeats, 1)
        wall, gpu = timer.arrays(repeats)
        phases = timer.phases

        def seconds(name, row=None):
            k = phases.index(name)
            values = event_else_wall(wall[:, k], gpu[:, k])
            values = values[row:row + 1] if row is not None else values
            values = values[np.isfinite(values)]
            return float(np.median(values)) if len(values) else 0.0

        return {"chol_analysis_seconds": seconds("analysis", 0),
                "chol_upload_seconds": seconds("upload", 0),
                "chol_numeric_seconds": seconds("numeric"), "chol_solve_seconds": seconds("solve"),
                "chol_refine_seconds": seconds("refine"),
                "chol_transfer_seconds": seconds("h2d") + seconds("d2h")}

    def rank_info(self):
        if not self.ctx.is_root:
            return {}
        info = {"n_rows": int(self.sym.n), "nnz": int(len(self.values))}
        if self.engine.BACKEND == "gpu":
            item = np.dtype(self.ctx.value_dtype).itemsize
            info["bytes_h2d"] = int(len(self.values) * item + self.b.size * item)
            info["bytes_d2h"] = int(self.b.size * item)
            info["bytes_plan"] = int(self.engine.bytes_plan)
        return info

    def run_peer(self, name, problem, repeats):
        from . import peers  # imported here: CuPy's adapters are needed only by a peer
        repeats = min(repeats, self.params["peer_repeats"])
        if name == "cusolver":
            if self.sym.flops > self.params["peer_max_flops"]:
                raise HisparseError(f"factor needs {self.sym.flops:.2e} flops > "
                                    f"operation.params.peer_max_flops "
                                    f"{self.params['peer_max_flops']:.2e}")
            return peers.cusolver_peer(self.matrix, self.b[:, 0], repeats)
        if name == "cholmod":
            return peers.cholmod_peer(self.matrix, self.b, repeats)
        raise HisparseError(f"unknown peer {name}")
