"""CP-ALS data and state that are not engine-specific: the CSR of a mode-n unfolding and its row
blocks (one rank's share: :class:`UnfoldingBlocks`), or a block's nonzeros unsorted for a GPU to
sort (:class:`ModeCOO`, cut by :func:`coo_blocks`), the blocks' bounds from per-mode counts
(:class:`RowBlockOwners`, also the router of a tensor read by parts), ||X|| from the ranks'
blocks, initial factors, checkpoints with the fingerprint of their run, and the plain NumPy
CP-ALS used as the verification reference.

The mode-n unfolding X_(n) has one row per index of mode n. Its CSR here stores, per nonzero, the
value and the N-1 coordinates of the other modes as separate int32 arrays (cheaper to decode than
a linearised column id, which would overflow int64 for many FROSTT shapes). Nonzeros are sorted by
the row, then by the other modes in increasing mode order, so runs of equal leading coordinates
(fibers of the last other mode) are contiguous; the faster MTTKRP kernel reuses factor rows
along such runs.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import numpy as np

from ...compiled import compiled_parallel, prange
from ...errors import HisparseError, InputError
from ...arrays import host_array
from ...io import hdf5_reference_check, open_member, split_hdf5_reference
from ...partition import partition_rows, split_by_owner
from ...arrays import array_module
from ...partition import mode_histograms


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

    Also the router of :func:`~hisparse.io.route_nonzeros`: :meth:`part_of` names the rank
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
    in a generated tensor every nonzero of a fiber has the fiber's index in every other mode
    (runs of about 7 equal neighbours at nell-2's 0.14 fibers per nonzero), and CuPy's
    ``bincount`` took 0.21 s for the three modes at 77M nonzeros. Where the column's runs of
    equal indices average two or more nonzeros, each run adds its length once instead (0.08 s;
    exact: integer sums below 2**53 in fp64)."""
    xp = array_module(column)
    count = len(column)
    if count == 0:
        return np.zeros(size, dtype=np.int64)
    change = column[1:] != column[:-1]
    if 2 * (int(xp.count_nonzero(change)) + 1) > count:
        counts = xp.bincount(column, minlength=size)
    else:
        starts = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.flatnonzero(change) + 1])
        lengths = xp.diff(xp.concatenate([starts, xp.full(1, count, dtype=xp.int64)]))
        counts = xp.bincount(column[starts], weights=lengths.astype(xp.float64),
                             minlength=size)
    return host_array(counts.astype(xp.int64))


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


# -- the column products of a solve -----------------------------------------------------------

def product_width(rank):
    """Entries of one rank's column products: U^T U (R*R), <U, M> (1), column maxima (R)."""
    return rank * rank + 1 + rank


def reduction_parts(total, rank):
    """``(sums, maxima)``: views of a column-products array, what the ranks reduce: U^T U and
    <U, M> (R*R + 1, summed), then the column maxima of |U| (R, maximised)."""
    return total[:rank * rank + 1], total[rank * rank + 1:]


def split_products(total, rank):
    """``(U^T U (R x R), <U, M>, column maxima (R,))`` of a column-products array (views of
    ``total`` but for the float)."""
    r2 = rank * rank
    return total[:r2].reshape(rank, rank), float(total[r2]), total[r2 + 1:]


# -- the norm of the tensor -------------------------------------------------------------------

def squares_sum(values):
    """Sum of the squares of one rank's mode-0 block values (fp64). The squares are made where
    the values are (NumPy or CuPy: correctly rounded products, the same bits) and added on the
    host by NumPy's pairwise sum, as the rank-0 path adds them, so ||X|| keeps its bits (a
    device reduction would add in another order)."""
    wide = values.astype(np.float64)
    return float(np.sum(host_array(wide * wide)))


def norm_from_blocks(sums):
    """||X|| from :func:`squares_sum` of every rank's mode-0 block, in rank order.

    The rank-0 path and the ranks' own blocks give the same bits: each sum is over the same
    array, and the sums are added exactly (``math.fsum``), not in an all-reduce's order.
    """
    return float(np.sqrt(math.fsum(sums)))


# -- initial factors --------------------------------------------------------------------------

#: Config check of ``operation.params.init``.
init_check = hdf5_reference_check(
    ("random", "nvecs"), "'random', 'nvecs' or 'FILE.h5[:/group]' holding factor_0..factor_{N-1}",
    inner_required=False)


def random_factors(shape, rank, seed, dtype=np.float64):
    """Uniform [0, 1) factors from ``seed`` (Tensor Toolbox / pyttb 'random'), one per mode.

    The first mode's factor is generated too, though CP-ALS never reads it (it is solved first).
    """
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.0, 1.0, size=(int(size), rank)).astype(dtype) for size in shape]


def nvecs_factors(tensor, rank, dtype=np.float64):
    """Leading ``rank`` left singular vectors of each unfolding (Tensor Toolbox 'nvecs').

    Eigenvectors of X_(n) X_(n)^T for the ``rank`` largest eigenvalues, sign fixed so that the
    largest-magnitude entry of each vector is positive (TTB ``nvecs`` flips this way; the first
    such entry where several tie). Computed from the whole tensor (rank 0 holds it for this
    init), so every rank count starts from the same bits; C-ordered, as the engines' in-place
    row all-gathers need.
    """
    factors = []
    for mode, size in enumerate(tensor.shape):
        if rank > size:
            raise InputError(f"init 'nvecs' needs rank <= every mode length; mode {mode} has "
                             f"{size} < rank {rank}")
        vecs = _leading_eigenvectors(_unfolding_gram(tensor, mode), rank)
        biggest = np.argmax(np.abs(vecs), axis=0)
        signs = np.sign(vecs[biggest, np.arange(rank)])
        signs[signs == 0] = 1.0
        factors.append(np.ascontiguousarray(vecs * signs, dtype=dtype))
    return factors


def _unfolding_gram(tensor, mode):
    """X_(n) X_(n)^T (sparse, fp64), the unfolding's columns compressed to the distinct ones."""
    import scipy.sparse as sp
    size = int(tensor.shape[mode])
    others = [m for m in range(tensor.order) if m != mode]
    _, columns = np.unique(tensor.indices[:, others], axis=0, return_inverse=True)
    unfolding = sp.csr_matrix((tensor.values.astype(np.float64),
                               (tensor.indices[:, mode], columns.ravel())),
                              shape=(size, int(columns.max()) + 1 if len(columns) else 1))
    return (unfolding @ unfolding.T).tocsr()


def _leading_eigenvectors(gram, rank):
    """Eigenvectors of the symmetric ``gram`` for its ``rank`` largest eigenvalues, largest
    first: dense LAPACK for small or nearly full problems, else ARPACK from a fixed start (its
    default start is random, which would make the factors differ from run to run)."""
    size = gram.shape[0]
    if size <= 2000 or rank >= size - 1:
        w, v = np.linalg.eigh(gram.toarray())
        return v[:, np.argsort(w, kind="stable")[::-1][:rank]]
    import scipy.sparse.linalg as spla
    w, v = spla.eigsh(gram.astype(np.float64), k=rank, which="LA",
                      v0=np.full(size, 1.0 / np.sqrt(size)))
    return v[:, np.argsort(w, kind="stable")[::-1]]


def read_factor_file(spec, shape, rank, dtype=np.float64):
    """Factors from ``FILE.h5`` or ``FILE.h5:/group`` (datasets ``factor_0`` .. ``factor_{N-1}``,
    e.g. the ``/result`` group of an earlier results file)."""
    import h5py
    path, group = split_hdf5_reference(spec)
    factors = []
    try:
        with h5py.File(path, "r") as handle:
            grp = open_member(handle, path, group, "group", "operation.params.init")
            for mode, size in enumerate(shape):
                name = f"factor_{mode}"
                if name not in grp:
                    raise InputError(f"{path}:{group}: dataset '{name}' (operation.params.init) "
                                     f"not found")
                array = np.asarray(grp[name][()])
                if array.shape != (size, rank):
                    raise InputError(f"{path}:{group}/{name} has shape {array.shape}, expected "
                                     f"({size}, {rank}) for mode {mode} at rank {rank}")
                if not np.isfinite(array).all():
                    raise InputError(f"{path}:{group}/{name} holds NaN/Inf")
                factors.append(array.astype(dtype))
    except OSError as exc:
        raise InputError(f"{path}: cannot read initial factors ({exc})") from None
    return factors


# -- checkpoints ------------------------------------------------------------------------------

CHECKPOINT_SCHEMA = "hisparse.cpals_checkpoint"

#: What a checkpoint must share with a run that resumes from it, with the words for a mismatch.
FINGERPRINT = {"shape": "tensor shape", "nnz": "nonzeros", "data_hash": "tensor data hash",
               "rank": "rank", "init": "init", "precision": "precision"}


def run_fingerprint(shape, unfolding, rank, init, precision):
    """The identity of a run's input and of the parameters that shape its iterates.

    The data hash is BLAKE2b over the mode-0 unfolding (row pointers as int64, the other modes'
    coordinates, the values at the run's precision): its nonzeros are in canonical order, so the
    same tensor hashes the same whatever the order of its file.

    Parameters
    ----------
    shape : tuple of int
    unfolding : ModeCSR
        The whole mode-0 unfolding.
    rank : int
    init : str
        How the factors were started (``"random (run.seed 3)"``, ``"nvecs"``, a file spec).
    precision : {"fp64", "fp32"}

    Returns
    -------
    dict
        Keys of :data:`FINGERPRINT`.
    """
    digest = hashlib.blake2b(digest_size=16)
    for array in (np.asarray(unfolding.indptr, dtype=np.int64), unfolding.other_idx,
                  unfolding.values):
        digest.update(np.ascontiguousarray(array))
    return {"shape": tuple(int(s) for s in shape), "nnz": int(unfolding.nnz),
            "data_hash": digest.hexdigest(), "rank": int(rank), "init": str(init),
            "precision": str(precision)}


def write_checkpoint(path, state):
    """Write the ALS state after an iteration (atomic: temporary file, then rename).

    Parameters
    ----------
    state : dict
        ``factors`` (list of (I_m, R) arrays, normalised), ``grams`` (list of (R, R) fp64),
        ``lam`` (R,), ``fits`` (iterations done,), ``fingerprint`` (:func:`run_fingerprint`).
    """
    from ...io import atomic_file
    # The io guard: replaces only a previous checkpoint (its schema attribute), cleans up.
    with atomic_file(path, what="checkpoint", replaces=CHECKPOINT_SCHEMA) as out:
        handle = out.h5()
        handle.attrs["schema"] = CHECKPOINT_SCHEMA
        handle.attrs["iteration"] = len(state["fits"])
        for key, value in state["fingerprint"].items():
            handle.attrs[key] = np.asarray(value, dtype=np.int64) if key == "shape" else value
        handle.create_dataset("fits", data=np.asarray(state["fits"], dtype=np.float64))
        handle.create_dataset("lambda", data=np.asarray(state["lam"], dtype=np.float64))
        for mode, (factor, gram) in enumerate(zip(state["factors"], state["grams"])):
            handle.create_dataset(f"factor_{mode}", data=factor)
            handle.create_dataset(f"gram_{mode}", data=gram)


def read_checkpoint(path, fingerprint, dtype):
    """Read a checkpoint written by :func:`write_checkpoint` for the run of ``fingerprint``.

    Raises
    ------
    InputError
        One line naming ``path``: the file is missing or not HDF5, not a CP-ALS checkpoint, of
        another input or other parameters (saying what differs), or a dataset is missing, of the
        wrong shape or not finite.
    """
    import h5py
    if not os.path.exists(path):
        raise InputError(f"{path}: checkpoint not found (operation.params.resume is true)")
    try:
        with h5py.File(path, "r") as handle:
            if handle.attrs.get("schema") != CHECKPOINT_SCHEMA:
                raise InputError(f"{path}: not a hisparse CP-ALS checkpoint")
            _check_fingerprint(path, handle.attrs, fingerprint)
            return _read_state(path, handle, fingerprint["shape"], fingerprint["rank"], dtype)
    except OSError as exc:
        raise InputError(f"{path}: cannot read checkpoint ({exc})") from None


def _check_fingerprint(path, attrs, wanted):
    missing = [key for key in FINGERPRINT if key not in attrs]
    if missing:
        raise InputError(f"{path}: checkpoint carries no fingerprint of its input "
                         f"({', '.join(missing)} missing: written by an older hisparse?), so it "
                         f"cannot be checked against this run; start without resume")
    saved = {key: attrs[key] for key in FINGERPRINT}
    saved["shape"] = tuple(int(s) for s in np.ravel(saved["shape"]))
    for key in ("nnz", "rank"):
        saved[key] = int(saved[key])
    for key in ("data_hash", "init", "precision"):
        saved[key] = str(saved[key])
    same_layout = all(saved[k] == wanted[k] for k in ("shape", "nnz", "precision"))
    differences = []
    for key, label in FINGERPRINT.items():
        # The hash is compared only where it can be the sole difference (same shape, nonzero
        # count and stored precision of the values).
        if saved[key] != wanted[key] and (key != "data_hash" or same_layout):
            differences.append(f"{label} {saved[key]} in the checkpoint, {wanted[key]} here")
    if differences:
        raise InputError(f"{path}: checkpoint is of another run ({'; '.join(differences)}); "
                         f"resume only with the input and parameters it was written with")


def _read_state(path, handle, shape, rank, dtype):
    """The datasets of a checkpoint, each checked for presence, shape and finite values."""
    order = len(shape)
    expected = {"fits": None, "lambda": (rank,)}
    for mode in range(order):
        expected[f"factor_{mode}"] = (int(shape[mode]), rank)
        expected[f"gram_{mode}"] = (rank, rank)
    arrays = {}
    for name, want in expected.items():
        dataset = handle.get(name)
        if dataset is None or not hasattr(dataset, "shape"):
            raise InputError(f"{path}: checkpoint dataset '{name}' not found")
        if (want is None and len(dataset.shape) != 1) or (want is not None and
                                                           dataset.shape != want):
            raise InputError(f"{path}: checkpoint dataset '{name}' has shape {dataset.shape}, "
                             f"expected {want or '(iterations,)'}")
        array = dataset[()]
        if array.dtype.kind not in "fiu" or not np.isfinite(array).all():
            raise InputError(f"{path}: checkpoint dataset '{name}' does not hold finite numbers")
        arrays[name] = array
    return {"fits": [float(f) for f in arrays["fits"]],
            "lam": arrays["lambda"].astype(np.float64),
            "factors": [arrays[f"factor_{m}"].astype(dtype) for m in range(order)],
            "grams": [arrays[f"gram_{m}"].astype(np.float64) for m in range(order)]}


# -- reference --------------------------------------------------------------------------------

def coo_rows(values, subs, n, size):
    """The nonzeros (``values``, ``subs``) grouped by their mode-``n`` index, in their own order
    within a group (a stable sort): ``(row pointers, values, subs)``, for :func:`coo_mttkrp`."""
    order = np.argsort(subs[:, n], kind="stable")
    pointers = np.zeros(int(size) + 1, dtype=np.int64)
    np.cumsum(np.bincount(subs[:, n], minlength=int(size)), out=pointers[1:])
    return pointers, values[order], np.ascontiguousarray(subs[order])


@compiled_parallel
def _coo_mttkrp_rows(pointers, values, subs, factors, others, out):
    """Row ``i`` of the MTTKRP: the sum, in the nonzeros' order, of value x the other modes'
    factor rows (multiplied in mode order), rows on every core."""
    rank = out.shape[1]
    for row in prange(len(pointers) - 1):
        term = np.empty(rank)
        for j in range(pointers[row], pointers[row + 1]):
            term[:] = values[j]
            for m in others:
                factor_row = factors[m][subs[j, m]]
                for r in range(rank):
                    term[r] *= factor_row[r]
            for r in range(rank):
                out[row, r] += term[r]


def coo_mttkrp(by_row, factors, n):
    """The mode-``n`` MTTKRP of a COO tensor from ``by_row`` (its :func:`coo_rows` for mode n),
    fp64: the same sums, in the same order, as the sparse indicator product
    ``csr(ones, (subs[:, n], arange(nnz))) @ (values x the other factors' rows)``."""
    pointers, values, subs = by_row
    out = np.zeros((len(pointers) - 1, factors[0].shape[1]))
    others = np.array([m for m in range(len(factors)) if m != n], dtype=np.int64)
    _coo_mttkrp_rows(pointers, values, subs,
                     tuple(np.ascontiguousarray(f, dtype=np.float64) for f in factors), others, out)
    return out


def numpy_cp_als(tensor, factors, rank, tol, max_iters, fits_done=(), grams=None):
    """Plain NumPy CP-ALS with the Tensor Toolbox rules, the verification reference.

    Independent of the engines: MTTKRP straight from the COO coordinates (each row's nonzeros
    added in their order, :func:`coo_mttkrp`, compiled), ``np.linalg.solve`` as pyttb does,
    fp64 throughout.

    Parameters
    ----------
    tensor : COOTensor
    factors : list of ndarray, shape (I_m, R)
        Initial factors (the first mode's is not read).
    fits_done, grams : optional
        When continuing a checkpointed run: the fits of the iterations already done and the
        saved Grams (R x R each) of ``factors``.

    Returns
    -------
    dict
        ``fits`` (list of float), ``lam`` (R,), ``factors`` (list of (I_m, R)).
    """
    order = tensor.order
    values = np.ascontiguousarray(tensor.values, dtype=np.float64)
    subs = np.ascontiguousarray(tensor.indices, dtype=np.int64)
    norm_x = float(np.sqrt(np.sum(values * values)))
    factors = [np.array(f, dtype=np.float64) for f in factors]
    grams = [f.T @ f for f in factors] if grams is None else [np.array(g) for g in grams]
    by_row = [coo_rows(values, subs, n, tensor.shape[n]) for n in range(order)]
    fits = [float(f) for f in fits_done]
    fit, lam = (fits[-1] if fits else 0.0), np.ones(rank)
    for iteration in range(len(fits), max_iters):
        fit_old = fit
        for n in range(order):
            mttkrp = coo_mttkrp(by_row[n], factors, n)
            v = np.ones((rank, rank))
            for m in range(order):
                if m != n:
                    v = v * grams[m]
            unew = np.linalg.solve(v.T, mttkrp.T).T
            if iteration == 0:
                lam = np.sqrt(np.sum(unew ** 2, axis=0))
            else:
                lam = np.maximum(np.max(np.abs(unew), axis=0), 1.0)
            factors[n] = unew / lam
            grams[n] = factors[n].T @ factors[n]
        hadamard = np.ones((rank, rank))
        for g in grams:
            hadamard = hadamard * g
        norm_m2 = float(lam @ hadamard @ lam)
        inner = float(np.sum(lam * np.sum(factors[-1] * mttkrp, axis=0)))
        residual = np.sqrt(abs(norm_x ** 2 + norm_m2 - 2.0 * inner))
        fit = 1.0 - residual / norm_x if norm_x > 0 else 0.0
        fits.append(fit)
        if iteration > 0 and abs(fit - fit_old) < tol:
            break
    return {"fits": fits, "lam": lam, "factors": factors}
