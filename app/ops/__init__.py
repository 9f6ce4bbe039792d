"""Operations, registered by name and imported lazily (one module per operation).

Each module defines a subclass of :class:`~hisparse.ops._base.Operation` and exposes it as
``OPERATION``. Importing this package imports none of them.
"""
import importlib

from ..errors import ConfigError
from ._base import PHASE_KINDS, Engine, GpuEngine, MemoryEstimate, Operation, pick_engine
from ._vectors import make_vector, vector_spec_check

#: operation name -> module (relative to this package)
OPERATIONS = {
    "spmv": ".spmv",
    "spgemm": ".spgemm",
    "sptv": ".sptv",
    "cpals": ".cpals",
    "cholesky": ".cholesky",
}


def get_operation_class(name, source="<config>"):
    """The :class:`Operation` subclass registered as ``name``.

    Raises
    ------
    ConfigError
        Unknown name (with a suggestion), or the module is not available in this build.
    """
    if name not in OPERATIONS:
        import difflib
        hint = difflib.get_close_matches(name, list(OPERATIONS), n=1)
        extra = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise ConfigError(source, "operation.name",
                          f"expected one of {', '.join(repr(o) for o in OPERATIONS)}, got "
                          f"{name!r}{extra}")
    try:
        module = importlib.import_module(OPERATIONS[name], __name__)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.endswith(OPERATIONS[name].lstrip(".")):
            raise ConfigError(source, "operation.name",
                              f"operation '{name}' is not implemented in this version") from None
        raise
    return module.OPERATION


__all__ = ["Operation", "MemoryEstimate", "Engine", "GpuEngine", "pick_engine", "PHASE_KINDS",
           "make_vector", "vector_spec_check", "OPERATIONS", "get_operation_class"]
