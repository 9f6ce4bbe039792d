"""Host-side plan of the GPU SpGEMM engine (pure NumPy, tested without a GPU): the kernels' hash
table sizes and bins, the walk's lane teams, the dense windows, the batches of global tables, and
the bounded-output pass's fixed layout.

:func:`plan_kernels` resolves the run's ``operation.params`` against the local rows, B and the
device's limits into a :class:`KernelPlan`, before the engine exists (:meth:`SpGEMM.upload`
checks it: a forced path that cannot apply is a ConfigError there, naming its key); the engine
only uploads and launches what the plan says. :func:`plan_bounded` lays the bounded-output pass
out once the memory left after the upload is known.
"""
from dataclasses import dataclass

import numpy as np

from ...formats import rows_sorted

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
#: launches and the mid-repeat read-back of nnz(C) cost more than the symbolic work saves (the
#: cap's measurements: docs/ops/spgemm.md, "The cap, measured")
BOUNDED_OUTPUT_BYTES = 128 << 20
#: slot entries one block of compact_rows packs at least (it holds them in shared memory; more
#: when a row's bound is larger)
PACK_GROUP_ENTRIES = 2048
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


def sym_shared_bytes(table, group, block, index_bytes):
    """Dynamic shared bytes of a symbolic_shared block: its groups' tables and counters."""
    groups = block // group
    return groups * table * index_bytes + groups * 8


def num_shared_bytes(table, group, block, rank, entry_bytes, n_cols):
    """Dynamic shared bytes of a numeric_shared block: its groups' tables of ``entry_bytes``
    entries, plus a column bitmap per row where the bin writes by rank."""
    per_row = table * entry_bytes
    if rank:
        per_row += rank_bytes(n_cols)
    return (block // group) * per_row


@dataclass
class KernelPlan:
    """What the GPU engine launches, resolved from ``operation.params``, the local rows, B and the
    device's limits (:func:`plan_kernels`). The engine takes every field as its own attribute.

    Attributes
    ----------
    value_dtype, index_dtype : numpy.dtype
    index_bytes, value_bytes : int
    n_rows, n_cols_b : int
        Local rows of A; columns of B.
    shared_limit, target_warps : int
        Opt-in shared bytes per block; warps that fill the device.
    team_lanes, product_lanes : int
        Lanes per B row walked (``B_TEAM``); lanes per row counting products.
    balanced : bool
        Products dealt to a group's warps (``balanced_products``).
    sym_bins, num_bins : list of (table, group, block)
    sym_limits, num_limits : ndarray of int64
    num_rank : list of bool
        Numeric bins that write by rank in a column bitmap.
    rank_words : int
    dense_bytes, dense_threads : int
    dense_ok : bool
        Long rows counted in a shared column bitmap (symbolic_dense).
    window_ratio, window_cols, window_bytes, short_ratio : int
    window_search : bool
    search_refused : bool
        ``window_search: true`` asked where B's rows are not sorted.
    sym_shared_max, num_shared_max : int
        The table kernels' largest dynamic shared memory.
    sym_counts : ndarray of int64
        Rows per symbolic bin (:func:`symbolic_bin_counts`).
    """

    value_dtype: object
    index_dtype: object
    index_bytes: int
    value_bytes: int
    n_rows: int
    n_cols_b: int
    shared_limit: int
    target_warps: int
    team_lanes: int
    product_lanes: int
    balanced: bool
    sym_bins: list
    num_bins: list
    sym_limits: np.ndarray
    num_limits: np.ndarray
    num_rank: list
    rank_words: int
    dense_bytes: int
    dense_threads: int
    dense_ok: bool
    window_ratio: int
    window_cols: int
    window_bytes: int
    short_ratio: int
    window_search: bool
    search_refused: bool
    sym_shared_max: int
    num_shared_max: int
    sym_counts: np.ndarray


def _walk(local, params):
    """The walk's lanes and whether products are dealt to the warps."""
    a, b = local.a, local.b
    # Teams of this many lanes walk one B row each (B_TEAM), sized to the B rows the products
    # walk: uniformly short rows keep a warp busy with several teams, while on power-law B the
    # long rows hold most products and want the whole warp (docs/ops/spgemm.md).
    weighted_length = product_weighted_row_length(a.indices, b.indptr)
    balanced = params["balanced_products"]
    return {"team_lanes": int(params["team_lanes"] or lanes_for_mean(weighted_length)),
            "product_lanes": lanes_for_mean(float(np.mean(np.diff(a.indptr)))
                                            if a.nrows else 1.0),
            "balanced": bool(skewed_rows(a.indices, b.indptr, weighted_length)
                             if balanced is None else balanced)}


def _tables(b, params, index_bytes, value_bytes, shared_limit):
    """The shared tables of both passes, their bins and the dense bitmap of long rows."""
    row_lanes = lanes_for_mean(b.nnz / b.nrows if b.nrows else 1.0)
    cap = params["max_shared_table"]
    num_max = largest_table(index_bytes + value_bytes, shared_limit, cap)
    # One more symbolic bin than tables: rows whose bound passes the largest table's load,
    # counted with a shared column bitmap when B is narrow enough, else tried in the largest
    # table (overflowing rows are redone with global tables). A hash table larger than the
    # bitmap counts no faster than the bitmap, so the tables stop at the bitmap's size.
    dense_bytes = 4 * ((b.ncols + 31) // 32)
    dense_ok = bool(params["dense_long_rows"]) and dense_bytes <= shared_limit - STATIC_SHARED
    sym_max = largest_table(index_bytes, shared_limit, cap)
    if dense_ok:
        sym_max = largest_table(index_bytes, dense_bytes + 64, sym_max)
    sym_bins, num_bins = bin_layout(sym_max, row_lanes), bin_layout(num_max, row_lanes)
    # The numeric phase has three more bins than tables: dense rows of the tables' range (B
    # fitting one window), rows above the largest table for dense column windows (when
    # ncols(B) <= dense_columns_per_output x their output), and the others for global tables.
    entry = index_bytes + value_bytes
    num_rank = [uses_rank(t, g, blk, entry, b.ncols, shared_limit) for t, g, blk in num_bins]
    return {"dense_bytes": dense_bytes, "dense_ok": dense_ok,
            "dense_threads": GLOBAL_THREADS if dense_bytes > SMALL_BITMAP_BYTES
            else SMALL_BITMAP_THREADS,
            "sym_bins": sym_bins, "num_bins": num_bins,
            "sym_limits": bin_limits(sym_bins, SYMBOLIC_LOAD),
            "num_limits": bin_limits(num_bins, NUMERIC_LOAD), "num_rank": num_rank,
            "rank_words": rank_words(b.ncols),
            "sym_shared_max": max(sym_shared_bytes(t, g, blk, index_bytes)
                                  for t, g, blk in sym_bins),
            "num_shared_max": max(num_shared_bytes(t, g, blk, rank, entry, b.ncols)
                                  for (t, g, blk), rank in zip(num_bins, num_rank))}


def _windows(local, params, value_bytes, shared_limit, num_limits):
    """The dense column windows of long rows and whether each window searches its products."""
    b = local.b
    window_ratio = int(params["dense_columns_per_output"]) if params["dense_long_rows"] else 0
    window_cols = window_columns(value_bytes, b.ncols, shared_limit)
    # Several windows and rows that may take them (products beyond the largest table): with B's
    # rows sorted by column each window walks only its own products.
    long_products = len(local.products) and int(np.max(local.products)) > num_limits[-2]
    search = params["window_search"]
    windows = bool(window_ratio) and b.ncols > window_cols
    # checked once, and only where a search could be asked for or chosen
    b_sorted = windows and (search or (search is None and long_products)) and \
        rows_sorted(b.indptr, b.indices)
    return {"window_ratio": window_ratio, "window_cols": window_cols,
            # B fits one window: rows of the tables' range whose output is dense in B's
            # columns take the dense accumulator too (no hashing), with smaller blocks.
            "short_ratio": SHORT_DENSE_RATIO if window_ratio and b.ncols <= window_cols else 0,
            "window_bytes": window_cols * value_bytes + window_cols // 8,
            "window_search": bool(b_sorted),
            "search_refused": bool(windows and search and not b_sorted)}


def plan_kernels(local, params, shared_limit, multiprocessors):
    """The :class:`KernelPlan` of ``local`` (a :class:`~.op.SpgemmLocal`) under ``params``
    (``operation.params``) on a device of ``shared_limit`` opt-in shared bytes per block and
    ``multiprocessors`` SMs."""
    a, b = local.a, local.b
    index_bytes, value_bytes = a.indices.dtype.itemsize, a.data.dtype.itemsize
    tables = _tables(b, params, index_bytes, value_bytes, shared_limit)
    return KernelPlan(
        value_dtype=a.data.dtype, index_dtype=a.indices.dtype, index_bytes=index_bytes,
        value_bytes=value_bytes, n_rows=a.nrows, n_cols_b=b.ncols, shared_limit=shared_limit,
        # enough warps to fill the device: a bin with fewer rows gives each row more warps
        target_warps=TARGET_WARPS_PER_SM * multiprocessors,
        sym_counts=symbolic_bin_counts(local.products, b.ncols, tables["sym_limits"]),
        **_walk(local, params), **tables,
        **_windows(local, params, value_bytes, shared_limit, tables["num_limits"]))


@dataclass
class BoundedPlan:
    """The bounded-output pass's fixed layout (:func:`plan_bounded`).

    Attributes
    ----------
    order : ndarray of the index dtype
        Rows with products, listed by the numeric bin of their bound.
    counts : ndarray of int64
        Rows per numeric bin.
    offsets : ndarray of int64, (n_rows + 1,)
        Each row's slot in the bound-sized buffer.
    groups : ndarray of int64
        The packing groups' first rows (:func:`pack_groups`).
    capacity : int
        Slot entries one packing block holds.
    """

    order: np.ndarray
    counts: np.ndarray
    offsets: np.ndarray
    groups: np.ndarray
    capacity: int

    @property
    def total(self):
        return int(self.offsets[-1])


def plan_bounded(products, plan, choice, chunk_rows, room):
    """Whether the repeats skip the symbolic pass (``bounded_output``: ``choice``) and, if so,
    their layout: ``(BoundedPlan or None, refusal)``. ``refusal`` says why ``choice: true``
    cannot apply (None otherwise); ``room``: device bytes left in the memory budget after the
    upload. Each row is computed into a slot of min(products, ncols(B)) entries, C packed in
    place: taken by ``null`` when no row needs a global table and the slots take at most
    ``BOUNDED_OUTPUT_BYTES``."""
    if choice is False or plan.n_rows == 0:
        return None, None
    bound = np.minimum(products, plan.n_cols_b).astype(np.int64)
    bins = numeric_bin_index(bound, plan.num_limits, plan.n_cols_b, plan.short_ratio,
                             plan.window_ratio)
    entry = plan.index_bytes + plan.value_bytes
    slot_bytes = int(bound.sum()) * entry
    # C is packed in place: the slots are its buffer
    fits = slot_bytes <= 0.8 * room
    global_rows = int(np.count_nonzero(bins == len(plan.num_bins) + 2))
    # a block of compact_rows holds a group of rows, at least the longest, in shared memory
    capacity = max(PACK_GROUP_ENTRIES, -(-int(bound.max()) // 32) * 32)
    pack_fits = capacity * entry <= plan.shared_limit - STATIC_SHARED
    why_not = ("rows beyond the shared tables and the dense windows need the exact "
               f"counts of the symbolic pass ({global_rows} rows)" if global_rows else
               "operation.params.chunk_rows asks for row chunks" if chunk_rows else
               f"the bound-sized buffer ({slot_bytes} bytes) does not fit the memory budget"
               if not fits else
               f"a row's bound ({int(bound.max())} entries) is more than one block packs"
               if not pack_fits else None)
    if choice is None and (why_not or slot_bytes > BOUNDED_OUTPUT_BYTES):
        return None, None
    if why_not:
        return None, why_not
    listed = np.flatnonzero(bins >= 0)
    order = listed[np.argsort(bins[listed], kind="stable")].astype(plan.index_dtype)
    offsets = np.zeros(plan.n_rows + 1, np.int64)
    np.cumsum(bound, out=offsets[1:])
    return BoundedPlan(order, np.bincount(bins[listed], minlength=len(plan.num_bins) + 3),
                       offsets, pack_groups(bound, capacity), capacity), None
