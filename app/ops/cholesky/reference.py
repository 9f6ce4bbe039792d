"""The verification reference of the Cholesky operation, on the host in float64: the residual
``b - A x`` and the componentwise backward error of a solution, against A as given (no factor,
no ordering): what the driver's verification, the refinement of the CPU engine and the peers
measure a solution by."""
import numpy as np

from ...compiled import compiled_parallel, prange
from ...formats import balanced_row_cuts
from ...threads import usable_cores


@compiled_parallel
def _residual_rows(indptr, indices, data, x, b, cuts, residual, ratio):
    """Over the row blocks ``cuts`` (in parallel): ``residual = b - A x`` and ``ratio = |r| /
    (|A| |x| + |b|)`` per entry (inf where only the scale is 0, 0 where both are), in one pass
    over A's entries. Each row's sums run in entry order from 0, as SciPy's CSR product sums
    them (and |a_ij| |x_j| is |a_ij x_j| exactly), so the results are the two SciPy products'
    bit for bit."""
    for block in prange(len(cuts) - 1):
        for row in range(cuts[block], cuts[block + 1]):
            for column in range(b.shape[1]):
                product = 0.0
                scale = 0.0
                for entry in range(indptr[row], indptr[row + 1]):
                    term = data[entry] * x[indices[entry], column]
                    product += term
                    scale += abs(term)
                rest = b[row, column] - product
                scale += abs(b[row, column])
                residual[row, column] = rest
                if scale > 0:
                    ratio[row, column] = abs(rest) / scale
                elif rest != 0:
                    ratio[row, column] = np.inf
                else:
                    ratio[row, column] = 0.0


class ResidualOperator:
    """A in float64, made once, for repeated residuals of one matrix (the refinements measure
    one per factorization). Each residual is one compiled pass over A's entries, its row blocks
    on the process's cores (:func:`_residual_rows`); two threaded SciPy products (A x and
    |A| |x|) and four NumPy passes over the rows had taken 54 ms a rank on the 2000² grid at 4
    ranks sharing a 16-core host, and making |A| cost 15 times the products.

    Parameters
    ----------
    matrix : scipy.sparse matrix, shape (n, n), or a rank's rows (nrows, ncols)
    """

    #: Entries per row block of the compiled pass (several blocks per core, for balance).
    BLOCK_ENTRIES = 1 << 16

    def __init__(self, matrix):
        import scipy.sparse as sp
        a = sp.csr_matrix(matrix)
        if a.dtype != np.float64:
            a = a.astype(np.float64)
        self.a = a
        nblocks = max(1, min(8 * usable_cores(), -(-a.nnz // self.BLOCK_ENTRIES)))
        self.row_cuts = balanced_row_cuts(a.indptr, nblocks).astype(np.int64)

    def residual_error(self, x, b):
        """The residual ``b - A x`` (float64) and the componentwise backward error
        ``max_i |b - A x|_i / (|A| |x| + |b|)_i`` of ``x`` (worst entry over every column).

        Parameters
        ----------
        x : ndarray, shape (ncols, k) (any shape of that size)
        b : ndarray, shape (nrows, k) or (nrows,)
        """
        b = np.asarray(b)
        rhs = np.ascontiguousarray(b, dtype=np.float64).reshape(
            self.a.shape[0], b.shape[1] if b.ndim == 2 else 1)
        x = np.ascontiguousarray(x, dtype=np.float64).reshape(self.a.shape[1], rhs.shape[1])
        residual, ratio = np.empty_like(rhs), np.empty_like(rhs)
        _residual_rows(self.a.indptr, self.a.indices, self.a.data, x, rhs, self.row_cuts,
                       residual, ratio)
        return residual.reshape(b.shape), (float(ratio.max()) if ratio.size else 0.0)


def residual_error(matrix, x, b):
    """The residual ``b - A x`` (float64) and the componentwise backward error
    ``max_i |b - A x|_i / (|A| |x| + |b|)_i`` of ``x`` (worst entry over every column).

    Parameters
    ----------
    matrix : scipy.sparse matrix, shape (n, n)
    x, b : ndarray, shape (n, k) (x may be any shape of b's size)
    """
    return ResidualOperator(matrix).residual_error(x, b)


def backward_error(matrix, x, b):
    """Componentwise backward error max_i |b - A x|_i / (|A| |x| + |b|)_i (worst column)."""
    return residual_error(matrix, x, b)[1]
