"""cProfile one `hisparse run` per rank; print each rank's setup functions by cumulative time."""
import cProfile, io, os, pstats, sys
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
from hisparse.cli import main
prof = cProfile.Profile()
prof.enable()
try:
    main(sys.argv[1:])
except SystemExit:
    pass
prof.disable()
out = io.StringIO()
st = pstats.Stats(prof, stream=out).sort_stats("cumulative")
st.print_stats(r"(cholesky|hisparse/parallel|driver)", 45)
text = out.getvalue()
lines = [l for l in text.splitlines() if l.strip() and ("/" in l or "ncalls" in l)]
print(f"===== rank {rank}")
for l in lines[:60]:
    print(l.replace("/root/", "").replace("site-packages/", "")[:170])
