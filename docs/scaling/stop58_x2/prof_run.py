"""stop 58: cProfile one `hisparse run` on every rank (under mpirun); each rank prints its main
thread's functions matching $PROF_MATCH (a regular expression) by cumulative time."""
import cProfile, io, os, pstats, sys
if __name__ == "__main__":
    from hisparse.cli import main
    prof = cProfile.Profile()
    prof.enable()
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(
        os.environ.get("PROF_MATCH", "hisparse"), int(os.environ.get("PROF_LINES", "45")))
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    lines = [line for line in out.getvalue().splitlines()
             if line.strip() and ("/" in line or "ncalls" in line)]
    sys.stdout.write("".join(f"[rank {rank}] {line.replace('/root/', '')[:180]}\n" for line in lines))
