"""Rows by a strategy (:class:`RowLayout`): every rank reads (or generates) only its rows of a
matrix.

The rank-0 path (:func:`~hisparse.io.read_matrix`, then the operation's ``partition``) holds the
whole matrix on rank 0 and takes as long at 4 ranks as at 1. Here, *collectively*:

1. Every rank opens the file and checks the group (shape, datasets, dtypes, the first and last
   row pointers: :func:`~hisparse.io.open_csr_group`).
2. The row split comes from ``indptr`` read in chunks: rank r scans rows ``r m / p .. (r+1) m /
   p`` (one pointer more, so the slices overlap and "never decreases" is checked across them),
   counts how many of its rows lie below each nnz-balanced target weight, and one all-reduce of
   those ``p - 1`` counts gives every rank the same boundaries as
   :func:`~hisparse.partition.nnz_balanced_blocks` on the whole ``indptr``. ``row_blocks``
   needs no counts; ``row_modulo`` scans all of ``indptr`` on every rank (in chunks) and keeps
   its own rows' extents.
3. Each rank reads its rows' ``indices``/``data`` by hyperslab
   (:func:`~hisparse.io.read_csr_rows`): one slice for contiguous rows; for ``row_modulo`` the
   ranges covering its scattered rows, in bounded chunks, keeping its entries.
4. Each rank validates its part (column range, NaN/Inf), sorts columns and sums or rejects
   duplicates (``input.duplicates``). When summing shortened some rows, ``nnz_balanced`` is
   balanced again on the merged rows (one all-to-all between neighbours, as the rank-0 path
   partitions the merged matrix); a file without duplicates never pays it. Every step that can fail runs under
   :func:`~hisparse.parallel.all_call`, so a bad file stops every rank with one error naming the
   file (and the rank that found it), never a hang.

Groups marked ``symmetric`` are read the same way: the schema stores both triangles of a
symmetric matrix (docs/hdf5_schema.md), so a rank's rows are complete in the file. A group
holding only one triangle would need the mirrored entries of other ranks' rows, which is what
the rank-0 path (its whole matrix in one place) would have to give it.

Generators make their parts the same way (:func:`generate_row_part`): stencil and band rows are
built directly, random matrices and R-MAT graphs in fixed-size seeded blocks, routed to their
row owners by one all-to-all (and R-MAT under ``nnz_balanced`` a second one, once the row
lengths are known after duplicate edges collapse).

The part a rank ends with equals what the rank-0 path's partition gives it, array for array
(tests/test_parallel_input.py checks it at 1, 2 and 4 ranks).
"""
from dataclasses import dataclass

import numpy as np

from .. import generators
from ..arrays import repeated, repeated_value
from ..compiled import fingerprint
from ..formats import CSRMatrix, index_dtype_for
from ..io import indptr_chunks, open_csr_group, read_csr_rows, row_extents, sample_row_columns
from ..parallel import AllReduce, all_call, alltoall_concatenated
from ..partition import (ROW_STRATEGIES, balance_targets, bounds_from_cuts, check_rows,
                         equal_blocks, group_by_owner, group_pairs, nnz_balanced_blocks,
                         owners_of, weight_counts)
from ..threads import fill_into
from ._base import (Layout, PartProblem, check_cast, check_input_kind, input_label, read_problem,
                    run_value_dtype)

#: Entries from which a one-rank run keeps a slow-to-make generated matrix (below, making it
#: again takes less than the fingerprint's first use, ~0.3 s with Numba's start-up).
KEEP_WHOLE_MIN_NNZ = 1 << 20


@dataclass
class RowPart:
    """This rank's rows of a matrix.

    Attributes
    ----------
    rows : ndarray of int64
        Global ids of the rows, ascending.
    indptr, indices, data : ndarray
        The rows in CSR (``indptr`` starts at 0), columns sorted within each row.
    shape : tuple of int
        The whole matrix's ``(m, n)``.
    nnz : int
        The whole matrix's entries (after duplicates were merged).
    symmetric : bool
    strategy : str
        The row partition that chose ``rows``.
    bounds : ndarray of int64 or None
        Rank r owns rows ``bounds[r]:bounds[r+1]`` (contiguous strategies).
    on_device : bool
        Made whole on every rank's GPU (:func:`generate_row_part`), not read or made on the host.
    """

    rows: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple
    nnz: int = -1
    symmetric: bool = False
    strategy: str = ""
    bounds: np.ndarray = None
    on_device: bool = False

    @property
    def local_nnz(self):
        return int(self.indptr[-1]) if len(self.indptr) else 0

    def arrays(self):
        """The part as the row-partitioned operations receive it from ``partition()``:
        ``indptr``, ``indices``, ``data``, ``rows``, ``ncols``, ``nrows``."""
        return {"indptr": self.indptr, "indices": self.indices, "data": self.data,
                "rows": self.rows, "ncols": int(self.shape[1]), "nrows": int(self.shape[0])}


class RowProblem(PartProblem):
    """The input as the driver hands it to an operation that reads by rows (a
    :class:`RowLayout`), on every rank.

    Holds this rank's :class:`RowPart` (:meth:`take_part`) and what is known of the whole matrix
    without holding it: ``shape``, ``nrows``, ``ncols``, ``nnz``, ``symmetric``, ``index_dtype``,
    ``value_dtype``. Any other attribute (``indptr``, ``to_scipy()``, ...) is the whole
    :class:`~hisparse.formats.CSRMatrix`, read or generated by ``load`` on first use and kept:
    verification (``op.reference``) and peers use it on rank 0 after the timed repeats, never
    during setup. A run with ``verify.enabled: false`` and no peers never loads it. With
    ``keep_whole`` (one rank) the part is the whole matrix and is used instead of ``load``
    when the operation left its arrays as they were handed over.
    """

    def __init__(self, part, load=None, index_dtype=None, value_dtype=None, keep_whole=False):
        super().__init__(load)
        self._part = part
        # keep_whole: the part is the whole matrix (one rank) and verification or the peers
        # will want it. It is kept with a fingerprint rather than made or read again (R-MAT
        # scale 21: 2.4 s), and used only if the operation left its arrays untouched.
        self._kept = None
        if keep_whole:
            whole = CSRMatrix(part.indptr, part.indices, part.data, tuple(part.shape),
                              part.symmetric)
            self._kept = (whole, fingerprint(whole.indptr, whole.indices, whole.data))
        self.shape = tuple(int(s) for s in part.shape)
        self.nnz = int(part.nnz)
        self.symmetric = bool(part.symmetric)
        self.strategy = part.strategy
        self.on_device = bool(part.on_device)
        self.index_dtype = np.dtype(index_dtype or part.indices.dtype)
        self.value_dtype = np.dtype(value_dtype or part.data.dtype)

    @property
    def nrows(self):
        return self.shape[0]

    @property
    def ncols(self):
        return self.shape[1]

    def take_part(self):
        """This rank's part as a dict (:meth:`RowPart.arrays`); the problem lets go of it, so
        the operation's copies are the only ones."""
        if self._part is None:
            raise RuntimeError("the row part was already taken")
        part, self._part = self._part, None
        return part.arrays()

    def whole(self):
        """The whole matrix: the kept part when its arrays are as they were handed over, else
        read or generated again (loaded on first use)."""
        if self._whole is None and self._kept is not None:
            whole, recorded = self._kept
            self._kept = None
            if fingerprint(whole.indptr, whole.indices, whole.data) == recorded:
                self._whole = whole
        return super().whole()

    @property
    def matrix(self):
        """The whole matrix (loaded on first use)."""
        return self.whole()


# -- the row split --------------------------------------------------------------------------------

def rows_of_rank(strategy, bounds, nrows, rank, size):
    """Global ids (int64, ascending) of the rows ``rank`` owns."""
    if strategy == "row_modulo":
        return np.arange(rank, nrows, size, dtype=np.int64)
    return np.arange(bounds[rank], bounds[rank + 1], dtype=np.int64)


def share_of(count, rank, size):
    """The contiguous range ``(lo, hi)`` of ``count`` items that rank ``rank`` of ``size``
    takes: the rows whose pointers it scans, the generator blocks it makes, the nonzeros or
    fibers of a tensor it reads or makes."""
    return rank * count // size, (rank + 1) * count // size


def _balanced_bounds(comm, counts, nrows):
    """Every rank's counts (:func:`~hisparse.partition.weight_counts` of its slice) summed: the
    same bounds on every rank."""
    total = AllReduce(comm, "sum")(np.ascontiguousarray(counts, dtype=np.int64))
    return bounds_from_cuts(total, nrows, comm.size)


def _split_from_lengths(comm, strategy, first_row, lengths, nrows):
    """The bounds of a contiguous strategy (``None`` for row_modulo) when rank r knows the
    lengths of rows ``first_row ..`` (consecutive slices in rank order, covering every row; only
    ``nnz_balanced`` looks at them)."""
    if strategy == "row_blocks":
        return equal_blocks(nrows, comm.size)
    if strategy == "row_modulo":
        return None
    lengths = np.asarray(lengths, dtype=np.int64)
    local = int(lengths.sum())
    offset = comm.exscan(local) if comm.size > 1 else 0
    total = AllReduce(comm, "sum").scalar(local)
    pointers = np.zeros(len(lengths), dtype=np.int64)  # indptr at rows first_row ..
    np.cumsum(lengths[:-1], out=pointers[1:])
    pointers += offset or 0  # exscan leaves rank 0 with None
    counts = weight_counts(pointers, first_row, balance_targets(total, nrows, comm.size))
    return _balanced_bounds(comm, counts, nrows)


def _check_strategy(strategy):
    if strategy not in ROW_STRATEGIES:
        raise ValueError(f"unknown row partition strategy {strategy!r} (expected one of "
                         f"{ROW_STRATEGIES})")


def _scan_indptr(csr, lo, hi, targets=None, keep_every=None):
    """Scan ``indptr[lo:hi + 1]`` in chunks (checked never to decrease by
    :func:`~hisparse.io.indptr_chunks`): count rows below the ``targets`` weights, and
    (``keep_every = (rank, size)``) keep the start and length of every row ``rank (mod size)``.

    Returns
    -------
    counts : ndarray of int64 or None
    starts, lengths : ndarray of int64 or None
    """
    counts = None if targets is None else np.zeros(len(targets), dtype=np.int64)
    starts, lengths = [], []
    for c0, pointers in indptr_chunks(csr, lo, hi):
        if counts is not None:
            counts += weight_counts(pointers[:-1], c0, targets)
        if keep_every is not None:
            rank, size = keep_every
            first = c0 + (rank - c0) % size
            starts.append(pointers[first - c0:-1:size])
            lengths.append(np.diff(pointers)[first - c0::size])
    if keep_every is None:
        return counts, None, None
    return counts, np.concatenate(starts), np.concatenate(lengths)


def read_row_part(comm, path, group="/", strategy="nnz_balanced", duplicates="sum"):
    """This rank's rows of the CSR matrix at ``path:group``, read by part. *Collective.*

    Parameters
    ----------
    comm : mpi4py communicator
    path, group : str
        As for :func:`~hisparse.io.read_matrix`.
    strategy : {"nnz_balanced", "row_blocks", "row_modulo"}
        The row partition (:func:`~hisparse.partition.partition_rows`).
    duplicates : {"sum", "reject"}

    Returns
    -------
    RowPart
        Columns sorted; the file's dtypes (integer or boolean values as float64); ``nnz`` the
        whole matrix's after merging duplicates.

    Raises
    ------
    CollectiveError
        On every rank, when any rank finds the file or its part malformed (the message names
        the file) or the rows cannot be split over the ranks.
    """
    _check_strategy(strategy)
    rank, size = comm.rank, comm.size
    csr = all_call(comm, open_csr_group, path, group)
    nrows = csr.shape[0]
    all_call(comm, check_rows, nrows, size)
    if strategy == "row_modulo":
        _, starts, lengths = all_call(comm, _scan_indptr, csr, 0, nrows,
                                      keep_every=(rank, size))
        bounds = None
    else:
        lo, hi = share_of(nrows, rank, size)
        targets = balance_targets(csr.nnz, nrows, size) if strategy == "nnz_balanced" \
            else None
        counts, _, _ = all_call(comm, _scan_indptr, csr, lo, hi, targets)
        bounds = _balanced_bounds(comm, counts, nrows) if targets is not None else \
            equal_blocks(nrows, size)
        starts, lengths = all_call(comm, row_extents, csr, int(bounds[rank]),
                                   int(bounds[rank + 1]))
    rows = rows_of_rank(strategy, bounds, nrows, rank, size)
    block = all_call(comm, read_csr_rows, csr, rows, starts, lengths, duplicates)
    nnz = AllReduce(comm, "sum").scalar(block.nnz)
    if strategy == "nnz_balanced" and nnz != csr.nnz:
        # Duplicates were merged, so rows are shorter than the file's indptr says: balance the
        # merged rows, as the rank-0 path (which partitions the merged matrix) does.
        return redistribute_rows(comm, int(bounds[rank]), block, csr.shape, strategy,
                                 csr.symmetric)
    return RowPart(rows, block.indptr, block.indices, block.data, csr.shape, nnz,
                   csr.symmetric, strategy, bounds)


# -- generating a part ----------------------------------------------------------------------------

def _owners(strategy, bounds, rows, size):
    """The rank owning each of ``rows``."""
    return owners_of(rows, None if strategy == "row_modulo" else bounds, size)


def redistribute_rows(comm, first_row, block, shape, strategy, symmetric=False, weights=None):
    """Move rows made on the wrong rank to their owners, by one all-to-all. *Collective.*

    Rank r holds the consecutive rows ``first_row .. first_row + block.nrows`` (the ranks'
    ranges follow each other in rank order and cover every row); afterwards it holds the rows
    ``strategy`` gives it, in ascending order. ``weights`` (one per row of ``block``) balances
    ``nnz_balanced`` by another cost than the row lengths, as
    :func:`~hisparse.partition.nnz_balanced_blocks` on their running sum would (SpGEMM's
    ``product_balanced``: each row's intermediate products).
    """
    nrows = int(shape[0])
    lengths = np.diff(np.asarray(block.indptr, dtype=np.int64)) if weights is None else weights
    bounds = _split_from_lengths(comm, strategy, first_row, lengths, nrows)
    rows = np.arange(first_row, first_row + block.nrows, dtype=np.int64)
    if comm.size == 1:  # every row is already where it belongs: no copy, no exchange
        return RowPart(rows, np.asarray(block.indptr, dtype=np.int64), block.indices,
                       block.data, tuple(shape), block.nnz, symmetric, strategy, bounds)
    mine = move_rows_to_owners(comm, rows, block, _owners(strategy, bounds, rows, comm.size),
                               int(shape[1]))
    nnz = AllReduce(comm, "sum").scalar(int(np.asarray(block.indptr)[-1]))
    return RowPart(mine["rows"], mine["indptr"], mine["indices"], mine["data"],
                   tuple(shape), nnz, symmetric, strategy, bounds)


def move_rows_to_owners(comm, rows, block, owners, ncols):
    """The rows ``rows`` of ``block`` (global ids, one per row) sent to the ranks ``owners``
    names, by one all-to-all; what this rank receives, as ``{rows, indptr, indices, data}`` in
    ascending row order (int64 row ids and pointers). *Collective.*"""
    owners = np.asarray(owners)
    if not np.any(owners[1:] < owners[:-1]):
        # Owners in rank order (contiguous rows to contiguous owners: generated row blocks to
        # nnz-balanced ones): the rows are grouped as they lie, no copy of the block (R-MAT 23
        # at 2 ranks: the rows' balance took 1.0 s a rank, mostly copies).
        cuts = np.searchsorted(owners, np.arange(comm.size + 1), side="left").astype(np.int64)
        grouped, grouped_rows = block, np.asarray(rows, dtype=np.int64)
    else:
        order, cuts = group_by_owner(owners, comm.size)
        grouped = block.rows(order)
        grouped_rows = np.asarray(rows, dtype=np.int64)[order]
    pointers = np.asarray(grouped.indptr, dtype=np.int64)
    pieces = [{"rows": grouped_rows[lo:hi], "lengths": np.diff(pointers[lo:hi + 1]),
               "indices": grouped.indices[pointers[lo]:pointers[hi]],
               "data": grouped.data[pointers[lo]:pointers[hi]]}
              for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist())]
    # Received in source order straight into one array each (a rank that keeps its rows and
    # gets none keeps its block uncopied): in ascending row order unless the owners interleave.
    received, _ = alltoall_concatenated(comm, pieces)
    rows = received["rows"].astype(np.int64, copy=False)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(received["lengths"], out=indptr[1:])
    block = CSRMatrix(indptr, received["indices"], received["data"], (len(rows), ncols))
    if len(rows) > 1 and np.any(rows[1:] < rows[:-1]):
        order = np.argsort(rows, kind="stable")
        block, rows = block.rows(order), rows[order]
    return {"rows": rows, "indptr": np.asarray(block.indptr, dtype=np.int64),
            "indices": block.indices, "data": block.data}


def generate_row_part(comm, spec, strategy="nnz_balanced", device=None, index_width=None,
                      repeated_values=False):
    """This rank's rows of the matrix a generator spec describes, made here. *Collective.*

    The ranks together make exactly the matrix of :func:`~hisparse.generators.generate` for the
    same spec (seed included), whatever their number (see
    :func:`~hisparse.generators.part_source`). ``device``: the run context of a GPU run, whose
    GPU makes the whole matrix's rows (R-MAT: ``whole_on_device``), or a rank's edges, where the
    generator finds it pays (the same matrix). ``index_width`` (the run's, as
    :func:`cast_row_part` takes it): the rows a GPU made come in the index dtype of the run
    already (no cast on the host). ``repeated_values``: the caller takes a unit-valued part's
    values as one value repeated (:func:`~hisparse.arrays.repeated`: no memory), where a GPU
    made its rows; otherwise, and elsewhere, as an array.

    Returns
    -------
    RowPart
        int64 row pointers and column indices (or those of ``index_width`` where a GPU made
        the rows); float64 values.
    """
    _check_strategy(strategy)
    spec = generators.validate_spec(dict(spec))
    if generators.spec_kind(spec) != "matrix":
        raise ValueError(f"generator '{spec['kind']}' makes no matrix")
    source = generators.part_source(spec)
    rank, size = comm.rank, comm.size
    nrows, ncols = source.shape
    all_call(comm, check_rows, nrows, size)
    if source.band is not None:
        band = source.band
        lo, hi = share_of(nrows, rank, size)
        lengths = band.lengths(np.arange(lo, hi, dtype=np.int64)) \
            if strategy == "nnz_balanced" else None
        bounds = _split_from_lengths(comm, strategy, lo, lengths, nrows)
        rows = rows_of_rank(strategy, bounds, nrows, rank, size)
        # The split gave this rank the very rows it measured (always at one rank): reuse them.
        same_rows = lengths is not None and len(rows) == len(lengths) and (
            not len(rows) or int(rows[0]) == lo)
        block = band.build(rows, ncols, lengths if same_rows else None)
        nnz = AllReduce(comm, "sum").scalar(block.nnz)
        return RowPart(rows, block.indptr, block.indices, block.data, source.shape, nnz,
                       source.symmetric, strategy, bounds)
    whole = source.whole_on_device
    if device is not None and whole is not None and strategy != "row_modulo" and \
            AllReduce(comm, "min").scalar(int(all_call(comm, whole.fits))):
        return _part_of_whole_on_device(comm, whole, source, strategy, index_width,
                                        repeated_values)
    blocks = range(*share_of(source.nblocks, rank, size))
    if source.row_blocks is not None:
        first_row = min(blocks.start * source.rows_per_block, nrows)
        return redistribute_rows(comm, first_row, source.row_blocks(blocks), source.shape,
                                 strategy, source.symmetric)
    # Edges: to the owners of their source rows (provisional equal blocks when the final split
    # needs the row lengths, known only once duplicate edges have collapsed).
    src, dst = source.edges(blocks, device)
    route = "row_modulo" if strategy == "row_modulo" else "row_blocks"
    bounds = None if route == "row_modulo" else equal_blocks(nrows, size)
    if size > 1:  # one rank owns every edge: no grouping (two gathers of every edge), no copy
        src, dst, cuts = group_pairs(src, dst, bounds, size)
        received, _ = alltoall_concatenated(comm, [{"src": src[cuts[d]:cuts[d + 1]],
                                                    "dst": dst[cuts[d]:cuts[d + 1]]}
                                                   for d in range(size)])
        src, dst = received["src"], received["dst"]
        del received
    rows = rows_of_rank(route, bounds, nrows, rank, size)
    block = generators.unit_rows(src, dst, rows, ncols)
    del src, dst
    if strategy == "nnz_balanced":
        return redistribute_rows(comm, int(bounds[rank]), block, source.shape, strategy,
                                 source.symmetric)
    nnz = AllReduce(comm, "sum").scalar(block.nnz)
    return RowPart(rows, block.indptr, block.indices, block.data, source.shape, nnz,
                   source.symmetric, strategy, bounds)


def _part_of_whole_on_device(comm, whole, source, strategy, index_width=None,
                             repeated_values=False):
    """This rank's rows of a generated matrix whose whole rows every rank makes on its GPU
    (``whole``: :class:`~hisparse.generators.RmatRowsOnDevice`, which every rank found to fit):
    the split from the whole row pointers, as :func:`redistribute_rows` would find it from the
    ranks' slices of them, and only this rank's columns copied to the host, in the dtype
    ``index_width`` gives (int64 without it); the unit values as one value repeated
    (:func:`~hisparse.arrays.repeated`) where ``repeated_values`` asks for them so. *Collective.*"""
    nrows = source.shape[0]
    indptr, columns = all_call(comm, whole.make)
    index_dtype = np.dtype(np.int64) if index_width is None else \
        all_call(comm, index_dtype_for, max(int(indptr[-1]), *source.shape), index_width)
    bounds = equal_blocks(nrows, comm.size) if strategy == "row_blocks" else \
        nnz_balanced_blocks(indptr, comm.size)
    lo, hi = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    first, last = int(indptr[lo]), int(indptr[hi])
    mine = whole.download(columns, first, last, index_dtype)
    del columns
    whole.release()  # the device's memory back for the operation
    values = repeated(1.0, last - first) if repeated_values else \
        fill_into(np.empty(last - first), 1.0)
    return RowPart(np.arange(lo, hi, dtype=np.int64),
                   (indptr[lo:hi + 1] - first).astype(index_dtype, copy=False), mine, values,
                   tuple(source.shape), int(indptr[-1]), source.symmetric, strategy, bounds,
                   on_device=True)


# -- the configured dtypes ------------------------------------------------------------------------

def cast_row_part(comm, part, value_dtype, index_width, label, precision):
    """The part in the run's dtypes, exactly as the rank-0 path casts the whole matrix (index
    dtype from the whole matrix's nnz and shape, per ``index_width``). *Collective.*"""
    index_dtype = all_call(comm, index_dtype_for, max(part.nnz, *part.shape), index_width)

    def cast():
        with np.errstate(over="ignore"):  # an overflow is reported by check_cast
            one = repeated_value(part.data)
            data = part.data.astype(value_dtype, copy=False) if one is None else \
                repeated(one[0], len(part.data), value_dtype)  # (its one value cast)

        def where(entry):
            local_row = int(np.searchsorted(part.indptr, entry, side="right") - 1)
            return f"row {int(part.rows[local_row])}, column {int(part.indices[entry])}"

        check_cast(part.data, data, label, precision, where)
        return data

    data = all_call(comm, cast)
    return RowPart(part.rows, part.indptr.astype(index_dtype, copy=False),
                   part.indices.astype(index_dtype, copy=False), data, part.shape, part.nnz,
                   part.symmetric, part.strategy, part.bounds, part.on_device)


# -- the layout -----------------------------------------------------------------------------------

class RowLayout(Layout):
    """Rows by a strategy (``nnz_balanced``, ``row_blocks``, ``row_modulo``): in the ``read``
    phase every rank reads or generates only its own rows (:func:`read_rows`); the operation's
    ``distribute`` then hands each rank that part as its ``partition()`` would scatter it
    (``indptr``, ``indices``, ``data``, ``rows``, ``ncols``, ``nrows`` in the run's dtypes), and
    the data every rank needs is made on every rank by its ``shared_data(part)`` instead of
    broadcast. The ``problem`` is a :class:`RowProblem`: shape, nnz and dtypes at hand, the
    whole matrix read or made only when rank 0's verification or a peer asks for it.

    ``strategy`` is the split the rows are read by: the run's, or a provisional one when the
    operation's split needs more than the input (SpGEMM's ``product_balanced`` reads equal
    ``row_blocks`` and moves the rows in ``shared_data``, :func:`redistribute_rows`).
    ``repeated_values``: the operation takes the unit values of a matrix its GPU made as one
    value repeated (:func:`generate_row_part`) and makes them an array where it needs one.
    """

    KIND = "matrix"

    def __init__(self, strategy, repeated_values=False):
        _check_strategy(strategy)
        self.strategy = strategy
        self.repeated_values = repeated_values

    def load(self, ctx, op):
        self.check(op)
        return read_rows(ctx.comm, ctx.config, type(op), self.strategy,
                         device=ctx if ctx.backend == "gpu" else None,
                         repeated_values=self.repeated_values)

    def distribute(self, op, problem):
        ctx = op.ctx
        with ctx.timer.phase("partition"):
            part = problem.take_part()
        with ctx.timer.phase("distribute"):
            shared = op.shared_data(part)
        return part, shared

    def describe(self, problem):
        # From the problem's metadata: the whole matrix is not loaded for it.
        return {"problem_kind": "matrix", "global_rows": problem.nrows,
                "global_cols": problem.ncols, "global_nnz": problem.nnz,
                "index_dtype": str(problem.index_dtype), "value_dtype": str(problem.value_dtype),
                "input_made_on_device": problem.on_device}


def read_rows(comm, config, op_cls, strategy, keep_whole=None, device=None,
              repeated_values=False):
    """This rank's rows of the input, read or generated here, in the run's dtypes. *Collective.*

    ``keep_whole``: one rank keeps its part (the whole matrix) for verification and the peers
    instead of making it again (:class:`RowProblem`); None decides by :func:`keeps_whole`.
    ``device``: the run context of a GPU run, whose GPU makes a generator's edges where it can
    (:func:`generate_row_part`, as are ``repeated_values``).

    Returns
    -------
    RowProblem
        The part, and the whole matrix on demand (:func:`~hisparse.layout.read_problem`, on the
        rank that asks: rank 0's verification and peers).
    """
    section = config["input"]
    all_call(comm, check_input_kind, config, op_cls)
    if section["generate"] is not None:
        part = generate_row_part(comm, section["generate"], strategy, device=device,
                                 index_width=config["index_width"],
                                 repeated_values=repeated_values)
    else:
        part = read_row_part(comm, section["path"], section["group"], strategy,
                             section["duplicates"])
    part = cast_row_part(comm, part, run_value_dtype(config), config["index_width"],
                         input_label(config), config["precision"])
    if keep_whole is None:
        keep_whole = keeps_whole(comm, config, part)
    return RowProblem(part, load=lambda: read_problem(config, op_cls), keep_whole=keep_whole)


#: rows :func:`sampled_reach` reads the columns of
REACH_SAMPLE_ROWS = 8


def sampled_reach(config, rank, size):
    """Before the read: the share of entries, among :data:`REACH_SAMPLE_ROWS` rows spread over
    this rank's even block of rows of the input file, whose columns lie outside its even block
    of columns (the x entries it would own): a guess of how far its rows reach, read from
    ``indices`` alone. None for a generated input, or where the file cannot be looked at (the
    read reports what is wrong with it). Local, never collective: a guess that only decides
    what is prepared beside the read, never a result."""
    section = config["input"]
    if section["generate"] is not None:
        return None
    try:
        csr = open_csr_group(section["path"], section["group"])
        lo, hi = share_of(csr.shape[0], rank, size)
        c0, c1 = share_of(csr.shape[1], rank, size)
        if hi <= lo:
            return None
        rows = np.unique(np.linspace(lo, hi - 1, REACH_SAMPLE_ROWS).astype(np.int64))
        columns = sample_row_columns(csr, rows)
    except Exception:  # noqa: BLE001 - the read meets and reports it, on every rank
        return None
    total = sum(len(c) for c in columns)
    outside = sum(int(np.count_nonzero((c < c0) | (c >= c1))) for c in columns)
    return outside / total if total else 0.0


def replicated_matrix(comm, config, problem, part):
    """The whole matrix on every rank, in the rank-0 path's dtypes (``problem.matrix``'s), for an
    operation that replicates it (SpGEMM's B when ``b: same``). *Collective.*

    A generator quick to run again (a stencil, a band) makes it again here; otherwise (a file,
    which every rank would read whole at once, or a generator slow to make again:
    :attr:`~hisparse.generators.Generator.SLOW_TO_REMAKE`) every rank's ``part`` (the
    :meth:`RowProblem.take_part` dict, before any row moved) goes to every rank by one
    all-to-all and the rows are put in order: R-MAT 18 at 2 ranks took 0.3 s to make again
    on each rank of the 2xH200 host, for 4M entries that move in a few hundredths. (Rank 0's
    verification still makes or reads its own whole matrix: a wrong gather is not checked
    against itself.)"""
    spec = config["input"]["generate"]
    if comm.size == 1 or (spec is not None and
                          not generators.generator_of(spec).SLOW_TO_REMAKE):
        return all_call(comm, lambda: problem.matrix)  # (a rank that fails stops them all)
    lengths = np.diff(np.asarray(part["indptr"], dtype=np.int64))
    mine = {"rows": np.asarray(part["rows"], dtype=np.int64), "lengths": lengths,
            "indices": part["indices"], "data": part["data"]}
    every, _ = alltoall_concatenated(comm, [mine] * comm.size)
    rows = every["rows"]
    if len(rows) != problem.nrows:
        raise RuntimeError(f"replicated_matrix: the ranks' parts hold {len(rows)} rows of "
                           f"{problem.nrows}")
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(every["lengths"], out=indptr[1:])
    index_dtype = np.asarray(part["indptr"]).dtype
    stacked = CSRMatrix(indptr, every["indices"], every["data"], tuple(problem.shape),
                        problem.symmetric)
    if np.any(rows[1:] < rows[:-1]):  # row-modulo parts interleave: rows in order
        stacked = stacked.rows(np.argsort(rows, kind="stable"))
    return CSRMatrix(stacked.indptr.astype(index_dtype, copy=False), stacked.indices,
                     stacked.data, tuple(problem.shape), problem.symmetric)


def keeps_whole(comm, config, part):
    """Whether one rank keeps its part for verification and the peers: when they will want the
    whole matrix and it was generated by a kind slow to make again
    (:attr:`~hisparse.generators.Generator.SLOW_TO_REMAKE`), and large. Stencils, bands and
    files are made or read again in about the time the kept arrays' fingerprint costs (in the
    set-up, where the time to solution counts it)."""
    spec = config["input"]["generate"]
    return (comm.size == 1 and (config["verify.enabled"] or bool(config["peers"]))
            and spec is not None and generators.generator_of(spec).SLOW_TO_REMAKE
            and part.local_nnz >= KEEP_WHOLE_MIN_NNZ)
