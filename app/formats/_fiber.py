"""Fiber-compressed sparse tensors for mode-n products (SpTV): the (P_f, Ind, Val, N_f) layout.

A mode-``n`` fiber of an N-order tensor is the set of entries sharing every coordinate except the
mode-``n`` one. SpTV ``Y = X x_n v`` is one dot product per fiber, so the format stores the
nonzeros grouped by fiber:

- ``fiber_ptr`` (P_f): fiber ``f`` owns nonzeros ``fiber_ptr[f]:fiber_ptr[f + 1]``;
- ``fiber_index`` (Ind): the mode-``n`` index of each nonzero (the only index the product reads);
- ``values`` (Val);
- ``fibers_per_slice`` (N_f): non-empty fibers of each slice of the first mode other than ``n``;
- ``fiber_coords``: the N-1 coordinates of each fiber, i.e. the coordinates of the output entry.

Empty fibers are never stored: every stored fiber holds at least one nonzero, so the number of
fibers is the number of nonzeros of Y.
"""
from dataclasses import dataclass

import numpy as np

from ..arrays import count_values, host_array, operand, unravel
from ..errors import InputError


def fiber_index_dtype(size):
    """Narrowest integer dtype holding every index ``0 .. size - 1`` of the fiber mode.

    ``uint16`` for modes of at most 65536 indices: Ind is read once per nonzero, so two bytes
    instead of four cut the kernel's memory traffic by about a sixth in fp64.
    """
    if size <= 1 << 16:
        return np.dtype(np.uint16)
    if size <= np.iinfo(np.int32).max:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


def linear_fiber_keys(coords, dims):
    """Row-major linear key of each coordinate tuple, or ``None`` when it could overflow int64.

    Parameters
    ----------
    coords : ndarray, shape (m, k), int
    dims : sequence of int, length k

    Returns
    -------
    ndarray, shape (m,), int64, or None
    """
    if float(np.prod([float(d) for d in dims])) >= 2.0 ** 62:
        return None
    keys = np.zeros(len(coords), dtype=np.int64)
    for column, size in enumerate(dims):
        keys *= np.int64(size)
        keys += coords[:, column].astype(np.int64, copy=False)
    return keys


@dataclass
class FiberTensor:
    """An N-order sparse tensor stored by mode-``mode`` fibers (empty fibers removed).

    Attributes
    ----------
    mode : int
        The fiber mode n (the mode contracted by SpTV).
    shape : tuple of int, length N
    fiber_ptr : ndarray, shape (nfibers + 1,), int64
        Strictly increasing (no empty fibers); ``fiber_ptr[0] == 0``, ``fiber_ptr[-1] == nnz``.
    fiber_index : ndarray, shape (nnz,), uint16, int32 or int64
        Mode-``mode`` index of each nonzero (see :func:`fiber_index_dtype`).
    values : ndarray, shape (nnz,), float32 or float64
    fiber_coords : ndarray, shape (nfibers, N - 1), int64
        Coordinates of each fiber in the other modes, in increasing mode order; fibers are
        sorted lexicographically by them.
    fibers_per_slice : ndarray, shape (shape[other_modes[0]],), int64
        Non-empty fibers per index of the first mode other than ``mode``.
    """

    mode: int
    shape: tuple
    fiber_ptr: np.ndarray
    fiber_index: np.ndarray
    values: np.ndarray
    fiber_coords: np.ndarray
    fibers_per_slice: np.ndarray

    @property
    def order(self):
        return len(self.shape)

    @property
    def nnz(self):
        return int(len(self.values))

    @property
    def nfibers(self):
        return int(len(self.fiber_ptr) - 1)

    @property
    def other_modes(self):
        """The N-1 modes indexing Y, in increasing order."""
        return tuple(m for m in range(self.order) if m != self.mode)

    @property
    def fiber_lengths(self):
        """Nonzeros per fiber, shape (nfibers,), int64 (all >= 1)."""
        return np.diff(self.fiber_ptr)

    def to_host(self):
        """This tensor with NumPy arrays (a copy of one built on the GPU; itself otherwise)."""
        arrays = ("fiber_ptr", "fiber_index", "values", "fiber_coords", "fibers_per_slice")
        if not any(hasattr(getattr(self, name), "get") for name in arrays):
            return self
        return FiberTensor(mode=self.mode, shape=self.shape,
                           **{name: host_array(getattr(self, name)) for name in arrays})

    def nbytes(self, pointer_dtype=np.int64):
        """Bytes of P_f, Ind and Val (what a kernel reads), with ``pointer_dtype`` pointers."""
        return int((self.nfibers + 1) * np.dtype(pointer_dtype).itemsize + self.fiber_index.nbytes
                   + self.values.nbytes)

    @classmethod
    def from_coo(cls, tensor, mode, name="tensor"):
        """Group the nonzeros of a COO tensor by mode-``mode`` fibers.

        Parameters
        ----------
        tensor : COOTensor
            Duplicate-free (as :meth:`COOTensor.validate` returns it).
        mode : int
            Fiber mode, ``0 <= mode < N``.
        name : str
            Used in error messages.

        Returns
        -------
        FiberTensor
        """
        shape = tuple(int(s) for s in tensor.shape)
        order = len(shape)
        if not 0 <= mode < order:
            raise InputError(f"{name}: mode {mode} out of range for an order-{order} tensor "
                             f"(operation.params.mode must lie in [0, {order}))")
        other = [m for m in range(order) if m != mode]
        other_dims = [shape[m] for m in other]
        indices = tensor.indices
        nnz = tensor.nnz
        coords = indices[:, other]
        keys = linear_fiber_keys(coords, other_dims)
        permutation = _fiber_major_permutation(indices, keys, mode, shape[mode])
        if permutation is not None:
            coords = coords[permutation]
            keys = keys[permutation] if keys is not None else None
            fiber_index = indices[permutation, mode]
            values = tensor.values[permutation]
        else:
            fiber_index = indices[:, mode]
            values = tensor.values
        if nnz:
            if keys is not None:
                starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
            else:
                starts = np.flatnonzero(np.concatenate(
                    [[True], (coords[1:] != coords[:-1]).any(axis=1)]))
        else:
            starts = np.zeros(0, dtype=np.int64)
        fiber_ptr = np.concatenate([starts, [nnz]]).astype(np.int64)
        fiber_coords = np.ascontiguousarray(coords[starts], dtype=np.int64)
        slice_size = shape[other[0]]
        fibers_per_slice = np.bincount(fiber_coords[:, 0], minlength=slice_size).astype(np.int64) \
            if len(fiber_coords) else np.zeros(slice_size, dtype=np.int64)
        return cls(mode=mode, shape=shape, fiber_ptr=fiber_ptr,
                   fiber_index=np.ascontiguousarray(fiber_index).astype(
                       fiber_index_dtype(shape[mode]), copy=False),
                   values=np.ascontiguousarray(values), fiber_coords=fiber_coords,
                   fibers_per_slice=fibers_per_slice)


def _fiber_major_permutation(indices, keys, mode, mode_size):
    """Permutation that groups the nonzeros by fiber, fibers in lexicographic order; ``None``
    when they already are.

    Cheapest case first: when every fiber is one contiguous run of nonzeros (COO sorted with the
    fiber mode last, or generated fiber by fiber in any fiber order) only the runs are sorted,
    keeping the order inside each run. Otherwise one argsort of ``fiber key * I_n + i_n`` (mode-n
    indices ascending inside a fiber), or a lexsort when that key could overflow.
    """
    nnz = len(indices)
    if nnz < 2:
        return None
    if keys is not None:
        run_starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
        run_keys = keys[run_starts]
        if (np.diff(run_keys) > 0).all():
            return None  # fiber-major already
        run_order = np.argsort(run_keys, kind="stable")
        sorted_keys = run_keys[run_order]
        if (np.diff(sorted_keys) > 0).all():  # each fiber is exactly one run
            run_lengths = np.diff(np.concatenate([run_starts, [nnz]]))[run_order]
            new_starts = np.concatenate([[0], np.cumsum(run_lengths)[:-1]])
            return np.repeat(run_starts[run_order] - new_starts, run_lengths) + \
                np.arange(nnz, dtype=np.int64)
        if float(keys.max()) * mode_size + mode_size < 2.0 ** 63:
            return np.argsort(keys * np.int64(mode_size) + indices[:, mode], kind="stable")
    other = [m for m in range(indices.shape[1]) if m != mode]
    return np.lexsort(tuple(indices[:, m] for m in [mode] + other[::-1]))


# -- the same format built by sorting, with any array module (CuPy: on the GPU) -------------------

def stable_argsort(xp, keys):
    """Stable argsort with NumPy or CuPy (CuPy's sort is always stable and takes no ``kind``)."""
    return np.argsort(keys, kind="stable") if xp is np else xp.argsort(keys)


def run_starts(xp, keys):
    """Where each run of equal consecutive ``keys`` starts (int64; empty for no keys)."""
    if len(keys) == 0:
        return xp.zeros(0, dtype=xp.int64)
    change = xp.flatnonzero(keys[1:] != keys[:-1]).astype(xp.int64) + operand(xp, 1)
    return xp.concatenate([xp.zeros(1, dtype=xp.int64), change])


def sortable(shape, mode):
    """Whether :func:`fibers_by_sort` takes a tensor of this shape: (fiber key, mode-n index)
    fits in int64."""
    other = [float(s) for m, s in enumerate(shape) if m != mode]
    return float(np.prod(other)) * float(shape[mode]) < 2.0 ** 62


def fibers_by_sort(xp, indices, values, shape, mode):
    """:meth:`FiberTensor.from_coo` by sorting, with the array module ``xp`` (CuPy builds the
    format on the GPU from the uploaded COO; NumPy runs the same code on the host). The result
    equals ``from_coo``'s, which stays the reference: nonzeros stable-sorted by fiber key when
    every fiber is one contiguous run of the input (their order inside a fiber kept), else by
    (fiber key, mode-n index); no sort when the input is fiber-major already.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``; ``indices`` (nnz, N) int and ``values`` (nnz,) are its arrays.
    shape : sequence of int
    mode : int
        The fiber mode, ``0 <= mode < N``.

    Returns
    -------
    FiberTensor or None
        With ``xp`` arrays; ``None`` when (fiber key, index) could overflow int64 (use
        :meth:`FiberTensor.from_coo`).
    """
    if not sortable(shape, mode):
        return None
    shape = tuple(int(s) for s in shape)
    other = [m for m in range(len(shape)) if m != mode]
    dims = [shape[m] for m in other]
    nnz = int(len(values))
    keys = xp.zeros(nnz, dtype=xp.int64)
    for column, size in zip(other, dims):
        keys *= operand(xp, size)
        keys += indices[:, column].astype(xp.int64, copy=False)
    fiber_index = indices[:, mode]
    if nnz >= 2:
        run_keys = keys[run_starts(xp, keys)]
        if not bool((run_keys[1:] > run_keys[:-1]).all()):  # not fiber-major yet
            if len(xp.unique(run_keys)) == len(run_keys):  # each fiber one run: keep its order
                permutation = stable_argsort(xp, keys)
            else:
                permutation = stable_argsort(
                    xp, keys * operand(xp, shape[mode]) +
                    fiber_index.astype(xp.int64, copy=False))
            keys, fiber_index, values = keys[permutation], fiber_index[permutation], \
                values[permutation]
    starts = run_starts(xp, keys)
    fiber_ptr = xp.concatenate([starts, xp.full(1, nnz, dtype=xp.int64)])
    fiber_coords = unravel(keys[starts], dims)
    fibers_per_slice = count_values(xp.ascontiguousarray(fiber_coords[:, 0]), dims[0])
    return FiberTensor(mode=mode, shape=shape, fiber_ptr=fiber_ptr,
                       fiber_index=xp.ascontiguousarray(fiber_index).astype(
                           fiber_index_dtype(shape[mode]), copy=False),
                       values=xp.ascontiguousarray(values), fiber_coords=fiber_coords,
                       fibers_per_slice=fibers_per_slice)
