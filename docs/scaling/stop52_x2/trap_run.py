"""session 52: `hisparse run` with a trap on SciPy's sparse package: the stack (hisparse's
frames) of whatever imports it first, per rank, then the run as usual."""
import importlib.abc, os, sys, traceback
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")


class Trap(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "scipy.sparse" and name not in sys.modules:
            frames = [f for f in traceback.extract_stack()[:-1] if "/app/" in f.filename]
            where = " < ".join(f"{f.filename.split('/')[-2]}/{f.filename.split('/')[-1]}:"
                               f"{f.lineno}({f.name})" for f in frames[::-1][:6])
            print(f"[trap rank {rank}] scipy.sparse imported from: {where}", file=sys.stderr)
        return None


sys.meta_path.insert(0, Trap())
from hisparse.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
