"""The ``hisparse jobs`` subcommand: its flags (:func:`add_subcommand`) and what it prints."""
import os
import re

from ._spec import LAUNCHERS, MODES, SCHEDULERS, WEAK_RULES, load_study
from ._study import Study
from ._render import write_study


def _int_list(text):
    try:
        values = [int(v) for v in re.split(r"[,\s]+", text.strip()) if v]
    except ValueError:
        raise ValueError(f"'{text}' is not a list of integers such as 1,2,4") from None
    return values


def _weak_rule(text):
    if "=" not in text:
        raise ValueError(f"'{text}' is not KEY=RULE, e.g. input.generate.nnz=multiply")
    key, rule = text.split("=", 1)
    return key.strip(), rule.strip()


def _cmd_jobs(args):
    overrides = {
        "kind": args.kind, "id": args.study_id, "ranks": args.ranks, "nodes": args.nodes,
        "dir": args.study_dir, "scheduler": "none" if args.no_scheduler else args.scheduler,
        "launcher": args.launcher, "mode": args.mode, "gpus_per_node": args.gpus_per_node,
        "ranks_per_node": args.ranks_per_node, "cpus_per_rank": args.cpus_per_rank,
        "account": args.account, "partition": args.partition, "queue": args.queue,
        "time": args.time, "signal_seconds": args.signal_seconds, "modules": args.module,
        "setup": args.setup, "directives": args.directive, "launcher_args": args.launcher_arg,
        "srun_mpi": args.srun_mpi, "one_node_pml": args.one_node_pml, "python": args.python,
        "workdir": args.workdir,
        "weak": dict(args.weak) if args.weak else None,
    }
    spec = load_study(args.study, overrides)
    study = Study(args.config, spec, run_overrides=args.set or [])
    written, removed = write_study(study)
    ranks = " ".join(str(r.nranks) for r in study.runs)
    print(f"hisparse jobs: study {study.id}: {study.kind} scaling over ranks {ranks}, "
          f"{study.scheduler}/{study.launcher}, mode {study.mode}")
    width = max(len(os.path.relpath(p)) for p, _ in written)
    for path in removed:
        print(f"  removed {os.path.relpath(path)}  (stale: from an earlier generation of this "
              f"study id)")
    for path, description in written:
        print(f"  wrote {os.path.relpath(path):<{width}}  {description}")
    earlier = _results_of(study)
    if earlier:
        print(f"  note: {study.study_dir} already holds {earlier} results file(s); `hisparse "
              f"report` aggregates them with the new runs of study {study.id}")
    for run in study.runs:
        if run.overrides:
            print(f"  r{run.nranks}: " + " ".join(f"--set {o}" for o in run.overrides))
    if study.scheduler == "none":
        print(f"run with:    bash {os.path.relpath(os.path.join(study.jobs_dir, 'run.sh'))}")
    else:
        print(f"submit with: bash {os.path.relpath(os.path.join(study.jobs_dir, 'submit.sh'))}")
    print(f"report with: hisparse report {os.path.relpath(study.study_dir)} --output "
          f"{os.path.relpath(study.study_dir)}")
    return 0


def _results_of(study):
    """How many results files the study directory holds already (kept, never removed)."""
    try:
        return sum(1 for name in os.listdir(study.study_dir) if name.endswith(".h5"))
    except OSError:
        return 0


def add_subcommand(subparsers):
    """Register ``hisparse jobs`` (called by :func:`hisparse.cli.build_parser`)."""
    p = subparsers.add_parser(
        "jobs", help="write Slurm/PBS/mpirun scripts for a strong or weak scaling study",
        description="Generate the job scripts of a scaling study of one run config. Values from "
                    "--study SPEC.yaml are overridden by the flags.")
    p.add_argument("config", help="the run config (YAML) every job runs")
    p.add_argument("--study", metavar="SPEC.yaml", help="study spec (see docs/cluster.md)")
    p.add_argument("--kind", choices=("strong", "weak"))
    p.add_argument("--study-id", metavar="ID")
    p.add_argument("--study-dir", metavar="DIR", help="study directory; {id} = the study id "
                                                     "(default results/{id})")
    p.add_argument("--ranks", type=_int_list, metavar="1,2,4")
    p.add_argument("--nodes", type=_int_list, metavar="1,2", help="node counts instead of ranks")
    p.add_argument("--scheduler", choices=SCHEDULERS)
    p.add_argument("--no-scheduler", action="store_true", help="same as --scheduler none")
    p.add_argument("--launcher", choices=LAUNCHERS)
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--gpus-per-node", type=int, metavar="G")
    p.add_argument("--ranks-per-node", type=int, metavar="P")
    p.add_argument("--cpus-per-rank", type=int, metavar="C")
    p.add_argument("--account", "-A")
    p.add_argument("--partition", "-p")
    p.add_argument("--queue", "-q")
    p.add_argument("--time", "-t", metavar="HH:MM:SS")
    p.add_argument("--signal-seconds", type=int, metavar="S",
                   help="USR1 this long before the walltime (0: off)")
    p.add_argument("--module", action="append", metavar="NAME", help="module to load (repeatable)")
    p.add_argument("--setup", action="append", metavar="LINE", help="shell line (repeatable)")
    p.add_argument("--directive", action="append", metavar="OPT",
                   help="extra #SBATCH/#PBS option (repeatable)")
    p.add_argument("--launcher-arg", action="append", metavar="ARG", help="(repeatable)")
    p.add_argument("--srun-mpi", metavar="PLUGIN",
                   help="srun --mpi=PLUGIN: auto (default: from the MPI mpi4py loads in the job), "
                        "default (no --mpi) or a plugin, e.g. pmi2")
    p.add_argument("--one-node-pml", metavar="PML",
                   help="OMPI_MCA_pml for runs on one node unless the job sets it (default ob1; "
                        "'' leaves Open MPI's choice)")
    p.add_argument("--python", metavar="EXE", help="python that runs hisparse in the jobs "
                                                   "(default: python3 on PATH after the setup)")
    p.add_argument("--workdir", metavar="DIR", help="directory the jobs start in")
    p.add_argument("--weak", action="append", type=_weak_rule, metavar="KEY=RULE",
                   help="weak-scaling rule, e.g. 'input.generate.dims[0]=multiply' "
                        f"(rules: {', '.join(WEAK_RULES)}; repeatable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config override for every run (repeatable)")
    p.set_defaults(func=_cmd_jobs)
    return p
