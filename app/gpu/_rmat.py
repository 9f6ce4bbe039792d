"""R-MAT graphs made on the rank's GPU (``kernels_cu/generators.cu``): what
:mod:`hisparse.generators` hands over (the blocks' stream table, the thresholds, the
permutation) in; out, the host's edges bit for bit (:func:`device_rmat_edges`, PyCUDA's
``rmat_edges``), or the whole unit matrix's rows, which the host would make from those edges
(:func:`device_rmat_unit_rows`, CuPy: the edges' keys sorted on the device)."""
import numpy as np

from ._generate import walk_operands
from ._kernels import KernelTable, grid_1d
from ._raw import last_value, launch

RMAT_KERNELS = KernelTable("generators", ["rmat_edges"])


def _draw_operands(block_edges, levels, thresholds):
    """The operands every R-MAT kernel takes after its edge range (``rmat_edge``): the block's
    edges, the levels and the quadrant thresholds ``(a, a + b, a + b + c)``."""
    low, middle, high = (np.float64(t) for t in thresholds)
    return np.int64(block_edges), np.int32(levels), low, middle, high

#: threads per block of the R-MAT kernel
THREADS = 256

#: most edges made per launch (whole blocks): the device holds two int64 arrays of this many
#: (512 MiB) whatever the graph's size
PIECE_EDGES = 1 << 25

#: bytes of each page-locked buffer the edges come back through
DOWNLOAD_PIECE = 32 << 20


def device_rmat_edges(ctx, table, first_edge, count, block_edges, levels, thresholds,
                      permutation):
    """``(src, dst)``: ``count`` R-MAT edges from graph edge ``first_edge`` (the first of a
    block) on, int64 host arrays.

    ``ctx``: the run context (its ``load_kernels`` compiles or loads ``generators.cu``);
    ``table``: :func:`hisparse.generators.rmat_block_table` of the blocks these edges lie in,
    blocks of ``block_edges`` edges; ``levels``: the scale; ``thresholds``: ``(a, a + b, a +
    b + c)``; ``permutation``: :class:`hisparse.generators.Permutation` of the vertex ids."""
    import pycuda.driver as cuda
    import pycuda.gpuarray as gpuarray
    from ._memory import free_pinned, staged_download
    src = np.empty(count, dtype=np.int64)
    dst = np.empty(count, dtype=np.int64)
    if not count:
        return src, dst
    kernel = RMAT_KERNELS.load(ctx).rmat_edges
    piece_edges = max(block_edges, PIECE_EDGES // block_edges * block_edges)
    stream = cuda.Stream()
    table_device = gpuarray.to_gpu(np.ascontiguousarray(table, dtype=np.uint64))
    keys = gpuarray.to_gpu(np.ascontiguousarray(permutation.keys, dtype=np.uint64))
    made = [gpuarray.empty(min(count, piece_edges), dtype=np.int64) for _ in range(2)]
    buffers = [cuda.pagelocked_empty(min(DOWNLOAD_PIECE, made[0].nbytes), np.uint8)
               for _ in range(2)]
    drawn, walked = (_draw_operands(block_edges, levels, thresholds),
                     walk_operands(permutation, keys.gpudata))
    try:
        for start in range(0, count, piece_edges):
            size = min(piece_edges, count - start)
            rows = int(table_device.gpudata) + (start // block_edges) * table.shape[1] * 8
            kernel.prepared_async_call(
                grid_1d(size, THREADS), (THREADS, 1, 1), stream, rows,
                np.int64(first_edge + start), np.int64(size), *drawn, *walked,
                made[0].gpudata, made[1].gpudata)
            for device, host in zip(made, (src, dst)):
                staged_download(device.gpudata, host[start:start + size], stream,
                                DOWNLOAD_PIECE, buffers)
    finally:
        for buffer in buffers:
            free_pinned(buffer)
        for array in made + [table_device, keys]:
            array.gpudata.free()
    return src, dst


def device_rmat_unit_rows(cupy, table, count, block_edges, levels, thresholds, permutation,
                          symmetric):
    """The unit matrix of all ``count`` edges of an R-MAT graph of ``2**levels`` vertices (with
    their reverses when ``symmetric``), made on the current GPU: ``(indptr, columns)``, the
    row pointers (int64, on the host) and the column indices (a CuPy int64 array), one entry per
    distinct edge, columns ascending in every row: :func:`hisparse.generators.unit_rows` of
    :func:`hisparse.generators.rmat_edges` of every block.

    Each edge becomes one 64-bit key, (source << levels) | destination (``rmat_edge_keys``: no
    edge list), the keys are sorted, and the first of each run of equal keys is an entry
    (``first_of_runs``, a scan, ``unit_entries``). ``table`` etc. as for
    :func:`device_rmat_edges`, for all the graph's blocks. Device memory: about 24 bytes a key
    at once (keys, their scan and the sort's space), 16 a key after; the caller checks it
    fits."""
    nrows = 1 << int(levels)
    total = int(count) * (2 if symmetric else 1)
    keys = cupy.empty(total, dtype=cupy.uint64)
    launch(cupy, "generators.cu", "rmat_edge_keys", int(count),
           cupy.asarray(np.ascontiguousarray(table, dtype=np.uint64)), np.int64(0),
           np.int64(count), *_draw_operands(block_edges, levels, thresholds),
           *walk_operands(permutation, cupy.asarray(np.ascontiguousarray(permutation.keys,
                                                                         dtype=np.uint64))),
           np.int32(bool(symmetric)), keys)
    keys.sort()
    positions = cupy.empty(total, dtype=cupy.int64)
    launch(cupy, "generators.cu", "first_of_runs", total, keys, np.int64(total), positions)
    cupy.cumsum(positions, out=positions)
    nnz = last_value(positions)
    columns = cupy.empty(nnz, dtype=cupy.int64)
    row_first = cupy.empty(nrows, dtype=cupy.int64)
    # Every byte 0xff: -1, a row with no entry (a memset: CuPy's fill takes a scalar operand).
    cupy.cuda.runtime.memsetAsync(row_first.data.ptr, 0xFF, row_first.nbytes,
                                  cupy.cuda.get_current_stream().ptr)
    launch(cupy, "generators.cu", "unit_entries", total, keys, positions, np.int64(total),
           np.int32(levels), columns, row_first)
    del keys, positions
    first = row_first.get()
    # A row without entries starts where the next row with one does (the last ones at nnz).
    first[first < 0] = nnz
    indptr = np.empty(nrows + 1, dtype=np.int64)
    indptr[nrows] = nnz
    indptr[:nrows] = np.minimum.accumulate(first[::-1])[::-1]
    return indptr, columns
