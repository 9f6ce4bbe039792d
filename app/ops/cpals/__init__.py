"""CP-ALS (ParSCP-ALS): rank-R CP decomposition of a sparse tensor with a fused MTTKRP.

``op.py`` is the plan and the ALS loop, ``cpu.py`` / ``gpu.py`` the engines, ``peers.py`` the
MTTKRP baselines, ``state.py`` the unfolding format, initial factors, checkpoints and the NumPy
reference.
"""
from .op import CPALS

OPERATION = CPALS

__all__ = ["CPALS", "OPERATION"]
