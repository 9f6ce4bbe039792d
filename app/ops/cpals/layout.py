"""CP-ALS data layout: the CSR of a mode-n unfolding and its row blocks (one rank's share:
:class:`UnfoldingBlocks`), or a block's nonzeros unsorted for a GPU to sort (:class:`ModeCOO`,
cut by :func:`coo_blocks`), and the blocks' bounds from per-mode counts
(:class:`RowBlockOwners`, also the router of a tensor read by parts).

The mode-n unfolding X_(n) has one row per index of mode n. Its CSR here stores, per nonzero, the
value and the N-1 coordinates of the other modes as separate int32 arrays (cheaper to decode than
a linearised column id, which would overflow int64 for many FROSTT shapes). Nonzeros are sorted by
the row, then by the other modes in increasing mode order, so runs of equal leading coordinates
(fibers of the last other mode) are contiguous; the faster MTTKRP kernel reuses factor rows
along such runs.
"""
from dataclasses import dataclass

import numpy as np

from ...arrays import array_module, count_values, host_array
from ...errors import HisparseError, InputError
from ...partition import mode_histograms, partition_rows, split_by_owner


@dataclass
class ModeCSR:
    """CSR of the mode-``mode`` unfolding of a sparse tensor (or of a block of its rows): host
    arrays, or device arrays where a GPU engine has built it (its ``local`` blocks after
    ``build_unfoldings``).

    Attributes
    ----------
    mode : int
    n_rows : int
        Rows of this block (I_mode for the whole unfolding).
    row_offset : int
        Global index of the first row of the block.
    indptr : ndarray, shape (n_rows + 1,), int32 or int64
    values : ndarray, shape (nnz,), float32 or float64
    other_idx : ndarray, shape (N - 1, nnz), int32
        Coordinates of the other modes, in increasing mode order.
    other_modes : tuple of int
    """

    mode: int
    n_rows: int
    row_offset: int
    indptr: np.ndarray
    values: np.ndarray
    other_idx: np.ndarray
    other_modes: tuple

    @property
    def nnz(self):
        return int(len(self.values))

    def row_block(self, lo, hi):
        """The block of rows [lo, hi) (local numbering) as its own ModeCSR, indptr rebased."""
        start, stop = int(self.indptr[lo]), int(self.indptr[hi])
        return ModeCSR(self.mode, hi - lo, self.row_offset + lo,
                       (self.indptr[lo:hi + 1] - start).astype(self.indptr.dtype),
                       self.values[start:stop], self.other_idx[:, start:stop],
                       self.other_modes)

    def as_part(self, prefix=""):
        """Arrays and scalars for :func:`~hisparse.parallel.scatter_arrays`, keys prefixed (a
        part is flat: its arrays travel as raw buffers, not pickled)."""
        return _prefixed(prefix, {"kind": "csr", "indptr": self.indptr, "values": self.values,
                                  "other_idx": self.other_idx, "mode": self.mode,
                                  "n_rows": self.n_rows, "row_offset": self.row_offset})

    @classmethod
    def from_part(cls, part):
        """From :meth:`as_part`'s dict with the prefix taken off."""
        mode, order = int(part["mode"]), int(part["other_idx"].shape[0]) + 1
        return cls(mode, int(part["n_rows"]), int(part["row_offset"]), part["indptr"],
                   part["values"], part["other_idx"],
                   tuple(m for m in range(order) if m != mode))


@dataclass
class ModeCOO:
    """One rank's nonzeros of a block of rows of the mode-``mode`` unfolding, in any order: what
    the GPU engine sorts into the block's :class:`ModeCSR` on the device. :meth:`to_csr` builds
    the same CSR with NumPy (:func:`mode_unfolding`, the reference of the device build).

    Attributes
    ----------
    mode, n_rows, row_offset : int
        As in :class:`ModeCSR`: the block is rows ``row_offset .. row_offset + n_rows - 1``.
    shape : tuple of int
        The whole tensor's shape.
    indices : ndarray, shape (nnz, N), int64
        Global coordinates of the block's nonzeros (a COOTensor's ``indices``, or rows of it):
        NumPy, or CuPy when the tensor was generated on the rank's GPU (the engine sorts them
        where they are).
    values : ndarray, shape (nnz,)
        NumPy or CuPy, as ``indices``.
    index_dtype : numpy dtype
        dtype of the CSR's ``indptr`` (from the whole tensor's nonzero count, the same on every
        rank).
    """

    mode: int
    n_rows: int
    row_offset: int
    shape: tuple
    indices: np.ndarray
    values: np.ndarray
    index_dtype: object

    @property
    def nnz(self):
        return int(len(self.values))

    @property
    def other_modes(self):
        return tuple(m for m in range(len(self.shape)) if m != self.mode)

    def as_part(self, prefix=""):
        return _prefixed(prefix, {"kind": "coo", "indices": self.indices, "values": self.values,
                                  "mode": self.mode, "n_rows": self.n_rows,
                                  "row_offset": self.row_offset,
                                  "shape": [int(s) for s in self.shape],
                                  "index_dtype": np.dtype(self.index_dtype).str})

    @classmethod
    def from_part(cls, part):
        return cls(int(part["mode"]), int(part["n_rows"]), int(part["row_offset"]),
                   tuple(int(s) for s in part["shape"]), part["indices"], part["values"],
                   np.dtype(part["index_dtype"]))

    def to_csr(self):
        """The block's CSR built on the host by :func:`mode_unfolding` (rows renumbered from 0).

        Built over the whole mode's rows, where the rows outside the block are empty, and cut
        to the block's (:meth:`ModeCSR.row_block`: its row pointers rebased, the nonzeros not
        copied): the coordinates are not copied to renumber them."""
        from ...formats import COOTensor
        csr = mode_unfolding(COOTensor(host_array(self.indices), host_array(self.values),
                                       tuple(self.shape)), self.mode, self.index_dtype)
        return csr.row_block(self.row_offset, self.row_offset + self.n_rows)


def block_from_part(part, prefix):
    """The :class:`ModeCSR` or :class:`ModeCOO` that ``as_part(prefix)`` put in ``part``."""
    mine = {key[len(prefix):]: value for key, value in part.items() if key.startswith(prefix)}
    return (ModeCOO if mine["kind"] == "coo" else ModeCSR).from_part(mine)


def _prefixed(prefix, fields):
    return {f"{prefix}{key}": value for key, value in fields.items()}


@dataclass
class UnfoldingBlocks:
    """One rank's share of the tensor, the local data of a CP-ALS engine.

    Attributes
    ----------
    shape : tuple of int
        The whole tensor's shape (factor ``m`` has ``shape[m]`` rows on every rank).
    modes : list of ModeCSR or ModeCOO
        This rank's block of rows of every mode's unfolding, in mode order: built (the CPU
        backend, and tests) or as nonzeros that the GPU engine sorts on its device.
    """

    shape: tuple
    modes: list

    @property
    def order(self):
        return len(self.shape)


def mode_unfolding(tensor, mode, index_dtype=np.int64, base_order=None):
    """CSR of the mode-``mode`` unfolding of a COO tensor.

    Parameters
    ----------
    tensor : COOTensor
        Duplicates already merged.
    mode : int
    index_dtype : numpy dtype
        dtype of ``indptr`` (int32 when nnz < 2**31).
    base_order : ndarray of int64 or None, optional
        :func:`row_major_order` of the tensor when already computed (shared by all modes).

    Returns
    -------
    ModeCSR
    """
    shape = tuple(int(s) for s in tensor.shape)
    if max(shape) > np.iinfo(np.int32).max:
        raise InputError(f"tensor mode of length {max(shape)} does not fit the int32 coordinates "
                         f"of the CP-ALS unfolding format")
    others = tuple(m for m in range(len(shape)) if m != mode)
    if base_order is None:
        base_order = row_major_order(tensor)
    # From row-major order, a stable sort by the mode-n index alone gives the wanted order:
    # (i_n, then the other modes in increasing mode order).
    if mode == 0:
        order = base_order
    else:
        keys = tensor.indices[:, mode] if base_order is None else \
            tensor.indices[base_order, mode]
        order = _stable_order(keys, shape[mode])
        if base_order is not None:
            order = base_order[order]
    rows = tensor.indices[:, mode] if order is None else tensor.indices[order, mode]
    counts = np.bincount(rows, minlength=shape[mode])
    indptr = np.zeros(shape[mode] + 1, dtype=index_dtype)
    np.cumsum(counts, out=indptr[1:])
    other_idx = np.empty((len(others), tensor.nnz), dtype=np.int32)
    for j, m in enumerate(others):
        other_idx[j] = tensor.indices[:, m] if order is None else tensor.indices[order, m]
    values = tensor.values if order is None else tensor.values[order]
    return ModeCSR(mode, shape[mode], 0, indptr, np.ascontiguousarray(values), other_idx, others)


def row_major_order(tensor):
    """Permutation that sorts the nonzeros row-major (lexicographically by mode 0, 1, ...), or
    None when they already are. LSD radix: one stable pass per mode, last mode first."""
    if _is_lexsorted(tensor.indices):
        return None
    order = np.arange(tensor.nnz)
    for m in reversed(range(tensor.order)):
        order = order[_stable_order(tensor.indices[order, m], int(tensor.shape[m]))]
    return order


def _is_lexsorted(indices, chunk=1 << 22):
    """Whether the rows of ``indices`` (nnz x N) are in row-major (lexicographic) order."""
    nnz = len(indices)
    for start in range(0, max(nnz - 1, 0), chunk):
        block = indices[start:min(start + chunk + 1, nnz)]
        tied = np.ones(len(block) - 1, dtype=bool)  # equal in every mode compared so far
        for m in range(indices.shape[1]):
            step = np.diff(block[:, m])
            if np.any(tied & (step < 0)):
                return False
            tied &= step == 0
    return True


def _stable_order(keys, bound):
    """Stable argsort of non-negative integer ``keys`` < ``bound`` by 16-bit radix passes
    (NumPy's stable sort is a radix sort for 16-bit keys, timsort otherwise)."""
    order = np.arange(len(keys))
    shift = 0
    while shift == 0 or (bound - 1) >> shift:
        digit = ((keys[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        shift += 16
    return order


def partition_mode(csr, nparts, strategy):
    """Contiguous row blocks of one unfolding, one per rank.

    Returns
    -------
    list of ModeCSR
    """
    bounds = block_bounds(csr.indptr, nparts, strategy)
    return [csr.row_block(int(bounds[r]), int(bounds[r + 1])) for r in range(nparts)]


def block_bounds(indptr, nparts, strategy):
    """Row bounds (nparts + 1,) of the contiguous blocks of an unfolding with row pointers
    ``indptr`` (int64)."""
    plan = partition_rows(indptr, nparts, strategy)
    if not plan.contiguous:
        raise HisparseError(f"partition strategy '{strategy}' is not contiguous; CP-ALS needs "
                            f"row blocks")
    return np.asarray(plan.bounds, dtype=np.int64)


class RowBlockOwners:
    """The contiguous row blocks of one mode's unfolding, one per rank, cut from the mode's
    nonzeros per index alone (:func:`block_bounds`): the same bounds whether the counts come
    from the whole tensor on rank 0 or are summed over the ranks' slices.

    Also the router of :func:`~hisparse.layout.route_nonzeros`: :meth:`part_of` names the rank
    owning each nonzero's row.

    Attributes
    ----------
    mode : int
    bounds : ndarray, shape (nparts + 1,), int64
    """

    def __init__(self, mode, counts, nparts, strategy):
        self.mode = int(mode)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.bounds = block_bounds(indptr, nparts, strategy)
        # Owner of every row (a gather per nonzero, no search); 16-bit where it fits, so that
        # the routing's stable sort by owner is a radix sort.
        owner_dtype = np.int16 if nparts <= np.iinfo(np.int16).max else np.int32
        self._row_owner = np.repeat(np.arange(nparts, dtype=owner_dtype), np.diff(self.bounds))
        self._device_owner = None  # its copy on the device, made when first needed

    def part_of(self, indices):
        """The rank owning each nonzero of ``indices`` (k, N), in their array module (CuPy:
        on the device, where a tensor generated there is routed from)."""
        xp = array_module(indices)
        if xp is np:
            return self._row_owner[indices[:, self.mode]]
        if self._device_owner is None:
            self._device_owner = xp.asarray(self._row_owner)
        return self._device_owner[indices[:, self.mode]]

    def rows_of(self, rank):
        """``(n_rows, row_offset)`` of ``rank``'s block."""
        return int(self.bounds[rank + 1] - self.bounds[rank]), int(self.bounds[rank])


def mode_counts(indices, shape):
    """Nonzeros of ``indices`` (k, N) per index of every mode, concatenated in mode order (int64,
    on the host; summed over the ranks' slices, the whole tensor's). NumPy or CuPy."""
    if array_module(indices) is np:
        return mode_histograms(indices, shape, mode=None)  # no mode left out
    return np.concatenate([index_counts(indices[:, m], int(size))
                           for m, size in enumerate(shape)])


def index_counts(column, size):
    """Nonzeros per index (``size`` of them) of one mode's ``column`` of coordinates, NumPy or
    CuPy (int64, on the host): :func:`mode_counts` on the device.

    On a GPU a count per nonzero is an atomic addition, and additions to one address serialise:
    in a generated tensor every nonzero of a fiber has the fiber's index in every other mode, so
    a column holds long runs of equal indices; the device count adds each run among a thread's
    values once (:func:`~hisparse.arrays.count_values`)."""
    return host_array(count_values(column, size))


def split_counts(joined, shape):
    """:func:`mode_counts`' array, one array per mode."""
    return np.split(joined, np.cumsum([int(s) for s in shape])[:-1])


def coo_blocks(tensor, mode, nparts, strategy, index_dtype):
    """The nonzeros of each rank's block of rows of the mode-``mode`` unfolding, unsorted: the
    blocks of :func:`partition_mode` (the same bounds, from the row counts alone) without
    sorting anything, for the GPU engines to sort on their devices.

    One rank's block is the whole tensor (its arrays, not a copy); with several, rank ``r`` gets
    the nonzeros whose mode-``mode`` index lies in its block, in their order in ``tensor``.

    Returns
    -------
    list of ModeCOO
    """
    shape = tuple(int(s) for s in tensor.shape)
    counts = np.bincount(tensor.indices[:, mode], minlength=shape[mode])
    blocks = RowBlockOwners(mode, counts, nparts, strategy)
    if nparts == 1:
        return [ModeCOO(mode, shape[mode], 0, shape, tensor.indices, tensor.values,
                        index_dtype)]
    pieces = split_by_owner(blocks.part_of(tensor.indices), nparts, tensor.indices,
                            tensor.values)
    return [ModeCOO(mode, *blocks.rows_of(r), shape, indices, values, index_dtype)
            for r, (indices, values) in enumerate(pieces)]
