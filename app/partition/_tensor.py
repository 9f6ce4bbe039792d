"""N-1-dimensional grid partitions of a sparse tensor for mode-n products (SpTV).

Every mode except the fiber mode ``n`` is cut into contiguous index ranges; the ranges form a grid
of ``nparts`` blocks, one per rank. A block holds whole mode-``n`` fibers, so each rank computes
its own block of Y and no reduction across ranks is needed.

Strategies
----------
``grid_nnz``
    Cuts of each mode at the quantiles of that mode's nonzero count (marginal histogram), for every
    factorisation of ``nparts`` into a grid; the grid whose blocks have the smallest nnz imbalance
    (max / mean) wins.
``grid_uniform``
    Equal index ranges per mode (the seed's layout); the grid shape is still chosen by imbalance.
"""
from dataclasses import dataclass

import numpy as np

from ..arrays import array_module, count_values, host_array, operand
from ..errors import LayoutError

TENSOR_STRATEGIES = ("grid_nnz", "grid_uniform")


@dataclass
class TensorGridPartition:
    """Which block of the N-1 other modes each rank owns.

    Attributes
    ----------
    strategy : str
    mode : int
        The fiber mode (not cut).
    other_modes : tuple of int
        The N-1 cut modes, increasing.
    grid : tuple of int
        Parts per other mode; their product is the number of ranks.
    cuts : list of ndarray, int64
        ``cuts[j]`` has ``grid[j] + 1`` bounds over ``other_modes[j]``.
    nnz_per_part : ndarray, shape (nparts,), int64
    """

    strategy: str
    mode: int
    other_modes: tuple
    grid: tuple
    cuts: list
    nnz_per_part: np.ndarray

    @property
    def nparts(self):
        return int(np.prod(self.grid))

    @property
    def imbalance(self):
        """Max over mean of the nonzeros per part (1.0 is perfect; 1.0 for an empty tensor)."""
        mean = self.nnz_per_part.mean() if len(self.nnz_per_part) else 0.0
        return float(self.nnz_per_part.max() / mean) if mean > 0 else 1.0

    def part_of(self, indices):
        """Owning part of each nonzero.

        Parameters
        ----------
        indices : ndarray, shape (nnz, N), int

        Returns
        -------
        ndarray, shape (nnz,), int64
        """
        return _block_ids(indices, self.other_modes, self.grid, self.cuts)

    def block_ranges(self, part):
        """``[(lo, hi), ...]`` index range of ``part`` in each other mode."""
        position = np.unravel_index(part, self.grid)
        return [(int(c[p]), int(c[p + 1])) for c, p in zip(self.cuts, position)]


def grid_shapes(nparts, ndims):
    """Every ordered factorisation of ``nparts`` into ``ndims`` positive factors.

    Returns
    -------
    list of tuple of int
    """
    if ndims == 1:
        return [(nparts,)]
    shapes = []
    for first in range(1, nparts + 1):
        if nparts % first == 0:
            shapes += [(first,) + rest for rest in grid_shapes(nparts // first, ndims - 1)]
    return shapes


def _nnz_cuts(counts, parts):
    """Bounds (parts + 1,) splitting an axis with per-index nonzero ``counts`` into ``parts``
    ranges of about equal nonzeros; each range is non-empty in indices."""
    size = len(counts)
    # Weight = nonzeros + 1 per index: an empty index costs a little, so runs of empty indices
    # are spread too and ties between equal quantiles are broken.
    weight = np.concatenate([[0], np.cumsum(counts.astype(np.float64) + 1.0)])
    targets = weight[-1] * np.arange(1, parts, dtype=np.float64) / parts
    cuts = np.searchsorted(weight, targets, side="left").astype(np.int64)
    bounds = np.concatenate([[0], cuts, [size]]).astype(np.int64)
    for k in range(1, parts):
        bounds[k] = min(max(bounds[k], bounds[k - 1] + 1), size - (parts - k))
    return bounds


def _block_ids(indices, other_modes, grid, cuts):
    xp = array_module(indices)
    block = xp.zeros(len(indices), dtype=xp.int64)
    for mode, parts, bounds in zip(other_modes, grid, cuts):
        block *= operand(xp, parts)
        if parts > 1:
            block += xp.searchsorted(xp.asarray(bounds[1:-1]), indices[:, mode], side="right")
    return block


def mode_histograms(indices, shape, mode):
    """Nonzeros per index of every mode other than ``mode``, concatenated in mode order (int64,
    on the host): what :func:`partition_tensor` cuts by, and what ranks that each hold some
    nonzeros sum to cut alike (:func:`hisparse.layout.plan_tensor_grid`)."""
    xp = array_module(indices)
    counts = [count_values(indices[:, m], int(size)) for m, size in enumerate(shape) if m != mode]
    joined = xp.concatenate(counts) if counts else xp.zeros(0, xp.int64)
    return host_array(joined)


def _check_shape(shape):
    empty = [m for m in range(len(shape)) if shape[m] == 0]
    if empty:
        raise LayoutError(f"the tensor has no index in mode {empty[0]} (shape {shape}): there is "
                          f"nothing to split over the ranks")


def grid_candidates(shape, mode, nparts, strategy, histograms=None):
    """Every grid of ``nparts`` blocks over the modes other than ``mode`` that fits the shape,
    with its cuts: ``[(grid, cuts), ...]``. ``histograms`` (:func:`mode_histograms` of the whole
    tensor) are needed by ``grid_nnz`` when ``nparts > 1``.

    Raises
    ------
    LayoutError
        An empty mode, or no grid fits (more ranks than the other modes' sizes allow).
    """
    if strategy not in TENSOR_STRATEGIES:
        raise ValueError(f"unknown tensor partition strategy {strategy!r}")
    shape = tuple(int(s) for s in shape)
    _check_shape(shape)
    other = tuple(m for m in range(len(shape)) if m != mode)
    offsets = np.concatenate([[0], np.cumsum([shape[m] for m in other])])
    candidates = []
    for grid in grid_shapes(nparts, len(other)):
        if any(parts > shape[m] for parts, m in zip(grid, other)):
            continue
        cuts = []
        for j, (parts, m) in enumerate(zip(grid, other)):
            if strategy == "grid_uniform" or parts == 1:
                cuts.append(np.linspace(0, shape[m], parts + 1).round().astype(np.int64))
            else:
                cuts.append(_nnz_cuts(histograms[offsets[j]:offsets[j + 1]], parts))
        candidates.append((grid, cuts))
    if not candidates:
        sizes = ", ".join(f"mode {m}: {shape[m]}" for m in other)
        raise LayoutError(f"cannot split the modes other than {mode} ({sizes}) into a grid of "
                          f"{nparts} blocks; run with fewer ranks")
    return candidates


def candidate_counts(indices, shape, mode, candidates):
    """Nonzeros of ``indices`` in each block of each candidate grid, shape ``(len(candidates),
    nparts)`` int64 on the host (summed over ranks, the whole tensor's)."""
    other = tuple(m for m in range(len(shape)) if m != mode)
    nparts = int(np.prod(candidates[0][0]))
    out = np.zeros((len(candidates), nparts), dtype=np.int64)
    for row, (grid, cuts) in enumerate(candidates):
        if nparts == 1:
            out[row, 0] = len(indices)
            continue
        out[row] = host_array(count_values(_block_ids(indices, other, grid, cuts), nparts))
    return out


def best_grid(shape, mode, strategy, candidates, counts):
    """The candidate whose blocks have the smallest nnz imbalance (the first among equals), as a
    :class:`TensorGridPartition`; ``counts`` as :func:`candidate_counts` gives them."""
    other = tuple(m for m in range(len(shape)) if m != mode)
    best = None
    for (grid, cuts), per_part in zip(candidates, counts):
        candidate = TensorGridPartition(strategy, mode, other, tuple(grid), cuts,
                                        np.asarray(per_part, dtype=np.int64))
        if best is None or candidate.imbalance < best.imbalance - 1e-12:
            best = candidate
    return best


def partition_tensor(indices, shape, mode, nparts, strategy="grid_nnz"):
    """Split the modes other than ``mode`` into a grid of ``nparts`` blocks.

    Parameters
    ----------
    indices : ndarray, shape (nnz, N), int
        Coordinates of the nonzeros (NumPy, or CuPy: counted on the GPU).
    shape : tuple of int, length N
    mode : int
        Fiber mode (never cut).
    nparts : int
        Number of ranks.
    strategy : {"grid_nnz", "grid_uniform"}

    Returns
    -------
    TensorGridPartition

    Raises
    ------
    LayoutError
        When no grid fits (more ranks than can be placed over the other modes' sizes).
    """
    if strategy not in TENSOR_STRATEGIES:
        raise ValueError(f"unknown tensor partition strategy {strategy!r}")
    shape = tuple(int(s) for s in shape)
    _check_shape(shape)
    histograms = mode_histograms(indices, shape, mode) \
        if strategy == "grid_nnz" and nparts > 1 else None
    candidates = grid_candidates(shape, mode, nparts, strategy, histograms)
    return best_grid(shape, mode, strategy, candidates,
                     candidate_counts(indices, shape, mode, candidates))
