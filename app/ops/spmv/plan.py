"""SpMV's set-up plan of one rank (:class:`SpmvPlan`): its share of x, where its entries go (row
blocks, or the checkerboard's grid), their split into the local block (the columns whose x
entries the rank owns) and the compressed ghost block (the others), the exchange of x (the
point-to-point halo or an all-gather; in rounds or not), the blocks' formats and values, the
degree renumbering and the layout the engines take (:class:`~.local.SpmvLocal`). Every rank
plans together: the global figures that choose kernels and exchanges come from one all-reduce,
so all take the same. :class:`~.op.SpMV` makes the plan in its setup (phase ``plan``, its steps
in ``plan_*_seconds``) and runs the products with the exchanges planned here. Design notes:
docs/ops/spmv.md.
"""
from dataclasses import replace

import numpy as np

from ...arrays import inverse_permutation, materialized
from ...distmatrix import (Checkerboard, fold_block, ghost_columns, local_positions,
                           locate_entries, merge_blocks, processor_grid, renumber_columns,
                           split_blocks, split_column_ranges, split_rows, x_owners)
from ...formats import default_sigma, row_length_census, uniform_value
from ...parallel import AllReduce, HaloExchange, RowAllGather, all_gather_concatenated
from .. import make_vector
from .local import SpmvLocal, reorder_local, threads_per_row, use_order


#: the all-gather of x is chosen (``exchange: auto``) when it moves at most this many times the
#: entries the point-to-point halo moves: the two move the same way (NCCL sends and receives),
#: and the all-gather saves only the halo's packing pass
ALL_GATHER_MAX_RATIO = 1.125

#: ranks from which ``partition.strategy: auto`` weighs the checkerboard against the row blocks
#: (and takes it where its expand and fold move fewer entries per product). Below, on one node:
#: R-MAT 23 on a 2 x 2 grid would move 15% fewer entries (6.23M against 7.29M per product, all
#: ranks, H200 host), but in two dependent steps where the row blocks' halo is one, and
#: weighing and moving the entries took 1.7 and 2.7 s of set-up at 4 ranks (1.1 s less since
#: the move's passes run on threads; the row blocks' whole 4-GPU run: 7.2 ms of products per
#: repeat); the grid's gain grows with the ranks (R-MAT 18: 20% fewer entries at 16 ranks, 40%
#: at 64; ``jobs/spmv_2d_volume.py``).
CHECKERBOARD_MIN_RANKS = 16

#: ghost rows longer than this (entries) make ``ghost_format: null`` take CSR5 for the ghost
#: block. CSR5's load balance pays for its fixed cost (a second kernel that fixes the tiles'
#: carries) only where rows are uneven: 2xH200, the ghost block of a 27-pt stencil (25,600 rows of
#: 9 entries a rank at 2 ranks) took 9.1 + 4.4 us a product in CSR5 (ncu), most of what a second
#: rank lost; R-MAT 23's (hubs of thousands of entries) 19 ms a repeat in CSR-vector against 10
#: in CSR5.
LONG_GHOST_ROW = 256

#: block entries from which a GPU run's degree renumbering works a block on its GPU
#: (:class:`~hisparse.gpu.RowsOnDevice`) rather than on the host's threads. Measured at R-MAT
#: 23's 131M entries (0.42-0.49 s on the GPU against 1.15-1.20 s on the 2xH200 host's threads,
#: copies included); the threshold itself is where the host's pass takes tens of milliseconds,
#: about the GPU path's fixed costs (not measured there)
DEVICE_RENUMBER_MIN_NNZ = 1 << 22


def _with_values(block):
    """``block`` with its values as an array where they were one value repeated
    (:func:`~hisparse.arrays.repeated`, the unit values of a graph made on the GPU), for the
    steps that send or keep the values themselves."""
    data = materialized(block.data)
    return block if data is block.data else replace(block, data=data)


def choose_exchange(requested, size, n_global, ghosts_total):
    """``none`` (one rank), ``point_to_point`` or ``all_gather`` for a run whose ranks receive
    ``ghosts_total`` ghost entries of x in all per product point to point, where an all-gather
    would bring each rank all the others' entries ((size - 1) n_global in all); ``auto`` takes
    the all-gather only where it moves at most :data:`ALL_GATHER_MAX_RATIO` times as much."""
    if size == 1:
        return "none"
    if requested != "auto":
        return requested
    gathered = (size - 1) * int(n_global)
    return ("all_gather" if gathered <= ALL_GATHER_MAX_RATIO * int(ghosts_total)
            else "point_to_point")


def ghost_format(requested, local_format, long_ghost_rows):
    """The ghost block's kernel: ``requested`` when given, else CSR5 where the local block's
    format is CSR5 and ``long_ghost_rows`` (all ranks) of the ghost rows are longer than
    :data:`LONG_GHOST_ROW`, else CSR-vector."""
    if requested is not None:
        return requested
    return "csr5" if local_format == "csr5" and long_ghost_rows > 0 else "csr"


def use_ghost_rounds(requested, ctx, exchange_mode, merged, local_nnz, ghost_nnz):
    """Whether the exchange runs in rounds with the ghost block cut by source rank (the
    ``ghost_rounds`` setting): only on the GPU backend over a device transport, point to point,
    with split blocks; ``auto`` from 3 ranks (at 2 there is one round: nothing to overlap) where
    the ghost entries (all ranks) are at least the local ones."""
    if requested == "never" or exchange_mode != "point_to_point" or merged or ctx.size < 2 or \
            ctx.backend != "gpu" or not ctx.transport.device:
        return False
    return requested == "always" or (ctx.size >= 3 and ghost_nnz >= local_nnz)


def vector_share(spec, size, owned, dtype, seed):
    """``make_vector(spec, size, dtype, seed)[owned]`` without the other entries, where
    ``owned`` is one range of consecutive entries and the spec makes entries one by one:
    ``ones``, or ``random``, whose uniform draws take one 64-bit output of the seeded PCG64
    each, so the range's draws start after advancing the generator by its first entry (every
    rank made all of x, the vector's length, to keep a share of it). ``None`` otherwise (a
    file; scattered entries)."""
    count = len(owned)
    first = int(owned[0]) if count else 0
    if count and (int(owned[-1]) != first + count - 1 or
                  not np.array_equal(owned, np.arange(first, first + count))):
        return None
    if spec == "ones":
        return np.ones(count, dtype=dtype)
    if spec != "random":
        return None
    generator = np.random.default_rng(seed)
    generator.bit_generator.advance(first)
    return generator.uniform(-1.0, 1.0, count).astype(dtype)


def plans_on_device(ctx):
    """Whether this rank's block split and degree renumbering are expected on the GPU
    (:meth:`SpmvPlan._device_rows`): a GPU run with CuPy whose input puts
    :data:`DEVICE_RENUMBER_MIN_NNZ` entries or more on a rank, as far as its header says
    before the read. A block the GPU then declines (device memory) is split and renumbered
    by the host's passes, their compiled code loaded then."""
    if ctx.backend != "gpu":
        return False
    from ...estimate import input_header
    from ...gpu import optional_cupy
    header = input_header(ctx.config)
    return (header is not None and header.part_nnz(ctx.size) >= DEVICE_RENUMBER_MIN_NNZ
            and optional_cupy("the rows' split and renumbering on the GPU") is not None)


class SpmvPlan:
    """One rank's set-up plan, made by every rank together: :meth:`own_x` (where the ranks read
    their own rows), then :meth:`make`, which returns the rank's :class:`SpmvLocal` and leaves
    here what the operation runs and records: the exchange of x (``halo``, point to point, or
    ``gather_x``, the all-gather; ``exchange_mode``, ``exchange_volumes``, ``rounds``), the
    checkerboard's ``board`` and ``fold_halo`` (``None``: row blocks), ``layout_volumes``,
    ``strategy`` (``checkerboard`` where ``auto`` took the grid), ``row_order`` (the degree
    renumbering's), ``mean_row_length``, ``rows_nnz``, ``split_nnz`` and ``device_rows``.

    Parameters
    ----------
    ctx : RunContext
        The run's context (its communicator, transport, backend and config).
    params : dict
        The operation's ``operation.params``.
    strategy : str
        The operation's partition strategy.
    plan_steps : StepClock
        Marks the plan's steps (``plan_*_seconds``).
    split_loader : optional
        The thread loading the block split's compiled passes (``SpMV.before_read``).
    """

    #: the exchange's rounds (send to, receive from), when it runs in rounds (:meth:`make`)
    rounds = ()
    #: the checkerboard's grid and fold (:meth:`_place_entries`; ``None``: row blocks), and the
    #: entries per product each layout would move where ``auto`` weighed them
    board = fold_halo = None
    layout_volumes = {}
    #: the degree renumbering's passes on the GPU (:meth:`_device_rows`), once planned
    device_rows = None
    #: on rank 0 (:meth:`own_x`): the whole x where it was made, else what makes it
    #: (``make_vector``'s arguments)
    x_global = x_made = None

    def __init__(self, ctx, params, strategy, plan_steps, split_loader=None):
        self.ctx, self.params, self.strategy = ctx, params, strategy
        self.plan_steps, self.split_loader = plan_steps, split_loader

    def own_x(self, part, problem):
        """``owned`` and ``x`` of this rank when every rank read its own rows: the x entries it
        owns (:func:`x_owners`; the other ranks' rows are not needed for either rule), cut from
        the vector every rank makes from the same spec and seed (no broadcast)."""
        ctx = self.ctx
        if part["nrows"] == part["ncols"]:
            owned = np.asarray(part["rows"], dtype=np.int64)
        else:
            owned = x_owners([None] * ctx.size, part["nrows"], part["ncols"])[ctx.rank]
        made = (self.params["x"], part["ncols"], problem.value_dtype, ctx.config["run.seed"])
        share = vector_share(made[0], made[1], owned, *made[2:])
        if share is not None:  # only its own entries; rank 0 makes all of x when asked
            if ctx.is_root:
                self.x_made = made
            return {"owned": owned, "x": share}
        x = make_vector(*made)
        if ctx.is_root:
            self.x_global = x  # the reference and the peers' x
        return {"owned": owned, "x": x[owned]}

    def make(self, rows, part, reuse=False):
        """Place this rank's entries (row blocks, or the checkerboard's grid), split them into
        local and ghost blocks, choose and plan the exchange of x (the point-to-point halo, or
        an all-gather), renumber by degree, and merge the blocks when asked. ``reuse``: the
        entries' arrays are this operation's alone (the split may overwrite them)."""
        ctx, params = self.ctx, self.params
        n_global = part["ncols"]
        owned = np.asarray(part["owned"], dtype=np.int64)
        n_rows = len(part["rows"])
        position = local_positions(owned, n_global)
        rows, located, ghosts = self._place_entries(rows, part, position)
        # (before the split, which may make the local block in these rows' arrays)
        census = row_length_census(rows.indptr) if params["format"] == "csr5" \
            else np.zeros(0, np.int64)
        device_rows = self._device_rows()
        if located is None:
            local, ghost, ghost_rows, ghosts = split_rows(rows, position, len(owned), reuse,
                                                          loading=self.split_loader,
                                                          device=device_rows)
        else:  # the placements were weighed over these entries' locations
            local, ghost, ghost_rows = split_blocks(rows, position, len(owned), ghosts, located)
        self.plan_steps.mark("split")
        # Global figures, so that every rank compiles the same kernels (CSR5's sigma follows
        # the census of A's row lengths or its mean row length, the ghost kernel's the mean
        # ghost row length) and takes the same exchange.
        long_ghost_rows = int(np.count_nonzero(ghost.row_lengths() > LONG_GHOST_ROW))
        totals = AllReduce(ctx.transport)(np.concatenate([
            np.array([rows.nnz, n_rows, ghost.nnz, ghost.nrows, len(ghosts), long_ghost_rows],
                     np.int64), census]))
        self.plan_steps.mark("totals")  # mostly the wait for the slowest rank's split
        self.mean_row_length = float(totals[0]) / max(int(totals[1]), 1)
        mean_ghost_row = float(totals[2]) / max(int(totals[3]), 1)
        self.exchange_mode = choose_exchange(params["exchange"], ctx.size, n_global,
                                             int(totals[4]))
        self.exchange_volumes = {"point_to_point": int(totals[4]),
                                 "all_gather": (ctx.size - 1) * int(n_global)}
        by_degree = params["reorder"] == "degree"
        self.halo = self.gather_x = None
        send_index = receive_names = None
        if self.exchange_mode == "point_to_point":
            ghost, receive_names = self._plan_halo(owned, ghost, ghosts, n_global, by_degree,
                                                   device_rows)
            send_index = self.halo.send_index.astype(local.indices.dtype)
        self.plan_steps.mark("exchange")
        sigma = ghost_sigma = None
        if params["format"] == "csr5":
            sigma = params["sigma"] or default_sigma(self.mean_row_length, totals[6:])
        if ghost_format(params["ghost_format"], params["format"], int(totals[5])) == "csr5":
            ghost_sigma = params["sigma"] or default_sigma(mean_ghost_row)
        self.rows_nnz = rows.nnz
        fold = fold_rows = None
        if self.fold_halo is not None:
            fold, fold_rows = fold_block(self.fold_halo.send_index, n_rows, local.data.dtype,
                                         local.indices.dtype)
        uniform = self._uniform_value(local.data, ghost.data) \
            if params["uniform_values"] else None
        if uniform is None:  # the engines keep the values arrays
            local, ghost = _with_values(local), _with_values(ghost)
        planned = SpmvLocal(local, part["x"], ghost, ghost_rows, send_index, sigma,
                            threads_per_row(mean_ghost_row),
                            chained=part["nrows"] == part["ncols"],
                            uniform=uniform,
                            ghost_sigma=ghost_sigma,
                            x_ids=owned if self.exchange_mode == "all_gather" else None,
                            n_rows=n_rows, fold=fold, fold_rows=fold_rows)
        self.plan_steps.mark("uniform")
        if device_rows is not None:  # with uniform values only the columns go and come back
            device_rows.same_values = uniform is not None
        planned, self.row_order = reorder_local(planned, by_degree, device_rows, receive_names)
        self.plan_steps.mark("reorder")
        self.split_nnz = (planned.matrix.nnz, planned.ghost.nnz, planned.ghost.nrows)
        planned = self._engine_layout(planned, ghosts, n_global, int(totals[0] - totals[2]),
                                      int(totals[2]))
        self.plan_steps.mark("layout")
        return planned

    def _engine_layout(self, planned, ghosts, n_global, local_nnz, ghost_nnz):
        """``planned`` as the engines take it: the ghost block cut by source rank where the
        exchange runs in rounds (``self.rounds``: each round's (send to, receive from)), the
        all-gather's layout of x, or one merged block; ``local_nnz`` and ``ghost_nnz``: all
        ranks' entries of each block, which weigh the rounds."""
        ctx, params = self.ctx, self.params
        self.rounds = []
        if use_ghost_rounds(params["ghost_rounds"], ctx, self.exchange_mode,
                            params["blocks"] == "merged", local_nnz, ghost_nnz):
            # Ghost columns are in receive order: each source rank's entries a range of them.
            bounds = np.append(self.halo.recv_displs, self.halo.n_ghosts)
            planned = replace(planned, ghost_parts=split_column_ranges(
                planned.ghost, planned.ghost_rows, bounds))
            rank, size = ctx.rank, ctx.size
            self.rounds = [((rank + k) % size, (rank - k) % size) for k in range(1, size)]
        if self.exchange_mode == "all_gather":
            planned = self._plan_all_gather(planned, ghosts, n_global)
        if params["blocks"] == "merged" and ctx.size > 1:
            merged = merge_blocks(planned.matrix, planned.ghost, planned.ghost_rows,
                                  planned.x_offset, planned.ghost_offset, planned.x_length)
            planned = replace(planned, matrix=merged, ghost=None, ghost_rows=None, merged=True)
        return planned

    def _plan_halo(self, owned, ghost, ghosts, n_global, by_degree, device_rows):
        """Plan the point-to-point exchange of this rank's ``ghosts`` (``self.halo``), each
        owner's entries most used first where the rows are renumbered by degree (denser
        gathers), and return ``(ghost, receive_names)``: the ghost block with its columns in
        the exchange's receive order, or, where the degree renumbering will move its rows, the
        block as it is and the new name of each column (``receive_names``, ``None`` where the
        receive order is the block's), which that pass applies on the way."""
        wanted, keep = np.arange(len(ghosts)), False  # positions in ghosts
        if by_degree and ghost.nnz:
            wanted, _ = use_order(ghost.indices, len(ghosts), device_rows)
            keep = True
        self.plan_steps.mark("exchange_order")
        self.halo = HaloExchange(self.ctx.transport, owned, ghosts[wanted], n_global,
                                 keep_order=keep)
        self.plan_steps.mark("exchange_halo")
        # the ghosts' places in receive order, from the exchange's grouping (no search)
        received = wanted[self.halo.receive_order]
        if np.array_equal(received, np.arange(len(ghosts))):
            return ghost, None
        receive_names = inverse_permutation(received)
        if by_degree:
            return ghost, receive_names
        return renumber_columns(ghost, receive_names, len(ghosts)), None

    def _place_entries(self, rows, part, position):
        """``(rows, located, ghosts)``: the entries this rank multiplies, over the rows of y it
        holds partial sums of, with :func:`locate_entries` of them and their ghost columns where
        weighing the placements made them (else ``None``: :func:`split_rows` finds them). Row
        blocks: its own rows as read. Checkerboard (``partition.strategy``; under ``auto`` from
        :data:`CHECKERBOARD_MIN_RANKS` ranks, where its expand and fold move fewer entries per
        product, all ranks, than the row blocks' halo): every rank's entries moved to their
        grid places (:class:`~hisparse.distmatrix.Checkerboard`), and the fold of the foreign
        rows' partial sums planned (``fold_halo``)."""
        ctx = self.ctx
        self.board = self.fold_halo = None
        self.layout_volumes = {}
        board = self._checkerboard(part)
        if board is None:
            return rows, None, None
        if self.strategy != "checkerboard":
            located = locate_entries(rows, position)
            ghosts = ghost_columns(rows, position, located)
            remote = located[1] if located[1] is not None else np.zeros(0, np.int64)
            expand, fold = board.volumes(rows, ghosts, remote)
            volumes = AllReduce(ctx.transport)(np.array([len(ghosts), expand + fold], np.int64))
            self.layout_volumes = {"row_blocks": int(volumes[0]),
                                   "checkerboard": int(volumes[1])}
            self.plan_steps.mark("weigh")
            if volumes[1] >= volumes[0]:
                return rows, located, ghosts
            self.strategy = "checkerboard"
        rows, foreign = board.redistribute(_with_values(rows))  # (the values travel)
        self.fold_halo = HaloExchange(ctx.transport, part["rows"], foreign, part["nrows"])
        # foreign rows ascend and so do their owners' ranges: they arrive in that order
        if not np.array_equal(self.fold_halo.ghosts, foreign):
            raise RuntimeError("spmv checkerboard: the fold does not receive the foreign rows "
                               "in their order")
        self.board = board
        self.plan_steps.mark("checkerboard")
        return rows, None, None

    def _checkerboard(self, part):
        """The grid placement this run considers (:class:`Checkerboard`), or ``None``: the
        row blocks (one rank; ``auto`` below :data:`CHECKERBOARD_MIN_RANKS` ranks or on a grid
        of one row; another strategy)."""
        ctx = self.ctx
        wanted = self.strategy == "checkerboard"
        considered = ctx.config["partition.strategy"] == "auto" and \
            ctx.size >= CHECKERBOARD_MIN_RANKS and processor_grid(ctx.size)[0] >= 2
        if ctx.size == 1 or not (wanted or considered):
            return None
        return Checkerboard(ctx.comm, part["rows"], part["owned"])

    def _plan_all_gather(self, planned, ghosts, n_global):
        """The all-gather's layout: x_all holds every rank's entries in rank order, each in its
        rank's local order (after its renumbering), so the ghost block's columns become
        positions in x_all; plans the in-place all-gather of x_all."""
        comm = self.ctx.comm
        # x_all's ids, laid out as x_all (int32 where they fit)
        ids, counts = all_gather_concatenated(comm, planned.x_ids, n_global)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        # each entry's place in x_all is where its id sits in ids (they cover all of x)
        place = np.empty(int(n_global), dtype=ids.dtype)
        place[ids] = np.arange(len(ids), dtype=ids.dtype)
        del ids
        ghost = renumber_columns(planned.ghost, place[ghosts], n_global)
        self.gather_x = RowAllGather(self.ctx.transport, int(offsets[comm.rank]),
                                     int(counts[comm.rank]))
        return replace(planned, ghost=ghost, x_offset=int(offsets[comm.rank]), ghost_offset=0,
                       x_length=int(n_global))

    def _device_rows(self):
        """The GPU's passes for :func:`split_rows` and :func:`reorder_local` in a GPU run (for
        blocks of :data:`DEVICE_RENUMBER_MIN_NNZ` entries or more), or ``None``: the host's."""
        if self.ctx.backend != "gpu":
            return None
        from ...gpu import RowsOnDevice
        self.device_rows = RowsOnDevice(min_entries=DEVICE_RENUMBER_MIN_NNZ)
        return self.device_rows

    def _uniform_value(self, *blocks):
        """The one value every nonzero of every rank's blocks (local and ghost) holds, as a
        1-element array, or ``None``: the same answer on every rank, so that all compile the
        same kernels. One all-reduce of (smallest value, -largest value, -[values differ])."""
        dtype = blocks[0].dtype
        filled = [data for data in blocks if len(data)]
        values = [uniform_value(data) for data in filled]
        if not filled:  # no nonzeros: no say
            bounds = np.array([np.inf, np.inf, 0.0])
        elif any(value is None for value in values):  # values that differ (or are not finite)
            bounds = np.array([0.0, 0.0, -1.0])
        else:
            own = [float(value[0]) for value in values]
            bounds = np.array([min(own), -max(own), 0.0])
        low, negated_high, differ = AllReduce(self.ctx.transport, op="min")(bounds)
        if differ or low != -negated_high or not np.isfinite(low):
            return None
        return np.array([low], dtype=dtype)

