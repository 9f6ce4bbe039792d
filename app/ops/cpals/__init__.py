"""CP-ALS (ParSCP-ALS): rank-R CP decomposition of a sparse tensor with a fused MTTKRP.

``op.py`` is the plan and the ALS loop, ``cpu.py`` / ``gpu.py`` the engines, ``peers.py`` the
MTTKRP baselines, ``layout.py`` the unfolding format and its row blocks, ``products.py`` what the
ranks reduce, ``init.py`` the initial factors, ``checkpoint.py`` the checkpoints and
``reference.py`` the NumPy CP-ALS that verifies a run.
"""
from .op import CPALS

OPERATION = CPALS

__all__ = ["CPALS", "OPERATION"]
