"""A rank's rows of a row-distributed matrix, stored as PETSc's MPIAIJ stores them: split into the
columns whose vector entries it owns (the *local block*, local column indices) and a compressed
block of the other columns (the *ghost block*: only the rows that have such entries, column ``k``
= the ``k``-th ghost entry, in the halo exchange's receive order).

:func:`split_rows` splits a rank's rows and finds their ghost columns at once. When the rank
owns a range of x and few of its rows reach outside it (a mesh or banded matrix in row blocks),
only those rows' entries are looked at and the others are copied whole; else, for a large
block, two compiled passes over the rows on the host's threads (Numba); else the NumPy passes
of :func:`locate_entries`, :func:`ghost_columns` and :func:`split_blocks`, which run piece by
piece on the host's threads and also serve where the entries' locations are wanted apart (the
checkerboard's weighing). At one rank the split is free (every column is owned), so at two
ranks these passes over half the entries were what the set-up added.
"""
import numpy as np

from ..arrays import repeated, repeated_value, sorted_distinct
from ..compiled import HAVE_NUMBA, compiled_parallel, prange
from ..formats import CSRMatrix, balanced_row_cuts
from ..partition import group_by_owner
from ..threads import take_into, threaded

#: entries per piece of the passes over a rank's entries that run on several host threads
ENTRY_PIECE = 1 << 21


def _pieces(count):
    """``[(start, stop), ...]`` covering ``range(count)`` in pieces of :data:`ENTRY_PIECE`."""
    return [(start, min(start + ENTRY_PIECE, count)) for start in range(0, count, ENTRY_PIECE)]


def _each_piece(work, count):
    """``work(piece, start, stop)`` for the pieces of ``range(count)`` (``piece``: its number),
    on the host's threads; each writes only its own slices."""
    pieces = _pieces(count)
    threaded(lambda piece: work(piece, *pieces[piece]), range(len(pieces)),
             name="hisparse-split")


def _take(source, index):
    """``source[index]`` (1-D), gathered piece by piece on the host's threads."""
    return take_into(np.empty(len(index), dtype=source.dtype), source, index)


def x_owners(rows_per_rank, nrows, ncols):
    """The global x entries each rank owns, ascending: its own rows for square A (so ``y``'s
    local entries are the next product's local x), else an even contiguous split of ``ncols``."""
    if nrows == ncols:
        return [np.asarray(rows, dtype=np.int64) for rows in rows_per_rank]
    size = len(rows_per_rank)
    bounds = ncols * np.arange(size + 1, dtype=np.int64) // size
    return [np.arange(bounds[r], bounds[r + 1], dtype=np.int64) for r in range(size)]


class OwnedColumns:
    """The global x entries a rank owns, as the block split looks columns up in them.

    A contiguous range (a rank's own rows of a square A, or the even split of a rectangular
    one) needs no table: the local position of column ``c`` is ``c - first``. Other sets (row
    modulo), or ``contiguous=False``, use a table ``position[c]`` of ``n_global`` entries (the
    local position, -1 where not owned).

    Attributes
    ----------
    count : int
        Owned entries.
    first : int or None
        The first owned entry when they are ``first, first + 1, ...``; ``None``: the table.
    """

    def __init__(self, owned, n_global, contiguous=True):
        owned = np.asarray(owned, dtype=np.int64)
        self.count, self.n_global = len(owned), int(n_global)
        first = int(owned[0]) if self.count else 0
        self.first, self._position = None, None
        if contiguous and (not self.count or (int(owned[-1]) == first + self.count - 1 and
                                              np.array_equal(owned, np.arange(
                                                  first, first + self.count)))):
            self.first = first
        else:
            dtype = np.int32 if self.count < 2**31 - 1 else np.int64
            self._position = np.full(self.n_global, -1, dtype=dtype)
            self._position[owned] = np.arange(self.count, dtype=dtype)

    @property
    def table(self):
        """``position[c]`` over every column of x (the local position, -1 where not owned), or
        ``None`` for a range (``first``)."""
        return self._position

    @property
    def everything(self):
        """Whether this rank owns all of x (one rank): every column is owned, unread."""
        return self.first == 0 and self.count == self.n_global

    def owns_all(self, columns):
        """Whether every entry of ``columns`` (global ids in ``[0, n_global)``) is owned here:
        at once when the range is all of x, else the range's bounds against the columns'
        minimum and maximum (two reads per piece on the host's threads, no temporaries); always
        false for a table."""
        if self.first is None or not len(columns):
            return self.first is not None
        if self.everything:  # every entry (one rank): no scan
            return True
        pieces = _pieces(len(columns))
        bounds = np.empty((len(pieces), 2), dtype=np.int64)

        def extremes(piece):  # one core reads ~1 GB/s: the pieces on the host's threads
            lo, hi = pieces[piece]
            bounds[piece] = columns[lo:hi].min(), columns[lo:hi].max()
        threaded(extremes, range(len(pieces)), name="hisparse-split")
        return self.first <= int(bounds[:, 0].min()) and int(bounds[:, 1].max()) < \
            self.first + self.count

    def shifted(self, columns):
        """The local positions of ``columns`` of a range, all owned (:meth:`owns_all`):
        ``columns`` itself when the range starts at 0."""
        return columns - columns.dtype.type(self.first) if self.first else columns

    def local_dtype(self, column_dtype):
        """The dtype of :meth:`locate`'s local positions for columns of ``column_dtype``."""
        return column_dtype if self.first is not None else self._position.dtype

    def locate(self, columns, local=None, owned=None):
        """``(local, owned)``: the local position of each of ``columns`` (meaningful where
        ``owned``) and whether it is owned here; written into ``local`` (of
        :meth:`local_dtype`) and ``owned`` (bool) when given."""
        if self.first is None:
            local = np.take(self._position, columns, out=local)
            return local, np.greater_equal(local, 0, out=owned)
        # In the unsigned view of the shifted columns one compare tests both bounds (the
        # columns lie in [0, n_global), so the shift fits their dtype).
        if self.first or local is not None:
            local = np.subtract(columns, columns.dtype.type(self.first), out=local)
        else:
            local = columns
        unsigned = np.dtype(columns.dtype.str.replace("i", "u"))
        return local, np.less(local.view(unsigned), self.count, out=owned)


def local_positions(owned, n_global):
    """The :class:`OwnedColumns` of the x entries this rank owns (global ids, ascending): where
    :func:`ghost_columns` and :func:`split_blocks` look up the columns of its rows."""
    return OwnedColumns(owned, n_global)


def locate_entries(matrix, position):
    """``(local_column, remote, owned)`` for ``matrix`` (this rank's rows): every entry's local x
    position (meaningful where owned here), the positions of the entries whose x entry another
    rank owns (ascending, int64) and whether each entry's is owned here; ``(None, None, None)``
    when every column is owned here. One pass over the entries (on the host's threads) that
    :func:`ghost_columns` and :func:`split_blocks` share."""
    columns = matrix.indices
    if position.owns_all(columns):
        return None, None, None
    local_column = np.empty(len(columns), dtype=position.local_dtype(columns.dtype))
    owned = np.empty(len(columns), dtype=bool)
    remote = [np.zeros(0, dtype=np.int64)] * (len(_pieces(len(columns))) + 1)

    def locate(piece, start, stop):
        position.locate(columns[start:stop], local_column[start:stop], owned[start:stop])
        remote[piece] = np.flatnonzero(~owned[start:stop]) + start
    _each_piece(locate, len(columns))
    return local_column, np.concatenate(remote), owned


#: columns of x up to which the block split looks remote columns up in tables over all of x
#: (a byte or an int32 per column) instead of sorting them; beyond it, as long as the remote
#: entries are at least an eighth of the columns
DENSE_COLUMN_TABLE = 1 << 24


def _dense_tables(n_global, remote_entries):
    """Whether tables over all ``n_global`` columns are cheaper than sorts of
    ``remote_entries`` entries (and small enough to hold)."""
    return n_global <= max(DENSE_COLUMN_TABLE, 8 * remote_entries)


def ghost_columns(matrix, position, located=None):
    """The global columns of ``matrix`` (this rank's rows) whose x entries other ranks own,
    ascending. ``located``: :func:`locate_entries` of the same rows, when the caller has it.
    Marked in a byte per column of x where that is cheap (:func:`_dense_tables`; R-MAT 19 at 4
    ranks, 6M remote entries: ``np.unique`` sorted them in 0.37 s), else sorted."""
    _, remote, _ = locate_entries(matrix, position) if located is None else located
    if remote is None:  # one rank, or a block diagonal part: nothing to fetch
        return np.zeros(0, dtype=np.int64)
    columns = _take(matrix.indices, remote)
    if _dense_tables(position.n_global, len(columns)):
        marked = np.zeros(position.n_global, dtype=bool)

        def mark(_, start, stop):  # every piece writes True: any order gives the same table
            marked[columns[start:stop]] = True
        _each_piece(mark, len(columns))
        return np.flatnonzero(marked)
    return sorted_distinct(columns).astype(np.int64)


def _piece_starts(count, remote):
    """The first entry of each of :func:`_pieces` (and ``count``), and the remote entries
    before each (``remote``: their ascending positions): a piece's owned entries go to the
    local block from its first entry less those."""
    starts = np.array([start for start, _ in _pieces(count)] + [count], dtype=np.int64)
    return starts, np.searchsorted(remote, starts)


def _ghost_rows(indptr, remote):
    """``(remote_before, ghost_rows, ghost_indptr)`` for rows whose remote entries sit at the
    ascending positions ``remote``: the remote entries before each row start, the rows holding
    any, and the ghost block's row pointers (int64). The local block's row pointers are
    ``indptr - remote_before``. Each remote entry's row is searched among the row starts and
    counted, then one running sum over the rows; nothing per entry of the block (a running
    count over all entries cost 5x the rest of the split on a stencil, whose few ghosts sit in
    few rows; a search of every row start among the remote entries 0.04 s of its 0.14 s)."""
    indptr = np.asarray(indptr)
    nrows = len(indptr) - 1
    lengths = np.bincount(np.searchsorted(indptr, remote, side="right") - 1, minlength=nrows) \
        if len(remote) else np.zeros(nrows, dtype=np.int64)
    remote_before = np.zeros(nrows + 1, dtype=np.int64)
    np.cumsum(lengths, out=remote_before[1:])
    ghost_rows = np.flatnonzero(lengths)
    ghost_indptr = np.zeros(len(ghost_rows) + 1, dtype=np.int64)
    np.cumsum(lengths[ghost_rows], out=ghost_indptr[1:])
    return remote_before, ghost_rows, ghost_indptr


def _owned_entries(local_column, data, owned, remote, index_dtype):
    """``(indices, values)`` of the local block: the owned entries' local columns (as
    ``index_dtype``) and values, in entry order, each piece of entries compressed on its own
    thread into its place (the remote entries before a piece say where that is)."""
    starts, before = _piece_starts(len(owned), remote)
    places = starts - before
    indices = np.empty(int(places[-1]), dtype=index_dtype)
    values = np.empty(int(places[-1]), dtype=data.dtype)

    def compress(piece, start, stop):
        place, end, keep = places[piece], places[piece + 1], owned[start:stop]
        indices[place:end] = local_column[start:stop][keep]
        values[place:end] = data[start:stop][keep]
    _each_piece(compress, len(owned))
    return indices, values


def split_blocks(matrix, position, n_owned, ghosts, located=None):
    """Split this rank's rows into the local block and the compressed ghost block.

    Parameters
    ----------
    matrix : CSRMatrix
        This rank's rows, global column indices.
    position : OwnedColumns
        :func:`local_positions` of the owned x entries.
    n_owned : int
    ghosts : ndarray of int64
        Every global column of ``matrix`` not owned here, in the order the exchange delivers
        their x entries (ghost-block column ``k`` is ``ghosts[k]``).
    located : tuple, optional
        :func:`locate_entries` of the same rows, when the caller has it.

    Returns
    -------
    local : CSRMatrix, shape (rows, n_owned)
    ghost : CSRMatrix, shape (ghost rows, len(ghosts))
    ghost_rows : ndarray
        Local row of each ghost-block row.

    Entries keep their order within a row, so each block's row is a subsequence of the row.
    When every column is owned here (one rank) the local block is ``matrix`` itself, its
    columns shifted to local positions (no copy at all when the owned range starts at 0).
    """
    index_dtype, pointer_dtype = matrix.indices.dtype, matrix.indptr.dtype
    columns = matrix.indices
    if position.owns_all(columns):
        return _owned_rows(matrix, position, n_owned, len(ghosts))
    local_column, remote, owned = locate_entries(matrix, position) if located is None \
        else located
    indptr = matrix.indptr.astype(np.int64)
    remote_before, ghost_rows, ghost_indptr = _ghost_rows(indptr, remote)
    local = CSRMatrix((indptr - remote_before).astype(pointer_dtype),
                      *_owned_entries(local_column, matrix.data, owned, remote, index_dtype),
                      (matrix.nrows, int(n_owned)))
    ghosts = np.asarray(ghosts, dtype=np.int64)
    remote_columns = _take(columns, remote)
    if _dense_tables(position.n_global, len(remote)):  # ghost-block column of each column
        dtype = np.int32 if len(ghosts) < 2**31 else np.int64
        table = np.empty(position.n_global, dtype=dtype)
        table[ghosts] = np.arange(len(ghosts), dtype=dtype)
        ghost_column = _take(table, remote_columns)
        del table
    else:
        order = np.argsort(ghosts, kind="stable")
        ghost_column = order[np.searchsorted(ghosts, remote_columns.astype(np.int64),
                                             sorter=order)]
    ghost = CSRMatrix(ghost_indptr.astype(pointer_dtype),
                      ghost_column.astype(index_dtype, copy=False),
                      _take(matrix.data, remote), (len(ghost_rows), len(ghosts)))
    return local, ghost, ghost_rows.astype(index_dtype)


#: entries from which :func:`split_rows` splits by two compiled passes over the rows on the
#: host's threads; fewer take the NumPy passes of :func:`locate_entries`, :func:`ghost_columns`
#: and :func:`split_blocks`
SPLIT_COMPILED_MIN = 1 << 20


def _owned_rows(matrix, position, n_owned, nghosts=0):
    """:func:`split_blocks` where every column of ``matrix`` is owned here: the rows are the
    local block, their columns shifted to local positions, and the ghost block is empty."""
    index_dtype, pointer_dtype = matrix.indices.dtype, matrix.indptr.dtype
    local = CSRMatrix(matrix.indptr, position.shifted(matrix.indices),
                      matrix.data, (matrix.nrows, int(n_owned)))
    ghost = CSRMatrix(np.zeros(1, pointer_dtype), np.zeros(0, index_dtype),
                      matrix.data[:0].copy(), (0, nghosts))
    return local, ghost, np.zeros(0, index_dtype)


def split_rows(matrix, position, n_owned, reuse=False, loading=None, device=None):
    """``(local, ghost, ghost_rows, ghosts)``: :func:`split_blocks` of ``matrix`` over its
    :func:`ghost_columns` (ascending, ghost-block column ``k`` is ``ghosts[k]``).

    From :data:`SPLIT_COMPILED_MIN` entries: over a range of owned x entries where the entries
    outside it are at most :data:`CROSSING_SHARE` of them, those entries alone
    (:func:`_split_few_ghosts`, NumPy on the host's threads); else the passes over every entry:
    ``device``'s (``split(matrix, position, n_owned)``: the same blocks, or ``None`` where it
    declines; :meth:`hisparse.gpu.RowsOnDevice.split`), else, where tables over every column of
    x cost no more than the entries themselves, two compiled passes over the rows on the host's
    threads: count each row's ghost entries and mark their columns, then place every entry in
    its block. The NumPy passes made ~10 sweeps over the entries (R-MAT 23 at 2 ranks, 67M
    entries a rank: 0.8-1.0 s of a 2.8 s plan on 16 cores; the one-rank plan has no split at
    all).

    ``reuse``: ``matrix``'s index and value arrays are the caller's alone and may be
    overwritten; where the few-ghost split or the compiled passes split them, the local block
    is made in them (views of a run of their entries) instead of in fresh memory.

    ``loading``: the thread of :func:`start_loading_split_loops`, joined only where the
    compiled passes run. A file's stencil is split by the few-ghost path, which needs none of
    them: waiting for the thread there made 0.29-0.35 s of the 2-rank split of a 27-pt 160^3
    file on the GPU host (its read, 0.9 s since stop 53, ends before Numba is loaded), against
    0.09-0.10 s for the same stencil generated (no thread)."""
    def every_entry():  # the device's passes, else the compiled ones, else None
        made = None if device is None else device.split(matrix, position, n_owned)
        if made is not None or not _split_compiles(matrix, position):
            return made
        if loading is not None:
            loading.join()  # loaded while the input was read
        return _split_compiled(matrix, position, n_owned, reuse=reuse)

    made = None
    if position.everything or (position.first is not None and
                               matrix.nnz >= SPLIT_COMPILED_MIN):
        # one comparison pass finds the entries outside the range (none read when the range is
        # all of x): none (the rows are the local block), few, or too many for the few-ghost
        # split
        outside = np.zeros(0, dtype=np.int64) if position.everything else \
            _outside_entries(matrix, position)
        if outside is not None and not len(outside):
            return (*_owned_rows(matrix, position, n_owned), np.zeros(0, dtype=np.int64))
        if outside is not None:
            return _split_few_ghosts(matrix, position, n_owned, outside, reuse)
        made = every_entry()
    elif matrix.nnz >= SPLIT_COMPILED_MIN and not position.owns_all(matrix.indices):
        made = every_entry()
    if made is not None:
        return made
    located = locate_entries(matrix, position)
    ghosts = ghost_columns(matrix, position, located)
    return (*split_blocks(matrix, position, n_owned, ghosts, located), ghosts)


#: the share of a rank's entries up to which the entries outside its range of x (the ghost
#: entries) are split out alone (:func:`_split_few_ghosts`); beyond it (power-law graphs: most
#: rows reach out) every entry is placed anyway, by the compiled passes
CROSSING_SHARE = 0.25


def _outside_entries(matrix, position):
    """The ascending positions of ``matrix``'s entries whose column lies outside
    ``position``'s range, when they are at most :data:`CROSSING_SHARE` of the entries; else
    None. One comparison pass over the entries on the host's threads counts them per piece,
    and only the pieces holding any are compared again for their positions (a stencil's few
    ghosts sit in one or two): no per-row reduction (the least and greatest column of every
    row by ``reduceat`` cost 0.1-0.2 s of a 27-pt 160^3 stencil's 2-rank split) and no mask
    over every entry (fresh memory: its first touch costs more than the comparisons)."""
    columns = matrix.indices
    first, end = position.first, position.first + position.count
    pieces = _pieces(matrix.nnz)
    counts = np.zeros(len(pieces), dtype=np.int64)

    def outside(piece):
        lo, hi = pieces[piece]
        segment = columns[lo:hi]
        return (segment < first) | (segment >= end)

    def count(piece):
        counts[piece] = np.count_nonzero(outside(piece))
    threaded(count, range(len(pieces)), name="hisparse-split")
    if counts.sum() > CROSSING_SHARE * matrix.nnz:
        return None
    holding = np.flatnonzero(counts)
    found = [None] * len(holding)

    def collect(k):
        found[k] = np.flatnonzero(outside(holding[k])) + pieces[holding[k]][0]
    threaded(collect, range(len(holding)), name="hisparse-split")
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _split_few_ghosts(matrix, position, n_owned, ghost_entries, reuse=False):
    """:func:`split_rows` for a contiguous range of owned columns where only the entries at the
    ascending positions ``ghost_entries`` lie outside it (a banded or mesh matrix in row blocks:
    the rows next to a neighbour's block reach out). Only those entries are gathered; every
    other entry goes to the local block by threaded copies (column shifted to the range), and no
    compiled code is loaded (at two ranks of the 27-pt 160^3 stencil, Numba's import and the
    load of the compiled passes took ~0.7 s of a 0.9 s split, which the one-rank run never
    pays). ``reuse``: the local block is made in ``matrix``'s own index and value arrays (see
    :func:`_compaction_pivot`: usually nothing but the pieces holding ghost entries moves)."""
    columns, data = matrix.indices, matrix.data
    one = repeated_value(data)  # one value repeated: the columns alone move
    index_dtype, pointer_dtype = columns.dtype, matrix.indptr.dtype
    indptr = np.asarray(matrix.indptr, dtype=np.int64)
    first = position.first
    ghost_columns_of_entries = _take(columns, ghost_entries)
    ghosts = sorted_distinct(ghost_columns_of_entries).astype(np.int64)
    ghost_before, ghost_rows, ghost_indptr = _ghost_rows(indptr, ghost_entries)
    ghost = CSRMatrix(ghost_indptr.astype(pointer_dtype),
                      np.searchsorted(ghosts, ghost_columns_of_entries).astype(index_dtype),
                      _take(data, ghost_entries) if one is None else
                      repeated(one[0], len(ghost_entries), data.dtype),
                      (len(ghost_rows), len(ghosts)))
    local_indptr = indptr - ghost_before
    n_local = matrix.nnz - len(ghost_entries)
    starts, dropped = _piece_starts(matrix.nnz, ghost_entries)
    lost = np.diff(dropped)  # ghost entries per piece
    kept = np.diff(starts) - lost
    shift = index_dtype.type(first)
    if reuse:  # the local block in the given arrays, from the pivot piece outwards
        pivot, _ = _compaction_pivot(kept, lost)
        base = int(dropped[pivot])  # the local block is columns[base:base + n_local]
        local_indices, local_values = columns, data
        # a piece below the pivot keeps its entries at its end, one above at its start
        placed = np.where(np.arange(len(kept)) < pivot, starts[1:] - kept, starts[:-1])
    else:  # each piece kept straight at its place
        local_indices = np.empty(n_local, dtype=index_dtype)
        local_values = np.empty(n_local if one is None else 0, dtype=data.dtype)
        placed = starts[:-1] - dropped[:-1]

    def keep(piece, lo, hi):  # the piece's entries less its ghost ones, columns shifted
        at, gone = placed[piece], ghost_entries[dropped[piece]:dropped[piece + 1]] - lo
        count = int(kept[piece])
        np.subtract(np.delete(columns[lo:hi], gone) if len(gone) else columns[lo:hi], shift,
                    out=local_indices[at:at + count])
        if one is not None:
            return
        if len(gone):
            local_values[at:at + count] = np.delete(data[lo:hi], gone)
        elif not reuse:  # (in place, the values of a piece without ghost entries stay put)
            local_values[at:at + count] = data[lo:hi]
    _each_piece(keep, matrix.nnz)
    if reuse:  # no fresh memory for the local block: its first touch on a fresh machine was
        # most of a stencil's 2-rank split (27-pt 160^3: 660 MB a rank, 0.3 s on the GPU host)
        targets = base + starts[:-1] - dropped[:-1]
        below = range(pivot - 1, -1, -1)  # upwards, the highest first
        above = range(pivot, len(kept))  # downwards, the lowest first
        for piece in list(below) + list(above):
            source, target, count = int(placed[piece]), int(targets[piece]), int(kept[piece])
            if source != target and count:
                columns[target:target + count] = columns[source:source + count]
                if one is None:
                    data[target:target + count] = data[source:source + count]
        local_indices, local_values = columns[base:base + n_local], data[base:base + n_local]
    if one is not None:
        local_values = repeated(one[0], n_local, data.dtype)
    local = CSRMatrix(local_indptr.astype(pointer_dtype), local_indices, local_values,
                      (matrix.nrows, int(n_owned)))
    return local, ghost, ghost_rows.astype(index_dtype), ghosts


def _compaction_pivot(kept, lost):
    """Where a block made in place (:func:`_split_few_ghosts`) is gathered: ``(pivot, moved)``.
    The pieces below piece ``pivot`` keep their entries at their ends and move up to it, the
    others keep theirs at their starts and move down to it; a piece moves only where a piece
    between it and the pivot lost ghost entries (``lost``: per piece; ``kept``: the entries
    each keeps). The pivot moves the fewest entries (``moved``): a rank whose ghost entries all
    sit at its block's start (the last rank of a band) or end (the first) moves none but its
    ghost-holding pieces' own, where gathering at the start moved its whole block down."""
    count = len(kept)
    total = np.concatenate([[0], np.cumsum(kept)])  # entries kept before each piece
    lossy = np.flatnonzero(lost)
    best = (0, None)
    for pivot in range(count + 1):
        # below: every piece under the highest lossy piece under the pivot moves
        under = lossy[lossy < pivot]
        moved = int(total[under[-1]]) if len(under) else 0
        # above: every piece over the lowest lossy piece from the pivot on moves
        over = lossy[lossy >= pivot]
        moved += int(total[-1] - total[over[0] + 1]) if len(over) else 0
        if best[1] is None or moved < best[1]:
            best = (pivot, moved)
    return best


def _move_down(columns, data, sources, places, lengths):
    """The runs ``sources[k]:sources[k] + lengths[k]`` of ``columns`` and ``data`` (``None``:
    the columns alone) moved to ``places[k]``, one after another in order: the places ascend,
    each at or below its run's source and at or past the end of the run moved before, so a move
    never covers a run not yet moved (NumPy copies an overlapping 1-D range downwards as memmove
    does, no temporary)."""
    for source, place, length in zip(sources.tolist(), places.tolist(), lengths.tolist()):
        if place < source and length:
            columns[place:place + length] = columns[source:source + length]
            if data is not None:
                data[place:place + length] = data[source:source + length]


def _split_compiled(matrix, position, n_owned, load_only=False, reuse=False):
    """:func:`split_rows`' compiled passes (``load_only``: their versions for these arguments
    loaded, not run; returns None). ``reuse``: the local block made in ``matrix``'s own index
    and value arrays: the placing pass gathers each row piece's local entries at the piece's own
    start (a row's entries never land past where they are read, so one thread per piece reads
    ahead of its writes), then the pieces move down in order (:func:`_move_down`)."""
    run = (lambda passes, *args: passes.load(*args)) if load_only else \
        (lambda passes, *args: passes(*args))
    columns = matrix.indices
    one = repeated_value(matrix.data)  # one value repeated: the columns alone move
    with_values = one is None
    index_dtype, pointer_dtype = columns.dtype, matrix.indptr.dtype
    indptr = np.asarray(matrix.indptr, dtype=np.int64)
    contiguous = position.first is not None
    first = int(position.first) if contiguous else 0
    table = np.zeros(0, np.int32) if contiguous else position.table
    row_cuts = balanced_row_cuts(indptr)  # entry-balanced: a hub row does not hold one back
    ghost_lengths = np.zeros(matrix.nrows, dtype=np.int64)
    marked = np.zeros(position.n_global, dtype=np.uint8)
    run(_count_ghost_entries, indptr, columns, contiguous, first, position.count, table,
        row_cuts, ghost_lengths, marked)
    ghosts = np.flatnonzero(marked)
    del marked
    ghost_before = np.zeros(matrix.nrows + 1, dtype=np.int64)
    np.cumsum(ghost_lengths, out=ghost_before[1:])
    ghost_rows = np.flatnonzero(ghost_lengths)
    ghost_indptr = np.append(ghost_before[ghost_rows], ghost_before[-1])
    local_indptr = indptr - ghost_before
    ghost_of = np.empty(position.n_global, dtype=index_dtype)  # ghost-block column of a column
    ghost_of[ghosts] = np.arange(len(ghosts), dtype=index_dtype)
    n_ghost, n_local = int(ghost_before[-1]), matrix.nnz - int(ghost_before[-1])
    value_dtype = matrix.data.dtype
    # without values the passes get one-element stand-ins they neither read nor write
    data = matrix.data if with_values else np.zeros(1, value_dtype)
    ghost_indices = np.empty(n_ghost, dtype=index_dtype)
    ghost_values = np.empty(n_ghost if with_values else 1, dtype=value_dtype)
    reuse = reuse and not load_only
    if reuse:  # each row's first local place, counted from its piece's first entry
        local_indices, local_values = columns, data
        places = local_indptr[:-1] + np.repeat(ghost_before[row_cuts[:-1]], np.diff(row_cuts))
    else:
        local_indices = np.empty(n_local, dtype=index_dtype)
        local_values = np.empty(n_local if with_values else 1, dtype=value_dtype)
        places = local_indptr
    run(_place_block_entries, indptr, columns, data, with_values, contiguous, first,
        position.count, table, ghost_of, row_cuts, places, ghost_before, local_indices,
        local_values, ghost_indices, ghost_values)
    if load_only:
        return None
    if reuse:
        starts = row_cuts[:-1]
        _move_down(columns, data if with_values else None, indptr[starts], local_indptr[starts],
                   np.diff(local_indptr[row_cuts]))
        local_indices = columns[:n_local]
        local_values = data[:n_local]
    if not with_values:
        local_values = repeated(one[0], n_local, value_dtype)
        ghost_values = repeated(one[0], n_ghost, value_dtype)
    local = CSRMatrix(local_indptr.astype(pointer_dtype), local_indices, local_values,
                      (matrix.nrows, int(n_owned)))
    ghost = CSRMatrix(ghost_indptr.astype(pointer_dtype), ghost_indices, ghost_values,
                      (len(ghost_rows), len(ghosts)))
    return local, ghost, ghost_rows.astype(index_dtype), ghosts.astype(np.int64)


def load_split_loops(value_dtype):
    """Load :func:`split_rows`' compiled passes for int32 and int64 column indices and
    ``value_dtype`` values (not run: :meth:`~hisparse.compiled._Compiled.load`), so that this
    process has them: a process's first split imported Numba and loaded each pass from the disk
    cache (0.7 s on the development host), inside a multi-rank plan's timed split (27-pt 160^3 at
    2 ranks on the GPU host: a ~1 s split). For a thread while the input is read
    (:func:`start_loading_split_loops`)."""
    if not HAVE_NUMBA:
        return
    for index_dtype in (np.int32, np.int64):
        block = CSRMatrix(np.array([0, 2, 3], dtype=np.int64),
                          np.array([0, 3, 1], dtype=index_dtype),
                          np.ones(3, dtype=value_dtype), (2, 4))
        _split_compiled(block, OwnedColumns(np.arange(2), 4), 2, load_only=True)


def start_loading_split_loops(value_dtype):
    """A thread running :func:`load_split_loops` (``join`` it before the split; None without
    Numba). Its failure is left to the split's own call, which meets it again."""
    if not HAVE_NUMBA:
        return None
    from ..threads import in_background
    return in_background([lambda: load_split_loops(value_dtype)], "hisparse-load-split")


def _split_compiles(matrix, position):
    """Whether :func:`split_rows` takes its compiled passes: Numba, enough entries, and tables
    over every column of x (a byte and an index each) no larger than the entries."""
    return (HAVE_NUMBA and matrix.nnz >= SPLIT_COMPILED_MIN
            and position.n_global <= max(DENSE_COLUMN_TABLE, matrix.nnz))


@compiled_parallel
def _count_ghost_entries(indptr, columns, contiguous, first, count, table, row_cuts,
                         ghost_lengths, marked):
    """Per row, its entries whose x entry another rank owns; ``marked[c] = 1`` for their
    columns (threads may mark one column at once: each writes the same byte)."""
    for piece in prange(len(row_cuts) - 1):
        for row in range(row_cuts[piece], row_cuts[piece + 1]):
            remote = 0
            for entry in range(indptr[row], indptr[row + 1]):
                column = columns[entry]
                if contiguous:
                    owned = first <= column < first + count
                else:
                    owned = table[column] >= 0
                if not owned:
                    remote += 1
                    marked[column] = 1
            ghost_lengths[row] = remote


@compiled_parallel
def _place_block_entries(indptr, columns, data, with_values, contiguous, first, count, table,
                         ghost_of, row_cuts, local_indptr, ghost_before, local_indices,
                         local_values, ghost_indices, ghost_values):
    """Every entry to its block, in row order: owned ones at their local column from
    ``local_indptr[row]`` on (a row's first place in ``local_indices``), the others at their
    ghost-block column (``ghost_of``); their values beside them ``with_values`` (else the value
    arrays are not touched)."""
    for piece in prange(len(row_cuts) - 1):
        for row in range(row_cuts[piece], row_cuts[piece + 1]):
            at_local, at_ghost = local_indptr[row], ghost_before[row]
            for entry in range(indptr[row], indptr[row + 1]):
                column = columns[entry]
                if contiguous:
                    local_column = column - first
                    owned = 0 <= local_column < count
                else:
                    local_column = table[column]
                    owned = local_column >= 0
                if owned:
                    local_indices[at_local] = local_column
                    if with_values:
                        local_values[at_local] = data[entry]
                    at_local += 1
                else:
                    ghost_indices[at_ghost] = ghost_of[column]
                    if with_values:
                        ghost_values[at_ghost] = data[entry]
                    at_ghost += 1


def restore_rows(y, rows):
    """y in the original local row order from a product over :func:`reorder_local`'s block
    (``rows``: new -> old; ``None``: nothing was renumbered)."""
    if rows is None:
        return y
    out = np.empty_like(y)
    out[rows] = y
    return out


def renumber_columns(block, new_column, ncols):
    """``block`` with column ``c`` renamed ``new_column[c]`` (entries keep their places), shape
    ``(rows, ncols)``: the ghost block's columns moved to another receive order, or to positions
    in a vector that holds more than the ghosts."""
    dtype = block.indices.dtype if ncols < np.iinfo(block.indices.dtype).max else np.int64
    # the new names in the result's dtype: a narrower table to gather from, and no cast after
    indices = _take(np.asarray(new_column).astype(dtype, copy=False), block.indices)
    # the kernels read row pointers and columns with one index type
    return CSRMatrix(block.indptr.astype(np.result_type(block.indptr.dtype, dtype), copy=False),
                     indices, block.data, (block.nrows, int(ncols)))


def merge_blocks(local, ghost, ghost_rows, local_offset, ghost_offset, ncols):
    """One block over a rank's rows from its local and ghost blocks: row ``r`` holds its local
    entries (columns + ``local_offset``) then its ghost entries (columns + ``ghost_offset``), in
    their blocks' order, shape ``(rows, ncols)``. For a product over one vector that holds the
    owned and the received entries of x (multiplied once, after the exchange)."""
    rows = local.nrows
    local_lengths = np.diff(local.indptr.astype(np.int64))
    ghost_counts = np.diff(ghost.indptr.astype(np.int64))
    where = np.asarray(ghost_rows, dtype=np.int64)
    lengths = local_lengths.copy()
    lengths[where] += ghost_counts
    indptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    nnz = int(indptr[-1])
    # one index type for row pointers and columns (the kernels read both with it)
    index_dtype = np.result_type(local.indptr.dtype, local.indices.dtype, ghost.indices.dtype)
    if ncols >= np.iinfo(index_dtype).max or nnz >= np.iinfo(index_dtype).max:
        index_dtype = np.dtype(np.int64)
    indices = np.empty(nnz, dtype=index_dtype)
    data = np.empty(nnz, dtype=local.data.dtype)
    # an entry's new place = its old place + its row's shift (new row start - old row start)
    shift = indptr[:-1] - local.indptr[:-1].astype(np.int64)
    places = np.arange(local.nnz, dtype=np.int64) + np.repeat(shift, local_lengths)
    indices[places] = local.indices.astype(index_dtype) + index_dtype.type(local_offset)
    data[places] = local.data
    shift = indptr[where] + local_lengths[where] - ghost.indptr[:-1].astype(np.int64)
    places = np.arange(ghost.nnz, dtype=np.int64) + np.repeat(shift, ghost_counts)
    indices[places] = ghost.indices.astype(index_dtype) + index_dtype.type(ghost_offset)
    data[places] = ghost.data
    return CSRMatrix(indptr.astype(index_dtype), indices, data, (rows, int(ncols)))


def split_column_ranges(block, rows, bounds):
    """``block`` (rows ``rows`` of a larger matrix) cut by column into the ranges
    ``bounds[k] .. bounds[k + 1] - 1`` (``bounds[0] = 0``, ``bounds[-1] = ncols``): for each range
    ``(part, part_rows)``, the compressed block of its entries (only the rows that have some;
    columns unchanged; rows and entries in their order) and those rows' ``rows``. The parts'
    products summed are the block's: a ghost block cut by the rank each column comes from, so
    that each part can multiply as soon as that rank's entries arrive."""
    bounds = np.asarray(bounds, dtype=np.int64)
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != block.ncols or \
            np.any(np.diff(bounds) < 0):
        raise ValueError(f"split_column_ranges: bounds must rise from 0 to the block's "
                         f"{block.ncols} columns, got {bounds.tolist()}")
    key = np.searchsorted(bounds, block.indices, side="right") - 1
    return entries_by_key(block, rows, key, len(bounds) - 1)


def entries_by_key(block, rows, key, parts):
    """``block``'s entries grouped by ``key`` (one number in ``[0, parts)`` per entry): for each
    key ``(part, part_rows)``, the compressed block of its entries (only the rows that have
    some; columns unchanged; rows and entries in their order) and those rows' ``rows``."""
    rows = np.asarray(rows)
    lengths = np.diff(block.indptr.astype(np.int64))
    entry_row = np.repeat(np.arange(block.nrows, dtype=np.int64), lengths)
    # grouped by key, row and entry order kept (a stable grouping)
    order, starts = group_by_owner(np.asarray(key), parts)
    pieces = []
    for index in range(parts):
        chosen = order[starts[index]:starts[index + 1]]
        chosen_rows = _take(entry_row, chosen)  # ascending: a stable grouping of row order
        first = np.flatnonzero(np.diff(chosen_rows, prepend=-1)) if len(chosen) else \
            np.zeros(0, dtype=np.int64)
        indptr = np.append(first, len(chosen)).astype(block.indptr.dtype)
        present = chosen_rows[first]
        pieces.append((CSRMatrix(indptr, _take(block.indices, chosen),
                                 _take(block.data, chosen), (len(present), block.ncols)),
                       rows[present]))
    return pieces
