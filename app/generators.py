"""Synthetic inputs with a seed: Poisson stencils, R-MAT graphs, Trefethen matrices, random
matrices and FROSTT-like random tensors.

A generator spec is a mapping ``{kind: NAME, ...params}``; :func:`validate_spec` checks it against
the generator's parameters and :func:`generate` builds the object. The same specs are accepted by
``input.generate`` in a run config and by ``hisparse generate``.
"""
import numpy as np

from .config import Setting, positive, non_negative, validate_section
from .errors import ConfigError
from .formats import COOTensor, CSRMatrix


def _sorted_unique(values):
    """Sorted distinct values of an int64 array (sort-based: much faster than np.unique's
    hash path on tens of millions of keys)."""
    values = np.sort(values)
    if len(values) == 0:
        return values
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _dims_check(value):
    if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                            for v in value):
        return "must be a non-empty list of positive integers"
    return None


def _probability(value):
    return None if 0.0 <= value <= 1.0 else "must lie in [0, 1]"


def poisson(dims, stencil=None, scale=1.0):
    """Negative Laplacian on a regular 2D/3D grid (SPD, symmetric).

    Parameters
    ----------
    dims : list of int
        Grid points per dimension, length 2 or 3; the matrix has ``prod(dims)`` rows.
    stencil : int, optional
        5 or 9 (2D), 7 or 27 (3D); defaults to 5 / 7.
    """
    import scipy.sparse as sp  # imported when used: it costs a quarter second
    if len(dims) not in (2, 3):
        raise ValueError("poisson dims must have 2 or 3 entries")
    stencil = stencil or (5 if len(dims) == 2 else 7)
    expected = (5, 9) if len(dims) == 2 else (7, 27)
    if stencil not in expected:
        raise ValueError(f"stencil {stencil} does not match {len(dims)}D dims")
    # Row-major numbering: the first grid dimension varies slowest, as in C arrays.
    if stencil in (5, 7):
        matrix = None
        for axis, size in enumerate(dims):
            before = sp.identity(int(np.prod(dims[:axis], dtype=np.int64)), format="csr")
            after = sp.identity(int(np.prod(dims[axis + 1:], dtype=np.int64)), format="csr")
            second_difference = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(size, size))
            term = sp.kron(sp.kron(before, second_difference), after, format="csr")
            matrix = term if matrix is None else matrix + term
    else:
        # Full box stencil: the pattern of kron(tridiag(1,1,1), ...); centre = stencil - 1 and
        # -1 elsewhere, which is diagonally dominant, hence SPD.
        box = None
        for size in dims:
            ones = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(size, size), format="csr")
            box = ones if box is None else sp.kron(box, ones, format="csr")
        matrix = -box
        matrix.setdiag(float(stencil - 1))
    matrix = (matrix * scale).tocsr()
    return CSRMatrix.from_scipy(matrix, symmetric=True)


def rmat(scale, edge_factor=16, a=0.57, b=0.19, c=0.19, seed=0, symmetric=False):
    """R-MAT power-law graph with ``2**scale`` vertices and about ``edge_factor * 2**scale`` edges.

    Vertex ids are randomly permuted so heavy rows are spread over the matrix; duplicate edges
    collapse to one unit entry.
    """
    import scipy.sparse as sp  # imported when used: it costs a quarter second
    rng = np.random.default_rng(seed)
    n = 1 << scale
    nedges = edge_factor * n
    src = np.zeros(nedges, dtype=np.int64)
    dst = np.zeros(nedges, dtype=np.int64)
    cumulative = np.array([a, a + b, a + b + c])
    for level in range(scale):
        r = rng.random(nedges)
        quadrant = np.searchsorted(cumulative, r, side="right")  # 0..3
        src |= (quadrant >> 1).astype(np.int64) << level
        dst |= (quadrant & 1).astype(np.int64) << level
    perm = rng.permutation(n)
    src, dst = perm[src], perm[dst]
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    matrix = sp.coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)).tocsr()
    matrix.data[:] = 1.0
    return CSRMatrix.from_scipy(matrix, symmetric=symmetric)


def _primes(count):
    """The first ``count`` primes, int64."""
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    limit = max(16, int(count * (np.log(count) + np.log(np.log(count + 2)) + 2)))
    sieve = np.ones(limit + 1, dtype=bool)
    sieve[:2] = False
    for p in range(2, int(limit ** 0.5) + 1):
        if sieve[p]:
            sieve[p * p::p] = False
    return np.flatnonzero(sieve)[:count].astype(np.int64)


def trefethen(n):
    """Trefethen_n: primes 2, 3, 5, ... on the diagonal and ones where ``|i - j|`` is a power of 2.

    SPD; ``inv(A)[0, 0]`` of Trefethen_20000 is 0.7250783462684011... (SIAM 100-digit problem 7).
    """
    import scipy.sparse as sp  # imported when used: it costs a quarter second
    offsets = []
    step = 1
    while step < n:
        offsets.append(step)
        step *= 2
    diagonals = [_primes(n).astype(np.float64)]
    positions = [0]
    for k in offsets:
        diagonals += [np.ones(n - k), np.ones(n - k)]
        positions += [k, -k]
    matrix = sp.diags(diagonals, positions, shape=(n, n), format="csr")
    return CSRMatrix.from_scipy(matrix, symmetric=True)


def random_matrix(rows, cols=None, nnz_per_row=8, seed=0, power_law=0.0):
    """Random-column matrix: ``nnz_per_row`` entries per row at uniform random columns.

    ``power_law`` > 0 draws row lengths from a Zipf-like law with that exponent instead
    (mean kept near ``nnz_per_row``), giving irregular rows.
    """
    import scipy.sparse as sp  # imported when used: it costs a quarter second
    rng = np.random.default_rng(seed)
    cols = cols or rows
    if power_law > 0:
        weights = (np.arange(1, rows + 1, dtype=np.float64)) ** (-power_law)
        lengths = np.maximum(1, np.round(weights / weights.mean() * nnz_per_row)).astype(np.int64)
        lengths = np.minimum(lengths, cols)[rng.permutation(rows)]
    else:
        lengths = np.full(rows, min(nnz_per_row, cols), dtype=np.int64)
    row_ids = np.repeat(np.arange(rows, dtype=np.int64), lengths)
    col_ids = rng.integers(0, cols, size=len(row_ids), dtype=np.int64)
    values = rng.uniform(-1.0, 1.0, size=len(row_ids))
    matrix = sp.coo_matrix((values, (row_ids, col_ids)), shape=(rows, cols)).tocsr()
    return CSRMatrix.from_scipy(matrix)


def random_tensor(dims, nnz, fibers_per_nnz=0.1, mode=None, seed=0, skew=1.0):
    """FROSTT-like random tensor with a target number of nonzeros and of mode-``mode`` fibers.

    ``fibers_per_nnz * nnz`` distinct fibers (coordinate tuples of every mode but ``mode``) are
    drawn uniformly; fiber lengths follow a skewed (lognormal, ``skew`` = sigma) law scaled to
    total ``nnz``; indices along ``mode`` are drawn without clustering. Duplicate coordinates are
    merged, so the result may have slightly fewer nonzeros than asked. Nonzeros come grouped by
    fiber, the fibers in random order (not sorted).

    Parameters
    ----------
    dims : list of int
        Shape, order N >= 2.
    nnz : int
        Target nonzeros.
    fibers_per_nnz : float
        Target ratio of non-empty mode-``mode`` fibers to nonzeros, in (0, 1].
    mode : int, optional
        The fiber mode; default the last.
    """
    rng = np.random.default_rng(seed)
    order = len(dims)
    mode = order - 1 if mode is None else mode
    other = [m for m in range(order) if m != mode]
    fiber_space = float(np.prod([dims[m] for m in other], dtype=np.float64))
    nfibers = int(max(1, min(round(nnz * fibers_per_nnz), fiber_space, nnz)))
    # Draw distinct fiber coordinates: encode them as one linear number per fiber (their space is
    # small enough here), dedupe, and top up until there are enough.
    sizes = np.array([dims[m] for m in other], dtype=np.int64)
    chosen = np.zeros(0, dtype=np.int64)
    while len(chosen) < nfibers:
        need = int((nfibers - len(chosen)) * 1.1) + 16
        draws = rng.integers(0, int(fiber_space), size=need, dtype=np.int64)
        chosen = _sorted_unique(np.concatenate([chosen, draws]))
    chosen = chosen[rng.permutation(len(chosen))[:nfibers]]
    fibers = np.stack(np.unravel_index(chosen, tuple(sizes)), axis=1).astype(np.int64)
    weights = rng.lognormal(0.0, skew, size=nfibers)
    share = weights / weights.sum() * nnz
    lengths = np.maximum(1, np.floor(share)).astype(np.int64)
    # Hand the rounding remainder to the fibers with the largest fractional parts.
    remainder = int(nnz - lengths.sum())
    if remainder > 0:
        lengths[np.argsort(share - np.floor(share))[::-1][:remainder]] += 1
    lengths = np.minimum(lengths, dims[mode])
    # Distinct mode-n indices inside each fiber: draw with replacement, drop repeats, and redraw
    # the shortfall a few times (keys are fiber * dim + index, so np.unique keeps fibers sorted).
    size = int(dims[mode])
    keys = np.zeros(0, dtype=np.int64)
    deficit = lengths
    for _ in range(8):
        owners = np.repeat(np.arange(nfibers, dtype=np.int64), deficit)
        draws = rng.integers(0, size, size=len(owners), dtype=np.int64)
        keys = _sorted_unique(np.concatenate([keys, owners * size + draws]))
        deficit = lengths - np.bincount(keys // size, minlength=nfibers)
        if not deficit.any():
            break
    owner, position = keys // size, keys % size
    coords = np.empty((len(keys), order), dtype=np.int64)
    for j, m in enumerate(other):
        coords[:, m] = fibers[owner, j]
    coords[:, mode] = position
    values = rng.uniform(0.0, 1.0, size=len(keys))
    # Distinct by construction; grouped by fiber, fibers in random order.
    return COOTensor(coords, values, tuple(int(d) for d in dims))


_COMMON = {"kind": Setting(str, None, "Generator name.")}

GENERATORS = {
    "poisson": (poisson, {
        "dims": Setting(list, None, "Grid points per dimension (2 or 3 entries).",
                        check=_dims_check),
        "stencil": Setting(int, None, "5/9 (2D) or 7/27 (3D).", choices=(5, 7, 9, 27),
                           nullable=True),
        "scale": Setting(float, 1.0, "Multiply all values."),
    }),
    "rmat": (rmat, {
        "scale": Setting(int, 10, "log2 of the vertex count.", check=positive),
        "edge_factor": Setting(int, 16, "Edges per vertex.", check=positive),
        "a": Setting(float, 0.57, "R-MAT probability a.", check=_probability),
        "b": Setting(float, 0.19, "R-MAT probability b.", check=_probability),
        "c": Setting(float, 0.19, "R-MAT probability c.", check=_probability),
        "seed": Setting(int, 0, "Random seed.", check=non_negative),
        "symmetric": Setting(bool, False, "Add reverse edges."),
    }),
    "trefethen": (trefethen, {
        "n": Setting(int, 2000, "Order of the matrix.", check=positive),
    }),
    "random_matrix": (random_matrix, {
        "rows": Setting(int, 1000, "Rows.", check=positive),
        "cols": Setting(int, None, "Columns (default: rows).", nullable=True, check=positive),
        "nnz_per_row": Setting(int, 8, "Average entries per row.", check=positive),
        "seed": Setting(int, 0, "Random seed.", check=non_negative),
        "power_law": Setting(float, 0.0, "Zipf exponent of row lengths (0 = uniform).",
                             check=non_negative),
    }),
    "random_tensor": (random_tensor, {
        "dims": Setting(list, None, "Shape of the tensor.", check=_dims_check),
        "nnz": Setting(int, 1000, "Target nonzeros.", check=positive),
        "fibers_per_nnz": Setting(float, 0.1, "Target fibers per nonzero in (0, 1].",
                                  check=lambda v: None if 0 < v <= 1 else "must lie in (0, 1]"),
        "mode": Setting(int, None, "Fiber mode (default: last).", nullable=True,
                        check=non_negative),
        "seed": Setting(int, 0, "Random seed.", check=non_negative),
        "skew": Setting(float, 1.0, "Lognormal sigma of fiber lengths.", check=non_negative),
    }),
}

TENSOR_GENERATORS = ("random_tensor",)


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
    params = {k: v for k, v in spec.items() if k != "kind"}
    out = validate_section(GENERATORS[kind][1], params, source, prefix)
    if kind == "poisson":
        if out["dims"] is None:
            raise ConfigError(source, prefix + "dims", "missing; e.g. [64, 64]")
        if len(out["dims"]) not in (2, 3):
            raise ConfigError(source, prefix + "dims", f"expected 2 or 3 entries, got {out['dims']}")
        allowed = (5, 9) if len(out["dims"]) == 2 else (7, 27)
        if out["stencil"] is not None and out["stencil"] not in allowed:
            raise ConfigError(source, prefix + "stencil", f"expected one of {allowed} for "
                                                          f"{len(out['dims'])}D dims, got "
                                                          f"{out['stencil']}")
    if kind == "rmat" and out["a"] + out["b"] + out["c"] > 1.0 + 1e-12:
        raise ConfigError(source, prefix + "a", f"a + b + c = {out['a'] + out['b'] + out['c']:.6g}"
                                                f" exceeds 1 (d = 1 - a - b - c is the fourth "
                                                f"quadrant's probability); lower a, b or c")
    if kind == "random_tensor":
        if out["dims"] is None or len(out["dims"]) < 2:
            raise ConfigError(source, prefix + "dims", "expected at least 2 entries")
        if out["mode"] is not None and out["mode"] >= len(out["dims"]):
            raise ConfigError(source, prefix + "mode", f"must be < order {len(out['dims'])}")
    return {"kind": kind, **out}


def generate(spec):
    """Build the matrix or tensor described by a (validated or raw) spec."""
    spec = validate_spec(dict(spec))
    func = GENERATORS[spec["kind"]][0]
    return func(**{k: v for k, v in spec.items() if k != "kind"})


def spec_kind(spec):
    """``"tensor"`` or ``"matrix"``: what a generator spec produces."""
    return "tensor" if spec["kind"] in TENSOR_GENERATORS else "matrix"
