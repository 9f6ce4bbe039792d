"""GPU engine of SpGEMM: the hash kernels of ``kernels_cu/spgemm_hash.cu`` driven from PyCUDA.

One repetition on one rank (local rows of A, all of B resident on the device):

1. ``binning``: products per row and symbolic bins (device), rows scattered into per-bin lists
   on the device (each bin's start found there from the counts). The bin sizes that set the
   symbolic launches are those of the plan's product counts (:func:`symbolic_bin_counts`, the
   same rule on the host), so nothing is read back.
2. ``symbolic``: one launch per non-empty bin with a shared-memory table sized to the bin (the
   count is the table's occupied slots: no shared counter per insert); rows beyond the largest
   table are counted in a shared bitmap of B's columns, or (B too wide, or ``dense_long_rows``
   off) tried in the largest table and redone with global-memory tables in bounded batches when
   they overflow; the row pointers of C are scanned on the device.
3. ``numeric``: rows binned again by their exact output size, the bin sizes read back together
   with nnz(C) (the repeat's one wait), C allocated, one launch per bin. Shared tables write their
   rows in column order by rank in a bitmap of B's columns where it fits (no sort), else by the
   sorts of the small tables; rows above the largest table take dense accumulators over column
   windows in shared memory (``numeric_window``) or global hash tables. C stays on the device
   (the next repetition hands its buffers back to the arena first, so memory stays flat). When
   C and the workspace would not fit in the memory budget, rows are processed in chunks whose C
   is copied to the host one after the other (``d2h``).

Small products skip steps 1-2 and the numeric binning (``bounded_output``): each row's numeric bin
and its slot in a buffer of min(products, ncols(B)) entries per row are fixed at upload from the
plan's product counts; a repetition computes every row into its slot with its entry count, scans
the counts into C's row pointers and packs the rows in place to the buffer's front (C), with no
wait between the launches, which are recorded once as a CUDA graph and replayed.

After the repetitions the operation collects C: the whole local block through two pinned staging
buffers (:meth:`GpuSpgemmEngine.local_result`), or per-row checksums computed on the device and a
few sampled rows (:meth:`GpuSpgemmEngine.checksums`, :meth:`GpuSpgemmEngine.sample`).

Workspace is O(rows) + O(nnz(C)) + O(bins): the global tables are at most 2x the output of the
rows they serve (numeric) or their bounded product count (symbolic), allocated per batch; the
dense windows live in shared memory. Every device buffer comes from the engine's arena, so the
peak device bytes are recorded. The engine takes local arrays and returns local arrays; it never
sees a communicator.

The host-side planning (table sizes, bins, batches of global tables) is pure NumPy, tested
without a GPU.
"""
import numpy as np

from ...errors import ConfigError
from ...formats import rows_sorted
from ...gpu import KernelTable, grid_1d, type_defines
from ...gpu import free_pinned, staged_download
from .. import GpuEngine
from .checksums import host_checksums, row_spans, take_rows

#: symbolic tables hold rows with up to this fraction of their size in (bounded) products
SYMBOLIC_LOAD = 0.8
#: numeric tables hold rows with up to this fraction of their size in output entries
NUMERIC_LOAD = 0.75
SMALLEST_TABLE = 32
BLOCK_THREADS = 256
SCAN_THREADS = 1024
GLOBAL_THREADS = 1024
#: bitmap words per prefix entry of the rank-ordered write (RANK_CHUNK in the kernels)
RANK_CHUNK = 16
#: shared bytes kept free beside the dynamic tables (the kernels' static scan scratch)
STATIC_SHARED = 1024
#: a bin of a warp or less per row fills the device with this many warps per SM; with fewer
#: rows each row gets a warp, or several (one row per block), at most WIDEST_GROUP threads
TARGET_WARPS_PER_SM = 32
WIDEST_GROUP = 256
#: column bitmaps of at most this many bytes (symbolic_dense) count a row with
#: SMALL_BITMAP_THREADS threads; larger ones with GLOBAL_THREADS
SMALL_BITMAP_BYTES = 16384
SMALL_BITMAP_THREADS = 256
#: numeric_window's static shared ranges of one segment of a row's entries (WINDOW_SEGMENT x
#: two index_t in the kernels, counted at 8 bytes each)
WINDOW_SEGMENT_BYTES = 256 * 2 * 8
#: a row of the tables' range takes the dense accumulator when ncols(B) <= this x its output
#: (B fitting one window)
SHORT_DENSE_RATIO = 16
#: threads per row for those rows
SHORT_DENSE_THREADS = 256
#: ``balanced_products: null`` deals products to warps when B's product-weighted row length
#: is at least this many times its mean row length (power-law B)
SKEW_RATIO = 4.0
#: ``bounded_output: null`` skips the symbolic pass when the rows' bound-sized slots (min(products,
#: ncols(B)) entries each) take at most this many bytes: small products, where the symbolic
#: launches and the mid-repeat read-back of nnz(C) cost more than the symbolic work saves
#: (measured on H100: 27-pt stencils gain 1.9x at 113 MB of slots and nothing at 225 MB;
#: facebook, 105 MB, gains 1.4-2x)
BOUNDED_OUTPUT_BYTES = 128 << 20
#: slot entries one block of compact_rows packs at least (it holds them in shared memory; more
#: when a row's bound is larger)
PACK_GROUP_ENTRIES = 2048
#: bytes of each of the two pinned buffers that stage C on its way to the host (collect)
STAGING_BYTES = 64 << 20
INT64_MAX = np.iinfo(np.int64).max


def next_pow2(values):
    """Smallest power of two >= each value (>= 1), int64."""
    values = np.maximum(np.asarray(values, dtype=np.int64), 1)
    return (1 << np.ceil(np.log2(values)).astype(np.int64)).astype(np.int64)


def lanes_for_mean(mean):
    """Threads that walk one row together: the power of two nearest ``mean`` (a mean row
    length), between 1 and 32."""
    return int(min(32, 2 ** max(0, round(np.log2(max(mean, 1.0))))))


def product_weighted_row_length(a_indices, b_indptr, sample=1 << 20):
    """B's mean row length as the products meet it: every entry of A starts a walk of one B row,
    and a product lies on a long row more often than a row is long, so the mean over products,
    sum(len^2) / sum(len) over A's entries (a strided sample of at most ``sample`` of them).
    On power-law B (R-MAT: 3.9 entries per row) it is far above the plain mean."""
    if not len(a_indices):
        return 1.0
    step = max(1, len(a_indices) // sample)
    lengths = np.diff(b_indptr)[a_indices[::step]].astype(np.float64)
    total = float(lengths.sum())
    return float(np.dot(lengths, lengths)) / total if total else 1.0


def skewed_rows(a_indices, b_indptr, weighted_length=None):
    """Whether B's rows, as A's entries meet them, are skewed enough that a row's products sit
    on a few long B rows: the product-weighted row length (``weighted_length`` when the caller
    has it) at least ``SKEW_RATIO`` x the plain mean. Then one warp per A entry leaves most of a
    one-row-per-block group idle while one warp walks the hub, and the kernels deal the products
    to the warps instead (``balanced_products``)."""
    rows = len(b_indptr) - 1
    if rows <= 0 or not len(a_indices):
        return False
    mean = (int(b_indptr[-1]) - int(b_indptr[0])) / rows
    if weighted_length is None:
        weighted_length = product_weighted_row_length(a_indices, b_indptr)
    return mean > 0 and weighted_length >= SKEW_RATIO * mean


def bin_layout(max_table, row_lanes=4):
    """Tables of one bin kind, smallest first: a list of ``(table_size, group_size, block)``.

    Tables up to 512 entries are served by groups of 4..32 threads per row (at least
    ``row_lanes``, the power of two nearest B's mean row length, since a group's lanes walk one
    B row at a time), several rows per block of 256 threads; larger tables by one block per row
    of table/8 threads (64..1024).
    """
    layout = []
    table = SMALLEST_TABLE
    while table <= max_table:
        if table <= 512:
            group = min(32, max(4, table // 16, row_lanes))
            layout.append((table, group, BLOCK_THREADS))
        else:
            threads = min(1024, max(64, table // 8))
            layout.append((table, threads, threads))
        table *= 2
    return layout


def largest_table(entry_bytes, shared_limit, cap=None):
    """Largest power-of-two table of ``entry_bytes`` entries (plus counters) in one block."""
    table = SMALLEST_TABLE
    while (table * 2) * entry_bytes + 64 <= shared_limit:
        table *= 2
    if cap is not None:
        table = max(SMALLEST_TABLE, min(table, int(next_pow2(cap))))
    return table


def bin_limits(layout, load):
    """Upper bound of each bin (``load`` x its table size), plus an unbounded last bin for the
    rows that no shared table takes; int64."""
    return np.array([int(t * load) for t, _, _ in layout] + [INT64_MAX], dtype=np.int64)


def global_batches(sizes, entry_bytes, batch_bytes):
    """Split rows needing global tables of ``sizes`` entries into consecutive batches of at most
    ``batch_bytes`` of tables, or of the largest table when that alone is larger.

    Returns
    -------
    list of (start, stop)
    """
    limit = max(batch_bytes // entry_bytes, int(sizes.max()))
    batches, start, used = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and used + size > limit:
            batches.append((start, i))
            start, used = i, 0
        used += int(size)
    batches.append((start, len(sizes)))
    return batches


def table_offsets(sizes):
    """Start of each table in one buffer holding tables of ``sizes`` entries back to back."""
    offsets = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    return offsets


def rank_words(n_cols):
    """Words of the column bitmap of one row for the rank-ordered write (a multiple of
    RANK_CHUNK)."""
    words = (int(n_cols) + 31) // 32
    return (words + RANK_CHUNK - 1) // RANK_CHUNK * RANK_CHUNK


def rank_bytes(n_cols):
    """Shared bytes of one row's column bitmap and chunk starts."""
    words = rank_words(n_cols)
    return 4 * words + 4 * (words // RANK_CHUNK)


def uses_rank(table, group, block, entry_bytes, n_cols, shared_limit):
    """Whether a numeric bin writes its rows by rank in a column bitmap instead of sorting:
    for tables of a warp or more per row (where the sort is a bitonic network), when the bitmap
    is at most twice the table (occupancy) and fits beside the block's tables."""
    per_row = rank_bytes(n_cols)
    fits = (block // group) * (table * entry_bytes + per_row) <= shared_limit - STATIC_SHARED
    return group >= 32 and per_row <= 2 * table * entry_bytes and fits


def window_columns(value_bytes, n_cols, shared_limit):
    """Columns per window of numeric_window: the most (a multiple of 1024, or B's column count
    rounded up to 32 when smaller) whose dense values and bitmap fit in one block beside the
    kernel's static shared memory."""
    usable = shared_limit - STATIC_SHARED - WINDOW_SEGMENT_BYTES
    window = (usable * 8 // (8 * value_bytes + 1)) // 1024 * 1024
    return int(min(window, (int(n_cols) + 31) // 32 * 32))


def numeric_bin_index(sizes, limits, n_cols, short_ratio, window_ratio):
    """Numeric bin of rows of output size ``sizes`` (or an upper bound of it), as
    ``numeric_bins`` bins them on the device: the first table whose limit holds the size; rows
    of the tables' range whose output is dense in B's columns (``short_ratio``) one bin after
    the tables; longer rows the dense windows (``window_ratio``) or, the last bin, global
    tables; rows of size 0 bin -1. ``limits`` are the tables' limits plus the unbounded last
    (:func:`bin_limits`)."""
    sizes = np.asarray(sizes, np.int64)
    tables = len(limits) - 1
    bins = np.searchsorted(np.asarray(limits[:tables], np.int64), sizes, side="left")
    in_tables = bins < tables
    if short_ratio:
        bins[in_tables & (int(n_cols) <= short_ratio * sizes)] = tables
    beyond = ~in_tables
    bins[beyond] = tables + 2
    if window_ratio:
        bins[beyond & (int(n_cols) <= window_ratio * sizes)] = tables + 1
    bins[sizes <= 0] = -1
    return bins


def pack_groups(bounds, capacity):
    """Consecutive rows grouped so that each group's bounds sum to at most ``capacity`` (every
    bound must be at most that): the first row of each group and the end, int64."""
    ends = np.cumsum(np.asarray(bounds, np.int64))
    firsts, start = [0], 0
    while start < len(ends):
        before = int(ends[start - 1]) if start else 0
        start = int(np.searchsorted(ends, before + capacity, side="right"))
        firsts.append(start)
    return np.asarray(firsts, np.int64)


def symbolic_bin_counts(products, n_cols, limits):
    """Rows per symbolic bin, as ``row_products`` bins them on the device (the first bin whose
    limit holds min(products, n_cols); rows without products in none), from the host's product
    counts: the launch sizes of the symbolic phase, known without a read-back."""
    bound = np.minimum(np.asarray(products, np.int64), int(n_cols))
    bins = np.searchsorted(limits, bound[bound > 0], side="left")
    return np.bincount(bins, minlength=len(limits)).astype(np.int64)


#: The kernels of ``kernels_cu/spgemm_hash.cu`` this engine launches (signatures derived from
#: the source).
KERNELS = KernelTable("spgemm_hash", [
    "row_products", "numeric_bins", "scatter_bins", "symbolic_shared", "symbolic_global",
    "scan_blocks", "scan_block_sums", "scan_add", "numeric_shared", "numeric_global",
    "row_checksums", "symbolic_dense", "numeric_window", "compact_rows"])


class GpuSpgemmEngine(GpuEngine):
    """Hash SpGEMM of the local rows of A times B on this rank's GPU.

    Parameters
    ----------
    ctx : EngineContext
    local : SpgemmLocal
        ``a`` (CSRMatrix, local rows of A), ``b`` (CSRMatrix, all of B), ``b_is_a`` (B is the
        same global matrix as A, held once when A is all of it), ``products`` (int64 per local
        row).
    params : dict
        ``operation.params``.
    """

    def __init__(self, ctx, local, params):
        super().__init__(ctx, local, params, owner="spgemm")
        self.arena.hint = "lower operation.params.memory_budget or use more ranks"
        self.c_device = None
        self.c_host = None
        self.bounded = False
        self.bound_offsets = self.pack_group_rows = self.pack_progress = None
        self.bounded_c = self.scan_sums = self.graphs = None
        self.stats = {}

    # -- setup --------------------------------------------------------------------------------
    def upload(self):
        import pycuda.driver as cuda
        local, b = self.local.a, self.local.b
        self.value_dtype = local.data.dtype
        self.index_dtype = local.indices.dtype
        self.index_bytes = self.index_dtype.itemsize
        self.value_bytes = self.value_dtype.itemsize
        self.n_cols_b = b.ncols
        row_lanes = lanes_for_mean(b.nnz / b.nrows if b.nrows else 1.0)
        # Teams of this many lanes walk one B row each (B_TEAM), sized to the B rows the
        # products walk: uniformly short rows keep a warp busy with several teams, while on
        # power-law B the long rows hold most products and want the whole warp (measured:
        # docs/ops/spgemm.md).
        weighted_length = product_weighted_row_length(local.indices, b.indptr)
        self.team_lanes = int(self.params["team_lanes"] or lanes_for_mean(weighted_length))
        self.kernels = KERNELS.load(self.ctx, type_defines(self.value_dtype, self.index_dtype,
                                                           B_TEAM=self.team_lanes))
        k = self.kernels

        device = cuda.Context.get_device()
        shared_limit = device.get_attribute(cuda.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.shared_limit = shared_limit
        # enough warps to fill the device: a bin with fewer rows gives each row more warps
        self.target_warps = TARGET_WARPS_PER_SM * device.get_attribute(
            cuda.device_attribute.MULTIPROCESSOR_COUNT)
        cap = self.params["max_shared_table"]
        num_max = largest_table(self.index_bytes + self.value_bytes, shared_limit, cap)
        balanced = self.params["balanced_products"]
        self.balanced = bool(skewed_rows(local.indices, b.indptr, weighted_length)
                             if balanced is None else balanced)
        # One more symbolic bin than tables: rows whose bound passes the largest table's load,
        # counted with a shared column bitmap when B is narrow enough, else tried in the largest
        # table (overflowing rows are redone with global tables). A hash table larger than the
        # bitmap counts no faster than the bitmap, so the tables stop at the bitmap's size.
        self.dense_bytes = 4 * ((b.ncols + 31) // 32)
        self.dense_ok = bool(self.params["dense_long_rows"]) and \
            self.dense_bytes <= shared_limit - STATIC_SHARED
        self.dense_threads = GLOBAL_THREADS if self.dense_bytes > SMALL_BITMAP_BYTES \
            else SMALL_BITMAP_THREADS
        sym_max = largest_table(self.index_bytes, shared_limit, cap)
        if self.dense_ok:
            sym_max = largest_table(self.index_bytes, self.dense_bytes + 64, sym_max)
        self.sym_bins = bin_layout(sym_max, row_lanes)
        self.num_bins = bin_layout(num_max, row_lanes)
        self.sym_limits = bin_limits(self.sym_bins, SYMBOLIC_LOAD)
        # The numeric phase has three more bins than tables: dense rows of the tables' range
        # (B fitting one window), rows above the largest table for dense column windows (when
        # ncols(B) <= dense_columns_per_output x their output), and the others for global
        # tables.
        self.num_limits = bin_limits(self.num_bins, NUMERIC_LOAD)
        entry = self.index_bytes + self.value_bytes
        self.num_rank = [uses_rank(t, g, blk, entry, b.ncols, shared_limit)
                         for t, g, blk in self.num_bins]
        self.rank_words = rank_words(b.ncols)
        self.window_ratio = int(self.params["dense_columns_per_output"]) \
            if self.params["dense_long_rows"] else 0
        self.window_cols = window_columns(self.value_bytes, b.ncols, shared_limit)
        # B fits one window: rows of the tables' range whose output is dense in B's columns
        # take the dense accumulator too (no hashing), with smaller blocks.
        self.short_ratio = SHORT_DENSE_RATIO if self.window_ratio and \
            b.ncols <= self.window_cols else 0
        self.window_bytes = self.window_cols * self.value_bytes + self.window_cols // 8
        # Several windows and rows that may take them (products beyond the largest table): with
        # B's rows sorted by column each window walks only its own products.
        long_products = len(self.local.products) and \
            int(np.max(self.local.products)) > self.num_limits[-2]
        search = self.params["window_search"]
        windows = bool(self.window_ratio) and b.ncols > self.window_cols
        # checked once, and only where a search could be asked for or chosen
        b_sorted = windows and (search or (search is None and long_products)) and \
            rows_sorted(b.indptr, b.indices)
        if windows and search and not b_sorted:
            raise ConfigError(self.ctx.config.source, "operation.params.window_search",
                              "true needs B's columns sorted within each row; they are not "
                              "(null searches only when they are)")
        self.window_search = bool(b_sorted)
        # Raise the dynamic shared-memory limit of the table kernels to what the bins use.
        sym_bytes = max(self._sym_shared_bytes(t, g, blk) for t, g, blk in self.sym_bins)
        num_bytes = max(self._num_shared_bytes(t, g, blk, rank)
                        for (t, g, blk), rank in zip(self.num_bins, self.num_rank))
        attr = cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES
        k.symbolic_shared.set_attribute(attr, int(sym_bytes))
        k.numeric_shared.set_attribute(attr, int(num_bytes))
        k.numeric_window.set_attribute(attr, int(self.window_bytes))
        if self.dense_ok:
            k.symbolic_dense.set_attribute(attr, int(self.dense_bytes))

        self.stream = cuda.Stream()
        self.a = self._upload_csr(local, "A (local rows)")
        if self.local.b_is_a:
            self.b = self.a
        else:
            self.b = self._upload_csr(b, "B")
        self.n_rows = local.nrows
        self.n_cols_b = b.ncols
        self.product_lanes = lanes_for_mean(
            float(np.mean(np.diff(local.indptr))) if local.nrows else 1.0)
        # Device limits for the symbolic/numeric bins, and pinned buffers for small read-backs.
        self.sym_limits_dev = self.arena.to_device(self.sym_limits, "bin limits")
        self.num_limits_dev = self.arena.to_device(self.num_limits, "bin limits")
        self.counts_host = cuda.pagelocked_zeros(64, np.int32)
        self.scalar_host = cuda.pagelocked_zeros(2, np.int64)
        # Symbolic launch sizes from the plan's product counts (the device bins the same rows in
        # every repeat); per-row work arrays kept across repeats (O(rows)).
        self.sym_counts = symbolic_bin_counts(self.local.products, b.ncols, self.sym_limits)
        n = max(self.n_rows, 1)
        self.row_nnz = self.arena.empty(n, self.index_dtype, "row counts")
        self.bin_rows = self.arena.empty(n, self.index_dtype, "bin rows")
        self.bin_counts = self.arena.empty(64, np.int32, "bin counts and cursors")
        free, _ = cuda.mem_get_info()
        budget = self.params["memory_budget"]
        self.budget = int(budget) if budget else int(0.85 * free)
        self.bounded = self._plan_bounded_output()
        # the symbolic pass's per-row bins (the bounded pass's bins are fixed at upload)
        self.row_bin = None if self.bounded else self.arena.empty(n, np.int32, "row bins")

    def _plan_bounded_output(self):
        """Whether the repeats skip the symbolic pass (``bounded_output``), and if so their fixed
        plan on the device: rows listed by the numeric bin of their bound min(products,
        ncols(B)) (``bin_rows``, ``bounded_counts``), each row's slot in the bound-sized buffer
        (``bound_offsets``), row counts zeroed once (rows without products keep 0), the packing
        groups, C's buffers for the run (``bounded_c``) and the repeat recorded as a CUDA graph
        (``gpu.graphs``)."""
        import pycuda.driver as cuda
        choice = self.params["bounded_output"]
        if choice is False or self.n_rows == 0:
            return False
        bound = np.minimum(self.local.products, self.n_cols_b).astype(np.int64)
        bins = numeric_bin_index(bound, self.num_limits, self.n_cols_b, self.short_ratio,
                                 self.window_ratio)
        entry = self.index_bytes + self.value_bytes
        slot_bytes = int(bound.sum()) * entry
        # C is packed in place: the slots are its buffer
        fits = slot_bytes <= 0.8 * (self.budget - self.arena.in_use)
        global_rows = int(np.count_nonzero(bins == len(self.num_bins) + 2))
        # a block of compact_rows holds a group of rows, at least the longest, in shared memory
        capacity = max(PACK_GROUP_ENTRIES, -(-int(bound.max()) // 32) * 32)
        pack_fits = capacity * entry <= self.shared_limit - STATIC_SHARED
        why_not = ("rows beyond the shared tables and the dense windows need the exact "
                   f"counts of the symbolic pass ({global_rows} rows)" if global_rows else
                   "operation.params.chunk_rows asks for row chunks"
                   if self.params["chunk_rows"] else
                   f"the bound-sized buffer ({slot_bytes} bytes) does not fit the memory budget"
                   if not fits else
                   f"a row's bound ({int(bound.max())} entries) is more than one block packs"
                   if not pack_fits else None)
        if choice is None and (why_not or slot_bytes > BOUNDED_OUTPUT_BYTES):
            return False
        if why_not:
            raise ConfigError(self.ctx.config.source, "operation.params.bounded_output",
                              f"true cannot be used here: {why_not} (null chooses it only "
                              f"where it can)")
        listed = np.flatnonzero(bins >= 0)
        order = listed[np.argsort(bins[listed], kind="stable")].astype(self.index_dtype)
        if len(order):
            cuda.memcpy_htod(self.bin_rows.ptr, order)
        self.bounded_counts = np.bincount(bins[listed], minlength=len(self.num_bins) + 3)
        offsets = np.zeros(self.n_rows + 1, np.int64)
        np.cumsum(bound, out=offsets[1:])
        self.bound_total = int(offsets[-1])
        self.bound_offsets = self.arena.to_device(offsets, "bounded row slots")
        cuda.memset_d8(self.row_nnz.ptr, 0, self.row_nnz.nbytes)
        groups = pack_groups(bound, capacity)
        self.pack_capacity = capacity
        self.pack_group_rows = self.arena.to_device(groups, "packing groups")
        self.pack_progress = self.arena.empty(len(groups), np.int32, "packing progress")
        self.kernels.compact_rows.set_attribute(
            cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(capacity * entry))
        # C's buffers stay for the run (each repeat overwrites them), so a repeat's launches
        # can be recorded once as a CUDA graph: every pointer is fixed.
        slots = max(self.bound_total, 1)
        self.bounded_c = (self.arena.empty(self.n_rows + 1, np.int64, "C row pointers"),
                          self.arena.empty(slots, self.index_dtype, "C indices (bounded slots)"),
                          self.arena.empty(slots, self.value_dtype, "C values (bounded slots)"))
        self.scan_sums = self.arena.empty(grid_1d(self.n_rows, SCAN_THREADS)[0], np.int64,
                                          "scan block sums")
        if self.ctx.config["gpu.graphs"]:
            from ...gpu import GraphCache
            self.graphs = GraphCache(lambda line: self.ctx.log(f"spgemm: {line}"))
            self.graphs.graph("bounded", self.stream, self._issue_bounded,
                              "SpGEMM bounded-output product")
        return True

    def _upload_csr(self, matrix, what):
        return {name: self.arena.to_device(getattr(matrix, name), what)
                for name in ("indptr", "indices", "data")}

    def _sym_shared_bytes(self, table, group, block):
        groups = block // group
        return groups * table * self.index_bytes + groups * 8

    def _num_shared_bytes(self, table, group, block, rank=False):
        per_row = table * (self.index_bytes + self.value_bytes)
        if rank:
            per_row += rank_bytes(self.n_cols_b)
        return (block // group) * per_row

    # -- helpers ------------------------------------------------------------------------------
    def _read_counts(self, count):
        """The first ``count`` bin counts (one small read-back; waits for the stream)."""
        import pycuda.driver as cuda
        cuda.memcpy_dtoh_async(self.counts_host[:count], self.bin_counts.ptr, self.stream)
        self.stream.synchronize()
        return np.array(self.counts_host[:count], dtype=np.int64)

    def _bin_rows(self, row_begin, n_rows, n_bins):
        """Scatter rows row_begin .. + n_rows - 1 into per-bin lists in ``self.bin_rows`` (bins
        in order, starts found on the device from the counts), after the binning kernel filled
        the counts; resets the counts' cursors first."""
        import pycuda.driver as cuda
        cursors = self.bin_counts.ptr + 32 * 4
        cuda.memset_d32_async(cursors, 0, 32, self.stream)
        self.kernels.scatter_bins.prepared_async_call(
            grid_1d(n_rows, BLOCK_THREADS), (BLOCK_THREADS, 1, 1), self.stream,
            np.int64(row_begin), np.int64(n_rows), self.row_bin.ptr, np.int32(n_bins),
            self.bin_counts.ptr, cursors, self.bin_rows.ptr)

    def _bin_launches(self, bins, counts):
        """One shared-table launch per non-empty bin: yields ``(index, grid, block threads,
        pointer to the bin's rows in bin_rows, rows, group size, table size)``.

        A bin of a warp or less per row whose threads would not fill the device (fewer than
        ``target_warps`` warps of them: small inputs) gives each row a whole warp, or several
        warps, one row per block, up to WIDEST_GROUP threads: its rows' products are walked by
        more lanes at once (the walk and the write paths serve any group of whole warps)."""
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for index, (table, group, block) in enumerate(bins):
            size = int(counts[index])
            if not size:
                continue
            if group <= 32 and size * group < 32 * self.target_warps:
                warps = min(WIDEST_GROUP // 32, self.target_warps // size)
                if warps >= 2:
                    group = block = 32 * (1 << (int(warps).bit_length() - 1))
                else:
                    group = 32
            yield (index, grid_1d(size, block // group), block,
                   self.bin_rows.ptr + int(offsets[index]) * self.index_bytes, size, group,
                   table)

    # -- one repetition -------------------------------------------------------------------------
    def multiply(self):
        """Compute this rank's rows of C and keep them: on the device (``c_device``), or on the
        host (``c_host``) when the numeric phase ran in chunks.

        One read-back per repetition (nnz(C) with the numeric bin sizes) when C fits: the
        symbolic launch sizes come from the plan's product counts, bins are scattered on the
        device."""
        import pycuda.driver as cuda
        timer, stream, arena, k = self.ctx.timer, self.stream, self.arena, self.kernels
        self.free_result()
        arena.reset_peaks()
        n = self.n_rows
        a, b = self.a, self.b
        row_nnz = self.row_nnz
        self.stats = {"n_chunks": 1, "chunked_for_memory": False, "symbolic_global_rows": 0,
                      "symbolic_dense_rows": 0, "numeric_global_rows": 0,
                      "numeric_dense_rows": 0, "team_lanes": self.team_lanes,
                      "balanced_products": self.balanced, "window_search": self.window_search}
        if n == 0:
            self.c_host = (np.zeros(1, np.int64), np.zeros(0, self.index_dtype),
                           np.zeros(0, self.value_dtype))
            return

        self.stats["bounded_output"] = self.bounded
        if self.bounded:
            self._multiply_bounded()
            return
        counts = self.sym_counts
        n_bins = len(counts)  # the tables, then the rows beyond the largest table
        with timer.phase("binning", stream=stream):
            cuda.memset_d32_async(self.bin_counts.ptr, 0, 32, stream)
            lanes = self.product_lanes
            k.row_products.prepared_async_call(
                grid_1d(n * lanes, BLOCK_THREADS), (BLOCK_THREADS, 1, 1), stream, np.int64(0),
                np.int64(n), a["indptr"].ptr, a["indices"].ptr, b["indptr"].ptr,
                np.int64(self.n_cols_b), np.int32(lanes), self.sym_limits_dev.ptr,
                np.int32(n_bins), self.row_bin.ptr, row_nnz.ptr, self.bin_counts.ptr)
            self._bin_rows(0, n, n_bins)
        self.stats["symbolic_bin_rows"] = counts.tolist()

        with timer.phase("symbolic", stream=stream):
            long_rows = int(counts[-1])
            long_ptr = self.bin_rows.ptr + int(counts[:-1].sum()) * self.index_bytes
            if long_rows and self.dense_ok:
                k.symbolic_dense.prepared_async_call(
                    (long_rows, 1), (self.dense_threads, 1, 1), stream, long_ptr,
                    np.int32(long_rows), a["indptr"].ptr, a["indices"].ptr, b["indptr"].ptr,
                    b["indices"].ptr, np.int64(self.n_cols_b), np.int32(self.balanced),
                    row_nnz.ptr, shared_size=int(self.dense_bytes))
            # Without the dense kernel, the long rows try the largest table and report overflow.
            bins = list(self.sym_bins) + ([] if self.dense_ok else [self.sym_bins[-1]])
            fail_rows = None
            if long_rows and not self.dense_ok:
                fail_rows = arena.empty(long_rows, self.index_dtype, "overflow rows")
                cuda.memset_d32_async(self.bin_counts.ptr, 0, 1, stream)
            for index, grid, block, rows_ptr, size, group, table in self._bin_launches(
                    bins, counts):
                overflow = index == len(self.sym_bins)
                k.symbolic_shared.prepared_async_call(
                    grid, (block, 1, 1), stream, rows_ptr, np.int32(size),
                    a["indptr"].ptr, a["indices"].ptr, b["indptr"].ptr, b["indices"].ptr,
                    np.int32(group), np.int32(table), np.int32(overflow),
                    np.int32(self.balanced and group > 32), row_nnz.ptr,
                    fail_rows.ptr if overflow else 0, self.bin_counts.ptr,
                    shared_size=int(self._sym_shared_bytes(table, group, block)))
            n_fail = 0
            if fail_rows is not None:
                n_fail = int(self._read_counts(1)[0])
                if n_fail:
                    self._symbolic_global(fail_rows, n_fail, row_nnz)
                arena.release(fail_rows)
            c_indptr = arena.empty(n + 1, np.int64, "C row pointers")
            self._scan(row_nnz, c_indptr, n)
        self.stats["symbolic_global_rows"] = n_fail
        self.stats["symbolic_dense_rows"] = long_rows if self.dense_ok else 0

        with timer.phase("numeric", stream=stream):
            # Numeric bins of every row, read back with nnz(C): the one wait of the repeat.
            num_counts = self._numeric_bins(0, n, c_indptr)
            total_nnz = int(self.scalar_host[0])
            chunks = self._plan_chunks(c_indptr, total_nnz)
            if len(chunks) == 1:
                c_indices = arena.empty(max(total_nnz, 1), self.index_dtype, "C indices")
                c_data = arena.empty(max(total_nnz, 1), self.value_dtype, "C values")
                self._numeric_launches(num_counts, c_indptr, 0, c_indices, c_data)
                self._count_numeric_rows(num_counts)
                self.c_device = (c_indptr, c_indices, c_data)
                stream.synchronize()
        self.stats["n_chunks"] = len(chunks)
        if len(chunks) > 1:  # C does not stay: each chunk goes to the host before the next
            self._numeric_in_chunks(chunks, c_indptr, total_nnz)
        self._record_product(total_nnz)

    def _record_product(self, total_nnz):
        """The repeat's nnz(C) and the arena's peaks, in the stats (both passes)."""
        self.stats["nnz_c"] = total_nnz
        self.stats["peak_device_bytes"] = self.arena.peak_reserved
        self.stats["peak_device_bytes_in_use"] = self.arena.peak_in_use

    def _multiply_bounded(self):
        """One repetition without the symbolic pass (:meth:`_issue_bounded`), replayed as the
        graph recorded at upload (``gpu.graphs``) or launched; one wait, at the end."""
        stream = self.stream
        with self.ctx.timer.phase("numeric", stream=stream):
            if self.graphs is not None:
                self.graphs.run("bounded", stream, self._issue_bounded,
                                "SpGEMM bounded-output product")
            else:
                self._issue_bounded()
            self.c_device = self.bounded_c
            stream.synchronize()
            total_nnz = int(self.scalar_host[0])
        self._count_numeric_rows(self.bounded_counts)
        self.stats["numeric_bin_rows"] = [int(x) for x in self.bounded_counts]
        self._record_product(total_nnz)

    def _issue_bounded(self):
        """Launch one bounded-output repetition into the run's C buffers (``bounded_c``): every
        row computed into its bound-sized slot with its entry count, the counts scanned into
        C's row pointers, the rows packed in place to the front of the slots, nnz(C) copied to
        the pinned ``scalar_host``. Nothing waits or allocates (it can be recorded)."""
        import pycuda.driver as cuda
        stream, n = self.stream, self.n_rows
        c_indptr, c_indices, c_data = self.bounded_c
        self._numeric_launches(self.bounded_counts, self.bound_offsets, 0, c_indices, c_data,
                               row_nnz_out=self.row_nnz)
        self._scan(self.row_nnz, c_indptr, n, self.scan_sums)
        groups = len(self.pack_group_rows) - 1
        cuda.memset_d32_async(self.pack_progress.ptr, 0, groups + 1, stream)
        self.kernels.compact_rows.prepared_async_call(
            (groups, 1), (BLOCK_THREADS, 1, 1), stream, np.int64(groups),
            np.int32(self.pack_capacity), self.pack_group_rows.ptr, self.bound_offsets.ptr,
            c_indptr.ptr, c_indices.ptr, c_data.ptr, self.pack_progress.ptr,
            shared_size=int(self.pack_capacity * (self.index_bytes + self.value_bytes)))
        cuda.memcpy_dtoh_async(self.scalar_host[:1], c_indptr.ptr + n * 8, stream)

    def _numeric_in_chunks(self, chunks, c_indptr, total_nnz):
        """The numeric phase over row chunks whose C is copied to the host one after the
        other (``d2h``); C ends on the host."""
        import pycuda.driver as cuda
        timer, stream, arena = self.ctx.timer, self.stream, self.arena
        n = self.n_rows
        self.stats["numeric_bin_rows"] = None
        host = (np.empty(n + 1, np.int64), np.empty(total_nnz, self.index_dtype),
                np.empty(total_nnz, self.value_dtype))
        for row_begin, row_end in chunks:
            with timer.phase("numeric", stream=stream):
                c_base, c_end = self._chunk_bounds(c_indptr, row_begin, row_end, total_nnz,
                                                   len(chunks))
                c_indices = arena.empty(max(c_end - c_base, 1), self.index_dtype, "C indices")
                c_data = arena.empty(max(c_end - c_base, 1), self.value_dtype, "C values")
                counts = self._numeric_bins(row_begin, row_end - row_begin)
                self._numeric_launches(counts, c_indptr, c_base, c_indices, c_data)
                self._count_numeric_rows(counts)
            with timer.phase("d2h", stream=stream):
                stream.synchronize()
                if c_end > c_base:
                    cuda.memcpy_dtoh(host[1][c_base:c_end], c_indices.ptr)
                    cuda.memcpy_dtoh(host[2][c_base:c_end], c_data.ptr)
            arena.release(c_indices, c_data)
        with timer.phase("d2h", stream=stream):
            cuda.memcpy_dtoh(host[0], c_indptr.ptr)
        arena.release(c_indptr)
        self.c_host = host

    def _scan(self, row_nnz, c_indptr, n, block_sums=None):
        """C's row pointers from the row counts; ``block_sums``: the run's scratch (else one
        taken and given back)."""
        stream, k = self.stream, self.kernels
        grid = grid_1d(n, SCAN_THREADS)
        own = block_sums is None
        if own:
            block_sums = self.arena.empty(grid[0], np.int64, "scan block sums")
        k.scan_blocks.prepared_async_call(grid, (SCAN_THREADS, 1, 1), stream, np.int64(0),
                                          np.int64(n), row_nnz.ptr, c_indptr.ptr,
                                          block_sums.ptr)
        k.scan_block_sums.prepared_async_call((1, 1), (SCAN_THREADS, 1, 1), stream,
                                              block_sums.ptr, np.int64(grid[0]))
        k.scan_add.prepared_async_call(grid, (SCAN_THREADS, 1, 1), stream, np.int64(n),
                                       c_indptr.ptr, block_sums.ptr)
        if own:
            self.arena.release(block_sums)

    def _table_batch(self, rows, sizes, what):
        """One batch of rows for global tables on the device: ``(rows, table offsets, table
        sizes)``, tables of ``sizes`` entries laid out back to back."""
        return (self.arena.to_device(rows, what),
                self.arena.to_device(table_offsets(sizes), "table offsets"),
                self.arena.to_device(sizes, "table sizes"))

    def _symbolic_global(self, fail_rows, n_fail, row_nnz):
        import pycuda.driver as cuda
        rows = np.empty(n_fail, self.index_dtype)
        self.stream.synchronize()
        cuda.memcpy_dtoh(rows, fail_rows.ptr)
        rows.sort()
        bound = np.minimum(self.local.products[rows], self.n_cols_b)
        sizes = next_pow2(np.ceil(bound / SYMBOLIC_LOAD))
        for start, stop in global_batches(sizes, self.index_bytes,
                                          self.params["global_table_bytes"]):
            batch = self._table_batch(rows[start:stop], sizes[start:stop], "overflow rows")
            tables = self.arena.empty(int(sizes[start:stop].sum()), self.index_dtype,
                                      "symbolic global tables")
            rows_dev, offsets_dev, sizes_dev = batch
            self.kernels.symbolic_global.prepared_async_call(
                (stop - start, 1), (GLOBAL_THREADS, 1, 1), self.stream, rows_dev.ptr,
                np.int32(stop - start), self.a["indptr"].ptr, self.a["indices"].ptr,
                self.b["indptr"].ptr, self.b["indices"].ptr, tables.ptr, offsets_dev.ptr,
                sizes_dev.ptr, row_nnz.ptr)
            self.stream.synchronize()
            self.arena.release(*batch, tables)

    def _plan_chunks(self, c_indptr, total_nnz):
        """Row ranges processed one after the other in the numeric phase."""
        import pycuda.driver as cuda
        n = self.n_rows
        entry = self.index_bytes + self.value_bytes
        need = total_nnz * entry
        available = self.budget - self.arena.in_use
        chunk_rows = self.params["chunk_rows"]
        if need <= 0.8 * available and not chunk_rows:
            return [(0, n)]
        indptr = np.empty(n + 1, np.int64)
        cuda.memcpy_dtoh(indptr, c_indptr.ptr)
        per_chunk = max(int(0.5 * available) // entry, 1)
        if need > 0.8 * available:
            self.stats["chunked_for_memory"] = True
        chunks, start = [], 0
        while start < n:
            stop = int(np.searchsorted(indptr, indptr[start] + per_chunk, side="right")) - 1
            stop = max(stop, start + 1)
            if chunk_rows:
                stop = min(stop, start + int(chunk_rows))
            stop = min(stop, n)
            chunks.append((start, stop))
            start = stop
        self._chunk_indptr = indptr
        return chunks

    def _chunk_bounds(self, c_indptr, row_begin, row_end, total_nnz, n_chunks):
        if n_chunks == 1:
            return 0, total_nnz
        return int(self._chunk_indptr[row_begin]), int(self._chunk_indptr[row_end])

    def _numeric_bins(self, row_begin, n, c_indptr=None):
        """Bin rows row_begin .. + n - 1 by their output size and scatter them; returns the
        bin sizes (tables, dense rows of the tables' range, dense windows of long rows, global
        tables), read back together with nnz(C) (into ``scalar_host[0]``) when ``c_indptr`` is
        given."""
        import pycuda.driver as cuda
        stream = self.stream
        n_bins = len(self.num_bins) + 3
        cuda.memset_d32_async(self.bin_counts.ptr, 0, 32, stream)
        self.kernels.numeric_bins.prepared_async_call(
            grid_1d(n, BLOCK_THREADS), (BLOCK_THREADS, 1, 1), stream, np.int64(row_begin),
            np.int64(n), self.row_nnz.ptr, self.num_limits_dev.ptr, np.int32(n_bins),
            np.int64(self.n_cols_b), np.int64(self.short_ratio), np.int64(self.window_ratio),
            self.row_bin.ptr, self.bin_counts.ptr)
        self._bin_rows(row_begin, n, n_bins)
        if c_indptr is not None:
            cuda.memcpy_dtoh_async(self.scalar_host[:1], c_indptr.ptr + n * 8, stream)
        counts = self._read_counts(n_bins)
        rows = self.stats.get("numeric_bin_rows") or [0] * n_bins
        self.stats["numeric_bin_rows"] = [x + int(y) for x, y in zip(rows, counts)]
        return counts

    def _count_numeric_rows(self, counts):
        """Add the rows of numeric bin sizes ``counts`` to the repeat's stats: rows above the
        largest shared table (dense windows and global tables) and rows on the dense window
        kernel. The callers count, not :meth:`_numeric_launches`: a replayed graph of those
        launches runs no Python."""
        tables = len(self.num_bins)
        n_short, n_window, n_global = (int(x) for x in counts[tables:tables + 3])
        self.stats["numeric_global_rows"] += n_window + n_global
        self.stats["numeric_dense_rows"] += n_short + n_window

    def _numeric_launches(self, counts, c_indptr, c_base, c_indices, c_data, row_nnz_out=None):
        """The numeric kernels of the binned rows (``self.bin_rows``, bins of ``counts``):
        shared tables, then dense column windows, then global tables for the long rows. With
        ``row_nnz_out`` (the bounded-output pass) ``c_indptr`` holds each row's slot and the
        kernels write each row's entry count there; no row takes a global table then."""
        import pycuda.driver as cuda
        stream, arena, k = self.stream, self.arena, self.kernels
        a, b = self.a, self.b
        tables = len(self.num_bins)
        counts_out = 0 if row_nnz_out is None else row_nnz_out.ptr
        for index, grid, block, rows_ptr, size, group, table in self._bin_launches(
                self.num_bins, counts):
            rank = self.num_rank[index]
            k.numeric_shared.prepared_async_call(
                grid, (block, 1, 1), stream, rows_ptr, np.int32(size), a["indptr"].ptr,
                a["indices"].ptr, a["data"].ptr, b["indptr"].ptr, b["indices"].ptr,
                b["data"].ptr, np.int32(group), np.int32(table),
                np.int32(self.rank_words if rank else 0), np.int32(self.balanced and group > 32),
                c_indptr.ptr, np.int64(c_base), c_indices.ptr, c_data.ptr, counts_out,
                shared_size=int(self._num_shared_bytes(table, group, block, rank)))
        n_short, n_window, n_global = (int(x) for x in counts[tables:tables + 3])
        short_ptr = self.bin_rows.ptr + int(counts[:tables].sum()) * self.index_bytes
        window_ptr = short_ptr + n_short * self.index_bytes
        for rows_ptr, size, threads in ((short_ptr, n_short, SHORT_DENSE_THREADS),
                                        (window_ptr, n_window, GLOBAL_THREADS)):
            if size:
                k.numeric_window.prepared_async_call(
                    (size, 1), (threads, 1, 1), stream, rows_ptr, np.int32(size),
                    a["indptr"].ptr, a["indices"].ptr, a["data"].ptr, b["indptr"].ptr,
                    b["indices"].ptr, b["data"].ptr, np.int64(self.n_cols_b),
                    np.int32(self.window_cols), np.int32(self.balanced),
                    np.int32(self.window_search), c_indptr.ptr, np.int64(c_base),
                    c_indices.ptr, c_data.ptr, counts_out, shared_size=int(self.window_bytes))
        if not n_global:
            return
        rows = np.empty(n_global, self.index_dtype)
        stream.synchronize()
        cuda.memcpy_dtoh(rows, window_ptr + n_window * self.index_bytes)
        rows.sort()
        nnz_host = np.empty(self.n_rows, self.index_dtype)
        cuda.memcpy_dtoh(nnz_host, self.row_nnz.ptr)
        sizes = next_pow2(2 * nnz_host[rows].astype(np.int64))
        entry = self.index_bytes + self.value_bytes
        for start, stop in global_batches(sizes, entry, self.params["global_table_bytes"]):
            batch = self._table_batch(rows[start:stop], sizes[start:stop], "long rows")
            total = int(sizes[start:stop].sum())
            keys = arena.empty(total, self.index_dtype, "numeric global keys")
            values = arena.empty(total, self.value_dtype, "numeric global values")
            rows_dev, offsets_dev, sizes_dev = batch
            k.numeric_global.prepared_async_call(
                (stop - start, 1), (GLOBAL_THREADS, 1, 1), stream, rows_dev.ptr,
                np.int32(stop - start), a["indptr"].ptr, a["indices"].ptr, a["data"].ptr,
                b["indptr"].ptr, b["indices"].ptr, b["data"].ptr, keys.ptr, values.ptr,
                offsets_dev.ptr, sizes_dev.ptr, c_indptr.ptr, np.int64(c_base),
                c_indices.ptr, c_data.ptr, np.int32(self.balanced))
            stream.synchronize()
            arena.release(*batch, keys, values)

    # -- after the repeats: C to the host, or its checksums ---------------------------------
    def local_result(self):
        """This rank's rows of C on the host: ``(indptr int64, indices, data)``, copied from the
        device through two pinned staging buffers (one fills while the other drains)."""
        if self.c_device is None:
            return self.c_host
        import pycuda.driver as cuda
        nnz = int(self.stats["nnz_c"])
        host = (np.empty(self.n_rows + 1, np.int64), np.empty(nnz, self.index_dtype),
                np.empty(nnz, self.value_dtype))
        largest = max(array.nbytes for array in host)
        staging = [cuda.pagelocked_empty(min(STAGING_BYTES, largest), np.uint8)
                   for _ in range(2)]
        try:
            self.stream.synchronize()
            for device, target in zip(self.c_device, host):
                staged_download(device.ptr, target, self.stream, STAGING_BYTES, staging)
        finally:
            for buffer in staging:
                free_pinned(buffer)
        return host

    def checksums(self):
        """``(row_nnz int64, row_sums, row_weighted_sums)`` of the local C (float64; see
        :mod:`.checksums`), the sums computed on the device (one warp per row)."""
        if self.c_device is None:
            return host_checksums(*self.c_host)
        import pycuda.driver as cuda
        n = self.n_rows
        c_indptr, c_indices, c_data = self.c_device
        sums = self.arena.empty(n, np.float64, "row sums")
        weighted = self.arena.empty(n, np.float64, "row weighted sums")
        self.kernels.row_checksums.prepared_async_call(
            grid_1d(n * 32, BLOCK_THREADS), (BLOCK_THREADS, 1, 1), self.stream, np.int64(n),
            c_indptr.ptr, c_indices.ptr, c_data.ptr, sums.ptr, weighted.ptr)
        indptr = np.empty(n + 1, np.int64)
        host_sums = np.empty(n, np.float64)
        host_weighted = np.empty(n, np.float64)
        self.stream.synchronize()
        cuda.memcpy_dtoh(indptr, c_indptr.ptr)
        cuda.memcpy_dtoh(host_sums, sums.ptr)
        cuda.memcpy_dtoh(host_weighted, weighted.ptr)
        self.arena.release(sums, weighted)
        return np.diff(indptr), host_sums, host_weighted

    def sample(self, positions):
        """Local rows ``positions`` of C: ``(indptr int64, indices, data)`` (a few small copies
        from the device)."""
        if self.c_device is None:
            return take_rows(*self.c_host, positions)
        import pycuda.driver as cuda
        c_indptr, c_indices, c_data = self.c_device
        indptr = np.empty(self.n_rows + 1, np.int64)
        self.stream.synchronize()
        cuda.memcpy_dtoh(indptr, c_indptr.ptr)
        starts, taken = row_spans(indptr, positions)
        indices = np.empty(int(taken[-1]), self.index_dtype)
        data = np.empty(int(taken[-1]), self.value_dtype)
        for first, lo, hi in zip(starts.tolist(), taken[:-1].tolist(), taken[1:].tolist()):
            if hi > lo:
                cuda.memcpy_dtoh(indices[lo:hi], c_indices.ptr + first * self.index_bytes)
                cuda.memcpy_dtoh(data[lo:hi], c_data.ptr + first * self.value_bytes)
        return taken, indices, data

    def free_result(self):
        if self.c_device is not None and self.c_device is not self.bounded_c:
            self.arena.release(*self.c_device)  # the bounded pass's buffers stay for the run
        self.c_device = None
        self.c_host = None

    def free(self):
        """Release every device and pinned buffer while this rank's context is current."""
        self.free_result()
        if self.graphs is not None:
            self.graphs.free()  # before the buffers its nodes point at
            self.graphs = None
        self.a = self.b = self.sym_limits_dev = self.num_limits_dev = None
        self.bound_offsets = self.pack_group_rows = self.pack_progress = None
        self.bounded_c = self.scan_sums = None
        self.row_bin = self.row_nnz = self.bin_rows = self.bin_counts = None
        super().free()  # A, B, bin limits and work arrays, then the arena's cache to the driver
        for name in ("counts_host", "scalar_host"):
            free_pinned(getattr(self, name, None))
            setattr(self, name, None)


ENGINES = {None: GpuSpgemmEngine}
