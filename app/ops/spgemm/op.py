"""SpGEMM, C = A B (or A A), CSR in and CSR out with sorted columns, over row partitions of A.

Plan: A's rows are partitioned in contiguous equal blocks (``auto``'s layout, kept unless the
input is skewed), row-modulo (the seed's layout) or in contiguous blocks balanced by
intermediate products (``sum_k nnz(B[k, :])`` over the row's columns k) or work, and B
(``b: same`` for A A, or ``FILE.h5:/group``) is replicated on every rank.

Setup by rows (issue 13, a :class:`~hisparse.layout.RowLayout`): every rank reads or generates only its rows of A in the
driver's ``read`` phase and makes B itself, in parallel (``b: same``: the whole input read or
generated from its spec and seed on every rank, or on one rank the part itself; else B's file
read whole by every rank), then counts its rows' products. ``product_balanced`` reads A in equal
provisional blocks and, once the products are known, moves the rows to their owners by one
all-to-all (the cuts found collectively). Nothing is partitioned, scattered or broadcast on rank
0, whose whole A is loaded only when verification or a peer asks for it
(:class:`~hisparse.layout.RowProblem`). Every rank ends with exactly the rows of A, dtypes,
products and B that the rank-0 path (:meth:`SpGEMM.partition`, still taken when the input is
handed over whole) gives it.

Every repetition each rank's engine multiplies its rows (GPU: two-phase hash kernels,
:mod:`.gpu`; CPU: SciPy, :mod:`.cpu`) and keeps them where it computed them (C stays on the GPU;
no copy, no communication in the timed repeat, unless C had to be computed in chunks that go to
the host one by one).

After the repeats, :meth:`SpGEMM.collect` brings back what verification and ``/result`` need:

- ``full``: C itself, when verification is on or nnz(C) <= ``store_result_max_nnz`` (and not
  ``keep_distributed``): each rank copies its block to the host (pinned, chunked), rank 0 gathers
  the blocks (:func:`~hisparse.parallel.gather_parts`) and reassembles C in global row order
  (contiguous blocks concatenated, row-modulo rows re-interleaved);
- ``checksums``: otherwise (always with ``keep_distributed``), per-row counts, sums and
  column-weighted sums computed where C is, and a few sampled rows, which verification compares
  with SciPy (:mod:`.checksums`).

FLOPs are 2 x intermediate products. Results record our peak device memory (bytes held from the
driver, inputs included) beside cuSPARSE's (CuPy memory-pool high-water mark).
"""
from dataclasses import dataclass

import numpy as np

from ...config import Setting, non_negative, positive
from ...errors import ConfigError, HisparseError, InputError
from ...formats import CSRMatrix, index_dtype_for, row_sums, rows_sorted
from ...io import hdf5_reference_check, split_hdf5_reference
from ...layout import RowLayout, move_rows_to_owners, redistribute_rows, replicated_matrix
from ...parallel import AllReduce, all_call, gather_parts
from ...partition import (equal_blocks, nnz_balanced_blocks, owners_of, partition_rows,
                          parts_work, work_imbalance, work_owners)
from .. import Operation
from . import peers
from .checksums import checksum_errors, reference_checksums, sample_positions
from .plan import plan_kernels
from .reference import csr_matmat, same_structure_error


@dataclass
class SpgemmLocal:
    """What an engine multiplies on one rank.

    Attributes
    ----------
    a : CSRMatrix
        This rank's rows of A.
    b : CSRMatrix
        All of B (``a`` itself when ``b_is_a``).
    b_is_a : bool
        B is the same matrix as A and A is all of it (one rank, ``b: same``): held once.
    products : ndarray of int64
        Intermediate products of each local row (:func:`row_products`).
    """

    a: CSRMatrix
    b: CSRMatrix
    b_is_a: bool
    products: np.ndarray


def row_products(a, b):
    """Intermediate products of each row of A B.

    Parameters
    ----------
    a, b : CSRMatrix
        ``a.ncols == b.nrows``.

    Returns
    -------
    ndarray, shape (a.nrows,), int64
        ``sum over the entries (i, k) of row i of A of nnz(B[k, :])``.
    """
    b_lengths = np.diff(np.asarray(b.indptr, dtype=np.int64))
    if len(b_lengths) and int(b_lengths.max()) <= np.iinfo(np.int32).max:
        b_lengths = b_lengths.astype(np.int32)  # half the bytes gathered; summed in int64
    indices = np.asarray(a.indices)
    # By blocks of rows on several threads (row_sums), each block's temporaries a few MB: the
    # whole matrix's per-entry lengths and their running sum (16 bytes per entry of A, 0.9 GB
    # for the 27-point 128^3 stencil) cost more in page faults than the sums.
    return row_sums(a.indptr, lambda s, e: b_lengths[indices[s:e]], np.int64)


#: ``partition.strategy: auto`` on several ranks takes ``flops_balanced`` when the row blocks'
#: work imbalance (max / mean over the ranks) is above this, or when some row is heavy (the
#: input is skewed: see :func:`choose_split`)
AUTO_IMBALANCE = 1.05


def row_work(products, ncols_b):
    """Each row's work for ``flops_balanced``: its intermediate products (the flops / 2), plus
    the bound ``min(products, ncols(B))`` on the entries it writes, plus 1 (an empty row still
    costs a thread and a row pointer); int64."""
    products = np.asarray(products, dtype=np.int64)
    return products + np.minimum(products, int(ncols_b)) + 1


@dataclass
class Split:
    """How A's rows end up over the ranks.

    Attributes
    ----------
    strategy : str
        The strategy taken (``auto`` resolved).
    owners : ndarray of int64 or None
        The rank of each row held here, when the rows must move (None: they stay).
    work : ndarray of int64
        Every rank's work (:func:`row_work` summed) under the split taken.
    held_imbalance : float or None
        The work imbalance of the rows as they were read (``auto``'s row blocks), when ``auto``
        weighed it.
    heavy_rows : int
        Rows dealt on their own by ``flops_balanced``.
    """

    strategy: str
    owners: object
    work: np.ndarray
    held_imbalance: object = None
    heavy_rows: int = 0


def held_owners(strategy, rows, nrows, nparts):
    """The rank of each of ``rows`` under the layout ``strategy`` reads by: ``row_modulo`` or
    ``row_blocks`` (:func:`~hisparse.partition.equal_blocks`); int64."""
    bounds = None if strategy == "row_modulo" else equal_blocks(nrows, nparts)
    return owners_of(np.asarray(rows, np.int64), bounds, nparts)


def choose_split(strategy, auto, rows, work, nrows, nparts, sum_all=lambda a: a,
                 gather_all=lambda v: [v]):
    """The split of A's rows by ``strategy`` (the one they were read by: ``row_blocks`` or
    ``row_modulo``) or, for ``flops_balanced`` (and ``auto`` where it takes it), the owners
    :func:`~hisparse.partition.work_owners` gives from ``work`` (:func:`row_work`).

    ``auto`` (held as ``row_blocks``, the layout it reads by) keeps the row blocks where their
    work imbalance is at most ``AUTO_IMBALANCE`` and no row is heavy (above ``HEAVY_FACTOR`` x
    the mean row's work), else takes ``flops_balanced``: on R-MAT, whose ids are permuted, the
    blocks' work imbalance is small, but the hubs land unevenly (docs/ops/spgemm.md).
    Contiguous rows, not row-modulo's, because neighbouring rows of a mesh share most of their
    B rows, which a rank then reads from L2 as one GPU does (27-point 128^3 at 2 ranks: the
    numeric kernel 8 % above half of one rank's under row-modulo). ``sum_all`` and
    ``gather_all`` are the two collectives over the ranks' rows (identities on rank 0 holding
    every row), so every rank and the rank-0 path choose alike.
    """
    if strategy != "flops_balanced" and not (auto and nparts > 1):
        return Split(strategy, None, parts_work(held_owners(strategy, rows, nrows, nparts),
                                                work, nparts, sum_all))
    owners, per_part, heavy = work_owners(rows, work, nrows, nparts, sum_all, gather_all)
    if strategy == "flops_balanced":
        return Split(strategy, owners, per_part, None, heavy)
    held = parts_work(held_owners(strategy, rows, nrows, nparts), work, nparts, sum_all)
    imbalance = work_imbalance(held)
    if heavy == 0 and imbalance <= AUTO_IMBALANCE:
        return Split(strategy, None, held, imbalance)
    return Split("flops_balanced", owners, per_part, imbalance, heavy)


def move_rows(comm, part, owners):
    """``part``'s rows (a dict as :meth:`SpGEMM.partition` gives) moved to the ranks ``owners``
    names, by one all-to-all; what this rank receives, in ascending row order. *Collective.*"""
    block = CSRMatrix(part["indptr"], part["indices"], part["data"],
                      (len(part["rows"]), part["ncols"]))
    mine = move_rows_to_owners(comm, part["rows"], block, owners, part["ncols"])
    return dict(part, rows=mine["rows"], indices=mine["indices"], data=mine["data"],
                indptr=mine["indptr"].astype(part["indptr"].dtype))


def read_b(spec, a_ncols, value_dtype):
    """The right operand B of C = A B from ``FILE.h5:/group``, checked against A's columns.

    Returns
    -------
    CSRMatrix
        Values of A's dtype (``value_dtype``); the file's index dtype
        (:func:`unify_index_dtypes` gives A and B one).
    """
    from ...io import read_matrix
    path, group = split_hdf5_reference(spec)
    b = read_matrix(path, group)
    if b.nrows != a_ncols:
        raise InputError(f"{path}:{group}: B has {b.nrows} rows but A has {a_ncols} columns "
                         f"(operation.params.b must have shape ({a_ncols}, n))")
    return b.astype(value_dtype)


def check_square(shape):
    """``b: same`` multiplies A by itself: A must be square."""
    if shape[0] != shape[1]:
        raise InputError(f"operation.params.b: 'same' needs a square A, got shape "
                         f"{tuple(shape)}; give B as 'FILE.h5:/group'")


def shared_index_dtype(a_nnz, a_shape, b, index_width):
    """The one index dtype of A (``a_nnz`` entries, ``a_shape``) and B, wide enough for both
    (``index_width`` as in the config): A's whole-matrix figures, so that a rank holding only
    its rows of A picks what rank 0 picks for all of A."""
    return index_dtype_for(max(a_nnz, b.nnz, *a_shape, *b.shape), index_width)


def unify_index_dtypes(a, b, index_width):
    """A and B with one index dtype, wide enough for both (``index_width`` as in the config)."""
    dtype = shared_index_dtype(a.nnz, a.shape, b, index_width)
    return a.astype(None, dtype), b.astype(None, dtype)


def assemble_rows(pieces, n_rows, n_cols, index_dtype, value_dtype):
    """Reassemble C from per-rank row sets in global row order.

    Parameters
    ----------
    pieces : list of dict
        ``rows`` (int64, global ids, ascending), ``indptr`` (int64, len(rows) + 1), ``indices``,
        ``data`` of each rank's rows of C.

    Returns
    -------
    CSRMatrix
        ``indptr`` int64.
    """
    lengths = np.zeros(n_rows, dtype=np.int64)
    for piece in pieces:
        lengths[piece["rows"]] = np.diff(piece["indptr"])
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    indices = np.empty(int(indptr[-1]), dtype=index_dtype)
    data = np.empty(int(indptr[-1]), dtype=value_dtype)
    for piece in pieces:
        rows, local = piece["rows"], piece["indptr"]
        if len(rows) == 0 or len(piece["data"]) == 0:
            continue
        if rows[-1] - rows[0] + 1 == len(rows):  # contiguous block: one slice
            start = int(indptr[rows[0]])
            indices[start:start + len(piece["indices"])] = piece["indices"]
            data[start:start + len(piece["data"])] = piece["data"]
            continue
        counts = np.diff(local)
        shift = np.repeat(indptr[rows] - local[:-1], counts)
        target = shift + np.arange(len(piece["data"]), dtype=np.int64)
        indices[target] = piece["indices"]
        data[target] = piece["data"]
    return CSRMatrix(indptr, indices, data, (n_rows, n_cols))


class SpGEMM(Operation):
    """C = A B with A's rows partitioned over the ranks and B replicated."""

    GATHERS_RESULT = True
    NAME = "spgemm"
    INPUT_KIND = "matrix"
    PARAMS = {
        "b": Setting(str, "same", "Right operand: 'same' (C = A A) or 'FILE.h5:/group'.",
                     check=hdf5_reference_check(
                         ("same",), "'same' (C = A A) or 'FILE.h5:/group' (C = A B)"),
                     path=True),
        "keep_distributed": Setting(bool, False, "Never gather C to rank 0: after the repeats "
                                                 "bring back per-row counts, sums and "
                                                 "column-weighted sums and sampled rows, which "
                                                 "verification checks."),
        "sample_rows": Setting(int, 8, "Rows of C per rank brought back whole when C is not "
                                       "gathered (evenly spaced, plus the longest).",
                               check=non_negative),
        "chunk_rows": Setting(int, None, "Process at most this many rows of A per numeric "
                                         "chunk (null = only when C would not fit).",
                              nullable=True, check=positive),
        "memory_budget": Setting(int, None, "Device bytes C and workspace may use (null = 85% of "
                                            "the free memory after the upload); C is computed "
                                            "in row chunks when it would not fit.",
                                 nullable=True, check=positive),
        "global_table_bytes": Setting(int, 1 << 30, "Bytes of global hash tables per batch of "
                                                      "long rows.", check=positive),
        "dense_long_rows": Setting(bool, True, "Rows beyond the largest shared table use "
                                               "shared-memory column bitmaps (symbolic) and "
                                               "dense accumulators over column windows "
                                               "(numeric, when B has at most "
                                               "dense_columns_per_output columns per output "
                                               "entry) instead of global hash tables."),
        "dense_columns_per_output": Setting(int, 64, "A long row takes the dense column "
                                                     "windows when ncols(B) <= this x its "
                                                     "output size.", check=positive),
        "balanced_products": Setting(bool, None, "One-row-per-block groups deal a row's "
                                                 "products to their warps in chunks of 32 "
                                                 "(a scan of the B row lengths and shuffles) "
                                                 "instead of one B row per warp; null = when "
                                                 "B's rows are skewed (the product-weighted "
                                                 "row length >= 4x the mean: power-law "
                                                 "graphs).", nullable=True),
        "window_search": Setting(bool, None, "With B wider than one dense window, each window "
                                             "walks only its products of B's long rows, found "
                                             "by binary search (needs B's rows sorted by "
                                             "column); null = when they are sorted and a row "
                                             "may take the windows.", nullable=True),
        "bounded_output": Setting(bool, None, "Skip the symbolic pass: each row is computed "
                                              "into a slot of min(products, ncols(B)) entries "
                                              "with its count, then the rows are packed in "
                                              "place into C (C keeps the slots' buffer); "
                                              "null = when no row needs a global hash table "
                                              "and the slots take at most 128 MB (small "
                                              "products, where the symbolic launches and the "
                                              "read-back of nnz(C) outweigh the symbolic "
                                              "work).", nullable=True),
        "team_lanes": Setting(int, None, "Lanes that walk one B row together (teams of a warp "
                                         "take A's entries in turn); null = the power of two "
                                         "nearest B's row length averaged over the products; "
                                         "32 = a whole warp per B row.",
                              nullable=True, choices=(1, 2, 4, 8, 16, 32)),
        "max_shared_table": Setting(int, None, "Cap on shared-memory table entries (null = what "
                                               "the device allows); rows above it use global "
                                               "tables.", nullable=True, check=positive),
        "store_result_max_nnz": Setting(int, 5_000_000, "Gather C and store it under /result "
                                                        "when nnz(C) is at most this; larger C "
                                                        "is gathered only to verify it (row "
                                                        "pointers are always stored).",
                                        check=non_negative),
    }
    PARTITIONS = ("row_blocks", "row_modulo", "product_balanced", "flops_balanced")
    PEERS = ("cusparse", "scipy")
    SETUP_PHASES = {"partition": "setup", "distribute": "communication", "upload": "transfer"}
    # Compute time (GFLOP/s, peer speedups) is binning + symbolic + numeric: the compute kinds.
    # C stays where it was computed; d2h runs only when C is computed in chunks that go to the
    # host. Gathering C (or its checksums) is the driver's ``collect`` phase, after the repeats.
    REPEAT_PHASES = {"binning": "compute", "symbolic": "compute", "numeric": "compute",
                     "d2h": "transfer"}

    # Its collectives move host buffers (nnz(C), the gathered parts): auto picks MPI, no NCCL
    # communicator is made.
    DEVICE_COLLECTIVES = False

    def __init__(self, ctx):
        super().__init__(ctx)
        #: ``auto`` reads by row blocks and may move to ``flops_balanced`` (:func:`choose_split`)
        self.auto = ctx.config["partition.strategy"] == "auto"
        self.split = None

    @classmethod
    def estimate_memory(cls, config, header, nranks):
        """The default (A's rows, one row of C each) and B, whole on every rank: A itself for
        ``b: same`` (another B's size is not known before it is read)."""
        estimate = super().estimate_memory(config, header, nranks)
        if config["operation.params.b"] == "same":
            estimate.add("operation.params.b", header.part_bytes(1))
        return estimate

    def layout(self):
        """Every rank reads or generates only its rows of A and makes B itself (issue 13);
        ``product_balanced`` and ``flops_balanced`` read A in equal provisional blocks: their
        split needs each row's products, known once B is (:meth:`shared_data` then moves the
        rows); ``auto`` reads by row blocks, where they stay unless the input is skewed."""
        balanced = ("product_balanced", "flops_balanced")
        return RowLayout("row_blocks" if self.strategy in balanced else self.strategy)

    def setup(self, problem):
        ctx = self.ctx
        # Read by rows: B, and later (rank 0: verification, peers) the whole A, come from here.
        self.problem = problem
        self._a_global = self._b_global = None
        part, b_arrays = self.distribute(problem)
        b_is_a = self.params["b"] == "same" and ctx.size == 1
        self.rows = part["rows"]
        self.global_shape = (part["nrows"], b_arrays["ncols"])
        a_local = CSRMatrix(part["indptr"], part["indices"], part["data"],
                            (len(part["indptr"]) - 1, part["ncols"]))
        b = a_local if b_is_a else CSRMatrix(
            b_arrays["indptr"], b_arrays["indices"], b_arrays["data"],
            (len(b_arrays["indptr"]) - 1, b_arrays["ncols"]))
        self.local = SpgemmLocal(a_local, b, b_is_a, part["products"])
        self.result_full = None
        self.collected = None
        self.stats_all = []
        self.peer_peak = {}
        self.engine = self.pick_engine(self.local)
        with ctx.timer.phase("upload"):
            self.upload(self.engine)

    def upload(self, engine):
        """Upload ``engine``'s operands. On the GPU the kernel plan (:func:`~.plan.plan_kernels`:
        tables, bins, walk, windows) is resolved from ``operation.params`` here, before the
        engine sees it, and a forced path that cannot apply stops the run with a ConfigError
        naming its key: ``window_search: true`` on unsorted B before the upload,
        ``bounded_output: true`` once the memory left after it is known."""
        if engine.BACKEND != "gpu":
            engine.upload()
            return
        source = self.ctx.config.source
        plan = plan_kernels(engine.local, self.params, *engine.device_limits())
        if plan.search_refused:
            raise ConfigError(source, "operation.params.window_search",
                              "true needs B's columns sorted within each row; they are not "
                              "(null searches only when they are)")
        engine.upload(plan)
        if engine.bounded_refusal:
            raise ConfigError(source, "operation.params.bounded_output",
                              f"true cannot be used here: {engine.bounded_refusal} (null "
                              f"chooses it only where it can)")

    def shared_data(self, part):
        """Read by rows: B, made on this rank (``b: same``: the whole input read or generated
        here, or on one rank the part, which is all of A; else B's file read whole), and
        ``part`` completed in place as :meth:`partition` gives it (A's rows in B's index dtype,
        their intermediate products). *Collective*: a bad B stops every rank with one error."""
        ctx = self.ctx
        b = all_call(ctx.comm, self._own_b, part)
        if b is None:  # B is A: whole A in the rank-0 path's dtypes, made again, or gathered
            # from the ranks' parts where making or reading it again is slow
            b = replicated_matrix(ctx.comm, ctx.config, self.problem, part)
        block = CSRMatrix(part["indptr"], part["indices"], part["data"],
                          (len(part["rows"]), part["ncols"]))
        part["products"] = row_products(block, b)
        if self.strategy == "product_balanced" and ctx.size > 1:
            part.update(self._balance_products(block, part, b))
        else:
            sum_all = AllReduce(ctx.comm, "sum")
            self.split = choose_split(self.strategy, self.auto, part["rows"],
                                      row_work(part["products"], b.ncols), part["nrows"],
                                      ctx.size, lambda a: sum_all(np.ascontiguousarray(a)),
                                      ctx.comm.allgather)
            self.strategy = self.split.strategy
            if self.split.owners is not None and ctx.size > 1:
                part.update(move_rows(ctx.comm, part, self.split.owners))
                moved = CSRMatrix(part["indptr"], part["indices"], part["data"],
                                  (len(part["rows"]), part["ncols"]))
                part["products"] = row_products(moved, b)
        self.total_products = AllReduce(ctx.comm, "sum").scalar(int(part["products"].sum()))
        self.operand_sizes = (self.problem.nnz, self.problem.nrows, b.nnz, b.nrows)
        return {"indptr": b.indptr, "indices": b.indices, "data": b.data, "ncols": b.ncols}

    def _own_b(self, part):
        """B on this rank, with ``part``'s index arrays cast to B's index dtype; ``None`` where B
        is A spread over several ranks (:meth:`shared_data` puts it together)."""
        problem, params = self.problem, self.params
        if params["b"] == "same":
            check_square(problem.shape)
            if self.ctx.size > 1:
                return None  # whole A on every rank: shared_data's collective step
            # One rank: the part is all of A, in the whole matrix's dtypes (cast_row_part).
            self._a_global = CSRMatrix(part["indptr"], part["indices"], part["data"],
                                       problem.shape, problem.symmetric)
            return self._a_global
        b = read_b(params["b"], problem.ncols, problem.value_dtype)
        dtype = shared_index_dtype(problem.nnz, problem.shape, b, self.ctx.index_width)
        for name in ("indptr", "indices"):
            part[name] = part[name].astype(dtype, copy=False)
        self._b_global = b.astype(None, dtype)
        return self._b_global

    def _balance_products(self, block, part, b):
        """``product_balanced`` read by rows: this rank's provisional block of A (equal row
        blocks, in rank order) moved so that rank r owns the rows :meth:`partition` gives it
        (the products' running sum cut as :func:`~hisparse.partition.nnz_balanced_blocks`
        cuts it), by one all-to-all; the products counted again for the rows it ends with.
        ``block``: this rank's rows of ``part`` as a CSRMatrix. *Collective.*"""
        moved = redistribute_rows(self.ctx.comm, int(part["rows"][0]), block,
                                  (part["nrows"], part["ncols"]), "nnz_balanced",
                                  weights=part["products"])
        rows = CSRMatrix(moved.indptr.astype(block.indptr.dtype), moved.indices, moved.data,
                         (len(moved.rows), part["ncols"]))
        return {"indptr": rows.indptr, "indices": rows.indices, "data": rows.data,
                "rows": moved.rows, "products": row_products(rows, b)}

    @property
    def a_global(self):
        """All of A in the run's dtypes (rank 0: verification, peers). Read by rows, it is
        loaded only here, on first use (:class:`~hisparse.layout.RowProblem`), unless B was it."""
        if self._a_global is None:
            index_dtype = self.local.a.indices.dtype  # B's, when B is a file
            self._a_global = self.problem.matrix.astype(None, index_dtype)
        return self._a_global

    @property
    def b_global(self):
        """All of B (A itself for ``b: same``)."""
        return self.a_global if self.params["b"] == "same" else self._b_global

    def partition(self, problem):
        ctx = self.ctx
        if self.params["b"] == "same":
            check_square(problem.shape)
            a, b = problem, problem
        else:
            b = read_b(self.params["b"], problem.ncols, problem.data.dtype)
            a, b = unify_index_dtypes(problem, b, ctx.index_width)
        self._a_global, self._b_global = a, b
        self.operand_sizes = (a.nnz, a.nrows, b.nnz, b.nrows)
        products = row_products(a, b)
        self.total_products = int(products.sum())
        if self.strategy == "product_balanced":
            bounds = nnz_balanced_blocks(np.concatenate([[0], np.cumsum(products)]), ctx.size)
            row_sets = [np.arange(bounds[r], bounds[r + 1], dtype=np.int64)
                        for r in range(ctx.size)]
        else:
            self.split = choose_split(self.strategy, self.auto,
                                      np.arange(a.nrows, dtype=np.int64),
                                      row_work(products, b.ncols), a.nrows, ctx.size)
            self.strategy = self.split.strategy
            if self.split.owners is None:  # the rows stay in the layout they were split by
                row_sets = partition_rows(a.indptr, ctx.size, self.strategy).rows
            else:
                row_sets = [np.flatnonzero(self.split.owners == r).astype(np.int64)
                            for r in range(ctx.size)]
        parts = []
        for rows in row_sets:
            if ctx.size == 1:
                block = a
            elif rows[-1] - rows[0] + 1 == len(rows):
                block = a.row_block(int(rows[0]), int(rows[-1]) + 1)
            else:
                block = a.rows(rows)
            parts.append({"indptr": block.indptr.astype(a.indptr.dtype), "indices": block.indices,
                          "data": block.data, "rows": rows, "products": products[rows],
                          "ncols": a.ncols, "nrows": a.nrows})
        return parts, {"indptr": b.indptr, "indices": b.indices, "data": b.data,
                       "ncols": b.ncols}

    def run_once(self):
        self.engine.multiply()

    def c_collection(self, nnz_c):
        """How C of ``nnz_c`` entries is collected: ``"full"`` (C to rank 0) or ``"checksums"``
        (see the module docstring); the same on every rank. Not ``output.collect`` (SpGEMM
        takes only ``gather``)."""
        if self.params["keep_distributed"]:
            return "checksums"
        needed = self.ctx.config["verify.enabled"] or nnz_c <= self.params["store_result_max_nnz"]
        return "full" if needed else "checksums"

    def collect(self):
        """C, or its checksums and sampled rows, from the last repeat to rank 0; then the ranks
        hand C's buffers back. *Collective.*"""
        ctx, engine = self.ctx, self.engine
        stats = dict(engine.stats)
        nnz_c = AllReduce(ctx.transport).scalar(int(stats.get("nnz_c", 0)))
        self.collected = self.c_collection(nnz_c)
        piece = {"rows": self.rows, "stats": dict(stats, **self._work_stats())}
        if self.collected == "full":
            piece.update(zip(("indptr", "indices", "data"), engine.local_result()))
        else:
            piece.update(zip(("row_nnz", "row_sums", "row_weighted_sums"), engine.checksums()))
            positions = sample_positions(piece["row_nnz"], self.params["sample_rows"])
            piece["sample_rows"] = self.rows[positions]
            piece.update(zip(("sample_indptr", "sample_indices", "sample_data"),
                             engine.sample(positions)))
        gathered = gather_parts(ctx.transport, piece)
        engine.free_result()
        if ctx.is_root:
            self.stats_all = [g["stats"] for g in gathered]
            self.result_full = self._assemble(gathered)

    def _assemble(self, gathered):
        """Rank 0: C (CSRMatrix) or the checksums of every row and the sampled rows (dict)."""
        m, n = self.global_shape
        if self.collected == "full":
            if len(gathered) == 1:
                g = gathered[0]
                return CSRMatrix(g["indptr"], g["indices"], g["data"], (m, n))
            return assemble_rows(gathered, m, n, gathered[0]["indices"].dtype,
                                 gathered[0]["data"].dtype)
        result = {"row_nnz": np.zeros(m, np.int64), "row_sums": np.zeros(m, np.float64),
                  "row_weighted_sums": np.zeros(m, np.float64)}
        for g in gathered:
            for name in result:
                result[name][g["rows"]] = g[name]
        samples = [{"rows": g["sample_rows"], "indptr": g["sample_indptr"],
                    "indices": g["sample_indices"], "data": g["sample_data"]} for g in gathered]
        rows = np.concatenate([g["sample_rows"] for g in gathered]).astype(np.int64)
        order = np.argsort(rows, kind="stable")
        # the sampled rows of every rank as one CSR block in ascending global row order
        block = assemble_rows(
            [dict(p, rows=np.searchsorted(rows[order], p["rows"])) for p in samples],
            len(rows), n, gathered[0]["sample_indices"].dtype, gathered[0]["sample_data"].dtype)
        result.update(sample_rows=rows[order], sample_indptr=block.indptr,
                      sample_indices=block.indices, sample_data=block.data)
        return result

    def teardown(self):
        self.engine.free()

    # -- rank 0 ---------------------------------------------------------------------------------
    def result(self):
        return self.result_full

    def reference(self, problem):
        """C in float64 as SciPy makes it (:func:`~.reference.csr_matmat`, the same arrays on
        every core), or (C collected as checksums) the reference checksums and sampled rows
        (:func:`~.checksums.reference_checksums`: no full product is formed)."""
        a = self.a_global.to_scipy().astype(np.float64)
        b = a if self.params["b"] == "same" else self.b_global.to_scipy().astype(np.float64)
        if self.collected == "checksums":
            return reference_checksums(a, b, row_products(self.a_global, self.b_global),
                                       self.result_full["sample_rows"])
        return csr_matmat(a, b)

    def compare(self, result, reference):
        """Norm-wise relative error of C; ``inf`` when the structure is wrong.

        The structure must hold every entry of the reference, with strictly increasing columns
        in each row. Entries the reference lacks (SciPy drops exact zeros of cancellation) count
        through their values. C collected as checksums: the largest of
        :func:`~.checksums.checksum_errors`.
        """
        if isinstance(result, dict):
            return max(checksum_errors(result, reference).values())
        scale = max(float(reference.data.max()), -float(reference.data.min())) \
            if reference.nnz else 0.0
        scale = scale if scale > 0 else 1.0
        if tuple(result.shape) != tuple(reference.shape):
            return float("inf")
        indptr = np.asarray(result.indptr, np.int64)
        if not rows_sorted(indptr, result.indices):
            return float("inf")
        # One compiled pass on every core for the usual case, C with the reference's structure
        # (NumPy's equality and difference passes over every entry took longer than the product).
        same_structure, largest = same_structure_error(result, reference)
        if same_structure:
            return largest / scale
        import scipy.sparse as sp
        ours = sp.csr_matrix((result.data.astype(np.float64), result.indices, indptr),
                             shape=result.shape)
        pattern = sp.csr_matrix((np.ones(ours.nnz), ours.indices, ours.indptr), shape=ours.shape)
        covered = abs(reference).multiply(pattern)
        covered.eliminate_zeros()
        if covered.nnz != reference.nnz:
            return float("inf")
        diff = (ours - reference).tocsr()
        return float(np.max(np.abs(diff.data), initial=0.0) / scale)

    def work(self, problem):
        # From sizes and dtypes (the local rows share the global dtypes): read by rows, rank 0
        # never loads the whole A just for this.
        a_nnz, a_rows, b_nnz, b_rows = self.operand_sizes
        index = self.local.a.indices.dtype.itemsize
        value = self.local.a.data.dtype.itemsize
        nnz_c = sum(int(s.get("nnz_c", 0)) for s in self.stats_all)
        # Compulsory traffic: read A and B once, write C once (row pointers included).
        compulsory = (a_nnz + b_nnz + nnz_c) * (index + value) + \
            (a_rows + 1 + b_rows + 1) * index + (a_rows + 1) * 8
        return {"flops": 2.0 * self.total_products, "bytes": float(compulsory)}

    def run_peer(self, name, problem, repeats):
        b = None if self.params["b"] == "same" else self.b_global
        if name == "scipy":
            return peers.scipy_spgemm(self.a_global, b, repeats)
        if name == "cusparse":
            if self.engine.arena is not None:  # give our cached blocks back for CuPy's pool
                self.engine.arena.release_cache()
            info = peers.cusparse_spgemm(self.a_global, b, repeats)
            self.peer_peak[name] = info["peak_device_bytes"]
            return info
        raise HisparseError(f"unknown peer {name}")

    def result_arrays(self, result):
        if isinstance(result, dict):  # checksums and sampled rows
            return dict(result)
        arrays = {"indptr": np.asarray(result.indptr, np.int64)}
        if result.nnz <= self.params["store_result_max_nnz"]:
            arrays.update(indices=result.indices, data=result.data)
        return arrays

    def summary(self):
        stats = self.stats_all
        if not stats:
            return {}
        out = {
            "products": self.total_products,
            "nnz_c": sum(int(s.get("nnz_c", 0)) for s in stats),
            "n_chunks_max": max(int(s.get("n_chunks", 1)) for s in stats),
            "chunked": bool(any(int(s.get("n_chunks", 1)) > 1 for s in stats)),
            "chunked_for_memory": bool(any(s.get("chunked_for_memory", False) for s in stats)),
            "b_operand": self.params["b"],
            "keep_distributed": bool(self.params["keep_distributed"]),
            "collected": self.collected or "",
        }
        out.update(self._partition_summary())
        if self.collected == "checksums":
            out["sampled_rows"] = len(self.result_full["sample_rows"])
        if "peak_device_bytes" in stats[0]:
            ours = max(int(s["peak_device_bytes"]) for s in stats)
            out["peak_device_bytes"] = ours
            out["peak_device_bytes_in_use"] = max(int(s["peak_device_bytes_in_use"])
                                                  for s in stats)
            out["symbolic_global_rows"] = sum(int(s["symbolic_global_rows"]) for s in stats)
            out["numeric_global_rows"] = sum(int(s["numeric_global_rows"]) for s in stats)
            out["symbolic_dense_rows"] = sum(int(s.get("symbolic_dense_rows", 0)) for s in stats)
            out["numeric_dense_rows"] = sum(int(s.get("numeric_dense_rows", 0)) for s in stats)
            out["team_lanes"] = int(stats[0].get("team_lanes", 32))
            out["balanced_products"] = bool(stats[0].get("balanced_products", False))
            out["window_search"] = bool(stats[0].get("window_search", False))
            out["bounded_output"] = bool(stats[0].get("bounded_output", False))
            out["symbolic_bin_rows_rank0"] = stats[0].get("symbolic_bin_rows", [])
            out["numeric_bin_rows_rank0"] = stats[0].get("numeric_bin_rows", [])
            peer = self.peer_peak.get("cusparse")
            if peer:
                out["peer_cusparse_peak_device_bytes"] = int(peer)
                out["memory_ratio_vs_cusparse"] = ours / peer
        return out

    def _work_stats(self):
        """This rank's share of the work: intermediate products and :func:`row_work`."""
        local = self.local
        return {"products": int(local.products.sum()),
                "work": int(row_work(local.products, local.b.ncols).sum())}

    def _partition_summary(self):
        """Root attributes of the split: every rank's flops and work, their imbalance (max /
        mean), and what ``auto`` weighed."""
        products = [int(s["products"]) for s in self.stats_all]
        work = [int(s["work"]) for s in self.stats_all]
        out = {"partition_rank_flops": ",".join(str(2 * p) for p in products),
               "partition_flops_imbalance": work_imbalance(products),
               "partition_work_imbalance": work_imbalance(work),
               "partition_auto": bool(self.auto)}
        if self.split is not None:
            out["partition_heavy_rows"] = int(self.split.heavy_rows)
            if self.split.held_imbalance is not None:  # the read layout's, as auto weighed it
                out["partition_read_work_imbalance"] = float(self.split.held_imbalance)
        return out

    def rank_info(self):
        # Peak device bytes come from the engine's arena (engine_stats), as for every operation.
        stats = self.engine.stats
        work = self._work_stats()
        return {"n_rows": int(self.local.a.nrows), "nnz": int(self.local.a.nnz),
                "products": work["products"], "flops": 2 * work["products"],
                "work": work["work"], "nnz_c": int(stats.get("nnz_c", 0)),
                "n_chunks": int(stats.get("n_chunks", 1))}

