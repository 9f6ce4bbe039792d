"""CP-ALS (ParSCP-ALS): rank-R CP decomposition of a sparse tensor, with a fused MTTKRP that never
forms the Khatri-Rao product, on the host or on one GPU per rank.

Plan: rank 0 builds, for every mode n, the CSR of the mode-n unfolding (nonzeros sorted by the
mode-n index, other coordinates kept as N-1 int32 arrays) and cuts its rows into contiguous
blocks (nnz-balanced by default), one per rank; each rank keeps its blocks of all N unfoldings
resident. Factors, their Grams and lambda are replicated. One iteration updates the modes in
order 0..N-1:

    M = MTTKRP(X, {U_m}, n)            local rows only                 phase mttkrp
    U_n = M V^-1,  V = *_{m != n} G_m  (R x R, by the engine)          phase solve
    all-gather the updated rows of U_n (a planned RowAllGather)         phase allgather
    lambda = column 2-norms (iteration 1) or max(max|U|, 1); U_n /= lambda; G_n = U_n^T U_n
                                                                        phase gram
    fit = 1 - ||X - M|| / ||X|| from lambda, the Grams and <U_N, M_N>   phase fit

(Tensor Toolbox / pyttb rules; fit arithmetic in fp64.) The loop stops when |delta fit| < tol
after the first iteration, or at max_iters. One repetition of the driver is the whole ALS from
the same initial factors (or from a checkpoint when resuming).

The engines (:mod:`.cpu`, :mod:`.gpu`) compute on this rank's data only and hold the ALS state;
the collectives (the row all-gather of each mode, the all-reduce of <X, M>) are planned here in
:meth:`CPALS.setup` on the run's transport and composed with the engine steps in
:meth:`CPALS.run_once`. On a device transport (NCCL) the GPU engine's factor is gathered in
place on the device and <X, M> is summed on the device: an iteration reads one number, the fit,
back to the host.
"""
import time

import numpy as np

from ...config import Setting, non_negative, positive
from ...errors import HisparseError, InputError, LayoutError
from ...formats import index_dtype_for
from ...parallel import AllReduce, RowAllGather
from .._base import Operation
from .peers import cusparse_mttkrp_peer, numpy_mttkrp_peer
from .state import (ModeCSR, UnfoldingBlocks, init_check, mode_unfolding, numpy_cp_als,
                    nvecs_factors, partition_mode, random_factors, read_checkpoint,
                    read_factor_file, row_major_order, run_fingerprint, write_checkpoint)

#: Seconds the iteration's one wait spins on the GPU stream before the transport's bounded,
#: sleeping wait takes over (a sleeping poll would add up to its sleep to every iteration).
SPIN_SECONDS = 0.05


class CPALS(Operation):
    """CP decomposition of a sparse tensor by alternating least squares."""

    NAME = "cpals"
    INPUT_KIND = "tensor"
    PARAMS = {
        "rank": Setting(int, 16, "CP rank R (columns of each factor).", check=positive),
        "tol": Setting(float, 1e-4, "Stop when |fit - previous fit| < tol (after iteration 1).",
                       check=non_negative),
        "max_iters": Setting(int, 50, "Most ALS iterations.", check=positive),
        "init": Setting(str, "random", "'random' (uniform [0,1) from run.seed), 'nvecs', or "
                                       "'FILE.h5[:/group]' with factor_0..factor_{N-1}.",
                        check=init_check),
        "mttkrp": Setting(str, "fast", "GPU MTTKRP kernel: 'seed' (one block per unfolding row) "
                                       "or 'fast' (nonzero-parallel teams).",
                          choices=("seed", "fast")),
        "chunk": Setting(int, None, "Nonzeros per team of the 'fast' kernel; null = auto.",
                         nullable=True, check=positive),
        "checkpoint_every": Setting(int, 0, "Write a checkpoint every k iterations (0 = never).",
                                    check=non_negative),
        "checkpoint": Setting(str, None, "Checkpoint file (HDF5).", nullable=True),
        "resume": Setting(bool, False, "Start from the checkpoint file instead of the init."),
    }
    PARTITIONS = ("nnz_balanced", "row_blocks")
    PEERS = ("cusparse", "numpy")
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "upload": "transfer"}
    # Every rank computes the Gram and lambda from its full copy of the factor: no exchange. The
    # fit phase holds the all-reduce of one number and the iteration's one wait for the GPU.
    REPEAT_PHASES = {"mttkrp": "compute", "solve": "compute", "allgather": "communication",
                     "gram": "compute", "fit": "compute", "checkpoint": "io"}
    COMPUTE_PHASES = ("mttkrp",)
    DEFAULT_RTOL = {"fp64": 1e-9, "fp32": 1e-3}

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

    # -- setup ----------------------------------------------------------------------------------
    def setup(self, problem):
        ctx = self.ctx
        part, start = self.distribute(problem)
        self.shape = tuple(int(s) for s in part["shape"])
        self.norm_x = float(part["norm_x"])
        order = len(self.shape)
        self.local = UnfoldingBlocks(self.shape, [ModeCSR.from_part(part[f"mode{n}"])
                                                  for n in range(order)])
        self.start = {"fits": [float(f) for f in start["fits"]], "lam": start["lam"],
                      "factors": [start[f"factor_{m}"] for m in range(order)],
                      "grams": [start[f"gram_{m}"] for m in range(order)]}
        # Planned once: who owns which rows of every factor, and the sum of <X, M>.
        transport = ctx.transport
        self.factor_gathers = [RowAllGather(transport, csr.row_offset, csr.n_rows, self.rank)
                               for csr in self.local.modes]
        self.inner_sum = AllReduce(transport, "sum")
        self.engine = self.pick_engine(self.local, self.params["mttkrp"])
        # A device transport moves the GPU engine's factor rows GPU to GPU; otherwise they go
        # through the engine's pinned host copy (MPI).
        self.device_exchange = bool(transport.device) and self.engine.BACKEND == "gpu"
        with ctx.timer.phase("upload"):
            self.engine.upload()

    def partition(self, problem):
        ctx = self.ctx
        self._check_problem(problem)
        dtype = ctx.value_dtype
        index_dtype = index_dtype_for(problem.nnz, ctx.index_width)
        base_order = row_major_order(problem)
        self.full_csrs = [mode_unfolding(problem, n, index_dtype, base_order)
                          for n in range(problem.order)]
        blocks = [partition_mode(csr, ctx.size, self.strategy) for csr in self.full_csrs]
        p = self.params
        if p["checkpoint_every"] or p["resume"]:
            self.fingerprint = run_fingerprint(problem.shape, self.full_csrs[0], self.rank,
                                               self._init_label(), ctx.config["precision"])
        norm_x = float(np.sqrt(np.sum(problem.values.astype(np.float64) ** 2)))
        parts = [{"shape": np.asarray(problem.shape, dtype=np.int64), "norm_x": norm_x}
                 for _ in range(ctx.size)]
        for n in range(problem.order):
            for r in range(ctx.size):
                parts[r][f"mode{n}"] = blocks[n][r].as_part()
        return parts, self._initial_state(problem, dtype)

    def _check_problem(self, problem):
        """Refuse what CP-ALS cannot decompose, naming the input and the mode; warn where the
        rank exceeds a mode's length (rank 0)."""
        ctx, source = self.ctx, self._input_name()
        if problem.order < 2:
            raise InputError(f"{source}: CP-ALS needs a tensor of order >= 2")
        if problem.nnz == 0:
            raise InputError(f"{source}: the tensor has no nonzeros; CP-ALS has nothing to "
                             f"decompose")
        short = [m for m, size in enumerate(problem.shape) if size < ctx.size]
        if short:
            modes = ", ".join(f"mode {m} (length {problem.shape[m]})" for m in short)
            most = min(problem.shape)
            raise LayoutError(f"{source}: CP-ALS gives every rank a block of every mode's indices, "
                              f"but {modes} {'has' if len(short) == 1 else 'have'} fewer than "
                              f"the {ctx.size} ranks; run with at most {most} "
                              f"rank{'' if most == 1 else 's'}")
        for m, size in enumerate(problem.shape):
            if self.rank > size:
                ctx.log(f"warning: CP rank {self.rank} exceeds the length {size} of mode {m}: "
                        f"factor {m}'s columns cannot be independent (the decomposition is not "
                        f"unique)")

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
        ctx, engine, p = self.ctx, self.engine, self.params
        timer, stream = ctx.timer, getattr(engine, "stream", None)
        order = len(self.shape)
        start = self.start
        engine.load(start["factors"], start["grams"], start["lam"])
        fits = list(start["fits"])
        fit = fits[-1] if fits else 0.0
        seconds = []
        self.final = None
        for iteration in range(len(fits), p["max_iters"]):
            began = time.perf_counter()
            fit_old = fit
            for n in range(order):
                with timer.phase("mttkrp", stream=stream):
                    engine.mttkrp(n)
                with timer.phase("solve", stream=stream):
                    engine.solve(n)
                if n == order - 1:
                    with timer.phase("fit", stream=stream):
                        inner = engine.inner_local()
                with timer.phase("allgather", stream=stream):
                    self._gather_factor(n, stream)
                with timer.phase("gram", stream=stream):
                    engine.normalize(n, first=iteration == 0)
            with timer.phase("fit", stream=stream):
                self.inner_sum(inner, stream=stream)
                engine.fit(self.norm_x)
                self._drain(stream)
                fit = engine.read_fit()
            fits.append(fit)
            seconds.append(time.perf_counter() - began)
            done = iteration > 0 and abs(fit - fit_old) < p["tol"]
            if p["checkpoint_every"] and (len(fits) % p["checkpoint_every"] == 0 or done):
                with timer.phase("checkpoint", stream=stream):
                    self._checkpoint(fits)
            ctx.maybe_fail("iteration", len(fits))  # tests kill a run mid-way (debug.*)
            if done:
                break
        self.fits, self.iteration_seconds = fits, seconds

    def _gather_factor(self, n, stream):
        """Every rank's updated rows of U_n into every rank's copy of it."""
        gather = self.factor_gathers[n]
        if gather.trivial:  # one rank: its rows are the whole factor already
            return
        if self.device_exchange:
            gather(self.engine.device_factor(n), stream=stream)
        else:
            gather(self.engine.factor_buffer(n))
            self.engine.factor_gathered(n)

    def _drain(self, stream):
        """Wait for the iteration's GPU work (nothing to wait for on the host). Spins first: the
        iteration was enqueued without waiting, so this is the one place the host waits for it;
        then the transport's wait, bounded so that a dead peer ends the run instead of hanging
        in NCCL."""
        if stream is None:
            return
        spin_until = time.monotonic() + SPIN_SECONDS
        while not stream.is_done() and time.monotonic() < spin_until:
            pass
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
        """Rank 0 downloads the final factors and lambda, once after the timed repeats. Every
        rank holds them (replicated), so nothing moves between ranks."""
        if self.ctx.is_root:
            self.final = self._final_state()

    def _final_state(self):
        lam, _ = self.engine.state()
        return lam, self.engine.factors()

    def teardown(self):
        self.engine.free()

    # -- results (rank 0) -----------------------------------------------------------------------
    def result(self):
        # The final state of the last repeat; downloaded here when collect() was not called.
        lam, factors = self.final if self.final is not None else self._final_state()
        # Tensor Toolbox arrange(): columns to unit 2-norm, weights into lambda, sorted by weight.
        weights = np.array(lam, dtype=np.float64)
        unit = []
        for factor in factors:
            norms = np.linalg.norm(factor.astype(np.float64), axis=0)
            norms[norms == 0] = 1.0
            weights = weights * norms
            unit.append(factor / norms.astype(factor.dtype))
        order = np.argsort(-weights, kind="stable")
        return {"fits": np.asarray(self.fits), "lambda": weights[order],
                "factors": [f[:, order] for f in unit],
                "iteration_seconds": np.asarray(self.iteration_seconds)}

    def result_arrays(self, result):
        arrays = {"fit": result["fits"], "lambda": result["lambda"],
                  "iteration_seconds": result["iteration_seconds"]}
        for m, factor in enumerate(result["factors"]):
            arrays[f"factor_{m}"] = factor
        return arrays

    def reference(self, problem):
        """Fits per iteration of a plain NumPy CP-ALS (TTB rules) from the same start."""
        start = self.initial
        if start["fits"]:
            return _resumed_reference(problem, start, self.rank, self.params)
        out = numpy_cp_als(problem, start["factors"], self.rank, self.params["tol"],
                           self.params["max_iters"])
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
        index = np.dtype(self.full_csrs[0].indptr.dtype).itemsize
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
            return numpy_mttkrp_peer(self.full_csrs, factors, count, repeats)
        if name == "cusparse":
            check = None
            if self.ctx.size == 1:
                # Our MTTKRP of the last mode from the same factors, for a correctness check.
                self.engine.load(factors)
                self.engine.mttkrp(problem.order - 1)
                check = (problem.order - 1, self.engine.local_mttkrp(problem.order - 1))
            return cusparse_mttkrp_peer(self.full_csrs, factors, count, repeats, check=check)
        raise HisparseError(f"unknown peer {name}")

    def summary(self):
        fits = self.fits
        seconds = np.asarray(self.iteration_seconds)
        done = len(fits) - len(self.initial["fits"])
        out = {"cp_rank": self.rank, "iterations": len(fits), "iterations_this_run": done,
               "final_fit": float(fits[-1]) if fits else float("nan"),
               "converged": bool(len(fits) >= 2 and abs(fits[-1] - fits[-2]) < self.params["tol"]),
               "mttkrp_kernel": getattr(self.engine, "kernel_name", ""),
               # How the factor rows moved: GPU to GPU, through host memory, or not at all.
               "factor_exchange": "device" if self.device_exchange else
               ("host" if self.ctx.size > 1 else "none"),
               "seconds_per_iteration_median": float(np.median(seconds)) if len(seconds) else
               float("nan"),
               "resumed_from_iteration": len(self.initial["fits"])}
        # Per-phase time per iteration in the last repeat (GPU-event time where recorded).
        wall, gpu = self.ctx.timer.arrays(self.ctx.config["run.repeats"])
        phases = list(self.phases())
        for phase in self.REPEAT_PHASES:
            column = phases.index(phase)
            value = gpu[-1, column] if np.isfinite(gpu[-1, column]) else wall[-1, column]
            if np.isfinite(value) and done:
                out[f"{phase}_ms_per_iteration"] = 1e3 * float(value) / done
        if done and "mttkrp_ms_per_iteration" in out:
            out["mttkrp_ms_per_call"] = out["mttkrp_ms_per_iteration"] / len(self.shape)
        return out

    def rank_info(self):
        return {"nnz": int(sum(csr.nnz for csr in self.local.modes)),
                "n_rows": int(sum(csr.n_rows for csr in self.local.modes))}


def _resumed_reference(problem, start, rank, params):
    """Reference fits of a resumed run: the saved fits, then NumPy from the saved state."""
    done = list(start["fits"])
    if len(done) >= params["max_iters"] or (len(done) >= 2 and
                                             abs(done[-1] - done[-2]) < params["tol"]):
        return {"fits": np.asarray(done)}
    out = numpy_cp_als(problem, start["factors"], rank, params["tol"], params["max_iters"],
                fits_done=done, grams=start["grams"])
    return {"fits": np.asarray(out["fits"])}


OPERATION = CPALS
