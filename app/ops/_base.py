"""The contract between the run driver and an operation.

The driver owns the pipeline (config -> input -> partition -> distribute -> compute -> gather ->
verify -> record); an operation fills in the steps. Every method marked *collective* is called on
all ranks in the same order; the others on rank 0 only.
"""
import numpy as np

from ..parallel import bcast_arrays, root_call, scatter_arrays


class Operation:
    """Base class of every operation.

    Class attributes
    ----------------
    NAME : str
        Registry name (``operation.name`` in a config).
    INPUT_KIND : {"matrix", "tensor"}
        What the input must hold.
    PARAMS : dict
        Schema of ``operation.params`` (:class:`~hisparse.config.Setting` leaves).
    PARTITIONS : tuple of str
        Accepted ``partition.strategy`` values; the first is the default.
    PEERS : tuple of str
        Accepted names in ``peers``.
    SETUP_PHASES, REPEAT_PHASES : tuple of str
        Phases this operation records once, and in each repeat (``read`` and ``total`` are the
        driver's).
    COMPUTE_PHASES : tuple of str
        Phases whose sum is "compute time" for GFLOP/s, GB/s and peer speedups.
    DEFAULT_RTOL : dict
        Verification tolerance per precision when ``verify.rtol`` is null.
    """

    NAME = "?"
    INPUT_KIND = "matrix"
    PARAMS = {}
    PARTITIONS = ()
    PEERS = ()
    SETUP_PHASES = ("partition", "distribute")
    REPEAT_PHASES = ("h2d", "kernel", "d2h", "gather")
    COMPUTE_PHASES = ("kernel",)
    DEFAULT_RTOL = {"fp64": 1e-12, "fp32": 1e-4}

    def __init__(self, ctx):
        self.ctx = ctx
        self.params = ctx.config["operation.params"]
        strategy = ctx.config["partition.strategy"]
        self.strategy = self.PARTITIONS[0] if strategy == "auto" and self.PARTITIONS else strategy

    @classmethod
    def phases(cls):
        return ("read",) + tuple(cls.SETUP_PHASES) + tuple(cls.REPEAT_PHASES) + ("total",)

    # -- collective steps -------------------------------------------------------------------
    def setup(self, problem):
        """Partition ``problem`` (rank 0; ``None`` elsewhere), distribute, and build the local
        plan and device buffers. *Collective.*"""
        raise NotImplementedError

    def distribute(self, problem):
        """Partition on rank 0 and hand every rank its part. *Collective.*

        Calls :meth:`partition` on rank 0 (timed as ``partition``; a
        :class:`~hisparse.errors.HisparseError` raised there stops every rank with the same
        message), then scatters the per-rank parts and broadcasts the shared data (timed as
        ``distribute``).

        Returns
        -------
        part : dict
            This rank's arrays and scalars.
        shared : dict or None
            The data every rank receives (e.g. the vector x, the matrix B, initial factors).
        """
        ctx = self.ctx
        with ctx.timer.phase("partition"):
            planned = root_call(ctx.comm, self.partition, problem)
        parts, shared = planned if ctx.is_root else (None, None)
        with ctx.timer.phase("distribute"):
            part = scatter_arrays(ctx.comm, parts)
            shared = bcast_arrays(ctx.comm, shared)
        return part, shared

    def partition(self, problem):
        """Split ``problem`` for the ranks (rank 0): ``(parts, shared)``, a list of ``comm.size``
        dicts of arrays and scalars, and one dict for every rank (or ``None``)."""
        raise NotImplementedError

    def run_once(self):
        """One timed repetition of the operation, ending with the result gathered on rank 0.
        *Collective.*"""
        raise NotImplementedError

    def teardown(self):
        """Free device buffers. *Collective.*"""

    # -- rank 0 steps -----------------------------------------------------------------------
    def result(self):
        """The gathered result of the last repetition (rank 0)."""
        raise NotImplementedError

    def reference(self, problem):
        """The independent reference result (NumPy/SciPy) for verification (rank 0)."""
        raise NotImplementedError

    def compare(self, result, reference):
        """Maximum relative error of ``result`` against ``reference`` (norm-wise by default)."""
        result = np.asarray(result, dtype=np.float64)
        reference = np.asarray(reference, dtype=np.float64)
        if result.shape != reference.shape:
            return float("inf")
        scale = np.linalg.norm(reference.ravel(), np.inf)
        diff = np.linalg.norm((result - reference).ravel(), np.inf)
        return float(diff / scale) if scale > 0 else float(diff)

    def work(self, problem):
        """``{"flops": ..., "bytes": ...}`` of one repetition's compute (rank 0)."""
        return {"flops": 0.0, "bytes": 0.0}

    def run_peer(self, name, problem, repeats):
        """Time peer ``name`` on ``problem``; return ``{"seconds": [...], ...attrs}`` (rank 0).
        Raise :class:`~hisparse.errors.HisparseError` if the peer cannot run here."""
        raise NotImplementedError

    def result_arrays(self, result):
        """Arrays stored under ``/result`` in the results file (rank 0)."""
        return {}

    def summary(self):
        """Extra root attributes for the results file (rank 0)."""
        return {}

    # -- every rank -------------------------------------------------------------------------
    def rank_info(self):
        """Per-rank scalars recorded in ``/perf`` (e.g. rows, nnz, bytes moved)."""
        return {}
