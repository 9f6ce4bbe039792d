"""hisparse run with the split loader started: early (as built), before the read (stop 48), or never (MODE env)."""
import os, sys
import hisparse.driver as driver
from hisparse.ops.spmv import SpMV
from hisparse.distmatrix import start_loading_split_loops
from hisparse.cli import main
mode = os.environ.get("MODE", "early")
if mode != "early":
    SpMV.start_early = classmethod(lambda cls, config, nranks: None)
if mode == "read":
    read = driver._read_input
    def patched(ctx, layout, op):
        if ctx.size > 1:
            start_loading_split_loops(ctx.value_dtype)
        return read(ctx, layout, op)
    driver._read_input = patched
sys.exit(main(sys.argv[1:]))
