"""SpTV, Y = X x_n v: the operation (:mod:`.op`), its chunk plan (:mod:`.plan`), engines
(:mod:`.cpu`, :mod:`.gpu`) and peers (:mod:`.peers`). See docs/ops/sptv.md."""
from .op import SpTV

OPERATION = SpTV

__all__ = ["SpTV", "OPERATION"]
