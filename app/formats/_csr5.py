"""The CSR5 sparse format (Liu & Vinter, ICS'15) and its NumPy reference builder and SpMV.

CSR5 cuts the nonzeros of a CSR matrix, in CSR order, into tiles of ``omega x sigma`` entries
(``omega = 32``: one warp per tile, lane ``l`` owning the ``l``-th run of ``sigma`` consecutive
entries). Whatever is left after the last full tile is the *tail*, kept in CSR order. Per full
tile ``t`` the format stores:

- ``col_idx`` / ``val`` transposed inside the tile: entry (lane ``l``, step ``i``) sits at
  ``t*omega*sigma + i*omega + l``, so every warp load is coalesced;
- ``tile_ptr[t]``: the row holding the tile's first entry (``upper_bound(row_ptr, t*omega*sigma)
  - 1``, which skips empty rows), with the sign bit set when empty rows lie strictly inside the
  tile's row range ``(tile_ptr[t], tile_ptr[t+1])``; ``tile_ptr[p]`` is the row of the tail's
  first entry (``m`` when there is no tail);
- ``tile_desc[t]``: per lane, ``num_packet`` 32-bit words read as one big-endian bit string:
  ``y_offset`` (``bit_y = ceil(log2(omega*sigma))`` bits: segments started in earlier lanes),
  ``seg_offset`` (5 bits: lanes after this one without a row start, i.e. how far its last
  partial sum carries), then ``sigma`` ``bit_flag`` bits (1 where a row starts);
- ``empty_offset[offset_ptr[t] + j]``: for tiles with empty rows, the row of the tile's ``j``-th
  segment (the segment containing the tile's first entry is ``j = 0``); other tiles use
  ``tile_ptr[t] + j``.

Partial sums that cross tile boundaries are combined without atomics: a tile whose first entry
does not start a row writes that leading partial to ``calibrator[t]`` (the tail to
``calibrator[p]``), and the *calibration chains* ``(chain_row, chain_first, chain_last)`` list,
per row continuing across tiles, the contiguous calibrator range to add to it; one writer per
row, in a fixed order, so ``y`` is bitwise reproducible.
"""
from dataclasses import dataclass

import numpy as np

from ..compiled import compiled, compiled_parallel, prange
from ..errors import HisparseError

OMEGA = 32
SEG_OFFSET_BITS = 5  # ceil(log2(OMEGA))
MAX_SIGMA = 32       # flags of one lane fit in a 64-bit (two-packet) descriptor


def sigma_check(value):
    """The config check of a ``sigma`` setting (SpMV's, and SpTV's csr5 kernel's): None when
    valid, else why not."""
    return None if 1 <= value <= MAX_SIGMA else f"must lie in [1, {MAX_SIGMA}]"


#: the least tile height the default takes: on Hopper the fixed cost of a tile (descriptor,
#: segmented scan) dominates below about 16 entries per lane (docs/ops/spmv.md)
MIN_DEFAULT_SIGMA = 16
#: rows looked at (evenly spaced) by :func:`row_length_census`
CENSUS_ROWS = 1 << 16


def row_length_census(indptr):
    """How many of up to :data:`CENSUS_ROWS` evenly spaced rows (every k-th from row 0) have each
    length 0..MAX_SIGMA, longer rows counted in one last bin: int64, ``MAX_SIGMA + 2`` entries,
    summed over the ranks (every rank's census of its own rows) for :func:`default_sigma`."""
    indptr = np.asarray(indptr)
    step = max(1, (len(indptr) - 1) // CENSUS_ROWS)
    lengths = indptr[1::step] - indptr[:-1:step]
    return np.bincount(np.minimum(lengths, MAX_SIGMA + 1),
                       minlength=MAX_SIGMA + 2).astype(np.int64)


def default_sigma(mean_row_length, census=None):
    """Tile height: the row length most rows share, where at least half the rows of ``census``
    (:func:`row_length_census`) have one length in [16, 32]; else the mean row length rounded,
    clamped to [16, 32].

    The reference CUDA code uses ``sigma = r`` for ``4 < r <= 32``; on Hopper short rows share a
    lane instead (:data:`MIN_DEFAULT_SIGMA`). A tile height equal to the common length of a
    stencil's rows gives every lane of a warp the same row starts, so the segment logic does not
    diverge: 27-point 160x160x40 (mean 26.33), one H200, 50 chained products 5.84 ms at sigma 26
    against 5.13 ms at 27; 160^3 (mean 26.66, 27 either way) 22.0 ms at 26 against 19.7 ms
    (docs/ops/spmv.md, "Stop 64").
    """
    if census is not None:
        census = np.asarray(census, dtype=np.int64)
        length = MIN_DEFAULT_SIGMA + int(np.argmax(census[MIN_DEFAULT_SIGMA:MAX_SIGMA + 1]))
        if 2 * int(census[length]) >= int(census.sum()) > 0:
            return length
    return int(min(MAX_SIGMA, max(MIN_DEFAULT_SIGMA, round(float(mean_row_length)))))


def descriptor_layout(sigma, omega=OMEGA):
    """``(bit_y, num_packet)`` of the tile descriptor for ``sigma``.

    Raises
    ------
    HisparseError
        ``sigma`` outside ``[1, 32]``.
    """
    if not 1 <= int(sigma) <= MAX_SIGMA:
        raise HisparseError(f"operation.params.sigma must lie in [1, {MAX_SIGMA}], got {sigma}")
    bit_y = int(np.ceil(np.log2(omega * sigma)))
    num_packet = (bit_y + SEG_OFFSET_BITS + sigma + 31) // 32
    return bit_y, num_packet


def empty_flag(dtype):
    """The ``tile_ptr`` bit marking a tile with empty rows (the sign bit of ``dtype``)."""
    return np.array(np.iinfo(dtype).min, dtype=dtype)


@dataclass
class CSR5Matrix:
    """A matrix in CSR5 form (see the module docstring for the layout).

    Attributes
    ----------
    shape : tuple of int
        ``(m, n)``.
    sigma, omega : int
        Tile height and width; a full tile holds ``omega * sigma`` entries.
    indptr : ndarray, shape (m + 1,), int32 or int64
        CSR row pointers (used by the tail, empty rows and the converter).
    col_idx : ndarray, shape (nnz,), int32 or int64
        Column indices, transposed inside full tiles, CSR order in the tail.
    val : ndarray, shape (nnz,), float32 or float64
        Values, same order as ``col_idx``.
    tile_ptr : ndarray, shape (p + 1,), index dtype
        First row of each tile, sign bit = "tile has empty rows".
    tile_desc : ndarray, shape (p, num_packet, omega), uint32
        Packed ``y_offset | seg_offset | bit_flag`` per lane.
    offset_ptr : ndarray, shape (p + 1,), int64
        Start of each tile's entries in ``empty_offset`` (a tile without empty rows has none).
    empty_offset : ndarray, shape (offset_ptr[-1],), index dtype
        Segment -> row map of tiles with empty rows.
    chain_row, chain_first, chain_last : ndarray, shape (n_chains,), index dtype
        Calibration: row ``chain_row[k]`` gets ``sum(calibrator[chain_first[k]:chain_last[k]+1])``
        added, in that order.
    """

    shape: tuple
    sigma: int
    omega: int
    indptr: np.ndarray
    col_idx: np.ndarray
    val: np.ndarray
    tile_ptr: np.ndarray
    tile_desc: np.ndarray
    offset_ptr: np.ndarray
    empty_offset: np.ndarray
    chain_row: np.ndarray
    chain_first: np.ndarray
    chain_last: np.ndarray

    @property
    def nnz(self):
        return int(len(self.val))

    @property
    def tile_size(self):
        return self.omega * self.sigma

    @property
    def num_tiles(self):
        """Full tiles ``p`` (the tail is not counted)."""
        return self.nnz // self.tile_size

    @property
    def tail_start(self):
        """Position of the tail's first entry (``p * omega * sigma``)."""
        return self.num_tiles * self.tile_size

    def tile_rows(self):
        """``tile_ptr`` without the empty-row flag, shape (p + 1,), int64."""
        return (self.tile_ptr & np.iinfo(self.tile_ptr.dtype).max).astype(np.int64)

    def tile_has_empty(self):
        """Per full tile, whether it has empty rows inside its row range, shape (p,), bool."""
        return (self.tile_ptr[:-1] & empty_flag(self.tile_ptr.dtype)) != 0

    @property
    def tail_row(self):
        """First row the tail step handles (``m`` when the tail is empty)."""
        return int(self.tile_rows()[-1])

    @property
    def lead_rows(self):
        """Rows before the first nonzero (empty, zeroed by the tail step)."""
        return int(self.tile_rows()[0])

    def nbytes(self):
        """Device bytes of the format (all arrays)."""
        return sum(int(a.nbytes) for a in (self.indptr, self.col_idx, self.val, self.tile_ptr,
                                           self.tile_desc, self.offset_ptr, self.empty_offset,
                                           self.chain_row, self.chain_first, self.chain_last))


def build_csr5(matrix, sigma=None, omega=OMEGA):
    """Convert a CSR matrix to CSR5 with NumPy (the reference the GPU converter must match).

    Parameters
    ----------
    matrix : CSRMatrix
        Canonical CSR (int32 or int64 indices); not modified.
    sigma : int, optional
        Tile height in [1, 32]; default :func:`default_sigma` of the mean row length and the
        rows' census.
    omega : int
        Tile width (32: a warp).

    Returns
    -------
    CSR5Matrix
    """
    m, n = (int(s) for s in matrix.shape)
    index_dtype = matrix.indices.dtype
    indptr = np.asarray(matrix.indptr, dtype=np.int64)
    nnz = int(indptr[-1]) if m else 0
    if sigma is None:
        sigma = default_sigma(nnz / max(m, 1), row_length_census(indptr))
    sigma = int(sigma)
    bit_y, num_packet = descriptor_layout(sigma, omega)
    tile = omega * sigma
    p = nnz // tile
    tail_start = p * tile

    tile_rows = np.searchsorted(indptr, np.arange(p + 1, dtype=np.int64) * tile, side="right") - 1
    nonempty = np.diff(indptr) > 0
    start_rows = np.flatnonzero(nonempty)
    starts = indptr[:-1][nonempty]
    in_tiles = starts < tail_start
    flags = np.zeros(tail_start, dtype=bool)
    flags[starts[in_tiles]] = True
    flags = flags.reshape(p, omega, sigma)
    real0 = flags[:, 0, 0].copy()

    # Lane 0's first entry always opens a segment (a row start or the carry from earlier tiles).
    forced = flags.copy()
    forced[:, 0, 0] = True
    counts = forced.sum(axis=2)
    y_offset = np.cumsum(counts, axis=1) - counts
    lanes = np.arange(omega)
    start_lane = np.where(counts > 0, lanes, omega)
    next_start = np.minimum.accumulate(start_lane[:, ::-1], axis=1)[:, ::-1]
    after = np.concatenate([next_start[:, 1:], np.full((p, 1), omega)], axis=1)
    seg_offset = after - lanes - 1

    shift = 64 - bit_y - SEG_OFFSET_BITS
    weights = np.left_shift(np.uint64(1), (shift - 1 - np.arange(sigma)).astype(np.uint64))
    packed = (y_offset.astype(np.uint64) << np.uint64(64 - bit_y)) \
        | (seg_offset.astype(np.uint64) << np.uint64(shift)) \
        | (flags.astype(np.uint64) * weights).sum(axis=2, dtype=np.uint64)
    words = [(packed >> np.uint64(32)).astype(np.uint32),
             (packed & np.uint64(0xFFFFFFFF)).astype(np.uint32)]
    tile_desc = np.stack(words[:num_packet], axis=1) if p else \
        np.zeros((0, num_packet, omega), dtype=np.uint32)

    # Empty rows strictly inside (tile_rows[t], tile_rows[t+1]).
    empty_before = np.concatenate([[0], np.cumsum(~nonempty)])
    first, last = tile_rows[:-1], tile_rows[1:]
    inner_empty = np.where(last > first + 1, empty_before[last] - empty_before[
        np.minimum(first + 1, m)], 0)
    has_empty = inner_empty > 0
    segments = 1 + flags.sum(axis=(1, 2)) - real0
    offset_ptr = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(np.where(has_empty, segments, 0), out=offset_ptr[1:])
    flagged = np.flatnonzero(has_empty)
    tile_starts, tile_start_rows = starts[in_tiles], start_rows[in_tiles]
    keep = has_empty[tile_starts // tile] & (tile_starts % tile != 0) if p else \
        np.zeros(0, dtype=bool)
    # Order by position; a tile's segment 0 (its first row) sorts just before the tile's entries.
    keys = np.concatenate([2 * flagged * tile - 1, 2 * tile_starts[keep]])
    rows = np.concatenate([first[flagged], tile_start_rows[keep]])
    empty_offset = rows[np.argsort(keys, kind="stable")].astype(index_dtype)
    assert len(empty_offset) == offset_ptr[-1]

    tile_ptr = tile_rows.astype(index_dtype)
    tile_ptr[:p][has_empty] |= empty_flag(index_dtype)

    col_idx = np.concatenate([
        matrix.indices[:tail_start].reshape(p, omega, sigma).transpose(0, 2, 1).ravel(),
        matrix.indices[tail_start:nnz]]).astype(index_dtype, copy=False)
    val = np.concatenate([
        matrix.data[:tail_start].reshape(p, omega, sigma).transpose(0, 2, 1).ravel(),
        matrix.data[tail_start:nnz]])

    tail = tail_unit(indptr, int(tile_rows[-1]), tail_start, nnz)
    chain_row, chain_first, chain_last = calibration_chains(
        flags.any(axis=(1, 2)), ~real0, tile_rows, tail)
    return CSR5Matrix((m, n), sigma, omega, matrix.indptr, col_idx, val, tile_ptr, tile_desc,
                      offset_ptr, empty_offset, chain_row.astype(index_dtype),
                      chain_first.astype(index_dtype), chain_last.astype(index_dtype))


def tail_unit(indptr, tail_row, tail_start, nnz):
    """``(has_row_start, lead_open)`` of the tail, or None when the tail is empty.

    ``tail_row`` holds the tail's first entry; a row starts in the tail when that row does, or
    when a later row holds entries. O(1): reads two row pointers.
    """
    if tail_start >= nnz:
        return None
    lead_open = int(indptr[tail_row]) != tail_start
    has_start = not lead_open or int(indptr[tail_row + 1]) < nnz
    return has_start, lead_open


def calibration_chains(has_start, lead_open, tile_rows, tail=None):
    """Rows continuing across tiles and the calibrator range each one collects.

    Units are the full tiles plus the tail (when ``tail`` is given). A unit's *lead* is open when
    its first entry does not start a row; a chain begins at an open-lead unit whose predecessor
    holds a row start (where the row began) and runs on through units without any row start.

    Parameters
    ----------
    has_start, lead_open : ndarray, shape (p,), bool
        Per full tile: any row starts in it; its first entry does not start a row.
    tile_rows : ndarray, shape (p + 1,), int
        ``tile_ptr`` without flags (``tile_rows[p]`` is the tail's first row).
    tail : tuple of bool, optional
        :func:`tail_unit` of the tail.

    Returns
    -------
    chain_row, chain_first, chain_last : ndarray, shape (n_chains,), int64
    """
    has_start = np.asarray(has_start, dtype=bool)
    lead_open = np.asarray(lead_open, dtype=bool)
    if tail is not None:
        has_start = np.append(has_start, tail[0])
        lead_open = np.append(lead_open, tail[1])
    empty = np.zeros(0, dtype=np.int64)
    if len(has_start) < 2:
        return empty, empty, empty
    first = np.flatnonzero(lead_open[1:] & has_start[:-1]) + 1
    stops = np.flatnonzero(has_start | np.append(~lead_open[1:], True))
    last = stops[np.searchsorted(stops, first)]
    return np.asarray(tile_rows, dtype=np.int64)[first], first, last


def decode_tile_desc(csr5):
    """Unpack the descriptors.

    Returns
    -------
    y_offset : ndarray, shape (p, omega), int64
    seg_offset : ndarray, shape (p, omega), int64
    bit_flag : ndarray, shape (p, omega, sigma), bool
        Stored flags (lane 0's first flag is the real one, not forced).
    """
    bit_y, num_packet = descriptor_layout(csr5.sigma, csr5.omega)
    desc = csr5.tile_desc.astype(np.uint64)
    packed = desc[:, 0, :] << np.uint64(32)
    if num_packet == 2:
        packed |= desc[:, 1, :]
    shift = 64 - bit_y - SEG_OFFSET_BITS
    y_offset = (packed >> np.uint64(64 - bit_y)).astype(np.int64)
    seg_offset = ((packed >> np.uint64(shift)) & np.uint64(31)).astype(np.int64)
    bits = (shift - 1 - np.arange(csr5.sigma)).astype(np.uint64)
    bit_flag = ((packed[:, :, None] >> bits) & np.uint64(1)).astype(bool)
    return y_offset, seg_offset, bit_flag


def csr5_spmv(csr5, x):
    """y = A x computed from the CSR5 arrays alone (descriptors, tile_ptr, empty_offset,
    calibrator chains and tail), as the GPU kernel does, with NumPy.

    Parameters
    ----------
    csr5 : CSR5Matrix
    x : ndarray, shape (n,)

    Returns
    -------
    ndarray, shape (m,), dtype of ``csr5.val``
    """
    m, _ = csr5.shape
    p, sigma, omega = csr5.num_tiles, csr5.sigma, csr5.omega
    tail_start, nnz = csr5.tail_start, csr5.nnz
    indptr = np.asarray(csr5.indptr, dtype=np.int64)
    y = np.zeros(m, dtype=np.float64)
    calibrator = np.zeros(p + 1, dtype=np.float64)
    if p:
        products = (csr5.val[:tail_start].astype(np.float64) * x[csr5.col_idx[:tail_start]])
        products = products.reshape(p, sigma, omega).transpose(0, 2, 1)  # (tile, lane, step)
        y_offset, _, bit_flag = decode_tile_desc(csr5)
        real0 = bit_flag[:, 0, 0].copy()
        bit_flag[:, 0, 0] = True
        # Segment of every entry: earlier lanes' segments + starts so far in the lane - 1 (the
        # entries before a lane's first start extend the previous lane's last segment).
        local = y_offset[:, :, None] + np.cumsum(bit_flag, axis=2) - 1
        per_tile = bit_flag.sum(axis=(1, 2))
        base = np.concatenate([[0], np.cumsum(per_tile)[:-1]])
        sums = np.bincount((local + base[:, None, None]).ravel(), weights=products.ravel(),
                           minlength=int(per_tile.sum()))
        seg_tile = np.repeat(np.arange(p), per_tile)
        seg_local = np.arange(len(sums)) - base[seg_tile]
        has_empty = csr5.tile_has_empty()[seg_tile]
        rows = csr5.tile_rows()[seg_tile] + seg_local
        mapped = csr5.offset_ptr[seg_tile[has_empty]] + seg_local[has_empty]
        rows[has_empty] = csr5.empty_offset[mapped]
        lead = (seg_local == 0) & ~real0[seg_tile]
        calibrator[seg_tile[lead]] = sums[lead]
        y[rows[~lead]] = sums[~lead]
    if tail_start < nnz or csr5.tail_row < m:
        tail_row = csr5.tail_row
        positions = np.arange(tail_start, nnz)
        rows = np.searchsorted(indptr, positions, side="right") - 1
        contrib = csr5.val[tail_start:].astype(np.float64) * x[csr5.col_idx[tail_start:]]
        sums = np.bincount(rows - tail_row, weights=contrib, minlength=m - tail_row)
        if tail_start < nnz and indptr[tail_row] < tail_start:
            calibrator[p] = sums[0]
            sums[0] = y[tail_row]  # left as the full tiles wrote it
        y[tail_row:] = sums
    if len(csr5.chain_row):
        # Each chain's terms summed in order from 0 (as the GPU's thread per chain sums them;
        # np.add.reduceat adds the first term to the sum of the others): the chains longest
        # first, so that the chains still running at term j are a prefix.
        first = csr5.chain_first.astype(np.int64)
        lengths = csr5.chain_last.astype(np.int64) - first + 1
        order = np.argsort(-lengths, kind="stable")
        first, lengths = first[order], lengths[order]
        totals = np.zeros(len(order), dtype=np.float64)
        running = len(order)
        for j in range(int(lengths[0])):
            while lengths[running - 1] <= j:
                running -= 1
            totals[:running] += calibrator[first[:running] + j]
        y[csr5.chain_row[order]] += totals
    return y.astype(csr5.val.dtype)


# -- the compiled product (the CPU backend's) ----------------------------------------------------

#: entries from which the compiled product's tiles run on all of the process's cores: below, one
#: core takes them all (waking the threads costs as much as a small product; on a host whose
#: cores other processes share, far more)
PARALLEL_MIN_ENTRIES = 1 << 22


@compiled
def _store_segment(y, calibrator, t, segment, real0, has_empty, empty_offset, mapped, first_row,
                   total):
    """Where tile ``t``'s ``segment`` ends up: the calibrator for a leading partial row (segment 0
    of a tile whose first entry does not start a row), else its row of y (through the empty-row
    offsets when the tile has empty rows)."""
    if segment == 0 and real0 == 0:
        calibrator[t] = total
    elif has_empty:
        y[empty_offset[mapped + segment]] = total
    else:
        y[first_row + segment] = total


def _tiles_product(n_tiles, sigma, omega, bit_y, num_packet, row_mask, col, val, tile_ptr,
                   tile_desc, offset_ptr, empty_offset, x, y, calibrator):
    """The full tiles, a tile per loop iteration: each walks its entries in CSR order (lane by
    lane, ``omega`` apart in storage), reading the row starts from its descriptors, and stores
    every segment it ends where the GPU kernel does (its row, or the calibrator for a leading
    partial)."""
    tile = omega * sigma
    flag_low = 64 - bit_y - SEG_OFFSET_BITS - sigma  # the last step's flag bit
    mask = (np.int64(1) << sigma) - 1
    for t in prange(n_tiles):
        entry = np.int64(tile_ptr[t])
        has_empty = entry < 0
        first_row = entry & row_mask
        mapped = np.int64(offset_ptr[t]) if has_empty else np.int64(0)
        segment = -1
        total = 0.0
        real0 = 1
        for lane in range(omega):
            desc = np.int64(tile_desc[t, 0, lane]) << 32
            if num_packet == 2:
                desc |= np.int64(tile_desc[t, 1, lane])
            flags = (desc >> flag_low) & mask
            if lane == 0:  # the tile's first entry opens segment 0 whatever its stored flag
                real0 = (flags >> (sigma - 1)) & 1
                flags |= np.int64(1) << (sigma - 1)
            k = np.int64(t) * tile + lane
            for step in range(sigma):
                if (flags >> (sigma - 1 - step)) & 1:
                    # The common case written out: _store_segment called for every segment
                    # cost twice the product on short rows (Numba does not inline it); the
                    # rare cases stay a call, which keeps this loop small.
                    if segment > 0 and not has_empty:
                        y[first_row + segment] = total
                    elif segment >= 0:
                        _store_segment(y, calibrator, t, segment, real0, has_empty,
                                       empty_offset, mapped, first_row, total)
                    segment += 1
                    total = 0.0
                total += np.float64(val[k]) * np.float64(x[col[k]])
                k += omega
        _store_segment(y, calibrator, t, segment, real0, has_empty, empty_offset, mapped,
                       first_row, total)


_csr5_tiles = compiled(_tiles_product)
_csr5_tiles_parallel = compiled_parallel(_tiles_product)


@compiled
def _csr5_tail_and_chains(n_tiles, tail_row, tail_start, indptr, col, val, x, y, calibrator,
                          chain_row, chain_first, chain_last):
    """The tail (rows from ``tail_row``, CSR order; its part of a row begun in a full tile goes
    to ``calibrator[n_tiles]``), then the calibration: each chain's terms summed in order and
    added to its row (at most a term per tile: one core)."""
    nnz = np.int64(indptr[len(indptr) - 1])
    for row in range(tail_row, len(indptr) - 1):
        begin, end = np.int64(indptr[row]), np.int64(indptr[row + 1])
        total = 0.0
        for j in range(max(begin, tail_start), end):
            total += np.float64(val[j]) * np.float64(x[col[j]])
        if tail_start < nnz and begin < tail_start:
            calibrator[n_tiles] = total
        else:
            y[row] = total
    for k in range(len(chain_row)):
        total = 0.0
        for c in range(chain_first[k], chain_last[k] + 1):
            total += calibrator[c]
        y[chain_row[k]] += total


def csr5_spmv_compiled(csr5, x):
    """y = A x from the CSR5 arrays, as :func:`csr5_spmv` computes it but compiled (Numba; the
    tiles of a large matrix on this process's cores): every segment summed in float64 in CSR
    order, each calibration chain's terms in order, y cast to the values' dtype: the same bits as
    :func:`csr5_spmv`."""
    m, _ = csr5.shape
    p = csr5.num_tiles
    bit_y, num_packet = descriptor_layout(csr5.sigma, csr5.omega)
    y = np.zeros(m, dtype=np.float64)
    calibrator = np.zeros(p + 1, dtype=np.float64)
    x = np.ascontiguousarray(x)
    if p:
        tiles = _csr5_tiles_parallel if csr5.nnz >= PARALLEL_MIN_ENTRIES else _csr5_tiles
        tiles(p, csr5.sigma, csr5.omega, bit_y, num_packet,
              np.int64(np.iinfo(csr5.tile_ptr.dtype).max), csr5.col_idx, csr5.val,
              csr5.tile_ptr, csr5.tile_desc, csr5.offset_ptr, csr5.empty_offset, x, y,
              calibrator)
    _csr5_tail_and_chains(p, csr5.tail_row, csr5.tail_start, np.asarray(csr5.indptr),
                          csr5.col_idx, csr5.val, x, y, calibrator, csr5.chain_row,
                          csr5.chain_first, csr5.chain_last)
    return y.astype(csr5.val.dtype, copy=False)  # fp64: y itself
