"""The verification reference of CP-ALS: a plain NumPy CP-ALS with the Tensor Toolbox rules,
its MTTKRP straight from the COO coordinates (compiled), independent of the engines."""
import numpy as np

from ...compiled import compiled_parallel, prange

def coo_rows(values, subs, n, size):
    """The nonzeros (``values``, ``subs``) grouped by their mode-``n`` index, in their own order
    within a group (a stable sort): ``(row pointers, values, subs)``, for :func:`coo_mttkrp`."""
    order = np.argsort(subs[:, n], kind="stable")
    pointers = np.zeros(int(size) + 1, dtype=np.int64)
    np.cumsum(np.bincount(subs[:, n], minlength=int(size)), out=pointers[1:])
    return pointers, values[order], np.ascontiguousarray(subs[order])


@compiled_parallel
def _coo_mttkrp_rows(pointers, values, subs, factors, others, out):
    """Row ``i`` of the MTTKRP: the sum, in the nonzeros' order, of value x the other modes'
    factor rows (multiplied in mode order), rows on every core."""
    rank = out.shape[1]
    for row in prange(len(pointers) - 1):
        term = np.empty(rank)
        for j in range(pointers[row], pointers[row + 1]):
            term[:] = values[j]
            for m in others:
                factor_row = factors[m][subs[j, m]]
                for r in range(rank):
                    term[r] *= factor_row[r]
            for r in range(rank):
                out[row, r] += term[r]


def coo_mttkrp(by_row, factors, n):
    """The mode-``n`` MTTKRP of a COO tensor from ``by_row`` (its :func:`coo_rows` for mode n),
    fp64: the same sums, in the same order, as the sparse indicator product
    ``csr(ones, (subs[:, n], arange(nnz))) @ (values x the other factors' rows)``."""
    pointers, values, subs = by_row
    out = np.zeros((len(pointers) - 1, factors[0].shape[1]))
    others = np.array([m for m in range(len(factors)) if m != n], dtype=np.int64)
    _coo_mttkrp_rows(pointers, values, subs,
                     tuple(np.ascontiguousarray(f, dtype=np.float64) for f in factors), others, out)
    return out


def numpy_cp_als(tensor, factors, rank, tol, max_iters, fits_done=(), grams=None):
    """Plain NumPy CP-ALS with the Tensor Toolbox rules, the verification reference.

    Independent of the engines: MTTKRP straight from the COO coordinates (each row's nonzeros
    added in their order, :func:`coo_mttkrp`, compiled), ``np.linalg.solve`` as pyttb does,
    fp64 throughout.

    Parameters
    ----------
    tensor : COOTensor
    factors : list of ndarray, shape (I_m, R)
        Initial factors (the first mode's is not read).
    fits_done, grams : optional
        When continuing a checkpointed run: the fits of the iterations already done and the
        saved Grams (R x R each) of ``factors``.

    Returns
    -------
    dict
        ``fits`` (list of float), ``lam`` (R,), ``factors`` (list of (I_m, R)).
    """
    order = tensor.order
    values = np.ascontiguousarray(tensor.values, dtype=np.float64)
    subs = np.ascontiguousarray(tensor.indices, dtype=np.int64)
    norm_x = float(np.sqrt(np.sum(values * values)))
    factors = [np.array(f, dtype=np.float64) for f in factors]
    grams = [f.T @ f for f in factors] if grams is None else [np.array(g) for g in grams]
    by_row = [coo_rows(values, subs, n, tensor.shape[n]) for n in range(order)]
    fits = [float(f) for f in fits_done]
    fit, lam = (fits[-1] if fits else 0.0), np.ones(rank)
    for iteration in range(len(fits), max_iters):
        fit_old = fit
        for n in range(order):
            mttkrp = coo_mttkrp(by_row[n], factors, n)
            v = np.ones((rank, rank))
            for m in range(order):
                if m != n:
                    v = v * grams[m]
            unew = np.linalg.solve(v.T, mttkrp.T).T
            if iteration == 0:
                lam = np.sqrt(np.sum(unew ** 2, axis=0))
            else:
                lam = np.maximum(np.max(np.abs(unew), axis=0), 1.0)
            factors[n] = unew / lam
            grams[n] = factors[n].T @ factors[n]
        hadamard = np.ones((rank, rank))
        for g in grams:
            hadamard = hadamard * g
        norm_m2 = float(lam @ hadamard @ lam)
        inner = float(np.sum(lam * np.sum(factors[-1] * mttkrp, axis=0)))
        residual = np.sqrt(abs(norm_x ** 2 + norm_m2 - 2.0 * inner))
        fit = 1.0 - residual / norm_x if norm_x > 0 else 0.0
        fits.append(fit)
        if iteration > 0 and abs(fit - fit_old) < tol:
            break
    return {"fits": fits, "lam": lam, "factors": factors}


def resumed_reference(problem, start, rank, params):
    """Reference fits of a resumed run: the saved fits, then NumPy from the saved state."""
    done = list(start["fits"])
    if len(done) >= params["max_iters"] or (len(done) >= 2 and
                                             abs(done[-1] - done[-2]) < params["tol"]):
        return {"fits": np.asarray(done)}
    out = numpy_cp_als(problem, start["factors"], rank, params["tol"], params["max_iters"],
                       fits_done=done, grams=start["grams"])
    return {"fits": np.asarray(out["fits"])}
