"""SpMV, y = A x, as a distributed operator (PETSc's MPIAIJ MatMult), in CSR or CSR5 format.

Plan: rank 0 partitions A's rows (nnz-balanced blocks by default, or row-modulo) and x (square A:
the same entries as the rank's rows; rectangular A: an even contiguous split of x) and scatters
them. Each rank splits its rows into the local block (the columns whose x entries it owns) and a
compressed ghost block (the others), and plans once, from that column pattern, the halo exchange
of the ghost entries of x (:class:`~hisparse.parallel.HaloExchange`, on the run's transport:
NCCL between GPUs, else MPI). Both blocks stay resident (CSR5: the local block is converted on
the GPU once, phase ``convert``).

Each product exchanges the x entries a rank needs (``exchange``: only its ghost entries, point to
point and device-packed, or an all-gather of x, chosen by the volume each moves; on a
communication stream) while the local block multiplies on the compute stream, then adds the
ghost block (CSR-vector or CSR5, ``ghost_format``); ``blocks: merged`` multiplies one block over
the owned and received entries after the exchange instead. For square A
the ``iterations`` products of a repetition chain like a solver's, x <- A x / ||A x||, with the
normalisation folded into the next product: y_{k+1} = (A y_k) / ||y_k||, so the all-reduce of
||y_k||^2 travels with that product's ghost exchange (one NCCL group) instead of standing between
two products, and one kernel scales and sums squares (no host round trip per product);
rectangular A repeats y = A x on the same x. y stays where it was computed; :meth:`SpMV.collect` gathers it to rank 0 once after
the timed repeats. The engines (``cpu.py``, ``gpu.py``) see only :class:`SpmvLocal`; every
collective is planned in ``plan.py`` (:class:`~.plan.SpmvPlan`: the blocks, the exchange, the
formats) and run here. Design notes: docs/ops/spmv.md.
"""
import time

import numpy as np

from ... import generators
from ...config import Setting, positive
from ...errors import HisparseError
from ...formats import CSRMatrix, load_renumber_loops, sigma_check
from ...gpu import ReplayPlan
from ...parallel import AllReduce, RowGather, all_call, max_over_ranks
from ...layout import PartProblem, RowLayout, sampled_reach
from ...partition import partition_rows
from ...threads import in_background
from ...timing import StepClock, event_else_wall
from .. import Operation, make_vector, vector_spec_check
from ...distmatrix import CROSSING_SHARE, restore_rows, start_loading_split_loops, x_owners
from .plan import SpmvPlan, plans_on_device
from .peers import PEERS


#: exchanges timed on their own at setup (after two untimed ones) for ``/perf``'s
#: ``halo_seconds`` and ``halo_gbps``
EXCHANGE_PROBE_ROUNDS = 10


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

    GATHERS_RESULT = True
    WRITES_PARTS = True
    #: what the set-up's plan decided (:class:`SpmvPlan`): the exchange of x and its rounds,
    #: the checkerboard's grid and fold, the blocks' figures, the renumbering's row order and
    #: the GPU's plan passes
    plan = None
    #: rank 0's whole x, and what makes it when it is made only when asked for (``x_global``)
    _x_global = _x_made = None
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
        "sigma": Setting(int, None, "CSR5 tile height (entries per lane, 1..32); null = the "
                                    "row length at least half the rows share, where one in "
                                    "[16, 32] does (a stencil's), else the mean row length "
                                    "clamped to [16, 32].", nullable=True,
                         check=sigma_check),
        "reorder": Setting(str, "none", "Renumber each rank's local block once at setup: degree "
                                        "= long rows and much-used x entries first (faster "
                                        "gathers of x on power-law matrices); y is returned in "
                                        "the original order.", choices=("none", "degree")),
        "ghost_format": Setting(str, None, "Kernel of the ghost block (the entries whose x "
                                           "entries other ranks own); null = CSR5 where format "
                                           "is csr5 and some rank's ghost block has a row of "
                                           "more than 256 entries (a power-law graph's hubs), "
                                           "else CSR-vector.",
                                nullable=True, choices=("csr", "csr5")),
        "blocks": Setting(str, "split", "split: the local block multiplies while the exchange "
                                        "runs, then the ghost block adds its rows; merged: one "
                                        "block over the owned and received x entries, "
                                        "multiplied once after the exchange.",
                          choices=("split", "merged")),
        "ghost_rounds": Setting(str, "never", "The exchange in rounds, each rank's ghost "
                                              "part multiplied as its round arrives (GPU over "
                                              "NCCL); auto: from 3 ranks, ghost >= local.",
                                choices=("auto", "always", "never")),
        "exchange": Setting(str, "auto", "How the ranks get the x entries they need: "
                                         "point_to_point (only those), all_gather (all of x), "
                                         "or auto (by the volume each moves).",
                            choices=("auto", "point_to_point", "all_gather")),
        "uniform_values": Setting(bool, True, "When every stored value (every rank's local and "
                                              "ghost blocks) is the same (a graph's adjacency "
                                              "matrix), the GPU "
                                              "keeps that value once and its products read "
                                              "only column indices (8 bytes per nonzero fewer "
                                              "in fp64); false keeps the values array."),
    }
    PARTITIONS = ("nnz_balanced", "row_modulo", "row_blocks", "checkerboard")
    PEERS = tuple(PEERS)
    # Its exchanges are small (a halo of a few hundred KB, an 8-byte all-reduce): with 4 NCCL
    # channels instead of 16 the connections NCCL makes at their first use (in the graph
    # capture) took 0.35 s instead of 1.24 s, for 11.47-11.49 against 11.39 ms per 50 products
    # (2x H200, 27-pt 160^3; docs/scaling/README.md, "NCCL's set-up").
    NCCL_CHANNELS = 4
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "plan": "setup",
                    "upload": "transfer", "convert": "setup", "probe": "communication",
                    "graph": "setup"}
    #: ``start``: x back to its initial value (device copy); ``halo``: pack and exchange the
    #: ghost entries of x, with the all-reduce of the chain's squared norm; ``kernel``: local and
    #: ghost block products; ``normalize``: the chain's step x = y / ||previous x|| and this
    #: rank's sum of squares (one kernel). When the repetition replays CUDA graphs
    #: (``gpu.graphs``, setup phase ``graph`` records them), all of it is one replay, timed as
    #: ``kernel``.
    REPEAT_PHASES = {"start": "transfer", "halo": "communication", "kernel": "compute",
                     "normalize": "compute"}
    COMPUTE_PHASES = ("kernel",)
    #: NCCL's connection goes on under the plan and upload (SpMV 160^3 at 2 ranks: a 0.2 s
    #: read left 0.5 s of it to wait for)
    CONNECTS_IN_SETUP = True
    #: NCCL's pair connections made under the read and plan (``parallel.connect_early: auto``,
    #: on one node): the exchange probe and the graph's capture no longer make them (2xH200,
    #: second runs: R-MAT 23 probe 0.19-0.20 -> 0 s, graph 0.15 -> 0.01, time to solution 4.54
    #: -> 4.02-4.44 s; 27-point 160^3 1.91 -> 1.62-1.77 s; docs/ops/spmv.md, "Stop 58")
    CONNECT_EARLY = True
    #: the thread loading the block split's compiled passes (:meth:`before_read`)
    split_loader = None

    @classmethod
    def estimate_memory(cls, config, header, nranks):
        """The default (the rank's rows, y) and the whole x every rank holds."""
        estimate = super().estimate_memory(config, header, nranks)
        return estimate.add(header.key, header.shape[1] * header.value_bytes)

    @classmethod
    def modules_for_setup(cls, config, nranks):
        """CuPy with ``reorder: degree``: large blocks are renumbered on the GPU
        (:meth:`SpmvPlan._device_rows`), and an R-MAT input is made there."""
        return ("cupy",) if config["operation.params"]["reorder"] == "degree" else ()

    def layout(self):
        """Every rank reads or generates only its own rows (issue 13); x is made on every rank.
        A graph made on the GPU keeps its unit values as one value repeated (no memory: R-MAT
        23's ones are 1 GB at one GPU): the split moves its columns alone, and
        the GPU engines of a uniform matrix never read the values; the plan makes them an array
        where it needs one (``plan.py``'s ``_with_values``: the checkerboard's moves, values
        kept)."""
        return RowLayout(self.row_strategy, repeated_values=True)

    def before_read(self):
        """At several ranks, the block split's compiled passes loaded on a thread while the
        input is read -- unless it is generated by a band (a stencil), whose row blocks reach
        outside their range of x only in the rows next to a neighbour's: their split looks at
        those rows alone (:func:`~hisparse.distmatrix.split_rows`) and loads no compiled code,
        and the thread's import of Numba only slowed the read (27-pt 160^3 at 2 ranks on the
        GPU host: read 0.19-0.21 s without it, 0.35-0.74 s with it). The split waits for the
        thread only where it takes the compiled passes (``split_rows``' ``loading``). A file is
        looked at first (:func:`~hisparse.layout.sampled_reach`: a few rows' columns): where
        its rows seem to stay near the rank's range of x (a mesh's, whose split takes the
        few-ghost way), no thread either (27-pt 100^3 file at 2 ranks on the development host:
        read 0.92-1.32 s with the thread, 0.42-0.43 s without). With ``reorder: degree`` (and
        no band), at any rank count, the renumbering's compiled pass is loaded on a thread as
        well (:func:`~hisparse.formats.load_renumber_loops`); the plan's call waits for it --
        unless the GPU will renumber this rank's block (:func:`~.plan.plans_on_device`): the
        thread's import of Numba and its loads from the cache (1.1 s on the 2xH200 host) held
        the interpreter while the read's copies needed it, and R-MAT 23's read at one GPU took
        0.95-1.04 s beside it against 0.41-0.56 s alone (``read_loader_probe.py``, stop 59)."""
        ctx = self.ctx
        spec = ctx.config["input"]["generate"]
        band = spec is not None and generators.makes_band(generators.validate_spec(dict(spec)))
        renumber_loads = self.params["reorder"] == "degree" and not band
        split_loads = False
        if ctx.size > 1:
            if spec is not None:
                near = band
            else:  # contiguous row blocks only: row-modulo owns no range of x
                reach = sampled_reach(ctx.config, ctx.rank, ctx.size) \
                    if self.row_strategy != "row_modulo" else None
                near = reach is not None and reach <= CROSSING_SHARE
            split_loads = not near
        if not (renumber_loads or split_loads) or plans_on_device(ctx):
            return  # nothing compiled to load, or the GPU splits and renumbers the block
        if renumber_loads:
            # The degree renumbering's compiled pass as well (at one rank nothing else loads
            # Numba before the plan: :func:`~hisparse.formats.load_renumber_loops`).
            in_background([lambda: load_renumber_loops(ctx.value_dtype)],
                          "hisparse-load-renumber")
        if split_loads:
            self.split_loader = start_loading_split_loops(ctx.value_dtype)

    def setup(self, problem):
        ctx = self.ctx
        part, _ = self.distribute(problem)
        # Every rank sizes arrays by the global x here (an x too large for this machine fails
        # on every rank alike): all_call turns that into one collective error line.
        with ctx.timer.phase("plan"):
            self.plan_steps = StepClock()
            plan = SpmvPlan(ctx, self.params, self.strategy, self.plan_steps, self.split_loader)
            if "owned" not in part:  # read by rows: this rank's share of x, made here
                part.update(all_call(ctx.comm, plan.own_x, part, problem))
                self._x_made, self.x_global = plan.x_made, plan.x_global  # rank 0's
            self.plan_steps.mark("own_x")
            rows = CSRMatrix(part["indptr"], part["indices"], part["data"],
                             (len(part["indptr"]) - 1, part["ncols"]))
            # Read by parts, the part's arrays were handed over (RowProblem.take_part): the
            # split may make the local block in them. Scattered from rank 0's whole matrix,
            # rank 0's part may be a view of the matrix verification reads.
            reuse = isinstance(problem, PartProblem)
            self.local = all_call(ctx.comm, plan.make, rows, part, reuse)
            self.plan = plan
            self.strategy = plan.strategy  # checkerboard where auto took the grid
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
        self.connected()  # the first collective on device buffers is the probe's
        with ctx.timer.phase("probe"):
            self.exchange_seconds = self._probe_exchange()
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

    @property
    def row_strategy(self):
        """The row split every rank reads by: the checkerboard places the entries of
        ``nnz_balanced`` row blocks on its grid."""
        return "nnz_balanced" if self.strategy == "checkerboard" else self.strategy

    @property
    def x_global(self):
        """The whole initial x on rank 0 (the reference's and the peers' x): made when first
        asked for where the plan made only each rank's share (:meth:`SpmvPlan.own_x`)."""
        if self._x_global is None and self._x_made is not None:
            self._x_global = make_vector(*self._x_made)
        return self._x_global

    @x_global.setter
    def x_global(self, x):
        self._x_global = x

    def partition(self, problem):
        ctx = self.ctx
        x = make_vector(self.params["x"], problem.ncols, problem.data.dtype,
                        ctx.config["run.seed"])
        plan = partition_rows(problem.indptr, ctx.size, self.row_strategy)
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
        y += A_ghost x_ghost; under the checkerboard the fold then brings the other ranks'
        partial sums of this rank's rows (:meth:`_fold`). In a chain, x holds the previous y
        unnormalised: after the first product the all-reduce of its squared norm joins the
        exchange (one NCCL group on a device transport), and ``next_x`` divides y by that norm
        into the next x and sums the new squares (the last product's y ends in x, the
        result)."""
        engine, timer = self.engine, self.ctx.timer
        chained, scaled = self.local.chained, index > 0
        engine.begin_exchange()
        if self.plan.rounds:
            self._step_in_rounds(chained and scaled)
        else:
            with timer.phase("halo", stream=engine.comm_stream):
                with self.ctx.transport.group():
                    if chained and scaled:
                        self.norm_sum(engine.norm2, stream=engine.comm_stream)
                    self._exchange()
            with timer.phase("kernel", stream=engine.stream):
                engine.multiply_local()
            engine.end_exchange()
            with timer.phase("kernel", stream=engine.stream):
                engine.add_ghost()
        if self.plan.fold_halo is not None:
            self._fold()
        if chained:
            with timer.phase("normalize", stream=engine.stream):
                engine.next_x(scaled)

    def _fold(self):
        """The checkerboard's fold, once the product is done: the foreign rows' partial sums
        to their owners (communication stream, phase ``halo``), then each rank adds those it
        received into its rows (compute stream)."""
        engine, timer = self.engine, self.ctx.timer
        engine.begin_exchange()
        with timer.phase("halo", stream=engine.comm_stream):
            self._fold_exchange()
        engine.end_exchange()
        with timer.phase("kernel", stream=engine.stream):
            engine.add_fold()

    def _fold_exchange(self):
        """Launch the fold's exchange on the communication stream."""
        engine = self.engine
        self.plan.fold_halo.reverse(engine.fold_values(), engine.fold_buffer,
                                    stream=engine.comm_stream)

    def _step_in_rounds(self, with_norm):
        """The exchange in rounds (``ghost_rounds``): round k sends to rank + k and receives
        from rank - k (communication stream), the local block multiplies meanwhile, and the
        ghost part of the rank received in round k as soon as that round is in, while round
        k + 1 moves. ``with_norm``: the chain's all-reduce joins the first round's group."""
        engine, timer, comm_stream = self.engine, self.ctx.timer, self.engine.comm_stream
        plan = self.plan
        with timer.phase("halo", stream=comm_stream):
            send_buffer = engine.pack()
            for index, (to, source) in enumerate(plan.rounds):
                with self.ctx.transport.group():
                    if with_norm and index == 0:
                        self.norm_sum(engine.norm2, stream=comm_stream)
                    plan.halo.pair(send_buffer, engine.x_ghost, to, source, stream=comm_stream)
                engine.part_done(source)
        with timer.phase("kernel", stream=engine.stream):
            engine.multiply_local()
            for _, source in plan.rounds:
                engine.add_ghost_part(source)

    def _exchange(self):
        """Launch this product's exchange of x on the communication stream: pack and send the
        entries the peers need (point to point) or all-gather x in place (nothing at one rank)."""
        engine, plan = self.engine, self.plan
        if plan.halo is not None:
            plan.halo(engine.x, engine.x_ghost, stream=engine.comm_stream,
                      send_buffer=engine.pack(), packed=True)
        elif plan.gather_x is not None:
            plan.gather_x(engine.x_all, stream=engine.comm_stream)

    def exchange_counts(self):
        """``(entries sent, entries received)`` by this rank per product: x's exchange, and
        the checkerboard's fold."""
        sends = receives = 0
        halo = self.plan.halo
        if halo is not None:
            sends, receives = halo.n_send, halo.n_ghosts
        elif self.plan.gather_x is not None:
            mine = len(self.local.x)
            sends, receives = mine * (self.ctx.size - 1), self.local.x_length - mine
        fold_sends, fold_receives = self._fold_counts()
        return sends + fold_sends, receives + fold_receives

    def _fold_counts(self):
        """``(partial sums sent, received)`` by this rank's fold per product (0 off the grid)."""
        fold = self.plan.fold_halo
        return (fold.n_ghosts, fold.n_send) if fold is not None else (0, 0)

    def _exchanges(self):
        """A product's exchanges without the product: x's, then the fold's (what the fold
        sends and receives here is overwritten by every product before it is read)."""
        self._exchange()
        if self.plan.fold_halo is not None:
            self._fold_exchange()

    def _probe_exchange(self, rounds=EXCHANGE_PROBE_ROUNDS):
        """Seconds of one product's exchanges (x's; the checkerboard's fold) on their own (no
        product beside them): ``rounds`` of them
        after two untimed ones (the first makes NCCL's connections), timed by CUDA events on the
        communication stream when the transport moves device arrays, else by the host clock;
        0 at one rank. x is reset at the start of every repetition, so the exchanges here
        change nothing a product reads."""
        ctx, engine = self.ctx, self.engine
        plan = self.plan
        if plan.halo is None and plan.gather_x is None and plan.fold_halo is None:
            return 0.0
        stream = engine.comm_stream
        events = stream is not None and bool(ctx.transport.device)
        for _ in range(2):
            self._exchanges()
        if stream is not None:
            ctx.transport.wait(stream, "SpMV exchange probe")
        ctx.comm.Barrier()
        if events:
            import pycuda.driver as cuda
            begin, end = cuda.Event(), cuda.Event()
            begin.record(stream)
        start = time.perf_counter()
        for _ in range(rounds):
            self._exchanges()
        if stream is not None:
            if events:
                end.record(stream)
            ctx.transport.wait(stream, "SpMV exchange probe")
        if events:
            return end.time_since(begin) / 1e3 / rounds
        return (time.perf_counter() - start) / rounds

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
        return restore_rows(self.engine.result(), self.plan.row_order)

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
        way). ``halo_exchange``: how x was exchanged (``none`` at one rank, ``point_to_point``
        or ``all_gather``) and the entries each way would move per product over all ranks
        (``halo_entries_*``: what ``exchange: auto`` chose by); ``spmv_blocks`` and
        ``ghost_format``: the blocks and the ghost block's kernel; ``ghost_rounds``: rounds of
        the exchange, each rank's ghost part multiplied as its round arrives (0: one exchange,
        then the whole ghost block); ``checkerboard_grid``: the grid (``2x2``) when the entries
        were placed on one (``none``: row blocks), and where ``partition.strategy: auto``
        weighed the two, ``partition_entries_row_blocks`` and ``partition_entries_checkerboard``,
        the entries each would move per product, all ranks. CSR5:
        sigma, tiles and the conversion cost in SpMV-equivalents (conversion time of the slowest
        rank over rank 0's median time of one product)."""
        plan = self.plan
        uniform = {"uniform_values": self.local.uniform is not None,
                   "halo_exchange": plan.exchange_mode,
                   "halo_entries_point_to_point": plan.exchange_volumes["point_to_point"],
                   "halo_entries_all_gather": plan.exchange_volumes["all_gather"],
                   "spmv_blocks": "merged" if self.local.merged else "split",
                   "ghost_format": ("none" if self.local.merged
                                    else "csr5" if self.local.ghost_sigma else "csr"),
                   "ghost_rounds": len(plan.rounds),
                   "checkerboard_grid": plan.board.shape if plan.board is not None else "none",
                   **{f"partition_entries_{name}": count
                      for name, count in plan.layout_volumes.items()}}
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
        """Per rank: the blocks' sizes (``local_nnz`` and ``ghost_nnz`` as split, also when
        merged), the exchange's entries and bytes per product, and its time and achieved GB/s
        on its own (``halo_seconds``, ``halo_gbps``: sent + received bytes over that time), and
        the replayed graph's nodes and its kernels raised above the local product
        (``graph_nodes``, ``graph_raised_nodes``; 0 without graphs). Under the checkerboard
        ``nnz`` counts the entries the rank holds on the grid, ``foreign_rows`` the rows of other
        ranks it sends partial sums of per product (the fold) and ``fold_receives`` the partial
        sums it receives; ``halo_sends`` and ``ghosts`` count x's entries (the expand), the
        bytes and seconds both steps."""
        local, plan = self.local, self.plan
        itemsize = local.x.dtype.itemsize
        sends, receives = self.exchange_counts()
        moved = (sends + receives) * itemsize
        seconds = float(self.exchange_seconds)
        fold_sends, fold_receives = self._fold_counts()
        info = {"n_rows": int(local.n_rows), "nnz": int(plan.rows_nnz),
                "foreign_rows": int(local.foreign_rows), "fold_receives": int(fold_receives),
                "local_nnz": int(plan.split_nnz[0]), "ghost_nnz": int(plan.split_nnz[1]),
                "owned_x": int(len(local.x)), "ghosts": int(receives - fold_receives),
                "ghost_rows": int(plan.split_nnz[2]), "halo_sends": int(sends - fold_sends),
                "halo_bytes_per_product": int(moved),
                "halo_seconds": seconds,
                "halo_gbps": moved / seconds / 1e9 if seconds > 0 else 0.0,
                "graph_nodes": int(self.replay.nodes) if self.replay is not None else 0,
                "graph_raised_nodes": int(self.replay.raised) if self.replay is not None else 0}
        info.update({f"plan_{step}_seconds": seconds
                     for step, seconds in self.plan_steps.seconds.items()})
        if plan.device_rows is not None:  # the split's and the renumbering's steps on the GPU
            info.update({f"plan_device_{step}_seconds": seconds
                         for step, seconds in plan.device_rows.steps.seconds.items()})
        if self.params["format"] == "csr5":
            info.update(csr5_sigma=int(self.engine.sigma), csr5_tiles=int(self.engine.tiles),
                        csr5_convert_seconds=float(self.convert_seconds))
            steps = getattr(getattr(self.engine, "device", None), "convert_steps", {})
            info.update({f"csr5_convert_{k}_seconds": float(v) for k, v in steps.items()})
        return info
