"""SpMV (the plan, engines and peers are split out of op.py in the next step)."""
from .op import Csr5Device, SpMV, threads_per_row

OPERATION = SpMV
