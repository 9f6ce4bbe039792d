"""The generator registry: one class per kind, the spec checks and the part sources."""
import math
from dataclasses import dataclass

from ..config import Setting, non_negative, positive, positive_integers, validate_section
from ..errors import ConfigError
from ._common import _probability
from ._poisson import _poisson_band, poisson
from ._random_matrix import (RANDOM_ROW_BLOCK, random_matrix, random_matrix_blocks,
                             random_matrix_rows)
from ._rmat import RMAT_MAX_SCALE, RmatRowsOnDevice, rmat, rmat_blocks, rmat_part_edges
from ._tensor import random_tensor, tensor_source
from ._trefethen import _trefethen_band, trefethen


# -- the registry: one class per kind -------------------------------------------------------------

class Generator:
    """One kind of generated input: its parameters (``PARAMS``, validated by
    :func:`validate_spec`), what it makes (``MAKES``), the whole object (:meth:`whole`), how ranks
    make their parts alone (:meth:`part_source`) and whether it is slow to make again
    (``SLOW_TO_REMAKE``). The class docstring's first line is the generator's summary in
    docs/config.md. Classes, never instantiated: :data:`GENERATORS` maps names to them."""

    NAME = "?"
    #: ``"matrix"`` or ``"tensor"``
    MAKES = "matrix"
    PARAMS = {}
    #: Takes seconds to make again (random draws, routing and a sort per entry): a one-rank run
    #: keeps the one it made for verification instead (:class:`hisparse.layout.RowLayout`);
    #: stencils and bands are made again about as fast as the kept arrays' fingerprint is taken.
    SLOW_TO_REMAKE = False

    @classmethod
    def problems(cls, params):
        """Checks across parameters (each alone is checked by its ``Setting``): yields
        ``(key, message)`` for what is wrong; :func:`validate_spec` raises the first as a
        :class:`~hisparse.errors.ConfigError` naming the key (so a check may assume the ones
        before it passed)."""
        return iter(())

    @classmethod
    def whole(cls, **params):
        """The whole matrix or tensor."""
        raise NotImplementedError

    @classmethod
    def part_source(cls, params):
        """How ranks make their parts alone: a :class:`PartSource` (matrices) or a
        :class:`TensorSource` (tensors), from validated ``params`` (no ``kind``)."""
        raise NotImplementedError

    @classmethod
    def grid(cls, params):
        """The regular grid whose points the matrix's rows are, row-major (its extents), or
        None: no grid."""
        return None


class Poisson(Generator):
    """Negative Laplacian on a regular 2D/3D grid (SPD, symmetric)."""

    NAME = "poisson"
    PARAMS = {
        "dims": Setting(list, None, "Grid points per dimension (2 or 3 entries).",
                        check=positive_integers),
        "stencil": Setting(int, None, "5/9 (2D) or 7/27 (3D).", choices=(5, 7, 9, 27),
                           nullable=True),
        "scale": Setting(float, 1.0, "Multiply all values."),
    }

    @classmethod
    def problems(cls, params):
        dims, stencil = params["dims"], params["stencil"]
        if dims is None:
            yield "dims", "missing; e.g. [64, 64]"
        if len(dims) not in (2, 3):
            yield "dims", f"expected 2 or 3 entries, got {dims}"
        allowed = (5, 9) if len(dims) == 2 else (7, 27)
        if stencil is not None and stencil not in allowed:
            yield "stencil", f"expected one of {allowed} for {len(dims)}D dims, got {stencil}"

    whole = staticmethod(poisson)

    @classmethod
    def part_source(cls, params):
        band = _poisson_band(params["dims"], params["stencil"], params["scale"])
        return PartSource((band.nrows, band.nrows), True, band=band)

    @classmethod
    def grid(cls, params):
        return list(params["dims"])


class Rmat(Generator):
    """R-MAT power-law graph with ``2**scale`` vertices and about ``edge_factor * 2**scale`` edges."""

    NAME = "rmat"
    PARAMS = {
        "scale": Setting(int, 10, "log2 of the vertex count (at most 32).", check=positive),
        "edge_factor": Setting(int, 16, "Edges per vertex.", check=positive),
        "a": Setting(float, 0.57, "R-MAT probability a.", check=_probability),
        "b": Setting(float, 0.19, "R-MAT probability b.", check=_probability),
        "c": Setting(float, 0.19, "R-MAT probability c.", check=_probability),
        "seed": Setting(int, 0, "Random seed.", check=non_negative),
        "symmetric": Setting(bool, False, "Add reverse edges."),
    }
    SLOW_TO_REMAKE = True

    @classmethod
    def problems(cls, params):
        if params["scale"] > RMAT_MAX_SCALE:
            yield "scale", (f"at most {RMAT_MAX_SCALE} (2**{RMAT_MAX_SCALE} vertices), got "
                            f"{params['scale']}")
        total = params["a"] + params["b"] + params["c"]
        if total > 1.0 + 1e-12:
            yield "a", (f"a + b + c = {total:.6g} exceeds 1 (d = 1 - a - b - c is the fourth "
                        f"quadrant's probability); lower a, b or c")

    whole = staticmethod(rmat)

    @classmethod
    def part_source(cls, params):
        n = 1 << params["scale"]
        return PartSource((n, n), params["symmetric"],
                          edges=lambda blocks, device=None: rmat_part_edges(params, blocks,
                                                                            device),
                          nblocks=rmat_blocks(params["scale"], params["edge_factor"]),
                          whole_on_device=RmatRowsOnDevice(params))


class Trefethen(Generator):
    """Trefethen_n: primes 2, 3, 5, ... on the diagonal and ones where ``|i - j|`` is a power of 2."""

    NAME = "trefethen"
    PARAMS = {"n": Setting(int, 2000, "Order of the matrix.", check=positive)}
    whole = staticmethod(trefethen)

    @classmethod
    def part_source(cls, params):
        band = _trefethen_band(params["n"])
        return PartSource((band.nrows, band.nrows), True, band=band)


class RandomMatrix(Generator):
    """Random-column matrix: ``nnz_per_row`` entries per row at uniform random columns."""

    NAME = "random_matrix"
    PARAMS = {
        "rows": Setting(int, 1000, "Rows.", check=positive),
        "cols": Setting(int, None, "Columns (default: rows).", nullable=True, check=positive),
        "nnz_per_row": Setting(int, 8, "Average entries per row.", check=positive),
        "seed": Setting(int, 0, "Random seed.", check=non_negative),
        "power_law": Setting(float, 0.0, "Zipf exponent of row lengths (0 = uniform).",
                             check=non_negative),
    }
    SLOW_TO_REMAKE = True
    whole = staticmethod(random_matrix)

    @classmethod
    def part_source(cls, params):
        rows = params["rows"]
        return PartSource((rows, params["cols"] or rows), False,
                          row_blocks=lambda blocks: random_matrix_rows(**params, blocks=blocks),
                          rows_per_block=RANDOM_ROW_BLOCK, nblocks=random_matrix_blocks(rows))


class RandomTensor(Generator):
    """FROSTT-like random tensor with a target number of nonzeros and of mode-``mode`` fibers."""

    NAME = "random_tensor"
    MAKES = "tensor"
    PARAMS = {
        "dims": Setting(list, None, "Shape of the tensor.", check=positive_integers),
        "nnz": Setting(int, 1000, "Target nonzeros.", check=positive),
        "fibers_per_nnz": Setting(float, 0.1, "Target fibers per nonzero in (0, 1].",
                                  check=lambda v: None if 0 < v <= 1 else "must lie in (0, 1]"),
        "mode": Setting(int, None, "Fiber mode (default: last).", nullable=True,
                        check=non_negative),
        "seed": Setting(int, 0, "Random seed.", check=non_negative),
        "skew": Setting(float, 1.0, "Lognormal sigma of fiber lengths.", check=non_negative),
    }

    @classmethod
    def problems(cls, params):
        dims = params["dims"]
        if dims is None or len(dims) < 2:
            yield "dims", "expected at least 2 entries"
        if params["mode"] is not None and params["mode"] >= len(dims):
            yield "mode", f"must be < order {len(dims)}"
        mode = len(dims) - 1 if params["mode"] is None else params["mode"]
        space = math.prod(d for m, d in enumerate(dims) if m != mode)
        if space >= 2 ** 62:
            yield "dims", (f"the modes other than {mode} span {space:.3g} fibers; at most 2**62 "
                           f"are supported")

    whole = staticmethod(random_tensor)

    @classmethod
    def part_source(cls, params):
        return tensor_source(**params)


#: Every generator kind by name (``input.generate.kind``).
GENERATORS = {kind.NAME: kind for kind in (Poisson, Rmat, Trefethen, RandomMatrix, RandomTensor)}


def _params(spec):
    return {k: v for k, v in spec.items() if k != "kind"}


def validate_spec(spec, source="<generate>", prefix="generate."):
    """Validate a generator spec and fill its defaults.

    Raises
    ------
    ConfigError
        Unknown generator, unknown parameter or bad value; names ``source`` and the key.
    """
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ConfigError(source, prefix + "kind", f"missing; expected one of "
                                                   f"{', '.join(GENERATORS)}")
    kind = Setting(str, None, "", choices=tuple(GENERATORS)).validate(spec["kind"], source,
                                                                     prefix + "kind")
    out = validate_section(GENERATORS[kind].PARAMS, _params(spec), source, prefix)
    for key, message in GENERATORS[kind].problems(out):
        raise ConfigError(source, prefix + key, message)
    return {"kind": kind, **out}


def generator_of(spec):
    """The :class:`Generator` class of a spec's kind (``KeyError`` for an unknown one; a
    validated spec has a known one)."""
    return GENERATORS[spec["kind"]]


def generate(spec):
    """Build the matrix or tensor described by a (validated or raw) spec."""
    spec = validate_spec(dict(spec))
    return generator_of(spec).whole(**_params(spec))


@dataclass
class PartSource:
    """How a matrix generator makes a part of its matrix, for ranks that each make their own
    rows (:meth:`hisparse.layout.RowLayout.load`) and get the same global matrix as
    :func:`generate` whatever their number.

    Exactly one way is set:

    - ``band``: any set of rows is made alone (``band.lengths(rows)``, ``band.build(rows,
      ncols)``): Poisson stencils, Trefethen;
    - ``row_blocks``: ``row_blocks(range_of_blocks)`` makes consecutive blocks of
      ``rows_per_block`` rows (the first at ``start * rows_per_block``), ``nblocks`` in all:
      random matrices;
    - ``edges``: ``edges(range_of_blocks, device=None)`` gives the (source, destination) pairs
      of edge blocks, ``nblocks`` in all, made on the GPU of ``device`` (a GPU run's context)
      where that pays; each distinct pair is one unit entry of row ``source``: R-MAT.

    Besides, ``whole_on_device`` (R-MAT's :class:`RmatRowsOnDevice`) makes the whole matrix's
    rows on a GPU where it ``fits()`` (``make()``), which a GPU run's ranks take instead.
    """

    shape: tuple
    symmetric: bool
    band: object = None
    row_blocks: object = None
    rows_per_block: int = 0
    edges: object = None
    nblocks: int = 0
    whole_on_device: object = None


def part_source(spec):
    """How ranks make their parts of a (validated) spec's matrix or tensor alone: its
    generator's :meth:`Generator.part_source`."""
    return generator_of(spec).part_source(_params(spec))


def makes_band(spec):
    """Whether a (validated) spec makes a matrix by a band (a stencil: every row's columns
    within a fixed distance of the row), known from its parameters alone."""
    return spec_kind(spec) == "matrix" and part_source(spec).band is not None


def grid_of_spec(spec):
    """The regular grid whose points a (validated) spec's matrix rows are, row-major (a
    Poisson's dims), or None."""
    return generator_of(spec).grid(_params(spec))


def spec_kind(spec):
    """``"tensor"`` or ``"matrix"``: what a generator spec produces."""
    return generator_of(spec).MAKES
