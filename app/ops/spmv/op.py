"""SpMV, y = A x, as a distributed operator (PETSc's MPIAIJ MatMult), in CSR or CSR5 format.

Plan: rank 0 partitions A's rows (nnz-balanced blocks by default, or row-modulo) and x (square A:
the same entries as the rank's rows; rectangular A: an even contiguous split of x) and scatters
them. Each rank splits its rows into the local block (the columns whose x entries it owns) and a
compressed ghost block (the others), and plans once, from that column pattern, the halo exchange
of the ghost entries of x (:class:`~hisparse.parallel.HaloExchange`, on the run's transport:
NCCL between GPUs, else MPI). Both blocks stay resident (CSR5: the local block is converted on
the GPU once, phase ``convert``).

Each product exchanges only the ghost entries of x (on a communication stream, device-packed)
while the local block multiplies on the compute stream, then adds the ghost block. For square A
the ``iterations`` products of a repetition chain like a solver's, x <- A x / ||A x||, with the
normalisation folded into the next product: y_{k+1} = (A y_k) / ||y_k||, so the all-reduce of
||y_k||^2 travels with that product's ghost exchange (one NCCL group) instead of standing between
two products, and one kernel scales and sums squares (no host round trip per product);
rectangular A repeats y = A x on the same x. y stays where it was computed; :meth:`SpMV.collect` gathers it to rank 0 once after
the timed repeats. The engines (``cpu.py``, ``gpu.py``) see only :class:`SpmvLocal`; every
collective is planned here. Design notes: docs/ops/spmv.md.
"""
import numpy as np

from ...config import Setting, positive
from ...errors import HisparseError
from ...formats import CSRMatrix
from ...formats import uniform_value
from ...formats import default_sigma, sigma_check
from ...gpu import ReplayPlan
from ...parallel import AllReduce, HaloExchange, RowGather, all_call, max_over_ranks
from ...partition import partition_rows
from ...timing import event_else_wall
from .. import Operation
from .. import make_vector, vector_spec_check
from ...distmatrix import (ghost_columns, local_positions, locate_entries, restore_rows,
                           split_blocks, x_owners)
from .local import SpmvLocal, reorder_local
from .peers import PEERS


def threads_per_row(mean_row_length):
    """Lanes per row for the CSR-vector kernel: the power of two nearest the mean row length."""
    if mean_row_length <= 1:
        return 1
    return int(min(32, 2 ** round(np.log2(mean_row_length))))


def chained_products(matrix, x, iterations):
    """The last y of ``iterations`` products chained like a power iteration: y = A x, then
    x <- y / ||y|| (x <- 0 when y = 0) before each further product. float64 on the host, each
    row summed in entry order as SciPy sums it, by the compiled product of
    :mod:`~hisparse.ops.spmv.reference` on the process's cores; the reference of square runs
    (rectangular runs use ``iterations=1``)."""
    import scipy.sparse as sp

    from .reference import csr_matvec
    matrix = sp.csr_matrix(matrix).astype(np.float64, copy=False)
    y = csr_matvec(matrix, x)
    for _ in range(iterations - 1):
        norm = np.linalg.norm(y)
        x = y / norm if norm > 0 else np.zeros_like(y)
        y = csr_matvec(matrix, x)
    return y


class SpMV(Operation):
    """y = A x for a sparse matrix A (CSR), rows and x distributed over the ranks."""

    NAME = "spmv"
    INPUT_KIND = "matrix"
    PARAMS = {
        "format": Setting(str, "csr", "Sparse format of the local block's kernel.",
                          choices=("csr", "csr5")),
        "iterations": Setting(int, 1, "Products per repetition on resident data; for square A "
                                      "they chain like a solver's, x <- A x / ||A x||.",
                              check=positive),
        "x": Setting(str, "random", "'random', 'ones' or 'FILE.h5:/dataset'.",
                     check=vector_spec_check, path=True),
        "threads_per_row": Setting(int, None, "CSR-vector lanes per row of the local block; "
                                              "null = from its mean row length.", nullable=True,
                                   choices=(1, 2, 4, 8, 16, 32)),
        "sigma": Setting(int, None, "CSR5 tile height (entries per lane, 1..32); null = the mean "
                                    "row length clamped to [16, 32].", nullable=True,
                         check=sigma_check),
        "reorder": Setting(str, "none", "Renumber each rank's local block once at setup: degree "
                                        "= long rows and much-used x entries first (faster "
                                        "gathers of x on power-law matrices); y is returned in "
                                        "the original order.", choices=("none", "degree")),
        "uniform_values": Setting(bool, True, "When every stored value (every rank's local and "
                                              "ghost blocks) is the same (a graph's adjacency "
                                              "matrix), the GPU "
                                              "keeps that value once and its products read "
                                              "only column indices (8 bytes per nonzero fewer "
                                              "in fp64); false keeps the values array."),
    }
    PARTITIONS = ("nnz_balanced", "row_modulo", "row_blocks")
    PEERS = tuple(PEERS)
    #: every rank reads or generates only its own rows (issue 13); x is made on every rank
    ROW_INPUT = True
    # Its exchanges are small (a halo of a few hundred KB, an 8-byte all-reduce): with 4 NCCL
    # channels instead of 16 the connections NCCL makes at their first use (in the graph
    # capture) took 0.35 s instead of 1.24 s, for 11.47-11.49 against 11.39 ms per 50 products
    # (2x H200, 27-pt 160^3; docs/scaling/README.md, "NCCL's set-up").
    NCCL_CHANNELS = 4
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "plan": "setup",
                    "upload": "transfer", "convert": "setup", "graph": "setup"}
    #: ``start``: x back to its initial value (device copy); ``halo``: pack and exchange the
    #: ghost entries of x, with the all-reduce of the chain's squared norm; ``kernel``: local and
    #: ghost block products; ``normalize``: the chain's step x = y / ||previous x|| and this
    #: rank's sum of squares (one kernel). When the repetition replays CUDA graphs
    #: (``gpu.graphs``, setup phase ``graph`` records them), all of it is one replay, timed as
    #: ``kernel``.
    REPEAT_PHASES = {"start": "transfer", "halo": "communication", "kernel": "compute",
                     "normalize": "compute"}
    COMPUTE_PHASES = ("kernel",)

    @classmethod
    def estimate_memory(cls, config, header, nranks):
        """The default (the rank's rows, y) and the whole x every rank holds."""
        estimate = super().estimate_memory(config, header, nranks)
        return estimate.add(header.key, header.shape[1] * header.value_bytes)

    def setup(self, problem):
        ctx = self.ctx
        part, _ = self.distribute(problem)
        # Every rank sizes arrays by the global x here (an x too large for this machine fails
        # on every rank alike): all_call turns that into one collective error line.
        with ctx.timer.phase("plan"):
            if "owned" not in part:  # read by rows: this rank's share of x, made here
                part.update(all_call(ctx.comm, self._own_x, part, problem))
            rows = CSRMatrix(part["indptr"], part["indices"], part["data"],
                             (len(part["indptr"]) - 1, part["ncols"]))
            self.local = all_call(ctx.comm, self._plan, rows, part)
        self.gather_y = RowGather(ctx.transport, part["rows"], part["nrows"])
        self.norm_sum = AllReduce(ctx.transport, "sum")
        self.y_full = None
        self.engine = self.pick_engine(self.local, self.params["format"])
        with ctx.timer.phase("upload"):
            self.engine.upload()
        self.convert_seconds = 0.0
        if hasattr(self.engine, "convert"):
            self.convert_seconds = self.engine.convert()
        # The slowest rank's conversion is what a run waits for.
        self.convert_seconds_max = max_over_ranks(ctx.comm, self.convert_seconds)
        self.replay = None
        if self._replayable():
            with ctx.timer.phase("graph"):
                try:
                    self.replay = self._record_products()
                except HisparseError as exc:  # the products still run, launched one by one
                    ctx.log(f"spmv: CUDA graph capture failed ({exc}); launching directly")

    def _replayable(self):
        """Whether a repetition can replay CUDA graphs: GPU engines, ``gpu.graphs`` on, and no
        host step between the products (one rank, or every collective on the NCCL transport)."""
        ctx = self.ctx
        return (ctx.backend == "gpu" and bool(ctx.config["gpu.graphs"])
                and (ctx.size == 1 or bool(ctx.transport.device)))

    def _record_products(self):
        """Record a repetition's launches (reset x, then ``iterations`` products, chained for
        square A) as CUDA graphs; nothing runs. The timer is off while recording: its events
        would be recorded into the graph instead of timing anything."""
        engine, timer = self.engine, self.ctx.timer

        def first():
            engine.start()
            self._step(0)

        def step():
            self._step(1)

        enabled, timer.enabled = timer.enabled, False
        try:
            return ReplayPlan(engine.stream, first, step, self.params["iterations"],
                              what="SpMV products")
        finally:
            timer.enabled = enabled

    def _plan(self, rows, part):
        """Split this rank's rows into local and ghost blocks and plan the halo exchange."""
        ctx = self.ctx
        n_global = part["ncols"]
        position = local_positions(part["owned"], n_global)
        located = locate_entries(rows, position)  # one pass, for both steps below
        self.halo = HaloExchange(ctx.transport, part["owned"],
                                 ghost_columns(rows, position, located), n_global)
        local, ghost, ghost_rows = split_blocks(rows, position, len(part["owned"]),
                                                self.halo.ghosts, located)
        # Global figures, so that every rank compiles the same kernels: CSR5's sigma follows
        # the mean row length of A, the ghost kernel's lanes the mean ghost row length.
        totals = AllReduce(ctx.transport)(np.array([rows.nnz, rows.nrows, ghost.nnz,
                                                    ghost.nrows], np.int64))
        self.mean_row_length = float(totals[0]) / max(int(totals[1]), 1)
        sigma = None
        if self.params["format"] == "csr5":
            sigma = self.params["sigma"] or default_sigma(self.mean_row_length)
        self.rows_nnz = rows.nnz
        planned = SpmvLocal(local, part["x"], ghost, ghost_rows,
                            self.halo.send_index.astype(local.indices.dtype), sigma,
                            threads_per_row(float(totals[2]) / max(int(totals[3]), 1)),
                            chained=part["nrows"] == part["ncols"],
                            uniform=(self._uniform_value(local.data, ghost.data)
                                     if self.params["uniform_values"] else None))
        planned, self.row_order = reorder_local(planned, self.params["reorder"] == "degree")
        return planned

    def _uniform_value(self, *blocks):
        """The one value every nonzero of every rank's blocks (local and ghost) holds, as a
        1-element array, or ``None``: the same answer on every rank, so that all compile the
        same kernels. One all-reduce of (smallest value, -largest value, -[values differ])."""
        dtype = blocks[0].dtype
        filled = [data for data in blocks if len(data)]
        values = [uniform_value(data) for data in filled]
        if not filled:  # no nonzeros: no say
            bounds = np.array([np.inf, np.inf, 0.0])
        elif any(value is None for value in values):  # values that differ (or are not finite)
            bounds = np.array([0.0, 0.0, -1.0])
        else:
            own = [float(value[0]) for value in values]
            bounds = np.array([min(own), -max(own), 0.0])
        low, negated_high, differ = AllReduce(self.ctx.transport, op="min")(bounds)
        if differ or low != -negated_high or not np.isfinite(low):
            return None
        return np.array([low], dtype=dtype)

    def _own_x(self, part, problem):
        """``owned`` and ``x`` of this rank when every rank read its own rows: the x entries it
        owns (:func:`x_owners`; the other ranks' rows are not needed for either rule), cut from
        the vector every rank makes from the same spec and seed (no broadcast)."""
        ctx = self.ctx
        if part["nrows"] == part["ncols"]:
            owned = np.asarray(part["rows"], dtype=np.int64)
        else:
            owned = x_owners([None] * ctx.size, part["nrows"], part["ncols"])[ctx.rank]
        x = make_vector(self.params["x"], part["ncols"], problem.value_dtype,
                        ctx.config["run.seed"])
        if ctx.is_root:
            self.x_global = x  # the reference and the peers' x
        return {"owned": owned, "x": x[owned]}

    def partition(self, problem):
        ctx = self.ctx
        x = make_vector(self.params["x"], problem.ncols, problem.data.dtype,
                        ctx.config["run.seed"])
        plan = partition_rows(problem.indptr, ctx.size, self.strategy)
        owners = x_owners(plan.rows, problem.nrows, problem.ncols)
        parts = []
        for rows, owned in zip(plan.rows, owners):
            block = (problem.row_block(int(rows[0]), int(rows[-1]) + 1) if plan.contiguous
                     else problem.rows(rows))
            parts.append({"indptr": block.indptr.astype(problem.indptr.dtype),
                          "indices": block.indices, "data": block.data, "rows": rows,
                          "owned": owned, "x": x[owned], "ncols": problem.ncols,
                          "nrows": problem.nrows})
        self.x_global = x
        return parts, {}

    def run_once(self):
        """``iterations`` products on resident data; y stays where it was computed."""
        engine, timer = self.engine, self.ctx.timer
        if self.replay is not None:
            with timer.phase("kernel", stream=engine.stream):
                self.replay.launch()
        else:
            with timer.phase("start", stream=engine.stream):
                engine.start()
            for index in range(self.params["iterations"]):
                self._step(index)
        if engine.stream is not None:  # the repeat ends when the device is done
            self.ctx.transport.wait(engine.stream, "SpMV products")

    def _step(self, index):
        """Product ``index`` of a repetition: y = A x, the exchange of the ghost entries of x
        (communication stream) overlapping the local block's product (compute stream), then
        y += A_ghost x_ghost. In a chain, x holds the previous y unnormalised: after the first
        product the all-reduce of its squared norm joins the exchange (one NCCL group on a
        device transport), and ``next_x`` divides y by that norm into the next x and sums
        the new squares (the last product's y ends in x, the result)."""
        engine, timer = self.engine, self.ctx.timer
        chained, scaled = self.local.chained, index > 0
        engine.begin_exchange()
        with timer.phase("halo", stream=engine.comm_stream):
            with self.ctx.transport.group():
                if chained and scaled:
                    self.norm_sum(engine.norm2, stream=engine.comm_stream)
                self.halo(engine.x, engine.x_ghost, stream=engine.comm_stream,
                          send_buffer=engine.pack(), packed=True)
        with timer.phase("kernel", stream=engine.stream):
            engine.multiply_local()
        engine.end_exchange()
        with timer.phase("kernel", stream=engine.stream):
            engine.add_ghost()
        if chained:
            with timer.phase("normalize", stream=engine.stream):
                engine.next_x(scaled)

    def collect(self):
        """y to rank 0 in global row order (once, after the timed repeats) — unless the ranks
        write their own parts (``output.collect: parts``) and nothing on rank 0 needs all of y
        (verification off)."""
        config = self.ctx.config
        if config["output.collect"] == "parts" and not config["verify.enabled"]:
            return
        self.y_full = self.gather_y(self._local_y())

    def local_result_arrays(self):
        """This rank's rows of y (``output.collect: parts``) and their global row numbers."""
        return {"y": (self._local_y(), np.asarray(self.gather_y.rows, dtype=np.int64))}

    def _local_y(self):
        """This rank's rows of y, in the order of its rows (undoing ``reorder``)."""
        return restore_rows(self.engine.result(), self.row_order)

    def teardown(self):
        if self.replay is not None:
            self.replay.free()
            self.replay = None
        self.engine.free()

    def result(self):
        return self.y_full

    def result_arrays(self, result):
        return {"y": result}

    def reference(self, problem):
        square = problem.nrows == problem.ncols
        return chained_products(problem.to_scipy(), self.x_global,
                                self.params["iterations"] if square else 1)

    def work(self, problem):
        # dtype attributes that a RowProblem knows without loading the whole matrix
        value = np.dtype(getattr(problem, "value_dtype", None) or problem.data.dtype).itemsize
        index = np.dtype(getattr(problem, "index_dtype", None) or problem.indices.dtype).itemsize
        m, n, nnz = problem.nrows, problem.ncols, problem.nnz
        per_product = nnz * (value + index) + (m + 1) * index + m * value + n * value
        k = self.params["iterations"]
        return {"flops": 2.0 * nnz * k, "bytes": float(per_product) * k}

    def run_peer(self, name, problem, repeats):
        if name not in PEERS:
            raise HisparseError(f"unknown peer {name}")
        return PEERS[name](problem, self.x_global, repeats, self.params["iterations"])

    def summary(self):
        """``uniform_values``: every stored value of every rank's local and ghost blocks was one
        value (the GPU engines then kept it once; the CPU engines multiply by the array either
        way). CSR5:
        sigma, tiles and the conversion cost in SpMV-equivalents (conversion time of the slowest
        rank over rank 0's median time of one product)."""
        uniform = {"uniform_values": self.local.uniform is not None}
        if self.params["format"] != "csr5":
            return uniform
        config = self.ctx.config
        wall, gpu = self.ctx.timer.arrays(config["run.repeats"])
        column = list(self.phases()).index("kernel")
        seconds = event_else_wall(wall[:, column], gpu[:, column])
        per_product = float(np.nanmedian(seconds)) / self.params["iterations"]
        return {**uniform, "csr5_sigma": int(self.engine.sigma),
                "csr5_tiles_rank0": int(self.engine.tiles),
                "csr5_convert_seconds": float(self.convert_seconds_max),
                "csr5_spmv_seconds": per_product,
                "csr5_convert_spmv_equivalents": float(self.convert_seconds_max / per_product)
                if per_product > 0 else float("nan")}

    def rank_info(self):
        local, halo = self.local, self.halo
        itemsize = local.x.dtype.itemsize
        info = {"n_rows": int(local.matrix.nrows), "nnz": int(self.rows_nnz),
                "local_nnz": int(local.matrix.nnz), "ghost_nnz": int(local.ghost.nnz),
                "owned_x": int(len(local.x)), "ghosts": int(halo.n_ghosts),
                "ghost_rows": int(local.ghost.nrows), "halo_sends": int(halo.n_send),
                "halo_bytes_per_product": int(halo.bytes_per_call * itemsize),
                "graph_nodes": int(self.replay.nodes) if self.replay is not None else 0}
        if self.params["format"] == "csr5":
            info.update(csr5_sigma=int(self.engine.sigma), csr5_tiles=int(self.engine.tiles),
                        csr5_convert_seconds=float(self.convert_seconds))
            steps = getattr(getattr(self.engine, "device", None), "convert_steps", {})
            info.update({f"csr5_convert_{k}_seconds": float(v) for k, v in steps.items()})
        return info
