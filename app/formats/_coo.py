"""Coordinate-format sparse tensors of any order."""
from dataclasses import dataclass

import numpy as np

from ._checks import first_non_finite
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
        """Sort by coordinates (row-major) and merge duplicates (``sum``) or reject them."""
        if self.nnz == 0:
            return self
        # lexsort (last key is primary) works for any shape, where a linear index could overflow.
        order = np.lexsort(self.indices.T[::-1])
        ordered = self.indices[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
        if first.all():
            return COOTensor(ordered, self.values[order], tuple(self.shape))
        if duplicates == "reject":
            bad = int(order[int(np.argmin(first))])
            raise InputError(f"{name}: duplicate coordinates {tuple(int(i) for i in self.indices[bad])}"
                             f" (nonzero {bad}); set input.duplicates: sum to merge them")
        starts = np.flatnonzero(first)
        values = np.add.reduceat(self.values[order], starts)
        return COOTensor(ordered[starts], values, tuple(self.shape))

    def astype(self, value_dtype):
        return COOTensor(self.indices, self.values.astype(value_dtype, copy=False),
                         tuple(self.shape))
