"""HDF5 input schema: read and write sparse matrices and tensors (see docs/hdf5_schema.md).

Matrix group (``format = "csr"``)::

    attrs: format="csr", shape=[m, n], symmetric=bool
    indptr  (m+1,) int32|int64
    indices (nnz,) int32|int64
    data    (nnz,) float32|float64

Tensor group (``format = "coo"``)::

    attrs: format="coo", shape=[I0, ..., I{N-1}]
    indices (nnz, N) integer            -- or one dataset per mode: index0 ... index{N-1}
    values  (nnz,) float
"""
import os

import h5py
import numpy as np

from ..errors import InputError
from ..formats import COOTensor, CSRMatrix

_COMPRESSION = dict(compression="gzip", compression_opts=4, shuffle=True)


def _open_group(path, group):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: input file not found")
    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"{path}: not a readable HDF5 file ({exc})") from None
    if group not in handle:
        handle.close()
        raise InputError(f"{path}: HDF5 group '{group}' not found")
    return handle, handle[group]


def _dataset(path, grp, name):
    if name not in grp:
        raise InputError(f"{path}: dataset '{grp.name.rstrip('/')}/{name}' not found "
                         f"(group has: {', '.join(sorted(grp.keys())) or 'nothing'})")
    return grp[name][()]


def _shape_attr(path, grp, order=None):
    if "shape" not in grp.attrs:
        raise InputError(f"{path}: group '{grp.name}' has no 'shape' attribute")
    shape = tuple(int(s) for s in np.atleast_1d(grp.attrs["shape"]))
    if order is not None and len(shape) != order:
        raise InputError(f"{path}: attribute '{grp.name}'.shape = {shape}, expected {order} "
                         f"dimensions")
    return shape


def hdf5_reference_check(keywords, expected, inner_required=True):
    """A config check accepting ``keywords`` or an HDF5 reference ``FILE.h5:/path``.

    Parameters
    ----------
    keywords : tuple of str
        Plain values accepted as they are (e.g. ``("random", "ones")``).
    expected : str
        What the error message says was expected.
    inner_required : bool
        Whether the ``:/path`` part is required (else ``FILE.h5`` alone means its root group).
    """
    def check(value):
        path, colon, _ = value.partition(":")
        if value in keywords or (path.endswith((".h5", ".hdf5")) and (colon or not inner_required)):
            return None
        return f"expected {expected}"
    return check


def split_hdf5_reference(reference, default="/"):
    """``"FILE.h5:/path"`` -> ``("FILE.h5", "/path")``; the path defaults to ``default``."""
    path, _, inner = reference.partition(":")
    return path, inner or default


def input_kind(path, group="/"):
    """``"matrix"`` or ``"tensor"``: what the group at ``path:group`` holds."""
    handle, grp = _open_group(path, group)
    with handle:
        fmt = grp.attrs.get("format", None)
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        if fmt == "csr" or (fmt is None and "indptr" in grp):
            return "matrix"
        if fmt == "coo" or (fmt is None and "values" in grp):
            return "tensor"
        raise InputError(f"{path}: group '{group}' holds neither a CSR matrix nor a COO tensor "
                         f"(attribute format = {fmt!r})")


def read_matrix(path, group="/", duplicates="sum"):
    """Read and validate a CSR matrix.

    Parameters
    ----------
    path : str
        HDF5 file.
    group : str
        Group holding ``indptr``, ``indices``, ``data`` and the ``shape`` attribute.
    duplicates : {"sum", "reject"}
        Duplicate (row, column) entries are summed or rejected.

    Returns
    -------
    CSRMatrix
        Column indices sorted within each row.
    """
    handle, grp = _open_group(path, group)
    with handle:
        shape = _shape_attr(path, grp, order=2)
        indptr = _dataset(path, grp, "indptr")
        indices = _dataset(path, grp, "indices")
        data = _dataset(path, grp, "data")
        symmetric = bool(grp.attrs.get("symmetric", False))
    if not np.issubdtype(indptr.dtype, np.integer) or not np.issubdtype(indices.dtype, np.integer):
        raise InputError(f"{path}: indptr and indices must be integer datasets")
    if np.issubdtype(data.dtype, np.integer) or data.dtype == bool:
        data = data.astype(np.float64)
    matrix = CSRMatrix(indptr, indices, data, shape, symmetric).validate(f"{path}:{group}")
    return _canonical_rows(matrix, path, duplicates)


def _canonical_rows(matrix, path, duplicates):
    """Sort columns within rows and merge or reject duplicate entries."""
    import scipy.sparse as sp
    csr = sp.csr_matrix((matrix.data, matrix.indices, matrix.indptr), shape=matrix.shape)
    if not csr.has_canonical_format:
        before = csr.nnz
        csr = csr.copy()
        csr.sort_indices()
        lengths_sorted = csr.indptr.copy()
        csr.sum_duplicates()
        if csr.nnz != before and duplicates == "reject":
            row = int(np.argmax(np.diff(csr.indptr) != np.diff(lengths_sorted)))
            raise InputError(f"{path}: duplicate entries in row {row}; set input.duplicates: sum "
                             f"to merge them")
    return CSRMatrix(csr.indptr, csr.indices, csr.data, tuple(csr.shape), matrix.symmetric)


def read_tensor(path, group="/", duplicates="sum"):
    """Read and validate a COO tensor.

    Returns
    -------
    COOTensor
        Coordinates sorted row-major, duplicates merged (or rejected).
    """
    handle, grp = _open_group(path, group)
    with handle:
        shape = _shape_attr(path, grp)
        if "indices" in grp:
            indices = grp["indices"][()]
        else:
            names = [f"index{m}" for m in range(len(shape))]
            if names[0] not in grp:
                raise InputError(f"{path}: dataset '{grp.name.rstrip('/')}/indices' not found "
                                 f"(nor per-mode index0..index{len(shape) - 1})")
            indices = np.stack([_dataset(path, grp, n) for n in names], axis=1)
        values = _dataset(path, grp, "values")
    if not np.issubdtype(indices.dtype, np.integer):
        raise InputError(f"{path}: tensor indices must be integers, got {indices.dtype}")
    if np.issubdtype(values.dtype, np.integer):
        values = values.astype(np.float64)
    tensor = COOTensor(indices.astype(np.int64, copy=False), values, shape)
    return tensor.validate(f"{path}:{group}", duplicates)


def _replace_group(handle, group):
    if group in ("/", ""):
        for key in list(handle.keys()):
            del handle[key]
        return handle["/"]
    if group in handle:
        del handle[group]
    return handle.require_group(group)


def write_matrix(path, matrix, group="/", mode="a"):
    """Write a :class:`CSRMatrix` in the input schema (gzip-compressed datasets)."""
    with h5py.File(path, mode) as handle:
        grp = _replace_group(handle, group)
        grp.attrs["format"] = "csr"
        grp.attrs["shape"] = np.asarray(matrix.shape, dtype=np.int64)
        grp.attrs["symmetric"] = bool(matrix.symmetric)
        grp.create_dataset("indptr", data=matrix.indptr, **_COMPRESSION)
        grp.create_dataset("indices", data=matrix.indices, **_COMPRESSION)
        grp.create_dataset("data", data=matrix.data, **_COMPRESSION)


def write_tensor(path, tensor, group="/", mode="a"):
    """Write a :class:`COOTensor` in the input schema (``indices`` as an nnz x N array)."""
    with h5py.File(path, mode) as handle:
        grp = _replace_group(handle, group)
        grp.attrs["format"] = "coo"
        grp.attrs["shape"] = np.asarray(tensor.shape, dtype=np.int64)
        smallest = np.int32 if max(tensor.shape) <= np.iinfo(np.int32).max else np.int64
        grp.create_dataset("indices", data=tensor.indices.astype(smallest), **_COMPRESSION)
        grp.create_dataset("values", data=tensor.values, **_COMPRESSION)


def describe(path):
    """One line per matrix/tensor group in ``path``: what ``hisparse info`` prints."""
    lines = []
    if not os.path.exists(path):
        raise InputError(f"{path}: file not found")

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and "format" in obj.attrs:
            fmt = obj.attrs["format"]
            fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
            shape = tuple(int(s) for s in obj.attrs.get("shape", ()))
            if fmt == "csr":
                nnz = obj["indices"].shape[0]
                m = shape[0] or 1
                lengths = np.diff(obj["indptr"][()])
                lines.append(f"/{name}: CSR matrix {shape[0]} x {shape[1]}, nnz {nnz}, "
                             f"{nnz / m:.2f} per row (max {int(lengths.max()) if len(lengths) else 0}"
                             f", empty rows {int((lengths == 0).sum())}), "
                             f"symmetric={bool(obj.attrs.get('symmetric', False))}, "
                             f"values {obj['data'].dtype}, indices {obj['indices'].dtype}")
            elif fmt == "coo":
                nnz = obj["values"].shape[0]
                dims = " x ".join(str(s) for s in shape)
                density = nnz / float(np.prod(np.asarray(shape, dtype=float))) if shape else 0
                lines.append(f"/{name}: COO tensor of order {len(shape)}, {dims}, nnz {nnz}, "
                             f"density {density:.3g}, values {obj['values'].dtype}")
    try:
        with h5py.File(path, "r") as handle:
            visit("", handle)
            handle.visititems(visit)
    except OSError as exc:
        raise InputError(f"{path}: not a readable HDF5 file ({exc})") from None
    lines = [line.replace("//", "/") for line in lines]
    return lines or [f"{path}: no hisparse matrix or tensor groups (attribute 'format' missing)"]
