"""Verification of a C that stays distributed: per-row checksums and sampled rows.

When C is not gathered to rank 0 (``keep_distributed``, or verification off and C too large for
``/result``), each rank brings back, for its rows of C,

- the row counts (exact: the structure is deterministic),
- the row sums of the values (a wrong value changes its row's sum),
- the row sums weighted by a pseudo-random weight in [1, 2) of each entry's column
  (:func:`column_weights`; a value moved to a wrong column changes it),

computed where C is (the GPU engine has a kernel for them, ``row_checksums`` in
``kernels_cu/spgemm_hash.cu``, with the same weights), and a few whole rows (evenly spaced and the
longest). Rank 0 checks them against SciPy without forming C: the reference sums are two sparse
matrix-vector products, ``A (B 1)`` and ``A (B w)``; the row counts come from the product of the
patterns of A and B in row chunks (no cancellation, as the kernels keep structural entries); the
sampled rows from ``A[rows] B``.
"""
import numpy as np

from ...arrays import sorted_distinct
from ...formats import CSRMatrix

#: products per row chunk of the pattern product that counts the reference's entries per row
PATTERN_CHUNK_PRODUCTS = 50_000_000


def row_value_sums(indptr, data):
    """Sum of each row's values, float64, shape (len(indptr) - 1,) (one bincount; not
    :func:`hisparse.formats.row_sums`, which adds any per-entry terms on several threads)."""
    lengths = np.diff(np.asarray(indptr, dtype=np.int64))
    rows = np.repeat(np.arange(len(lengths)), lengths)
    return np.bincount(rows, weights=np.asarray(data, dtype=np.float64), minlength=len(lengths))


def column_weights(columns):
    """Weight of each column index in the weighted row sums: ``1 + (h(j) >> 8) / 2**24`` with h
    the 32-bit MurmurHash3 finaliser of ``j`` (mod 2**32), exactly as the device computes it
    (``column_weight`` in ``kernels_cu/spgemm_hash.cu``); float64 in [1, 2)."""
    h = np.asarray(columns).astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return 1.0 + (h >> np.uint32(8)).astype(np.float64) * (1.0 / 16777216.0)


def host_checksums(indptr, indices, data):
    """``(row_nnz int64, row_sums, row_weighted_sums)`` of a CSR block held on the host."""
    weighted = np.asarray(data, dtype=np.float64) * column_weights(indices)
    return np.diff(np.asarray(indptr, np.int64)), row_value_sums(indptr, data), \
        row_value_sums(indptr, weighted)


def sample_positions(row_nnz, count):
    """Local rows brought back whole: ``count - 1`` evenly spaced rows and the longest one,
    ascending and distinct (fewer when the block has fewer rows)."""
    n = len(row_nnz)
    if n == 0 or count <= 0:
        return np.zeros(0, np.int64)
    spread = np.linspace(0, n - 1, num=count - 1).round().astype(np.int64)
    return sorted_distinct(np.concatenate([spread, [np.argmax(row_nnz)]]).astype(np.int64))


def row_spans(indptr, positions):
    """Where rows ``positions`` of a CSR block start (int64), and their own row pointers once
    taken out (int64, ``len(positions) + 1``)."""
    indptr = np.asarray(indptr, np.int64)
    positions = np.asarray(positions, np.int64)
    starts = indptr[positions]
    taken = np.zeros(len(positions) + 1, np.int64)
    np.cumsum(indptr[positions + 1] - starts, out=taken[1:])
    return starts, taken


def take_rows(indptr, indices, data, positions):
    """Rows ``positions`` of a host CSR block: ``(indptr int64, indices, data)``."""
    # CSRMatrix.rows does the gather; the column count plays no part in it.
    rows = CSRMatrix(np.asarray(indptr), indices, data, (len(indptr) - 1, 0)).rows(positions)
    return rows.indptr.astype(np.int64), rows.indices, rows.data


def _pattern(matrix):
    import scipy.sparse as sp
    return sp.csr_matrix((np.ones(matrix.nnz), matrix.indices, matrix.indptr),
                         shape=matrix.shape)


def structural_row_counts(a, b, products):
    """Entries of each row of A B counting every column some product reaches (cancelled sums
    included), from the product of the patterns in row chunks of bounded products.

    Parameters
    ----------
    a, b : scipy.sparse.csr_matrix
    products : ndarray of int64
        Intermediate products of each row of A B (bound the chunks' work and memory).
    """
    pattern_a, pattern_b = _pattern(a), _pattern(b)
    before = np.zeros(a.shape[0] + 1, np.int64)  # products of the rows before each row
    np.cumsum(products, out=before[1:])
    counts = np.zeros(a.shape[0], np.int64)
    start = 0
    while start < a.shape[0]:
        stop = int(np.searchsorted(before, before[start] + PATTERN_CHUNK_PRODUCTS,
                                   side="right")) - 1
        stop = min(max(stop, start + 1), a.shape[0])
        counts[start:stop] = np.diff((pattern_a[start:stop] @ pattern_b).indptr)
        start = stop
    return counts


def reference_checksums(a, b, products, sample_rows):
    """What :func:`checksum_errors` compares a distributed C with (rank 0, float64).

    Parameters
    ----------
    a, b : scipy.sparse.csr_matrix
        float64 operands.
    products : ndarray of int64
        Intermediate products of each row of A B.
    sample_rows : ndarray of int64
        Global rows brought back whole.

    Returns
    -------
    dict
        ``row_nnz``; ``row_sums`` = A (B 1) and ``row_weighted_sums`` = A (B w) with their
        rounding scales ``|A| (|B| 1)`` and ``|A| (|B| w)``; the sampled rows of A B and of its
        pattern (``sample``, ``sample_pattern``) and of ``|A| |B|`` (``sample_bound``).
    """
    weights = column_weights(np.arange(b.shape[1]))
    abs_a, abs_b = abs(a), abs(b)
    ones = np.ones(b.shape[1])
    a_rows = a[sample_rows]
    sample_pattern = (_pattern(a_rows) @ _pattern(b)).tocsr()
    sample_pattern.sort_indices()
    sample = (a_rows @ b).tocsr()
    sample.sort_indices()
    return {"row_nnz": structural_row_counts(a, b, products),
            "row_sums": a @ (b @ ones), "row_sums_scale": abs_a @ (abs_b @ ones),
            "row_weighted_sums": a @ (b @ weights),
            "row_weighted_sums_scale": abs_a @ (abs_b @ weights),
            "sample_rows": np.asarray(sample_rows, np.int64), "sample": sample,
            "sample_pattern": sample_pattern, "sample_bound": (abs(a_rows) @ abs_b).tocsr()}


def _normwise(values, reference, scale):
    if len(reference) == 0:
        return 0.0
    top = float(np.max(scale))
    return float(np.max(np.abs(np.asarray(values) - reference)) / (top if top > 0 else 1.0))


def checksum_errors(result, reference):
    """Errors of a distributed C's checksums and sampled rows against :func:`reference_checksums`.

    Returns
    -------
    dict of str -> float
        ``row_nnz`` (0 or inf), ``row_sums`` and ``row_weighted_sums`` (max difference over the
        rows / the largest rounding scale of a row), ``sampled_rows`` (inf when a sampled row's
        columns differ from the reference pattern's, else max difference / the largest entry of
        ``|A| |B|`` in those rows).
    """
    errors = {"row_nnz": 0.0 if np.array_equal(result["row_nnz"], reference["row_nnz"])
              else float("inf")}
    for name in ("row_sums", "row_weighted_sums"):
        errors[name] = _normwise(result[name], reference[name], reference[f"{name}_scale"])
    errors["sampled_rows"] = _sampled_rows_error(result, reference)
    return errors


def _sampled_rows_error(result, reference):
    if not np.array_equal(result["sample_rows"], reference["sample_rows"]):
        return float("inf")
    pattern, sample = reference["sample_pattern"], reference["sample"]
    indptr = np.asarray(result["sample_indptr"], np.int64)
    if not np.array_equal(indptr, pattern.indptr) or \
            not np.array_equal(np.asarray(result["sample_indices"], np.int64),
                               pattern.indices.astype(np.int64)):
        return float("inf")
    # The reference values at the pattern's columns (SciPy drops entries that cancel to zero).
    expected = np.zeros(len(pattern.indices))
    for row in range(pattern.shape[0]):
        lo, hi = pattern.indptr[row], pattern.indptr[row + 1]
        columns = sample.indices[sample.indptr[row]:sample.indptr[row + 1]]
        where = lo + np.searchsorted(pattern.indices[lo:hi], columns)
        expected[where] = sample.data[sample.indptr[row]:sample.indptr[row + 1]]
    bound = reference["sample_bound"].data
    return _normwise(np.asarray(result["sample_data"], np.float64), expected,
                     bound if len(bound) else np.zeros(1))
