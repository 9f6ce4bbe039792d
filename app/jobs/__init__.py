"""``hisparse jobs``: job scripts for strong- and weak-scaling studies (Slurm, PBS Pro, plain MPI).

A *study* is one run configuration executed at several rank counts. Every run of a study gets
``--set run.study=KIND --set run.study_id=ID --set output.dir=STUDY_DIR``, so its results file
lands in the study directory and ``hisparse report STUDY_DIR`` can aggregate the study.

The study spec (a YAML file given with ``--study``, every key also a command-line flag) says::

    kind: strong            # strong | weak
    id: spmv-strong-a       # default: <run.name>-<kind>-<UTC stamp>
    ranks: [1, 2, 4, 8]     # or nodes: [1, 2] (ranks = nodes x ranks_per_node)
    dir: results/{id}       # the study directory ({id} is replaced)
    scheduler: slurm        # slurm | pbs | none (a plain loop, no scheduler)
    launcher: srun          # srun | mpiexec | mpirun (default: srun on Slurm, else mpiexec)
    mode: chain             # chain: one job per rank count, each after the previous one
                            # array: one job array sized for the largest rank count
                            # single: one job, sized for the largest count, loops over them
    gpus_per_node: 4        # 0 for CPU-only runs
    ranks_per_node: null    # default: gpus_per_node, or the largest rank count when 0 GPUs
    cpus_per_rank: 8
    account / partition / queue / time / modules / setup / directives / launcher_args
    signal_seconds: 120     # USR1 this long before the walltime (0 = off)
    set: [run.repeats=10]   # overrides for every run
    weak: {"input.generate.dims[0]": multiply}   # how a weak study grows the problem

GPU binding: the application binds the GPU of its node-local rank modulo the visible GPUs
(``app/gpu/_device.py``), so ``srun --gpus-per-task=1`` (one visible GPU per task: device 0) and
``mpiexec`` inside an allocation with ``--gpus-per-node`` (all GPUs visible: local rank modulo
count) both give one GPU per rank.

Walltime: Slurm scripts ask for ``--signal=B:USR1@S``; PBS and plain scripts start a timer that
sends USR1 to the script ``S`` seconds before the walltime. The script runs the launcher in the
background and forwards USR1 (and TERM) to it, which forwards it to the ranks; see
:class:`hisparse.parallel.StopRequest` for the rank side.

The package: ``_spec`` (the spec's schema, its checks, walltimes, weak-scaling rules),
``_study`` (:class:`Study` and its :class:`Run` list, the checks of the config and its input
files), ``_render`` (the scripts' text and the writing of the study's jobs directory) and
``_cli`` (the subcommand). This module is their contract: import from ``hisparse.jobs``.
"""
from ._spec import (LAUNCHERS, MODES, SCHEDULERS, STUDY_SCHEMA, WEAK_RULES, load_study,
                    walltime_seconds, weak_overrides)
from ._study import Run, Study
from ._render import render_scripts, write_study
from ._cli import add_subcommand

__all__ = ["SCHEDULERS", "LAUNCHERS", "MODES", "WEAK_RULES", "STUDY_SCHEMA", "walltime_seconds",
           "load_study", "weak_overrides", "Run", "Study", "render_scripts", "write_study",
           "add_subcommand"]
