"""hisparse: multi-GPU sparse kernels (SpMV, SpGEMM, SpTV, CP-ALS, Cholesky) driven by YAML run
configs, reading and writing HDF5, one MPI rank per GPU.

The public API is small: :func:`run` executes one run from a config file; :func:`load_config`
validates one; the formats and I/O functions read and write inputs.
"""
from ._version import __version__
from . import config as _config
from .lazy import lazy_getattr
from .config import load_config
from .errors import ConfigError, HisparseError, InputError, LayoutError, VerificationError


# Devito-style hand-in: the config schema validates against registries owned by the packages
# above it, which give them here instead of being imported by it. They are handed in as
# functions that import their owners on first use, so that importing hisparse (and so starting
# `hisparse run`) does not import NumPy, h5py and every operation before the command begins:
# hisparse.cli starts CUDA's initialisation in the background first (hisparse.gpu._warmup).
def _operation_names():
    from .ops import OPERATIONS
    return tuple(OPERATIONS)


def _operation_class(name, source="<config>"):
    from .ops import get_operation_class
    return get_operation_class(name, source)


def _generator_spec(spec, source="<generate>", prefix="generate."):
    from .generators import validate_spec
    return validate_spec(spec, source, prefix)


_config.provide(operation_names=_operation_names, operation_class=_operation_class,
                generator_spec=_generator_spec)

# Public names and subpackages imported on first access (PEP 562, hisparse.lazy).
__getattr__ = lazy_getattr(__name__, {
    "CSRMatrix": ".formats", "COOTensor": ".formats", "read_matrix": ".io", "read_tensor": ".io",
    "write_matrix": ".io", "write_tensor": ".io",
    **{name: "." + name for name in ("formats", "io", "ops", "generators", "partition",
                                     "parallel", "gpu", "report", "driver", "timing")}})


def run(config_path, overrides=(), comm=None):
    """Execute one run (collective over ``comm``); returns the results path on rank 0."""
    from .driver import run as _run
    return _run(config_path, overrides, comm)


__all__ = ["__version__", "run", "load_config", "CSRMatrix", "COOTensor", "read_matrix",
           "read_tensor", "write_matrix", "write_tensor", "HisparseError", "ConfigError",
           "InputError", "LayoutError", "VerificationError"]
