"""CP-ALS's unfolding blocks sorted into CSR on the rank's GPU, from their nonzeros: what the GPU
engines' set-up (``upload``) does with a block given as nonzeros (:class:`~.layout.ModeCOO`).

A tensor generated or routed on the device never comes back to the host: its nonzeros are
viewed where they are (:func:`nonzeros_on_device`), keyed and sorted stably there (CuPy's sort,
our key, gather and row-pointer kernels at the end of ``kernels_cu/mttkrp.cu``), and the block's
CSR is made on the device (:class:`DeviceSorter`). The sort can also part a block's nonzeros by
the owner of their row of another mode's factor (the 'fast' engine's two MTTKRP launches, one
before the exchange of that factor and one after it): the part goes into the key's top, so the
same one sort orders the early part first, each part in the block's order.
"""
import math
from dataclasses import dataclass

import numpy as np

from ...arrays import array_module, as_cupy
from ...gpu import grid_1d

#: Threads per block of the format kernels.
BLOCK = 256


def sorting_cupy():
    """CuPy when it can sort on this rank's GPU (importable, and built with Thrust: its
    ``argsort``), else None: the unfoldings are then sorted on the host."""
    from ...gpu import optional_cupy
    cupy = optional_cupy("the CP-ALS unfoldings on the GPU")
    if cupy is None:
        return None
    if not getattr(getattr(cupy.cuda, "thrust", None), "available", True):
        return None  # a CuPy built without Thrust cannot sort
    return cupy


def nonzeros_on_device(arena, array, dtype, what):
    """A block's nonzeros on the device: host arrays uploaded into ``arena``; arrays made on the
    device already (CuPy: a tensor generated there, ``CPALS.input_module``) viewed where they
    are, without a copy (the view keeps them alive until the sort lets go)."""
    if isinstance(array, np.ndarray):
        return arena.to_device(np.ascontiguousarray(array, dtype=dtype), what)
    import pycuda.gpuarray as gpuarray
    array = array_module(array).ascontiguousarray(array, dtype=dtype)
    return gpuarray.GPUArray(array.shape, array.dtype, gpudata=int(array.data.ptr), base=array)


def coordinate_pointers(arena, other, nnz, first=0, what="coordinate pointers"):
    """Device array of the pointers to each other mode's int32 coordinates of a block's
    nonzeros from the ``first``-th on (``other``: the block's (modes - 1, ``nnz``) device
    coordinates), as the MTTKRP kernels take them."""
    base, rows = int(other.gpudata), int(other.shape[0])
    pointers = np.array([base + (j * int(nnz) + int(first)) * 4 for j in range(rows)],
                        dtype=np.uint64)
    return arena.to_device(pointers, what)


@dataclass
class SortedBlock:
    """One block's CSR on the device: row pointers, values and the other modes' coordinates
    ((modes - 1, nnz) int32). ``parts``: where the sort parted the nonzeros, ``(n_early, early
    row pointers, late row pointers)`` (each part's CSR over the block's rows; the late part's
    nonzeros start at ``n_early``), else None."""
    indptr: object
    values: object
    other: object
    parts: tuple = None


class DeviceSorter:
    """Sorts blocks of one tensor on the device, on ``stream`` (the engine's), allocating from
    ``arena``; ``kernels``: the loaded ``mttkrp`` kernel table (its format kernels); ``shape``:
    the tensor's; ``index``: the row-count scalar of ``index_dtype``."""

    def __init__(self, cupy, kernels, arena, stream, shape, dtype, index_dtype, index):
        self.cupy, self.kernels, self.arena, self.stream = cupy, kernels, arena, stream
        self.shape, self.dtype, self.index_dtype, self.index = shape, dtype, index_dtype, index

    def sort(self, block, coords, values, late=None):
        """The CSR of ``block`` (a :class:`~.layout.ModeCOO`) from its nonzeros on the device
        (``coords``: (nnz, order) int64, ``values``): one 64-bit key per nonzero sorted stably
        when (row, other modes) fits in it, else a lexsort of the coordinates; then the gather
        and the row pointers. ``late``: ``(mode, lo, hi)``, the nonzeros whose coordinate of
        ``mode`` is in [lo, hi) first, the rest after (where the key has room for the part;
        one part otherwise). Returns a :class:`SortedBlock`; the stream is synchronised."""
        cupy, arena, stream, kernels = self.cupy, self.arena, self.stream, self.kernels
        nnz, mode, offset = block.nnz, block.mode, np.int64(block.row_offset)
        sorted_block = SortedBlock(
            indptr=arena.empty(block.n_rows + 1, self.index_dtype, "row pointers"),
            values=arena.empty(nnz, self.dtype, "values"),
            other=arena.empty((len(self.shape) - 1, nnz), np.int32, "coordinates"))
        rows = arena.empty(nnz, np.int32, "sorted rows")
        radix = [block.n_rows] + [int(self.shape[m]) for m in block.other_modes]
        span = math.prod(radix)
        if late is not None and (nnz == 0 or 2 * span > 2 ** 64):
            late = None  # no room in the key for the part (or nothing to part): one part
        n_early = None
        if nnz == 0:
            sorted_order = None
        elif span <= 2 ** 64:  # the largest key, prod - 1, fits in 64 bits
            dims = arena.to_device(np.asarray(self.shape, dtype=np.int64), "mode lengths")
            keys = arena.empty(nnz, np.uint64, "sort keys")
            counter = arena.zeros(1, np.uint64, "early nonzeros")
            late_mode, lo, hi = late if late is not None else (-1, 0, 0)
            kernels.unfolding_keys.prepared_async_call(
                grid_1d(nnz, BLOCK), (BLOCK, 1, 1), stream, np.int64(nnz), np.int32(mode),
                offset, coords.gpudata, dims.gpudata, np.int32(late_mode), np.int64(lo),
                np.int64(hi), np.uint64(span % 2 ** 64), counter.gpudata, keys.gpudata)
            stream.synchronize()  # CuPy sorts on its own stream
            if late is not None:
                n_early = int(counter.get()[0])
            sorted_order = cupy.argsort(as_cupy(cupy, keys))
            arena.release(keys, dims, counter)
        else:
            columns = as_cupy(cupy, coords)
            # lexsort: the last key is the primary one (the row, then the other modes in order).
            keys = cupy.stack([columns[:, m] for m in reversed(block.other_modes)] +
                              [columns[:, mode]])
            stream.synchronize()
            sorted_order = cupy.lexsort(keys)
            del keys
        if nnz:
            cupy.cuda.get_current_stream().synchronize()
            kernels.unfolding_gather.prepared_async_call(
                grid_1d(nnz, BLOCK), (BLOCK, 1, 1), stream, np.int64(nnz), np.int32(mode),
                offset, int(sorted_order.data.ptr), coords.gpudata, values.gpudata,
                sorted_block.values.gpudata, sorted_block.other.gpudata, rows.gpudata)
        row_grid = grid_1d(block.n_rows + 1, BLOCK)
        if n_early is None:
            kernels.unfolding_indptr.prepared_async_call(
                row_grid, (BLOCK, 1, 1), stream, self.index(block.n_rows), np.int64(nnz),
                rows.gpudata, sorted_block.indptr.gpudata)
        else:
            parts = [arena.empty(block.n_rows + 1, self.index_dtype, "part row pointers")
                     for _ in range(2)]
            kernels.unfolding_indptr_parts.prepared_async_call(
                row_grid, (BLOCK, 1, 1), stream, self.index(block.n_rows), np.int64(n_early),
                np.int64(nnz), rows.gpudata, parts[0].gpudata, parts[1].gpudata,
                sorted_block.indptr.gpudata)
            sorted_block.parts = (n_early, *parts)
        stream.synchronize()
        del sorted_order
        arena.release(rows)
        return sorted_block
