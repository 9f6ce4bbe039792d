"""Coordinate-format sparse tensors of any order."""
from dataclasses import dataclass

import numpy as np

from ._checks import first_non_finite
from ._fiber import linear_fiber_keys
from ..errors import InputError


@dataclass
class COOTensor:
    """A sparse N-order tensor in coordinate form.

    Parameters
    ----------
    indices : ndarray, shape (nnz, N), int64
        Zero-based coordinates of each nonzero, one column per mode.
    values : ndarray, shape (nnz,), float32 or float64
        Value of each nonzero.
    shape : tuple of int, length N
        Size of each mode.
    """

    indices: np.ndarray
    values: np.ndarray
    shape: tuple

    @property
    def nnz(self):
        return int(len(self.values))

    @property
    def order(self):
        return len(self.shape)

    def validate(self, name="tensor", duplicates="sum"):
        """Check coordinates and values; sum or reject duplicate coordinates.

        Returns the (possibly deduplicated) tensor; raises :class:`InputError` naming the first
        offending nonzero.
        """
        shape = tuple(int(s) for s in self.shape)
        if len(shape) < 2:
            raise InputError(f"{name}: order {len(shape)} < 2")
        if min(shape) < 0:
            raise InputError(f"{name}: negative size in shape {shape}")
        if self.values.ndim != 1:
            raise InputError(f"{name}: values must be 1-D (one per nonzero), got shape "
                             f"{self.values.shape}")
        if self.indices.ndim != 2 or self.indices.shape[1] != len(shape):
            raise InputError(f"{name}: indices has shape {self.indices.shape}, expected "
                             f"(nnz, {len(shape)})")
        if len(self.values) != self.indices.shape[0]:
            raise InputError(f"{name}: {self.indices.shape[0]} coordinates but "
                             f"{len(self.values)} values")
        for mode, size in enumerate(shape):
            column = self.indices[:, mode]
            if len(column) and (column.min() < 0 or column.max() >= size):
                bad = int(np.argmax((column < 0) | (column >= size)))
                raise InputError(f"{name}: index {int(column[bad])} out of range [0, {size}) in "
                                 f"mode {mode} at nonzero {bad}")
        bad = first_non_finite(name, self.values)
        if bad is not None:
            raise InputError(f"{name}: value {self.values[bad]} (NaN/Inf) at nonzero {bad} "
                             f"(coordinates {tuple(int(i) for i in self.indices[bad])})")
        return self.deduplicated(name, duplicates)

    def deduplicated(self, name="tensor", duplicates="sum"):
        """Sort by coordinates (row-major) and merge duplicates (``sum``) or reject them
        (:func:`sorted_nonzeros`; a rejected duplicate is named by its position here)."""
        if self.nnz == 0:
            return self
        positions = np.arange(self.nnz, dtype=np.int64) if duplicates == "reject" else None
        indices, values = sorted_nonzeros(self.indices, self.values, self.shape, duplicates,
                                             positions, name)
        return COOTensor(indices, values, tuple(self.shape))

    def astype(self, value_dtype):
        return COOTensor(self.indices, self.values.astype(value_dtype, copy=False),
                         tuple(self.shape))


def sorted_nonzeros(indices, values, shape, duplicates="sum", positions=None, label="tensor"):
    """Sort nonzeros (NumPy arrays) row-major by coordinates and merge (``sum``) or reject
    duplicates: a stable sort, so copies are summed in the order they came (the file's). A
    linear key when the shape's index space allows one (:func:`linear_fiber_keys`), else a
    lexicographic sort.

    Returns
    -------
    indices, values

    Raises
    ------
    InputError
        ``reject`` and a duplicate: names ``label``, the coordinates and, when ``positions``
        (each nonzero's position in the file) are given, the repeated nonzero's position.
    """
    if len(values) == 0:
        return indices, values
    keys = linear_fiber_keys(indices, shape)
    if keys is not None:
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        first = np.ones(len(order), dtype=bool)
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        del keys
        indices = indices[order]
    else:
        order = np.lexsort(indices.T[::-1])
        indices = indices[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (indices[1:] != indices[:-1]).any(axis=1)
    if first.all():
        return indices, values[order]
    if duplicates == "reject":
        bad = int(np.argmin(first))
        where = f" (nonzero {int(positions[order[bad]])})" if positions is not None else ""
        raise InputError(f"{label}: duplicate coordinates {tuple(int(i) for i in indices[bad])}"
                         f"{where}; set input.duplicates: sum to merge them")
    starts = np.flatnonzero(first)
    return indices[starts], np.add.reduceat(values[order], starts)
