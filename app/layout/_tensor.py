"""Tensors read by slices (:class:`TensorSliceLayout`) and cut by the N-1-dimensional grid
partition (:class:`TensorGridLayout`): every rank reads (or generates) a slice of the nonzeros,
the grid is cut collectively, and the nonzeros move to their owners in one all-to-all.

The rank-0 path (:func:`~hisparse.io.read_tensor` or the generator on rank 0, then the
operation's ``partition``) holds the whole tensor on rank 0 and takes as long at 4 ranks as at 1.
Here, *collectively*:

1. **Read** (driver phase ``read``): rank r reads nonzeros ``r nnz / p .. (r+1) nnz / p`` of
   ``indices``/``values`` by hyperslab (:func:`read_tensor_slice`), checking them as
   :meth:`~hisparse.formats.COOTensor.validate` does (messages name the file and the global
   nonzero); or makes the fibers ``r F / p .. (r+1) F / p`` of a random tensor
   (:func:`generate_tensor_slice`, with CuPy on the rank's GPU when the operation asks for it:
   the nonzeros are then born on the device).
2. **Partition** (:func:`plan_tensor_grid`): every rank counts its nonzeros per index of each
   mode other than the fiber mode, one all-reduce sums the counts, every rank derives the same
   candidate grids and cuts from them, a second all-reduce sums the per-block counts of every
   candidate, and every rank picks the same grid -- exactly what
   :func:`~hisparse.partition.partition_tensor` picks from the whole tensor.
3. **Distribute** (:func:`route_nonzeros`): one all-to-all of host arrays moves each nonzero to
   the owner of its block (coordinates as int32 in transit when the shape allows). A rank's own
   nonzeros never leave it (on the GPU they stay on the device). A device transport (an
   all-to-all of device buffers) would skip the two host copies of the moved nonzeros and the
   pinned host memory they occupy; the plan (counts per destination, one exchange) is the same.
   A generated tensor whose fibers are the grid's moves no nonzero (:func:`make_own_fibers`):
   a fiber's nonzeros and coordinates depend on its number alone, so the ranks exchange the
   numbers of the fibers they hold (8 bytes a fiber) and each makes the fibers it owns.
4. A file's nonzeros are then sorted row-major on their owner and duplicates merged or rejected,
   as ``read_tensor`` does for the whole tensor (copies of one coordinate share an owner, and
   arrive in file order, so sums are the same bits). When merging removed any, the grid is cut
   again from the merged counts and the nonzeros routed once more (the rank-0 path partitions
   the merged tensor); a file without duplicates never pays it. Generated tensors have none.

What each rank ends with equals what the rank-0 path's partition gives it, array for array
(tests/test_tensor_input.py checks it at 1, 2 and 4 ranks).

Steps 3 and 4 take any router (``part_of``), so an operation with another partition uses them
too: CP-ALS routes the nonzeros to the row blocks of every mode (:meth:`TensorProblem.settle`,
:func:`route_nonzeros`; tests/test_cpals_input.py).
"""
from dataclasses import dataclass

import numpy as np

from .. import generators
from ..arrays import array_module, host_array, is_cupy_array
from ..errors import InputError
from ..formats import sorted_nonzeros
from ..io import open_coo_group, read_coo_range
from ..parallel import (AllReduce, all_call, alltoall_arrays, alltoall_concatenated,
                        device_alltoallv)
from ..partition import (TENSOR_STRATEGIES, best_grid, candidate_counts, grid_candidates,
                         group_by_owner, mode_histograms)
from ._base import (Layout, PartProblem, check_cast, check_input_kind, input_label, read_problem,
                    run_value_dtype)
from ._rows import share_of


@dataclass
class TensorSlice:
    """Nonzeros this rank read or made, before they move to their owners.

    Attributes
    ----------
    indices : ndarray, shape (k, N), int64
        NumPy, or CuPy when made on the GPU.
    values : ndarray, shape (k,)
    shape : tuple of int
    nnz : int
        The whole input's nonzeros (before duplicates are merged, for a file).
    label : str
        The input as messages name it (``path:group``).
    positions : ndarray of int64 or None
        Each nonzero's position in the file (to name a duplicate in ``reject`` mode).
    distinct : bool
        Whether coordinates are known to be distinct and in their final order (generated).
    source : hisparse.generators.TensorSource or None
        The generator that made the slice (its fibers ``fibers``, a range of fiber numbers),
        for :meth:`TensorProblem.take_part` to make a rank's own fibers instead of moving them.
    """

    indices: object
    values: object
    shape: tuple
    nnz: int
    label: str = ""
    positions: np.ndarray = None
    distinct: bool = False
    source: object = None
    fibers: range = None


class TensorProblem(PartProblem):
    """The input as the driver hands it to an operation that reads a tensor by parts
    (a :class:`TensorSliceLayout`), on every rank.

    Holds this rank's :class:`TensorSlice` and what is known of the whole tensor without holding
    it: ``shape``, ``order``, ``nnz`` (after duplicates are merged, once :meth:`take_part` ran),
    ``value_dtype``. Any other attribute (``indices``, ``values``) is the whole
    :class:`~hisparse.formats.COOTensor`, read or generated by ``load`` on first use: rank 0's
    verification and peers, after the timed repeats.
    """

    def __init__(self, piece, load=None, value_dtype=np.float64, duplicates="sum",
                 precision="fp64", label=""):
        super().__init__(load)
        self._piece = piece
        self.shape = tuple(int(s) for s in piece.shape)
        self.nnz = int(piece.nnz)
        self.value_dtype = np.dtype(value_dtype)
        self.duplicates, self.precision, self.label = duplicates, precision, label
        self.grid = None

    @property
    def order(self):
        return len(self.shape)

    def plan(self, comm, mode, strategy):
        """Cut the grid from every rank's nonzeros (:func:`plan_tensor_grid`). *Collective.*"""
        self.grid = plan_tensor_grid(comm, self._piece.indices, self.shape, mode, strategy)
        return self.grid

    def take_part(self, comm):
        """This rank's nonzeros under the grid of :meth:`plan`, moved to it, merged and cast to
        the run's value dtype: ``{"indices", "values", "mode", "shape", "grid"}`` as
        ``partition()`` gives them. The problem lets go of its slice. *Collective.*

        The nonzeros go through host MPI even on an NCCL transport (SpTV runs on MPI under
        ``parallel.transport: auto`` anyway; NCCL only when asked for): on 2×H200 the NCCL route
        made SpTV's ``distribute`` 430 -> 1206 ms, time to solution 1.07 -> 1.97 s -- NCCL
        connects a pair of ranks at their first send (~1 s), which SpTV's repeats never pay
        (CP-ALS's do: it routes on the device, :meth:`settle` with its transport).

        A generated tensor whose fibers are the grid's (the generator's fiber mode is the grid's
        mode) moves no nonzero: the ranks exchange the numbers of the fibers each owns, and
        each makes its own fibers (:func:`make_own_fibers`)."""
        if comm.size > 1 and self._piece is not None and self._piece.source is not None and \
                self._piece.source.mode == self.grid.mode:
            piece, self._piece = self._piece, None
            indices, values = make_own_fibers(comm, self.grid, piece.source, piece.fibers,
                                              array_module(piece.indices))
            del piece
        else:
            nonzeros, distinct = self.take_nonzeros()
            mode, strategy = self.grid.mode, self.grid.strategy
            indices, values, self.grid = self.settle(
                comm, nonzeros, distinct, self.grid,
                lambda merged: plan_tensor_grid(comm, merged, self.shape, mode, strategy))
        values = self.cast(comm, values, indices)
        return {"indices": indices, "values": values, "mode": self.grid.mode,
                "shape": list(self.shape), "grid": list(self.grid.grid)}

    def take_nonzeros(self):
        """This rank's slice as a dict of arrays (``indices``, ``values``, and ``positions``
        when kept for messages) and whether its coordinates are distinct and in their final
        order (generated). The problem lets go of the slice, so that routing the dict frees the
        arrays as it splits them. For an operation that moves the nonzeros its own way (CP-ALS:
        to the row blocks of every mode); :meth:`take_part` uses it too."""
        if self._piece is None:
            raise RuntimeError("the tensor part was already taken")
        piece, self._piece = self._piece, None
        nonzeros = {"indices": piece.indices, "values": piece.values}
        if piece.positions is not None:
            nonzeros["positions"] = piece.positions
        return nonzeros, piece.distinct

    def settle(self, comm, nonzeros, distinct, router, recut, transport=None):
        """Move ``nonzeros`` (a dict as :meth:`take_nonzeros` gives, emptied here) to their
        owners under ``router`` (anything with ``part_of(indices)`` -> the owning rank of each
        nonzero, e.g. a grid partition) and, unless they are ``distinct``, sort them row-major
        on their owner and merge or reject duplicates, as ``read_tensor`` does for the whole
        tensor (copies of one coordinate share an owner, and arrive in file order, so sums are
        the same bits). When merging removed any, ``recut(merged indices)`` (*collective*) gives
        the router of the merged tensor, as the rank-0 path cuts the merged tensor, and the
        nonzeros are routed once more and sorted again; a file without duplicates never pays
        it. Sets :attr:`nnz` to the merged count. ``transport``: :func:`route_nonzeros`'s.
        *Collective.*

        Returns
        -------
        indices, values, router
            This rank's nonzeros (values not yet cast) and the router they went by.
        """
        routed = route_nonzeros(comm, router, nonzeros, transport)
        nonzeros.clear()  # one rank: routing returns the same arrays; the caller keeps none
        nonzeros = routed
        del routed
        if distinct:
            return nonzeros["indices"], nonzeros["values"], router
        indices, values = all_call(comm, merge_duplicates, nonzeros.pop("indices"),
                                      nonzeros.pop("values"), self.shape, self.duplicates,
                                      nonzeros.pop("positions", None), self.label)
        nnz = AllReduce(comm, "sum").scalar(len(values))
        if nnz != self.nnz:
            router = recut(indices)
            if comm.size > 1:  # one rank: routing moves nothing, and they are sorted already
                moved = route_nonzeros(comm, router, {"indices": indices, "values": values},
                                       transport)
                indices, values = merge_duplicates(moved["indices"], moved["values"],
                                                   self.shape)
            self.nnz = nnz
        return indices, values, router

    def cast(self, comm, values, indices):
        """``values`` in the run's value dtype (:func:`cast_values`; an overflow on any rank
        stops every rank naming the nonzero). *Collective.*"""
        return all_call(comm, cast_values, values, indices, self.value_dtype, self.label,
                        self.precision)

    @property
    def tensor(self):
        """The whole tensor (loaded on first use)."""
        return self.whole()


# -- the grid, cut collectively -------------------------------------------------------------------

def plan_tensor_grid(comm, indices, shape, mode, strategy):
    """The grid partition of the whole tensor, from each rank's ``indices`` (any slice of the
    nonzeros; NumPy or CuPy). *Collective*; every rank returns the same
    ``TensorGridPartition`` (:func:`~hisparse.partition.best_grid`), equal to
    ``partition_tensor(whole indices, shape, mode, comm.size, strategy)``.

    Raises
    ------
    CollectiveError
        On every rank, when no grid fits (more ranks than the other modes' sizes allow).
    """
    shape = tuple(int(s) for s in shape)
    histograms = None
    if strategy == "grid_nnz" and comm.size > 1:
        histograms = AllReduce(comm, "sum")(np.ascontiguousarray(
            mode_histograms(indices, shape, mode)))
    candidates = all_call(comm, grid_candidates, shape, mode, comm.size, strategy, histograms)
    counts = AllReduce(comm, "sum")(candidate_counts(indices, shape, mode, candidates))
    return best_grid(shape, mode, strategy, candidates, counts)


# -- moving nonzeros to their owners --------------------------------------------------------------

def route_nonzeros(comm, grid, nonzeros, transport=None):
    """Move every nonzero to the rank owning its block of ``grid``, in one all-to-all.
    *Collective.* ``grid`` is anything whose ``part_of(indices)`` gives each nonzero's owner
    (the grid partition :func:`~hisparse.partition.best_grid` picks, or CP-ALS's row blocks of
    one mode).

    ``nonzeros`` is a dict of ``indices`` (k, N) int, ``values`` (k,) and optionally
    ``positions`` (k,) int64 (host), emptied here so that the arrays are freed as soon as they
    are split (the caller keeps no copy). What a rank keeps stays where it is (a CuPy array stays
    on the device); what it sends goes through host memory, coordinates as int32 when they fit
    -- or, with a device ``transport`` and every array on the GPU, GPU to GPU
    (:func:`~hisparse.parallel.device_alltoallv`). Received nonzeros come in source rank order,
    each source's in its own order: ranks holding consecutive slices of the input end with their
    nonzeros in input order, as a stable partition of the whole input orders them.

    Returns
    -------
    dict
        This rank's nonzeros, the same keys, in the array module of ``indices`` (int64
        coordinates).
    """
    if comm.size == 1:
        return dict(nonzeros)
    if _routes_on_device(transport, nonzeros):
        return _route_on_device(transport, grid, nonzeros)
    indices = nonzeros.pop("indices")
    xp = array_module(indices)
    owner = grid.part_of(indices)
    order, cuts = group_by_owner(owner, comm.size)
    del owner
    largest = int(indices.max()) if len(indices) else 0
    transit = {"indices": np.int32 if largest <= np.iinfo(np.int32).max else np.int64}
    pieces = [{} for _ in range(comm.size)]
    own = {}
    for name, array in [("indices", indices)] + [(k, nonzeros.pop(k)) for k in list(nonzeros)]:
        on_host = name == "positions"  # kept on the host (only messages use them)
        for dest in range(comm.size):
            take = order[int(cuts[dest]):int(cuts[dest + 1])]
            chosen = array[host_array(take) if on_host else take]
            if dest == comm.rank:
                own[name] = chosen
            else:
                pieces[dest][name] = host_array(chosen.astype(transit.get(name, chosen.dtype),
                                                              copy=False))
        del array, chosen
    del indices, order
    received = alltoall_arrays(comm, pieces)
    del pieces
    # Filled in place, each received piece let go once copied (no second whole copy).
    lengths = [len(own["values"]) if source == comm.rank else len(got["values"])
               for source, got in enumerate(received)]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    out = {}
    for name, mine in own.items():
        module = np if name == "positions" else xp
        out[name] = module.empty((int(starts[-1]),) + mine.shape[1:], dtype=mine.dtype)
    for source in range(comm.size):
        got = own if source == comm.rank else received[source]
        lo, hi = int(starts[source]), int(starts[source + 1])
        for name, array in got.items():
            out[name][lo:hi] = array if name == "positions" else xp.asarray(array)
        received[source] = None
    return out


def make_own_fibers(comm, grid, source, fibers, xp=np):
    """This rank's nonzeros under ``grid`` of the generator ``source``'s tensor, made here:
    the ranks' fiber numbers (this rank holds ``fibers``) are sent to the ranks owning them
    (8 bytes a fiber, where :func:`route_nonzeros` would move every nonzero of it), and each
    rank makes the fibers it receives (:meth:`~hisparse.generators.TensorSource.fibers_of`).
    What :func:`route_nonzeros` gives from the ranks' generated slices, bit for bit and in the
    same order: source rank order, each source's fibers ascending. *Collective.*"""
    ids = xp.arange(fibers.start, fibers.stop, dtype=xp.int64)
    order, cuts = group_by_owner(grid.part_of(source.fiber_coordinates(ids, xp)), comm.size)
    ids = host_array(ids[order])
    del order
    received, _ = alltoall_concatenated(comm, [{"ids": ids[int(cuts[d]):int(cuts[d + 1])]}
                                               for d in range(comm.size)])
    del ids
    return source.fibers_of(xp.asarray(received["ids"]), xp)


def _routes_on_device(transport, nonzeros):
    """Whether :func:`route_nonzeros` moves ``nonzeros`` GPU to GPU: a device transport, every
    array a CuPy array (no host ``positions``) of a type the transport carries."""
    if transport is None or not transport.device:
        return False
    if not all(is_cupy_array(array) for array in nonzeros.values()):
        return False  # a host array among them
    return all(transport.carries(array.dtype) for array in nonzeros.values())


def _route_on_device(transport, grid, nonzeros):
    """:func:`route_nonzeros` GPU to GPU: the owners grouped on the device, the counts
    exchanged through MPI, then each array in one device all-to-all (int64 coordinates: NVLink
    does not need them narrowed). Each array is let go of once its rows are grouped."""
    comm = transport.comm
    order, cuts = group_by_owner(grid.part_of(nonzeros["indices"]), comm.size)
    recv_counts = np.asarray(comm.alltoall(np.diff(cuts).tolist()), dtype=np.int64)
    out = {}
    for name in list(nonzeros):
        grouped = nonzeros.pop(name)[order]
        out[name] = device_alltoallv(transport, grouped, cuts, recv_counts, "nonzero routing")
        del grouped
    return out


# -- sorting and merging a rank's nonzeros --------------------------------------------------------

def merge_duplicates(indices, values, shape, duplicates="sum", positions=None, label="tensor"):
    """:func:`~hisparse.formats._coo.sorted_nonzeros` on the host (device arrays come back first)."""
    return sorted_nonzeros(host_array(indices), host_array(values), shape, duplicates,
                           positions, label)


def cast_values(values, indices, value_dtype, label, precision):
    """``values`` in the run's value dtype; an overflow raises :class:`InputError` naming the
    nonzero's coordinates (as :func:`~hisparse.layout.check_cast` does for the whole input)."""
    xp = array_module(values)
    with np.errstate(over="ignore"):
        cast = values.astype(value_dtype, copy=False)
    if cast.dtype != values.dtype and len(cast) and not bool(xp.isfinite(cast).all()):
        host_values, host_cast = host_array(values), host_array(cast)
        check_cast(host_values, host_cast, label, precision,
                   lambda i: f"coordinates {tuple(int(c) for c in host_array(indices[i]))}")
    return cast


def read_tensor_slice(comm, path, group="/", duplicates="sum"):
    """This rank's contiguous slice of the nonzeros of the COO tensor at ``path:group``.
    *Collective.*

    Raises
    ------
    CollectiveError
        On every rank, when any rank finds the file or its slice malformed (the message names
        the file and, for a bad nonzero, its position).
    """
    coo = all_call(comm, open_coo_group, path, group)
    lo, hi = share_of(coo.nnz, comm.rank, comm.size)
    indices, values = all_call(comm, read_coo_range, coo, lo, hi)
    positions = np.arange(lo, hi, dtype=np.int64) if duplicates == "reject" else None
    return TensorSlice(indices, values, coo.shape, coo.nnz, coo.label, positions,
                       distinct=False)


# -- generating a slice ---------------------------------------------------------------------------

def generate_tensor_slice(comm, spec, xp=np):
    """This rank's fibers of the random tensor a (validated) generator spec describes, made here
    with ``xp`` (CuPy: on this rank's GPU). Together the ranks make exactly
    :func:`~hisparse.generators.random_tensor`'s tensor, whatever their number. *Collective.*"""
    spec = generators.validate_spec(dict(spec))
    source = all_call(comm, _tensor_source, spec)
    lo, hi = share_of(source.nfibers, comm.rank, comm.size)
    indices, values = source.fibers(range(lo, hi), xp)
    if xp is not np:
        xp.cuda.Device().synchronize()  # the read phase ends when the GPU's work does
    nnz = AllReduce(comm, "sum").scalar(int(len(values)))
    return TensorSlice(indices, values, source.shape, nnz,
                       f"input.generate {{kind: {spec['kind']}}}", distinct=True, source=source,
                       fibers=range(lo, hi))


def _tensor_source(spec):
    if generators.spec_kind(spec) != "tensor":
        raise InputError(f"input.generate kind '{spec['kind']}' makes no tensor")
    try:
        return generators.part_source(spec)
    except ValueError as exc:
        raise InputError(str(exc)) from None


# -- the layouts ----------------------------------------------------------------------------------

def _numpy():
    return np


class _TensorSlices(Layout):
    """A COO tensor read by slices: in the ``read`` phase every rank reads a contiguous slice of
    the file's nonzeros by hyperslab, or makes a contiguous range of a random tensor's fibers
    (:func:`read_tensor_parts`, with the array module ``module()`` gives: CuPy makes the
    nonzeros on the rank's GPU). The ``problem`` is a :class:`TensorProblem`: shape, order, nnz
    and value dtype at hand, the whole tensor read or made only when rank 0's verification or a
    peer asks for it."""

    KIND = "tensor"

    def __init__(self, module=_numpy):
        self.module = module

    def load(self, ctx, op):
        self.check(op)
        return read_tensor_parts(ctx.comm, ctx.config, type(op), self.module())

    def describe(self, problem):
        # From the problem's metadata: the whole tensor is not loaded for it.
        return {"problem_kind": "tensor", "tensor_shape": list(problem.shape),
                "global_nnz": problem.nnz, "value_dtype": str(problem.value_dtype)}


class TensorSliceLayout(_TensorSlices):
    """A COO tensor read by slices (see :class:`_TensorSlices`) and moved where the operation's
    own partition wants it by ``distribute(problem)`` (*collective*, returning ``(part,
    shared)``), with the pieces of :class:`TensorProblem` (:meth:`~TensorProblem.take_nonzeros`,
    :meth:`~TensorProblem.settle`, :meth:`~TensorProblem.cast`) and :func:`route_nonzeros`:
    CP-ALS's, to the row blocks of every mode's unfolding."""

    def __init__(self, distribute, module=_numpy):
        super().__init__(module)
        self._distribute = distribute

    def distribute(self, op, problem):
        return self._distribute(problem)


class TensorGridLayout(_TensorSlices):
    """A COO tensor read by slices (see :class:`_TensorSlices`) and cut by the N-1-dimensional
    grid partition (``strategy``: ``grid_nnz``, ``grid_uniform``) of the mode ``mode(problem)``
    names (the mode left uncut; *every rank*, raising :class:`~hisparse.errors.InputError` when
    the tensor does not fit). ``distribute`` cuts the grid from every rank's nonzeros (phase
    ``partition``: two all-reduces, :func:`plan_tensor_grid`), moves them to their owners in one
    all-to-all and merges a file's duplicates there (phase ``distribute``:
    :meth:`TensorProblem.take_part`), and makes the data every rank needs with the operation's
    ``shared_data(part)``. Each rank's part is what the operation's ``partition()`` gives it:
    ``indices``, ``values``, ``mode``, ``shape``, ``grid``."""

    def __init__(self, strategy, mode, module=_numpy):
        if strategy not in TENSOR_STRATEGIES:
            raise ValueError(f"unknown tensor partition strategy {strategy!r} (expected one of "
                             f"{TENSOR_STRATEGIES})")
        super().__init__(module)
        self.strategy, self.mode = strategy, mode

    def distribute(self, op, problem):
        ctx = op.ctx
        with ctx.timer.phase("partition"):
            mode = all_call(ctx.comm, self.mode, problem)
            problem.plan(ctx.comm, mode, self.strategy)
        with ctx.timer.phase("distribute"):
            part = problem.take_part(ctx.comm)
            shared = op.shared_data(part)
        return part, shared


def read_tensor_parts(comm, config, op_cls, xp=np):
    """This rank's slice of the tensor's nonzeros, read or generated here (with ``xp`` = CuPy
    generated on this rank's GPU). *Collective.*

    Returns
    -------
    TensorProblem
        The slice (the operation's ``distribute`` moves it to its owners), and the whole tensor
        on demand (:func:`~hisparse.layout.read_problem`, on the rank that asks: rank 0's
        verification and peers).
    """
    section = config["input"]
    all_call(comm, check_input_kind, config, op_cls)
    if section["generate"] is not None:
        piece = generate_tensor_slice(comm, section["generate"], xp)
    else:
        piece = read_tensor_slice(comm, section["path"], section["group"],
                                  section["duplicates"])
    return TensorProblem(piece, load=lambda: read_problem(config, op_cls),
                         value_dtype=run_value_dtype(config), duplicates=section["duplicates"],
                         precision=config["precision"], label=input_label(config))
