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
