"""CSR5 on the current GPU (``kernels_cu/spmv_csr5.cu``): the conversion from a resident CSR block
and the product, shared by every engine that multiplies a CSR5 block (SpMV's local and ghost
blocks, SpTV's CSR5 engine)."""
import time

import numpy as np

from ..errors import HisparseError
from ..formats import CSR5Matrix, OMEGA, descriptor_layout
from ._kernels import KernelTable, c_type, grid_1d, type_defines

CSR5_KERNELS = KernelTable("spmv_csr5", [
    "csr5_tile_ptr", "csr5_tile_desc", "csr5_tile_totals", "csr5_tile_scan", "csr5_empty_offset",
    "csr5_mark_empty", "csr5_transpose", "csr5_narrow_columns", "csr5_spmv", "csr5_calibrate"])


#: the largest column count whose indices the product reads as 16-bit (``COL_T``)
NARROW_COLUMNS_MAX = 1 << 16


def csr5_column_dtype(matrix, narrow=None):
    """The product's column index dtype: ``uint16`` when every column index fits (``narrow``
    None: decided by the column count; False keeps the index dtype), else the index dtype."""
    columns = int(matrix.shape[1])
    if narrow is None:
        narrow = columns <= NARROW_COLUMNS_MAX
    elif narrow and columns > NARROW_COLUMNS_MAX:
        raise HisparseError(f"operation.params.narrow_columns: 16-bit column indices need at most "
                            f"{NARROW_COLUMNS_MAX:,} columns; this one has {columns:,}")
    return np.dtype(np.uint16) if narrow else np.dtype(matrix.indices.dtype)


def csr5_defines(matrix, sigma, narrow=None, uniform=False):
    """The ``-D`` macros of ``spmv_csr5.cu`` for ``matrix``'s dtypes and tile height ``sigma``
    (``narrow``: see :func:`csr5_column_dtype`; ``uniform``: every value of ``matrix`` is the
    same and the format keeps it once, :func:`~hisparse.formats._csr.uniform_value`)."""
    extra = {"SIGMA": int(sigma)}
    column_dtype = csr5_column_dtype(matrix, narrow)
    if column_dtype != matrix.indices.dtype:
        extra["COL_T"] = c_type(column_dtype)
    if uniform:
        extra["UNIFORM_VALUES"] = 1
    return type_defines(matrix.data.dtype, matrix.indices.dtype, **extra)


class Csr5Device:
    """CSR5 on the current GPU: conversion from a resident CSR block and the product.

    Parameters
    ----------
    kernels : hisparse.gpu.Kernels
        :data:`CSR5_KERNELS` loaded with :func:`csr5_defines` of ``matrix``, ``sigma`` and
        ``narrow``.
    matrix : CSRMatrix
        The host copy of the block: shape, nnz and dtypes (its row pointers only serve
        :meth:`to_host`).
    sigma : int
    stream : pycuda.driver.Stream
    arena : hisparse.gpu.DeviceArena
        Where the format's device arrays are allocated.
    narrow : bool or None
        Whether the product reads 16-bit column indices (:func:`csr5_column_dtype`).
    uniform : ndarray or None
        The one value of every nonzero (a 1-element array, ``formats._csr.uniform_value``)
        when the kernels were loaded with ``uniform=True``: :meth:`convert` then takes it as
        ``data`` instead of an nnz-long array, and the product reads no values.

    Notes
    -----
    Conversion runs on the GPU, ``offset_ptr`` and the calibration chains included (a scan over
    the tiles in two launches); the host reads back four numbers only (array and launch sizes).
    """

    BLOCK = 256
    #: threads per block of ``csr5_tile_totals`` / ``csr5_tile_scan`` (``SCAN_THREADS`` in
    #: ``spmv_csr5.cu``)
    SCAN_THREADS = 512
    #: calibration chains of more terms than this take a warp each, the others a thread
    LONG_CHAIN_TERMS = 32
    #: a tile with more rows than this strictly inside its row range (a long run of empty rows:
    #: a checkerboard block's owned rows in degree order, the empty ones last, before its other
    #: rows; or a matrix's own empty block rows) leaves their zeros to a thread per row of the
    #: product's last blocks; one warp walked 2M of them in 0.17 s (R-MAT 23, 2 ranks)
    WIDE_SPAN = 1024

    def __init__(self, kernels, matrix, sigma, stream, arena, narrow=None, uniform=None):
        self.matrix, self.sigma, self.stream, self.arena = matrix, int(sigma), stream, arena
        self.uniform = uniform
        self.index_dtype, self.value_dtype = matrix.indices.dtype, matrix.data.dtype
        self.column_dtype = csr5_column_dtype(matrix, narrow)
        self.tile = OMEGA * self.sigma
        self.num_packet = descriptor_layout(self.sigma)[1]
        self.nnz, (self.m, self.n) = matrix.nnz, matrix.shape
        self.tiles = self.nnz // self.tile
        self.tail_start = self.tiles * self.tile
        self.kernels = kernels
        # Longest row (host pointers): a row of L entries adds at most L / tile + 2 calibrator
        # terms, so without a row of more than LONG_CHAIN_TERMS - 2 tiles every chain is short
        # and the conversion lists no long ones (no read-back of the chains).
        indptr = np.asarray(matrix.indptr)
        longest = int(np.max(indptr[1:] - indptr[:-1])) if len(indptr) > 1 else 0
        self.may_have_long_chains = longest // self.tile + 2 > self.LONG_CHAIN_TERMS
        self.n_long = 0
        self.n_wide = self.wide_rows = 0  # the wide tiles (_list_wide_tiles)
        self.signatures = CSR5_KERNELS.signatures(
            csr5_defines(matrix, self.sigma, narrow, uniform is not None))
        self.arrays = {}
        self._summary = None  # page-locked host copy of csr5_tile_scan's summary (see load)

    def _launch(self, name, threads, *args, block=BLOCK):
        # A zero-size GPUArray made outside an arena has no allocation (gpudata None), and absent
        # scratch is None: pass a null pointer.
        args = [0 if arg is None else arg for arg in args]
        self.kernels[name].prepared_async_call(grid_1d(threads, block), (block, 1, 1),
                                               self.stream, *args)

    def load(self):
        """Launch every kernel once on empty work, so that the driver's lazy loading of the
        module's functions happens here and not inside the timed conversion; also allocate the
        page-locked buffer the conversion's summary is read back into."""
        import pycuda.driver as cuda
        self._summary = cuda.pagelocked_empty(4, np.int64)
        # Counts 0 and every pointer at one zeroed scratch block: a kernel on empty work may
        # still read a row pointer or write a total (csr5_tile_scan does both).
        scratch = self.arena.zeros(64, np.int64, "csr5 load scratch", stream=self.stream)
        for name in CSR5_KERNELS.names:
            zero = {"q": np.int64(0), "i": np.int32(0)}
            args = [zero.get(kind, scratch.gpudata) for kind in self.signatures[name]]
            self.kernels[name].prepared_async_call((1, 1), (32, 1, 1), self.stream, *args)
        self.stream.synchronize()
        self.arena.release(scratch)

    def convert(self, indptr, indices, data):
        """Build CSR5 from the device CSR arrays (GPUArrays). ``indices`` and ``data`` are
        transposed in place and become the format's ``col_idx`` / ``val`` (with ``uniform``,
        ``data`` is the one value and stays as it is); the format keeps
        references to all three (``indices`` is given back for a 16-bit copy when the column
        dtype is narrow). Synchronises the stream once, when the four numbers the host
        needs (the sizes of ``empty_offset`` and of the calibration, the tail's rows) are back;
        a matrix whose tiles have empty rows then builds their segment -> row map and waits once
        more.

        ``self.convert_steps`` receives the wall seconds of the three steps: ``launch``
        (allocations and launches: tile_ptr, descriptors, the in-place transpose and the scan
        giving ``offset_ptr``, the chains and the summary), ``wait`` (until the device is done
        and the summary is back) and ``finish`` (the empty-row map when needed, scratch given
        back).
        """
        import pycuda.driver as cuda
        p, q = self.tiles, np.int64
        arrays, stream, arena = self.arrays, self.stream, self.arena
        if self._summary is None:
            self.load()
        clock = [time.perf_counter()]
        arrays["indptr"], arrays["col"], arrays["val"] = indptr, indices, data
        # The transpose first: it needs no new array and is most of the device time, so the
        # allocations below overlap it.
        if p:
            self._launch("csr5_transpose", p * self.BLOCK, q(p), indices.gpudata, data.gpudata)
        wide = None
        if self.column_dtype != self.index_dtype:  # the product's copy, after the transpose
            wide, arrays["col"] = indices, arena.empty(max(self.nnz, 1), self.column_dtype,
                                                      "csr5 col (16-bit)")
            self._launch("csr5_narrow_columns", min(self.nnz, 1 << 22), q(self.nnz),
                         wide.gpudata, arrays["col"].gpudata)
        tile_ptr = arrays["tile_ptr"] = arena.empty(p + 1, self.index_dtype, "csr5 tile_ptr")
        seg_count = tile_info = None  # per-tile scratch, released at the end
        if p:
            tile_desc = arrays["tile_desc"] = arena.empty(p * self.num_packet * OMEGA, np.uint32,
                                                          "csr5 tile_desc")
            seg_count = arena.empty(p, np.int32, "csr5 segment counts")
            tile_info = arena.empty(p, np.uint8, "csr5 tile flags")
        else:  # everything is tail, in CSR order
            arrays["tile_desc"] = arena.zeros(1, np.uint32, "csr5 tile_desc", stream=stream)
        self._launch("csr5_tile_ptr", p + 1, q(p + 1), q(self.m), indptr.gpudata,
                     tile_ptr.gpudata)
        if p:
            self._launch("csr5_tile_desc", p * OMEGA, q(p), q(self.m), indptr.gpudata,
                         tile_ptr.gpudata, tile_desc.gpudata, seg_count.gpudata,
                         tile_info.gpudata)
        offset_ptr = arrays["offset_ptr"] = arena.empty(p + 1, np.int64, "csr5 offset_ptr")
        # A chain begins at a unit (tile or tail) after the first: at most p chains.
        chains = [arena.empty(max(p, 1), self.index_dtype, f"csr5 {name}")
                  for name in ("chain_row", "chain_first", "chain_last")]
        arrays["chain_row"], arrays["chain_first"], arrays["chain_last"] = chains
        arrays["calibrator"] = arena.empty(p + 1, self.value_dtype, "csr5 calibrator")
        units = p + (1 if self.tail_start < self.nnz else 0)  # the tiles and the tail
        grid = grid_1d(units, self.SCAN_THREADS)
        block_totals = arena.empty(3 * grid[0], np.int64, "csr5 scan block totals")
        summary = arena.empty(len(self._summary), np.int64, "csr5 conversion summary")
        scan_args = (q(p), q(self.nnz), indptr.gpudata, tile_ptr.gpudata,
                     getattr(seg_count, "gpudata", None), getattr(tile_info, "gpudata", None))
        self._launch("csr5_tile_totals", units, *scan_args, block_totals.gpudata,
                     block=self.SCAN_THREADS)
        self._launch("csr5_tile_scan", units, *scan_args, block_totals.gpudata,
                     offset_ptr.gpudata, *(chain.gpudata for chain in chains), summary.gpudata,
                     block=self.SCAN_THREADS)
        cuda.memcpy_dtoh_async(self._summary, summary.gpudata, stream)
        clock.append(time.perf_counter())
        stream.synchronize()
        clock.append(time.perf_counter())
        self.n_offsets, self.n_chains, self.lead_rows, self.tail_row = (
            int(value) for value in self._summary)
        arrays["empty_offset"] = arena.empty(max(self.n_offsets, 1), self.index_dtype,
                                             "csr5 empty_offset")
        if self.n_offsets:  # some tile has empty rows inside its row range
            self._launch("csr5_empty_offset", p * OMEGA, q(p), q(self.m), indptr.gpudata,
                         tile_ptr.gpudata, tile_desc.gpudata, tile_info.gpudata,
                         offset_ptr.gpudata, arrays["empty_offset"].gpudata)
            self._launch("csr5_mark_empty", p, q(p), tile_info.gpudata, tile_ptr.gpudata)
            stream.synchronize()
        self._list_long_chains()
        self._list_wide_tiles()
        arena.release(seg_count, tile_info, block_totals, summary, wide)
        clock.append(time.perf_counter())
        self.convert_steps = dict(zip(("launch", "wait", "finish"), np.diff(clock)))

    def _list_long_chains(self):
        """``long_chains``: the chains of more than LONG_CHAIN_TERMS calibrator terms (their
        numbers, ascending), which ``csr5_calibrate`` gives a warp each; read from the chains'
        bounds when some row is long enough to make one."""
        arrays, arena, n = self.arrays, self.arena, self.n_chains
        long_chains = np.zeros(0, dtype=self.index_dtype)
        if n and self.may_have_long_chains:
            first = arrays["chain_first"].get()[:n].astype(np.int64)
            last = arrays["chain_last"].get()[:n].astype(np.int64)
            long_chains = np.flatnonzero(last - first + 1 > self.LONG_CHAIN_TERMS).astype(
                self.index_dtype)
        self.n_long = len(long_chains)
        arrays["long_chains"] = (arena.to_device(long_chains, "csr5 long chains")
                                 if self.n_long else
                                 arena.empty(1, self.index_dtype, "csr5 long chains"))

    def _list_wide_tiles(self):
        """``wide_start`` / ``wide_prefix``: the first row inside each tile with more than
        :attr:`WIDE_SPAN` rows inside its row range, and where each one's inside rows begin in
        them laid end to end (``n_wide``, ``wide_rows``: their count and total); read from
        ``tile_ptr`` when some tile has empty rows inside."""
        arrays, arena, index = self.arrays, self.arena, self.index_dtype
        starts = np.zeros(0, dtype=np.int64)
        inside = np.zeros(0, dtype=np.int64)
        if self.n_offsets and self.tiles:
            mask = np.iinfo(index).max  # all bits but the sign bit, the empty-row flag
            first = (arrays["tile_ptr"].get()[:self.tiles + 1] & mask).astype(np.int64)
            inside = first[1:] - first[:-1] - 1
            wide = np.flatnonzero(inside > self.WIDE_SPAN)
            starts, inside = first[wide] + 1, inside[wide]
        prefix = np.concatenate([[0], np.cumsum(inside)]).astype(index)
        self.n_wide, self.wide_rows = len(starts), int(prefix[-1])
        arrays["wide_start"] = arena.to_device(
            starts.astype(index) if len(starts) else np.zeros(1, index), "csr5 wide tiles")
        arrays["wide_prefix"] = arena.to_device(prefix, "csr5 wide tile rows")

    def multiply(self, x, y, rows=None):
        """y = A x on the stream (x, y: GPUArrays of the value dtype; y needs no zeroing), or,
        given ``rows`` (a device array of the index dtype, one distinct row of y per row of A),
        y[rows] += A x: a compressed ghost block added to the local block's product."""
        a, q = self.arrays, np.int64
        row_map = 0 if rows is None else rows.gpudata
        # One launch: the tiles' blocks, then the tail's (lead rows, tail rows), then, writing
        # y's own rows, those of the empty rows inside the wide tiles.
        tile_blocks = -(-self.tiles * OMEGA // self.BLOCK)
        tail_threads = self.lead_rows + (self.m - self.tail_row)
        wide_threads = self.wide_rows if rows is None else 0
        blocks = tile_blocks + -(-tail_threads // self.BLOCK) + -(-wide_threads // self.BLOCK)
        if blocks:
            self.kernels["csr5_spmv"].prepared_async_call(
                (blocks, 1), (self.BLOCK, 1, 1), self.stream, q(self.tiles), q(tile_blocks),
                q(self.lead_rows), q(self.tail_row), q(self.m), q(self.tail_start),
                q(self.n_wide), q(self.WIDE_SPAN),
                a["tile_ptr"].gpudata, a["tile_desc"].gpudata, a["col"].gpudata,
                a["val"].gpudata, a["offset_ptr"].gpudata, a["empty_offset"].gpudata,
                a["indptr"].gpudata, a["wide_start"].gpudata, a["wide_prefix"].gpudata,
                x.gpudata, y.gpudata, row_map, a["calibrator"].gpudata)
        if self.n_chains:  # a thread per short chain, then a warp per long one
            threads = -(-self.n_chains // OMEGA) * OMEGA + OMEGA * self.n_long
            self._launch("csr5_calibrate", threads, q(self.n_chains), q(self.LONG_CHAIN_TERMS),
                         q(self.n_long), a["long_chains"].gpudata, a["chain_row"].gpudata,
                         a["chain_first"].gpudata, a["chain_last"].gpudata,
                         a["calibrator"].gpudata, y.gpudata, row_map)

    def to_host(self):
        """The converted format as a :class:`CSR5Matrix` (for comparison with the NumPy
        builder)."""
        a, p = self.arrays, self.tiles
        n_chains = self.n_chains
        values = a["val"].get()
        if self.uniform is not None:  # the one value stands for every nonzero
            values = np.full(self.nnz, values[0], dtype=values.dtype)
        return CSR5Matrix(
            (self.m, self.n), self.sigma, OMEGA, self.matrix.indptr,
            a["col"].get()[:self.nnz].astype(self.index_dtype),
            values, a["tile_ptr"].get(),
            a["tile_desc"].get()[:p * self.num_packet * OMEGA].reshape(p, self.num_packet, OMEGA),
            a["offset_ptr"].get(), a["empty_offset"].get()[:self.n_offsets],
            a["chain_row"].get()[:n_chains], a["chain_first"].get()[:n_chains],
            a["chain_last"].get()[:n_chains])

    def free(self, keep=()):
        """Give the format's device arrays back to the arena (including the CSR arrays handed to
        :meth:`convert`), except the GPUArrays in ``keep``."""
        kept = {id(array) for array in keep}
        for name, array in list(self.arrays.items()):
            if id(array) not in kept:
                self.arena.release(array)
            del self.arrays[name]
