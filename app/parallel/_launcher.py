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
