"""hisparse: multi-GPU sparse kernels (SpMV, SpGEMM, SpTV, CP-ALS, Cholesky) driven by YAML run
configs, reading and writing HDF5, one MPI rank per GPU.

The public API is small: :func:`run` executes one run from a config file; :func:`load_config`
validates one; the formats and I/O functions read and write inputs.
"""
from ._version import __version__
from . import config as _config, generators as _generators, ops as _ops
from .config import load_config
from .errors import ConfigError, HisparseError, InputError, LayoutError, VerificationError
from .formats import COOTensor, CSRMatrix
from .io import read_matrix, read_tensor, write_matrix, write_tensor

# Devito-style hand-in: the config schema validates against registries owned by the packages
# above it, which give them here instead of being imported by it.
_config.provide(operation_names=tuple(_ops.OPERATIONS), operation_class=_ops.get_operation_class,
                generator_spec=_generators.validate_spec)


def run(config_path, overrides=(), comm=None):
    """Execute one run (collective over ``comm``); returns the results path on rank 0."""
    from .driver import run as _run
    return _run(config_path, overrides, comm)


__all__ = ["__version__", "run", "load_config", "CSRMatrix", "COOTensor", "read_matrix",
           "read_tensor", "write_matrix", "write_tensor", "HisparseError", "ConfigError",
           "InputError", "LayoutError", "VerificationError"]
