"""Poisson stencils: the negative Laplacian on a regular 2D/3D grid, built row by row."""
import math

import numpy as np

from ._common import _BandRows, _whole


def _poisson_layout(dims, stencil):
    """Checked ``(dims, stencil)`` of a Poisson spec, the stencil defaulted."""
    dims = [int(d) for d in dims]
    if len(dims) not in (2, 3):
        raise ValueError("poisson dims must have 2 or 3 entries")
    stencil = stencil or (5 if len(dims) == 2 else 7)
    expected = (5, 9) if len(dims) == 2 else (7, 27)
    if stencil not in expected:
        raise ValueError(f"stencil {stencil} does not match {len(dims)}D dims")
    return dims, stencil


def _poisson_offsets(dims, stencil):
    """The stencil's neighbour offsets (one vector per neighbour, the centre included), ordered
    by linear offset so that every row's columns come out sorted."""
    ndim = len(dims)
    if stencil in (5, 7):
        offsets = [np.zeros(ndim, np.int64)]
        for axis in range(ndim):
            for step in (-1, 1):
                offset = np.zeros(ndim, np.int64)
                offset[axis] = step
                offsets.append(offset)
    else:  # the full box
        grids = np.meshgrid(*([np.array([-1, 0, 1])] * ndim), indexing="ij")
        offsets = list(np.stack([g.ravel() for g in grids], axis=1).astype(np.int64))
    strides = np.array([int(np.prod(dims[axis + 1:], dtype=np.int64)) for axis in range(ndim)],
                       dtype=np.int64)
    return sorted(offsets, key=lambda o: int(o @ strides)), strides



def _grid_coordinates(rows, dims):
    """The grid coordinates of row-major ``rows`` (as ``np.unravel_index``, in int32 when the
    row numbers fit: twice as fast)."""
    if math.prod(dims) <= np.iinfo(np.int32).max:
        rows = rows.astype(np.int32)
    coordinates = []
    for size in dims[:0:-1]:
        rows, coordinate = np.divmod(rows, size)
        coordinates.append(coordinate)
    return [rows] + coordinates[::-1]


def _poisson_band(dims, stencil, scale):
    """:class:`_BandRows` of the Poisson matrix: centre ``2 * ndim`` (5/7 points) or
    ``stencil - 1`` (9/27 points), -1 at every neighbour, all times ``scale``."""
    dims, stencil = _poisson_layout(dims, stencil)
    offsets, strides = _poisson_offsets(dims, stencil)
    offsets = np.array(offsets, dtype=np.int64)
    shape = np.array(dims, dtype=np.int64)
    centre_value = float(2 * len(dims) if stencil in (5, 7) else stencil - 1)
    centre = np.flatnonzero(~offsets.any(axis=1))[0]
    # Along each axis a grid point is at the low edge (bit 0), at the high edge (bit 1), both
    # (an axis of one point) or neither; the 4**ndim combinations' masks are tabulated once, so
    # a row's mask, length and diagonal slot are lookups of its class.
    ndim = len(dims)
    masks = np.ones((4 ** ndim, len(offsets)), dtype=bool)
    for code in range(4 ** ndim):
        for axis in range(ndim):
            edges = (code >> (2 * axis)) & 3
            steps = np.array([not edges & 1, True, not edges & 2])  # steps -1, 0, +1 stay on
            masks[code] &= steps[offsets[:, axis] + 1]
    counts = masks.sum(axis=1)
    before_centre = masks[:, :centre].sum(axis=1)

    def classes(rows):
        code = np.zeros(len(rows), dtype=np.intp)
        for axis, coordinate in enumerate(_grid_coordinates(rows, dims)):
            code |= ((coordinate == 0) | ((coordinate == shape[axis] - 1) << 1)) << (2 * axis)
        return code

    def pattern(rows):
        code = classes(rows)
        return masks[code], before_centre[code]

    def diagonal(rows):
        return np.full(len(rows), centre_value * scale)

    return _BandRows(int(np.prod(shape)), offsets @ strides, pattern,
                     lambda rows: counts[classes(rows)], diagonal, -1.0 * scale)


def poisson(dims, stencil=None, scale=1.0):
    """Negative Laplacian on a regular 2D/3D grid (SPD, symmetric).

    Rows are numbered row-major (the first grid dimension varies slowest, as in C arrays). The
    5/7-point stencil is the Kronecker sum of second differences (centre ``2 * ndim``); the
    9/27-point one the full box (centre ``stencil - 1``, -1 elsewhere: diagonally dominant,
    hence SPD). Built row by row (:func:`poisson_rows` gives any set of rows alone).

    Parameters
    ----------
    dims : list of int
        Grid points per dimension, length 2 or 3; the matrix has ``prod(dims)`` rows.
    stencil : int, optional
        5 or 9 (2D), 7 or 27 (3D); defaults to 5 / 7.
    """
    band = _poisson_band(dims, stencil, scale)
    return _whole(band.build(np.arange(band.nrows, dtype=np.int64), band.nrows), symmetric=True)


def poisson_rows(dims, rows, stencil=None, scale=1.0):
    """Rows ``rows`` (ascending global ids) of :func:`poisson`'s matrix, shape
    ``(len(rows), prod(dims))``, equal to those rows of the whole matrix."""
    band = _poisson_band(dims, stencil, scale)
    return band.build(rows, band.nrows)
