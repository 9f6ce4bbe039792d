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

The host-side planning (table sizes, bins, batches of global tables, the bounded pass's layout)
is :mod:`.plan`, pure NumPy, tested without a GPU; the operation resolves it from the run's
parameters before the engine uploads.
"""
import numpy as np

from ...gpu import KernelTable, grid_1d, type_defines
from ...gpu import free_pinned, staged_download
from .. import GpuEngine
from .checksums import host_checksums, row_spans, take_rows
from .plan import (BLOCK_THREADS, GLOBAL_THREADS, SCAN_THREADS, SHORT_DENSE_THREADS,
                   SYMBOLIC_LOAD, WIDEST_GROUP, global_batches, next_pow2, num_shared_bytes,
                   plan_bounded, sym_shared_bytes, table_offsets)

#: bytes of each of the two pinned buffers that stage C on its way to the host (collect)
STAGING_BYTES = 64 << 20

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
        self.bounded_refusal = None
        self.bound_offsets = self.pack_group_rows = self.pack_progress = None
        self.bounded_c = self.scan_sums = self.graphs = None
        self.stats = {}

    # -- setup --------------------------------------------------------------------------------
    @staticmethod
    def device_limits():
        """``(opt-in shared bytes per block, multiprocessors)`` of this rank's device: what
        :func:`~.plan.plan_kernels` sizes the tables and bins by."""
        import pycuda.driver as cuda
        device = cuda.Context.get_device()
        attribute = cuda.device_attribute
        return (device.get_attribute(attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
                device.get_attribute(attribute.MULTIPROCESSOR_COUNT))

    def upload(self, plan):
        """Load the kernels, upload A and B and the plan's bins, allocate the repeats' work
        arrays and lay out the bounded-output pass where ``plan`` (a
        :class:`~.plan.KernelPlan`, resolved and checked by the operation) and the memory left
        allow it. A ``bounded_output: true`` that cannot apply is left in
        ``bounded_refusal`` for the operation to report."""
        import pycuda.driver as cuda
        # the launch code reads the plan's figures as the engine's own
        self.plan = plan
        vars(self).update(vars(plan))
        self.kernels = KERNELS.load(self.ctx, type_defines(self.value_dtype, self.index_dtype,
                                                           B_TEAM=self.team_lanes))
        self._raise_shared_limits()
        self.stream = cuda.Stream()
        # The long rows' kernels (a block per row) run on a side stream beside the table bins.
        self.long_stream = cuda.Stream()
        no_timing = cuda.event_flags.DISABLE_TIMING
        self.long_forked, self.long_done = cuda.Event(no_timing), cuda.Event(no_timing)
        self.a = self._upload_csr(self.local.a, "A (local rows)")
        self.b = self.a if self.local.b_is_a else self._upload_csr(self.local.b, "B")
        # Device limits for the symbolic/numeric bins, and pinned buffers for small read-backs.
        self.sym_limits_dev = self.arena.to_device(self.sym_limits, "bin limits")
        self.num_limits_dev = self.arena.to_device(self.num_limits, "bin limits")
        self.counts_host = cuda.pagelocked_zeros(64, np.int32)
        self.scalar_host = cuda.pagelocked_zeros(2, np.int64)
        # per-row work arrays kept across repeats (O(rows))
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

    def _raise_shared_limits(self):
        """Raise the dynamic shared-memory limit of the table kernels to what the bins use."""
        import pycuda.driver as cuda
        k, attr = self.kernels, cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES
        k.symbolic_shared.set_attribute(attr, int(self.sym_shared_max))
        k.numeric_shared.set_attribute(attr, int(self.num_shared_max))
        k.numeric_window.set_attribute(attr, int(self.window_bytes))
        if self.dense_ok:
            k.symbolic_dense.set_attribute(attr, int(self.dense_bytes))

    def _plan_bounded_output(self):
        """Whether the repeats skip the symbolic pass (``bounded_output``), and if so their fixed
        plan on the device (:func:`~.plan.plan_bounded`): rows listed by the numeric bin of
        their bound (``bin_rows``, ``bounded_counts``), each row's slot in the bound-sized
        buffer (``bound_offsets``), row counts zeroed once (rows without products keep 0), the
        packing groups, C's buffers for the run (``bounded_c``) and the repeat recorded as a
        CUDA graph (``gpu.graphs``)."""
        import pycuda.driver as cuda
        params = self.params
        layout, self.bounded_refusal = plan_bounded(
            self.local.products, self.plan, params["bounded_output"], params["chunk_rows"],
            self.budget - self.arena.in_use)
        if layout is None:
            return False
        if len(layout.order):
            cuda.memcpy_htod(self.bin_rows.ptr, layout.order)
        self.bounded_counts = layout.counts
        self.bound_total = layout.total
        self.bound_offsets = self.arena.to_device(layout.offsets, "bounded row slots")
        cuda.memset_d8(self.row_nnz.ptr, 0, self.row_nnz.nbytes)
        self.pack_capacity = layout.capacity
        self.pack_group_rows = self.arena.to_device(layout.groups, "packing groups")
        self.pack_progress = self.arena.empty(len(layout.groups), np.int32, "packing progress")
        self.kernels.compact_rows.set_attribute(
            cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
            int(layout.capacity * (self.index_bytes + self.value_bytes)))
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
        return sym_shared_bytes(table, group, block, self.index_bytes)

    def _num_shared_bytes(self, table, group, block, rank=False):
        return num_shared_bytes(table, group, block, rank, self.index_bytes + self.value_bytes,
                                self.n_cols_b)

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
            c_indptr = self._symbolic(counts)

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

    def _fork_long_rows(self):
        """The side stream starts from the engine's stream as it is now; returns it. The long
        rows' kernels, launched there first, run a block per row: on the engine's stream they
        ran alone (a hub row of R-MAT 18, 429k products, about a quarter of a rank's work at 4
        ranks, on one SM while the others idled), beside the table bins they overlap them."""
        self.long_forked.record(self.stream)
        self.long_stream.wait_for_event(self.long_forked)
        return self.long_stream

    def _join_long_rows(self):
        """The engine's stream waits for the side stream's launches."""
        self.long_done.record(self.long_stream)
        self.stream.wait_for_event(self.long_done)

    def _symbolic(self, counts):
        """The symbolic pass over the binned rows (symbolic bins of ``counts``): long rows in a
        shared column bitmap (or the largest table, then global tables for the rows that
        overflow it), the others in shared tables; then C's row pointers scanned from the
        counts (returned, on the device)."""
        import pycuda.driver as cuda
        stream, arena, k = self.stream, self.arena, self.kernels
        a, b, row_nnz, n = self.a, self.b, self.row_nnz, self.n_rows
        long_rows = int(counts[-1])
        long_ptr = self.bin_rows.ptr + int(counts[:-1].sum()) * self.index_bytes
        beside = bool(long_rows and self.dense_ok)
        if beside:
            k.symbolic_dense.prepared_async_call(
                (long_rows, 1), (self.dense_threads, 1, 1), self._fork_long_rows(), long_ptr,
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
        if beside:
            self._join_long_rows()
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
        return c_indptr

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
        dense column windows (a block per row, on the side stream) beside the shared tables,
        then global tables for the long rows. With
        ``row_nnz_out`` (the bounded-output pass) ``c_indptr`` holds each row's slot and the
        kernels write each row's entry count there; no row takes a global table then."""
        import pycuda.driver as cuda
        stream, arena, k = self.stream, self.arena, self.kernels
        a, b = self.a, self.b
        tables = len(self.num_bins)
        counts_out = 0 if row_nnz_out is None else row_nnz_out.ptr
        n_short, n_window, n_global = (int(x) for x in counts[tables:tables + 3])
        short_ptr = self.bin_rows.ptr + int(counts[:tables].sum()) * self.index_bytes
        window_ptr = short_ptr + n_short * self.index_bytes
        # The dense-window rows (a block per row) first, on the side stream, beside the bins.
        long_stream = self._fork_long_rows() if n_short or n_window else None
        for rows_ptr, size, threads in ((short_ptr, n_short, SHORT_DENSE_THREADS),
                                        (window_ptr, n_window, GLOBAL_THREADS)):
            if size:
                k.numeric_window.prepared_async_call(
                    (size, 1), (threads, 1, 1), long_stream, rows_ptr, np.int32(size),
                    a["indptr"].ptr, a["indices"].ptr, a["data"].ptr, b["indptr"].ptr,
                    b["indices"].ptr, b["data"].ptr, np.int64(self.n_cols_b),
                    np.int32(self.window_cols), np.int32(self.balanced),
                    np.int32(self.window_search), c_indptr.ptr, np.int64(c_base),
                    c_indices.ptr, c_data.ptr, counts_out, shared_size=int(self.window_bytes))
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
        if long_stream is not None:
            self._join_long_rows()
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
        self.long_stream = None
        super().free()  # A, B, bin limits and work arrays, then the arena's cache to the driver
        for name in ("counts_host", "scalar_host"):
            free_pinned(getattr(self, name, None))
            setattr(self, name, None)


ENGINES = {None: GpuSpgemmEngine}
