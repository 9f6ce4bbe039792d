"""Kernels of ``kernels_cu/`` on CuPy arrays: each source one CuPy ``RawModule`` (compiled by
NVRTC, kept in CuPy's kernel cache, loaded once a process), for the device steps that hold CuPy
arrays (the generators, :mod:`._generate`; counts, :func:`device_counts`).

Why not CuPy's own routines there: CuPy loads ``cupyx``, and with it SciPy's sparse package, at
its first operation between an array and a scalar, in ``bincount`` and in ``unravel_index``
(0.3-0.45 s of a process's set-up on the H200 host; array-array operations, sorts, scans,
gathers, ``unique``, ``searchsorted`` and raw kernels with scalar arguments do not:
``docs/scaling/stop52_x2/probe55.py``, ``probe57.py``), and chains of its array expressions are
one kernel each to compile and load.
"""
import re
from contextlib import contextmanager

import numpy as np

from ._compile import kernel_source_dir

#: Threads per block of every launch (grid-stride loops or fixed items a thread: any count fits).
BLOCK = 256
#: Blocks at most per grid-stride launch (each thread then loops).
MAX_BLOCKS = 65536
#: Values a thread of ``count_values`` takes (COUNT_ITEMS in kernels_cu/device_arrays.cu).
COUNT_ITEMS = 16

_MODULES = {}


def _source_with_headers(name):
    """``kernels_cu/<name>`` with its ``#include "x.cuh"`` lines replaced by the headers' text,
    so that CuPy's cache key (the code's hash) changes when a header does."""
    directory = kernel_source_dir()
    return re.sub(r'^#include "([^"]+\.cuh)"\s*$',
                  lambda match: (directory / match.group(1)).read_text(),
                  (directory / name).read_text(), flags=re.M)


def raw_module(cupy, source):
    """The module of ``kernels_cu/<source>`` (compiled once a process; CuPy loads it on each
    device it is used on)."""
    if source not in _MODULES:
        _MODULES[source] = cupy.RawModule(code=_source_with_headers(source),
                                          options=("-std=c++17",))
    return _MODULES[source]


def launch(cupy, source, kernel, count, *args, items=None):
    """``kernel`` of ``source`` over ``count`` items on CuPy's current stream: a grid-stride
    launch, or with ``items`` a thread for every ``items`` items."""
    if count <= 0:
        return
    threads = count if items is None else (count + items - 1) // items
    blocks = (threads + BLOCK - 1) // BLOCK
    if items is None:
        blocks = min(MAX_BLOCKS, blocks)
    raw_module(cupy, source).get_function(kernel)((int(blocks),), (BLOCK,), args)


def last_value(array):
    """The last element of a CuPy array as an int (0 when empty), by a slice's copy to the
    host (no scalar operation)."""
    return int(array[len(array) - 1:].get()[0]) if len(array) else 0


def _staging(cupy):
    """CuPy's side of a staged copy: page-locked buffers of CuPy's pinned pool (uint8 arrays of
    :data:`~hisparse.gpu._memory.STAGING_PIECE_BYTES`), an event slot for each and a stream."""
    from ._memory import STAGING_BUFFERS, STAGING_PIECE_BYTES
    memory = [cupy.cuda.alloc_pinned_memory(STAGING_PIECE_BYTES) for _ in range(STAGING_BUFFERS)]
    buffers = [np.ndarray(STAGING_PIECE_BYTES, np.uint8, buffer=block) for block in memory]
    return buffers, [None] * STAGING_BUFFERS, cupy.cuda.Stream(non_blocking=True)


def _staged_copy(cupy, host, device, to_device, threads):
    """``host`` (a contiguous NumPy array) copied to ``device`` (a contiguous CuPy array of as
    many bytes), or back where ``to_device`` is false, in pieces through page-locked buffers of
    CuPy's pinned pool, each filled or emptied on the host's ``threads`` while the piece before
    crosses (:func:`~hisparse.gpu._memory.upload_in_pieces`, ``download_in_pieces``). The
    copies wait for the work queued on the current stream (the pool may hand out memory it
    still reads; the array to fetch may still be in the making); done on return."""
    from concurrent.futures import ThreadPoolExecutor
    from ._memory import download_in_pieces, upload_in_pieces
    runtime = cupy.cuda.runtime
    buffers, events, stream = _staging(cupy)
    direction = runtime.memcpyHostToDevice if to_device else runtime.memcpyDeviceToHost

    def cross(slot, piece, offset):
        ends = (device.data.ptr + offset, piece.ctypes.data)
        runtime.memcpyAsync(*(ends if to_device else ends[::-1]), piece.nbytes, direction,
                            stream.ptr)
        events[slot] = stream.record()

    stream.wait_event(cupy.cuda.get_current_stream().record())
    pieces = upload_in_pieces if to_device else download_in_pieces
    name = "hisparse-upload" if to_device else "hisparse-download"
    with ThreadPoolExecutor(threads, thread_name_prefix=name) as pool:
        pieces(host, buffers, cross, lambda slot: events[slot].synchronize(), pool, threads)
    stream.synchronize()


def host_copy(array):
    """A CuPy array's copy on the host (``array.get()``) into fresh memory. From
    :data:`~hisparse.gpu._memory.STAGED_UPLOAD_MIN_BYTES` on (and with more than one core), in
    pieces (:func:`_staged_copy`); below, the driver's copy into pages first touched on the
    host's threads (:func:`hisparse.threads.touch_pages`). A copy into fresh pageable memory
    faults its pages in on one core as it goes, at about 1 GB/s (R-MAT 23's 131M int32
    columns, 0.5 GB, took 0.35 s to come back at one rank on the 2xH200 host; with the pages
    touched first, those and the row pointers 0.16-0.18 s; the pieces' rate not timed yet)."""
    import cupy
    from ..threads import touch_pages
    from ._memory import STAGED_UPLOAD_MIN_BYTES, staging_threads
    out = np.empty(array.shape, dtype=array.dtype)
    threads = staging_threads()
    if not out.size:
        return out
    if out.nbytes < STAGED_UPLOAD_MIN_BYTES or threads <= 1:
        array.get(out=touch_pages(out))
        return out
    _staged_copy(cupy, out, cupy.ascontiguousarray(array), False, threads)
    return out


def host_to_device(cupy, host):
    """A host array's copy on the current GPU as a new CuPy array. From
    :data:`~hisparse.gpu._memory.STAGED_UPLOAD_MIN_BYTES` on (and with more than one core), in
    pieces (:func:`_staged_copy`, as the engines' arena uploads); below, the driver's copy of
    pageable memory. 22-23 GB/s for 0.5-1 GiB on the 2xH200 host, against 9.3-9.9 GB/s for
    ``cupy.asarray`` and for ``empty`` and ``set`` (docs/scaling/stop58_x2/upload_probe.py)."""
    from ._memory import STAGED_UPLOAD_MIN_BYTES, staging_threads
    host = np.ascontiguousarray(host)
    out = cupy.empty(host.shape, dtype=host.dtype)
    threads = staging_threads()
    if not host.size:
        return out
    if host.nbytes < STAGED_UPLOAD_MIN_BYTES or threads <= 1:
        out.set(host)
        return out
    _staged_copy(cupy, host, out, True, threads)
    return out


def device_counts(cupy, values, size):
    """How many times each of ``0 .. size - 1`` occurs in ``values`` (a CuPy integer array):
    ``bincount(values, minlength=size)`` as int64, on the device.

    Raises
    ------
    ValueError
        A value outside ``0 .. size - 1`` (the kernel would add outside the counts), named.
    """
    values = cupy.ascontiguousarray(values).astype(cupy.int64, copy=False)
    if len(values):
        low, high = int(values.min()), int(values.max())  # reductions: no scalar operand
        if low < 0 or high >= size:
            raise ValueError(f"a value to count ({low if low < 0 else high}) is outside "
                             f"0 .. {int(size) - 1}")
    counts = cupy.zeros(int(size), dtype=cupy.uint64)
    launch(cupy, "device_arrays.cu", "count_values", len(values), values,
           np.int64(len(values)), counts, items=COUNT_ITEMS)
    return counts.view(cupy.int64)


def _flagged_positions(cupy, prefix, n):
    """The positions ``i < n`` flagged in ``prefix`` (the exclusive sum of 0/1 flags, ``n + 1``
    entries, on the device), ascending, as a CuPy int64 array."""
    out = cupy.empty(last_value(prefix), dtype=cupy.int64)
    launch(cupy, "device_arrays.cu", "flagged_positions", n, prefix, np.int64(n), out)
    return out


@contextmanager
def _pool_released():
    """CuPy's memory pool given back to the driver after the block, however it ends: a plan's
    pass holds its arrays only while it runs, and the engines' arena wants that memory next."""
    try:
        yield
    finally:
        from ._blas import release_pool
        release_pool()


#: device bytes :class:`RowsOnDevice` holds at most per entry (int64 columns, keys, the sort's
#: output and scratch; with values, their sources and the values twice) and per row
_RENUMBER_ENTRY_BYTES = 32
_RENUMBER_VALUE_BYTES = 32
_RENUMBER_ROW_BYTES = 32


class RowsOnDevice:
    """The SpMV plan's block split (:meth:`split`, :func:`hisparse.distmatrix.split_rows`'
    blocks) and degree renumbering on the current GPU with CuPy: the degree order
    (:meth:`degree_order`, :func:`hisparse.arrays.order_by_count`'s), and
    :meth:`hisparse.formats.CSRMatrix.renumbered` and :meth:`~hisparse.formats.CSRMatrix.rows`,
    the same arrays entry for entry. Each answers ``None`` where it does not run there: fewer
    than ``min_entries`` entries, no CuPy, a row and a column number that do not fit one 64-bit
    key together, or more device memory than 4/5 of the free; the caller then takes the host's
    pass. The rows asked for are distinct (a permutation or a selection).

    ``same_values``: every value of the matrices is the same (the SpMV plan's uniform values),
    so any order of them is the matrix's own ``data``: only the columns go to the GPU and back
    (an attribute the plan sets once it knows, before the renumbering; the split looks at its
    rows' values itself).
    Why: the SpMV plan's degree renumbering of a power-law graph's blocks took 2.0-2.4 s of
    R-MAT 23's set-up at one GPU on the host's threads, 1.0-1.25 s a rank at two
    (``plan_reorder``; docs/ops/spmv.md, "Stop 58")."""

    def __init__(self, same_values=False, min_entries=0):
        from ..timing import StepClock
        self.same_values = bool(same_values)
        self.min_entries = int(min_entries)
        #: host seconds of each pass's steps, summed over the calls (``host``: the caller's work
        #: before each; ``order``, ``upload``, ``keys`` or ``sources``, ``sort``, ``download``,
        #: ``release``), the device waited for at each
        self.steps = StepClock()

    def _mark(self, cupy, step):
        cupy.cuda.get_current_stream().synchronize()
        self.steps.mark(step)

    def degree_order(self, counts, entries):
        """``(order, inverse)``: ``order_by_count(counts)`` (most first, ties in index order: one
        stable sort of the negated counts) and its inverse permutation, int64 host arrays, for
        a block of ``entries`` entries; or ``None`` (fewer than ``min_entries``, no CuPy)."""
        self.steps.mark("host")
        cupy = self._cupy(entries)
        if cupy is None:
            return None
        with _pool_released():
            made = self._order(cupy, host_to_device(cupy, np.asarray(counts, dtype=np.int64)))
        self._mark(cupy, "order")
        return made

    def use_order(self, values, size):
        """:meth:`degree_order` of ``count_values(values, size)`` with the counting on the GPU
        too (``values``: a block's columns, each of ``0 .. size - 1``), or ``None`` (fewer than
        ``min_entries`` values, no CuPy, no room). Why: the SpMV plan orders a rank's ghost
        columns by their uses, which counted and sorted on the host's threads took 0.11-0.12 s
        a rank of R-MAT 23 at two GPUs (``plan_exchange_order``; docs/ops/spmv.md, "Stop 61").

        Raises
        ------
        ValueError
            A value outside ``0 .. size - 1`` (:func:`device_counts`)."""
        self.steps.mark("host")
        cupy = self._cupy(len(values))
        if cupy is None:
            return None
        from ._blas import fits_free_memory
        values = np.asarray(values)
        if not fits_free_memory(cupy, len(values) * (8 + values.itemsize) +
                                int(size) * _RENUMBER_ROW_BYTES):
            return None
        with _pool_released():
            made = self._order(cupy, device_counts(cupy, host_to_device(cupy, values), size))
        self._mark(cupy, "use_order")
        return made

    @staticmethod
    def _order(cupy, counts):
        """``(order, inverse)`` of device ``counts`` (:meth:`degree_order`), on the host."""
        order = cupy.argsort(-counts)  # stable (CuPy's sorts all are)
        inverse = cupy.empty_like(order)
        inverse[order] = cupy.arange(len(order), dtype=order.dtype)
        return host_copy(order), host_copy(inverse)

    def renumbered(self, matrix, row_ids, new_column):
        """``matrix.renumbered(row_ids, new_column)``, or ``None``. Each entry of the result gets
        one key, (new row << column bits) | new column (``renumbered_keys``: a binary search of
        the new row pointers finds its row), and one stable sort of the keys sorts every row by
        its new columns (duplicates in the host's order)."""
        self.steps.mark("host")  # the caller's work since the last pass (or the making)
        ready = self._start(matrix, row_ids, _RENUMBER_ENTRY_BYTES)
        if ready is None:
            return None
        cupy, indptr, row_ids, new_indptr, column_bits = ready
        with _pool_released():
            total = last_value(new_indptr)
            indices = host_to_device(cupy, matrix.indices).astype(cupy.int64, copy=False)
            new_column = host_to_device(cupy, np.asarray(new_column, dtype=np.int64))
            values = None if self.same_values else host_to_device(cupy, matrix.data)
            self._mark(cupy, "upload")
            keys = cupy.empty(total, dtype=cupy.uint64)
            sources = cupy.empty(1 if self.same_values else total, dtype=cupy.int64)
            launch(cupy, "device_arrays.cu", "renumbered_keys", total, indptr, indices, row_ids,
                   new_indptr, np.int64(len(row_ids)), new_column, np.int32(column_bits),
                   np.int64(total), keys, np.int32(not self.same_values), sources)
            del indptr, indices, row_ids, new_column
            self._mark(cupy, "keys")
            if self.same_values:
                keys.sort()
            else:
                order = cupy.argsort(keys)  # stable, as the host's sort of a row
                keys = keys[order]
                values = values[sources[order]]
                del order
            del sources
            columns = cupy.empty(total, dtype=cupy.int64)
            launch(cupy, "device_arrays.cu", "key_columns", total, keys, np.int32(column_bits),
                   np.int64(total), columns)
            del keys
            columns = columns.astype(matrix.indices.dtype, copy=False)
            self._mark(cupy, "sort")
            indices = host_copy(columns)
            data = self._values_alike(matrix, total) if values is None else host_copy(values)
            new_indptr = host_copy(new_indptr)
            del columns, values
            self._mark(cupy, "download")
        self._mark(cupy, "release")
        return self._matrix(matrix, new_indptr, indices, data)

    def rows(self, matrix, row_ids, new_column=None):
        """``matrix.rows(row_ids)``, or ``None``: each entry's source found as in
        :meth:`renumbered` (``row_sources``), the columns (and values) gathered, no sort.
        ``new_column``: each column renamed ``new_column[c]`` on the way (entries keep their
        places in a row; the names must fit the block's index type), so that the SpMV plan's
        ghost block takes its receive order in the pass that moves its rows."""
        self.steps.mark("host")
        ready = self._start(matrix, row_ids, 0)
        if ready is None:
            return None
        cupy, indptr, row_ids, new_indptr, _ = ready
        with _pool_released():
            total = last_value(new_indptr)
            indices = host_to_device(cupy, matrix.indices)
            values = None if self.same_values else host_to_device(cupy, matrix.data)
            names = None if new_column is None else host_to_device(
                cupy, np.asarray(new_column).astype(matrix.indices.dtype, copy=False))
            self._mark(cupy, "upload")
            sources = cupy.empty(total, dtype=cupy.int64)
            launch(cupy, "device_arrays.cu", "row_sources", total, indptr, row_ids, new_indptr,
                   np.int64(len(row_ids)), np.int64(total), sources)
            indices = indices[sources] if names is None else names[indices[sources]]
            del names
            values = None if values is None else values[sources]
            del sources, indptr, row_ids
            self._mark(cupy, "sources")
            data = self._values_alike(matrix, total) if values is None else host_copy(values)
            indices = host_copy(indices)
            new_indptr = host_copy(new_indptr)
            self._mark(cupy, "download")
        self._mark(cupy, "release")
        return self._matrix(matrix, new_indptr, indices, data)

    def split(self, matrix, position, n_owned):
        """:func:`hisparse.distmatrix.split_rows`' blocks ``(local, ghost, ghost_rows, ghosts)``
        made on the GPU, the same arrays as the host's passes, or ``None`` (see the class; and
        tables over every column of x that do not fit). ``position``: the
        :class:`~hisparse.distmatrix.OwnedColumns` of this rank (``first`` and ``count`` of a
        range, or its ``table``). One flag per entry (``mark_ghost_entries``, which marks the
        ghost columns too), one scan of the flags and one of the marks, then every entry placed
        (``place_split_entries``); values one value repeated stay so (the columns alone move),
        other values follow by a gather. Why: the host's split of a power-law graph needs two
        compiled passes whose load from Numba's cache (0.7-1.1 s a process on the 2xH200 host,
        on a thread during the read) was the floor of R-MAT 23's read and split at two ranks,
        which one GPU never pays (docs/ops/spmv.md, "Stop 60")."""
        from ..arrays import repeated, repeated_value
        from ..formats import CSRMatrix
        self.steps.mark("host")
        cupy = self._cupy(matrix.nnz)
        if cupy is None:
            return None
        one = repeated_value(matrix.data)
        with_values = one is None
        total, nrows, n_global = matrix.nnz, matrix.nrows, int(position.n_global)
        value_bytes = 2 * matrix.data.dtype.itemsize + 16 if with_values else 0
        needed = total * (40 + value_bytes) + (nrows + n_global) * _RENUMBER_ROW_BYTES
        from ._blas import fits_free_memory
        if not fits_free_memory(cupy, needed):
            return None
        index_dtype, pointer_dtype = matrix.indices.dtype, matrix.indptr.dtype
        int64 = cupy.int64
        with _pool_released():
            indptr = host_to_device(cupy, np.asarray(matrix.indptr, dtype=np.int64))
            columns = host_to_device(cupy, matrix.indices).astype(int64, copy=False)
            use_table = position.table is not None
            table = host_to_device(cupy, position.table).astype(int64, copy=False) \
                if use_table else cupy.zeros(1, dtype=int64)
            values = host_to_device(cupy, matrix.data) if with_values else None
            self._mark(cupy, "split_upload")
            bounds = (np.int64(position.first or 0), np.int64(position.count), table,
                      np.int32(use_table))
            flags = cupy.empty(total, dtype=int64)
            marked = cupy.zeros(n_global, dtype=int64)
            launch(cupy, "device_arrays.cu", "mark_ghost_entries", total, columns,
                   np.int64(total), *bounds, flags, marked)
            before = cupy.zeros(total + 1, dtype=int64)
            cupy.cumsum(flags, out=before[1:])
            del flags
            ghost_of = cupy.zeros(n_global + 1, dtype=int64)
            cupy.cumsum(marked, out=ghost_of[1:])
            del marked
            ghosts = _flagged_positions(cupy, ghost_of, n_global)
            n_ghost = last_value(before)
            local_columns = cupy.empty(total - n_ghost, dtype=int64)
            ghost_columns = cupy.empty(n_ghost, dtype=int64)
            sources = [cupy.empty(len(block) if with_values else 1, dtype=int64)
                       for block in (local_columns, ghost_columns)]
            launch(cupy, "device_arrays.cu", "place_split_entries", total, columns,
                   np.int64(total), *bounds, before, ghost_of, local_columns, ghost_columns,
                   np.int32(with_values), *sources)
            del columns, table, ghost_of
            ghost_before = before[indptr]  # each row's first place in the ghost block
            del before
            row_flags = cupy.zeros(nrows + 1, dtype=int64)  # rows with ghost entries, scanned
            cupy.cumsum((ghost_before[1:] - ghost_before[:-1]).astype(cupy.bool_).astype(int64),
                        out=row_flags[1:])
            ghost_rows = _flagged_positions(cupy, row_flags, nrows)
            ghost_indptr = cupy.concatenate([ghost_before[ghost_rows], ghost_before[nrows:]])
            local_indptr = indptr - ghost_before
            del indptr, ghost_before, row_flags
            if with_values:  # each block's values gathered from their sources
                local_values, ghost_values = (host_copy(values[taken]) for taken in sources)
            else:  # the one value, repeated (no array of it anywhere)
                local_values, ghost_values = (repeated(one[0], count, matrix.data.dtype)
                                              for count in (total - n_ghost, n_ghost))
            del values, sources
            self._mark(cupy, "split")
            local = CSRMatrix(host_copy(local_indptr.astype(pointer_dtype)),
                              host_copy(local_columns.astype(index_dtype)), local_values,
                              (nrows, int(n_owned)))
            ghost = CSRMatrix(host_copy(ghost_indptr.astype(pointer_dtype)),
                              host_copy(ghost_columns.astype(index_dtype)), ghost_values,
                              (len(ghost_rows), len(ghosts)))
            made = (local, ghost, host_copy(ghost_rows.astype(index_dtype)), host_copy(ghosts))
            del local_indptr, local_columns, ghost_indptr, ghost_columns, ghost_rows, ghosts
            self._mark(cupy, "split_download")
        self._mark(cupy, "split_release")
        return made

    def _cupy(self, entries):
        """CuPy, where a block of ``entries`` entries is worked on the GPU; else ``None``."""
        from ._blas import optional_cupy
        if entries < max(self.min_entries, 1):
            return None
        return optional_cupy("the rows' renumbering on the GPU")

    def _start(self, matrix, row_ids, entry_bytes):
        """``(cupy, the row pointers, row_ids and the new row pointers on the device (int64),
        column bits)``, or ``None`` where the pass does not run on the GPU (see the class). The
        new row pointers: the selected rows' lengths, gathered and summed there."""
        cupy = self._cupy(matrix.nnz)
        if cupy is None:
            return None
        nrows, ncols = len(row_ids), int(matrix.ncols)
        row_bits, column_bits = max(nrows - 1, 0).bit_length(), max(ncols - 1, 0).bit_length()
        if row_bits + column_bits > 63:
            return None
        entry_bytes += 0 if self.same_values else _RENUMBER_VALUE_BYTES
        needed = matrix.nnz * (16 + entry_bytes) + \
            (matrix.nrows + nrows + ncols) * _RENUMBER_ROW_BYTES
        from ._blas import fits_free_memory
        if not fits_free_memory(cupy, needed):
            return None
        indptr = host_to_device(cupy, np.asarray(matrix.indptr, dtype=np.int64))
        row_ids = host_to_device(cupy, np.asarray(row_ids, dtype=np.int64))
        new_indptr = cupy.zeros(nrows + 1, dtype=cupy.int64)
        # lengths as indptr[1:][rows] - indptr[:-1][rows]: no scalar operand (CuPy would load
        # cupyx, and SciPy's sparse package with it, at rows + 1)
        cupy.cumsum(indptr[1:][row_ids] - indptr[:-1][row_ids], out=new_indptr[1:])
        return cupy, indptr, row_ids, new_indptr, column_bits

    @staticmethod
    def _values_alike(matrix, total):
        """``total`` values of a matrix whose values are all the same: its own ``data`` where
        the result holds as many entries (every row, once), else that value repeated (as one
        value repeated, :func:`~hisparse.arrays.repeated`, where ``data`` is one)."""
        from ..arrays import repeated, repeated_value
        if total == len(matrix.data):
            return matrix.data
        if repeated_value(matrix.data) is not None:
            return repeated(matrix.data[0], total, matrix.data.dtype)
        from ..threads import fill_into
        return fill_into(np.empty(total, dtype=matrix.data.dtype), matrix.data[0])

    @staticmethod
    def _matrix(matrix, new_indptr, indices, data):
        from ..formats import CSRMatrix
        return CSRMatrix(new_indptr.astype(matrix.indptr.dtype), indices, data,
                         (len(new_indptr) - 1, matrix.ncols), False)
