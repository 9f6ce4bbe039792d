"""session 53: cProfile one `hisparse run` (1 rank); rank 0's main thread by cumulative time, the
read's functions (io, layout, formats, distmatrix, partition)."""
import cProfile, io, pstats, sys
from hisparse.cli import main
prof = cProfile.Profile()
prof.enable()
try:
    main(sys.argv[1:])
except SystemExit:
    pass
prof.disable()
out = io.StringIO()
pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(r"(io/|layout|formats|distmatrix|partition|driver|threads|h5py|numpy)", 40)
for line in out.getvalue().splitlines():
    if line.strip() and ("/" in line or "ncalls" in line):
        print(line.replace("/root/", "").replace("site-packages/", "")[:170])
