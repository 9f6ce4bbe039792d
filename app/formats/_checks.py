"""Value checks shared by the sparse formats' validation."""
import numpy as np

from ..errors import InputError
from ..arrays import all_finite


def first_non_finite(name, values):
    """Index of the first NaN/Inf of ``values`` (floating point required), or None.

    Raises
    ------
    InputError
        ``values`` is not floating point (named by ``name``).
    """
    if not np.issubdtype(values.dtype, np.floating):
        raise InputError(f"{name}: values must be floating point, got {values.dtype}")
    if all_finite(values):  # on the host's threads; the first bad one found on one core
        return None
    return int(np.argmin(np.isfinite(values)))
