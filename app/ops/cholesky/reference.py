"""The verification reference of the Cholesky operation, on the host in float64: the residual
``b - A x`` and the componentwise backward error of a solution, against A as given (no factor,
no ordering): what the driver's verification, the refinement of the CPU engine and the peers
measure a solution by."""
import numpy as np


def residual_error(matrix, x, b):
    """The residual ``b - A x`` (float64) and the componentwise backward error
    ``max_i |b - A x|_i / (|A| |x| + |b|)_i`` of ``x`` (worst entry over every column).

    Parameters
    ----------
    matrix : scipy.sparse matrix, shape (n, n)
    x, b : ndarray, shape (n, k) (x may be any shape of b's size)
    """
    a64 = matrix.astype(np.float64)
    x = np.asarray(x, dtype=np.float64).reshape(b.shape)
    residual = b - a64 @ x
    scale = abs(a64) @ np.abs(x) + np.abs(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale > 0, np.abs(residual) / scale,
                         np.where(residual != 0, np.inf, 0.0))
    return residual, (float(ratio.max()) if ratio.size else 0.0)


def backward_error(matrix, x, b):
    """Componentwise backward error max_i |b - A x|_i / (|A| |x| + |b|)_i (worst column)."""
    return residual_error(matrix, x, b)[1]
