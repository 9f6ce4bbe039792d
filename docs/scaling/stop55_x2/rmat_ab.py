"""session 55: R-MAT edges, stop 54's generator (the tree at HEAD, unpacked in /tmp/oldgen) against
this tree's, at scale 23: one process with every core, or (with a block range argument) the
share one of two ranks makes."""
import sys, time, importlib.util
which, scale = sys.argv[1], int(sys.argv[2])
part = int(sys.argv[3]) if len(sys.argv) > 3 else None
if which == "old":
    spec = importlib.util.spec_from_file_location("app", "/tmp/oldgen/app/__init__.py",
                                                  submodule_search_locations=["/tmp/oldgen/app"])
    m = importlib.util.module_from_spec(spec); sys.modules["app"] = m; spec.loader.exec_module(m)
    from app import generators as g, threads
else:
    from hisparse import generators as g, threads
if part is not None:
    threads._ranks_sharing = 2
g.rmat_edges(12)
nb = g.rmat_blocks(scale, 16)
blocks = None if part is None else range(part * nb // 2, (part + 1) * nb // 2)
ts = []
for r in range(3):
    t = time.perf_counter(); g.rmat_edges(scale, blocks=blocks); ts.append(time.perf_counter() - t)
print(which, "part", part, "cores", threads.usable_cores(), [round(x, 3) for x in ts])
