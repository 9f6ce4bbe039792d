"""CP-ALS on the rank's GPU: the MTTKRP kernels of ``kernels_cu/mttkrp.cu`` and the dense steps of
``kernels_cu/cpals_dense.cu``. The unfolding blocks, every factor, the Grams and lambda stay
resident on the device, so one ALS iteration never waits for the host: the R x R solve,
normalisation and fit run there too, and the host reads one number (the fit) per iteration.

Setup: the engine gets this rank's nonzeros of each mode's block of rows
(:class:`~.layout.ModeCOO`: host arrays, uploaded, or device arrays of a tensor generated on the
GPU, used where they are) and sorts them into the block's CSR on the device
(:mod:`.device_sort`), or gets blocks built on the host (:class:`~.layout.ModeCSR`, uploaded as
they are).

One mode update is three launches: the MTTKRP, ``solve_rows`` (this rank's rows of U_n = M V^-1
and their column products U^T U, <U, M>, max |U|), and, after the operation has reduced those
over the ranks and all-gathered the rows, ``normalize_factor`` (lambda, U_n scaled, G_n, and
after the last mode the fit); the next mode's V^-1 (``gram_inverse``) runs on a side stream,
beside the next MTTKRP, and the next solve waits for it.

The operation takes the normalisation off the chain of every mode (the last one of an
iteration too, except for the run's last iteration and one a checkpoint follows: the next
iteration's first MTTKRP reads it; :meth:`MttkrpGpuEngine.defer_normalize`, with the fit, and
:meth:`MttkrpGpuEngine.join_side_streams` at the iteration's end): the exchange runs on a stream
of its own
(:meth:`~MttkrpGpuEngine.fork_exchange`), the next MTTKRP reads the solved factor unnormalised
(U' = U diag(lambda): its rows come out M' = M diag(lambda)), and the side stream makes lambda,
the Gram and the next solve's W = diag(1/lambda) V^-1 in one launch (``deferred_normalize``)
once the exchange is in, then scales the factor (``scale_columns``) once that MTTKRP has read it.
The 'fast' engine also cuts each mode's nonzeros by the owner of their row of the previous
mode's factor (mode 0's: the last mode's): those of this rank's own rows run before the
exchange is in (:meth:`~MttkrpGpuEngine.mttkrp_before_exchange`, on a stream of its own into
rows of its own), the rest after it (:meth:`~MttkrpGpuEngine.mttkrp_after_exchange`), so the
exchange is hidden behind the first part and the second starts beside the first one's last
waves. The operation's exchange runs either in place on the device (the products' views and
:meth:`MttkrpGpuEngine.device_factor`, one NCCL group on the engine's stream) or, on an MPI
transport, through host memory (the products staged, and
:meth:`MttkrpGpuEngine.factor_buffer` downloads this rank's rows into the pinned full host
factor that the MPI all-gather fills, :meth:`MttkrpGpuEngine.factor_gathered` uploads it
again). One engine per MTTKRP kernel (``operation.params.mttkrp``): ``seed`` (one block per
unfolding row) and ``fast`` (nonzero-parallel teams).
"""
import numpy as np

from ...errors import HisparseError
from ...gpu import KernelTable, grid_1d, index_scalar, type_defines
from .. import GpuEngine
from .device_sort import DeviceSorter, coordinate_pointers, nonzeros_on_device, sorting_cupy
from .layout import ModeCSR
from .products import FIT_SLOTS, product_width, reduction_parts, split_products

MTTKRP_KERNELS = KernelTable("mttkrp", ["mttkrp_row_block", "mttkrp_nnz_team", "unfolding_keys",
                                        "unfolding_gather", "unfolding_indptr",
                                        "unfolding_indptr_parts"])
DENSE_KERNELS = KernelTable("cpals_dense", ["gram_inverse", "solve_rows", "normalize_factor",
                                            "deferred_normalize", "scale_columns"])

#: Most nonzeros per team of the 'fast' kernel.
MAX_CHUNK = 256
#: What a team pays before its first nonzero (the binary search for its first row, ~14 dependent
#: loads), in nonzeros' worth of time: an estimate, used only to choose the chunk.
TEAM_OVERHEAD = 32
#: Threads per block of the element-wise kernels and of normalize_factor (at least).
BLOCK = 256
#: Threads per block of solve_rows.
SOLVE_THREADS = 512
#: solve_rows: fewest rows per block, most blocks, and most partial sums (blocks x width) that
#: its last block adds up (a few warps take the blocks' partials in turn: they bound its tail).
#: A block's rows are a few multiply-adds a thread, its partials a chain of the last block's:
#: at rank 16, blocks of at least 128 rows took 10.4-16.6 us on the 20M benchmark's modes at
#: 1, 2 and 4 ranks' rows where 32 took 10.9-16.6 (-2.1 us at 6046 rows, -2.7 at 4592, -1.9 at
#: 7205; docs/scaling/stop63_h200/solve_blocks_probe.py, d118; 160 rows lost at 3023).
MIN_SOLVE_ROWS = 128
MAX_SOLVE_BLOCKS = 256
PARTIAL_BUDGET = 32768
#: Most blocks that scale a factor's rows in normalize_factor (they stride over the rows).
MAX_SCALE_BLOCKS = 1024


def solve_shared_limit(rank):
    """Dynamic shared memory the inversion of V (``gram_inverse``) may use (bytes): the default
    48 KiB per block, less room for static shared memory (8 R bytes, a 32-double scratch, the
    pivot: what the inversion had beside it when it ran inside normalize_factor) to spare."""
    return 48 * 1024 - 8 * int(rank) - 512


def solve_grid(n_rows, rank):
    """``(blocks, rows per block)`` of solve_rows on ``n_rows`` rows: blocks of at least
    :data:`MIN_SOLVE_ROWS` rows, at most :data:`MAX_SOLVE_BLOCKS` of them and at most
    :data:`PARTIAL_BUDGET` partial sums to add; one block (of no rows) when ``n_rows`` is 0."""
    most = max(1, min(MAX_SOLVE_BLOCKS, PARTIAL_BUDGET // product_width(rank)))
    blocks = max(1, min(most, -(-int(n_rows) // MIN_SOLVE_ROWS)))
    rows_per_block = max(1, -(-int(n_rows) // blocks))
    return max(1, -(-int(n_rows) // rows_per_block)), rows_per_block


def next_power_of_two(value):
    return 1 << max(0, int(value - 1).bit_length())


def team_size(rank):
    """Lanes per nonzero team of the faster kernel: R rounded up to a power of two, <= 32."""
    return min(32, next_power_of_two(rank))


def team_chunk(nnz, team, requested=None, resident=None):
    """Nonzeros per team of the 'fast' kernel (a multiple of ``team``, at most :data:`MAX_CHUNK`).

    Every team does the same work, so the teams run in waves of ``resident`` (how many the GPU
    holds at once) and the kernel takes about (waves) x (chunk + :data:`TEAM_OVERHEAD`). With a
    fixed chunk a rank's share of the nonzeros can end on a part-filled wave, which cost the
    MTTKRP's scaling over ranks (docs/ops/cpals.md, "Measurements behind the code"); the chunk
    that minimises that estimate fills the last wave instead.
    Without ``resident`` (occupancy unknown): enough teams to fill an H100 (about 132 SMs x 64
    teams), at most 256 nonzeros each.
    """
    if requested:
        return max(team, (int(requested) // team) * team)
    nnz = int(nnz)
    if resident:
        def estimate(chunk):
            waves = -(-(-(-nnz // chunk)) // int(resident))
            return waves * (chunk + TEAM_OVERHEAD), -chunk  # ties: fewer, longer teams
        return min(range(team, max(team, MAX_CHUNK) + 1, team), key=estimate)
    target = nnz // (132 * 64)
    return int(min(MAX_CHUNK, max(team, (target // team) * team)))


def resident_teams(function, block, team):
    """Teams of ``team`` lanes that the current GPU runs at once for a kernel launched with
    ``block`` threads per block: SMs x blocks per SM (bounded by threads and by registers,
    allocated per warp in units of 256), or None if the driver does not say."""
    import pycuda.driver as cuda
    try:
        device = cuda.Context.get_device()
        attribute = cuda.device_attribute
        sms = device.get_attribute(attribute.MULTIPROCESSOR_COUNT)
        threads = device.get_attribute(attribute.MAX_THREADS_PER_MULTIPROCESSOR)
        registers = device.get_attribute(attribute.MAX_REGISTERS_PER_MULTIPROCESSOR)
        per_thread = function.get_attribute(cuda.function_attribute.NUM_REGS)
    except (AttributeError, cuda.Error):
        return None
    warps = block // 32
    per_warp = -(-max(1, per_thread) * 32 // 256) * 256
    blocks = min(threads // block, registers // (per_warp * warps))
    return max(1, blocks) * sms * (block // team) if sms else None


class MttkrpGpuEngine(GpuEngine):
    """The steps of one mode update on the GPU; subclasses launch their MTTKRP kernel.

    Parameters
    ----------
    ctx : EngineContext
    local : UnfoldingBlocks
        Blocks built already (:class:`~.layout.ModeCSR`: uploaded as they are) or this rank's
        nonzeros of each block (:class:`~.layout.ModeCOO`: sorted into the CSR on the device).
    params : dict
        ``operation.params`` (``rank`` and ``chunk`` are read).
    """

    #: The MTTKRP kernel this engine launches (recorded as ``mttkrp_kernel``).
    kernel_name = None
    #: The operation may defer every mode's normalisation past the next MTTKRP, with the
    #: exchange beside it (:meth:`fork_exchange`, :meth:`defer_normalize`).
    DEFERS_NORMALIZATION = True
    #: Whether the device sort parts each mode's nonzeros by the owner of their row of the
    #: previous mode (:meth:`_late_part`), so that the MTTKRP can start before the exchange.
    PARTS_BY_OWNER = False

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params, owner="cpals")
        self.cp_rank = int(params["rank"])
        self.requested_chunk = params["chunk"]
        self.shape = local.shape
        self.order = local.order
        #: Where the unfoldings were sorted: "device", or "host" (given built, or no CuPy).
        self.unfoldings_built_on = "host"

    def upload(self):
        """:meth:`upload_data`, then :meth:`build_unfoldings`."""
        self.upload_data()
        self.build_unfoldings()

    def upload_data(self):
        """Load the kernels, make the stream and the dense state, and upload this rank's data:
        built blocks as they are, or the nonzeros of the blocks to sort (once when every mode
        shares them, as on one rank)."""
        import pycuda.driver as cuda
        ctx, rank, arena = self.ctx, self.cp_rank, self.arena
        dtype = ctx.value_dtype
        self.dtype = dtype
        if rank > 1024:
            raise HisparseError(f"operation.params.rank {rank} > 1024 is not supported on the GPU")
        modes = self.local.modes
        index_dtype = np.dtype(modes[0].indptr.dtype if isinstance(modes[0], ModeCSR)
                               else modes[0].index_dtype)
        self.index_dtype = index_dtype
        self.team = team_size(rank)
        self.kernels = MTTKRP_KERNELS.load(ctx, type_defines(dtype, index_dtype, ORDER=self.order,
                                                             RANK=rank, TEAM=self.team))
        self.dense = DENSE_KERNELS.load(ctx, type_defines(dtype, index_dtype, ORDER=self.order,
                                                          RANK=rank, SOLVE_THREADS=SOLVE_THREADS))
        self.index = index_scalar(index_dtype)
        self.stream = cuda.Stream()
        self.d_indptr, self.d_values, self.d_other = [], [], []
        self.d_coo = []  # per mode: (coordinates, values) on the device until sorted
        shared = {}
        for block in modes:
            if isinstance(block, ModeCSR):
                self.d_indptr.append(arena.to_device(block.indptr, "row pointers"))
                self.d_values.append(arena.to_device(
                    np.ascontiguousarray(block.values, dtype=dtype), "values"))
                self.d_other.append(arena.to_device(
                    np.ascontiguousarray(block.other_idx, dtype=np.int32), "coordinates"))
                self.d_coo.append(None)
                continue
            key = (id(block.indices), id(block.values))
            if key not in shared:
                shared[key] = (nonzeros_on_device(arena, block.indices, np.int64,
                                                  "nonzero coordinates"),
                               nonzeros_on_device(arena, block.values, dtype, "nonzero values"))
            self.d_coo.append(shared[key])
            self.d_indptr.append(None)
            self.d_values.append(None)
            self.d_other.append(None)
        self.d_factors = [arena.zeros((int(size), rank), dtype, "factor") for size in self.shape]
        self.d_factor_ptrs = []
        for n in range(self.order):
            ptrs = np.array([int(self.d_factors[m].gpudata) for m in range(self.order) if m != n],
                            dtype=np.uint64)
            self.d_factor_ptrs.append(arena.to_device(ptrs, "factor pointers"))
        max_local = max(max(block.n_rows for block in modes), 1)
        # Zero: the 'fast' MTTKRP adds into it, and the solve zeroes the rows it has read.
        self.d_m = arena.zeros((max_local, rank), dtype, "MTTKRP rows")
        self.m_clean = True
        self._upload_dense_state()
        self.h_full = [cuda.pagelocked_empty((int(size), rank), dtype) for size in self.shape]

    def build_unfoldings(self):
        """Sort the uploaded nonzeros of every mode's block into its CSR on the device
        (:class:`~.device_sort.DeviceSorter`); without CuPy, on the host
        (:meth:`~.layout.ModeCOO.to_csr`). The nonzeros are let go after: their device copies
        released, and the blocks of ``local`` replaced by the device CSR blocks (a
        :class:`~.layout.ModeCSR` of device arrays), so that nonzeros made on the device return
        to CuPy's pool, released here too, and host ones are freed."""
        cupy = sorting_cupy() if any(coo is not None for coo in self.d_coo) else None
        sorter = None if cupy is None else DeviceSorter(
            cupy, self.kernels, self.arena, self.stream, self.shape, self.dtype,
            self.index_dtype, self.index)
        #: per mode: (early nonzeros, the early part's and the late part's row pointers) where
        #: the device sort parted the block (:meth:`_late_part`), else None
        self.part_indptrs = [None] * self.order
        for n, block in enumerate(self.local.modes):
            if self.d_coo[n] is None:
                continue
            if sorter is None:
                csr = block.to_csr()
                self.d_indptr[n] = self.arena.to_device(csr.indptr, "row pointers")
                self.d_values[n] = self.arena.to_device(
                    np.ascontiguousarray(csr.values, dtype=self.dtype), "values")
                self.d_other[n] = self.arena.to_device(
                    np.ascontiguousarray(csr.other_idx, dtype=np.int32), "coordinates")
            else:
                sorted_block = sorter.sort(block, *self.d_coo[n], late=self._late_part(n))
                self.d_indptr[n], self.d_values[n] = sorted_block.indptr, sorted_block.values
                self.d_other[n], self.part_indptrs[n] = sorted_block.other, sorted_block.parts
                self.unfoldings_built_on = "device"
            self.local.modes[n] = ModeCSR(n, block.n_rows, block.row_offset, self.d_indptr[n],
                                          self.d_values[n], self.d_other[n], block.other_modes)
        block = sorted_block = None  # nor may the loops keep the last block's nonzeros
        self.arena.release(*[array for coo in {id(c): c for c in self.d_coo if c is not None}
                             .values() for array in coo])
        self.d_coo = [None] * self.order
        self.d_other_ptrs = [coordinate_pointers(self.arena, self.d_other[n], csr.nnz)
                             for n, csr in enumerate(self.local.modes)]
        if cupy is not None:
            from ...gpu import release_pool
            release_pool()
        self.arena.release_cache()  # the sort's buffers back to the driver

    def _late_part(self, n):
        """Where mode n's nonzeros are parted (:class:`NnzTeamEngine`): ``(mode, lo, hi)``, the
        previous mode and this rank's rows of it [lo, hi), whose nonzeros come first; ``None``:
        not parted (an engine that runs whole blocks, or a rank holding every row of the
        previous mode). Mode 0's previous mode is the last: the next iteration's first MTTKRP
        runs beside the exchange of an iteration's last mode."""
        previous_mode = (n - 1) % self.order
        if not self.PARTS_BY_OWNER or self.holds_every_row(previous_mode):
            return None
        previous = self.local.modes[previous_mode]
        return previous_mode, previous.row_offset, previous.row_offset + previous.n_rows

    def holds_every_row(self, n):
        """Whether this rank's block of mode n is the whole mode (one rank)."""
        return self.local.modes[n].n_rows == self.shape[n]

    def local_unfolding(self, n):
        """This rank's block of the mode-n unfolding as the device holds it, on the host (a
        :class:`~.layout.ModeCSR`; tests compare it with the NumPy builder)."""
        self.stream.synchronize()
        block = self.local.modes[n]
        return ModeCSR(n, block.n_rows, block.row_offset, self.d_indptr[n].get(),
                       self.d_values[n].get(), self.d_other[n].get(), block.other_modes)

    def _upload_dense_state(self):
        """The buffers of the dense steps: Grams, lambda, V^-1, the solve's partials and the
        column products (one view for the sums, one for the maxima), the fit, and their pinned
        host copies."""
        import pycuda.driver as cuda
        rank, arena = self.cp_rank, self.arena
        self.d_grams = arena.zeros((self.order, rank, rank), np.float64, "Grams")
        self.d_lam = arena.zeros(rank, np.float64, "lambda")
        self.d_vinv = arena.zeros((rank, rank), self.dtype, "inverse of V")
        self.vinv_mode = None  # the mode whose V^-1 d_vinv holds
        # The next mode's V^-1 needs only the Grams, so normalize leaves it to a side stream
        # where it overlaps the next MTTKRP (which does not use it); the next solve waits for
        # it; in normalize_factor's one block it sat on the critical path.
        self.side_stream = cuda.Stream()
        no_timing = cuda.event_flags.DISABLE_TIMING
        self.normalized = cuda.Event(no_timing)
        self.inverted = cuda.Event(no_timing)
        self.inversion_pending = False
        # The exchange of a solved mode on a stream of its own, forked after the solve
        # (fork_exchange) and joined by the next MTTKRP's part that needs it and by the side
        # stream's deferred normalisation; the factor a deferred normalisation leaves
        # unnormalised is scaled on the side stream once the MTTKRP reading it is done
        # (read_done), and the next MTTKRP waits for that (scaled).
        self.exchange_stream = cuda.Stream()
        self.solved, self.exchanged = cuda.Event(no_timing), cuda.Event(no_timing)
        # The 'fast' MTTKRP's part before the exchange on a stream of its own, into its own
        # rows (d_m_early): the part after the exchange starts as soon as the exchange is in,
        # beside the first part's last waves, instead of after them (the solve adds the two).
        self.early_stream = cuda.Stream()
        self.early_forked, self.early_done = cuda.Event(no_timing), cuda.Event(no_timing)
        self.early_pending = False
        self.d_m_early = None
        self.read_done, self.scaled = cuda.Event(no_timing), cuda.Event(no_timing)
        self.d_lam_modes = arena.zeros((self.order, rank), np.float64, "lambda per mode")
        self._reset_deferral()
        # The inversion's R x R matrix and one column: in shared memory when they fit beside
        # gram_inverse's static shared memory.
        solve_bytes = (rank * rank + rank) * 8
        self.solve_shared = solve_bytes if solve_bytes <= solve_shared_limit(rank) else 0
        self.d_solve_work = None if self.solve_shared else \
            arena.empty(rank * rank + rank, np.float64, "solve matrix")
        self.solve_block = min(1024, max(32, -(-rank * rank // 32) * 32))
        self.normalize_block = max(BLOCK, self.solve_block)
        self.solve_grids = [solve_grid(block.n_rows, rank) for block in self.local.modes]
        width = product_width(rank)
        blocks = max(grid[0] for grid in self.solve_grids)
        self.d_partial = arena.zeros(blocks * width, np.float64, "partial products")
        self.d_total = arena.zeros(width, np.float64, "column products")
        # What the operation reduces over the ranks: sums (U^T U, <U, M>), then maxima.
        self.d_sums, self.d_maxima = reduction_parts(self.d_total, rank)
        self.d_blocks_done = arena.zeros(1, np.uint32, "block counter")
        # A ring of slots (fit, status of the solves), one per iteration of the operation's
        # window, read when the operation wants them.
        self.fit_slots = max(1, min(int(self.params.get("max_iters") or 1), FIT_SLOTS))
        self.d_fits = arena.zeros((self.fit_slots, 2), np.float64, "fits and status")
        self.d_status = arena.zeros(1, np.int32, "solve status")
        self.h_total = cuda.pagelocked_empty(width, np.float64)
        self.h_vinv = cuda.pagelocked_empty((rank, rank), self.dtype)
        self.h_lam = cuda.pagelocked_empty(rank, np.float64)
        self.h_grams = cuda.pagelocked_empty((self.order, rank, rank), np.float64)
        self.h_fits = cuda.pagelocked_empty((self.fit_slots, 2), np.float64)

    # -- state ---------------------------------------------------------------------------------
    def load(self, factors, grams=None, lam=None):
        """Start from ``factors`` (and their ``grams``, fp64, and ``lam``; by default U^T U and
        ones).

        Every repetition starts from the same state: the first load of a state uploads it once
        into device copies, and the later loads of the same objects copy device to device
        instead of copying and uploading every factor from the host again, a cost per repeat
        that does not shrink with the ranks."""
        import pycuda.driver as cuda
        self._join_deferred()  # the side stream may still write V^-1 or scale a factor
        # The staged objects are kept referenced, so "the same objects" cannot be fooled by a
        # new state that reuses a freed object's identity.
        staged = getattr(self, "_staged", None)
        if staged is None or not (staged[0] is factors and staged[1] is grams
                                  and staged[2] is lam):
            self._stage_start(factors, grams, lam)
            self._staged = (factors, grams, lam)
        for n in range(self.order):
            cuda.memcpy_dtod_async(self.d_factors[n].gpudata, self.d_start[n].gpudata,
                                   self.d_start[n].nbytes, self.stream)
        cuda.memcpy_dtod_async(self.d_grams.gpudata, self.d_start_grams.gpudata,
                               self.d_start_grams.nbytes, self.stream)
        cuda.memcpy_dtod_async(self.d_lam.gpudata, self.d_start_lam.gpudata,
                               self.d_start_lam.nbytes, self.stream)
        cuda.memset_d32_async(self.d_status.gpudata, 0, 1, self.stream)
        for rows in (self.d_m, self.d_m_early):
            if rows is not None:
                cuda.memset_d8_async(rows.gpudata, 0, rows.nbytes, self.stream)
        self.m_clean = True
        self.vinv_mode = None
        self._reset_deferral()
        self.stream.synchronize()

    def _stage_start(self, factors, grams, lam):
        """Upload a start state into the device copies that :meth:`load` restores from."""
        import pycuda.driver as cuda
        if grams is None:
            grams = [np.asarray(f, dtype=np.float64).T @ np.asarray(f, dtype=np.float64)
                     for f in factors]
        if getattr(self, "d_start", None) is None:
            self.d_start = [self.arena.empty(f.shape, f.dtype, "start factor")
                            for f in self.d_factors]
            self.d_start_grams = self.arena.empty(self.d_grams.shape, np.float64, "start Grams")
            self.d_start_lam = self.arena.empty(self.d_lam.shape, np.float64, "start lambda")
        for n, factor in enumerate(factors):
            self.h_full[n][:] = factor
            cuda.memcpy_htod_async(self.d_start[n].gpudata, self.h_full[n], self.stream)
            self.h_grams[n] = grams[n]
        self.h_lam[:] = 1.0 if lam is None else lam
        cuda.memcpy_htod_async(self.d_start_grams.gpudata, self.h_grams, self.stream)
        cuda.memcpy_htod_async(self.d_start_lam.gpudata, self.h_lam, self.stream)
        self.stream.synchronize()  # the pinned staging buffers are reused afterwards

    def state(self):
        """``(lam, grams)`` on the host (fp64): checkpoints and the final result."""
        import pycuda.driver as cuda
        self._join_deferred()
        cuda.memcpy_dtoh_async(self.h_lam, self.d_lam.gpudata, self.stream)
        cuda.memcpy_dtoh_async(self.h_grams, self.d_grams.gpudata, self.stream)
        self.stream.synchronize()
        return self.h_lam.copy(), [gram.copy() for gram in self.h_grams]

    def factors(self):
        import pycuda.driver as cuda
        self._join_deferred()
        for n in range(self.order):
            cuda.memcpy_dtoh_async(self.h_full[n], self.d_factors[n].gpudata, self.stream)
        self.stream.synchronize()
        return [np.array(full) for full in self.h_full]

    def factor_rows(self, n):
        """This rank's rows of factor n, on the host (``output.collect: parts``)."""
        block = self.local.modes[n]
        self._join_deferred()
        self.stream.synchronize()
        return self.d_factors[n][block.row_offset:block.row_offset + block.n_rows].get()

    def local_mttkrp(self, n):
        """The last MTTKRP (of mode n) on the host: local rows x R (tests, the peer check)."""
        self.stream.synchronize()
        self.early_stream.synchronize()
        rows = self.d_m.get()[:self.local.modes[n].n_rows]
        if self.two_parts(n):
            rows += self.d_m_early.get()[:len(rows)]
        return rows

    def products(self):
        """This rank's column products of the last solve (or, after the operation's all-reduce,
        everyone's) on the host: ``(U^T U, <U, M>, column maxima of |U|)``."""
        import pycuda.driver as cuda
        cuda.memcpy_dtoh_async(self.h_total, self.d_total.gpudata, self.stream)
        self.stream.synchronize()
        return split_products(self.h_total.copy(), self.cp_rank)

    # -- steps ---------------------------------------------------------------------------------
    def _grid(self, threads):
        return grid_1d(threads, BLOCK)

    def mttkrp(self, n):
        """The whole MTTKRP of mode n into the rows of M (after any exchange and scaling it
        needs)."""
        self.mttkrp_before_exchange(n)
        self.mttkrp_after_exchange(n)

    def mttkrp_before_exchange(self, n):
        """The part of mode n's MTTKRP that reads only this rank's own rows of the previous
        mode's factor (the 'fast' engine's first part; nothing for the others): it runs while
        the operation's exchange brings the other ranks' rows."""
        self._join_scale()
        self._launch_mttkrp(n, 0)

    def mttkrp_after_exchange(self, n):
        """The rest of mode n's MTTKRP, once the exchange is in (the engine's stream waits for
        it); then a factor it read unnormalised is scaled, on the side stream."""
        self._join_scale()
        self._join_exchange()
        self._launch_mttkrp(n, 1)
        self._join_early()
        self._scale_unnormalized()

    def _launch_mttkrp(self, n, part):
        """Launch part ``part`` (0: before the exchange, 1: after it) of mode n's MTTKRP."""
        raise NotImplementedError

    def two_parts(self, n):
        """Whether mode n's MTTKRP runs as two launches into two buffers, the first on the
        early stream (:class:`NnzTeamEngine` with the block parted); else one launch into the
        rows of M."""
        return False

    @property
    def mttkrp_streams(self):
        """The streams the MTTKRP's launches go on (the graph's background work)."""
        return self.stream, self.early_stream

    def _join_early(self):
        """The engine's stream waits for the MTTKRP's part on the early stream (if pending)."""
        if self.early_pending:
            self.stream.wait_for_event(self.early_done)
            self.early_pending = False

    def _local_rows(self, n):
        """Pointer to this rank's first row of factor n, and its row count."""
        block = self.local.modes[n]
        return (int(self.d_factors[n].gpudata) +
                block.row_offset * self.cp_rank * self.dtype.itemsize, block.n_rows)

    def _work(self):
        return 0 if self.d_solve_work is None else self.d_solve_work.gpudata

    def solve(self, n, vinv=None):
        """This rank's rows of U_n = M V^-1, written into the device factor, and their column
        products. V^-1 is the one the last normalisation prepared for mode n (computed here
        otherwise), or ``vinv`` (R x R, from the host) when given.

        Returns
        -------
        (sums, maxima) : device arrays, views of the column products
            U^T U and <U, M> (R*R + 1 fp64) to sum over the ranks, then the column maxima of
            |U| (R) to maximise over the ranks, in place, before :meth:`normalize`.
        """
        import pycuda.driver as cuda
        self.join_inversion()
        deferred = self.deferred_mode
        if deferred is not None and (vinv is not None or self.vinv_mode != n):
            raise RuntimeError(f"CP-ALS engine: the solve of mode {n} follows the deferred "
                               f"normalisation of mode {deferred}, which prepared W of mode "
                               f"{self.vinv_mode}")
        if vinv is not None:
            self.h_vinv[:] = vinv
            cuda.memcpy_htod_async(self.d_vinv.gpudata, self.h_vinv, self.stream)
        elif self.vinv_mode != n:
            self._invert(n, self.stream)
        self.vinv_mode = n
        rows_ptr, n_rows = self._local_rows(n)
        blocks, rows_per_block = self.solve_grids[n]
        # M came out scaled by the deferred mode's lambda: <U, M> divides it out
        m_scale = 0 if deferred is None else self._lambda_of(deferred)
        self.dense.solve_rows.prepared_async_call(
            (blocks, 1), (SOLVE_THREADS, 1, 1), self.stream, self.index(n_rows),
            self.index(rows_per_block), self.d_m.gpudata, self.d_vinv.gpudata, rows_ptr,
            self.d_partial.gpudata, self.d_blocks_done.gpudata, self.d_total.gpudata,
            np.intp(self.d_m_early.gpudata if self.two_parts(n) else 0), np.intp(m_scale))
        self.m_clean = True  # solve_rows zeroed the rows of M it read (of both buffers)
        self.deferred_mode = None
        return self.d_sums, self.d_maxima

    def _lambda_of(self, n):
        """Device pointer to lambda of mode n as its deferred normalisation left it."""
        return int(self.d_lam_modes.gpudata) + n * self.cp_rank * 8

    # -- the exchange beside the next MTTKRP, the normalisation deferred past it ---------------
    def fork_exchange(self):
        """The stream the operation enqueues the exchange of the mode just solved on: forked
        from the engine's stream after the solve, so that the next MTTKRP's first part runs
        beside it. :meth:`exchange_done` marks its end."""
        self.solved.record(self.stream)
        self.exchange_stream.wait_for_event(self.solved)
        return self.exchange_stream

    def exchange_done(self):
        """The exchange enqueued on :meth:`fork_exchange`'s stream is complete there: the
        deferred normalisation and the next MTTKRP's second part wait for this point."""
        self.exchanged.record(self.exchange_stream)
        self.exchange_pending = True

    def defer_normalize(self, n, first, norm_x=None, slot=0):
        """In place of :meth:`normalize`, after :meth:`exchange_done`: on the side stream, once
        the exchange is in, lambda of mode n, its Gram and the next mode's W = diag(1/lambda)
        V^-1 in one launch (the next solve waits for it); the factor stays unnormalised for the
        next MTTKRP, which reads it so (its rows come out M diag(lambda), which W and the
        solve's <U, M> undo), and is scaled once that MTTKRP is done
        (:meth:`mttkrp_after_exchange`). ``first``: the iteration is the first (lambda from
        column norms). With ``norm_x`` (an iteration's last mode, the next iteration's first
        MTTKRP reading it), also the iteration's lambda and its fit into fit slot ``slot``,
        copied to the host on the side stream (:meth:`join_side_streams` joins it)."""
        import pycuda.driver as cuda
        next_mode = (n + 1) % self.order
        slot, fit_ptr = self._fit_slot(slot)
        self.side_stream.wait_for_event(self.exchanged)
        self.dense.deferred_normalize.prepared_async_call(
            (1, 1), (self.solve_block, 1, 1), self.side_stream, np.int32(n), np.int32(next_mode),
            np.int32(bool(first)), self.d_total.gpudata, self.d_lam_modes.gpudata,
            self.d_grams.gpudata, self._work(), self.d_vinv.gpudata, self.d_status.gpudata,
            np.float64(-1.0 if norm_x is None else norm_x), self.d_lam.gpudata, fit_ptr,
            shared_size=self.solve_shared)
        if norm_x is not None:
            cuda.memcpy_dtoh_async(self.h_fits[slot], fit_ptr, self.side_stream)
        self.inverted.record(self.side_stream)
        self.inversion_pending = True
        self.vinv_mode = next_mode
        self.deferred_mode = n  # the next solve divides lambda_n out of <U, M>
        self.unnormalized_mode = n  # scaled after the next MTTKRP

    def _scale_unnormalized(self):
        """The factor a deferred normalisation left unnormalised divided by its lambda, on the
        side stream after the work enqueued so far (the MTTKRP that read it)."""
        n = self.unnormalized_mode
        if n is None:
            return
        self.read_done.record(self.stream)
        self.side_stream.wait_for_event(self.read_done)
        rows = int(self.shape[n])
        blocks = max(1, min(MAX_SCALE_BLOCKS, -(-rows * self.cp_rank // BLOCK)))
        self.dense.scale_columns.prepared_async_call(
            (blocks, 1), (BLOCK, 1, 1), self.side_stream, self.index(rows),
            self.d_factors[n].gpudata, np.intp(self._lambda_of(n)))
        self.scaled.record(self.side_stream)
        self.scale_pending = True
        self.unnormalized_mode = None

    def _join_scale(self):
        """The engine's stream waits for the side stream's scaling of a factor (if pending)."""
        if self.scale_pending:
            self.stream.wait_for_event(self.scaled)
            self.scale_pending = False

    def _join_exchange(self):
        """The engine's stream waits for the exchange (if one is pending)."""
        if self.exchange_pending:
            self.stream.wait_for_event(self.exchanged)
            self.exchange_pending = False

    def _join_deferred(self):
        """Whatever a deferred normalisation left pending on the other streams joined into the
        engine's stream, a factor still unnormalised scaled first: the state as a normalised
        iteration end leaves it."""
        self.join_side_streams()  # (before the scaling: the early part may read that factor)
        self._scale_unnormalized()
        self._join_scale()

    def join_side_streams(self):
        """The engine's stream waits for the exchange and the side stream's work enqueued so
        far (the last of it a deferred normalisation or an inversion): how an iteration whose
        last mode is deferred ends, as a recorded iteration must join every stream it forked;
        the host's wait on the engine's stream then covers the fit's copy."""
        self._join_exchange()
        self._join_early()
        self.join_inversion()

    def _reset_deferral(self):
        self.exchange_pending = self.scale_pending = False
        self.deferred_mode = self.unnormalized_mode = None

    #: What the host tracks of the device's state between launches: which mode's V^-1 (or W)
    #: d_vinv holds, the deferred normalisation's modes, whether M is zero, and the other
    #: streams' work the engine's stream has yet to wait for.
    BOOKKEEPING = ("vinv_mode", "deferred_mode", "unnormalized_mode", "m_clean",
                   "exchange_pending", "scale_pending", "inversion_pending", "early_pending")

    def bookkeeping(self):
        """The host's record of the device's state (:data:`BOOKKEEPING`), as a dict: a
        recorded iteration keeps the one its recording ended with, and a replay, which runs no
        host code, restores it (:meth:`restore_bookkeeping`)."""
        return {name: getattr(self, name) for name in self.BOOKKEEPING}

    def restore_bookkeeping(self, state):
        """Set the host's record of the device's state to ``state`` (:meth:`bookkeeping`):
        after a replayed iteration, the record its recording ended with; after a recording
        that failed (nothing of it ran), the record from before it."""
        for name, value in state.items():
            setattr(self, name, value)

    def normalize(self, n, first, norm_x=None, slot=0, invert_next=True):
        """From the column products reduced over the ranks: lambda (column norms in the
        ``first`` iteration, else column maxima floored at 1), U_n /= lambda (every row: the
        factor is gathered), G_n, and with ``norm_x`` (after the last mode) the fit, into fit
        slot ``slot`` (the iteration) and copied to the host for :meth:`read_fit`: one launch
        (and a 16-byte copy). Then, with ``invert_next``, V^-1 of the next mode on the side
        stream (:meth:`invert_ahead`; the next :meth:`solve` waits for it); a recorded
        iteration ends without it (the side stream must be joined before its capture ends)."""
        import pycuda.driver as cuda
        self._join_deferred()  # (nothing within an iteration but the exchange: the solve
        #                        joined the inversion, the last MTTKRP scaled its factor)
        rows_ptr, n_rows = self.d_factors[n].gpudata, int(self.shape[n])
        slot, fit_ptr = self._fit_slot(slot)
        scale_blocks = min(MAX_SCALE_BLOCKS,
                           -(-n_rows * self.cp_rank // self.normalize_block))
        self.dense.normalize_factor.prepared_async_call(
            (1 + scale_blocks, 1), (self.normalize_block, 1, 1), self.stream, np.int32(n),
            np.int32(bool(first)), self.index(n_rows), rows_ptr, self.d_total.gpudata,
            self.d_lam.gpudata, self.d_grams.gpudata, self.d_status.gpudata,
            np.float64(-1.0 if norm_x is None else norm_x), fit_ptr)
        if invert_next:
            self.invert_ahead((n + 1) % self.order)
        if norm_x is not None:
            cuda.memcpy_dtoh_async(self.h_fits[slot], fit_ptr, self.stream)

    def _fit_slot(self, slot):
        """``(slot, device pointer)`` of fit slot ``slot`` (taken modulo the slots)."""
        slot = int(slot) % self.fit_slots
        return slot, int(self.d_fits.gpudata) + slot * 2 * 8

    def invert_ahead(self, mode):
        """V^-1 of ``mode`` from the Grams as the work enqueued so far leaves them, on the side
        stream (forked from the engine's stream by an event), so that it overlaps what is
        enqueued next; the next :meth:`solve` of ``mode`` waits for it. Nothing may be pending
        (:meth:`join_inversion`). A recorded iteration starts with this for mode 0, so that its
        graph forks and joins the side stream itself."""
        self.normalized.record(self.stream)
        self.side_stream.wait_for_event(self.normalized)
        self._invert(mode, self.side_stream)
        self.inverted.record(self.side_stream)
        self.inversion_pending = True
        self.vinv_mode = mode

    def _invert(self, mode, stream):
        """V^-1 of ``mode`` (from the Grams now current) into d_vinv, on ``stream``."""
        self.dense.gram_inverse.prepared_async_call(
            (1, 1), (self.solve_block, 1, 1), stream, np.int32(mode),
            self.d_grams.gpudata, self._work(), self.d_vinv.gpudata, self.d_status.gpudata,
            shared_size=self.solve_shared)

    def join_inversion(self):
        """Order the engine's stream after the side stream's pending V^-1 (if any)."""
        if getattr(self, "inversion_pending", False):
            self.stream.wait_for_event(self.inverted)
            self.inversion_pending = False

    def free(self):
        for stream in (getattr(self, "side_stream", None), getattr(self, "exchange_stream", None),
                       getattr(self, "early_stream", None)):
            if stream is not None:
                stream.synchronize()  # their last launches write memory about to be released
        super().free()

    def device_factor(self, n):
        """The (I_n, R) device factor of mode n, this rank's solved rows in place: what a
        device all-gather fills."""
        return self.d_factors[n]

    def factor_buffer(self, n, stream=None):
        """The pinned (I_n, R) host array that a host all-gather of mode n fills in place,
        with this rank's solved rows downloaded into it (on ``stream``, by default the
        engine's)."""
        import pycuda.driver as cuda
        stream = stream or self.stream
        block, full = self.local.modes[n], self.h_full[n]
        rows_ptr, n_rows = self._local_rows(n)
        if n_rows:
            cuda.memcpy_dtoh_async(full[block.row_offset:block.row_offset + n_rows], rows_ptr,
                                   stream)
        stream.synchronize()
        return full

    def factor_gathered(self, n, stream=None):
        """Upload the other ranks' rows of the factor of mode n (on ``stream``, by default the
        engine's), now that they are on the host; this rank's own rows are not written, as the
        next MTTKRP's first part may be reading them."""
        import pycuda.driver as cuda
        stream = stream or self.stream
        block, full, device = self.local.modes[n], self.h_full[n], self.d_factors[n]
        row_bytes = self.cp_rank * self.dtype.itemsize
        for first, last in ((0, block.row_offset),
                            (block.row_offset + block.n_rows, int(self.shape[n]))):
            if last > first:
                cuda.memcpy_htod_async(int(device.gpudata) + first * row_bytes, full[first:last],
                                       stream)

    def mark(self):
        """A point in the engine's stream (a recorded event), for :meth:`elapsed`."""
        import pycuda.driver as cuda
        event = cuda.Event()
        event.record(self.stream)
        return event

    @staticmethod
    def elapsed(start, end):
        """Seconds between two :meth:`mark` points (GPU time; the stream must be past ``end``)."""
        return end.time_since(start) * 1e-3

    def read_fit(self, slot=0):
        """The fit that :meth:`normalize` with ``norm_x`` put in ``slot`` (call after the
        engine's stream is done)."""
        fit, failed = self.h_fits[int(slot) % self.fit_slots]
        failed = int(failed)
        if failed:
            error = HisparseError(
                f"CP-ALS on the GPU: the {self.cp_rank}x{self.cp_rank} system of mode "
                f"{failed - 1} (the Hadamard product of the other modes' Grams) is not positive "
                f"definite: the factors have lost rank (is rank {self.cp_rank} more than the "
                f"tensor supports?); backend: cpu solves it with a pseudo-inverse")
            error.collective = True  # every rank solves the same system from the same Grams
            raise error
        return float(fit)


class RowBlockEngine(MttkrpGpuEngine):
    """``mttkrp: seed``: one thread block per unfolding row, one thread per rank column."""

    kernel_name = "mttkrp_row_block"

    def _launch_mttkrp(self, n, part):
        if part == 0:  # one launch over whole rows: it waits for the exchange
            return
        csr = self.local.modes[n]
        self.m_clean = False
        self.kernels.mttkrp_row_block.prepared_async_call(
            grid_1d(csr.n_rows, 1), (self.cp_rank, 1, 1), self.stream, self.index(csr.n_rows),
            self.d_indptr[n].gpudata, self.d_values[n].gpudata, self.d_other_ptrs[n].gpudata,
            self.d_factor_ptrs[n].gpudata, self.d_m.gpudata)


class _NonzeroPart:
    """The nonzeros of one block that one launch of the 'fast' kernel takes: a CSR over the
    block's rows (``indptr`` from 0) of ``nnz`` nonzeros at ``first`` of the block's arrays."""

    def __init__(self, nnz, first, indptr, other_ptrs, chunk):
        self.nnz, self.first, self.indptr = int(nnz), int(first), indptr
        self.other_ptrs, self.chunk = other_ptrs, int(chunk)


class NnzTeamEngine(MttkrpGpuEngine):
    """``mttkrp: fast``: equal chunks of nonzeros, one per team of lanes (see mttkrp.cu).

    Each mode's nonzeros are in two parts (:meth:`build_unfoldings`): those whose row of the
    previous mode's factor (mode 0's: the last mode's) is this rank's, then the rest, each sorted
    as the block is; the first part runs before the exchange of that factor is in
    (:meth:`mttkrp_before_exchange`, on the early stream into ``d_m_early``), the second
    after it into ``d_m``; the solve adds the two."""

    kernel_name = "mttkrp_nnz_team"
    PARTS_BY_OWNER = True

    def upload_data(self):
        super().upload_data()
        self.resident = resident_teams(self.kernels.mttkrp_nnz_team, BLOCK, self.team)

    def build_unfoldings(self):
        """The blocks sorted on the device (:meth:`MttkrpGpuEngine.build_unfoldings`), each
        mode's nonzeros parted there by the owner of their row of the previous mode's factor;
        each part's launch. An unparted block is one part: after the exchange (blocks built on
        the host, a key without room for the part), or before it where this rank holds every
        row of the previous mode (one rank)."""
        super().build_unfoldings()
        self.parts = []
        for n, csr in enumerate(self.local.modes):
            parted = self.part_indptrs[n]
            if parted is None:
                whole = _NonzeroPart(csr.nnz, 0, self.d_indptr[n], self.d_other_ptrs[n],
                                     self._chunk(csr.nnz))
                everything_early = self.holds_every_row((n - 1) % self.order)
                self.parts.append((whole, None) if everything_early else (None, whole))
                continue
            n_early, early_indptr, late_indptr = parted
            self.parts.append(tuple(
                _NonzeroPart(count, first, indptr, coordinate_pointers(
                    self.arena, self.d_other[n], csr.nnz, first, "part coordinate pointers"),
                    self._chunk(count)) if count else None
                for first, count, indptr in ((0, n_early, early_indptr),
                                             (n_early, csr.nnz - n_early, late_indptr))))
        if any(self.two_parts(n) for n in range(self.order)):
            self.d_m_early = self.arena.zeros(self.d_m.shape, self.dtype,
                                              "MTTKRP rows before the exchange")

    def two_parts(self, n):
        parts = self.parts[n]
        return parts[0] is not None and parts[1] is not None

    def _chunk(self, nnz):
        return team_chunk(nnz, self.team, self.requested_chunk, self.resident)

    def local_unfolding(self, n):
        """The block as the NumPy builder makes it (its nonzeros in row, then coordinate order),
        whatever parts the device holds them in."""
        block = super().local_unfolding(n)
        if self.part_indptrs[n] is None:
            return block
        # the row of each nonzero as the parts hold them: the first part's rows, then the rest's
        rows = np.concatenate([np.repeat(np.arange(block.n_rows), np.diff(pointers.get()))
                               for pointers in self.part_indptrs[n][1:]])
        order = np.lexsort(tuple(block.other_idx[::-1]) + (rows,))
        return ModeCSR(n, block.n_rows, block.row_offset, block.indptr, block.values[order],
                       block.other_idx[:, order], block.other_modes)

    def _launch_mttkrp(self, n, part):
        """Part ``part`` of mode n's MTTKRP: a block in two parts has its first on the early
        stream into ``d_m_early`` (forked from the engine's stream, :meth:`_join_early` joins
        it), its second on the engine's stream into ``d_m``, so that the second can start
        beside the first's last waves; a block in one part runs on the engine's stream."""
        import pycuda.driver as cuda
        csr = self.local.modes[n]
        if part == 0:
            # Rows cut by chunk boundaries are added atomically: the rows start from zero, as
            # the last solve (or load) left them; only a second MTTKRP without a solve between
            # (tests, the peer check) clears them first.
            words = csr.n_rows * self.cp_rank * self.dtype.itemsize // 4
            if words and not self.m_clean:
                for rows in (self.d_m, self.d_m_early):
                    if rows is not None:
                        cuda.memset_d32_async(rows.gpudata, 0, words, self.stream)
            self.m_clean = False
        launch = self.parts[n][part]
        if launch is None or not launch.nnz:
            return
        stream, rows = self.stream, self.d_m
        if part == 0 and self.two_parts(n):
            stream, rows = self.early_stream, self.d_m_early
            self.early_forked.record(self.stream)
            stream.wait_for_event(self.early_forked)
        teams = (launch.nnz + launch.chunk - 1) // launch.chunk
        values = int(self.d_values[n].gpudata) + launch.first * self.dtype.itemsize
        self.kernels.mttkrp_nnz_team.prepared_async_call(
            self._grid(teams * self.team), (BLOCK, 1, 1), stream,
            self.index(csr.n_rows), self.index(launch.nnz), self.index(launch.chunk),
            launch.indptr.gpudata, np.intp(values), launch.other_ptrs.gpudata,
            self.d_factor_ptrs[n].gpudata, rows.gpudata)
        if stream is self.early_stream:
            self.early_done.record(stream)
            self.early_pending = True


ENGINES = {"seed": RowBlockEngine, "fast": NnzTeamEngine}
