"""Converters from common text formats to the HDF5 input schema (``hisparse convert``).

Each converter reads one source file (plain, ``.gz``, ``.bz2`` or ``.xz``) and returns a
:class:`CSRMatrix` or :class:`COOTensor`:

============  ===========================================================================
format        source
============  ===========================================================================
mtx           Matrix Market coordinate/array (real, integer, pattern; general/symmetric)
snap          SNAP edge list (``#`` comments, ``src dst`` per line); pattern matrix
triplet       0-based ``i j x`` triplets (e.g. CSparse's lower-triangle files; ``--symmetric``)
tns           FROSTT ``.tns`` (1-based coordinates then a value per line)
genten        GenTen / Tensor Toolbox ``sptensor`` text (header, then 0-based coordinates)
movielens     ``u.data`` (tab) or ``ratings.dat`` (``::``): user x movie x time tensor
lastfm        Last.fm ``user_taggedartists.dat``: user x artist x tag tensor (value 1)
============  ===========================================================================
"""
import bz2
import gzip
import io
import lzma
import os

import numpy as np

from ..errors import InputError
from ..formats import COOTensor, CSRMatrix


def _open_text(path):
    if not os.path.exists(path):
        raise InputError(f"{path}: file not found")
    openers = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}
    opener = openers.get(os.path.splitext(path)[1])
    return opener(path, "rt") if opener else open(path, "rt")


def _base_name(path):
    name = os.path.basename(path)
    for ext in (".gz", ".xz", ".bz2"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    return name


def detect_format(path):
    """Guess the converter from the file name; ``None`` when unknown."""
    name = _base_name(path).lower()
    if name.endswith(".mtx"):
        return "mtx"
    if name.endswith(".tns"):
        return "tns"
    if name in ("u.data",) or name.startswith("ratings"):
        return "movielens"
    if name.endswith("_data.txt") and "aminoacid" in name:
        return "genten"
    if name.startswith("user_taggedartists"):
        return "lastfm"
    if "triplet" in name:
        return "triplet"
    if name.endswith(".txt") or name.endswith(".edges"):
        return "snap"
    return None


def _numeric_table(path, comments="#", delimiter=None, skip_header=0, min_columns=2):
    """Load a whitespace/delimiter-separated numeric table as float64, shape (rows, cols)."""
    with _open_text(path) as handle:
        text = handle.read()
    if delimiter and len(delimiter) > 1:
        text = text.replace(delimiter, "\t")
        delimiter = "\t"
    try:
        table = np.loadtxt(io.StringIO(text), comments=comments, delimiter=delimiter,
                           skiprows=skip_header, ndmin=2, dtype=np.float64)
    except ValueError as exc:
        raise InputError(f"{path}: cannot parse numeric columns ({exc})") from None
    if table.size and table.shape[1] < min_columns:
        raise InputError(f"{path}: expected at least {min_columns} columns, got {table.shape[1]}")
    return table


def read_mtx(path):
    """Matrix Market file to CSR; symmetric files are expanded to both triangles."""
    import scipy.io
    import scipy.sparse as sp
    with _open_text(path) as handle:
        header = handle.readline().lower()
        handle.seek(0)
        try:
            matrix = scipy.io.mmread(handle)
        except Exception as exc:  # scipy raises ValueError/IndexError on malformed files
            raise InputError(f"{path}: malformed Matrix Market file ({exc})") from None
    symmetric = "symmetric" in header or "hermitian" in header
    if not sp.issparse(matrix):
        matrix = sp.csr_matrix(matrix)
    matrix = matrix.tocsr().astype(np.float64)
    if "complex" in header:
        raise InputError(f"{path}: complex matrices are not supported")
    return CSRMatrix.from_scipy(matrix, symmetric=symmetric)


def read_snap(path, symmetrize=False):
    """SNAP edge list to a square pattern matrix (value 1 per edge), node ids kept as given."""
    import scipy.sparse as sp
    table = _numeric_table(path).astype(np.int64)
    if table.size == 0:
        raise InputError(f"{path}: no edges")
    src, dst = table[:, 0], table[:, 1]
    if min(src.min(), dst.min()) < 0:
        raise InputError(f"{path}: negative node id")
    n = int(max(src.max(), dst.max())) + 1
    if symmetrize:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    matrix = sp.coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)).tocsr()
    matrix.data[:] = 1.0  # repeated edges stay a single unit entry in a pattern matrix
    return CSRMatrix.from_scipy(matrix, symmetric=symmetrize)


def read_triplet(path, symmetric=False):
    """0-based ``i j x`` triplets to CSR; ``symmetric`` mirrors the strict lower triangle."""
    import scipy.sparse as sp
    table = _numeric_table(path, min_columns=3)
    rows, cols, vals = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2]
    n = int(max(rows.max(), cols.max())) + 1
    matrix = sp.coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr()
    if symmetric:
        matrix = matrix + sp.tril(matrix, -1).T
    return CSRMatrix.from_scipy(matrix, symmetric=symmetric)


def read_tns(path):
    """FROSTT ``.tns``: N 1-based coordinates and a value per line; shape = max index."""
    table = _numeric_table(path)
    if table.size == 0:
        raise InputError(f"{path}: no nonzeros")
    coords = table[:, :-1].astype(np.int64) - 1
    if coords.min() < 0:
        raise InputError(f"{path}: FROSTT coordinates are 1-based; found 0")
    shape = tuple(int(s) for s in coords.max(axis=0) + 1)
    return COOTensor(coords, table[:, -1].copy(), shape)


def read_genten(path):
    """GenTen / Tensor Toolbox ``sptensor`` text file (e.g. GenTen's amino-acid data).

    Layout: a line ``sptensor``, the order N, the N mode sizes, the nonzero count, then one
    ``i_1 ... i_N value`` line per nonzero with 0-based coordinates.
    """
    with _open_text(path) as handle:
        if handle.readline().strip() != "sptensor":
            raise InputError(f"{path}: first line is not 'sptensor'")
        try:
            order = int(handle.readline())
            shape = tuple(int(s) for s in handle.readline().split())
            nnz = int(handle.readline())
            table = np.loadtxt(handle, ndmin=2)
        except ValueError as exc:
            raise InputError(f"{path}: malformed sptensor header or body ({exc})") from None
    if len(shape) != order or table.shape != (nnz, order + 1):
        raise InputError(f"{path}: header says order {order}, shape {shape}, {nnz} nonzeros; "
                         f"the body has {table.shape[0]} lines of {table.shape[1]} columns")
    return COOTensor(table[:, :order].astype(np.int64), table[:, order].copy(), shape)


def _compress_ids(column):
    """Map arbitrary ids to 0..k-1 in sorted order."""
    unique, dense = np.unique(column, return_inverse=True)
    return dense.astype(np.int64), len(unique)


def read_movielens(path, time_bin_days=1):
    """MovieLens ratings to a user x movie x time tensor of ratings.

    Users and movies keep their (1-based) ids as indices minus one; timestamps are binned to
    ``time_bin_days`` and the occupied bins numbered densely in time order.
    """
    with _open_text(path) as handle:
        first = handle.readline()
    delimiter = "::" if "::" in first else None
    table = _numeric_table(path, delimiter=delimiter, min_columns=4).astype(np.int64)
    users, movies, ratings, stamps = table[:, 0] - 1, table[:, 1] - 1, table[:, 2], table[:, 3]
    bins, nbins = _compress_ids(stamps // (86400 * max(int(time_bin_days), 1)))
    coords = np.stack([users, movies, bins], axis=1)
    shape = (int(users.max()) + 1, int(movies.max()) + 1, nbins)
    return COOTensor(coords, ratings.astype(np.float64), shape)


def read_lastfm(path):
    """Last.fm ``user_taggedartists.dat`` to a user x artist x tag count tensor."""
    table = _numeric_table(path, skip_header=1, min_columns=3).astype(np.int64)
    coords = table[:, :3] - 1
    shape = tuple(int(s) for s in coords.max(axis=0) + 1)
    return COOTensor(coords, np.ones(len(coords)), shape)


CONVERTERS = {
    "mtx": read_mtx,
    "snap": read_snap,
    "triplet": read_triplet,
    "tns": read_tns,
    "genten": read_genten,
    "movielens": read_movielens,
    "lastfm": read_lastfm,
}


def convert(source, output, fmt=None, group="/", symmetric=False, duplicates="sum"):
    """Convert ``source`` to the HDF5 input schema at ``output:group``.

    Parameters
    ----------
    source : str
        Input file (any format in :data:`CONVERTERS`, optionally compressed).
    output : str
        HDF5 file to write (created or updated).
    fmt : str, optional
        Converter name; guessed from the file name when omitted.
    symmetric : bool
        For ``snap``: add reverse edges; for ``triplet``: mirror the lower triangle.

    Returns
    -------
    CSRMatrix or COOTensor
        What was written.
    """
    from ._hdf5 import write_matrix, write_tensor
    fmt = fmt or detect_format(source)
    if fmt is None:
        raise InputError(f"{source}: cannot tell the format from the name; pass --format "
                         f"({', '.join(CONVERTERS)})")
    if fmt not in CONVERTERS:
        raise InputError(f"unknown format '{fmt}'; expected one of {', '.join(CONVERTERS)}")
    if fmt in ("snap", "triplet"):
        obj = CONVERTERS[fmt](source, symmetric)
    else:
        obj = CONVERTERS[fmt](source)
    if isinstance(obj, CSRMatrix):
        obj.validate(source)
        write_matrix(output, obj, group)
    else:
        obj = obj.validate(source, duplicates)
        write_tensor(output, obj, group)
    return obj
