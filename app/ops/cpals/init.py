"""CP-ALS initial factors: ``random`` (from run.seed), ``nvecs`` (the leading left singular
vectors of every unfolding) or read from ``FILE.h5[:/group]``."""
import numpy as np

from ...errors import InputError
from ...io import hdf5_reference_check, open_member, split_hdf5_reference

#: Config check of ``operation.params.init``.
init_check = hdf5_reference_check(
    ("random", "nvecs"), "'random', 'nvecs' or 'FILE.h5[:/group]' holding factor_0..factor_{N-1}",
    inner_required=False)


def random_factors(shape, rank, seed, dtype=np.float64):
    """Uniform [0, 1) factors from ``seed`` (Tensor Toolbox / pyttb 'random'), one per mode.

    The first mode's factor is generated too, though CP-ALS never reads it (it is solved first).
    """
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.0, 1.0, size=(int(size), rank)).astype(dtype) for size in shape]


def nvecs_factors(tensor, rank, dtype=np.float64):
    """Leading ``rank`` left singular vectors of each unfolding (Tensor Toolbox 'nvecs').

    Eigenvectors of X_(n) X_(n)^T for the ``rank`` largest eigenvalues, sign fixed so that the
    largest-magnitude entry of each vector is positive (TTB ``nvecs`` flips this way; the first
    such entry where several tie). Computed from the whole tensor (rank 0 holds it for this
    init), so every rank count starts from the same bits; C-ordered, as the engines' in-place
    row all-gathers need.
    """
    factors = []
    for mode, size in enumerate(tensor.shape):
        if rank > size:
            raise InputError(f"init 'nvecs' needs rank <= every mode length; mode {mode} has "
                             f"{size} < rank {rank}")
        vecs = _leading_eigenvectors(_unfolding_gram(tensor, mode), rank)
        biggest = np.argmax(np.abs(vecs), axis=0)
        signs = np.sign(vecs[biggest, np.arange(rank)])
        signs[signs == 0] = 1.0
        factors.append(np.ascontiguousarray(vecs * signs, dtype=dtype))
    return factors


def _unfolding_gram(tensor, mode):
    """X_(n) X_(n)^T (sparse, fp64), the unfolding's columns compressed to the distinct ones."""
    import scipy.sparse as sp
    size = int(tensor.shape[mode])
    others = [m for m in range(tensor.order) if m != mode]
    _, columns = np.unique(tensor.indices[:, others], axis=0, return_inverse=True)
    unfolding = sp.csr_matrix((tensor.values.astype(np.float64),
                               (tensor.indices[:, mode], columns.ravel())),
                              shape=(size, int(columns.max()) + 1 if len(columns) else 1))
    return (unfolding @ unfolding.T).tocsr()


def _leading_eigenvectors(gram, rank):
    """Eigenvectors of the symmetric ``gram`` for its ``rank`` largest eigenvalues, largest
    first: dense LAPACK for small or nearly full problems, else ARPACK from a fixed start (its
    default start is random, which would make the factors differ from run to run)."""
    size = gram.shape[0]
    if size <= 2000 or rank >= size - 1:
        w, v = np.linalg.eigh(gram.toarray())
        return v[:, np.argsort(w, kind="stable")[::-1][:rank]]
    import scipy.sparse.linalg as spla
    w, v = spla.eigsh(gram.astype(np.float64), k=rank, which="LA",
                      v0=np.full(size, 1.0 / np.sqrt(size)))
    return v[:, np.argsort(w, kind="stable")[::-1]]


def read_factor_file(spec, shape, rank, dtype=np.float64):
    """Factors from ``FILE.h5`` or ``FILE.h5:/group`` (datasets ``factor_0`` .. ``factor_{N-1}``,
    e.g. the ``/result`` group of an earlier results file)."""
    import h5py
    path, group = split_hdf5_reference(spec)
    factors = []
    try:
        with h5py.File(path, "r") as handle:
            grp = open_member(handle, path, group, "group", "operation.params.init")
            for mode, size in enumerate(shape):
                name = f"factor_{mode}"
                if name not in grp:
                    raise InputError(f"{path}:{group}: dataset '{name}' (operation.params.init) "
                                     f"not found")
                array = np.asarray(grp[name][()])
                if array.shape != (size, rank):
                    raise InputError(f"{path}:{group}/{name} has shape {array.shape}, expected "
                                     f"({size}, {rank}) for mode {mode} at rank {rank}")
                if not np.isfinite(array).all():
                    raise InputError(f"{path}:{group}/{name} holds NaN/Inf")
                factors.append(array.astype(dtype))
    except OSError as exc:
        raise InputError(f"{path}: cannot read initial factors ({exc})") from None
    return factors
