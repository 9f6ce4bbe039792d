"""Value checks shared by the sparse formats' validation."""
import numpy as np

from ..errors import InputError


def first_non_finite(name, values):
    """Index of the first NaN/Inf of ``values`` (floating point required), or None.

    Raises
    ------
    InputError
        ``values`` is not floating point (named by ``name``).
    """
    if not np.issubdtype(values.dtype, np.floating):
        raise InputError(f"{name}: values must be floating point, got {values.dtype}")
    finite = np.isfinite(values)
    return None if finite.all() else int(np.argmin(finite))
