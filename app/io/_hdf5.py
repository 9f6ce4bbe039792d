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
import re
from contextlib import contextmanager

import h5py
import numpy as np

from ..errors import InputError, OutputError
from ..formats import COOTensor, CSRMatrix, index_dtype_for, rows_sorted

_COMPRESSION = dict(compression="gzip", compression_opts=4, shuffle=True)
#: Bytes (uncompressed) of a chunk of the input datasets hisparse writes. h5py's own choice was
#: about 100 KB (13,332 entries of 27-point 160^3's 109M), and a read inflates chunk by chunk on
#: threads, each chunk a Python step under the interpreter's lock: on the 2xH200 host the
#: matrix's indices read in 0.35-0.36 s from those chunks and 0.18-0.21 s from 1 MiB ones,
#: its values in 0.64-0.69 s and 0.41-0.68 s; 4 MiB chunks were no better (session 53,
#: docs/scaling/stop53_x2/probe59.py). The file is smaller too (16.2 -> 7.4 MB).
WRITE_CHUNK_BYTES = 1 << 20


def _compressed(array):
    """The dataset options hisparse writes ``array`` with: gzip after the shuffle filter, in
    chunks of about :data:`WRITE_CHUNK_BYTES` along the first axis (h5py's choice for an empty
    one, which cannot have a chunk)."""
    if not array.size:
        return dict(_COMPRESSION)
    row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    rows = max(1, min(array.shape[0], WRITE_CHUNK_BYTES // max(row_bytes, 1)))
    return dict(_COMPRESSION, chunks=(rows,) + tuple(array.shape[1:]))

#: The largest size an index of int64 can describe with room for sums (shape attributes beyond
#: it are refused as malformed).
_MAX_SIZE = 2 ** 62


def missing_file_message(path, what="input file"):
    """``PATH: <what> not found``; for a relative path, where it was looked for (the working
    directory: hisparse takes relative paths from there, not from the config's directory)."""
    path = os.fspath(path)
    if os.path.isabs(path):
        return f"{path}: {what} not found"
    return (f"{path}: {what} not found (a relative path is taken from the working directory "
            f"{os.getcwd()}: tried {os.path.abspath(path)})")


def _open_group(path, group):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(missing_file_message(path))
    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"{path}: not a readable HDF5 file ({exc})") from None
    try:
        grp = open_member(handle, path, group, "HDF5 group")
    except InputError:
        handle.close()
        raise
    return handle, grp


def open_member(handle, path, name, what="group", key=None):
    """``handle[name]`` of the open HDF5 file ``path``, or one :class:`InputError` naming the
    file, the member (``what``, and the setting ``key`` that named it) and, when a link on its
    path is dangling, looping or external to a missing file, that link."""
    try:
        return handle[name]
    except (KeyError, RuntimeError, OSError, ValueError) as exc:
        problem = _broken_link(handle, name) or f"not found ({exc})"
    where = f" ({key})" if key else ""
    raise InputError(f"{path}: {what} '{name}'{where} {problem}")


def _broken_link(handle, name):
    """Why the object ``name`` of the open file cannot be reached: the first link on its path
    that is missing, dangling (its target does not exist), looping, or external to a file that
    cannot be opened; None when every link resolves."""
    where = ""
    for part in [p for p in name.split("/") if p]:
        where = f"{where}/{part}"
        try:
            link = handle.get(where, getlink=True)
        except (KeyError, RuntimeError, OSError, ValueError):
            link = None
        if link is None:
            return "not found" if where == "/" + name.strip("/") else f"not found ('{where}' " \
                                                                     f"does not exist)"
        try:
            handle[where]
        except (KeyError, RuntimeError, OSError, ValueError) as exc:
            text = str(exc)
            loop = "too many links" in text or "traversal failed" in text
            if isinstance(link, h5py.ExternalLink):
                why = "loops" if loop else "cannot be followed (its file or object is missing)"
                return (f"cannot be opened: the external link '{where}' -> "
                        f"'{link.filename}:{link.path}' {why}")
            if isinstance(link, h5py.SoftLink):
                why = "loops (a chain of soft links that comes back to itself)" if loop else \
                    "dangles (its target does not exist)"
                return f"cannot be opened: the soft link '{where}' -> '{link.path}' {why}"
            return f"cannot be opened: '{where}' ({text})"
    return None


def check_value_dtype(dtype, label):
    """Stored values may be floating point, integer or boolean (a pattern); anything else is
    refused, naming ``label``."""
    if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)
            or dtype == bool):
        raise InputError(f"{label}: values must be floating point, integer or boolean, got "
                         f"{dtype}")


def as_float_values(values):
    """Integer or boolean stored values as float64 (a pattern reads as ones); floating point
    values as stored (the run casts them to its precision later)."""
    if np.issubdtype(values.dtype, np.integer) or values.dtype == bool:
        return values.astype(np.float64)
    return values


def require_dataset(path, grp, name):
    """The h5py dataset ``name`` of ``grp`` (not read), or the error naming the file, the
    dataset's path and what the group has: one message for the whole and the sliced readers."""
    if name not in grp:
        raise InputError(f"{path}: dataset '{grp.name.rstrip('/')}/{name}' not found "
                         f"(group has: {', '.join(sorted(grp.keys())) or 'nothing'})")
    return grp[name]


def require_index_columns(path, grp, order):
    """A COO group without ``indices`` must hold per-mode ``index0..index{order-1}``: their
    names, or the error that names what is missing."""
    names = [f"index{m}" for m in range(order)]
    if names[0] not in grp:
        raise InputError(f"{path}: dataset '{grp.name.rstrip('/')}/indices' not found "
                         f"(nor per-mode index0..index{order - 1})")
    for name in names:
        require_dataset(path, grp, name)
    return names


def _dataset(path, grp, name):
    dataset = require_dataset(path, grp, name)
    return read_range(dataset) if dataset.ndim else dataset[()]


#: Ranges of fewer (uncompressed) bytes than this, or of one chunk, are read by h5py itself (the
#: threads would not repay).
PARALLEL_MIN_BYTES = 2 << 20
#: Bytes (uncompressed) one thread inflates per task, in whole chunks (a task per chunk of ~100
#: KB cost more in the pool than the inflating; 32 chunks of 1 MiB left 27 tasks for 32 threads
#: in an 874 MB dataset), and tasks in flight per thread (the raw bytes read ahead are bounded
#: by them).
TASK_BYTES = 4 << 20
TASKS_AHEAD = 4


def _threaded_inflate(dataset):
    """Whether ``dataset``'s chunks can be inflated here, on threads: 1-D or 2-D (a tensor's
    (nnz, N) indices), chunked, compressed by gzip alone or after the shuffle filter (what
    hisparse writes), nothing else in the pipeline (no checksum, no scale-offset), a plain
    numeric dtype."""
    return (dataset.ndim in (1, 2) and dataset.chunks is not None
            and dataset.compression == "gzip"
            and not dataset.fletcher32 and dataset.scaleoffset is None
            and dataset.dtype.kind in "iuf" and dataset.dtype.isnative
            and dataset.id.get_create_plist().get_nfilters() == 1 + bool(dataset.shuffle))


def read_range(dataset, lo=0, hi=None):
    """``dataset[lo:hi]`` (rows ``lo:hi`` of a 2-D one). Where its chunks are gzip-compressed
    (what hisparse writes), they are read raw and inflated on threads: zlib lets the
    interpreter's lock go, where h5py inflates one chunk after another on one core (0.45 GB/s:
    2.9 s of the 1-rank read of a 27-point 160³ matrix on the H200 host). Anything else is read
    by h5py."""
    from ..threads import usable_cores
    n = dataset.shape[0]
    hi = n if hi is None else min(int(hi), n)
    lo = max(int(lo), 0)
    if hi <= lo:
        return dataset[lo:lo]
    if not _threaded_inflate(dataset) or usable_cores() < 2:
        return dataset[lo:hi]
    chunk = dataset.chunks[0]
    first, last = lo // chunk, (hi - 1) // chunk
    chunk_bytes = dataset.dtype.itemsize * int(np.prod(dataset.chunks, dtype=np.int64))
    row_bytes = dataset.dtype.itemsize * int(np.prod(dataset.shape[1:], dtype=np.int64))
    if last == first or (hi - lo) * row_bytes < PARALLEL_MIN_BYTES:
        return dataset[lo:hi]
    out = np.empty((hi - lo,) + dataset.shape[1:], dtype=dataset.dtype)
    columns = range(0, dataset.shape[1], dataset.chunks[1]) if dataset.ndim == 2 else [None]
    offsets = ((k * chunk,) if column is None else (k * chunk, column)
               for k in range(first, last + 1) for column in columns)
    _inflate_on_threads(dataset, offsets, _ChunkInflater(dataset, out, lo, hi),
                        min(usable_cores(), 32), max(1, TASK_BYTES // max(chunk_bytes, 1)))
    return out


def _inflate_on_threads(dataset, offsets, inflate, workers, per_task):
    """h5py (HDF5 is not thread-safe) reads the chunks' raw bytes here, one after another (a
    few ms for thousands), and ``workers`` threads inflate them meanwhile, ``per_task`` at a
    time (:data:`TASK_BYTES`), at most TASKS_AHEAD tasks a thread ahead of them."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(workers, thread_name_prefix="hisparse-h5") as pool:
        pending, batch = deque(), []
        for offset in offsets:
            batch.append((offset, *dataset.id.read_direct_chunk(offset)))
            if len(batch) == per_task:
                pending.append(pool.submit(inflate, batch))
                batch = []
                if len(pending) > TASKS_AHEAD * workers:
                    pending.popleft().result()
        if batch:
            pending.append(pool.submit(inflate, batch))
        for future in pending:
            future.result()


class _ChunkInflater:
    """Inflates raw chunks ``(offset, filter mask, bytes)`` of a gzip (+ shuffle) dataset into
    their parts of ``out`` (the dataset's rows ``lo:hi``)."""

    def __init__(self, dataset, out, lo, hi):
        self.dataset, self.out, self.lo, self.hi = dataset, out, lo, hi
        self.chunks, self.itemsize = dataset.chunks, dataset.dtype.itemsize
        self.shuffled = bool(dataset.shuffle)
        # a 1-D dataset's chunk is written straight into ``out`` (no second copy)
        self.flat = out.reshape(-1).view(np.uint8) if dataset.ndim == 1 else None

    def __call__(self, batch):
        import zlib
        lo, size = self.lo, self.itemsize
        for offset, filter_mask, raw in batch:
            start = offset[0]
            a, b = max(start, lo), min(start + self.chunks[0], self.hi)  # rows
            where = (slice(a - lo, b - lo),) + tuple(
                slice(o, min(o + c, n)) for o, c, n in zip(offset[1:], self.chunks[1:],
                                                           self.dataset.shape[1:]))
            if filter_mask:  # a filter was skipped for this chunk: HDF5 decodes it (h5py locks)
                self.out[where] = self.dataset[(slice(a, b),) + where[1:]]
                continue
            data = np.frombuffer(zlib.decompress(raw), dtype=np.uint8)
            if self.flat is not None:
                target = self.flat[(a - lo) * size:(b - lo) * size]
                if self.shuffled:  # byte plane j holds byte j of every value: a strided copy
                    target.reshape(-1, size)[:] = data.reshape(size, -1)[:, a - start:b - start].T
                else:
                    target[:] = data[(a - start) * size:(b - start) * size]
                continue
            values = np.empty(int(np.prod(self.chunks)), dtype=self.dataset.dtype)
            if self.shuffled:
                values.view(np.uint8).reshape(-1, size)[:] = data.reshape(size, -1).T
            else:
                values.view(np.uint8)[:] = data
            block = values.reshape(self.chunks)[a - start:b - start]
            self.out[where] = block[(slice(None),) + tuple(
                slice(0, s.stop - s.start) for s in where[1:])]


def _shape_attr(path, grp, order=None):
    if "shape" not in grp.attrs:
        raise InputError(f"{path}: group '{grp.name}' has no 'shape' attribute")
    raw = np.atleast_1d(grp.attrs["shape"])
    if raw.ndim != 1 or not (np.issubdtype(raw.dtype, np.integer) or
                             (np.issubdtype(raw.dtype, np.floating) and
                              np.all(np.isfinite(raw)) and np.all(raw == np.round(raw)))):
        raise InputError(f"{path}: attribute '{grp.name}'.shape = {raw.tolist()} is not a list of "
                         f"whole numbers")
    if len(raw) and (raw.min() < 0 or raw.max() > _MAX_SIZE):
        raise InputError(f"{path}: attribute '{grp.name}'.shape = {raw.tolist()}: sizes must lie "
                         f"in [0, 2**62]")
    shape = tuple(int(s) for s in raw)
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
    check_value_dtype(data.dtype, f"{path}:{group}")
    data = as_float_values(data)
    matrix = CSRMatrix(indptr, indices, data, shape, symmetric).validate(f"{path}:{group}")
    return _canonical_rows(matrix, path, duplicates)


def _canonical_rows(matrix, path, duplicates, row_ids=None):
    """Sort columns within rows and merge or reject duplicate entries.

    ``row_ids`` are the global ids of ``matrix``'s rows when it is a part of the file's matrix
    (messages name the global row); default ``0 .. m-1``. Index arrays come back int32 where
    the shape and nnz allow, else int64, as SciPy makes them.
    """
    if rows_sorted(matrix.indptr, matrix.indices):
        # Already canonical (what hisparse writes): no SciPy, whose import is 0.2-0.5 s of
        # every run's setup.
        dtype = index_dtype_for(max(max(matrix.shape, default=0), len(matrix.indices)))
        return CSRMatrix(np.asarray(matrix.indptr).astype(dtype, copy=False),
                         np.asarray(matrix.indices).astype(dtype, copy=False), matrix.data,
                         tuple(int(n) for n in matrix.shape), matrix.symmetric)
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
            row = row if row_ids is None else int(row_ids[row])
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
            indices = _dataset(path, grp, "indices")
        else:
            names = require_index_columns(path, grp, len(shape))
            columns = [_dataset(path, grp, n) for n in names]
            lengths = {n: c.shape for n, c in zip(names, columns)}
            if len(set(lengths.values())) != 1 or columns[0].ndim != 1:
                listed = ", ".join(f"{n} {shape}" for n, shape in lengths.items())
                raise InputError(f"{path}: per-mode index datasets must be 1-D and of one "
                                 f"length; got {listed}")
            indices = np.stack(columns, axis=1)
        values = _dataset(path, grp, "values")
    if not np.issubdtype(indices.dtype, np.integer):
        raise InputError(f"{path}: tensor indices must be integers, got {indices.dtype}")
    check_value_dtype(values.dtype, f"{path}:{group}")
    values = as_float_values(values)
    tensor = COOTensor(indices.astype(np.int64, copy=False), values, shape)
    return tensor.validate(f"{path}:{group}", duplicates)


#: What a matrix or tensor group holds: replaced by ``--overwrite`` at the root group, where
#: everything else (other groups, other attributes) stays.
_SCHEMA_ATTRS = ("format", "shape", "symmetric")
_SCHEMA_DATASETS = ("indptr", "indices", "data", "values")


def _is_root(group):
    return group.strip("/") == ""


def check_output_group(path, group="/", overwrite=False):
    """Whether a matrix or tensor may be written to ``path:group``, before any work is done.

    Returns
    -------
    {"new", "add", "replace"}
        A new file; a new group in an existing HDF5 file; an existing group that ``overwrite``
        allows to replace (only that group: other groups are kept).

    Raises
    ------
    OutputError
        The group (for ``/``: the file) exists and ``overwrite`` is not set; the file exists
        but is not HDF5; the directory does not exist or takes no new file; a parent of the
        group is a dataset.
    """
    from ._atomic import check_output_path
    path = os.fspath(path)
    if not os.path.lexists(path) or os.path.isdir(path):
        check_output_path(path, what="HDF5 file")  # the guard of every written file
        return "new"
    if not h5py.is_hdf5(path):
        raise OutputError(f"{path}: exists and is not an HDF5 file; it was not touched (choose "
                          f"another output name)")
    try:
        with h5py.File(path, "r") as handle:
            taken = _is_root(group) or group in handle
            parents = [p for p in _parents(group) if p in handle and
                       not isinstance(handle[p], h5py.Group)]
    except OSError as exc:
        raise OutputError(f"{path}: not a readable HDF5 file ({exc})") from None
    if parents:
        raise OutputError(f"{path}: cannot create group '{group}': '{parents[0]}' is a dataset")
    if not taken:
        return "add"
    if not overwrite:
        what = "the file exists" if _is_root(group) else f"group '{group}' exists"
        raise OutputError(f"{path}: {what}; pass --overwrite to replace group '{group}' (other "
                          f"groups are kept), or write to another --group or file")
    return "replace"


def _parents(group):
    parts = [p for p in group.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _prepare_group(handle, group, replace):
    if _is_root(group):
        root = handle["/"]
        if replace:
            for name in _SCHEMA_ATTRS:
                if name in root.attrs:
                    del root.attrs[name]
            for name in list(root):
                if isinstance(root[name], h5py.Dataset) and (
                        name in _SCHEMA_DATASETS or re.fullmatch(r"index\d+", name)):
                    del root[name]
        return root
    if replace and group in handle:
        del handle[group]
    return handle.require_group(group)


@contextmanager
def output_group(path, group="/", overwrite=False, mode="a"):
    """Yield the HDF5 group to fill at ``path:group``; the file appears complete or not at all.

    ``mode="a"`` adds the group to the file (see :func:`check_output_group`); ``mode="w"``
    writes a new file that replaces any file of that name.
    """
    from ._atomic import atomic_file
    path = os.fspath(path)
    state = "new" if mode == "w" else check_output_group(path, group, overwrite)
    with atomic_file(path, update=state != "new", replace=mode == "w") as out:
        yield _prepare_group(out.h5("w" if state == "new" else "a"), group, state == "replace")


def write_matrix(path, matrix, group="/", overwrite=False, mode="a"):
    """Write a :class:`CSRMatrix` in the input schema (gzip-compressed datasets), through a
    temporary file; an existing group is replaced only with ``overwrite``."""
    with output_group(path, group, overwrite, mode) as grp:
        grp.attrs["format"] = "csr"
        grp.attrs["shape"] = np.asarray(matrix.shape, dtype=np.int64)
        grp.attrs["symmetric"] = bool(matrix.symmetric)
        for name in ("indptr", "indices", "data"):
            array = np.asarray(getattr(matrix, name))
            grp.create_dataset(name, data=array, **_compressed(array))


def write_tensor(path, tensor, group="/", overwrite=False, mode="a"):
    """Write a :class:`COOTensor` in the input schema (``indices`` as an nnz x N array), through a
    temporary file; an existing group is replaced only with ``overwrite``."""
    with output_group(path, group, overwrite, mode) as grp:
        grp.attrs["format"] = "coo"
        grp.attrs["shape"] = np.asarray(tensor.shape, dtype=np.int64)
        smallest = np.int32 if max(tensor.shape) <= np.iinfo(np.int32).max else np.int64
        indices, values = tensor.indices.astype(smallest), np.asarray(tensor.values)
        grp.create_dataset("indices", data=indices, **_compressed(indices))
        grp.create_dataset("values", data=values, **_compressed(values))


def describe(path):
    """One line per matrix/tensor group in ``path``: what ``hisparse info`` prints. A group that
    does not follow the schema gets a line saying what is wrong with it."""
    lines = []
    if not os.path.exists(path):
        raise InputError(f"{path}: file not found")

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and "format" in obj.attrs:
            fmt = obj.attrs["format"]
            fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
            try:
                lines.append(f"/{name}: " + _describe_group(path, obj, fmt))
            except InputError as exc:
                lines.append(f"/{name}: malformed {fmt} group: {exc}".replace(f"{path}: ", ""))

    try:
        with h5py.File(path, "r") as handle:
            visit("", handle)
            handle.visititems(visit)
    except OSError as exc:
        raise InputError(f"{path}: not a readable HDF5 file ({exc})") from None
    lines = [line.replace("//", "/") for line in lines]
    return lines or [f"{path}: no hisparse matrix or tensor groups (attribute 'format' missing)"]


def _describe_group(path, grp, fmt):
    def member(name):
        if name not in grp or not isinstance(grp[name], h5py.Dataset):
            raise InputError(f"{path}: dataset '{name}' missing")
        return grp[name]

    if fmt == "csr":
        shape = _shape_attr(path, grp, order=2)
        indices, data, indptr = member("indices"), member("data"), member("indptr")
        if indptr.ndim != 1 or indptr.shape[0] != shape[0] + 1:
            raise InputError(f"{path}: indptr has shape {indptr.shape}, expected "
                             f"({shape[0] + 1},)")
        nnz = indices.shape[0] if indices.ndim else 0
        lengths = np.diff(indptr[()])
        return (f"CSR matrix {shape[0]} x {shape[1]}, nnz {nnz}, "
                f"{nnz / (shape[0] or 1):.2f} per row (max "
                f"{int(lengths.max()) if len(lengths) else 0}, empty rows "
                f"{int((lengths == 0).sum())}), "
                f"symmetric={bool(grp.attrs.get('symmetric', False))}, "
                f"values {data.dtype}, indices {indices.dtype}")
    if fmt == "coo":
        shape = _shape_attr(path, grp)
        values = member("values")
        nnz = values.shape[0] if values.ndim else 0
        dims = " x ".join(str(s) for s in shape)
        density = nnz / float(np.prod(np.asarray(shape, dtype=float))) if shape else 0
        return (f"COO tensor of order {len(shape)}, {dims}, nnz {nnz}, density {density:.3g}, "
                f"values {values.dtype}")
    raise InputError(f"{path}: unknown format {fmt!r} (expected 'csr' or 'coo')")
