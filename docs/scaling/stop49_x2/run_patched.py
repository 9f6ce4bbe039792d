"""hisparse run with SpMV's connection waited right after the read (CONNECTS_IN_SETUP False)."""
import sys
from hisparse.ops.spmv import SpMV
from hisparse.cli import main
SpMV.CONNECTS_IN_SETUP = False
sys.exit(main(sys.argv[1:]))
