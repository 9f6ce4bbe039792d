"""R-MAT edges made on the rank's GPU (PyCUDA, ``kernels_cu/generators.cu``'s ``rmat_edges``):
what :func:`hisparse.generators.rmat_edges_on_device` hands over (the blocks' stream table, the
thresholds, the permutation) in, the host's edges out, bit for bit."""
import numpy as np

from ._kernels import KernelTable, grid_1d

RMAT_KERNELS = KernelTable("generators", ["rmat_edges"])

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
    low, middle, high = (float(t) for t in thresholds)
    try:
        for start in range(0, count, piece_edges):
            size = min(piece_edges, count - start)
            rows = int(table_device.gpudata) + (start // block_edges) * table.shape[1] * 8
            kernel.prepared_async_call(
                grid_1d(size, THREADS), (THREADS, 1, 1), stream, rows,
                np.int64(first_edge + start), np.int64(size), np.int64(block_edges),
                np.int32(levels), np.float64(low), np.float64(middle), np.float64(high),
                np.uint64(permutation.limit), np.uint64(permutation.shift),
                np.uint64(permutation.low), keys.gpudata, np.int32(len(permutation.keys)),
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
