"""Whether an MPI launcher started this process, from the variables launchers set in their ranks.

Standard library only: ``hisparse run`` asks before it imports NumPy and MPI (it starts CUDA's
initialisation in the background first, ``hisparse.gpu._warmup``), and :func:`get_world` asks to
choose between MPI and the one-rank serial world.
"""
import os

from ..errors import HisparseError

#: The launchers recognised, in the order asked, by the variables they set in the processes they
#: start; the name is what a results file records as ``launcher``. Slurm's srun tasks; Open MPI's
#: mpirun; the rest as mpiexec: PMIx (Open MPI 5, PRRTE, srun --mpi=pmix), PMI-1/2 (MPICH's
#: Hydra, Intel MPI, Cray MPICH, srun --mpi=pmi2), MVAPICH, Cray ALPS and PALS (PBS on HPE).
LAUNCHERS = (("srun", ("SLURM_STEP_ID",)),
             ("openmpi", ("OMPI_COMM_WORLD_SIZE",)),
             ("mpiexec", ("PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD", "MV2_COMM_WORLD_SIZE",
                          "MPIRUN_RANK", "ALPS_APP_PE", "PALS_RANKID")))

#: Node-local rank variables of launchers that set them (Open MPI, MPICH's Hydra, PALS); srun sets
#: SLURM_LOCALID (other launchers inside a Slurm allocation leave it 0 on every rank).
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID")

#: ``HISPARSE_MPI=always`` initialises MPI even without a launcher (a singleton world of one).
MPI_MODE_VARIABLE = "HISPARSE_MPI"


def launcher_name():
    """The launcher that started this process (:data:`LAUNCHERS`), or ``"none"``."""
    for name, variables in LAUNCHERS:
        if any(variable in os.environ for variable in variables):
            return name
    return "none"


def launched_by_mpi():
    """Whether an MPI launcher started this process (:func:`launcher_name`), or the user asked
    for MPI regardless (``HISPARSE_MPI=always``)."""
    mode = os.environ.get(MPI_MODE_VARIABLE, "auto").strip().lower()
    if mode not in ("auto", "always"):
        raise HisparseError(f"{MPI_MODE_VARIABLE}={mode!r}: expected auto or always")
    return mode == "always" or launcher_name() != "none"


#: Variables in which an MPI launcher states the size of the world it started, asked in this
#: order: Open MPI's mpirun, PMI-1/2 (MPICH's Hydra, Intel MPI, Cray PMI, srun --mpi=pmi2),
#: MVAPICH. They describe the launch the MPI library will join, so they come before Slurm's: an
#: mpiexec inside an allocation starts its proxies with srun, one task per node, and its ranks
#: inherit that step's SLURM_STEP_NUM_TASKS.
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")

#: Slurm's task count of the current step (srun sets these in every task of a step it starts;
#: SLURM_STEP_ID tells a step's task from the batch script, which holds the allocation's count).
SLURM_SIZE_VARIABLES = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")


def promised_world_size():
    """The number of processes the launcher says it started, as ``(count, variable)``, or
    ``(None, None)`` when no launcher variable states one."""
    slurm = SLURM_SIZE_VARIABLES if "SLURM_STEP_ID" in os.environ else ()
    for name in SIZE_VARIABLES + slurm:
        count = _int_or_none(os.environ.get(name, ""))
        if count is not None:
            return count, name
    return None, None


def check_world_size(size, library=None):
    """Raise when the launcher promised several processes but MPI made a world of ``size`` 1:
    each process then ran alone (the MPI that mpi4py loaded does not speak the launcher's
    process-management interface) and would write its own one-rank results.

    Parameters
    ----------
    size : int
        ``COMM_WORLD``'s size.
    library : str, optional
        The first line of ``MPI.Get_library_version()``, named in the message.
    """
    count, variable = promised_world_size()
    if count is None or count <= 1 or size != 1:
        return
    mpi = f" ({library.strip()})" if library else ""
    if variable in SLURM_SIZE_VARIABLES:
        cause = ("srun's MPI plugin does not match the MPI mpi4py uses: with the mpich wheel "
                 "run srun --mpi=pmi2 (Open MPI: --mpi=pmix; `srun --mpi=list` shows the "
                 "plugins), or start the ranks with that MPI's own mpiexec")
    else:
        cause = ("the launcher is not the one of the MPI mpi4py uses: start the ranks with "
                 "the mpiexec of that MPI (for the mpich wheel, the venv's bin/mpiexec)")
    raise HisparseError(f"the launcher started {count} processes ({variable}={count}) but MPI "
                        f"made a world of 1 in each{mpi}: {cause}. Stopping before any work, "
                        f"so that {count} one-rank runs do not each write their own results")


def guess_local_rank(launched):
    """This process's node-local rank as the launcher's variables give it, 0 without a launcher
    (``launched`` false), or None when they do not say. Before MPI exists: for the CUDA warm-up
    (``hisparse.gpu._warmup``), where a wrong guess costs only the overlap (the context made
    would be released unused)."""
    for name in LOCAL_RANK_VARIABLES:
        if name in os.environ:
            return _int_or_none(os.environ[name])
    if not launched:
        return 0
    if launcher_name() == "srun" and "SLURM_LOCALID" in os.environ:
        return _int_or_none(os.environ["SLURM_LOCALID"])
    return None


def _int_or_none(text):
    try:
        return int(text)
    except ValueError:
        return None
