"""SpTV (moved; split follows)."""
from .op import OPERATION, SpTV

__all__ = ["OPERATION", "SpTV"]
