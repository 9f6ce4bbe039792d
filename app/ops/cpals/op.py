"""CP-ALS (ParSCP-ALS): rank-R CP decomposition of a sparse tensor, with a fused MTTKRP that never
forms the Khatri-Rao product, on the host or on one GPU per rank.

Plan: for every mode n the rows of the mode-n unfolding X_(n) (one per index of mode n) are cut
into contiguous blocks (nnz-balanced by default), one per rank, from the row counts alone; each
rank keeps its blocks of all N unfoldings resident as CSR (nonzeros sorted by the mode-n index,
other coordinates kept as N-1 int32 arrays). Every rank reads or generates a slice of the
tensor; the blocks are cut from per-mode counts summed over the ranks and each nonzero moves to
the owner of its row in every mode (:meth:`CPALS.distribute_parts`; rank 0 reads the whole
tensor and scatters the blocks only where the run needs it whole: nvecs, checkpoints). On the
GPU backend each rank gets the nonzeros of its blocks unsorted and sorts them on its device (a
generated tensor is made there, and at one rank only the squares of its values come to the
host, for ||X||); on the CPU backend each rank sorts its blocks with NumPy. Factors (all rows,
for the MTTKRP), their Grams and lambda are replicated. One iteration updates the modes in order
0..N-1:

    M = MTTKRP(X, {U_m}, n)                    local rows only                      mttkrp
    U_n = M V^-1, V = *_{m != n} G_m; this rank's U^T U, <U, M>, max|U|             solve
    sum (R x R + 1) and max (R) of those over the ranks (planned AllReduces), and
    all-gather the rows of U_n (a planned RowAllGather): one NCCL group              exchange
    lambda = column 2-norms (iteration 1) or max(max|U|, 1); U_n /= lambda;
    G_n = U^T U / (lambda lambda^T); after the last mode the fit                     gram
    wait for the iteration, read the fit (tol = 0: once, after the last iteration)   fit

(Tensor Toolbox / pyttb rules; fit arithmetic in fp64: 1 - ||X - M|| / ||X|| from lambda, the
Grams and <X, M> = the summed <U_N, M_N>.) The work that does not shrink with the ranks is R x R
(the solve's V^-1, lambda, the Grams, the fit), beside the element-wise scaling of the gathered
U_n (I_n x R: one scaling of each gathered row instead of a second exchange). The loop stops
when |delta fit| < tol after the first iteration, at max_iters, or after the iteration in which
the ranks agree on a walltime signal (:mod:`.progress`, which also prints a line per
iteration). One repetition of the driver is the whole ALS from the same initial factors (or
from a checkpoint when resuming).

The engines (:mod:`.cpu`, :mod:`.gpu`) compute on this rank's data only and hold the ALS state;
the collectives are planned here in :meth:`CPALS.setup` on the run's transport and composed with
the engine steps in :meth:`CPALS.run_once`. On a device transport (NCCL) a mode's reductions and
all-gather are one NCCL group on the GPU engine's stream: an iteration reads one number, the
fit, back to the host. There (and at one rank) an iteration is recorded once as a CUDA graph
and replayed with one launch (``gpu.graphs``; :meth:`CPALS._recorded_iteration`).
"""
import math
import time

import numpy as np

from ...config import Setting, non_negative, positive
from ...errors import ConfigError, HisparseError, InputError, LayoutError
from ...formats import COOTensor, index_dtype_for
from ...layout import TensorSliceLayout, WholeOnRoot, route_nonzeros
from ...parallel import AllReduce, RowAllGather, all_call
from ...timing import event_else_wall
from .. import Operation
from .peers import cusparse_mttkrp_peer, numpy_mttkrp_peer
from .checkpoint import CHECKPOINT_SCHEMA, read_checkpoint, run_fingerprint, write_checkpoint
from .init import init_check, nvecs_factors, random_factors, read_factor_file
from .layout import (ModeCOO, RowBlockOwners, UnfoldingBlocks, block_from_part, coo_blocks,
                     mode_counts, mode_unfolding, partition_mode, row_major_order, split_counts)
from .products import FIT_SLOTS, norm_from_blocks, squares_sum
from .progress import PROGRESS_SECONDS, IterationProgress, IterationStops, outcome_line
from .reference import numpy_cp_als, resumed_reference


class CPALS(Operation):
    """CP decomposition of a sparse tensor by alternating least squares."""

    GATHERS_RESULT = True
    WRITES_PARTS = True
    NAME = "cpals"
    INPUT_KIND = "tensor"
    PARAMS = {
        "rank": Setting(int, 16, "CP rank R (columns of each factor).", check=positive),
        "tol": Setting(float, 1e-4, "Stop when |fit - previous fit| < tol (after iteration 1).",
                       check=non_negative),
        "max_iters": Setting(int, 50, "Most ALS iterations.", check=positive),
        "init": Setting(str, "random", "'random' (uniform [0,1) from run.seed), 'nvecs', or "
                                       "'FILE.h5[:/group]' with factor_0..factor_{N-1}.",
                        check=init_check, path=True),
        "mttkrp": Setting(str, "fast", "GPU MTTKRP kernel: 'seed' (one block per unfolding row) "
                                       "or 'fast' (nonzero-parallel teams).",
                          choices=("seed", "fast")),
        "chunk": Setting(int, None, "Nonzeros per team of the 'fast' kernel; null = auto.",
                         nullable=True, check=positive),
        "checkpoint_every": Setting(int, 0, "Write a checkpoint every k iterations (0 = never).",
                                    check=non_negative),
        "checkpoint": Setting(str, None, "Checkpoint file (HDF5).", nullable=True, path=True),
        "resume": Setting(bool, False, "Start from the checkpoint file instead of the init."),
    }
    PARTITIONS = ("nnz_balanced", "row_blocks")
    PEERS = ("cusparse", "numpy")
    # upload: this rank's nonzeros (or built blocks) to its GPU; format: the unfoldings sorted
    # there (GPU backend; the CPU backend's are built in partition).
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "upload": "transfer",
                    "format": "setup"}
    # exchange: each rank's column products of its own rows reduced over the ranks and its rows
    # of the factor all-gathered; the fit phase holds the iteration's one wait for the GPU and
    # the read of the fit. iteration: a whole iteration replayed as one CUDA graph
    # (``gpu.graphs``), in place of its mttkrp, solve, exchange and gram phases, which it holds;
    # so the compute time is the MTTKRPs' when launched directly and the iterations' when
    # replayed.
    REPEAT_PHASES = {"mttkrp": "compute", "solve": "compute", "exchange": "communication",
                     "gram": "compute", "iteration": "compute", "fit": "compute",
                     "checkpoint": "io"}
    COMPUTE_PHASES = ("mttkrp", "iteration")
    DEFAULT_RTOL = {"fp64": 1e-9, "fp32": 1e-3}
    # The fits (and lambda) are on rank 0 whatever output.collect says, so verification always
    # runs; gather brings the factors to rank 0, parts has each rank write its rows of them,
    # none keeps them on the ranks.
    COLLECT_MODES = ("gather", "parts", "none")

    @classmethod
    def estimate_memory(cls, config, header, nranks):
        """The default (the rank's nonzeros), one copy of them per mode's unfolding, and the
        factors every rank holds whole (sum of the dims x rank) with one MTTKRP output."""
        estimate = super().estimate_memory(config, header, nranks)
        estimate.add(header.key, (len(header.shape) - 1) * header.part_bytes(nranks))
        rank = config["operation.params.rank"]
        return estimate.add("operation.params.rank",
                            (sum(header.shape) + max(header.shape)) * rank * header.value_bytes)

    @classmethod
    def files_written(cls, params):
        if params["checkpoint"] and params["checkpoint_every"]:
            return [("operation.params.checkpoint", params["checkpoint"], CHECKPOINT_SCHEMA)]
        return []

    def __init__(self, ctx):
        super().__init__(ctx)
        p = self.params
        if (p["checkpoint_every"] or p["resume"]) and not p["checkpoint"]:
            raise InputError(f"{ctx.config.source}: operation.params.checkpoint (a file path) is "
                             f"needed with checkpoint_every > 0 or resume: true")
        self.rank = p["rank"]
        self.fits, self.iteration_seconds = [], []
        self.final = None
        self.fingerprint = None
        self.device_exchange = False
        self._full_csrs = self._base_order = None
        self.local_parts = None
        self.stops = IterationStops(ctx.comm)
        self.stopped = False  # a walltime signal ended the last ALS early
        self.graphs = None  # recorded iterations (a GraphCache) when they replay as CUDA graphs
        self.graph_ends = {}  # per recorded iteration: the engine's bookkeeping at its end
        self.replayed = False  # whether an iteration replayed one
        self.carried = False  # whether the last iteration left its last mode to the next
        self._runs = 0  # ALS runs done (warm-up and timed repeats), for the progress lines

    # -- setup ----------------------------------------------------------------------------------
    def setup(self, problem):
        ctx = self.ctx
        part, start = self.distribute(problem)
        self.shape = tuple(int(s) for s in part["shape"])
        self.norm_x = float(part["norm_x"])
        order = len(self.shape)
        self.local = UnfoldingBlocks(self.shape, [block_from_part(part, f"mode{n}_")
                                                  for n in range(order)])
        self.start = {"fits": [float(f) for f in start["fits"]], "lam": start["lam"],
                      "factors": [start[f"factor_{m}"] for m in range(order)],
                      "grams": [start[f"gram_{m}"] for m in range(order)]}
        # The blocks hold the nonzeros now: when the engine has sorted them into its unfoldings
        # it lets go of them, and nothing else may keep them (made on the GPU, they go back to
        # CuPy's pool and from there to the driver).
        del part
        # Planned once: who owns which rows of every factor, and the reductions of the column
        # products (sums: U^T U and <U, M>; maxima: max |U|).
        transport = ctx.transport
        self.factor_gathers = [RowAllGather(transport, block.row_offset, block.n_rows, self.rank)
                               for block in self.local.modes]
        self.product_sum = AllReduce(transport, "sum")
        self.product_max = AllReduce(transport, "max")
        self.engine = self.pick_engine(self.local, self.params["mttkrp"])
        # A device transport moves the GPU engine's buffers GPU to GPU; otherwise they go
        # through host memory (MPI).
        self.device_exchange = bool(transport.device) and self.engine.BACKEND == "gpu"
        with ctx.timer.phase("upload"):
            self.engine.upload_data()
        with ctx.timer.phase("format"):
            self.engine.build_unfoldings()
        if self._replayable():
            from ...gpu import GraphCache
            self.graphs = GraphCache()  # recorded on first use (:meth:`_recorded_iteration`)

    def _replayable(self):
        """Whether iterations can replay CUDA graphs: the GPU engine, ``gpu.graphs`` on, and no
        host step inside an iteration (one rank, or the exchange on the device transport)."""
        ctx = self.ctx
        return (self.engine.BACKEND == "gpu" and bool(ctx.config["gpu.graphs"])
                and (ctx.size == 1 or self.device_exchange))

    @classmethod
    def modules_for_setup(cls, config, nranks):
        """CuPy: the GPU backend sorts the unfoldings with it (:meth:`input_module`)."""
        return ("cupy",)

    def input_module(self):
        """CuPy when this rank sorts its unfoldings on its GPU (the GPU backend, CuPy importable
        and able to sort): a generated tensor is then made there (phase ``read``), counted,
        cast and routed there (``partition``, ``distribute``: one rank routes nothing) and
        sorted where it is (``upload`` copies nothing): at one rank only the squares of the
        values cross PCIe, for ||X||. NumPy otherwise (the CPU backend builds its CSR with
        NumPy)."""
        if self.ctx.backend != "gpu":
            return np
        from .device_sort import sorting_cupy
        return sorting_cupy() or np

    def reads_tensor_parts(self):
        """Whether every rank reads or generates its slice of the tensor (the default), or rank 0
        reads it whole and scatters the blocks (:meth:`partition`): it does when the run needs
        the whole tensor there before the ALS starts anyway -- ``init: nvecs`` (the leading
        singular vectors of every whole unfolding) and checkpoints (``checkpoint_every``,
        ``resume``: the fingerprint hashes the whole mode-0 unfolding)."""
        p = self.params
        needs_whole = p["init"] == "nvecs" or bool(p["checkpoint_every"]) or bool(p["resume"])
        return self.strategy in self.PARTITIONS and not needs_whole

    def layout(self):
        """Every rank reads or generates a slice of the tensor and the row blocks are cut and
        filled collectively (:meth:`distribute_parts`), unless the run needs the whole tensor on
        rank 0 anyway (:meth:`reads_tensor_parts`: then :meth:`partition` splits it there)."""
        if not self.reads_tensor_parts():
            return WholeOnRoot(self.INPUT_KIND)
        return TensorSliceLayout(self.distribute_parts, self.input_module)

    def distribute_parts(self, problem):
        """Every rank's row blocks of every mode's unfolding from the ranks' slices of the tensor,
        without the whole tensor anywhere: what :meth:`partition` scatters, array for array.
        *Collective.*

        1. (``partition``) The input is checked (shape and nonzero count are known on every
           rank); the nonzeros per index of every mode are counted on each rank and summed by one
           all-reduce; every rank cuts each mode's row blocks from them (:class:`RowBlockOwners`,
           the bounds :func:`partition_mode` and :func:`coo_blocks` cut from the whole tensor),
           and makes the initial state (the factors from ``run.seed`` or read from their file).
        2. (``distribute``) The nonzeros are put in the rank-0 path's order, spread over the
           ranks in rank order: a file's are routed to the mode-0 row blocks, sorted row-major
           and their duplicates merged there (:meth:`TensorProblem.settle`; the blocks are cut
           again when merging removed any); a generated tensor's slices already are in that
           order (generator order), or are routed to the mode-0 blocks and sorted row-major for
           the CPU backend. The values are cast to the run's dtype.
        3. (``distribute``) One all-to-all per mode moves each nonzero to the owner of its row
           (:func:`route_nonzeros`; mode 0 is already in place when step 2 routed by its
           blocks). A rank's nonzeros arrive in source-rank order, each source's in its order:
           the order of the whole tensor, as :func:`coo_blocks` keeps it. The GPU backend gets
           them as :class:`ModeCOO` (sorted on its device); the CPU backend sorts them into each
           block's CSR here (``partition``; :meth:`ModeCOO.to_csr`: the canonical order of
           :func:`mode_unfolding`).
        4. ||X|| from each rank's sum of squares of its mode-0 block, gathered and added in rank
           order (:func:`norm_from_blocks`), as :meth:`partition` adds the blocks' sums.

        A tensor generated on the GPU (CuPy, :meth:`input_module`) stays there: the counts are
        device bincounts, the cast and a rank's own nonzeros stay on the device (the nonzeros
        sent to other ranks move GPU to GPU on an NCCL transport, else through host memory), and
        the blocks' nonzeros reach the engine
        as device arrays, which it sorts where they are. Only the squares of the mode-0 block
        come to the host, for the sum of step 4 (NumPy's, so that ||X|| has the rank-0 path's
        bits).
        """
        ctx, comm, timer = self.ctx, self.ctx.comm, self.ctx.timer
        shape, order, nparts = problem.shape, problem.order, ctx.size
        on_host = ctx.backend != "gpu"  # the CPU engine takes built CSR blocks
        blocks = []

        def cut(indices):
            """Every mode's row blocks from every rank's ``indices``. *Collective.*"""
            counts = AllReduce(comm, "sum")(mode_counts(indices, shape))
            blocks[:] = [RowBlockOwners(n, c, nparts, self.strategy)
                         for n, c in enumerate(split_counts(counts, shape))]
            return blocks[0]

        with timer.phase("partition"):
            all_call(comm, self._check_problem, problem)
            nonzeros, distinct = problem.take_nonzeros()
            cut(nonzeros["indices"])
            start = all_call(comm, self._initial_state, problem, ctx.value_dtype)
        with timer.phase("distribute"):
            in_mode0_blocks = not distinct or on_host
            if in_mode0_blocks:
                indices, values, _ = problem.settle(comm, nonzeros, distinct, blocks[0], cut,
                                                    ctx.transport)
            else:
                indices, values = nonzeros.pop("indices"), nonzeros.pop("values")
            values = problem.cast(comm, values, indices)
        if distinct and on_host:
            with timer.phase("partition"):  # generator order -> the rank-0 path's row-major
                permutation = row_major_order(COOTensor(indices, values, shape))
                if permutation is not None:
                    indices, values = indices[permutation], values[permutation]
                del permutation
        index_dtype = index_dtype_for(problem.nnz, ctx.index_width)
        part = {"shape": np.asarray(shape, dtype=np.int64)}
        for n in range(order):
            with timer.phase("distribute"):
                mine = {"indices": indices, "values": values}
                if n == order - 1:
                    indices = values = None  # the last routing frees them as it splits them
                if n > 0 or not in_mode0_blocks:
                    # On NCCL GPU to GPU: slower here (NCCL connects the pair at the first
                    # send) but the first repeat no longer pays that (docs/scaling/README.md).
                    mine = route_nonzeros(comm, blocks[n], mine, ctx.transport)
                block = ModeCOO(n, *blocks[n].rows_of(ctx.rank), shape, mine["indices"],
                                mine["values"], index_dtype)
                del mine
            if on_host:
                with timer.phase("partition"):
                    block = block.to_csr()
            if n == 0:
                with timer.phase("distribute"):  # the squares of a device block cross PCIe
                    own_sum = squares_sum(block.values)
                    norm_sums = comm.allgather(own_sum) if nparts > 1 else [own_sum]
            part.update(block.as_part(f"mode{n}_"))
            del block
        part["norm_x"] = norm_from_blocks(norm_sums)
        return part, start

    def partition(self, problem):
        """Rank 0 (the whole tensor read there: see :meth:`reads_tensor_parts`): every mode's
        row blocks, one per rank: sorted into CSR here for the CPU backend, or each rank's
        nonzeros of its blocks, unsorted, for the GPU engines to sort (one rank: the tensor
        itself, not a copy)."""
        ctx = self.ctx
        self._check_problem(problem)
        dtype = ctx.value_dtype
        index_dtype = index_dtype_for(problem.nnz, ctx.index_width)
        if ctx.backend == "gpu":
            blocks = [coo_blocks(problem, n, ctx.size, self.strategy, index_dtype)
                      for n in range(problem.order)]
        else:
            blocks = [partition_mode(csr, ctx.size, self.strategy)
                      for csr in self.full_csrs(problem)]
        p = self.params
        if p["checkpoint_every"] or p["resume"]:
            self.fingerprint = run_fingerprint(problem.shape, self.full_unfolding(problem, 0),
                                               self.rank, self._init_label(),
                                               ctx.config["precision"])
        # ||X|| as the ranks make it from their own blocks (distribute_parts): the same bits.
        norm_x = norm_from_blocks([squares_sum(block.values) for block in blocks[0]])
        parts = [{"shape": np.asarray(problem.shape, dtype=np.int64), "norm_x": norm_x}
                 for _ in range(ctx.size)]
        for n in range(problem.order):
            for r in range(ctx.size):
                parts[r].update(blocks[n][r].as_part(f"mode{n}_"))
        return parts, self._initial_state(problem, dtype)

    def full_unfolding(self, problem, n):
        """The whole mode-n unfolding, built with NumPy on rank 0 when first needed (the CPU
        backend's partition, a checkpoint's fingerprint, the peers) and kept."""
        if self._full_csrs is None:
            self._full_csrs = [None] * problem.order
            self._base_order = row_major_order(problem)  # shared by the modes
        if self._full_csrs[n] is None:
            self._full_csrs[n] = mode_unfolding(
                problem, n, index_dtype_for(problem.nnz, self.ctx.index_width), self._base_order)
        return self._full_csrs[n]

    def full_csrs(self, problem):
        return [self.full_unfolding(problem, n) for n in range(problem.order)]

    def _check_problem(self, problem):
        """Refuse what CP-ALS cannot decompose, naming the input and the mode; warn where the
        rank exceeds a mode's length (rank 0)."""
        ctx, source = self.ctx, self._input_name()
        if problem.order < 2:
            raise InputError(f"{source}: CP-ALS needs a tensor of order >= 2")
        if problem.nnz == 0:
            raise InputError(f"{source}: the tensor has no nonzeros; CP-ALS has nothing to "
                             f"decompose")
        if max(problem.shape) > np.iinfo(np.int32).max:
            raise InputError(f"{source}: tensor mode of length {max(problem.shape)} does not fit "
                             f"the int32 coordinates of the CP-ALS unfolding format")
        short = [m for m, size in enumerate(problem.shape) if size < ctx.size]
        if short:
            modes = ", ".join(f"mode {m} (length {problem.shape[m]})" for m in short)
            most = min(problem.shape)
            raise LayoutError(f"{source}: CP-ALS gives every rank a block of every mode's indices, "
                              f"but {modes} {'has' if len(short) == 1 else 'have'} fewer than "
                              f"the {ctx.size} ranks; run with at most {most} "
                              f"rank{'' if most == 1 else 's'}")
        self._check_rank(tuple(int(s) for s in problem.shape))
        for m, size in enumerate(problem.shape):
            if self.rank > size:
                ctx.log(f"warning: CP rank {self.rank} exceeds the length {size} of mode {m}: "
                        f"factor {m}'s columns cannot be independent (the decomposition is not "
                        f"unique)")

    def _check_rank(self, shape):
        """Refuse, before any factor is allocated, a CP rank above the largest rank a tensor of
        ``shape`` can have: the smallest product of all modes' lengths but one (a mode-n
        unfolding has that many columns). (Whether the factors fit the host is the driver's
        memory estimate, :meth:`estimate_memory`, checked before the input is read.)"""
        bound = min(math.prod(s for m, s in enumerate(shape) if m != n)
                    for n in range(len(shape)))
        if self.rank > bound:
            raise ConfigError(self.ctx.config.source, "operation.params.rank",
                              f"{self.rank} exceeds {bound}, the largest rank a tensor of shape "
                              f"{shape} can have (the smallest product of the other modes' "
                              f"lengths); use a rank <= {bound}")

    def _input_name(self):
        config = self.ctx.config
        return config["input.path"] or "input.generate"

    def _init_label(self):
        """How the factors start, as recorded in a checkpoint's fingerprint."""
        init = self.params["init"]
        return f"random (run.seed {self.ctx.config['run.seed']})" if init == "random" else init

    def _initial_state(self, problem, dtype):
        """Initial factors and Grams (or a checkpoint's state) as a dict of arrays (rank 0)."""
        p, rank, shape = self.params, self.rank, problem.shape
        if p["resume"]:
            state = read_checkpoint(p["checkpoint"], self.fingerprint, dtype)
            self.ctx.log(f"resuming from {p['checkpoint']} after iteration {len(state['fits'])}")
        else:
            if p["init"] == "random":
                factors = random_factors(shape, rank, self.ctx.config["run.seed"], dtype)
            elif p["init"] == "nvecs":
                factors = nvecs_factors(problem, rank, dtype)
            else:
                factors = read_factor_file(p["init"], shape, rank, dtype)
            grams = [f.astype(np.float64).T @ f.astype(np.float64) for f in factors]
            state = {"fits": [], "lam": np.ones(rank), "factors": factors, "grams": grams}
        self.initial = state
        out = {"fits": np.asarray(state["fits"], dtype=np.float64), "lam": state["lam"]}
        for m in range(problem.order):
            out[f"factor_{m}"] = state["factors"][m]
            out[f"gram_{m}"] = state["grams"][m]
        return out

    # -- the ALS loop ---------------------------------------------------------------------------
    def run_once(self):
        """The whole ALS from the start state, in windows of iterations (:meth:`_window`): one
        iteration each when a fit is needed after every iteration (the convergence test,
        checkpoints); with ``tol: 0`` and no checkpoints nothing needs a fit before a window's
        end, so a window's iterations are enqueued back to back and their fits read after one
        wait (their times taken between marks in the engine's stream). After every iteration
        the ranks agree on the stop signals (:class:`~.progress.IterationStops`); after every
        window rank 0 reports the iterations (:class:`~.progress.IterationProgress`)."""
        p, start = self.params, self.start
        self.engine.load(start["factors"], start["grams"], start["lam"])
        self.carried = False
        fits, seconds = list(start["fits"]), []
        self.final, self.stopped = None, False
        deferred = p["tol"] == 0 and not p["checkpoint_every"]
        progress = IterationProgress(self.ctx.log, self.ctx.config["run.progress"],
                                     self._repeat_label())
        while len(fits) < p["max_iters"] and not self.stopped:
            window = min(FIT_SLOTS if deferred else 1, p["max_iters"] - len(fits))
            new_fits, new_seconds = self._window(len(fits), window, deferred)
            first = len(fits)
            fits += new_fits
            seconds += new_seconds
            converged = self._converged(fits)
            if p["checkpoint_every"] and (len(fits) % p["checkpoint_every"] == 0 or converged):
                with self.ctx.timer.phase("checkpoint", stream=getattr(self.engine, "stream",
                                                                       None)):
                    self._checkpoint(fits)
            if not deferred:  # (a window of one iteration: _window checked nothing)
                self.ctx.maybe_fail("iteration", len(fits))  # tests kill a run mid-way
                self.stopped = not converged and self.stops.stop_requested(len(fits))
            ended = converged or self.stopped or len(fits) == p["max_iters"]
            for k in range(first, len(fits)):
                progress.iteration(k + 1, fits[k], fits[k - 1] if k else None,
                                   new_seconds[k - first], last=ended and k == len(fits) - 1)
            if converged:
                break
        self.fits, self.iteration_seconds = fits, seconds
        self._runs += 1

    def _window(self, first, count, deferred):
        """Iterations ``first .. first + count - 1`` (0-based), then one wait and their fits:
        ``(fits, seconds)``. With ``deferred`` a stop signal agreed after an iteration ends the
        window (and the ALS) there, and so does the host's time in the window reaching
        :data:`~.progress.PROGRESS_SECONDS`, so that progress lines keep coming (where a window
        ends changes no result); otherwise the window is one iteration and :meth:`run_once`
        checks the signals after its fit."""
        engine, timer = self.engine, self.ctx.timer
        stream = getattr(engine, "stream", None)
        began = time.perf_counter()
        marks = [engine.mark()]
        for iteration in range(first, first + count):
            self._sweep(iteration, stream)
            marks.append(engine.mark())
            if not deferred:
                break
            self.ctx.maybe_fail("iteration", iteration + 1)  # tests kill a run mid-way
            if self.stops.stop_requested(iteration + 1):
                self.stopped = True
                break
            if time.perf_counter() - began >= PROGRESS_SECONDS:
                break
        done = len(marks) - 1
        with timer.phase("fit", stream=stream):
            self._drain(stream)
            fits = [engine.read_fit(i) for i in range(first, first + done)]
        if deferred:
            return fits, [engine.elapsed(a, b) for a, b in zip(marks, marks[1:])]
        return fits, [time.perf_counter() - began]  # the wait and the read of the fit included

    def _sweep(self, iteration, stream):
        """One ALS iteration: every mode updated in order, the fit left in the engine's slot of
        ``iteration`` (0-based: the first uses column norms for lambda). Replayed as one CUDA
        graph where iterations are recorded (:meth:`_recorded_iteration`), else launched."""
        carry_in, carry_out = self.carried, self._carries(iteration)
        recorded = None
        if self.graphs is not None:
            recorded = self._recorded_iteration(iteration, stream, carry_in, carry_out)
        if recorded is not None:
            graph, end = recorded
            with self.ctx.timer.phase("iteration", stream=stream):
                graph.launch()
            # a replay runs no host code: the engine's record of the device is its recording's
            self.engine.restore_bookkeeping(end)
            self.replayed = True
        else:
            self._issue_iteration(iteration, stream, carry_in, carry_out)
        self.carried = carry_out

    def _carries(self, iteration):
        """Whether ``iteration`` leaves its last mode's exchange and normalisation to the next
        iteration, beside that one's first MTTKRP (GPU engines, ``DEFERS_NORMALIZATION``): every
        iteration but the run's last (``max_iters``) and one a checkpoint follows (it reads the
        factors normalised). An iteration that converges (``tol``) or is stopped after carrying
        leaves the next one's first MTTKRP part done for nothing; the factors are normalised
        when they are read (the engine's ``state``, ``factors``)."""
        p = self.params
        if not self.engine.DEFERS_NORMALIZATION:
            return False
        if iteration + 1 >= p["max_iters"]:
            return False
        every = p["checkpoint_every"]
        return not (every and (iteration + 1) % every == 0)

    def _issue_iteration(self, iteration, stream, carry_in=False, carry_out=False,
                         recording=False):
        """Enqueue (or, ``recording``, record) one ALS iteration's steps, each mode's in its
        phase. A recorded iteration forks and joins the side stream's V^-1 itself: it starts
        with mode 0's and its last mode prepares none (launched, the last mode's overlaps the
        next iteration's first MTTKRP instead).

        GPU engines (``DEFERS_NORMALIZATION``): every mode hands its exchange to a stream of its
        own beside the next MTTKRP's first part, and defers its normalisation past that MTTKRP
        (gpu.py's docstring); for the iteration's last mode the next MTTKRP is the next
        iteration's first, so with ``carry_out`` (:meth:`_carries`) the iteration ends with
        that MTTKRP's first part enqueued, the fit made on the side stream, and every stream
        joined (a recorded iteration is whole), and the next one (``carry_in``) starts with
        that MTTKRP's second part and the W of mode 0 the deferred normalisation made. Without
        ``carry_out`` the last mode is exchanged and normalised on the engine's stream, so
        that the iteration ends with every factor normalised."""
        engine, timer, order = self.engine, self.ctx.timer, len(self.shape)
        first = iteration == 0
        overlapped = engine.DEFERS_NORMALIZATION
        if recording and not carry_in:
            engine.invert_ahead(0)
        for n in range(order):
            last = n == order - 1
            with timer.phase("mttkrp", stream=stream):
                if overlapped and (n > 0 or carry_in):  # its first part went beside the exchange
                    self._mttkrp(engine.mttkrp_after_exchange, n, stream, recording)
                else:
                    self._mttkrp(engine.mttkrp, n, stream, recording)
            with timer.phase("solve", stream=stream):
                products = engine.solve(n)
            if overlapped and (carry_out or not last):
                exchange_stream = engine.fork_exchange()
                with timer.phase("mttkrp", stream=stream):
                    self._mttkrp(engine.mttkrp_before_exchange, (n + 1) % order, stream,
                                 recording)
                with timer.phase("exchange", stream=exchange_stream):
                    self._exchange(n, products, exchange_stream)
                engine.exchange_done()
                with timer.phase("gram", stream=engine.side_stream):
                    engine.defer_normalize(n, first=first,
                                           **({"norm_x": self.norm_x, "slot": iteration}
                                              if last else {}))
                continue
            with timer.phase("exchange", stream=stream):
                self._exchange(n, products, stream)
            with timer.phase("gram", stream=stream):
                engine.normalize(n, first=first, slot=iteration,
                                 norm_x=self.norm_x if last else None,
                                 **({"invert_next": False} if recording and last else {}))
        if carry_out:
            engine.join_side_streams()

    def _mttkrp(self, step, n, stream, recording):
        """Launch (or record) ``step`` (the engine's MTTKRP of mode n, or a part of it).
        Recorded with ``gpu.graph_priorities``, it is the graph's background work: every other
        kernel outranks it, so that the side stream's one-block V^-1 beside it runs at once
        instead of after the MTTKRP's waves, and the exchange beside its first part goes
        first."""
        from ...gpu import background_work
        with background_work(getattr(self.engine, "mttkrp_streams", stream),
                             recording and self.ctx.config["gpu.graph_priorities"]):
            step(n)

    def _recorded_iteration(self, iteration, stream, carry_in, carry_out):
        """The CUDA graph of ``iteration``, recorded on first use, and the engine's bookkeeping
        at its end (``None`` where recording failed): one per distinct set of
        frozen arguments, i.e. per fit slot (the fit's device slot and pinned host copy),
        whether it is the first iteration (lambda from column norms), and whether it takes the
        last iteration's last mode (``carry_in``) and leaves its own to the next
        (``carry_out``). Recording runs nothing and the phase timer is off meanwhile (its
        events would be recorded); the engine's bookkeeping at its end is kept
        (:attr:`graph_ends`) for the replays to restore. If a recording fails, the run says so
        once, the engine's bookkeeping is put back as it was before (nothing ran), and every
        iteration is launched directly from then on."""
        engine, timer = self.engine, self.ctx.timer
        engine.join_inversion()  # nothing of the side stream pending before a graph forks it
        first, slot = iteration == 0, iteration % engine.fit_slots
        key = (first, slot, carry_in, carry_out)
        what = f"CP-ALS iteration ({'first, ' if first else ''}fit slot {slot})"
        before = engine.bookkeeping()
        enabled, timer.enabled = timer.enabled, False
        try:
            graph = self.graphs.graph(
                key, stream, lambda: self._issue_iteration(iteration, stream, carry_in,
                                                           carry_out, recording=True), what)
        finally:
            timer.enabled = enabled
        if graph is None:
            engine.restore_bookkeeping(before)
            self.ctx.log(f"cpals: CUDA graph recording failed ({self.graphs.error}); launching "
                         f"the iterations directly")
            self.graphs.free()
            self.graphs = None
            self.graph_ends = {}
            return None
        if key not in self.graph_ends:  # recorded just now: the engine's record is its end's
            self.graph_ends[key] = engine.bookkeeping()
        return graph, self.graph_ends[key]

    def graph_nodes(self, attribute="nodes"):
        """Nodes of the largest recorded iteration (0 when iterations are launched directly);
        ``attribute="raised"``: its kernel nodes raised above the MTTKRPs."""
        graphs = self.graphs.graphs.values() if self.graphs is not None else ()
        return max((getattr(graph, attribute) for graph in graphs), default=0)

    def _repeat_label(self):
        """``warm-up k: `` or ``repeat k: `` for the progress lines of this ALS."""
        warmup = self.ctx.config["run.warmup"]
        if self._runs < warmup:
            return f"warm-up {self._runs + 1}/{warmup}: "
        return f"repeat {self._runs - warmup + 1}/{self.ctx.config['run.repeats']}: "

    def _exchange(self, n, products, stream):
        """Every rank's column products of its own rows summed (U^T U, <U, M>) and maximised
        (max |U|) over the ranks in place (R x R + R + 1 numbers), and every rank's solved rows
        of U_n gathered into every rank's copy of it: one NCCL group on a device transport (one
        launch), MPI on host buffers otherwise."""
        if self.ctx.size == 1:  # its products and rows are everyone's
            return
        sums, maxima = products
        gather, engine = self.factor_gathers[n], self.engine
        with self.ctx.transport.group():  # one NCCL launch; nothing on the MPI transport
            self.product_sum(sums, stream=stream)
            self.product_max(maxima, stream=stream)
            if self.device_exchange:
                gather(engine.device_factor(n), stream=stream)
            else:
                gather(engine.factor_buffer(n, stream))
                engine.factor_gathered(n, stream)

    def _drain(self, stream):
        """Wait for the iteration's GPU work (with tol = 0: every iteration's; nothing to wait
        for on the host): the one place the host waits for it, through the transport's wait
        (it spins first, and with NCCL is bounded so that a dead peer ends the run instead of
        hanging)."""
        if stream is None:
            return
        self.ctx.transport.wait(stream, "CP-ALS iteration")

    def _checkpoint(self, fits):
        if self.ctx.is_root:
            lam, grams = self.engine.state()
            write_checkpoint(self.params["checkpoint"],
                             {"factors": self.engine.factors(), "grams": grams, "lam": lam,
                              "fits": fits, "fingerprint": self.fingerprint})
        if self.ctx.size > 1:
            self.ctx.comm.Barrier()

    def collect(self):
        """Once after the timed repeats: ``gather`` has rank 0 download the final factors and
        lambda (every rank holds them, so nothing moves between ranks); ``parts`` has every rank
        take its own rows of each factor, arranged like the whole (:meth:`result`), for its part
        file; ``none`` keeps the factors on the ranks. The fits are on rank 0 in every mode."""
        mode = self.ctx.config["output.collect"]
        lam, grams = self.engine.state()
        scale, order, _ = arrangement(lam, grams)
        if mode == "parts":
            self.local_parts = {}
            for m, block in enumerate(self.local.modes):
                rows = np.arange(block.row_offset, block.row_offset + block.n_rows,
                                 dtype=np.int64)
                self.local_parts[f"factor_{m}"] = (arranged(self.engine.factor_rows(m),
                                                            scale[m], order), rows)
        if self.ctx.is_root:
            self.final = (lam, grams, self.engine.factors() if mode == "gather" else None)
            self.ctx.log(outcome_line(self.fits, len(self.fits) - len(self.initial["fits"]),
                                      self._converged(), self.stopped, self.params["tol"]))

    def local_result_arrays(self):
        """``output.collect: parts``: this rank's rows of every factor (arranged as in
        :meth:`result`, global row numbers beside them); rank 0 adds the whole ``fit``,
        ``lambda`` and ``iteration_seconds`` (empty on the other ranks, joined in rank order)."""
        arrays = dict(self.local_parts or {})
        if self.ctx.is_root:
            whole = self.result_arrays(self.result())
        for name in ("fit", "lambda", "iteration_seconds"):
            arrays[name] = (whole[name] if self.ctx.is_root else np.zeros(0), None)
        return arrays

    def teardown(self):
        if self.graphs is not None:  # before the buffers and the NCCL communicator they use
            self.graphs.free()
            self.graphs = None
            self.graph_ends = {}
        self.engine.free()

    # -- results (rank 0) -----------------------------------------------------------------------
    def result(self):
        """Fits, lambda and (gathered) factors of the last repeat, arranged like Tensor Toolbox
        ``arrange()``: columns to unit 2-norm, their norms into lambda, sorted by weight. The
        norms are those of the Grams, so every rank arranges its own rows alike (``parts``)."""
        if self.final is None:  # collect() was not called: download here
            lam, grams = self.engine.state()
            self.final = (lam, grams, self.engine.factors())
        lam, grams, factors = self.final
        scale, order, weights = arrangement(lam, grams)
        return {"fits": np.asarray(self.fits), "lambda": weights[order],
                "factors": None if factors is None else
                [arranged(f, norms, order) for f, norms in zip(factors, scale)],
                "iteration_seconds": np.asarray(self.iteration_seconds)}

    def result_arrays(self, result):
        arrays = {"fit": result["fits"], "lambda": result["lambda"],
                  "iteration_seconds": result["iteration_seconds"]}
        for m, factor in enumerate(result["factors"] or []):
            arrays[f"factor_{m}"] = factor
        return arrays

    def reference(self, problem):
        """Fits per iteration of a plain NumPy CP-ALS (TTB rules) from the same start, over the
        iterations the run did where a walltime signal stopped it early."""
        start, params = self.initial, dict(self.params)
        if self.stopped:
            params["max_iters"] = len(self.fits)
        if start["fits"]:
            return resumed_reference(problem, start, self.rank, params)
        out = numpy_cp_als(problem, start["factors"], self.rank, params["tol"],
                           params["max_iters"])
        return {"fits": np.asarray(out["fits"])}

    def compare(self, result, reference):
        """Largest |fit difference| over the iterations; inf if fp64 runs stop at different
        iterations (fp32 compares the common iterations and the last fits)."""
        ours, theirs = np.asarray(result["fits"]), np.asarray(reference["fits"])
        if len(ours) != len(theirs):
            if self.ctx.config["precision"] == "fp64":
                return float("inf")
            common = min(len(ours), len(theirs))
            return float(max(np.max(np.abs(ours[:common] - theirs[:common]), initial=0.0),
                             abs(ours[-1] - theirs[-1])))
        return float(np.max(np.abs(ours - theirs), initial=0.0))

    def _iterations_run(self):
        return max(1, len(self.fits) - len(self.initial["fits"]))

    def work(self, problem):
        order, rank, nnz = problem.order, self.rank, problem.nnz
        value = np.dtype(self.ctx.value_dtype).itemsize
        index = np.dtype(index_dtype_for(nnz, self.ctx.index_width)).itemsize
        per_round = 0.0
        for n in range(order):
            others = sum(problem.shape[m] for m in range(order) if m != n)
            # Compulsory DRAM traffic: nonzeros (value + N-1 int32), row pointers, output rows,
            # each other factor read once (the per-nonzero factor row gathers hit L2).
            per_round += nnz * (value + 4 * (order - 1)) + (problem.shape[n] + 1) * index + \
                problem.shape[n] * rank * value + others * rank * value
        iterations = self._iterations_run()
        return {"flops": float(iterations * order * order * rank * nnz),
                "bytes": float(iterations * per_round)}

    def run_peer(self, name, problem, repeats):
        count = self._iterations_run() * problem.order
        factors = [np.asarray(f, dtype=self.ctx.value_dtype) for f in self.initial["factors"]]
        if name == "numpy":
            return numpy_mttkrp_peer(self.full_csrs(problem), factors, count, repeats)
        if name == "cusparse":
            check = None
            if self.ctx.size == 1:
                # Our MTTKRP of the last mode from the same factors, for a correctness check.
                self.engine.load(factors)
                self.engine.mttkrp(problem.order - 1)
                check = (problem.order - 1, self.engine.local_mttkrp(problem.order - 1))
            return cusparse_mttkrp_peer(self.full_csrs(problem), factors, count, repeats,
                                        check=check)
        raise HisparseError(f"unknown peer {name}")

    def summary(self):
        fits = self.fits
        seconds = np.asarray(self.iteration_seconds)
        done = len(fits) - len(self.initial["fits"])
        out = {"cp_rank": self.rank, "iterations": len(fits), "iterations_this_run": done,
               "final_fit": float(fits[-1]) if fits else float("nan"),
               "converged": self._converged(),
               "stopped_by_signal": bool(self.stopped),
               "mttkrp_kernel": getattr(self.engine, "kernel_name", ""),
               # How the factor rows moved: GPU to GPU, through host memory, or not at all.
               "factor_exchange": "device" if self.device_exchange else
               ("host" if self.ctx.size > 1 else "none"),
               # Where the unfoldings were sorted: on the GPUs, or on the host (NumPy).
               "unfoldings_built_on": getattr(self.engine, "unfoldings_built_on", "host"),
               # Whether the iterations replayed CUDA graphs (gpu.graphs), or were launched.
               "cpals_graphs": bool(self.replayed and self.graphs is not None),
               "seconds_per_iteration_median": float(np.median(seconds)) if len(seconds) else
               float("nan"),
               "resumed_from_iteration": len(self.initial["fits"])}
        # Per-phase time per iteration in the last repeat (GPU-event time where recorded).
        wall, gpu = self.ctx.timer.arrays(self.ctx.config["run.repeats"])
        phases = list(self.phases())
        for phase in self.REPEAT_PHASES:
            column = phases.index(phase)
            value = event_else_wall(wall[-1, column], gpu[-1, column])
            if np.isfinite(value) and done:
                out[f"{phase}_ms_per_iteration"] = 1e3 * float(value) / done
        if done and "mttkrp_ms_per_iteration" in out:
            out["mttkrp_ms_per_call"] = out["mttkrp_ms_per_iteration"] / len(self.shape)
        return out

    def _converged(self, fits=None):
        """Whether the last two of ``fits`` (by default the last ALS's) differ by under tol."""
        fits = self.fits if fits is None else fits
        return bool(len(fits) >= 2 and abs(fits[-1] - fits[-2]) < self.params["tol"])

    def rank_info(self):
        """Per rank: its nonzeros and rows over all modes' blocks, ``graph_nodes``, the nodes
        of its largest recorded iteration, and ``graph_raised_nodes``, its kernel nodes raised
        above the MTTKRPs (``gpu.graph_priorities``; both 0 when its iterations were launched
        directly)."""
        return {"nnz": int(sum(block.nnz for block in self.local.modes)),
                "n_rows": int(sum(block.n_rows for block in self.local.modes)),
                "graph_nodes": int(self.graph_nodes()),
                "graph_raised_nodes": int(self.graph_nodes("raised"))}


def arrangement(lam, grams):
    """How Tensor Toolbox ``arrange()`` orders the model: per mode the column 2-norms of the
    factor (from its Gram's diagonal; 1 for a zero column), the column order by decreasing
    weight (stable) and the weights lambda * prod(norms)."""
    scale = []
    weights = np.array(lam, dtype=np.float64)
    for gram in grams:
        norms = np.sqrt(np.maximum(np.diag(np.asarray(gram, dtype=np.float64)), 0.0))
        norms[norms == 0] = 1.0
        scale.append(norms)
        weights = weights * norms
    return scale, np.argsort(-weights, kind="stable"), weights


def arranged(rows, norms, order):
    """Rows of a factor with unit-norm columns (``norms`` of the whole factor) in ``order``."""
    return (rows / norms.astype(rows.dtype))[:, order]


OPERATION = CPALS
