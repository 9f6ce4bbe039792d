"""Dense input vectors given by a short spec in ``operation.params`` (shared by the operations
that multiply by a vector)."""
import numpy as np

from ..errors import InputError
from ..io import hdf5_reference_check, open_member, split_hdf5_reference


#: Config check of a vector spec: ``random``, ``ones`` or ``FILE.h5:/dataset``.
vector_spec_check = hdf5_reference_check(("random", "ones"),
                                         "'random', 'ones' or 'FILE.h5:/dataset'")


def make_vector(spec, size, dtype, seed, name="x", what="the matrix's columns"):
    """Build the vector a spec describes.

    Parameters
    ----------
    spec : str
        ``random`` (uniform in [-1, 1) from ``seed``), ``ones``, or ``FILE.h5:/dataset``.
    size : int
        Required length.
    dtype : numpy.dtype
        Value dtype of the result.
    seed : int
    name, what : str
        Used in error messages ("x has shape (5,), expected (6,) to match the matrix's columns").

    Returns
    -------
    ndarray, shape (size,), dtype ``dtype``

    Raises
    ------
    InputError
        The file or dataset is missing, the length is wrong, or it holds NaN/Inf.
    """
    if spec == "ones":
        return np.ones(size, dtype=dtype)
    if spec == "random":
        return np.random.default_rng(seed).uniform(-1.0, 1.0, size).astype(dtype)
    import h5py
    path, dataset = split_hdf5_reference(spec)
    try:
        with h5py.File(path, "r") as handle:
            member = open_member(handle, path, dataset, "dataset", f"operation.params.{name}")
            vector = np.asarray(member[()])
    except OSError as exc:
        raise InputError(f"{path}: cannot read {name} ({exc})") from None
    if vector.ndim != 1 or len(vector) != size:
        raise InputError(f"{path}:{dataset}: {name} has shape {vector.shape}, expected ({size},) "
                         f"to match {what} ({size})")
    finite = np.isfinite(vector)
    if not finite.all():
        raise InputError(f"{path}:{dataset}: {name} holds NaN/Inf at index {int(np.argmin(finite))}")
    return vector.astype(dtype)
