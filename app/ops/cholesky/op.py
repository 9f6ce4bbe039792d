"""Supernodal sparse Cholesky, A = L L^T, and the solve A x = b (one or many right-hand sides).

Two partition strategies. ``single``: rank 0 does the work and the other ranks wait (the plan
below). ``subtree`` (what ``auto`` takes on several ranks of the CPU backend): rank 0 analyses
and maps whole subtrees of the supernodal elimination tree to the ranks (:mod:`.mapping`,
balanced by flops); setup ``distribute`` sends every rank its local plan, its entries of A and
its right-hand-side rows, and makes the rank's :class:`~.tree.SubtreeExchange`; each repeat
every rank factors its subtrees alone, then the top supernodes are factored by their owners
(``numeric``), and the solve goes up the tree and back down (``solve``), the blocks moving
between the ranks along the elimination tree (:mod:`.tree`; the engine,
:class:`~.cpu.SubtreeFactorEngine`, hands out and takes in the blocks); ``refine``: every rank
measures its rows of the residual (:mod:`.residual`; a correction is solved the same
distributed way, :class:`~.refinement.RankRefinement`). The solution stays on the ranks until
``collect`` gathers it to rank 0, once.

Plan of ``single``:

- setup ``analysis`` (host): checks (square, symmetric), fill-reducing ordering (METIS nested
  dissection via pymetis, RCM fallback), elimination tree + postorder, column counts,
  fundamental and relaxed supernodes, split of big supernodes into column blocks, and the
  numeric plan (panel offsets, A-to-panel map, relative indices); see :mod:`.symbolic`.
- setup ``upload`` (GPU): the engine is built: its chunk schedule (levels of 64-column chunks,
  see :mod:`.gpu`) is planned and the plan's index arrays go to the device once.
- every repeat is a refactorization that reuses the analysis: ``h2d`` (A's values and the
  right-hand sides), ``numeric`` (assembly + factorization; log det from the diagonal),
  ``solve`` (forward and backward substitution, the factor resident), ``refine`` (iterative
  refinement, :func:`~.refinement.refine`), ``d2h`` (the solution).
  The engine (:mod:`.cpu` or :mod:`.gpu`) does each step; the CPU engine moves no data, so it
  records no ``upload``, ``h2d`` or ``d2h``. No collective is needed: the other ranks wait.
  ``summary()`` adds its phases' seconds (:meth:`Cholesky.phase_seconds`).

The result is the solution x (original numbering) of A x = b, with b = A x_true for a known
x_true (``rhs: random_x`` / ``ones_x``) or b = ones (:func:`~.problem.make_rhs`).
Verification is the componentwise backward error max_i |b - A x|_i / (|A| |x| + |b|)_i.
"""
import os
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass

import numpy as np

from ... import generators
from ...arrays import inverse_permutation
from ...config import Setting, non_negative, positive, positive_integers
from ...errors import HisparseError
from ...gpu import start_library_import
from ...layout import WholeOnEveryRank, WholeOnRoot
from ...parallel import bcast_arrays, root_call, scatter_arrays
from ...threads import alone, at_most, take_into, threaded, usable_cores
from ...timing import StepClock, event_else_wall
from .. import Operation
from .factor import SymbolicFactor
from .mapping import subtree_mapping
from .rank_plan import PlanStructure, complete_plan, own_lower_entries, plan_structure
from .ordering import (METIS_NITER, ORDERINGS, SPLIT_CHOICES, analysis_affinity,
                       resolve_ordering, start_ordering_pool)
from .ordering_file import reads_saved_ordering
from .problem import make_rhs
from .reference import backward_error
from .refinement import RankRefinement, refine
from .residual import RankResidual, first_residual, rank_rows, start_residual_warm_up
from .structure import position_arrays, sorted_positions
from .supernodes import RELAXATIONS, TOP_PIECE_COLUMNS
from .symbolic import analyze, check_square_symmetric, warm_up
from .tree import NUMERIC_STEPS, SubtreeExchange


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
    plan : LocalPlan or None
        Strategy ``subtree``: this rank's share of the plan (``sym`` is then None).
    runs : list or None
        Strategy ``subtree``: the runs of top supernodes the rank holds, ``(first and last
        local id, owner, holders)`` in postorder (the blocks it will send and receive).
    solve_runs : list or None
        Strategy ``subtree``: the runs the solve goes by, where they are not ``runs``.
    staged : bool
        Strategy ``subtree`` on the GPU: the update blocks go through host buffers (false: the
        owners read them from the other GPUs through CUDA IPC, and no staging buffer is made).
    """

    sym: SymbolicFactor
    kernels: object = None
    matrix: object = None
    plan: object = None
    runs: list = None
    staged: bool = True
    solve_runs: list = None


#: The steps of a rank's ``distribute`` and ``upload`` phases under strategy subtree, recorded
#: per rank as ``chol_setup_<step>_seconds``: rank 0 cutting every rank's share of the factor's
#: structure (the others wait), sending them with the ordering, the rank taking its entries
#: and rows of P A P^T from its own copy of A (:class:`~hisparse.layout.WholeOnEveryRank`),
#: planning the residual's halo, completing its own numeric plan
#: (:func:`~.rank_plan.complete_plan`: its relative indices and where its entries of A go); then
#: waiting for the GPU libraries' import, building the engine (its device arrays and uploads),
#: mapping the peers' panels (CUDA IPC).
SETUP_STEPS = ("plans", "scatter", "entries", "residual", "complete", "import", "engine", "ipc")
#: What a rank's set-up does outside its named phases (the driver's ``prepare``), recorded per
#: rank as ``chol_prepare_<step>_seconds``: starting the ordering's worker processes (rank 0),
#: loading the GPU kernels (every rank of a node), Numba's start and the compiled analysis'
#: load (rank 0: ``chol_compiled_load_seconds``), A's values and the right-hand side (rank 0),
#: and on the other ranks the wait for rank 0's analysis.
PREPARE_STEPS = ("pool", "kernels", "compiled", "rhs", "wait")
#: Variables that set the BLAS's threads; without one, ranks sharing a node oversubscribe it.
BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: ``refinement`` values: ``auto`` or a fixed number of steps.
REFINEMENT = ("auto", 0, 1, 2)

#: Fewest rows for which the GPU libraries are imported while METIS runs: below it METIS takes
#: milliseconds and the import (mostly Python holding the interpreter) would run on into the
#: symbolic analysis, so it is made in the upload (docs/ops/cholesky.md, "Figures moved out of
#: the code").
OVERLAP_IMPORT_MIN_ROWS = 10_000


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

    GATHERS_RESULT = True
    NAME = "cholesky"
    INPUT_KIND = "matrix"
    PARAMS = {
        "ordering": Setting(str, "auto", "Fill-reducing ordering; auto = geometric for a known "
                                         "2-D or 3-D grid (ordering_grid, or a generated "
                                         "poisson input), else metis when pymetis is "
                                         "installed, else rcm on one rank and dissection "
                                         "(level-set nested dissection, RCM inside) on "
                                         "several.", choices=ORDERINGS),
        "ordering_file": Setting(str, None, "HDF5 file of the fill-reducing ordering: read "
                                            "instead of computing it when the file exists (it "
                                            "must be of this matrix and this ordering method; "
                                            "any rank count), else the computed ordering is "
                                            "written there (a new file). A scaling study's "
                                            "runs of one matrix then order it once.",
                                 nullable=True, path=True),
        "ordering_grid": Setting(list, None, "The regular grid whose points the rows are, "
                                             "numbered row-major (the first extent slowest), "
                                             "e.g. [120, 120, 120]: ordering: geometric cuts "
                                             "it by lattice planes (axis and, for a stencil "
                                             "of face neighbours, diagonal ones): an ordering "
                                             "in a fraction of METIS's time, with less fill "
                                             "on 3-D grids. A generated poisson input gives "
                                             "its dims without it.",
                                 nullable=True, check=positive_integers),
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
        "analysis_affinity": Setting(str, "node", "Rank 0's analysis (ordering workers, "
                                                  "parallel loops): node (on all the node's "
                                                  "CPUs when a launcher bound the rank to fewer, "
                                                  "the binding restored after it) or bound (as "
                                                  "bound).", choices=("node", "bound")),
        "relaxation": Setting(str, "threshold", "Supernode amalgamation: threshold (merge "
                                                "child and parent below merge_threshold "
                                                "columns), cholmod (CHOLMOD's zero-fraction "
                                                "rules) or none.", choices=RELAXATIONS),
        "merge_threshold": Setting(int, 64, "Column threshold of relaxation 'threshold'.",
                                   check=positive),
        "block_size": Setting(int, 1024, "Columns per block task of large supernodes.",
                              check=positive),
        "top_piece_columns": Setting(int, TOP_PIECE_COLUMNS, "partition.strategy subtree: the "
                                                             "separators above the ranks' "
                                                             "subtrees are cut into pieces of "
                                                             "at most this many columns, dealt "
                                                             "to the ranks below them, which "
                                                             "factor each separator together "
                                                             "(a pipeline); 0: one rank each.",
                                     check=non_negative),
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
                                               "chunks it depends on; under partition "
                                               "subtree over each rank's subtrees, its top "
                                               "supernodes one launch per chunk) or levels "
                                               "(one launch per chunk level and direction).",
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
        "subtree_exchange": Setting(str, "auto", "GPU, partition.strategy subtree: update "
                                                 "blocks read by the owner's GPU straight from "
                                                 "the other GPUs' memory through CUDA IPC "
                                                 "(ipc; one node), or staged through "
                                                 "page-locked host memory and MPI (host); auto: "
                                                 "ipc when every rank is on one node.",
                                    choices=("auto", "host", "ipc")),
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
    PARTITIONS = ("single", "subtree")
    PEERS = ("cusolver", "cholmod")

    @classmethod
    def files_written(cls, params):
        path = params["ordering_file"]
        # an existing file is read, not written (:mod:`.ordering_file`)
        return [] if not path or reads_saved_ordering(path) else [
            ("operation.params.ordering_file", path, None)]
    # The subtree strategy's blocks move through host MPI: nothing moves on the device.
    DEVICE_COLLECTIVES = False
    SETUP_PHASES = {"analysis": "setup", "distribute": "communication", "upload": "transfer"}
    REPEAT_PHASES = {"h2d": "transfer", "numeric": "compute", "solve": "compute",
                     "refine": "compute", "d2h": "transfer"}
    COMPUTE_PHASES = ("numeric",)
    DEFAULT_RTOL = {"fp64": 1e-12, "fp32": 1e-5}

    @classmethod
    def estimate_memory(cls, config, header, nranks):
        """Rank 0: A, its factor (at least A's lower triangle), and the right-hand sides B and
        the solution X (n x nrhs each); under strategy subtree every rank holds A too
        (:meth:`layout`)."""
        from .. import MemoryEstimate
        n = header.nrows
        factor = header.csr_bytes(n, (header.nnz + n) // 2)
        strategy = config["partition.strategy"]
        if strategy == "auto":
            strategy = cls.auto_strategy(nranks)
        every_rank = nranks > 1 and strategy == "subtree"
        estimate = MemoryEstimate().add(header.key, header.part_bytes(1),
                                        root_only=not every_rank)
        estimate.add(header.key, factor, root_only=True)
        estimate.note("Cholesky's factor is counted as A's lower triangle: its fill is known only "
                      "after the analysis, and is most of the memory (3-D Laplacian 250^3: 175 "
                      "GB against 0.7 GB); python jobs/cholesky_plan.py (--input FILE | DIMS) "
                      "RANKS... gives each rank's bytes from the analysis")
        return estimate.add("operation.params.nrhs",
                            2 * n * config["operation.params.nrhs"] * header.value_bytes,
                            root_only=True)

    def layout(self):
        """Under strategy subtree (``auto`` at several ranks) every rank reads the whole matrix,
        its own copy, while rank 0 analyses (:class:`~hisparse.layout.WholeOnEveryRank`): each
        rank then takes its rows and lower entries of P A P^T itself once rank 0's ordering is
        known, where rank 0 cut every rank's and sent them (on the 2000^2 grid at 2 ranks,
        333 MB a rank after the analysis). Under ``single`` rank 0 reads it."""
        if self.strategy == "single":
            return WholeOnRoot(self.INPUT_KIND)
        return WholeOnEveryRank(self.INPUT_KIND)

    @classmethod
    def auto_strategy(cls, nranks):
        """``subtree`` on several ranks (each factors its subtrees), ``single`` on one."""
        return "subtree" if nranks > 1 else "single"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.distributed = self.strategy == "subtree" and ctx.size > 1

    # -- collective ------------------------------------------------------------------------
    def setup(self, problem):
        ctx = self.ctx
        self.kernels = None
        self.mapping = None
        self.x = self.x_local = None
        self.gather_seconds = 0.0  # collect's gather of the solution (strategy subtree)
        self.logdet = float("nan")
        self.timed_repeats = 0
        self.refinement_steps, self.unrefined_error = 0, float("nan")
        self.library_import, self.library_times = None, (float("nan"),) * 2
        self.residual_warm_up = None  # start_residual_warm_up's thread (strategy subtree)
        if ctx.is_root and self.strategy == "single" and ctx.size > 1:
            ctx.log(f"warning: cholesky: partition.strategy 'single' leaves ranks "
                    f"{list(range(1, ctx.size))} idle (rank 0 factors alone)")
        self.exchange = None  # strategy subtree: the exchanges along the tree (SubtreeExchange)
        self.analysis_steps = {}  # rank 0's analysis phase, by step (StepClock)
        self.setup_split = {}  # SETUP_STEPS' seconds (strategy subtree)
        self.prepare_split = {}  # PREPARE_STEPS' seconds
        if ctx.backend == "cpu" and self.distributed and not any(
                name in os.environ for name in BLAS_THREAD_VARIABLES):
            ctx.log(f"warning: cholesky: {ctx.size} ranks on the CPU backend and no "
                    f"{' / '.join(BLAS_THREAD_VARIABLES)} set: every rank's BLAS may start a "
                    f"thread per core, and the ranks' threads then share the cores (set "
                    f"OMP_NUM_THREADS to the cores per rank)")
        with ExitStack() as analysis:
            if ctx.is_root:  # the other ranks wait for rank 0's analysis: all its cores
                analysis.enter_context(alone())
            self.analysis_cpus = usable_cores()
            if ctx.is_root and self.params["analysis_affinity"] == "node":
                self.analysis_cpus = analysis.enter_context(analysis_affinity(
                    lambda line: ctx.log(f"cholesky: {line}")))
            self._setup_analysed(problem)

    def _setup_analysed(self, problem):
        """:meth:`setup`'s work, rank 0's on the CPUs :func:`analysis_affinity` gave it."""
        ctx = self.ctx
        clock = StepClock()
        # The ordering's worker processes start first, on rank 0 (the one that factors): their
        # start (a fresh interpreter importing the analysis) then overlaps the kernel load,
        # Numba's start-up and the matrix checks instead of the analysis.
        self.ordering = self.ordering_method(problem) if ctx.is_root else None
        self.ordering_pool = start_ordering_pool(problem.nnz, self.ordering,
                                                 self.params["ordering_split"]) \
            if ctx.is_root and not reads_saved_ordering(self.params["ordering_file"]) else None
        clock.mark("pool")
        try:
            if ctx.backend == "gpu":
                # Every rank of the node takes part (the node-local compile is collective),
                # though only rank 0 factors.
                from .gpu import load_kernels
                self.kernels = load_kernels(ctx)
            clock.mark("kernels")
            self.engine = None
            if self.distributed and ctx.backend == "gpu" and not ctx.is_root:
                # every rank's engine needs the GPU libraries: imported while this rank waits
                # for rank 0's analysis, not in its upload (rank 0's overlaps its METIS)
                self._start_library_import()
            if self.distributed and self.refines and not ctx.is_root:
                self.residual_warm_up = start_residual_warm_up()  # while rank 0 analyses
            waited = time.perf_counter()
            if self.distributed and not ctx.is_root:
                self._own_copy(problem)  # while rank 0 analyses
            root_call(ctx.comm, self._setup_root, problem)
            if not ctx.is_root:
                self.prepare_split["wait"] = time.perf_counter() - waited
            self.prepare_split.update(clock.seconds)
            if self.distributed:
                self._distribute()
        finally:
            if self.ordering_pool is not None:
                self.ordering_pool.shutdown(wait=False, cancel_futures=True)
                self.ordering_pool = None

    def ordering_method(self, problem):
        """``ordering`` with ``auto`` resolved (:func:`~.ordering.choose_ordering`: the grid, the
        stencil read from the rows' most entries, the ranks): before the ordering's worker
        processes start, which the planes of a grid do not need."""
        return resolve_ordering(self.params["ordering"], self.ctx.size if self.distributed else 1,
                                self.ordering_grid(), problem.indptr)

    def ordering_grid(self):
        """The grid ``ordering: geometric`` cuts: ``ordering_grid``, else a generated poisson
        input's dims (its rows are the grid's points, row-major), else None."""
        grid = self.params["ordering_grid"]
        spec = self.ctx.config["input"]["generate"]
        if grid is None and spec is not None:
            grid = generators.grid_of_spec(generators.validate_spec(dict(spec)))
        return grid

    def _own_copy(self, problem):
        """A rank other than 0, while rank 0 analyses: its copy of A as the distribution
        reads it (SciPy CSR, the values, the sorted pattern's arrays) and the compiled passes
        of its share loaded (a one-rank analysis of a small grid: the lower entries, their
        offsets, the update groups), which its distribution would otherwise pay first."""
        self.matrix = problem.to_scipy()
        self.values = np.ascontiguousarray(problem.data)
        self.positions = position_arrays(sorted_positions(self.matrix))
        self._compiled_load(1)  # its share's loops (rank 0 loads its own at once)

    def _compiled_load(self, nranks):
        """Numba's start-up and the load of the compiled loops of an ``nranks``-rank analysis
        from its disk cache (:func:`~.symbolic.warm_up`), in seconds: a one-time cost per
        process, recorded apart on rank 0 (``chol_compiled_load_seconds``). Where several ranks
        run, every rank loads at the same time, on one thread: the tiny analyses' parallel loops
        only woke threads that then spun on every core, and the other ranks' work took the cores
        the main thread needed (:func:`~hisparse.threads.at_most`; 7-pt 120^3 on the H200 host,
        alternated: 0.74-0.86 -> 0.49-0.56 s at 2 ranks, 0.99-1.13 -> 0.60-0.94 s at 4;
        docs/ops/cholesky.md, "Stop 60"). One rank keeps its threads (no gain measured)."""
        with at_most(1) if self.ctx.size > 1 else nullcontext():
            return warm_up(nranks)

    def _setup_root(self, problem):
        ctx, params = self.ctx, self.params
        self.compiled_load_seconds = self._compiled_load(ctx.size if self.distributed else 1)
        self.prepare_split["compiled"] = self.compiled_load_seconds
        # The libraries the GPU engine uses are imported while METIS runs (through ctypes: the
        # interpreter is free), not in the upload, where it would add to the time to solution;
        # not at the analysis' start, where it slowed the Python parts. Small matrices import in
        # the upload (OVERLAP_IMPORT_MIN_ROWS).
        self.library_import, self.library_times = None, (float("nan"),) * 2
        overlap_import = ctx.backend == "gpu" and problem.shape[0] >= OVERLAP_IMPORT_MIN_ROWS
        warm_residual = self.distributed and self.refines
        if warm_residual and self.ordering == "geometric":
            # The planes' ordering runs Numba's threads itself, where METIS's C call leaves them
            # free, and the warm-up runs them too: two parallel regions at once abort Numba's
            # workqueue layer. So the warm-up goes first here, on this thread (a 4 x 4 residual
            # from Numba's cache; the ordering it waits for takes about a second, not METIS's
            # several).
            first_residual()
            warm_residual = False

        def while_ordering():  # background work while METIS's processes leave the interpreter free
            if overlap_import:
                self._start_library_import()
            if warm_residual:
                self.residual_warm_up = start_residual_warm_up()

        steps = StepClock()
        with ctx.timer.phase("analysis"):
            matrix = problem.to_scipy()
            pattern_symmetric = _symmetric_or_explain(matrix, problem)
            self.matrix = matrix
            steps.mark("checks")
            self.sym = analyze(matrix, self.ordering, params["relaxation"],
                               params["merge_threshold"], params["block_size"],
                               params["metis_niter"], pattern_symmetric,
                               pool=self.ordering_pool,
                               before_ordering=while_ordering
                               if overlap_import or warm_residual else None,
                               split=params["ordering_split"],
                               nranks=ctx.size if self.distributed else 1,
                               top_piece_columns=params["top_piece_columns"],
                               ordering_file=params["ordering_file"],
                               complete=not self.distributed, grid=self.ordering_grid())
            steps.mark("analyze")
            if self.distributed:
                self.mapping = subtree_mapping(self.sym, ctx.size)
            steps.mark("mapping")
        self.analysis_steps = steps.seconds
        stats, took = self.sym.stats, sum(steps.seconds.values())
        ctx.progress(f"cholesky: analysis {took:.3g} s (ordering {stats['ordering_seconds']:.3g} "
                     f"s, {stats['ordering_source']}; symbolic {stats['symbolic_seconds']:.3g} s)",
                     took)
        made = time.perf_counter()
        self.values = np.ascontiguousarray(problem.data)
        self.b, self.x_true = make_rhs(matrix, params["rhs"], params["nrhs"],
                                       ctx.config["run.seed"])
        self.prepare_split["rhs"] = time.perf_counter() - made
        self.x = None
        self.logdet = float("nan")
        self.timed_repeats = 0
        self.refinement_steps, self.unrefined_error = 0, float("nan")
        if self.distributed:
            idle = self.mapping.idle_ranks()
            if idle:
                ctx.log(f"warning: cholesky: the {self.sym.ordering} ordering's elimination "
                        f"tree leaves ranks {idle} without work under partition.strategy "
                        f"'subtree' (use ordering metis or dissection)")
            return
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
        if self.distributed:
            self._run_distributed()
        else:
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

    # -- strategy subtree ---------------------------------------------------------------------
    def _distribute(self):
        """Send every rank its share of the structure, its right-hand-side rows and the
        ordering; every rank takes its entries of A from its own copy, completes its plan and
        builds its engine. *Collective.*"""
        ctx = self.ctx
        clock = StepClock()
        with ctx.timer.phase("distribute"):
            parts = root_call(ctx.comm, self._plan_parts)
            clock.mark("plans")
            part = scatter_arrays(ctx.comm, parts)
            ordering = {"perm": self.sym.perm} if ctx.is_root else None
            perm = bcast_arrays(ctx.comm, ordering)["perm"]
            clock.mark("scatter")
            owned, n = part["owned_columns"], int(part["n"])
            if ctx.is_root:
                iperm, positions = self.sym.iperm, self.sym.positions
            else:
                iperm = inverse_permutation(perm)
                positions, self.positions = self.positions, None
            # the rank's entries of A (to complete its plan) and its rows of P A P^T (for its
            # rows of the residual), from its own copy of A
            entry_rows, entry_cols, source = own_lower_entries(positions, iperm, owned)
            self.local_values = take_into(np.empty(len(source), dtype=self.values.dtype),
                                          self.values, source)
            rows = rank_rows(self.matrix, perm, iperm, owned) if self.refines else None
            del source, positions
            if ctx.is_root:  # A's kept pattern (int64 arrays as long as A): used up
                self.sym.positions = None
            else:
                self.matrix = self.values = None
            clock.mark("entries")
            # every rank measures its rows of each factorization's residual (refinement):
            # its rows of A in float64 and the halo of x, planned once, not per repeat
            self.rank_residual = RankResidual(ctx.comm, rows, owned, n, part["b"]) \
                if self.refines else None
            del rows
            if self.residual_warm_up is not None:
                self.residual_warm_up.join()
            clock.mark("residual")
            self.local_b = part.pop("b")
            bounds, ranks = part.pop("holders_offset"), part.pop("holders")
            chains, solve_chains = part.pop("chains"), part.pop("solve_chains")
            holders = [ranks[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]
            # the rank's own share of the numeric plan: part of the distribution (rank 0 made
            # every rank's here before)
            self.plan = complete_plan(PlanStructure.from_dict(part), entry_rows, entry_cols)
            del entry_rows, entry_cols
            self.exchange = exchange = SubtreeExchange(
                ctx, self.plan, holders, chains, solve_chains, perm if ctx.is_root else None,
                self.rank_columns if ctx.is_root else None, self.local_b.shape[1])
            clock.mark("complete")
        with self._transfer("upload"):
            self._join_library_import()
            clock.mark("import")
            ipc = exchange.ipc_wanted(self.params["subtree_exchange"])
            self.engine = self.pick_engine(CholeskyLocal(
                None, self.kernels, None, self.plan, exchange.tops(), staged=not ipc,
                solve_runs=exchange.tops(exchange.solve_chains) if ipc else None), "subtree")
            clock.mark("engine")
            exchange.connect(self.engine, ipc)
            clock.mark("ipc")
        self.setup_split = clock.seconds

    def _plan_parts(self):
        """Rank 0: every rank's part: its :class:`PlanStructure` and its rows of ``b``. The
        analysis stopped before the numeric plan (``complete=False``): each rank takes its
        entries of A from its own copy and makes its own share of the plan, where rank 0 made
        every rank's in turn."""
        sym, mapping = self.sym, self.mapping
        holders = mapping.holders
        offsets = np.concatenate([[0], np.cumsum([len(h) for h in holders])]).astype(np.int64)
        flat = np.concatenate(holders).astype(np.int64) if holders else np.zeros(0, np.int64)
        b_perm = self.b[sym.perm]
        parts = [None] * self.ctx.size

        def make_part(rank):  # NumPy array work: the ranks' parts are made on threads
            structure = plan_structure(sym, mapping, rank)
            parts[rank] = dict(structure.to_dict(),
                               b=np.ascontiguousarray(b_perm[structure.owned_columns]),
                               holders_offset=offsets, holders=flat, chains=mapping.chains,
                               solve_chains=mapping.solve_chains)

        threaded(make_part, range(self.ctx.size), name="cholesky-plans")
        self.rank_columns = [part["owned_columns"] for part in parts]
        return parts

    def _run_distributed(self):
        timer = self.ctx.timer
        if timer.enabled:
            self.timed_repeats += 1
        with self._transfer("h2d"):
            self.engine.load(self.local_values)
        with timer.phase("numeric"):
            self.logdet = self.exchange.factor()
        with timer.phase("solve"):
            self.exchange.solve(self.local_b)
        with self._transfer("d2h"):
            x_local = self._local_solution()
        with timer.phase("refine"):
            self.x_local = self._refine_distributed(x_local)

    def _local_solution(self):
        """This rank's rows of the solution (owned columns), float64, a copy of its own: the
        engine's buffer is overwritten by the next solve."""
        return np.array(self.engine.solution(), dtype=np.float64)

    @property
    def refines(self):
        """Whether the solve is followed by iterative refinement (``refinement`` not 0)."""
        return self.params["refinement"] != 0

    def _refine_distributed(self, x_local):
        """:func:`~.refinement.refine` for strategy subtree, the solution left on the ranks
        (:class:`~.refinement.RankRefinement`). Returns this rank's rows of the refined solution.
        *Collective.*"""
        solution = RankRefinement(x_local, self.rank_residual, self._correction)
        self.refinement_steps, self.unrefined_error = refine(
            solution, self.params["refinement"], self.params["refinement_tolerance"])
        return solution.x

    def _correction(self, residual):
        """This rank's rows of A^-1 r, solved from every rank's ``residual`` rows along the
        tree. *Collective.*"""
        self.exchange.solve(residual.astype(self.local_b.dtype, copy=False))
        return self._local_solution()

    def collect(self):
        """Strategy subtree: the solution's rows to rank 0 (once, after the repeats: each
        repeat leaves them on the ranks) and every rank's peak device bytes."""
        if self.distributed:
            began = time.perf_counter()
            self.x = self.exchange.gather_solution(self.x_local)
            self.gather_seconds = time.perf_counter() - began
            held = self.engine.held_bytes()
            self.rank_held_bytes = self.ctx.comm.gather(held, root=0)

    def teardown(self):
        if self.engine is not None:
            if self.exchange is not None:
                self.exchange.close()
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
        stats["chol_partition"] = self.strategy
        stats.update(self._rank_stats())
        stats["chol_compiled_load_seconds"] = self.compiled_load_seconds
        # The background import of the GPU libraries (started with the ordering): what it
        # took, and how long the upload waited for it.
        stats["chol_library_import_seconds"], stats["chol_library_wait_seconds"] = \
            self.library_times
        stats["chol_analysis_cpus"] = self.analysis_cpus
        # the analysis phase beside analyze()'s own steps: the matrix checks, the mapping
        for step in ("checks", "mapping"):
            stats[f"chol_analysis_{step}_seconds"] = self.analysis_steps.get(step, 0.0)
        stats["chol_refinement"] = str(self.params["refinement"])
        stats["chol_refinement_steps"] = self.refinement_steps
        stats["chol_unrefined_backward_error"] = self.unrefined_error
        stats.update(self.phase_seconds())
        return stats

    def _rank_stats(self):
        """Every rank's factor flops and held bytes (one entry per rank), the top supernodes
        and the ranks left without work."""
        nranks = self.ctx.size
        if self.mapping is None:  # rank 0 factors everything
            flops = np.zeros(nranks)
            flops[0] = self.sym.flops
            return {"chol_rank_flops": flops, "chol_speedup_bound": 1.0, "chol_top_supernodes": 0,
                    "chol_top_exchanges": 0,
                    "chol_idle_ranks": list(range(1, nranks))}
        held = getattr(self, "rank_held_bytes", None)
        stats = {"chol_rank_flops": np.asarray(self.mapping.rank_flops, dtype=np.float64),
                 # the flop model's bound on the speed-up over one rank (the top supernodes
                 # wait on their children, one rank each)
                 "chol_speedup_bound": float(self.mapping.rank_flops.sum()
                                             / max(self.mapping.makespan, 1.0)),
                 "chol_subtree_exchange": "ipc" if self.exchange.ipc else "host",
                 "chol_top_supernodes": int(len(self.mapping.top)),
                 "chol_top_exchanges": int(len(self.mapping.chains)),
                 "chol_idle_ranks": self.mapping.idle_ranks()}
        if held is not None:
            stats["chol_rank_peak_bytes"] = np.asarray(held, dtype=np.int64)
        return stats

    def phase_seconds(self):
        """Its phases in seconds, the parts of the driver's ``time_to_solution_seconds``:
        ``chol_analysis_seconds``, ``chol_distribute_seconds`` and ``chol_upload_seconds``
        (once), the median over the timed repeats of ``chol_numeric_seconds``,
        ``chol_solve_seconds``, ``chol_refine_seconds`` and ``chol_transfer_seconds`` (h2d +
        d2h), CUDA-event time where recorded, else wall time; ``chol_gather_seconds``: the
        solution's gather to rank 0 in ``collect`` (strategy subtree; once)."""
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
                "chol_distribute_seconds": seconds("distribute", 0),
                "chol_upload_seconds": seconds("upload", 0),
                "chol_numeric_seconds": seconds("numeric"), "chol_solve_seconds": seconds("solve"),
                "chol_gather_seconds": self.gather_seconds,
                "chol_refine_seconds": seconds("refine"),
                "chol_transfer_seconds": seconds("h2d") + seconds("d2h")}

    def rank_info(self):
        if self.distributed:
            plan = self.plan
            info = {"n_rows": int(len(plan.owned_columns)), "nnz": int(len(plan.a_dest)),
                    "chol_held_supernodes": int(plan.nsuper),
                    "chol_held_bytes": int(self.engine.held_bytes())}
            numeric_split, solve_split = self.exchange.numeric_split, self.exchange.solve_split
            if numeric_split:  # the median over the factorizations (warm-up included)
                split = np.median(np.asarray(numeric_split), axis=0)
                info.update({f"chol_{step}_seconds": float(seconds)
                             for step, seconds in zip(NUMERIC_STEPS, split)})
            if solve_split:  # the median over the solves (refinement's included)
                info["chol_solve_subtree_seconds"] = float(np.median(solve_split))
            info.update({f"chol_setup_{step}_seconds": float(self.setup_split.get(step, 0.0))
                         for step in SETUP_STEPS})
            return dict(info, **self._prepare_info())
        if not self.ctx.is_root:
            return self._prepare_info()
        info = {"n_rows": int(self.sym.n), "nnz": int(len(self.values)), **self._prepare_info()}
        if self.engine.BACKEND == "gpu":
            item = np.dtype(self.ctx.value_dtype).itemsize
            info["bytes_h2d"] = int(len(self.values) * item + self.b.size * item)
            info["bytes_d2h"] = int(self.b.size * item)
            info["bytes_plan"] = int(self.engine.bytes_plan)
        return info

    def _prepare_info(self):
        return {f"chol_prepare_{step}_seconds": float(self.prepare_split.get(step, 0.0))
                for step in PREPARE_STEPS}

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
