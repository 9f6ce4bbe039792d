"""Package attributes imported on first access (PEP 562).

``hisparse``, ``hisparse.gpu`` and ``hisparse.parallel`` export their names this way, so that
``hisparse run`` starts (and starts CUDA's initialisation in the background,
:mod:`hisparse.gpu._warmup`) before NumPy, h5py, MPI and the operations are imported.
"""
import importlib


def lazy_getattr(package, where):
    """A module ``__getattr__`` for ``package``: ``where`` maps each exported name to the
    relative module that defines it (``".io"``), or a submodule's own name to itself
    (``"io": ".io"``), imported on the name's first access."""
    def __getattr__(name):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        loaded = importlib.import_module(module, package)
        return loaded if module == "." + name else getattr(loaded, name)
    return __getattr__
