"""Reading part of an HDF5 input group by hyperslab: some rows of a CSR group, a range of a COO
group's nonzeros. Plain file I/O on one rank, with :func:`~hisparse.io.read_matrix`'s and
:func:`~hisparse.io.read_tensor`'s checks and messages (which name the file and the global row,
entry or nonzero); which rank reads what is :mod:`hisparse.layout`'s business.
"""
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..arrays import min_max
from ..formats import CSRMatrix, first_non_finite
from ._hdf5 import (_canonical_rows, _open_group, _shape_attr, as_float_values, check_value_dtype,
                    read_range, require_dataset, require_index_columns)

#: Row pointers read per step of a scan of ``indptr`` (32 MiB of int64).
INDPTR_CHUNK = 1 << 22
#: Entries of ``indices``/``data`` read per step when the rows read are scattered.
ENTRY_CHUNK = 1 << 22
#: Nonzeros read per hyperslab step (a range is read in pieces of at most this many).
TENSOR_READ_CHUNK = 1 << 24


# -- a CSR group ----------------------------------------------------------------------------------

@dataclass
class CsrGroup:
    """A checked CSR group: where it is and what every rank can know of it without its
    arrays."""

    path: str
    group: str
    shape: tuple
    nnz: int
    symmetric: bool

    @property
    def label(self):
        return f"{self.path}:{self.group}"


def open_csr_group(path, group):
    """Check what every rank can check alike: the group, its datasets, their dtypes and lengths,
    and the first and last row pointers (messages as :func:`~hisparse.io.read_matrix`'s)."""
    handle, grp = _open_group(path, group)
    with handle:
        shape = _shape_attr(path, grp, order=2)
        indptr, indices, data = (require_dataset(path, grp, name)
                                 for name in ("indptr", "indices", "data"))
        if not np.issubdtype(indptr.dtype, np.integer) or \
                not np.issubdtype(indices.dtype, np.integer):
            raise InputError(f"{path}: indptr and indices must be integer datasets")
        label = f"{path}:{group}"
        for name, dataset in (("indptr", indptr), ("indices", indices), ("data", data)):
            if dataset.ndim != 1:
                raise InputError(f"{label}: {name} must be 1-D, got shape {dataset.shape}")
        m = shape[0]
        if indptr.shape[0] != m + 1:
            raise InputError(f"{label}: indptr has length {indptr.shape[0]}, expected m + 1 = "
                             f"{m + 1}")
        if indices.shape[0] != data.shape[0]:
            raise InputError(f"{label}: indices has length {indices.shape[0]} but data has "
                             f"{data.shape[0]}")
        nnz = int(indices.shape[0])
        first, last = int(indptr[0]), int(indptr[m])
        if first != 0 or last != nnz:
            raise InputError(f"{label}: indptr must start at 0 and end at nnz = {nnz}, got "
                             f"{first} .. {last}")
        check_value_dtype(data.dtype, label)
        symmetric = bool(grp.attrs.get("symmetric", False))
    return CsrGroup(path, group, shape, nnz, symmetric)


def indptr_chunks(csr, lo, hi):
    """``indptr[lo:hi + 1]`` read in chunks of :data:`INDPTR_CHUNK` rows, checked never to
    decrease: yields ``(c0, pointers)``, the int64 pointers of rows ``c0 .. c1`` (one more than
    the chunk's rows, so consecutive chunks overlap by one)."""
    handle, grp = _open_group(csr.path, csr.group)
    with handle:
        dataset = grp["indptr"]
        for c0 in range(lo, hi, INDPTR_CHUNK):
            c1 = min(c0 + INDPTR_CHUNK, hi)
            pointers = dataset[c0:c1 + 1].astype(np.int64)
            steps = np.diff(pointers)
            if len(steps) and steps.min() < 0:
                raise InputError(f"{csr.label}: indptr decreases at row "
                                 f"{c0 + int(np.argmax(steps < 0))}")
            yield c0, pointers


def row_extents(csr, lo, hi):
    """Starts and lengths (int64) of rows ``lo:hi`` (one hyperslab of ``indptr``)."""
    handle, grp = _open_group(csr.path, csr.group)
    with handle:
        pointers = grp["indptr"][lo:hi + 1].astype(np.int64)
    return pointers[:-1], np.diff(pointers)


def sample_row_columns(csr, rows):
    """The column indices (int64) of each of ``rows``, read from ``indices`` alone, a hyperslab
    a row: a look at a few rows before the read (where a rank's rows reach), not a checked
    read (:func:`read_csr_rows` checks what it returns)."""
    handle, grp = _open_group(csr.path, csr.group)
    out = []
    with handle:
        indptr, indices = grp["indptr"], grp["indices"]
        for row in np.asarray(rows, dtype=np.int64).tolist():
            lo, hi = (int(v) for v in indptr[row:row + 2])
            out.append(np.asarray(indices[lo:max(lo, hi)], dtype=np.int64))
    return out


def _read_entries(csr, starts, lengths):
    """The entries of rows given by their ``starts`` and ``lengths`` (ascending, disjoint), read
    by hyperslab over the ranges that cover them, at most :data:`ENTRY_CHUNK` entries at a time.

    Returns
    -------
    indices, data : ndarray
    positions : callable
        Local entry number -> global entry number (for messages).
    """
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    total = int(indptr[-1])
    handle, grp = _open_group(csr.path, csr.group)
    with handle:
        source_indices, source_data = grp["indices"], grp["data"]
        if len(starts) and total == int(starts[-1] + lengths[-1] - starts[0]):
            # Contiguous rows: one slice.
            lo = int(starts[0])
            return (read_range(source_indices, lo, lo + total),
                    read_range(source_data, lo, lo + total), lambda local: lo + local)
        wanted = np.repeat(np.asarray(starts, dtype=np.int64) - indptr[:-1], lengths) + \
            np.arange(total, dtype=np.int64)  # global entry of each local entry, ascending
        indices = np.empty(total, dtype=source_indices.dtype)
        data = np.empty(total, dtype=source_data.dtype)
        done = 0
        while done < total:
            # The next range starts at the first entry still wanted: gaps (other ranks' rows
            # longer than a chunk) are skipped, not read.
            c0 = int(wanted[done])
            c1 = min(c0 + ENTRY_CHUNK, csr.nnz)
            stop = int(np.searchsorted(wanted, c1, side="left"))
            take = wanted[done:stop] - c0
            indices[done:stop] = read_range(source_indices, c0, c1)[take]
            data[done:stop] = read_range(source_data, c0, c1)[take]
            done = stop
    return indices, data, lambda local: int(wanted[local])


def _checked_rows(csr, rows, indptr, indices, data, positions, duplicates):
    """Validate some rows as :meth:`CSRMatrix.validate` validates the whole matrix (the messages
    name global entries and rows), then sort and merge them as :func:`~hisparse.io.read_matrix`
    does."""
    label, ncols = csr.label, csr.shape[1]
    data = as_float_values(data)
    if len(indices):
        low, high = (int(bound) for bound in min_max(indices))
        if low < 0 or high >= ncols:
            bad = int(np.argmax((indices < 0) | (indices >= ncols)))
            row = int(rows[np.searchsorted(indptr, bad, side="right") - 1])
            raise InputError(f"{label}: column index {int(indices[bad])} out of range "
                             f"[0, {ncols}) at entry {positions(bad)} (row {row})")
    bad = first_non_finite(label, data)
    if bad is not None:
        row = int(rows[np.searchsorted(indptr, bad, side="right") - 1])
        raise InputError(f"{label}: value {data[bad]} (NaN/Inf) at entry {positions(bad)} "
                         f"(row {row}, column {int(indices[bad])})")
    block = CSRMatrix(indptr, indices, data, (len(rows), ncols), csr.symmetric)
    return _canonical_rows(block, csr.path, duplicates, row_ids=rows)


def read_csr_rows(csr, rows, starts, lengths, duplicates):
    """The rows ``rows`` (global ids, ascending) of the group, whose entries start at ``starts``
    and number ``lengths``: a :class:`~hisparse.formats.CSRMatrix` of ``len(rows)`` rows,
    checked, columns sorted and duplicates summed or rejected (``duplicates``)."""
    indices, data, positions = _read_entries(csr, starts, lengths)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return _checked_rows(csr, rows, indptr, indices, data, positions, duplicates)


# -- a COO group ----------------------------------------------------------------------------------

@dataclass
class CooGroup:
    """A checked COO group (see :class:`CsrGroup`)."""

    path: str
    group: str
    shape: tuple
    nnz: int
    per_mode: bool  # index0 .. index{N-1} instead of one (nnz, N) dataset

    @property
    def label(self):
        return f"{self.path}:{self.group}"


def open_coo_group(path, group):
    """Check what every rank can check alike (the group, its datasets, their dtypes and shapes),
    with :func:`~hisparse.io.read_tensor`'s messages."""
    handle, grp = _open_group(path, group)
    with handle:
        shape = _shape_attr(path, grp)
        label = f"{path}:{group}"
        if len(shape) < 2:
            raise InputError(f"{label}: order {len(shape)} < 2")
        values = require_dataset(path, grp, "values")
        if "indices" in grp:
            per_mode, index_sets = False, [grp["indices"]]
            indices = grp["indices"]
            if indices.ndim != 2 or indices.shape[1] != len(shape):
                raise InputError(f"{label}: indices has shape {indices.shape}, expected "
                                 f"(nnz, {len(shape)})")
            count = indices.shape[0]
        else:
            names = require_index_columns(path, grp, len(shape))
            per_mode, index_sets = True, [grp[n] for n in names]
            lengths = {n: grp[n].shape for n in names}
            if len(set(lengths.values())) != 1 or index_sets[0].ndim != 1:
                listed = ", ".join(f"{n} {s}" for n, s in lengths.items())
                raise InputError(f"{path}: per-mode index datasets must be 1-D and of one "
                                 f"length; got {listed}")
            count = index_sets[0].shape[0]
        for dataset in index_sets:
            if not np.issubdtype(dataset.dtype, np.integer):
                raise InputError(f"{path}: tensor indices must be integers, got {dataset.dtype}")
        if values.ndim != 1:
            raise InputError(f"{label}: values must be 1-D (one per nonzero), got shape "
                             f"{values.shape}")
        if values.shape[0] != count:
            raise InputError(f"{label}: {count} coordinates but {values.shape[0]} values")
        check_value_dtype(values.dtype, label)
    return CooGroup(path, group, shape, int(count), per_mode)


def read_coo_range(coo, lo, hi):
    """Nonzeros ``lo:hi`` of the group by hyperslab (in pieces of :data:`TENSOR_READ_CHUNK`),
    checked as :meth:`COOTensor.validate` checks the whole tensor: the messages name the file and
    the nonzero's position in it. Returns ``indices`` (int64, (hi - lo, N)) and ``values``."""
    order = len(coo.shape)
    indices = np.empty((hi - lo, order), dtype=np.int64)
    handle, grp = _open_group(coo.path, coo.group)
    with handle:
        values = read_range(grp["values"], lo, hi)
        for c0 in range(lo, hi, TENSOR_READ_CHUNK):
            c1 = min(c0 + TENSOR_READ_CHUNK, hi)
            if coo.per_mode:
                for m in range(order):
                    indices[c0 - lo:c1 - lo, m] = read_range(grp[f"index{m}"], c0, c1)
            else:
                indices[c0 - lo:c1 - lo] = read_range(grp["indices"], c0, c1)
    values = as_float_values(values)
    for mode, size in enumerate(coo.shape):
        column = indices[:, mode]
        if len(column) and (column.min() < 0 or column.max() >= size):
            bad = int(np.argmax((column < 0) | (column >= size)))
            raise InputError(f"{coo.label}: index {int(column[bad])} out of range [0, {size}) "
                             f"in mode {mode} at nonzero {lo + bad}")
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(np.argmin(finite))
        raise InputError(f"{coo.label}: value {values[bad]} (NaN/Inf) at nonzero {lo + bad} "
                         f"(coordinates {tuple(int(i) for i in indices[bad])})")
    return indices, values
