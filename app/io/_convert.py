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
import zlib

import numpy as np

from ..errors import InputError, OutputError
from ..formats import COOTensor, CSRMatrix


_OPENERS = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}


def _read_bytes(path):
    """The whole (decompressed) content of ``path``; a missing, unreadable or corrupt file is an
    :class:`InputError` naming it."""
    if not os.path.exists(path):
        raise InputError(f"{path}: file not found")
    opener = _OPENERS.get(os.path.splitext(path)[1], open)
    try:
        with opener(path, "rb") as handle:
            return handle.read()
    except (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise InputError(f"{path}: corrupt or truncated compressed file ({exc})") from None
    except OSError as exc:
        if opener is not open and not exc.strerror:  # bz2 reports bad data as a bare OSError
            raise InputError(f"{path}: corrupt or truncated compressed file ({exc})") from None
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _read_text(path):
    """The whole (decompressed) text of ``path``, UTF-8 (a byte order mark is dropped)."""
    data = _read_bytes(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError(f"{path}: not a text file (byte 0x{data[exc.start]:02x} on line "
                         f"{line} is not UTF-8)") from None


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


def _numeric_table(path, comments="#", delimiter=None, skip_header=0, min_columns=2, text=None):
    """Load a whitespace/delimiter-separated numeric table as float64, shape (rows, cols)."""
    text = _read_text(path) if text is None else text
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


def _whole_numbers(path, table, columns, what):
    """Columns of ``table`` that hold ids or coordinates, as int64: a fractional, non-finite or
    out-of-range value is refused (never truncated)."""
    part = table[:, columns]
    bad = ~np.isfinite(part) | (part != np.round(part)) | (np.abs(part) >= 2.0 ** 62)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(f"{path}: {what} must be whole numbers; data line {row + 1}, column "
                         f"{columns[col] + 1} holds {float(part[row, col])!r}")
    return part.astype(np.int64)


def _mtx_symmetry(path, data):
    """The symmetry word of a Matrix Market banner: general, symmetric, skew-symmetric or
    hermitian."""
    banner = data[:data.find(b"\n")].decode("ascii", "replace").lower().split()
    if len(banner) < 5 or banner[0] != "%%matrixmarket":
        raise InputError(f"{path}: malformed Matrix Market file (the first line is not "
                         f"'%%MatrixMarket matrix FORMAT FIELD SYMMETRY')")
    if banner[3] == "complex":
        raise InputError(f"{path}: complex matrices are not supported")
    return banner[4]


def read_mtx(path):
    """Matrix Market file to CSR; symmetric and skew-symmetric files are expanded to both
    triangles (only a symmetric one is marked symmetric)."""
    import scipy.io
    import scipy.sparse as sp
    data = _read_bytes(path)
    symmetry = _mtx_symmetry(path, data)
    # SciPy reads from a buffer that stays open until it is done (its reader threads outlive
    # an exception; a closed handle made them print a traceback after the error line).
    source = io.BytesIO(data)
    try:
        matrix = scipy.io.mmread(source)
    except Exception as exc:  # SciPy raises ValueError/IndexError/... on malformed files
        raise InputError(f"{path}: malformed Matrix Market file ({exc})") from None
    if not sp.issparse(matrix):
        matrix = sp.csr_matrix(matrix)
    matrix = matrix.tocsr().astype(np.float64)
    return CSRMatrix.from_scipy(matrix, symmetric=symmetry == "symmetric")


def read_snap(path, symmetrize=False):
    """SNAP edge list to a square pattern matrix (value 1 per edge), node ids kept as given."""
    import scipy.sparse as sp
    table = _numeric_table(path)
    if table.size == 0:
        raise InputError(f"{path}: no edges")
    src, dst = _whole_numbers(path, table, [0, 1], "node ids").T
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
    if table.size == 0:
        raise InputError(f"{path}: no entries")
    rows, cols = _whole_numbers(path, table, [0, 1], "row and column indices").T
    vals = table[:, 2]
    if min(rows.min(), cols.min()) < 0:
        raise InputError(f"{path}: negative index (triplets are 0-based)")
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
    coords = _whole_numbers(path, table, list(range(table.shape[1] - 1)), "coordinates") - 1
    if coords.min() < 0:
        raise InputError(f"{path}: FROSTT coordinates are 1-based; found 0")
    shape = tuple(int(s) for s in coords.max(axis=0) + 1)
    return COOTensor(coords, table[:, -1].copy(), shape)


def read_genten(path):
    """GenTen / Tensor Toolbox ``sptensor`` text file (e.g. GenTen's amino-acid data).

    Layout: a line ``sptensor``, the order N, the N mode sizes, the nonzero count, then one
    ``i_1 ... i_N value`` line per nonzero with 0-based coordinates.
    """
    lines = _read_text(path).split("\n", 4)
    if lines[0].strip() != "sptensor":
        raise InputError(f"{path}: first line is not 'sptensor'")
    try:
        order = int(lines[1])
        shape = tuple(int(s) for s in lines[2].split())
        nnz = int(lines[3])
    except (ValueError, IndexError) as exc:
        raise InputError(f"{path}: malformed sptensor header ({exc})") from None
    table = _numeric_table(path, min_columns=1, text=lines[4] if len(lines) > 4 else "")
    if len(shape) != order or table.shape != (nnz, order + 1):
        raise InputError(f"{path}: header says order {order}, shape {shape}, {nnz} nonzeros; "
                         f"the body has {table.shape[0]} lines of {table.shape[1]} columns")
    coords = _whole_numbers(path, table, list(range(order)), "coordinates")
    return COOTensor(coords, table[:, order].copy(), shape)


def _compress_ids(column):
    """Map arbitrary ids to 0..k-1 in sorted order."""
    unique, dense = np.unique(column, return_inverse=True)
    return dense.astype(np.int64), len(unique)


def read_movielens(path, time_bin_days=1):
    """MovieLens ratings to a user x movie x time tensor of ratings.

    Users and movies keep their (1-based) ids as indices minus one; timestamps are binned to
    ``time_bin_days`` and the occupied bins numbered densely in time order.
    """
    text = _read_text(path)
    delimiter = "::" if "::" in text[:text.find("\n")] else None
    table = _numeric_table(path, delimiter=delimiter, min_columns=4, text=text)
    if table.size == 0:
        raise InputError(f"{path}: no ratings")
    users, movies, stamps = _whole_numbers(path, table, [0, 1, 3], "user, movie and time ids").T
    users, movies, ratings = users - 1, movies - 1, table[:, 2]
    bins, nbins = _compress_ids(stamps // (86400 * max(int(time_bin_days), 1)))
    coords = np.stack([users, movies, bins], axis=1)
    shape = (int(users.max()) + 1, int(movies.max()) + 1, nbins)
    return COOTensor(coords, ratings.copy(), shape)


def read_lastfm(path):
    """Last.fm ``user_taggedartists.dat`` to a user x artist x tag count tensor."""
    table = _numeric_table(path, skip_header=1, min_columns=3)
    if table.size == 0:
        raise InputError(f"{path}: no tag assignments")
    coords = _whole_numbers(path, table, [0, 1, 2], "user, artist and tag ids") - 1
    shape = tuple(int(s) for s in coords.max(axis=0) + 1)
    return COOTensor(coords, np.ones(len(coords)), shape)


def one_triangle(matrix):
    """``"lower"`` or ``"upper"`` when the square ``matrix`` (CSR) stores off-diagonal entries on
    one side of the diagonal only (CSparse's triplet files hold the lower half of a symmetric
    matrix), else None (a diagonal matrix included)."""
    if matrix.symmetric or matrix.shape[0] != matrix.shape[1] or matrix.nnz == 0:
        return None
    rows = np.repeat(np.arange(matrix.shape[0], dtype=np.int64), np.diff(matrix.indptr))
    below = int(np.count_nonzero(matrix.indices < rows))
    above = int(np.count_nonzero(matrix.indices > rows))
    if below and not above:
        return "lower"
    if above and not below:
        return "upper"
    return None


#: The note ``hisparse convert`` prints for a matrix that holds one triangle only.
ONE_TRIANGLE_NOTE = ("{source}: only the {side} triangle is stored (no entry {other} the "
                     "diagonal): written as an unsymmetric matrix with attribute storage="
                     "'{side}'. If it is one half of a symmetric matrix (CSparse's files are), "
                     "convert it again with --symmetric (triplet) or from a Matrix Market file "
                     "marked symmetric: Cholesky needs both triangles")


def _record_storage(output, group, side):
    """The group's ``storage`` attribute: ``lower``/``upper`` for a one-triangle matrix, absent
    otherwise (a group written again loses a stale one)."""
    import h5py
    with h5py.File(output, "a") as handle:
        attrs = handle[group].attrs
        if side:
            attrs["storage"] = side
        elif "storage" in attrs:
            del attrs["storage"]


CONVERTERS = {
    "mtx": read_mtx,
    "snap": read_snap,
    "triplet": read_triplet,
    "tns": read_tns,
    "genten": read_genten,
    "movielens": read_movielens,
    "lastfm": read_lastfm,
}


def convert(source, output, fmt=None, group="/", symmetric=False, duplicates="sum",
            overwrite=False):
    """Convert ``source`` to the HDF5 input schema at ``output:group``.

    The output is checked before the source is read (an existing group is refused unless
    ``overwrite``; see :func:`~hisparse.io.check_output_group`) and written through a temporary
    file, so a failure leaves ``output`` as it was.

    Parameters
    ----------
    source : str
        Input file (any format in :data:`CONVERTERS`, optionally compressed).
    output : str
        HDF5 file to write (created, or given one more group).
    fmt : str, optional
        Converter name; guessed from the file name when omitted.
    group : str
        Group to write (``/``: the file's root group).
    symmetric : bool
        For ``snap``: add reverse edges; for ``triplet``: mirror the lower triangle.
    overwrite : bool
        Replace ``group`` if it exists (only that group; other groups are kept).

    Returns
    -------
    CSRMatrix or COOTensor
        What was written.
    """
    from ._hdf5 import check_output_group, write_matrix, write_tensor
    fmt = fmt or detect_format(source)
    if fmt is None:
        raise InputError(f"{source}: cannot tell the format from the name; pass --format "
                         f"({', '.join(CONVERTERS)})")
    if fmt not in CONVERTERS:
        raise InputError(f"unknown format '{fmt}'; expected one of {', '.join(CONVERTERS)}")
    if os.path.exists(source) and os.path.exists(output) and os.path.samefile(source, output):
        raise OutputError(f"{output}: is the source file itself; choose another output name")
    check_output_group(output, group, overwrite)
    if fmt in ("snap", "triplet"):
        obj = CONVERTERS[fmt](source, symmetric)
    else:
        obj = CONVERTERS[fmt](source)
    if isinstance(obj, CSRMatrix):
        obj.validate(source)
        write_matrix(output, obj, group, overwrite=overwrite)
        _record_storage(output, group, one_triangle(obj))
    else:
        obj = obj.validate(source, duplicates)
        write_tensor(output, obj, group, overwrite=overwrite)
    return obj
