"""The ``hisparse`` command: run, convert, generate, info, report.

Errors a user can fix print one line, ``hisparse: error: ...``, and exit 2 (3 for a failed
verification); expected failures of the environment (out of memory, an I/O error, a corrupt or
non-UTF-8 file) are mapped to such a line here, at the boundary (:func:`hisparse.errors.
as_user_error`). Any other exception on any rank prints ``hisparse: rank R: <type>: <message>``
and aborts the whole MPI job, so a failing rank never leaves the others hanging.

SIGINT, SIGTERM and SIGUSR1 are handled from the start, before MPI (see
:mod:`hisparse.parallel._stop`): an interrupted command exits with 128 + the signal number,
every rank of a run together.
"""
import argparse
import sys
import traceback

from .errors import HisparseError, Interrupted, VerificationError, as_user_error


def _backend_asked(args):
    """The ``backend`` a run asks for, as far as a look ahead can tell: the last ``--set backend=``
    override, else the config file's top-level key; None when unknown. Only a
    hint for :func:`_start_cuda_warmup`: the run validates its config itself."""
    for item in reversed(args.set or []):
        key, _, value = item.partition("=")
        if key.strip() == "backend":
            return value.strip()
    try:
        import yaml
        with open(args.config) as handle:
            raw = yaml.safe_load(handle)
    except Exception:  # an unreadable or broken config: the run reports it, with its context
        return None
    if not isinstance(raw, dict):
        return None
    return raw.get("backend", "auto")  # the schema's default


def _start_cuda_warmup(args):
    """Start CUDA's initialisation in the background (:mod:`hisparse.gpu._warmup`) unless the run
    asks for the CPU: the driver, and the primary context of the device this rank will be given
    when its node-local rank is known (no launcher: rank 0; under one, the launcher's variable).
    Every rank reads the config file ahead for its ``backend`` (a small YAML file; rank 0 alone
    validates it later): making the context here, beside the imports and MPI's start, took
    0.10-0.20 s off every rank's start-up, where a context made after MPI's start waits in the
    run's ``device`` step (2xH200, stop 59)."""
    from .gpu import CudaWarmup
    from .parallel import guess_local_rank, launched_by_mpi
    try:
        launched = launched_by_mpi()
    except HisparseError:
        return None  # the run reports a bad HISPARSE_MPI
    backend = _backend_asked(args)
    if backend == "cpu":
        return None
    local_rank = guess_local_rank(launched) if backend is not None else None
    return CudaWarmup(local_rank)


def _run_overrides(args):
    """The ``--set`` overrides of ``hisparse run``, with ``--resume`` as its config key."""
    overrides = list(args.set or [])
    if args.resume:
        # Only operations with checkpoints (cpals) know this key; others reject it by name.
        overrides.append("operation.params.resume=true")
    return overrides


def _cmd_dry_run(args):
    """``hisparse run CONFIG --dry-run``: the resolved config, the plan and the memory estimate
    per rank; nothing read, allocated or written. The ranks are ``--ranks``, else the
    launcher's world."""
    from .config import load_config
    from .estimate import dry_run_text
    nranks = args.ranks
    rank = 0
    if nranks is None:
        from .parallel import get_world
        comm = get_world()
        nranks, rank = comm.size, comm.rank
    config = load_config(args.config, _run_overrides(args))
    if rank == 0:
        sys.stdout.write(dry_run_text(config, nranks))
    return 0


def _cmd_run(args):
    if args.dry_run:
        return _cmd_dry_run(args)
    if args.ranks is not None:
        raise HisparseError("--ranks plans a --dry-run; a run takes its ranks from the launcher "
                            "(mpiexec -n N hisparse run ...)")
    from .timing import StepClock
    launch = StepClock(since_launch=True)
    launch.mark("interpreter")  # Python's start, hisparse's command line
    warmup = getattr(args, "cuda_warmup", None)  # started by main, before anything imported NumPy
    from .driver import run
    from .parallel import get_world
    launch.mark("imports")
    comm = get_world()
    launch.mark("mpi_init")
    path = run(args.config, _run_overrides(args), comm=comm, count_launch=True, cuda_warmup=warmup,
               launch_clock=launch)
    if comm.rank == 0:
        print(f"hisparse: results written to {path}")
        if not args.quiet:
            from .report import format_table, run_rows
            print(format_table(run_rows([path])))
    return 0


def _cmd_convert(args):
    from .io import convert
    obj = convert(args.source, args.output, fmt=args.format, group=args.group,
                  symmetric=args.symmetric, duplicates=args.duplicates, overwrite=args.overwrite)
    kind = "matrix" if hasattr(obj, "indptr") else "tensor"
    print(f"hisparse: wrote {kind} {tuple(obj.shape)} with {obj.nnz} nonzeros to "
          f"{args.output}:{args.group}")
    if kind == "matrix":
        from .io import ONE_TRIANGLE_NOTE, one_triangle
        side = one_triangle(obj)
        if side:
            print("hisparse: note: " + ONE_TRIANGLE_NOTE.format(
                source=args.source, side=side, other="above" if side == "lower" else "below"))
    return 0


def _cmd_generate(args):
    from .config import parse_overrides
    from .generators import generate, validate_spec
    from .io import check_output_group, write_matrix, write_tensor
    spec = {"kind": args.kind}
    spec.update(parse_overrides(args.param, source="hisparse generate", example="dims=[64,64]"))
    spec = validate_spec(spec, source="hisparse generate", prefix="")
    check_output_group(args.output, args.group, args.overwrite)  # before the work
    obj = generate(spec)
    writer = write_tensor if hasattr(obj, "values") else write_matrix
    writer(args.output, obj, args.group, overwrite=args.overwrite)
    print(f"hisparse: wrote {spec['kind']} {tuple(obj.shape)} with {obj.nnz} nonzeros to "
          f"{args.output}:{args.group}")
    return 0


def _cmd_info(args):
    from .io import describe
    for path in args.files:
        for line in describe(path):
            print(f"{path}{line}" if line.startswith("/") else line)
    return 0


def _cmd_report(args):
    from .report import report
    return report(args.paths, csv_out=args.csv, per_run=args.runs, study=args.study,
                  output=args.output, plots=args.plots, no_plots=args.no_plots,
                  setup=args.setup)


def _user_path(value):
    """argparse type of a path argument: ``~`` and ``$VAR`` expanded even when the shell did
    not (quoted, or from a job script's variables); an unset variable is a usage error."""
    from .config import expand_path
    try:
        return expand_path(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_OVERWRITE_HELP = ("replace GROUP if it exists (only that group: other groups are kept); without "
                   "it an existing group, or for --group / an existing file, is refused")


def build_parser():
    from ._version import __version__
    parser = argparse.ArgumentParser(prog="hisparse", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"hisparse {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="execute one run described by a YAML config (collective)")
    p.add_argument("config", type=_user_path)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key, e.g. --set output.dir=results (repeatable)")
    p.add_argument("--quiet", action="store_true", help="do not print the summary table")
    p.add_argument("--resume", action="store_true",
                   help="continue from the operation's checkpoint (cpals: operation.params."
                        "checkpoint)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the resolved config, the plan and the memory per rank, then "
                        "stop (nothing read or written)")
    p.add_argument("--ranks", type=int, metavar="N",
                   help="with --dry-run: plan for N ranks (default: the launcher's)")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("convert", help="convert .mtx/SNAP/.tns/MovieLens/Last.fm to HDF5")
    p.add_argument("source", type=_user_path)
    p.add_argument("output", type=_user_path)
    p.add_argument("--format", choices=("mtx", "snap", "triplet", "tns", "genten", "movielens", "lastfm"))
    p.add_argument("--group", default="/")
    p.add_argument("--symmetric", action="store_true",
                   help="snap: add reverse edges; triplet: mirror the lower triangle")
    p.add_argument("--duplicates", choices=("sum", "reject"), default="sum")
    p.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP)
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("generate", help="write a synthetic matrix or tensor to HDF5")
    p.add_argument("kind", help="poisson, rmat, trefethen, random_matrix, random_tensor")
    p.add_argument("output", type=_user_path)
    p.add_argument("param", nargs="*", help="KEY=VALUE parameters, e.g. dims=[64,64] stencil=5")
    p.add_argument("--group", default="/")
    p.add_argument("--overwrite", action="store_true", help=_OVERWRITE_HELP)
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("info", help="describe the matrices and tensors in HDF5 files")
    p.add_argument("files", nargs="+", type=_user_path)
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("report", help="tabulate results files; aggregate scaling studies")
    p.add_argument("paths", nargs="+", type=_user_path,
                   help="results files or (study) directories")
    p.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    p.add_argument("--runs", action="store_true", help="one row per run, even for a study")
    p.add_argument("--study", action="store_true",
                   help="aggregate by rank count even for runs not marked strong/weak")
    p.add_argument("--output", "-o", metavar="DIR", type=_user_path,
                   help="write report.txt, study.csv, runs.csv and the plots to DIR")
    p.add_argument("--plots", metavar="DIR", type=_user_path, help="write the PNG plots to DIR")
    p.add_argument("--no-plots", action="store_true", help="with --output: no plots")
    p.add_argument("--setup", action="store_true",
                   help="one row per run of its one-time phases (startup, connect, read, ..., "
                        "each on its slowest rank): where the time to solution goes")
    p.set_defaults(func=_cmd_report)

    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub):
    """Subcommands contributed by other modules (e.g. ``jobs``), registered if present."""
    try:
        from .jobs import add_subcommand
    except ImportError:
        return
    add_subcommand(sub)


def _world_or_none():
    if "mpi4py" not in sys.modules:
        return None
    from mpi4py import MPI
    return MPI.COMM_WORLD if MPI.Is_initialized() and not MPI.Is_finalized() else None


def _starts_a_run(args):
    """Whether ``args`` are ``hisparse run``'s for a run (not a ``--dry-run``, not ``--ranks``)."""
    return getattr(args, "func", None) is _cmd_run and not args.dry_run and args.ranks is None


def main(argv=None):
    args = build_parser().parse_args(argv)
    # CUDA's initialisation first, so that the imports from here on overlap with it (the
    # signal guard's module imports NumPy: 0.2 s on the 2xH200 host).
    args.cuda_warmup = _start_cuda_warmup(args) if _starts_a_run(args) else None
    from .parallel import install_signal_guard
    install_signal_guard()  # before MPI starts: MPICH keeps a handler that is already there
    try:
        return args.func(args)
    except Interrupted as exc:
        return _interrupted(exc)
    except KeyboardInterrupt:
        return _interrupted(Interrupted(2))
    except Exception as exc:
        error = as_user_error(exc)
        if error is None:
            _bug(exc)
        return _user_error(error)


def _user_error(exc):
    """One line for an error the user can fix; a lone failing rank takes the job down."""
    from .parallel import abort
    comm = _world_or_none()
    if exc.collective or comm is None or comm.size == 1:
        # Every rank raised the same error: rank 0 prints it and all exit cleanly.
        if comm is None or comm.rank == 0:
            sys.stderr.write(f"hisparse: error: {exc}\n")
        return 3 if isinstance(exc, VerificationError) else 2
    abort(comm, f"hisparse: error on rank {comm.rank}: {exc}", code=2)


def _interrupted(exc):
    """Every rank left together (a collective stop): exit 128 + signal; a rank interrupted on its
    own must not leave the others waiting in a collective: abort the job."""
    from .parallel import abort
    comm = _world_or_none()
    if exc.collective or comm is None or comm.size == 1:
        if comm is None or comm.rank == 0:
            sys.stderr.write(f"hisparse: {exc}; nothing written\n")
        return exc.exit_status
    abort(comm, f"hisparse: rank {comm.rank} {exc}; aborting the job", code=exc.exit_status)


def _bug(exc):
    """A bug or an unexpected environment failure: take the whole job down."""
    from .parallel import abort
    comm = _world_or_none()
    rank = comm.rank if comm is not None else 0
    # The traceback and the one-line summary leave in one write (see parallel.abort).
    abort(comm, "".join(traceback.format_exception(exc))
          + f"hisparse: rank {rank}: {type(exc).__name__}: {exc}", code=1)


if __name__ == "__main__":
    sys.exit(main())
