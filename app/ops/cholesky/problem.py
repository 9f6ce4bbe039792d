"""The problems the Cholesky operation solves and its benchmarks build: the right-hand sides
(:func:`make_rhs`, with the known solution where there is one) and the shifted graph Laplacian
that stands in for circuit matrices (:func:`shifted_laplacian`, written to an input file by
:func:`write_shifted_laplacian`)."""
import numpy as np


def make_rhs(matrix, kind, nrhs, seed):
    """Right-hand sides b, shape (n, nrhs) float64, and the known solution (or None).

    Parameters
    ----------
    matrix : scipy.sparse matrix, shape (n, n)
    kind : {"random_x", "ones_x", "ones", "unit"}
    """
    n = matrix.shape[0]
    if kind == "ones":
        return np.ones((n, nrhs)), None
    if kind == "unit":
        b = np.zeros((n, nrhs))
        b[0] = 1.0  # x[0] is then inv(A)[0, 0]
        return b, None
    if kind == "ones_x":
        x_true = np.ones((n, nrhs))
    else:
        x_true = np.random.default_rng(seed).uniform(-1.0, 1.0, (n, nrhs))
    # copy=False: SciPy's astype copies a float64 matrix whole by default (its first touch was
    # 0.4-0.7 s of a 2000^2 grid's 0.45-0.75 s here on the development host, against 0.03 s
    # for the product)
    return np.asarray(matrix.astype(np.float64, copy=False) @ x_true), x_true


def shifted_laplacian(graph, shift):
    """The graph Laplacian D - W of a graph's adjacency pattern (symmetrised, unit weights, no
    self loops) plus ``shift`` I: SPD for shift > 0. The benchmarks' stand-in for circuit
    matrices (sparse, nearly planar networks), e.g. on ``luxembourg_osm``.

    Parameters
    ----------
    graph : scipy.sparse matrix, shape (n, n)
    shift : float

    Returns
    -------
    scipy.sparse.csr_matrix, float64
    """
    import scipy.sparse as sp
    adjacency = sp.csr_matrix(graph, dtype=np.float64)
    adjacency = (adjacency + adjacency.T).tocsr()
    adjacency.setdiag(0)
    adjacency.eliminate_zeros()
    adjacency.data[:] = 1.0
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    return sp.csr_matrix(sp.diags(degree + shift) - adjacency)


def write_shifted_laplacian(source, output, shift=0.01):
    """Write :func:`shifted_laplacian` of a Matrix Market graph (``.mtx`` or ``.mtx.gz``) to an
    HDF5 input file, e.g. ``write_shifted_laplacian("../shared/data/matrices/graphs/
    luxembourg_osm.mtx.gz", "data/luxembourg_laplacian.h5")``."""
    import scipy.io
    from ...formats import CSRMatrix
    from ...io import write_matrix
    laplacian = shifted_laplacian(scipy.io.mmread(str(source)), shift)
    write_matrix(output, CSRMatrix.from_scipy(laplacian, symmetric=True), overwrite=True)
