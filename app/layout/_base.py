"""The layout protocol, the whole input on rank 0, and what every layout shares: the input read
whole and cast, the input's label, the check of a cast to the run's precision, and the problem
read by parts."""
import numpy as np

from .. import generators
from ..arrays import repeated_value
from ..context import VALUE_DTYPES
from ..errors import InputError
from ..formats import index_dtype_for
from ..io import input_kind, read_matrix, read_tensor
from ..parallel import all_call, bcast_arrays, root_call, scatter_arrays


class Layout:
    """How a run's input is read and spread over the ranks (PETSc's ``PetscLayout``, Devito's
    ``Distributor``): an operation declares its own (``Operation.layout()``), the driver calls
    :meth:`load` in its ``read`` phase, the operation's ``distribute`` calls :meth:`distribute`,
    and rank 0 records :meth:`describe` in the results file.

    ``KIND`` is the input it needs (``"matrix"`` or ``"tensor"``; None: either); a layout
    declared by an operation of another ``INPUT_KIND`` is a ``TypeError`` at :meth:`load`.
    """

    KIND = None
    #: Every rank reads (or generates) only its own part of the input; False: rank 0 reads all
    #: of it first (what the memory estimate counts on rank 0 alone).
    BY_PARTS = True

    def check(self, op):
        """Raise ``TypeError`` when ``op``'s ``INPUT_KIND`` is not the one this layout reads."""
        if self.KIND is not None and op.INPUT_KIND != self.KIND:
            raise TypeError(f"{type(op).__name__}: a {type(self).__name__} needs INPUT_KIND "
                            f"'{self.KIND}', not '{op.INPUT_KIND}'")

    def load(self, ctx, op):
        """The input as this rank holds it after the ``read`` phase: the ``problem`` the
        operation's ``setup`` gets. *Collective.*"""
        raise NotImplementedError

    def distribute(self, op, problem):
        """``(part, shared)``: this rank's part of ``problem`` and the data every rank gets
        (timed as the phases ``partition`` and ``distribute``). *Collective.*"""
        raise NotImplementedError

    def describe(self, problem):
        """The input's root attributes for the results file (``problem_kind``, its global
        shape, nnz and dtypes), from what rank 0 holds. *Rank 0.*"""
        raise NotImplementedError


class WholeOnRoot(Layout):
    """The whole input read or generated on rank 0 (``None`` on the other ranks), split there by
    the operation's ``partition(problem)`` (a :class:`~hisparse.errors.HisparseError` raised
    there stops every rank with the same message) and scattered: the default layout, for any
    input. ``kind`` is the operation's ``INPUT_KIND`` (what :meth:`describe` finds on rank 0)."""

    BY_PARTS = False

    def __init__(self, kind="matrix"):
        self.kind = kind

    def load(self, ctx, op):
        return root_call(ctx.comm, read_problem, ctx.config, type(op))

    def distribute(self, op, problem):
        ctx = op.ctx
        with ctx.timer.phase("partition"):
            planned = root_call(ctx.comm, op.partition, problem)
        parts, shared = planned if ctx.is_root else (None, None)
        with ctx.timer.phase("distribute"):
            part = scatter_arrays(ctx.comm, parts)
            shared = bcast_arrays(ctx.comm, shared)
        return part, shared

    def describe(self, problem):
        if self.kind == "matrix":
            return {"problem_kind": "matrix", "global_rows": problem.nrows,
                    "global_cols": problem.ncols, "global_nnz": problem.nnz,
                    "index_dtype": str(problem.indices.dtype),
                    "value_dtype": str(problem.data.dtype)}
        return {"problem_kind": "tensor", "tensor_shape": list(problem.shape),
                "global_nnz": problem.nnz, "value_dtype": str(problem.values.dtype)}


class WholeOnEveryRank(WholeOnRoot):
    """The whole input read or generated on every rank, each rank its own copy (split and sent
    as :class:`WholeOnRoot` when the operation asks): for an operation whose ranks each need
    entries from all over the input that only rank 0's analysis picks (Cholesky's subtree
    strategy: a rank's rows and lower entries of P A P^T, P rank 0's ordering), each rank reads
    the input while rank 0 analyses instead of waiting for rank 0 to cut and send its share.
    Every rank holds the input: the memory estimate counts it on every rank."""

    def load(self, ctx, op):
        return all_call(ctx.comm, read_problem, ctx.config, type(op))


class PartProblem:
    """The input of a run read by parts, as the operation gets it on every rank: the subclass
    holds this rank's part and what is known of the whole input without holding it; the whole
    input is loaded by ``load`` on first use and kept. Attributes the subclass does not define
    (the whole input's arrays and methods) are the whole input's."""

    def __init__(self, load):
        self._load, self._whole = load, None

    @property
    def loaded(self):
        """Whether the whole input has been read or generated here."""
        return self._whole is not None

    def whole(self):
        """The whole input (loaded on first use)."""
        if self._whole is None:
            if self._load is None:
                raise RuntimeError("this rank cannot load the whole input")
            self._whole = self._load()
        return self._whole

    def __getattr__(self, name):
        # Only reached for what the subclass's metadata lacks.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.whole(), name)


def layout_of(op, problem):
    """The layout ``problem`` was read by: the operation's own for a problem read by parts, the
    whole input on rank 0 otherwise (a matrix or tensor on rank 0, ``None`` elsewhere)."""
    return op.layout() if isinstance(problem, PartProblem) else WholeOnRoot(op.INPUT_KIND)


# -- the input, read whole ------------------------------------------------------------------------

def read_problem(config, op_cls):
    """Read or generate the whole input on this rank and cast it to the configured precision.

    Returns
    -------
    CSRMatrix or COOTensor
    """
    section = config["input"]
    check_input_kind(config, op_cls)
    if section["generate"] is not None:
        problem = generators.generate(section["generate"])  # valid by construction
    else:
        reader = read_matrix if op_cls.INPUT_KIND == "matrix" else read_tensor
        problem = reader(section["path"], section["group"], section["duplicates"])
    dtype = run_value_dtype(config)
    with np.errstate(over="ignore"):  # an overflow is reported by check_cast, not warned about
        if op_cls.INPUT_KIND == "matrix":
            index_dtype = index_dtype_for(max(problem.nnz, *problem.shape), config["index_width"])
            cast = problem.astype(dtype, index_dtype)
            check_cast(problem.data, cast.data, input_label(config), config["precision"])
            return cast
        cast = problem.astype(dtype)
    check_cast(problem.values, cast.values, input_label(config), config["precision"])
    return cast


def check_input_kind(config, op_cls):
    """The input holds what the operation needs (a matrix or a tensor)."""
    section, want = config["input"], op_cls.INPUT_KIND
    if section["generate"] is not None:
        spec = section["generate"]
        have = generators.spec_kind(spec)
        if have != want:
            raise InputError(f"{config.source}: input.generate kind '{spec['kind']}' makes a {have}"
                             f", but operation '{op_cls.NAME}' needs a {want}")
        return
    path, group = section["path"], section["group"]
    have = input_kind(path, group)
    if have != want:
        raise InputError(f"{path}: group '{group}' holds a {have}, but operation "
                         f"'{op_cls.NAME}' needs a {want}")


def run_value_dtype(config):
    """The run's value dtype (``precision``)."""
    return VALUE_DTYPES[config["precision"]]


def input_label(config):
    """The input as messages name it: its path, or the generator spec."""
    if config["input.path"] is not None:
        return config["input.path"]
    return f"input.generate {{kind: {config['input.generate']['kind']}}}"


def check_cast(values, cast, label, precision, where=None):
    """Raise :class:`InputError` when a finite value overflowed the configured precision (an
    input error, not a NaN found at verification). ``where(i)`` names entry ``i`` in the
    message (default ``"entry i"``). One value repeated (:func:`~hisparse.arrays.repeated`) is
    looked at once, where it first stands."""
    if cast.dtype == values.dtype or not len(cast):
        return
    if repeated_value(cast) is not None:
        values, cast = values[:1], cast[:1]
    finite = np.isfinite(cast)
    if not finite.all():
        bad = int(np.argmin(finite))
        place = where(bad) if where is not None else f"entry {bad}"
        raise InputError(f"{label}: value {values[bad]:.6g} at {place} overflows {precision} "
                         f"(largest {np.finfo(cast.dtype).max:.3g}); use precision: fp64")
