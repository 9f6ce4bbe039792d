"""Peer baselines of CP-ALS's MTTKRP, timed over the same number of MTTKRPs as one repetition
(cycling over the modes): cuSPARSE SpMM through CuPy, and the host NumPy MTTKRP."""
import numpy as np

from ...errors import HisparseError
from ...timing import time_on_host
from .cpu import numpy_mttkrp


def cusparse_mttkrp_peer(full_csrs, factors, count, repeats, check=None):
    """MTTKRP as cuSPARSE SpMM through CuPy: X_(n) (distinct columns only) times the rows of the
    Khatri-Rao product for those columns, formed per call by gathering factor rows.

    Parameters
    ----------
    full_csrs : list of ModeCSR
        The whole unfolding of every mode.
    factors : list of ndarray, shape (I_m, R)
    count : int
        MTTKRPs per repeat (cycling over the modes), to match one of our repetitions.
    check : tuple (mode, ndarray) or None
        Our MTTKRP of ``mode`` with ``factors``, compared with the peer's.

    Returns
    -------
    dict
        ``seconds`` per repeat and attributes.
    """
    from ...gpu import import_cupy_sparse, release_pool, time_with_events
    cupy, csp = import_cupy_sparse("peer 'cusparse'")
    dtype = factors[0].dtype
    d_factors = [cupy.asarray(f) for f in factors]
    plans = []
    for csr in full_csrs:
        sizes = [int(factors[m].shape[0]) for m in csr.other_modes]
        if float(np.prod(sizes, dtype=np.float64)) >= 2.0 ** 62:
            raise HisparseError("peer 'cusparse': unfolding column ids overflow int64")
        other = cupy.asarray(csr.other_idx).astype(cupy.int64)
        key = other[0]
        for j in range(1, len(sizes)):
            key = key * sizes[j] + other[j]
        del other
        unique, columns = cupy.unique(key, return_inverse=True)
        del key
        coords = []
        rest = unique
        for j in reversed(range(len(sizes))):
            coords.append((rest % sizes[j]).astype(cupy.int32))
            rest = rest // sizes[j]
        coords.reverse()
        matrix = csp.csr_matrix((cupy.asarray(csr.values, dtype=dtype),
                                 columns.astype(cupy.int32).ravel(),
                                 cupy.asarray(csr.indptr).astype(cupy.int32)),
                                shape=(csr.n_rows, int(len(unique))))
        plans.append((csr.other_modes, coords, matrix))

    def one(n):
        modes, coords, matrix = plans[n]
        krp = d_factors[modes[0]][coords[0]]
        for m, c in zip(modes[1:], coords[1:]):
            krp *= d_factors[m][c]
        return matrix @ krp

    attrs = {}
    if check is not None:
        mode, ours = check
        theirs = cupy.asnumpy(one(mode))
        scale = float(np.abs(theirs).max()) or 1.0
        attrs["max_rel_diff_vs_ours"] = float(np.abs(theirs - ours).max() / scale)
    order = len(plans)
    for n in range(order):
        one(n)  # warm-up: cuSPARSE handles and buffers

    def mttkrps():
        for call in range(count):
            one(call % order)

    seconds = time_with_events(mttkrps, repeats)
    plans.clear()
    d_factors.clear()
    release_pool()
    import cupy.cuda.runtime as rt
    return dict(attrs, seconds=seconds, device="gpu", library=f"cupy {cupy.__version__}",
                mttkrps_per_repeat=count, cuda_runtime=rt.runtimeGetVersion())


def numpy_mttkrp_peer(full_csrs, factors, count, repeats):
    """MTTKRP with NumPy on the host (one process), ``count`` calls per repeat."""
    rank = factors[0].shape[1]

    def mttkrps():
        for call in range(count):
            numpy_mttkrp(full_csrs[call % len(full_csrs)], factors, rank)

    seconds = time_on_host(mttkrps, repeats)
    return {"seconds": seconds, "device": "cpu", "mttkrps_per_repeat": count}
