"""session 53: hisparse's command line with ordering.LEVEL_SET_TOLERANCE set to argv[1]. Under
the guard: the ordering's fork server imports the main module (as __mp_main__) and must not
start a second run (the unguarded first version crashed every run of d37)."""
import sys

if __name__ == "__main__":
    from hisparse.ops.cholesky import ordering
    ordering.LEVEL_SET_TOLERANCE = float(sys.argv[1])
    from hisparse.cli import main
    sys.exit(main(sys.argv[2:]))
